"""Genesis apply_all pre-pass: `python3 -m vllm._genesis.patches.apply_all` (SIMULATED stand-in).

Boot-log lines, in order (research/genesis.md section 4): `Genesis platform: {...}`, the pin-gate
line, `[Genesis registry] ...`, the GPU-profile block, per patch `[Genesis Dispatcher] APPLY|SKIP`
and `[Genesis] applied|skipped|DRIFT skipped|FAILED: ...`, `Genesis Results: A applied,
S skipped, F failed`, `[Genesis] structured boot summary: {...}` and
`[Genesis compile-watchdog] apply_all elapsed: Xs`.

Exit codes: 0 ok; 1 a patch FAILED (P65 together with P67, a read-only target, ...);
2 orchestrator error or GENESIS_VLLM_PIN_POLICY=strict with a vllm.__version__ that is not in
KNOWN_GOOD_VLLM_PINS (nothing is patched then).

P87 (Genesis's own Marlin pad text patch) while the vllm#40361 Marlin overlay is baked in: the
overlay's marlin.py has no P87 anchor, so P87 is reported `[Genesis] DRIFT skipped: ...`
(boot continues, a strict health gate refuses it). When the target file cannot be written (the
club-3090 read-only bind-mount), the result is `[Genesis] FAILED: ... [Errno 30] Read-only file
system` and exit 1.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path

from vllm._genesis import GENESIS_RELEASE
from vllm._genesis.dispatcher import BY_ID, REGISTRY, decide, registry_problems, unknown_flags
from vllm._genesis.guards import check_pin, pin_policy
from vllm._genesis.wiring.text_patch import TextPatcher


def _gpu_count() -> int:
    try:
        from vllm._sim.platform import visible_gpu_count
    except ImportError:  # a vllm without the stand-in platform module: assume the two cards
        return 2
    return visible_gpu_count()


def run(
    *,
    dry_run: bool = False,
    quiet: bool = False,
    source: str = "apply_all",
    env: Mapping[str, str] | None = None,
    out: Callable[[str], None] | None = None,
) -> int:
    started = time.monotonic()
    env = dict(os.environ) if env is None else dict(env)

    def say(line: str, *, always: bool = False) -> None:
        if not quiet or always:
            (out or (lambda s: print(s, flush=True)))(line)

    import vllm

    version = str(getattr(vllm, "__version__", "unknown"))
    pkg = Path(vllm.__file__).resolve().parent
    gpus = _gpu_count()
    say(
        f"[Genesis] {GENESIS_RELEASE} (SIMULATED stand-in for Genesis v7.72.2; "
        "text patches write markers only)"
    )
    plat = {
        "genesis": GENESIS_RELEASE,
        "vllm": version,
        "python": platform.python_version(),
        "is_nvidia_cuda": gpus > 0,
        "gpus": gpus,
        "sm": "8.6" if gpus else None,
        "simulated": True,
    }
    say(f"Genesis platform: {json.dumps(plat, sort_keys=True)}")

    ok, lines = check_pin(version)
    for line in lines:
        say(line, always=not ok)
    if not ok:
        return 2

    problems = registry_problems()
    if problems:
        say(f"[Genesis] orchestrator error: registry inconsistent: {'; '.join(problems)}", always=True)
        return 2
    say(f"[Genesis registry] {len(REGISTRY)} dispatcher entries — schema-clean, dependency graph consistent.")
    if gpus:
        say(
            f"[Genesis GPU profile] {gpus}x NVIDIA GeForce RTX 3090 (sm_86, 24 GiB, L2 6 MB) — "
            "regime: ampere-consumer"
        )
    else:
        say("[Genesis GPU profile] no NVIDIA CUDA device visible — CUDA-only patches will skip")
    say(f"[Genesis GPU profile] pin policy={pin_policy()} source={source} simulated=true")
    for line in unknown_flags(env):
        say(line, always=True)

    wanted = {spec.id: decide(spec, env) for spec in REGISTRY}
    applied: list[str] = []
    skipped: list[str] = []
    failed: list[str] = []
    drift: list[str] = []
    for spec in REGISTRY:
        apply, reason = wanted[spec.id]
        label = f"{spec.id} ({spec.title})"
        if apply:
            clash = [other for other in spec.conflicts_with if wanted[other][0]]
            missing = [other for other in spec.requires if not wanted[other][0]]
            if clash:
                say(f"[Genesis Dispatcher] APPLY {spec.id} — {reason}")
                say(
                    f"[Genesis] FAILED: {label} — conflicts_with {', '.join(clash)} (both enabled); "
                    "enable only one of them",
                    always=True,
                )
                failed.append(spec.id)
                continue
            if missing:
                apply, reason = False, f"requires {', '.join(missing)} (not enabled)"
            elif spec.retired:
                apply, reason = False, spec.retired
            elif spec.cuda_only and gpus == 0:
                apply, reason = False, "platform: not NVIDIA CUDA (no GPU visible)"
        if not apply:
            say(f"[Genesis Dispatcher] SKIP {spec.id} — {reason}")
            say(f"[Genesis] skipped: {label} — {reason}")
            skipped.append(spec.id)
            continue
        say(f"[Genesis Dispatcher] APPLY {spec.id} — {reason}")
        patcher = TextPatcher(
            pkg / spec.target,
            marker=spec.marker,
            anchor=spec.anchor_text,
            replacement=spec.replacement_text,
            upstream_markers=spec.upstream_markers,
        )
        result = patcher.apply(dry_run=dry_run)
        where = f"vllm/{spec.target}"
        if result.status in ("applied", "would-apply"):
            verb = "would apply" if dry_run else "applied"
            say(f"[Genesis] {verb}: {label} -> {where}")
            applied.append(spec.id)
        elif result.status == "idempotent":
            say(f"[Genesis] applied: {label} -> {where} (IDEMPOTENT: marker present)")
            applied.append(spec.id)
        elif result.status == "upstream":
            say(f"[Genesis] skipped: {label} — {result.detail}")
            skipped.append(spec.id)
        elif result.status == "drift":
            say(f"[Genesis] DRIFT skipped: {label} -> {where} — {result.detail}", always=True)
            skipped.append(spec.id)
            drift.append(spec.id)
        else:
            say(f"[Genesis] FAILED: {label} -> {where} — {result.detail}", always=True)
            failed.append(spec.id)

    tag = " (dry-run)" if dry_run else ""
    say(
        f"Genesis Results{tag}: {len(applied)} applied, {len(skipped)} skipped, {len(failed)} failed",
        always=bool(failed),
    )
    summary = {
        "genesis": GENESIS_RELEASE,
        "vllm": version,
        "pin_known_good": True,
        "applied": applied,
        "failed": failed,
        "drift": drift,
        "skipped": len(skipped),
        "dry_run": dry_run,
        "simulated": True,
    }
    say(f"[Genesis] structured boot summary: {json.dumps(summary, sort_keys=True)}")
    elapsed = time.monotonic() - started
    say(f"[Genesis compile-watchdog] apply_all elapsed: {elapsed:.2f}s")
    if quiet:
        say(
            f"[Genesis plugin] {source}: {len(applied)} applied, {len(skipped)} skipped, "
            f"{len(failed)} failed (SIMULATED)",
            always=True,
        )
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m vllm._genesis.patches.apply_all",
        description="Apply Genesis patches (SIMULATED stand-in).",
    )
    parser.add_argument("--dry-run", action="store_true", help="report what would apply; edit nothing")
    parser.add_argument(
        "--verify-rebinds",
        action="store_true",
        help="check the class rebinds (the stand-in has none; always OK)",
    )
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    if args.verify_rebinds:
        print("[Genesis] verify-rebinds: the SIMULATED stand-in models text patches only; nothing to verify")
        return 0
    try:
        return run(dry_run=args.dry_run, quiet=args.quiet)
    except Exception as exc:  # orchestrator errors exit 2, as upstream does
        traceback.print_exc()
        print(f"[Genesis] orchestrator error: {exc}", flush=True)
        return 2


__all__ = ["BY_ID", "main", "run"]

if __name__ == "__main__":
    sys.exit(main())
