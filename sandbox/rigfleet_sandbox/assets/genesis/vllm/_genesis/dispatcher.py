"""Patch registry and the v7 apply rule (SIMULATED stand-in of Genesis v7.72.2's dispatcher).

v7.72.2 rule: GENESIS_ENABLE_<X> truthy (1/true/yes/on) applies; falsy (0/false/no/off) kills;
unset applies only the legacy default-on patches. Each patch is one text patch on one stand-in
vllm file: the anchor line `# [anchor <ID>]` (or a custom anchor) becomes the marker line
`# [Genesis <ID> v7.72.2-sim] <title>`. Targets are relative to the vllm package directory.

`python3 -m vllm._genesis.dispatcher` prints the apply matrix for the current environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from vllm._genesis import GENESIS_RELEASE

ARG_UTILS = "engine/arg_utils.py"
TQ_ATTN = "v1/attention/backends/turboquant_attn.py"
CONFIG = "config/vllm.py"
SERVING = "entrypoints/openai/chat_completion/serving.py"
RUNNER = "v1/worker/gpu_model_runner.py"
GDN = "model_executor/layers/mamba/gdn_linear_attn.py"
WORKER = "v1/worker/gpu_worker.py"
MARLIN = "model_executor/kernels/linear/mixed_precision/marlin.py"

TRUTHY = {"1", "true", "yes", "on"}
FALSY = {"0", "false", "no", "off"}


@dataclass(frozen=True)
class PatchSpec:
    id: str
    flag: str
    title: str
    target: str
    default_on: bool = False
    cuda_only: bool = True
    conflicts_with: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()
    retired: str = ""
    upstream_markers: tuple[str, ...] = ()
    anchor: str = ""
    replacement: str = ""

    @property
    def marker(self) -> str:
        return f"# [Genesis {self.id} {GENESIS_RELEASE}]"

    @property
    def anchor_text(self) -> str:
        return self.anchor or f"# [anchor {self.id}]"

    @property
    def replacement_text(self) -> str:
        return self.replacement or f"{self.marker} {self.title}"


def _p(pid: str, suffix: str, title: str, target: str, **kw: object) -> PatchSpec:
    flag = "GENESIS_ENABLE_" + (f"{pid.upper()}_{suffix}" if suffix else pid.upper())
    return PatchSpec(pid, flag, title, target, **kw)  # type: ignore[arg-type]


def _legacy(pid: str, title: str, target: str, **kw: object) -> PatchSpec:
    return _p(pid, "", title, target, default_on=True, **kw)


API = {"cuda_only": False}

REGISTRY: tuple[PatchSpec, ...] = (
    # Legacy default-on patches (applied unless their flag is explicitly 0).
    _legacy("P1", "FP8 KV-cache dtype propagation", WORKER),
    _legacy("P3", "TurboQuant BF16->FP8 cast guard", TQ_ATTN),
    _legacy(
        "P4",
        "TurboQuant KV on hybrid models",
        ARG_UTILS,
        anchor="_TQ_HYBRID_SUPPORTED = False  # [anchor P4]",
        replacement=(
            f"_TQ_HYBRID_SUPPORTED = True  # [Genesis P4 {GENESIS_RELEASE}] TurboQuant KV on hybrid models"
        ),
    ),
    _legacy("P5", "KV page-size unification for hybrid models", TQ_ATTN),
    _legacy("P6", "TurboQuant page size", TQ_ATTN),
    _legacy("P7", "GDN dual-stream in_proj", GDN),
    _legacy("P12", "Qwen3 <tool_call> token fix", SERVING, **API),
    _legacy("P14", "block-table tail zeroing", RUNNER),
    _legacy("P15", "Qwen3 null tool arguments", SERVING, **API),
    _legacy("P17", "Marlin MoE per-SM tuning", WORKER),
    _legacy("P18b", "TQ decode stage-count clamp", TQ_ATTN),
    _legacy("P20", "TQ continuation prefill FP16 rotate", TQ_ATTN),
    _legacy("P22", "TQ shared dequant prealloc", RUNNER),
    _legacy("P23", "Marlin FP32_REDUCE env override", WORKER),
    _legacy("P24", "fused_moe num_warps/num_stages overlay", WORKER),
    _legacy("P26", "TQ prefill output prealloc", RUNNER),
    _legacy("P27", "Qwen3 BEFORE-THINK fallback", SERVING, **API),
    _legacy("P28", "GDN core_attn_out prealloc", GDN),
    _legacy("P29", "tool parser IndexError guard", SERVING, **API),
    _legacy("P31", "MoE router fp32 softmax", WORKER),
    _legacy("P32", "TQ cu_2 / synth_seq_lens prealloc", RUNNER),
    _legacy("P34", "Mamba zero-collapse deadlock guard", GDN),
    _legacy("P36", "TQ shared decode buffers", RUNNER),
    _legacy("P38", "TQ continuation-prefill persistent workspace", RUNNER),
    _legacy("P39a", "FLA chunk_scaled_dot_kkt buffer pool", GDN),
    _legacy("P44", "TQ mixed-batch attn_out pool", RUNNER),
    _legacy("P46", "GDN gating buffer pool", GDN),
    _legacy("P51", "TQ-active detection", TQ_ATTN),
    _legacy("PN33", "spec-decode warmup K-aware sizing", RUNNER),
    _legacy("PN35", "inputs_embeds optional for text-only", RUNNER),
    _legacy("PN60", "quantization preflight", WORKER),
    _legacy("PN63", "kernel cache key hardening", WORKER),
    # Opt-in patches (the club-3090 TQ3+MTP set and its neighbours).
    _p("P15B", "FA_VARLEN_CLAMP", "FA varlen clamp", RUNNER),
    _p("P38B", "COMPILE_SAFE", "P38 compile-safe variant", RUNNER),
    _p("P40", "", "TQ k8v4 GQA kernel (pays only with L2 >= 24 MB)", TQ_ATTN),
    _p("P58", "ASYNC_PLACEHOLDER_FIX", "async scheduler placeholder fix", RUNNER),
    _p("P60", "GDN_NGRAM_FIX", "GDN + ngram state recovery", GDN),
    _p("P60B", "TRITON_KERNEL", "GDN ngram Triton kernel", GDN),
    _p("P61", "QWEN3_MULTI_TOOL", "Qwen3 multi-tool first occurrence", SERVING, **API),
    _p("P61B", "STREAMING_OVERLAP", "Qwen3 streaming partial-tag overlap guard", SERVING, **API),
    _p("P62", "STRUCT_OUT_SPEC_TIMING", "structured-output spec-decode timing", RUNNER),
    _p("P64", "QWEN3CODER_MTP_STREAMING", "qwen3coder MTP streaming tool-call edge", SERVING, **API),
    _p(
        "P65",
        "TURBOQUANT_SPEC_CG_DOWNGRADE",
        "TurboQuant spec-decode PIECEWISE cudagraph downgrade",
        CONFIG,
        conflicts_with=("P67",),
    ),
    _p("P66", "CUDAGRAPH_SIZE_FILTER", "cudagraph capture sizes divisible by 1+K", CONFIG),
    _p(
        "P67",
        "TQ_MULTI_QUERY_KERNEL",
        "TurboQuant multi-query kernel for spec-decode K+1 verify",
        TQ_ATTN,
        conflicts_with=("P65",),
        anchor="_MULTI_QUERY_VERIFY_KERNEL = False  # [anchor P67]",
        replacement=(
            f"_MULTI_QUERY_VERIFY_KERNEL = True  # [Genesis P67 {GENESIS_RELEASE}] "
            "TurboQuant multi-query kernel for spec-decode K+1 verify"
        ),
    ),
    _p("P68", "AUTO_FORCE_TOOL", "tool_choice auto -> required at long context", SERVING, **API),
    _p("P69", "LONG_CTX_TOOL_REMINDER", "long-context tool reminder", SERVING, **API),
    _p("P72", "PROFILE_RUN_CAP", "profile_run M cap (GENESIS_PROFILE_RUN_CAP_M)", CONFIG),
    _p("P74", "CHUNK_CLAMP", "chunked-prefill clamp", CONFIG),
    _p("P78", "TOLIST_CAPTURE_GUARD", ".tolist() capture guard", RUNNER),
    _p("P81", "FP8_BLOCK_SCALED_M_LE_8", "fp8 block-scaled M<=8", WORKER),
    _p("P82", "", "acceptance-threshold OR-clause", RUNNER),
    _p("P83", "", "MTP keep-last-verified (research)", RUNNER),
    _p("P84", "", "draft-probability capture (research)", RUNNER),
    _p("P85", "", "adaptive K (research)", RUNNER, requires=("P84",)),
    _p("P87", "", "Marlin pad sub-tile N (text patch of marlin.py)", MARLIN),
    _p("P91", "", "spec-decode block-table reuse", RUNNER),
    _p("P94", "", "spec-decode prepare_next_token_ids fast path", RUNNER),
    # v0.20 already carries the workspace revert: the drift marker fires and PN34 does the work.
    _p("P98", "", "TQ workspace revert", TQ_ATTN, upstream_markers=("_tq_workspace_reserved_before_lock",)),
    _p("P99", "", "MTP draft logits slice", RUNNER),
    _p("P100", "", "rejection sampler fast path", RUNNER),
    _p("P101", "", "TQ continuation slice", TQ_ATTN),
    _p("P103", "", "FLA chunked GDN self-install hook", GDN),
    _p("P107", "", "MTP draft KV reuse", RUNNER),
    _p("PN8", "MTP_DRAFT_ONLINE_QUANT", "MTP draft online quant (vllm#40849)", RUNNER),
    _p(
        "PN9",
        "INDEPENDENT_DRAFTER_ATTN",
        "independent drafter attention backend",
        RUNNER,
        retired="self-retired: upstream selects the drafter backend itself on this pin",
    ),
    _p("PN11", "GDN_AB_CONTIGUOUS", "GDN a/b contiguous", GDN),
    _p("PN12", "FFN_INTERMEDIATE_POOL", "FFN intermediate pool (Cliff 1)", RUNNER),
    _p(
        "PN13",
        "CUDA_GRAPH_LAMBDA_ARITY",
        "cudagraph lambda arity",
        RUNNER,
        retired="retired at v7.70 for the 0.20.2 pin (upstream fixed the arity)",
    ),
    _p("PN14", "TQ_DECODE_OOB_CLAMP", "TQ decode OOB clamp", TQ_ATTN),
    _p("PN17", "FA2_LSE_CLAMP", "FA2 softmax_lse clamp (Cliff 1)", RUNNER),
    _p("PN19", "SCOPED_MAX_SPLIT", "scoped max_split_size_mb", WORKER),
    _p("PN22", "LOCAL_ARGMAX_TP", "local argmax under TP", RUNNER),
    _p("PN25", "SILU_INDUCTOR_SAFE", "SiLU inductor-safe", WORKER),
    _p("PN26", "SPARSE_V", "sparse-V decode", TQ_ATTN),
    _p("PN30", "DS_LAYOUT_SPEC_DECODE", "DS conv-state layout under spec-decode", GDN),
    _p("PN32", "", "chunked GDN (Cliff 2)", GDN),
    _p("PN34", "WORKSPACE_LOCK_RELAX", "workspace lock relax (vllm#39226)", RUNNER),
    _p("PN50", "", "GDN state checkpoint", GDN),
    _p("PN54", "GDN_CONTIGUOUS_DEDUP", "GDN dedup (Cliff 2b)", GDN),
    _p("PN55", "", "GDN varlen fast path", GDN),
    _p("PN57", "", "TQ centroid cache in ~/.cache/genesis", TQ_ATTN),
    _p("PN59", "STREAMING_GDN", "streaming GDN", GDN),
)

BY_ID: dict[str, PatchSpec] = {spec.id: spec for spec in REGISTRY}
FLAGS: dict[str, PatchSpec] = {spec.flag: spec for spec in REGISTRY}


def decide(spec: PatchSpec, env: Mapping[str, str]) -> tuple[bool, str]:
    """(apply?, reason) for one patch under the v7.72.2 rule."""
    raw = env.get(spec.flag)
    value = raw.strip().lower() if raw is not None else None
    if value in TRUTHY:
        return True, f"env {spec.flag}={raw}"
    if value in FALSY:
        return False, f"disabled by {spec.flag}={raw}"
    if spec.default_on:
        return True, "legacy default-on"
    return False, f"opt-in only — set {spec.flag}=1 to engage"


def unknown_flags(env: Mapping[str, str]) -> list[str]:
    """GENESIS_ENABLE_* names no dispatcher entry answers to (typos silently do nothing upstream)."""
    lines = []
    for name in sorted(env):
        if not name.startswith("GENESIS_ENABLE_") or name in FLAGS:
            continue
        short = name.removeprefix("GENESIS_ENABLE_").split("_")[0]
        hint = next((s.flag for s in REGISTRY if s.id.upper() == short), None)
        extra = f" (did you mean {hint}?)" if hint else ""
        lines.append(f"[Genesis] WARNING: {name} matches no dispatcher entry and is ignored{extra}")
    return lines


def registry_problems() -> list[str]:
    problems = []
    if len(BY_ID) != len(REGISTRY):
        problems.append("duplicate patch ids")
    for spec in REGISTRY:
        for other in spec.conflicts_with + spec.requires:
            if other not in BY_ID:
                problems.append(f"{spec.id} refers to unknown patch {other}")
    return problems


def main() -> int:
    env = dict(os.environ)
    print(f"Genesis {GENESIS_RELEASE} apply matrix (SIMULATED stand-in)")
    for spec in REGISTRY:
        apply, reason = decide(spec, env)
        print(f"  {'APPLY' if apply else 'skip ':5} {spec.id:6} {spec.title:55} {reason}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
