"""Fault switches for tests, read from RIGFLEET_SANDBOX_FAULT. SIMULATED.

* boot-crash      prints a realistic engine-core traceback during boot and exits 1.
* unhealthy       boots and serves, but GET /health answers 500.
* slow-boot       ready (port bound, "Application startup complete.") only after
                  RIGFLEET_SANDBOX_SLOW_BOOT_S seconds (default 20).
* garbage-output  boots, /health is fine, short single-turn answers are right (a basic gate
                  passes, as the seed's broken TQ3+MTP path did), but: long outputs collapse into
                  `!` floods or first-word repetition, multi-turn / longer prompts get ~1/3 silent
                  empty replies (HTTP 200, 0 completion tokens), needles in long prompts are
                  missed, and MTP acceptance is near 0 (RIGFLEET_SANDBOX_GARBAGE_AL=100 makes it a
                  suspicious 100% instead).
The same garbage behaviour is what TurboQuant KV + MTP gives without Genesis P67.
Several faults may be given comma-separated; unknown names are logged and ignored.
"""

from __future__ import annotations

import os

KNOWN = ("boot-crash", "unhealthy", "slow-boot", "garbage-output")


def active() -> set[str]:
    raw = os.environ.get("RIGFLEET_SANDBOX_FAULT", "")
    return {part.strip().lower() for part in raw.split(",") if part.strip() and part.strip() != "none"}


def unknown() -> set[str]:
    return active() - set(KNOWN)


def slow_boot_seconds() -> float:
    try:
        return max(0.0, float(os.environ.get("RIGFLEET_SANDBOX_SLOW_BOOT_S", "20")))
    except ValueError:
        return 20.0


def garbage_full_acceptance() -> bool:
    return os.environ.get("RIGFLEET_SANDBOX_GARBAGE_AL", "").strip() in ("100", "1.0", "full")
