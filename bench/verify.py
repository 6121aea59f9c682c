"""The cost of real-upstream verification (no sandbox): cold, with the vLLM wheels downloaded
through pip and the patch trees cloned from the mirror map, against warm, from the derivation
cache; and what the warm path adds to `rigfleet check` (check with verification against check
with it switched off, same inventory, same process kind).

The inventory is the shipped example with its mirror map pointed at the shared mirror's git
bundle (the real Genesis/SNDR repository; this machine cannot reach its git host).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rigfleet.loader import load_fleet
from rigfleet.upstream import fleet as upstream_fleet
from rigfleet.upstream import sources

REPO = Path(__file__).resolve().parents[1]
TREE_SOURCE = "https://github.com/Sandermage/genesis-vllm-patches.git"
MIRRORS = [os.environ.get("RIGFLEET_SHARED_MIRROR", ""), str(REPO.parent / "shared" / "mirror"), "/work/shared/mirror"]
RIGFLEET = str(Path(sys.executable).parent / "rigfleet")

Record = Callable[[str, str, float, str], None]


def bundle() -> Path:
    for candidate in MIRRORS:
        path = Path(candidate) / "genesis-vllm-patches.bundle" if candidate else None
        if path is not None and path.is_file():
            return path
    raise SystemExit("bench verify: the shared mirror (genesis-vllm-patches.bundle) is missing: "
                     "set RIGFLEET_SHARED_MIRROR")


def inventory(into: Path) -> Path:
    target = into / "inventory"
    shutil.copytree(REPO / "inventory" / "example", target)
    (target / "mirrors.yml").write_text(f"prefixes:\n  {TREE_SOURCE}: {bundle()}\n", encoding="utf-8")
    return target


def _timed(argv: list[str], env: dict[str, str], ok: tuple[int, ...] = (0,)) -> float:
    started = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    seconds = time.monotonic() - started
    if done.returncode not in ok:
        raise SystemExit(f"bench verify: {' '.join(argv[1:])} exited {done.returncode}:\n"
                         f"{(done.stdout + done.stderr)[-2000:]}")
    return seconds


def run(repeats: int, record: Record, say: Callable[[str], None]) -> None:
    with tempfile.TemporaryDirectory(prefix="rigfleet-bench-verify-") as tmp:
        inv = inventory(Path(tmp))
        cache = Path(tmp) / "cache"
        base = {**os.environ, "RIGFLEET_INVENTORY": str(inv), sources.CACHE_ENV: str(cache)}
        base.pop(upstream_fleet.SKIP_ENV, None)
        # Cold once per bench run: every wheel is a real download (pip's own cache off), every tree a
        # clone of the bundle; repeating it would only re-measure the network.
        say("verification cold: rigfleet pins --verify with an empty cache (wheels downloaded through pip)")
        cold = _timed([RIGFLEET, "pins", "--verify"], {**base, "PIP_NO_CACHE_DIR": "1"})
        record("verify cold (download wheels, clone trees), all pin sets", "s", cold, "")
        for attempt in range(repeats):
            say(f"verification warm and check with/without it ({attempt + 1}/{repeats})")
            record("verify warm (from the cache), all pin sets", "s",
                   _timed([RIGFLEET, "pins", "--verify"], base), "")
            # check exits 0 or 1 (warnings/errors of the example inventory are its own business)
            with_verify = _timed([RIGFLEET, "check"], base, ok=(0, 1))
            without = _timed([RIGFLEET, "check"], {**base, upstream_fleet.SKIP_ENV: "1"}, ok=(0, 1))
            record("rigfleet check, verification warm", "s", with_verify, "")
            record("rigfleet check, verification off", "s", without, "")
            record("  warm verification adds to check", "s", with_verify - without, "< 2 s")
        # the same path in-process (the guard's call), without the interpreter start-up's noise
        old = os.environ.get(sources.CACHE_ENV)
        os.environ[sources.CACHE_ENV] = str(cache)
        try:
            fleet = load_fleet(inv)
            for _ in range(repeats):
                started = time.monotonic()
                upstream_fleet.problems(fleet)
                record("  the guard's verification call, warm, in-process", "s", time.monotonic() - started, "")
        finally:
            if old is None:
                os.environ.pop(sources.CACHE_ENV, None)
            else:
                os.environ[sources.CACHE_ENV] = old
