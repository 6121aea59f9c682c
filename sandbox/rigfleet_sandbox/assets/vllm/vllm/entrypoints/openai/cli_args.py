"""`vllm serve` argument parser (SIMULATED stand-in of vLLM's FlexibleArgumentParser setup).

Accepts the flags the rigfleet catalog variants and club-3090 composes pass; anything else is
refused the way argparse does (usage line + `error: unrecognized arguments`, exit 2). An image that
carries vllm/_sim/real_surface.json (the CLI surface derived from the real vLLM release wheel of
its version, rigfleet_sandbox.stacks) accepts exactly the real release's flags instead: a flag the
real release lacks is refused even if modelled here, a real flag not modelled here is accepted and
ignored, and a choice the real release does not list (--kv-cache-dtype ...) is refused.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vllm.v1.core.kv_cache_utils import KV_DTYPES

KV_CACHE_DTYPES = tuple(KV_DTYPES)


def _json(value: str) -> dict:
    parsed = json.loads(value)
    if not isinstance(parsed, dict):
        raise ValueError("expected a JSON object")
    return parsed


_json.__name__ = "loads"  # argparse names the type in its error: "invalid loads value"


def _unit_float(value: str) -> float:
    number = float(value)
    if not 0.0 < number <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return number


REAL_SURFACE = Path(__file__).resolve().parents[2] / "_sim" / "real_surface.json"


def real_surface() -> dict | None:
    try:
        return json.loads(REAL_SURFACE.read_text())
    except (OSError, ValueError):
        return None


class RealSurfaceParser(argparse.ArgumentParser):
    """The stand-in's parser held to the real release's flag set and value choices."""

    real: dict | None = None

    def parse_args(self, args=None, namespace=None):  # type: ignore[no-untyped-def,override]
        if self.real is None:
            return super().parse_args(args, namespace)
        argv = list(args) if args is not None else []
        flags = set(self.real.get("flags", []))
        used = [a.split("=", 1)[0] for a in argv if a.startswith("--")]
        unknown = [f for f in used if f not in flags and f not in ("--help",)]
        if unknown:
            self.error(f"unrecognized arguments: {' '.join(unknown)} "
                       f"(not a flag of vLLM {self.real.get('release')}, SIMULATED from its real CLI surface)")
        parsed, rest = self.parse_known_args(argv, namespace)
        for flag, choices in self.real.get("choices", {}).items():
            value = getattr(parsed, flag.lstrip("-").replace("-", "_"), None)
            if flag in used and isinstance(value, str) and value not in choices:
                self.error(f"argument {flag}: invalid choice: {value!r} (choose from {', '.join(choices)})")
        positional = [r for r in rest if not r.startswith("-")]
        if positional and not any(r.startswith("--") for r in rest):
            self.error(f"unrecognized arguments: {' '.join(positional)}")
        return parsed  # the rest: real flags the simulation does not model (accepted, ignored)


def make_arg_parser() -> argparse.ArgumentParser:
    parser = RealSurfaceParser(
        prog="vllm serve",
        usage="vllm serve [model_tag] [options]",
        description="Start the vLLM OpenAI-compatible API server (SIMULATED stand-in).",
    )
    add = parser.add_argument
    add("model_tag", nargs="?", default=None, help="model name or path (overrides --model)")
    add("--model", default="Qwen/Qwen3-0.6B")
    add("--served-model-name", nargs="+", default=None)
    add("--tokenizer", default=None)
    add("--revision", default=None)
    add("--quantization", "-q", default=None)
    add("--dtype", default="auto", choices=["auto", "half", "float16", "bfloat16", "float", "float32"])
    add("--tensor-parallel-size", "-tp", type=int, default=1)
    add("--pipeline-parallel-size", "-pp", type=int, default=1)
    add("--max-model-len", type=int, default=None)
    add("--max-num-seqs", type=int, default=None)
    add("--max-num-batched-tokens", type=int, default=None)
    add("--gpu-memory-utilization", type=_unit_float, default=0.9)
    add("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES)
    add("--kv-cache-memory-bytes", type=int, default=None)
    add("--block-size", type=int, default=None)
    add("--swap-space", type=float, default=4)
    add("--speculative-config", type=_json, default=None)
    add("--trust-remote-code", action="store_true")
    add("--chat-template", default=None)
    add("--reasoning-parser", default=None)
    add("--default-chat-template-kwargs", type=_json, default=None)
    add("--enable-auto-tool-choice", action="store_true")
    add("--tool-call-parser", default=None)
    add("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    add("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None)
    add("--long-prefill-token-threshold", type=int, default=0)
    add("--override-generation-config", type=_json, default=None)
    add("--generation-config", default="auto")
    add("--disable-custom-all-reduce", action="store_true")
    add("--enforce-eager", action="store_true")
    add("--compilation-config", "-O", type=_json, default=None)
    add("--load-format", default="auto")
    add("--download-dir", default=None)
    add("--seed", type=int, default=None)
    add("--max-logprobs", type=int, default=20)
    add("--disable-log-stats", action="store_true")
    add("--disable-log-requests", action="store_true")
    add("--enable-log-requests", action="store_true")
    add("--uvicorn-log-level", default="info")
    add("--host", default=None)
    add("--port", type=int, default=8000)
    add("--api-key", default=None)
    add("--allowed-origins", type=_json, default=None)
    parser.real = real_surface()
    return parser


DEFAULTS = {action.dest: action.default for action in make_arg_parser()._actions}


def non_default_args(args: argparse.Namespace) -> dict:
    """What vLLM logs as `non-default args: {...}` at boot (the api key is masked)."""
    out = {k: v for k, v in vars(args).items() if k in DEFAULTS and DEFAULTS[k] != v}
    if out.get("api_key"):
        out["api_key"] = "***"
    return out
