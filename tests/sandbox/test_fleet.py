"""Fleet re-pin end to end on 4 SIMULATED rigs: `rigfleet repin` and `rigfleet status --json` run
as the operator runs them (subprocesses), against the sandbox's fleet registry.

The tests run in file order and build on each other (one converge to sandbox-a, then re-pins
between sandbox-a and sandbox-b), so the rigs are converged once per module. Waves are small
(`--wave 1` or 3) and every rig gates `basic` except the canary (`repin` gates it `full`). The
module deploys from a copy of the sandbox inventory (it edits group_vars/all.yml).

Run it under the shared sandbox lock: flock /tmp/rigfleet-e2e.lock pytest tests/sandbox/test_fleet.py
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from rigfleet_sandbox import manager, procs
from rigfleet_sandbox.invfiles import fault_vars
from rigfleet_sandbox.layout import LOG_DIR, REGISTRY_DIR, REGISTRY_PORT, SERVICE_ADDR
from tests import REPO_ROOT

from .conftest import Sandbox, module_inventory

SANDBOX_RIGS = 4
RIGS = ["rig-01", "rig-02", "rig-03", "rig-04"]
REPIN_TIMEOUT_S = 3600
GATE_TIMEOUT_S = 120
BUILDS = "/var/lib/rigfleet/image-builds.jsonl"
LEDGER = "/var/lib/rigfleet/ledger.json"
REGISTRY = f"{SERVICE_ADDR}:{REGISTRY_PORT}"

pytestmark = pytest.mark.sandbox


def bin_path(name: str) -> str:
    return str(Path(sys.executable).parent / name)


@pytest.fixture(scope="module")
def inventory(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Path:
    # a re-pin goes between a and b
    return module_inventory(sandbox, tmp_path_factory, pinsets=["sandbox-a", "sandbox-b"],
                          group={"pinset": "sandbox-a", "gate": "basic", "gate_timeout_s": GATE_TIMEOUT_S})


def set_group(inventory: Path, **values: Any) -> None:
    path = inventory / "group_vars" / "all.yml"
    data = yaml.safe_load(path.read_text())
    data.update(values)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def host_vars(inventory: Path, rig: str, **values: Any) -> None:
    path = inventory / "host_vars" / f"{rig}.yml"
    if values:
        path.write_text(yaml.safe_dump(values))
    else:
        path.unlink(missing_ok=True)


def rigfleet(inventory: Path, *args: str, timeout: float = REPIN_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    proc = subprocess.run([bin_path("rigfleet"), *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          env={**os.environ, "RIGFLEET_INVENTORY": str(inventory), "COLUMNS": "200"},
                          timeout=timeout)
    print(f"$ rigfleet {' '.join(args)}  -> exit {proc.returncode} in {time.monotonic() - started:.0f} s")
    print(proc.stdout[-8000:])
    print(proc.stderr[-4000:])
    return proc


def status(inventory: Path) -> dict[str, dict[str, Any]]:
    proc = rigfleet(inventory, "status", "--json", timeout=300)
    assert proc.returncode == 0, proc.stderr
    return {row["rig"]: row for row in json.loads(proc.stdout)}


def ledger(sandbox: Sandbox, rig: str) -> dict[str, Any]:
    return dict(json.loads(sandbox.ssh(rig, f"sudo cat {LEDGER}").stdout))


def builds(sandbox: Sandbox, tag: str) -> dict[str, int]:
    counts = {}
    for rig in RIGS:
        lines = sandbox.ssh(rig, f"sudo cat {BUILDS} 2>/dev/null || true").stdout.splitlines()
        counts[rig] = sum(1 for line in lines if line.strip() and json.loads(line).get("tag") == tag)
    return counts


def assert_on(rows: dict[str, dict[str, Any]], rigs: list[str], pinset: str) -> None:
    for rig in rigs:
        row = rows[rig]
        assert row["reachable"] and row["healthy"], row
        assert row["pinset"] == pinset, row
        assert row["drift"] == [], row


def test_rigs_reach_one_another_and_nothing_beyond_the_sandbox(sandbox: Sandbox) -> None:
    """The host routes between the rigs' links (a gateway or monitor on one rig reaches the others),
    with no NAT (rig-02 sees rig-01's own address) and nothing routed out of the sandbox's /16."""
    other = sandbox.address("rig-02")
    ssh_banner = sandbox.ssh("rig-01", f"timeout 10 bash -c 'exec 3<>/dev/tcp/{other}/22 && head -c 7 <&3'")
    assert ssh_banner.stdout == "SSH-2.0", ssh_banner
    # rig-01 holds a connection open; rig-02's sshd sees it come from rig-01's own address
    sandbox.ssh("rig-01", f"nohup timeout 30 bash -c 'exec 3<>/dev/tcp/{other}/22; sleep 25' >/dev/null 2>&1 &")
    peers = ""
    for _ in range(40):
        peers = sandbox.ssh("rig-02", "ss -Htn state established '( sport = :22 )'").stdout
        if f"{sandbox.address('rig-01')}:" in peers:
            break
        time.sleep(0.5)
    assert f"{sandbox.address('rig-01')}:" in peers, peers
    # A route lookup, no packet sent: anything else from a rig's address is refused by the host.
    spec = manager.RigSpec.from_name("rig-02")
    beyond = subprocess.run(["ip", "route", "get", "198.51.100.7", "from", other, "iif", spec.host_if],
                            capture_output=True, text=True)
    assert beyond.returncode != 0 and "permission denied" in beyond.stderr.lower(), beyond
    inside = subprocess.run(["ip", "route", "get", sandbox.address("rig-03"), "from", other, "iif", spec.host_if],
                            capture_output=True, text=True)
    assert inside.returncode == 0 and manager.RigSpec.from_name("rig-03").host_if in inside.stdout, inside


def test_repin_whole_fleet_builds_the_image_once(sandbox: Sandbox, inventory: Path) -> None:
    assert sandbox.rigs == RIGS
    converge = rigfleet(inventory, "repin", "--wave", "3")
    assert converge.returncode == 0, converge.stdout
    before = status(inventory)
    assert_on(before, RIGS, "sandbox-a")
    tag_a = before["rig-01"]["image_tag"]
    print(f"sandbox-a image {tag_a}: builds per rig {builds(sandbox, tag_a)}")

    set_group(inventory, pinset="sandbox-b")
    drifted = status(inventory)
    for rig in RIGS:
        assert any(d.startswith("pinset: sandbox-a (want sandbox-b)") for d in drifted[rig]["drift"]), drifted[rig]
    ledgers_before = {rig: ledger(sandbox, rig) for rig in RIGS}

    started = time.monotonic()
    repin = rigfleet(inventory, "repin", "--wave", "3")
    took = time.monotonic() - started
    assert repin.returncode == 0, repin.stdout
    assert "re-pin complete" in repin.stdout

    after = status(inventory)
    assert_on(after, RIGS, "sandbox-b")
    tag_b = after["rig-01"]["image_tag"]
    assert tag_b != tag_a and {row["image_tag"] for row in after.values()} == {tag_b}
    counts = builds(sandbox, tag_b)
    print(f"FLEET RE-PIN to sandbox-b: image {tag_b} built {sum(counts.values())} time(s) across the fleet "
          f"{counts}; re-pin took {took:.0f} s")
    assert sum(counts.values()) == 1, counts
    for rig in RIGS:
        now = ledger(sandbox, rig)
        assert now["current"]["pinset"] == "sandbox-b"
        assert now["previous"]["release_id"] == ledgers_before[rig]["current"]["release_id"]
        assert now["attempts"][-1]["result"] == "passed"


def test_canary_boot_crash_rolls_back_and_touches_nobody_else(sandbox: Sandbox, inventory: Path) -> None:
    set_group(inventory, pinset="sandbox-a")
    host_vars(inventory, "rig-01", **fault_vars("boot-crash"))
    before = {rig: ledger(sandbox, rig) for rig in RIGS}
    repin = rigfleet(inventory, "repin", "--wave", "3")
    assert repin.returncode != 0
    assert "re-pin halted" in repin.stdout and "rig-01" in repin.stdout
    assert "untouched rig-02, rig-03, rig-04" in repin.stdout
    canary = ledger(sandbox, "rig-01")
    assert canary["attempts"][-1]["result"] == "failed"
    assert canary["current"]["release_id"] == before["rig-01"]["current"]["release_id"]
    for rig in RIGS[1:]:
        assert ledger(sandbox, rig) == before[rig], f"{rig} was touched"
    rows = status(inventory)
    assert rows["rig-01"]["healthy"] and rows["rig-01"]["pinset"] == "sandbox-b"


def test_failure_in_wave_two_halts_and_rerun_finishes(sandbox: Sandbox, inventory: Path) -> None:
    # --wave 1: canary rig-01, wave 1 rig-02, wave 2 rig-03 (faulty), wave 3 rig-04
    host_vars(inventory, "rig-01")
    host_vars(inventory, "rig-03", **fault_vars("boot-crash"))
    before = {rig: ledger(sandbox, rig) for rig in RIGS}
    repin = rigfleet(inventory, "repin", "--wave", "1")
    assert repin.returncode != 0
    assert "failed rig-03" in repin.stdout and "untouched rig-04" in repin.stdout
    rows = status(inventory)
    assert_on(rows, ["rig-01", "rig-02"], "sandbox-a")
    assert rows["rig-03"]["healthy"] and rows["rig-03"]["pinset"] == "sandbox-b"
    assert ledger(sandbox, "rig-03")["current"]["release_id"] == before["rig-03"]["current"]["release_id"]
    assert ledger(sandbox, "rig-04") == before["rig-04"], "rig-04 (wave 3) was touched"

    host_vars(inventory, "rig-03")
    done = {rig: ledger(sandbox, rig) for rig in ("rig-01", "rig-02")}
    rerun = rigfleet(inventory, "repin", "--wave", "1")
    assert rerun.returncode == 0, rerun.stdout
    assert_on(status(inventory), RIGS, "sandbox-a")
    # the rigs already on the declared release changed nothing: no new attempt
    for rig in ("rig-01", "rig-02"):
        assert ledger(sandbox, rig)["attempts"] == done[rig]["attempts"], f"{rig} re-deployed"


def _sshd(sandbox: Sandbox, rig: str, action: str) -> None:
    """Stop or start the rig's sshd from the host side (once stopped, ssh cannot start it)."""
    init = next(s.init_pid for s in manager.status() if s.name == rig)
    assert init, f"{rig} is not running"
    subprocess.run(["nsenter", "-t", str(init), "-a", "systemctl", action, "ssh.socket", "ssh.service"],
                   capture_output=True, text=True, timeout=60, check=False)


def test_unreachable_rig_in_a_wave_stops_the_rollout(sandbox: Sandbox, inventory: Path) -> None:
    set_group(inventory, pinset="sandbox-b")
    before = ledger(sandbox, "rig-04")
    _sshd(sandbox, "rig-03", "stop")
    try:
        repin = rigfleet(inventory, "repin", "--wave", "1")
        assert repin.returncode != 0
        assert "rig-03: unreachable" in repin.stdout
        assert "unreachable rig-03" in repin.stdout and "untouched rig-04" in repin.stdout
        assert ledger(sandbox, "rig-04") == before
        rows = status(inventory)
        assert not rows["rig-03"]["reachable"] and rows["rig-03"]["drift"] == ["unreachable"]
        assert_on(rows, ["rig-01", "rig-02"], "sandbox-b")
    finally:
        _sshd(sandbox, "rig-03", "start")
    rerun = rigfleet(inventory, "repin", "--wave", "1")
    assert rerun.returncode == 0, rerun.stdout
    assert_on(status(inventory), RIGS, "sandbox-b")


def _registry_procs() -> list[procs.Proc]:
    return [p for p in procs.sandbox_processes() if p.what == "registry"]


def test_registry_outage_falls_back_to_a_local_build(sandbox: Sandbox, inventory: Path) -> None:
    """rig-04 lost its image (untagged) while the registry is down: it builds here and warns."""
    tag = status(inventory)["rig-04"]["image_tag"]
    before = builds(sandbox, tag)["rig-04"]
    sandbox.ssh("rig-04", f"sudo docker rmi -f {tag} {REGISTRY}/{tag} >/dev/null 2>&1 || true")
    running = _registry_procs()
    assert running, "the sandbox's registry is not running"
    for proc in running:
        os.kill(proc.pid, signal.SIGTERM)
    try:
        repin = rigfleet(inventory, "repin", "--limit", "rig-04")
        assert repin.returncode == 0, repin.stdout
        assert f"rigfleet: warning: fleet registry {REGISTRY} unavailable; building {tag} here" in repin.stdout
        assert builds(sandbox, tag)["rig-04"] == before + 1
        assert_on(status(inventory), ["rig-04"], "sandbox-b")
    finally:
        # back as `sandbox up` started it, for the modules that follow
        log = open(LOG_DIR / "registry.log", "ab")  # noqa: SIM115 - the detached child keeps it
        subprocess.Popen([sys.executable, "-m", "rigfleet_sandbox.registry", "--addr", SERVICE_ADDR, "--port",
                          str(REGISTRY_PORT), "--storage", str(REGISTRY_DIR / "data")],
                         stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
