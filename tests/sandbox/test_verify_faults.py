"""`rigfleet verify` against each failure the SIMULATED engine can simulate, on one rig, over SSH.

Issue 15: the ladder passes a healthy rig and fails a broken one naming the check. Each fault is
switched on the way an operator would meet it: the rig's `engine_env` (the stand-in engine's
RIGFLEET_SANDBOX_FAULT, vllm._sim.faults) in host_vars, then a converge whose swap gate (`basic`:
running, /health, models, one short completion) passes, because none of these faults shows in one
short answer. Then `rigfleet verify --level full --json`, run as the operator runs it, must exit 1
and name the fault's check. vram-growth is the full level's `vram_growth` (nvidia-smi's memory.used
on the rig before and after the short soak's turns: the host's nvidia-smi sees the engine in its
container, as on hardware). Last, a late failure (healthy for the first
60 requests, garbage after): the swap gate at `full` passes, `verify --level soak` fails on
`soak_long`. The healthy engine is restored at the end.

The same faults against the same stand-in engine, locally: tests/unit/test_verify_ladder.py.
Run it under the shared sandbox lock: flock /tmp/rigfleet-e2e.lock pytest tests/sandbox/test_verify_faults.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from rigfleet_sandbox.invfiles import fault_vars
from tests import REPO_ROOT

from .conftest import Sandbox, group_pinset, module_inventory

RIG = "rig-01"
SANDBOX_RIGS = 1
GATE_TIMEOUT_S = 120
VERIFY_TIMEOUT_S = 240  # verify's --timeout: seconds per phase on the rig
RUN_TIMEOUT_S = 1200
LEDGER = "/var/lib/rigfleet/ledger.json"

pytestmark = pytest.mark.sandbox

# fault -> (level, the check that must fail, every check that may fail with it)
FAULTS: dict[str, tuple[str, str, set[str]]] = {
    "bang-flood": ("full", "degeneracy", {"degeneracy", "long_output"}),
    "repetition": ("full", "degeneracy", {"degeneracy", "long_output"}),
    "empty-replies": ("full", "soak", {"soak", "long_output", "streaming", "tool_call", "tool_call_stream",
                                       "degeneracy", "needle_10k", "needle_30k", "needle_60k"}),
    "broken-sse": ("full", "streaming", {"streaming", "tool_call_stream"}),
    "bad-tool-json": ("full", "tool_call", {"tool_call", "tool_call_stream"}),
    "low-acceptance": ("full", "mtp_acceptance", {"mtp_acceptance"}),
    "needle-miss": ("full", "needle_10k", {"needle_10k", "needle_30k", "needle_60k"}),
    "vram-growth": ("full", "vram_growth", {"vram_growth"}),
}


@pytest.fixture(scope="module")
def inventory(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return module_inventory(sandbox, tmp_path_factory, pinsets=[group_pinset(sandbox)],
                            rig_vars={RIG: {"gate_timeout_s": GATE_TIMEOUT_S}})


def host_vars(inventory: Path, **values: Any) -> None:
    (inventory / "host_vars" / f"{RIG}.yml").write_text(yaml.safe_dump({"gate_timeout_s": GATE_TIMEOUT_S, **values}))


def run(inventory: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, cwd=REPO_ROOT, env={**os.environ, "RIGFLEET_INVENTORY": str(inventory),
                                                    "COLUMNS": "200"},
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    print(f"$ {' '.join(argv[-4:])} -> exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def bin_path(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def ledger(sandbox: Sandbox) -> dict[str, Any]:
    return dict(json.loads(sandbox.ssh(RIG, f"sudo cat {LEDGER}").stdout))


def converge(sandbox: Sandbox, inventory: Path, **values: Any) -> dict[str, Any]:
    """Converge the rig with these host vars; the swap gate passed: the ledger's current release
    is the one the converge gated (returned)."""
    host_vars(inventory, **values)
    proc = run(inventory, [bin_path("pyinfra"), "-y", "inventory.py", "deploy.py"])
    assert proc.returncode == 0, "the converge failed: the swap gate let nothing through (its log is above)"
    book = ledger(sandbox)
    assert book["attempts"] and book["attempts"][-1]["result"] == "passed", book["attempts"][-1:]
    return dict(book["current"])


def verify(inventory: Path, level: str) -> tuple[int, dict[str, Any]]:
    proc = run(inventory, [bin_path("rigfleet"), "verify", RIG, "--level", level,
                           "--timeout", str(VERIFY_TIMEOUT_S), "--json"])
    assert "Traceback" not in proc.stderr
    [row] = json.loads(proc.stdout)
    return proc.returncode, dict(row)


def engine_env(sandbox: Sandbox) -> str:
    """The fault switch the serving container's engine runs with."""
    return sandbox.ssh(RIG, "sudo docker ps -q --filter label=io.rigfleet.release --filter status=running "
                            "| xargs -r sudo docker inspect --format '{{range .Config.Env}}{{println .}}{{end}}' "
                            "| grep '^RIGFLEET_SANDBOX_FAULT=' || true").stdout.strip()


def test_the_healthy_rig_passes_full(sandbox: Sandbox, inventory: Path) -> None:
    sandbox.ssh(RIG, "sudo mkdir -p /srv/models/chat-templates && "
                     "{ [ -s /srv/models/chat-templates/froggeric.jinja ] || "
                     "echo '{{ messages }}' | sudo tee /srv/models/chat-templates/froggeric.jinja >/dev/null; }")
    current = converge(sandbox, inventory)
    assert engine_env(sandbox) == ""
    code, row = verify(inventory, "full")
    assert code == 0 and row["ok"] and row["failed"] == [], row["failed"]
    assert row["release_id"] == current["release_id"] and row["recorded"]
    assert "mtp_acceptance" in {c["name"] for c in row["checks"]}  # the variant drafts: the check ran
    vram = next(c for c in row["checks"] if c["name"] == "vram_growth")  # a real reading, flat
    assert vram["ok"] and "(+0 MiB)" in vram["detail"], vram


@pytest.mark.parametrize("fault", FAULTS)
def test_each_fault_passes_the_swap_gate_and_verify_names_its_check(sandbox: Sandbox, inventory: Path,
                                                                   fault: str) -> None:
    level, check, allowed = FAULTS[fault]
    current = converge(sandbox, inventory, **fault_vars(fault))
    assert engine_env(sandbox) == f"RIGFLEET_SANDBOX_FAULT={fault}"
    code, row = verify(inventory, level)
    failed = set(row["failed"])
    print(f"{fault}: --level {level} failed {sorted(failed)}")
    assert code == 1 and not row["ok"]
    assert check in failed, row["checks"]
    assert failed <= allowed, f"{fault} failed checks that are not its own: {sorted(failed - allowed)}"
    assert next(c["detail"] for c in row["checks"] if c["name"] == check)
    assert row["release_id"] == current["release_id"] and row["recorded"]
    last = ledger(sandbox)["verifications"][-1]
    assert (last["level"], last["result"], last["release_id"]) == (level, "failed", current["release_id"])


def test_soak_catches_a_late_failure_that_the_full_swap_gate_let_through(sandbox: Sandbox, inventory: Path) -> None:
    """Healthy for the first 60 requests (the full gate sends about 23), then garbage: the swap
    gate at `full` passes; the soak's 100 turns run into it."""
    current = converge(sandbox, inventory, gate="full", **fault_vars("late-failure"))
    book = ledger(sandbox)
    assert book["attempts"][-1]["release_id"] == current["release_id"]
    code, row = verify(inventory, "soak")
    failed = set(row["failed"])
    print(f"late-failure: --level soak failed {sorted(failed)}")
    assert code == 1 and "soak_long" in failed, row["checks"]
    assert failed <= {"soak_long", "vram_growth_long", "throughput_retention"}, "a full-level check failed: not late"
    assert "silent-empty" in next(c["detail"] for c in row["checks"] if c["name"] == "soak_long")


def test_the_healthy_engine_is_restored(sandbox: Sandbox, inventory: Path) -> None:
    converge(sandbox, inventory)
    assert engine_env(sandbox) == ""
    code, row = verify(inventory, "smoke")
    assert code == 0 and row["ok"], row["failed"]
