"""`rigfleet verify` end to end on a SIMULATED rig, over SSH: smoke and full on the serving release.

Lean on purpose: it reuses the module sandbox and the release an earlier module left serving
(test_serving.py, which runs just before this module, leaves one); only when rig-01 serves
nothing does it deploy once. The faults
(each failing the check that names it) are covered against the same stand-in engine in
tests/unit/test_verify_command.py and test_verify_ladder.py.

Run it under the shared sandbox lock: flock /tmp/rigfleet-e2e.lock pytest tests/sandbox/test_serving_verify.py
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import REPO_ROOT

from .conftest import Sandbox, group_pinset, module_inventory

RIG = "rig-01"
SANDBOX_RIGS = 1

pytestmark = pytest.mark.sandbox


def bin_path(name: str) -> str:
    return str(Path(sys.executable).parent / name)


@pytest.fixture(scope="module")
def inventory(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return module_inventory(sandbox, tmp_path_factory, pinsets=[group_pinset(sandbox)])


def ledger(sandbox: Sandbox) -> dict[str, Any]:
    proc = sandbox.ssh(RIG, "sudo cat /var/lib/rigfleet/ledger.json", check=False)
    return dict(json.loads(proc.stdout)) if proc.returncode == 0 and proc.stdout.strip() else {}


def serving_container(sandbox: Sandbox) -> str:
    return sandbox.ssh(RIG, "sudo docker ps -q --filter label=io.rigfleet.release --filter status=running").stdout


@pytest.fixture(scope="module")
def serving(sandbox: Sandbox, inventory: Path) -> str:
    """The release rig-01 serves; deployed here only when an earlier module left none."""
    env = {**os.environ, "RIGFLEET_INVENTORY": str(inventory)}
    if not (ledger(sandbox).get("current") or {}).get("release_id") or not serving_container(sandbox).strip():
        sandbox.ssh(RIG, "sudo mkdir -p /srv/models/chat-templates && "
                         "{ [ -s /srv/models/chat-templates/froggeric.jinja ] || "
                         "echo '{{ messages }}' | sudo tee /srv/models/chat-templates/froggeric.jinja >/dev/null; }")
        proc = subprocess.run([bin_path("pyinfra"), "-y", "inventory.py", "deploy.py"], cwd=REPO_ROOT, env=env,
                              capture_output=True, text=True, timeout=1800)
        assert proc.returncode == 0, proc.stderr[-3000:]
    return str(ledger(sandbox)["current"]["release_id"])


def verify(inventory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([bin_path("rigfleet"), "verify", RIG, *args], cwd="/",
                          env={**os.environ, "RIGFLEET_INVENTORY": str(inventory), "COLUMNS": "80"},
                          capture_output=True, text=True, timeout=900)
    print(proc.stdout[-4000:], proc.stderr[-4000:])
    return proc


def test_smoke_and_full_pass_on_the_serving_rig_and_change_only_the_ledger(
        sandbox: Sandbox, inventory: Path, serving: str) -> None:
    before = ledger(sandbox)
    container = serving_container(sandbox)
    smoke = verify(inventory, "--level", "smoke")
    assert smoke.returncode == 0, smoke.stderr
    assert max(len(line) for line in smoke.stdout.splitlines()) <= 80 and "pass" in smoke.stdout
    full = verify(inventory, "--level", "full", "--json")
    assert full.returncode == 0, full.stderr
    [row] = json.loads(full.stdout)
    assert row["ok"] and row["release_id"] == serving and row["recorded"]
    assert {"streaming", "tool_call", "tool_call_stream", "degeneracy", "soak"} <= {c["name"] for c in row["checks"]}
    assert f"{RIG}  streaming" in full.stderr  # progress from the rig, as it went
    after = ledger(sandbox)
    added = after["verifications"][len(before.get("verifications") or []):]
    assert [(v["level"], v["result"], v["release_id"]) for v in added] == [("smoke", "passed", serving),
                                                                            ("full", "passed", serving)]
    assert {k: after.get(k) for k in ("current", "previous", "attempts")} == {
        k: before.get(k) for k in ("current", "previous", "attempts")}
    assert serving_container(sandbox) == container  # the engine was not restarted
    assert sandbox.ssh(RIG, "ls -d /tmp/rigfleet-verify-* 2>/dev/null | wc -l").stdout.strip() == "0"



def test_status_watch_in_a_terminal_of_80_columns(sandbox: Sandbox, inventory: Path, serving: str) -> None:
    """`status --watch` in a real pseudo-terminal 80 columns wide: the fields are there, and they update."""
    import fcntl
    import pty
    import re
    import select
    import struct
    import termios

    pid, fd = pty.fork()
    if pid == 0:  # the child: the operator's shell in an 80x40 terminal
        os.environ.update({"RIGFLEET_INVENTORY": str(inventory), "TERM": "xterm-256color"})
        os.execv(bin_path("rigfleet"), ["rigfleet", "status", "--watch", "--interval", "1", "--count", "3"])
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 80, 0, 0))
    raw = b""
    while True:
        ready, _, _ = select.select([fd], [], [], 120)
        if not ready:
            break
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the child exited and closed the terminal
            break
        if not chunk:
            break
        raw += chunk
    _, code = os.waitpid(pid, 0)
    # colours go; the other control sequences (cursor moves, line clears) end a line on the screen
    text = re.sub(r"\x1b\[[0-9;]*m", "", raw.decode("utf-8", "replace"))
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r", "\n", text)
    print(text[-4000:])
    assert os.waitstatus_to_exitcode(code) == 0
    stamps = re.findall(r"rigfleet status --watch\s+(\d\d:\d\d:\d\d) UTC", text)
    assert len(set(stamps)) >= 2, stamps  # it refreshed
    lines = [line for line in text.splitlines() if line.strip()]
    assert max(len(line) for line in lines) <= 80
    [rig_line] = list(dict.fromkeys(line for line in lines if line.startswith(RIG + " ") and "GiB" not in line))[-1:]
    assert "healthy" in rig_line and "ok full" in rig_line, rig_line  # the verify above, from the ledger
    assert any(line.startswith(RIG + " ") and " C " in line and " W" in line and "GiB" in line for line in lines)


def test_an_operator_repo_converges_the_rig(sandbox: Sandbox, inventory: Path, serving: str, tmp_path: Path) -> None:
    """Issue 19: the repo `rigfleet init` writes, holding this rig's inventory, converges it with
    `pyinfra inventory.py deploy.py` run from that repo (no RIGFLEET_INVENTORY, no checkout on
    PYTHONPATH, its own entry files); run again, nothing changes and the engine is not restarted.
    (The release an earlier module left may be another inventory's: the first run may swap.)"""
    env = {k: v for k, v in os.environ.items() if k not in ("RIGFLEET_INVENTORY", "PYTHONPATH")}
    ops = tmp_path / "ops"
    subprocess.run([bin_path("rigfleet"), "init", str(ops)], cwd="/", env=env, check=True, timeout=60)
    assert "rigfleet.deploy" in (ops / "deploy.py").read_text()
    shutil.rmtree(ops / "inventory")
    shutil.copytree(inventory, ops / "inventory")

    def converge() -> list[dict[str, Any]]:
        proc = subprocess.run([bin_path("pyinfra"), "-y", "--json", "inventory.py", "deploy.py"], cwd=ops,
                              env=env, capture_output=True, text=True, timeout=1800)
        print(proc.stderr[-4000:])
        assert proc.returncode == 0, proc.stderr[-3000:]
        operations = json.loads(proc.stdout)["results"]["operations"]
        serve = [op for op in operations if any("Serve release" in n for n in op.get("names", []))]
        assert len(serve) == 1, operations
        return serve

    converge()
    first = ledger(sandbox)["current"]["release_id"]
    before = serving_container(sandbox)
    assert before.strip()
    again = converge()
    assert again[0].get("success", []) == [] and again[0].get("no_change"), again
    assert ledger(sandbox)["current"]["release_id"] == first
    assert serving_container(sandbox) == before  # not restarted
