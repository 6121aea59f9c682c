"""Capacity planner: the KV pool a variant gets on a rig, in tokens, before anything boots.

Per GPU, vLLM hands the KV cache what is left of `gpu_memory_utilization x VRAM` after the
weights shard and the runtime's own needs. With tensor parallelism each GPU stores its share of
the KV heads for every token, so the pool in tokens is that memory over the per-GPU bytes one
token costs in the full-attention layers (the Gated-DeltaNet layers of the hybrid keep a fixed
per-sequence state, not per-token KV).

The per-token cost comes from the architecture (catalog/models.yaml) and the KV dtype
(catalog/kv_dtypes.yaml). The non-KV terms (runtime, MTP draft, activations per batched token,
TurboQuant's decode workspace) are four constants fitted to the seed's measured pools:

    int8 605K, tq3-nomtp 1.73M, tq3-mtp-genesis 1.22M, patch-only tq3-mtp 1.42M.

On tq3-nomtp the seed states both 1.42M and 1.73M. We match 1.73M: the seed's own per-variant
table and its 6.59x concurrency (1.73M / 262144 = 6.6) give 1.73M for the Genesis-free no-MTP
compose, while 1.42M (5.41x) is the pool of the broken patch-only TQ3 *with* MTP, which the
TL;DR mislabels "without MTP". The per-token arithmetic agrees: without the MTP draft layer and
its weights the same 0.92 budget must hold more tokens than with them, not fewer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rigfleet import catalog
from rigfleet.schema import Rig, Variant

GIB = 1024**3


@dataclass(frozen=True)
class Capacity:
    kv_pool_tokens: int
    max_full_context_streams: int
    concurrency: float
    bytes_per_token_per_gpu: int
    kv_gib_per_gpu: float


def tensor_parallel(rig: Rig, variant: Variant) -> int:
    return rig.tensor_parallel_size or variant.tensor_parallel_size


def pipeline_parallel(rig: Rig, variant: Variant) -> int:
    return rig.pipeline_parallel_size or variant.pipeline_parallel_size


def bytes_per_token_per_gpu(variant: Variant, tp: int, pp: int) -> int:
    model = catalog.models()[variant.model]
    dtype = catalog.kv_dtypes()[variant.kv_cache_dtype]
    head_dim = model["head_dim"]
    per_head = math.ceil(dtype["k_bits"] * head_dim / 8) + math.ceil(dtype["v_bits"] * head_dim / 8)
    per_head += dtype["extra_bytes"]
    layers = model["full_attention_layers"] + (model["mtp_attention_layers"] if variant.mtp_tokens else 0)
    heads_per_gpu = max(1, model["kv_heads"] // tp)
    return math.ceil(layers / pp) * heads_per_gpu * per_head


def predict(rig: Rig, variant: Variant) -> Capacity:
    model = catalog.models()[variant.model]
    fit = model["planner"]
    gpu = catalog.gpus()[rig.gpu_model]
    tp, pp = tensor_parallel(rig, variant), pipeline_parallel(rig, variant)
    budget = variant.gpu_memory_utilization * gpu["vram_mib"] / 1024
    weights = model["weights"][variant.weights]["size_gib"] / (tp * pp)
    non_kv = weights + fit["runtime_overhead_gib"]
    non_kv += fit["activation_gib_per_1k_batched_tokens"] * variant.max_num_batched_tokens / 1024
    if variant.mtp_tokens:
        non_kv += fit["mtp_draft_gib"]
    if variant.kv_cache_dtype.startswith("turboquant_"):
        non_kv += fit["turboquant_workspace_gib"]
    kv_gib = max(0.0, budget - non_kv)
    per_token = bytes_per_token_per_gpu(variant, tp, pp)
    pool = int(kv_gib * GIB // per_token)
    return Capacity(
        kv_pool_tokens=pool,
        max_full_context_streams=pool // variant.max_model_len,
        concurrency=round(pool / variant.max_model_len, 2),
        bytes_per_token_per_gpu=per_token,
        kv_gib_per_gpu=round(kv_gib, 2),
    )
