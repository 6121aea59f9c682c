"""`rigfleet status` end to end on SIMULATED rigs: JSON keys, the table, read-only, unreachable.

Whatever earlier modules left on the rigs is fine here (a fresh rig shows drift "release: none");
the fleet re-pin module (test_fleet.py) checks drift before and after a re-pin.

Run it under the shared sandbox lock: flock /tmp/rigfleet-e2e.lock pytest tests/sandbox/test_status.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rigfleet_sandbox import manager

from .conftest import Sandbox

SANDBOX_RIGS = 2
KEYS = {"rig", "reachable", "pinset", "variant", "image_tag", "healthy", "kv_pool_tokens", "drift"}
# what a read-only command must not change on the rig
FOOTPRINT = ("sudo sh -c 'stat -c %Y /var/lib/rigfleet/ledger.json 2>/dev/null; ls -la --time-style=+%s "
             "/var/lib/rigfleet /etc/docker 2>/dev/null; docker ps -aq | sort'")

pytestmark = pytest.mark.sandbox


@pytest.fixture(scope="module")
def inventory(sandbox: Sandbox) -> Path:
    return sandbox.inventory_dir


def rigfleet(inventory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(Path(sys.executable).parent / "rigfleet"), *args], cwd="/",
                          env={**os.environ, "RIGFLEET_INVENTORY": str(inventory), "COLUMNS": "200"},
                          capture_output=True, text=True, timeout=300)
    print(proc.stdout[-6000:], proc.stderr[-3000:])
    return proc


def test_status_json_and_table_are_read_only(sandbox: Sandbox, inventory: Path) -> None:
    before = {rig: sandbox.ssh(rig, FOOTPRINT).stdout for rig in sandbox.rigs}
    proc = rigfleet(inventory, "status", "--json")
    assert proc.returncode == 0, proc.stderr
    # every rig of the inventory, in its order (the sandbox may have more up than this module asked for)
    rows = [row for row in json.loads(proc.stdout) if row["rig"] in sandbox.rigs]
    assert [row["rig"] for row in rows] == sandbox.rigs
    pinset = yaml.safe_load((inventory / "group_vars" / "all.yml").read_text())["pinset"]
    for row in rows:
        assert set(row) >= KEYS, row
        assert row["reachable"] is True and row["os"].startswith("debian")
        assert isinstance(row["drift"], list)
        if row["pinset"] is None:
            assert any(d.startswith("release: none") for d in row["drift"]), row
        elif row["pinset"] != pinset:
            assert any(d.startswith(f"pinset: {row['pinset']}") for d in row["drift"]), row
    table = rigfleet(inventory, "status")
    assert table.returncode == 0 and all(rig in table.stdout for rig in sandbox.rigs)
    assert "drift" in table.stdout
    after = {rig: sandbox.ssh(rig, FOOTPRINT).stdout for rig in sandbox.rigs}
    assert after == before, "status changed something on a rig"


def test_unreachable_rig_is_reported_not_skipped(sandbox: Sandbox, inventory: Path) -> None:
    rig = sandbox.rigs[-1]
    init = next(s.init_pid for s in manager.status() if s.name == rig)
    assert init
    stop = ["nsenter", "-t", str(init), "-a", "systemctl"]
    subprocess.run([*stop, "stop", "ssh.socket", "ssh.service"], capture_output=True, timeout=60, check=False)
    try:
        proc = rigfleet(inventory, "status", "--json")
        assert proc.returncode == 0, proc.stderr
        rows = {row["rig"]: row for row in json.loads(proc.stdout)}
        assert rows[rig]["reachable"] is False and rows[rig]["drift"] == ["unreachable"]
        assert all(rows[r]["reachable"] for r in sandbox.rigs if r != rig)
        table = rigfleet(inventory, "status")
        assert "NO" in table.stdout
    finally:
        subprocess.run([*stop, "start", "ssh.socket", "ssh.service"], capture_output=True, timeout=60, check=False)
