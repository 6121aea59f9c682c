"""Engine arguments -> validated VllmConfig (SIMULATED stand-in of vllm/engine/arg_utils.py).

Refuses what real vLLM refuses for this hardware and model, with its messages: a model dir
without config.json, max_model_len above the model's limit, TP x PP above the visible GPUs,
fp8_e4m3 KV on compute capability 8.6, and TurboQuant KV with speculative decoding (MTP) on a
hybrid model unless Genesis P4 has patched this file (the anchor line below). TurboQuant without
MTP boots Genesis-free, as club-3090's tq3-nomtp did on the same nightly. The module-level flag
is read when this module is imported, so a patch written later in the same process (a plugin)
comes too late: the v7.70 "F2" finding that made the apply_all pre-pass mandatory.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from vllm._sim import platform
from vllm.config.vllm import ModelConfig, SpeculativeConfig, VllmConfig, env_flag
from vllm.version import __version__, __version_tuple__

_TQ_HYBRID_SUPPORTED = False  # [anchor P4]

SPEC_METHODS = ("mtp", "ngram", "eagle", "eagle3", "draft_model", "medusa", "suffix")


@dataclass
class EngineArgs:
    args: argparse.Namespace

    def __post_init__(self) -> None:
        # vLLM loads general plugins here, after this module was imported: a plugin's text patch
        # of this file cannot change _TQ_HYBRID_SUPPORTED for this process any more.
        from vllm.plugins import load_general_plugins

        load_general_plugins()

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> EngineArgs:
        return cls(args)

    def create_engine_config(self) -> VllmConfig:
        a = self.args
        model_name = a.model_tag or a.model
        model = ModelConfig.from_dir(model_name)
        max_len = a.max_model_len or model.max_position_embeddings
        if max_len > model.max_position_embeddings and not env_flag("VLLM_ALLOW_LONG_MAX_MODEL_LEN"):
            raise ValueError(
                f"User-specified max_model_len ({max_len}) is greater than the derived max_model_len "
                f"(max_position_embeddings={model.max_position_embeddings} or model_max_length=None in "
                "model's config.json). To allow overriding this maximum, set the env var "
                "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme "
                "caution."
            )
        spec = None
        if a.speculative_config:
            method = str(a.speculative_config.get("method", ""))
            if method not in SPEC_METHODS:
                raise ValueError(
                    f"Unsupported speculative method: '{method}'. Supported: {', '.join(SPEC_METHODS)}"
                )
            n = int(a.speculative_config.get("num_speculative_tokens", 1))
            if n < 1:
                raise ValueError("num_speculative_tokens must be a positive integer")
            if method == "mtp" and model.mtp_layers_available == 0:
                raise ValueError(
                    f"MTP speculative decoding is not supported for {model.architectures[0]}: "
                    "the checkpoint has no MTP layers"
                )
            spec = SpeculativeConfig(method, n)
        self._check_kv_cache_dtype(a.kv_cache_dtype, model, spec)
        world = a.tensor_parallel_size * a.pipeline_parallel_size
        gpus = platform.visible_gpu_count()
        if gpus == 0:
            raise RuntimeError("No CUDA GPUs are available")
        if world > gpus:
            raise ValueError(
                f"World size ({world}) is larger than the number of available GPUs ({gpus}) in this node. "
                "If this is intentional and you are using:\n"
                "- ray, set '--distributed-executor-backend ray'.\n"
                "- multiprocessing, set '--nnodes' appropriately."
            )
        chunked = a.enable_chunked_prefill if a.enable_chunked_prefill is not None else True
        generation = {"temperature": 0.7, "top_p": 0.8, "top_k": 20}
        generation.update(a.override_generation_config or {})
        return VllmConfig(
            model=model,
            model_name=model_name,
            served_model_names=list(a.served_model_name or [model_name]),
            quantization=a.quantization or model.quant_method,
            dtype="float16"
            if a.dtype in ("half", "float16")
            else ("bfloat16" if a.dtype == "auto" else a.dtype),
            kv_cache_dtype=a.kv_cache_dtype,
            tensor_parallel_size=a.tensor_parallel_size,
            pipeline_parallel_size=a.pipeline_parallel_size,
            max_model_len=max_len,
            max_num_seqs=a.max_num_seqs or 256,
            max_num_batched_tokens=a.max_num_batched_tokens or 8192,
            gpu_memory_utilization=a.gpu_memory_utilization,
            speculative=spec,
            enforce_eager=a.enforce_eager,
            enable_prefix_caching=a.enable_prefix_caching if a.enable_prefix_caching is not None else True,
            enable_chunked_prefill=chunked,
            enable_auto_tool_choice=a.enable_auto_tool_choice,
            tool_call_parser=a.tool_call_parser,
            reasoning_parser=a.reasoning_parser,
            default_chat_template_kwargs=dict(a.default_chat_template_kwargs or {}),
            generation_config=generation,
            host=a.host or "0.0.0.0",
            port=a.port,
            api_key=a.api_key or os.environ.get("VLLM_API_KEY") or None,
        )

    @staticmethod
    def _check_kv_cache_dtype(
        kv_cache_dtype: str, model: ModelConfig, spec: SpeculativeConfig | None
    ) -> None:
        cc = platform.capability_str()
        # as rigfleet's catalog records it (gpus.yaml kv_cache_dtype_min_vllm): builds before 0.27.1
        # fail on sm_86 (vllm#26431); club-3090 runs fp8_e4m3 on 3090s with v0.27.1
        if (kv_cache_dtype == "fp8_e4m3" and platform.COMPUTE_CAPABILITY < (8, 9)
                and tuple(__version_tuple__[:3]) < (0, 27, 1)):
            raise ValueError(
                f"fp8_e4m3 KV cache is not supported on compute capability {cc} ({platform.DEVICE_NAME}) "
                f"by vLLM {__version__}. Use --kv-cache-dtype fp8_e5m2, int8_per_token_head or auto."
            )
        tq = kv_cache_dtype.startswith("turboquant_")
        if tq and model.is_hybrid and spec is not None and not _TQ_HYBRID_SUPPORTED:
            raise NotImplementedError(
                "TurboQuant KV cache is not supported for hybrid models (attention + linear-attention/Mamba "
                f"layers) with speculative decoding ({spec.method}, {spec.num_speculative_tokens} tokens): "
                f"{model.architectures[0]} has {model.num_hidden_layers - model.full_attention_layers} "
                "non-attention layers. Use --kv-cache-dtype auto, fp8_e5m2 or int8_per_token_head."
            )


def tq_hybrid_supported() -> bool:
    return _TQ_HYBRID_SUPPORTED
