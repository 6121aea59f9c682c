"""The serving health gate.

`checks.py` (decisions) and `probe.py` (the loop that talks to the engine) are stdlib-only: they
are uploaded to the rig and run there, printing one JSON object, so the gate works when the API
binds to an address the control machine cannot reach. This module is the control-machine side:
what to upload, and how to read the result.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

GATE_DIR = Path(__file__).resolve().parent
ON_RIG_FILES = ("checks.py", "probe.py")


def rig_files() -> dict[str, str]:
    """The files the rig needs to run the gate, by name."""
    return {name: (GATE_DIR / name).read_text(encoding="utf-8") for name in ON_RIG_FILES}


# Inventory fields (rigfleet.schema.Rig) that become the probe's settings (checks.DEFAULTS keys):
# written into release.json for the swap gate, and handed to `rigfleet verify`'s probe as they are now.
RIG_SETTINGS = ("vram_growth_max_mib",)


def rig_settings(rig: Any) -> dict[str, Any]:
    return {name: getattr(rig, name) for name in RIG_SETTINGS}


def parse_output(stdout: str) -> dict[str, Any]:
    """The probe's JSON result (its last JSON line); a failed result when there is none."""
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
    tail = stdout.strip().splitlines()[-5:]
    return {"ok": False, "checks": [{"name": "gate", "ok": False, "warning": False,
                                     "detail": "the gate printed no result: " + " | ".join(tail)}]}


def failures(result: dict[str, Any]) -> list[str]:
    return [f"{c['name']}: {c.get('detail', '')}" for c in result.get("checks", [])
            if not c.get("ok") and not c.get("warning")]


def warnings(result: dict[str, Any]) -> list[str]:
    return [f"{c['name']}: {c.get('detail', '')}" for c in result.get("checks", []) if c.get("warning")]


def summary(result: dict[str, Any]) -> str:
    if result.get("ok"):
        names = [c["name"] for c in result.get("checks", []) if c.get("ok")]
        return "passed (" + ", ".join(names) + ")"
    return "failed: " + "; ".join(failures(result) or ["no check passed"])
