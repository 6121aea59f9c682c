"""vLLM pin allowlist and pin gate (SIMULATED stand-in of Genesis v7.72.2 guards)."""

from __future__ import annotations

import os

KNOWN_GOOD_VLLM_PINS: tuple[str, ...] = (
    "0.20.1rc1.dev16+g7a1eb8ac2",
    "0.20.2rc1.dev9+g01d4d1ad3",
)

POLICIES = ("warn", "strict", "off")


def pin_policy() -> str:
    policy = os.environ.get("GENESIS_VLLM_PIN_POLICY", "warn").strip().lower() or "warn"
    return policy if policy in POLICIES else "warn"


def check_pin(version: str) -> tuple[bool, list[str]]:
    """(ok_to_continue, log lines). Unknown pins warn and continue unless policy is strict."""
    policy = pin_policy()
    if version in KNOWN_GOOD_VLLM_PINS:
        return True, [f"[Genesis pin-gate] vllm {version} is in KNOWN_GOOD_VLLM_PINS (policy={policy}): OK"]
    allowed = ", ".join(KNOWN_GOOD_VLLM_PINS)
    if policy == "strict":
        return False, [
            f"[Genesis pin-gate] STRICT FAIL: vllm {version} is not in KNOWN_GOOD_VLLM_PINS ({allowed}); "
            "refusing to patch (GENESIS_VLLM_PIN_POLICY=strict)"
        ]
    if policy == "off":
        return True, [f"[Genesis pin-gate] pin gate off: vllm {version} not checked"]
    return True, [
        f"[Genesis pin-gate] WARNING: vllm {version} is not in KNOWN_GOOD_VLLM_PINS ({allowed}); "
        "continuing (set GENESIS_VLLM_PIN_POLICY=strict to refuse)"
    ]
