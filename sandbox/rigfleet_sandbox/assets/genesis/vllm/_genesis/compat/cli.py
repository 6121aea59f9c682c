"""`genesis` console script (SIMULATED stand-in of `python3 -m vllm._genesis.compat.cli`).

Subcommands: doctor (markers on disk vs the apply matrix), self-test (structural checks),
verify --quick (every patch the env enables has its marker on disk), explain <ID>.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from vllm._genesis import GENESIS_RELEASE
from vllm._genesis.dispatcher import BY_ID, REGISTRY, decide, registry_problems
from vllm._genesis.guards import KNOWN_GOOD_VLLM_PINS


def _pkg() -> Path:
    import vllm

    return Path(vllm.__file__).resolve().parent


def _on_disk(spec_id: str) -> bool:
    spec = BY_ID[spec_id]
    try:
        return spec.marker in (_pkg() / spec.target).read_text(encoding="utf-8")
    except OSError:
        return False


def doctor() -> int:
    import vllm

    print(f"Genesis {GENESIS_RELEASE} (SIMULATED) on vllm {vllm.__version__} at {_pkg()}")
    print(f"known-good pins: {', '.join(KNOWN_GOOD_VLLM_PINS)}")
    for spec in REGISTRY:
        apply, reason = decide(spec, os.environ)
        state = "on-disk" if _on_disk(spec.id) else "-"
        print(f"  {spec.id:6} {'APPLY' if apply else 'skip':5} {state:8} {spec.title}  [{reason}]")
    return 0


def self_test() -> int:
    problems = registry_problems()
    for spec in REGISTRY:
        if not (_pkg() / spec.target).is_file():
            problems.append(f"{spec.id}: target vllm/{spec.target} missing")
    for problem in problems:
        print(f"FAIL {problem}")
    print(f"self-test: {'FAIL' if problems else 'PASS'} ({len(REGISTRY)} entries)")
    return 1 if problems else 0


def verify_quick() -> int:
    missing = [s.id for s in REGISTRY if decide(s, os.environ)[0] and not s.retired and not _on_disk(s.id)]
    print(f"verify --quick: {'FAIL, not on disk: ' + ', '.join(missing) if missing else 'PASS'}")
    return 1 if missing else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="genesis", description="Genesis CLI (SIMULATED stand-in)")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("doctor")
    sub.add_parser("self-test")
    verify = sub.add_parser("verify")
    verify.add_argument("--quick", action="store_true")
    explain = sub.add_parser("explain")
    explain.add_argument("patch_id")
    args = parser.parse_args(argv)
    if args.cmd == "doctor":
        return doctor()
    if args.cmd == "self-test":
        return self_test()
    if args.cmd == "verify":
        return verify_quick()
    spec = BY_ID.get(args.patch_id)
    if spec is None:
        print(f"unknown patch {args.patch_id}")
        return 2
    print(
        f"{spec.id}: {spec.title}\n  flag: {spec.flag}\n  target: vllm/{spec.target}\n"
        f"  default_on: {spec.default_on}\n  conflicts_with: {list(spec.conflicts_with)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
