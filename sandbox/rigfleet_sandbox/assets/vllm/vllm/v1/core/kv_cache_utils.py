"""KV-cache pool size of the SIMULATED engine (stand-in for vllm/v1/core/kv_cache_utils.py).

A documented formula, not a measurement. Constants are fitted to the seed report's measured pools
(int8 605K, tq3-nomtp 1.73M, tq3-mtp-genesis 1.22M tokens at 262K) and are the rigfleet
capacity planner's (rigfleet/catalog/models.yaml, rigfleet/planner.py), so a health gate comparing
the boot-log pool with the planner's prediction sees 100% (to within one 16-token block).

    bytes_per_token = attention_layers x kv_heads x slot_bytes
        attention_layers = full-attention layers (16 of Qwen3.6-27B's 64; the 48 Gated-DeltaNet
                           layers keep a fixed-size state, not per-token KV)
                           + 1 when MTP speculative decoding is on (its layer's KV shares the pool)
        slot_bytes       = (k_bits + v_bits) x head_dim / 8 + extra bytes per head (scales, norms)
    per_gpu_kv_GiB  = gpu_memory_utilization x 24 GiB
                      - weights_GiB / (TP x PP)                (index.json metadata.total_size)
                      - 1.78 runtime (CUDA context, NCCL, cudagraph pool)
                      - 0.108 x max_num_batched_tokens / 1024  (activation peak of the profile run)
                      - 1.31 if MTP (draft head + its buffers)
                      - 1.07 if turboquant_* (decode scratch workspace)
    tokens          = floor(per_gpu_kv_GiB x GPUs x 2^30 / bytes_per_token), down to a multiple of 16

Examples (head_dim 256, 4 KV heads, 16.3 GiB weights, TP=2):
    int8_per_token_head, MTP n=3, util 0.92, batched 8192 ->   605,856 tokens, 2.31x at 262,144
    turboquant_3bit_nc,  MTP n=3, util 0.85, batched 4128 -> 1,220,896 tokens, 4.66x
    turboquant_3bit_nc,  no MTP,  util 0.92, batched 8192 -> 1,731,264 tokens, 6.60x
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1 << 30
BLOCK_TOKENS = 16
RUNTIME_OVERHEAD_GIB = 1.78
ACTIVATION_GIB_PER_1K_BATCHED = 0.108
MTP_DRAFT_GIB = 1.31
TURBOQUANT_WORKSPACE_GIB = 1.07

# dtype -> (k_bits, v_bits, extra bytes per KV head); "auto" follows the model dtype (16-bit).
KV_DTYPES: dict[str, tuple[int, int, int]] = {
    "auto": (16, 16, 0),
    "fp8": (8, 8, 0),
    "fp8_e4m3": (8, 8, 0),
    "fp8_e5m2": (8, 8, 0),
    "int8_per_token_head": (8, 8, 8),
    "turboquant_k8v4": (8, 4, 4),
    "turboquant_4bit_nc": (4, 4, 6),
    "turboquant_k3v4_nc": (3, 4, 6),
    "turboquant_3bit_nc": (3, 3, 6),
}


@dataclass(frozen=True)
class KVPool:
    bytes_per_token: int
    per_gpu_available_gib: float
    num_gpus: int
    tokens: int

    def max_concurrency(self, max_model_len: int) -> float:
        return self.tokens / max_model_len if max_model_len else 0.0


def slot_bytes(kv_cache_dtype: str, head_dim: int) -> int:
    k_bits, v_bits, extra = KV_DTYPES[kv_cache_dtype]
    return (k_bits + v_bits) * head_dim // 8 + extra


def compute_kv_pool(
    *,
    kv_cache_dtype: str,
    gpu_memory_utilization: float,
    num_gpus: int,
    weights_gib: float,
    max_num_batched_tokens: int,
    full_attention_layers: int,
    kv_heads: int,
    head_dim: int,
    mtp_layers: int,
    gpu_memory_gib: float = 24.0,
) -> KVPool:
    layers = full_attention_layers + mtp_layers
    per_token = layers * kv_heads * slot_bytes(kv_cache_dtype, head_dim)
    available = (
        gpu_memory_utilization * gpu_memory_gib
        - weights_gib / max(num_gpus, 1)
        - RUNTIME_OVERHEAD_GIB
        - ACTIVATION_GIB_PER_1K_BATCHED * max_num_batched_tokens / 1024
        - (MTP_DRAFT_GIB if mtp_layers else 0.0)
        - (TURBOQUANT_WORKSPACE_GIB if kv_cache_dtype.startswith("turboquant_") else 0.0)
    )
    tokens = 0
    if available > 0:
        tokens = int(available * num_gpus * GIB // per_token) // BLOCK_TOKENS * BLOCK_TOKENS
    return KVPool(per_token, available, num_gpus, tokens)
