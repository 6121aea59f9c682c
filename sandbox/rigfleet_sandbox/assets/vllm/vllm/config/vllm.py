"""Engine configuration of the SIMULATED vLLM stand-in (model config read from config.json).

Genesis text-patch anchors for this file are kept below (P65/P66/P72/P74).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

# Genesis anchors (the stand-in Genesis replaces each line with its marker):
# [anchor P65]
# [anchor P66]
# [anchor P72]
# [anchor P74]

DEFAULT_WEIGHTS_BYTES = 17_502_027_366  # 16.3 GiB: Qwen3.6-27B AutoRound INT4 on disk


def _invalid_model(model: str) -> ValueError:
    return ValueError(
        f"Invalid repository ID or local directory specified: '{model}'.\n"
        "Please verify the following requirements:\n"
        "1. Provide a valid Hugging Face repository ID.\n"
        "2. Specify a local directory that contains a recognized configuration file.\n"
        "   - For Hugging Face models: ensure the presence of a 'config.json'.\n"
        "   - For Mistral models: ensure the presence of a 'params.json'.\n"
    )


@dataclass
class ModelConfig:
    path: Path
    architectures: list[str]
    model_type: str
    num_hidden_layers: int
    full_attention_layers: int
    kv_heads: int
    head_dim: int
    max_position_embeddings: int
    mtp_layers_available: int
    is_hybrid: bool
    quant_method: str | None
    weights_bytes: int
    shards: list[str] = field(default_factory=list)

    @classmethod
    def from_dir(cls, model: str) -> ModelConfig:
        # The sandbox is offline: only local directories can be served.
        path = Path(model)
        if not (path / "config.json").is_file():
            raise _invalid_model(model)
        cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
        text = cfg.get("text_config", cfg)
        layers = int(text.get("num_hidden_layers", 64))
        layer_types = text.get("layer_types")
        if isinstance(layer_types, list) and layer_types:
            full = sum(1 for t in layer_types if t == "full_attention")
            hybrid = any(t != "full_attention" for t in layer_types)
        elif text.get("full_attention_interval"):
            full = layers // int(text["full_attention_interval"])
            hybrid = full < layers
        else:
            full, hybrid = layers, False
        heads = int(text.get("num_attention_heads", 24))
        hidden = int(text.get("hidden_size", 5120))
        index_path = path / "model.safetensors.index.json"
        weights_bytes, shards = DEFAULT_WEIGHTS_BYTES, []
        if index_path.is_file():
            index = json.loads(index_path.read_text(encoding="utf-8"))
            weights_bytes = int(index.get("metadata", {}).get("total_size", DEFAULT_WEIGHTS_BYTES))
            shards = sorted(set(index.get("weight_map", {}).values()))
        else:
            shards = sorted(p.name for p in path.glob("*.safetensors"))
        quant = (cfg.get("quantization_config") or {}).get("quant_method")
        return cls(
            path=path,
            architectures=list(cfg.get("architectures") or ["UnknownForCausalLM"]),
            model_type=str(cfg.get("model_type", "unknown")),
            num_hidden_layers=layers,
            full_attention_layers=full,
            kv_heads=int(text.get("num_key_value_heads", heads)),
            head_dim=int(text.get("head_dim", hidden // max(heads, 1))),
            max_position_embeddings=int(text.get("max_position_embeddings", 262144)),
            mtp_layers_available=int(
                text.get("mtp_num_hidden_layers", text.get("num_nextn_predict_layers", 0))
            ),
            is_hybrid=hybrid,
            quant_method=quant,
            weights_bytes=weights_bytes,
            shards=shards,
        )


@dataclass
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int


@dataclass
class VllmConfig:
    model: ModelConfig
    model_name: str
    served_model_names: list[str]
    quantization: str | None
    dtype: str
    kv_cache_dtype: str
    tensor_parallel_size: int
    pipeline_parallel_size: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    gpu_memory_utilization: float
    speculative: SpeculativeConfig | None
    enforce_eager: bool
    enable_prefix_caching: bool
    enable_chunked_prefill: bool
    enable_auto_tool_choice: bool
    tool_call_parser: str | None
    reasoning_parser: str | None
    default_chat_template_kwargs: dict
    generation_config: dict
    host: str
    port: int
    api_key: str | None

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def cudagraph_capture_sizes(self) -> list[int]:
        sizes = [1, 2, 4] + list(range(8, 513, 8))
        return [s for s in sizes if s <= max(self.max_num_seqs * (1 + self.num_spec_tokens), 1)]

    @property
    def num_spec_tokens(self) -> int:
        return self.speculative.num_speculative_tokens if self.speculative else 0


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")
