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

One failure each, for the verify ladder (vllm._sim.degrade applies them; the N are env knobs):
* bang-flood      replies longer than RIGFLEET_SANDBOX_FLOOD_AFTER tokens (default 40) turn into `!`.
* repetition      replies longer than RIGFLEET_SANDBOX_FLOOD_AFTER tokens repeat their first word.
* empty-replies   every third chat reply is silent empty (HTTP 200, 0 completion tokens).
* broken-sse      a stream ends with a cut-off JSON event, empty deltas and no `data: [DONE]`.
* bad-tool-json   tool-call arguments are cut-off JSON.
* low-acceptance  MTP drafts are almost never accepted (mean acceptance length ~1.1).
* needle-miss     questions about a secret planted in the prompt are answered "not found".
* vram-growth     each request adds RIGFLEET_SANDBOX_VRAM_STEP_MIB (default 64) to the GPU memory
                  the engine reports to the stand-in nvidia-smi (compute-apps.json in its state dir;
                  in a container, the rig's nvidia-smi reads it through /proc/PID/root).
* late-failure    healthy for RIGFLEET_SANDBOX_LATE_AFTER requests (default 60: more than the swap
                  gate sends, fewer than a soak), then the garbage-output behaviour.
Several faults may be given comma-separated; unknown names are logged and ignored.
"""

from __future__ import annotations

import os

KNOWN = ("boot-crash", "unhealthy", "slow-boot", "garbage-output", "bang-flood", "repetition", "empty-replies",
         "broken-sse", "bad-tool-json", "low-acceptance", "needle-miss", "vram-growth", "late-failure")


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


def number(name: str, default: int) -> int:
    try:
        return max(0, int(os.environ.get(name, str(default))))
    except ValueError:
        return default
