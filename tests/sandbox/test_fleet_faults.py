"""A rig REBOOTED or POWERED OFF in the middle of its re-pin wave, on 3 SIMULATED rigs.

`rigfleet repin --wave 1` runs as the operator runs it (a subprocess, as in test_fleet.py): canary
rig-01, wave 1 rig-02 (the rig the fault hits), wave 2 rig-03 (must stay untouched). The fault is
injected at one fixed moment of rig-02's converge: its serving step has stopped the previous
release, started the new one and is running the health gate (`/opt/rigfleet/gate/probe.py` is a
process in rig-02's PID namespace), so the ledger still names the previous release and nothing
healthy is serving. The test watches the rig's processes from the host and injects the moment the
gate process shows.

Each test asserts: the re-pin halts (exit 1) within a bounded time, names rig-02 with a reason,
starts no later wave (rig-03's ledger byte-identical), leaves rig-02's ledger whole; and once
rig-02 is back (the rebooted one by itself, the powered-off one powered on by the test) the same
command resumes and completes: exit 0, every rig healthy on the target pin set with no drift, the
canary not deployed again.

Run it under the shared sandbox lock:
    flock /tmp/rigfleet-e2e.lock pytest tests/sandbox/test_fleet_faults.py
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rigfleet.liveness import LOST
from rigfleet_sandbox import manager
from rigfleet_sandbox.layout import RigSpec
from rigfleet_sandbox.supervisor import read_boots, read_state
from tests import REPO_ROOT

from .conftest import Sandbox
from .test_fleet import LEDGER, assert_on, bin_path, inventory, ledger, rigfleet, set_group, status

__all__ = ["inventory"]  # the module-scoped inventory fixture of test_fleet.py, used here

SANDBOX_RIGS = 3
RIGS = ["rig-01", "rig-02", "rig-03"]
CANARY, TARGET, LATER = RIGS
# the sandbox may have more rigs up (after test_fleet.py, four): the re-pins here cover these three
SCOPE = [arg for rig in RIGS for arg in ("--limit", rig)]
GATE_RUN = "/opt/rigfleet/gate/probe.py /opt/rigfleet/releases/"  # the probe of a release, not its upload
GATE_SEEN_TIMEOUT_S = 900  # the canary's converge (full gate) and rig-02's up to its gate
HALT_TIMEOUT_S = 180  # from the fault to `repin` exiting: longer is a hang (a silent rig is noticed in ~60 s)
BACK_TIMEOUT_S = 180

pytestmark = pytest.mark.sandbox


def ledger_bytes(rig: str) -> bytes:
    """The rig's ledger as it lies on disk (read from the host through the rig's root)."""
    return (RigSpec.from_name(rig).root / LEDGER.lstrip("/")).read_bytes()


def rig_init(rig: str) -> int:
    init = next(s.init_pid for s in manager.status() if s.name == rig)
    assert init, f"{rig} is not running"
    return init


def gate_running(init: int) -> str | None:
    """The command line of a process running the health gate on a release, in the PID namespace of
    the rig whose init is `init` (the sudo/sh wrappers of the probe count too), or None."""
    try:
        ns = os.readlink(f"/proc/{init}/ns/pid")
    except OSError:
        return None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            if GATE_RUN.encode() in cmdline and os.readlink(entry / "ns" / "pid") == ns:
                return cmdline.replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
    return None


def boot_id(sandbox: Sandbox, rig: str) -> str | None:
    proc = sandbox.ssh(rig, "cat /proc/sys/kernel/random/boot_id", check=False, timeout=20)
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def other_pinset(rows: dict[str, dict[str, Any]]) -> str:
    current = {rows[rig]["pinset"] for rig in RIGS}
    assert len(current) == 1, f"the rigs are not on one pin set: {current}"
    return "sandbox-b" if current == {"sandbox-a"} else "sandbox-a"


def repin_with_fault(inventory: Path, tmp_path: Path, inject: Callable[[int], None]) -> tuple[int, str]:
    """`rigfleet repin --wave 1` (as test_fleet.rigfleet runs it); `inject(init pid of rig-02)` the
    moment rig-02's gate runs; returns (exit status, stdout + stderr). Fails if the gate is never
    seen or `repin` does not end within HALT_TIMEOUT_S of the fault."""
    init = rig_init(TARGET)
    out_path, err_path = tmp_path / "repin.out", tmp_path / "repin.err"
    started = time.monotonic()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen([bin_path("rigfleet"), "repin", "--wave", "1", *SCOPE], cwd=REPO_ROOT, stdout=out,
                                stderr=err, env={**os.environ, "RIGFLEET_INVENTORY": str(inventory), "COLUMNS": "200"})
    try:
        seen = None
        deadline = time.monotonic() + GATE_SEEN_TIMEOUT_S
        while seen is None and proc.poll() is None and time.monotonic() < deadline:
            seen = gate_running(init)
            if seen is None:
                time.sleep(0.05)
        assert seen, (f"{TARGET}'s gate never ran (repin exit {proc.poll()}): "
                      f"{out_path.read_text()[-3000:]}")
        print(f"{time.monotonic() - started:.0f} s into the re-pin, {TARGET} runs its gate: {seen}")
        inject(init)
        injected = time.monotonic()
        try:
            code = proc.wait(timeout=HALT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"`rigfleet repin` still running {HALT_TIMEOUT_S} s after the fault (a hang): "
                        f"{out_path.read_text()[-3000:]}")
        print(f"$ rigfleet repin --wave 1  -> exit {code}, {time.monotonic() - injected:.0f} s after the fault")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stdout, stderr = out_path.read_text(), err_path.read_text()
    print(stdout[-8000:])
    print(stderr[-4000:])
    return code, stdout + stderr


def assert_halted_at_the_target(code: int, output: str) -> None:
    assert code == 1, output[-4000:]
    assert "Traceback" not in output
    assert "re-pin halted after 2 of 3 waves" in output, output[-4000:]
    # The rig's result line, not the report's "where each rig got its image" lines after it.
    reported = [line.strip() for line in output.splitlines()
                if line.strip().startswith(f"{TARGET}: ") and not line.strip().startswith(f"{TARGET}: image ")]
    assert reported, f"no result line for {TARGET}"
    line = reported[-1]
    print(f"reported: {line}")
    # failed, with the reason: the connection dropped in the middle of the serving step
    assert line.startswith(f"{TARGET}: failed: Serving | Serve release "), line
    assert f"{LOST} (" in line and "the rig rebooted, lost power or left the network" in line, line
    assert f"failed -; unreachable -; {LOST} {TARGET};" in output
    assert f"untouched {LATER}." in output
    assert f"converged {CANARY};" in output


def resume(sandbox: Sandbox, inventory: Path, pinset: str, canary_attempts: list[Any]) -> None:
    rerun = rigfleet(inventory, "repin", "--wave", "1", *SCOPE)
    assert rerun.returncode == 0, rerun.stdout
    assert "re-pin complete" in rerun.stdout
    rows = status(inventory)
    assert_on(rows, RIGS, pinset)
    assert len({rows[rig]["image_tag"] for rig in RIGS}) == 1
    assert ledger(sandbox, CANARY)["attempts"] == canary_attempts, "the canary was deployed again"
    for rig in (TARGET, LATER):
        book = ledger(sandbox, rig)
        assert book["current"]["pinset"] == pinset and book["attempts"][-1]["result"] == "passed", book


def settle(inventory: Path) -> str:
    """Every rig healthy on one pin set, without drift (converged first when not); returns the
    OTHER pin set, the one the test re-pins to."""
    rows = status(inventory)
    pinsets = {rows[rig]["pinset"] for rig in RIGS}
    if len(pinsets) != 1 or None in pinsets or any(rows[rig]["drift"] or not rows[rig]["healthy"] for rig in RIGS):
        set_group(inventory, pinset="sandbox-a")
        first = rigfleet(inventory, "repin", "--wave", "2", *SCOPE)
        assert first.returncode == 0, first.stdout
        rows = status(inventory)
        assert_on(rows, RIGS, "sandbox-a")
    else:
        set_group(inventory, pinset=pinsets.pop())
    return other_pinset(rows)


def test_rig_rebooted_while_its_gate_runs_halts_and_rerun_resumes(sandbox: Sandbox, inventory: Path,
                                                                  tmp_path: Path) -> None:
    """Inject: a hard reboot of rig-02 (`systemctl reboot --force --force` inside it: the reset
    button, reboot(2) at once; nspawn exits 133 and the sandbox supervisor boots the rig again) the
    moment rig-02's health gate process runs, i.e. the new release was started, the previous one
    stopped, the ledger not yet written. The rig's TCP connections die with it (reset). rig-02 comes
    back by itself. (An orderly `systemctl reboot` of a serving rig spends minutes in stop jobs in
    the sandbox before it reboots; this test does not wait for that.)"""
    assert sandbox.rigs == RIGS
    target = settle(inventory)
    set_group(inventory, pinset=target)
    target_before = ledger(sandbox, TARGET)
    later_before = ledger_bytes(LATER)
    booted = boot_id(sandbox, TARGET)
    reboots = sum(1 for r in read_boots(RigSpec.from_name(TARGET)) if r.get("exit") == 133)

    def reboot(init: int) -> None:
        subprocess.run(["nsenter", "-t", str(init), "-a", "systemctl", "reboot", "--force", "--force"],
                       capture_output=True, text=True, timeout=30, check=False)

    code, output = repin_with_fault(inventory, tmp_path, reboot)
    assert_halted_at_the_target(code, output)
    assert ledger_bytes(LATER) == later_before, f"{LATER} (wave 2) was touched"
    canary_attempts = ledger(sandbox, CANARY)["attempts"]

    deadline = time.monotonic() + BACK_TIMEOUT_S
    while (now := boot_id(sandbox, TARGET)) in (None, booted) and time.monotonic() < deadline:
        time.sleep(1)
    assert now not in (None, booted), f"{TARGET} did not come back from its reboot"
    assert sum(1 for r in read_boots(RigSpec.from_name(TARGET)) if r.get("exit") == 133) == reboots + 1
    # the interrupted swap left the ledger whole, still on the previous release
    book = ledger(sandbox, TARGET)
    assert book["current"]["release_id"] == target_before["current"]["release_id"], book["current"]

    resume(sandbox, inventory, target, canary_attempts)


def test_rig_powered_off_while_its_gate_runs_halts_and_rerun_resumes(sandbox: Sandbox, inventory: Path,
                                                                     tmp_path: Path) -> None:
    """Inject: a power cut of rig-02 (manager.power_off: its link dark, then the container killed with
    no orderly shutdown) the moment rig-02's health gate process runs, i.e. the new release was
    started, the previous one stopped, the ledger not yet written. It stays off (silent: no FIN, no
    RST) until the test powers it on (manager.power_on) after the halt."""
    assert sandbox.rigs == RIGS
    target = settle(inventory)
    set_group(inventory, pinset=target)
    target_before = ledger_bytes(TARGET)
    later_before = ledger_bytes(LATER)
    try:
        code, output = repin_with_fault(inventory, tmp_path, lambda _: manager.power_off(TARGET, log=print))
        assert read_state(RigSpec.from_name(TARGET)).get("state") == "stopped", "rig-02 did not stay off"
        assert_halted_at_the_target(code, output)
        assert ledger_bytes(LATER) == later_before, f"{LATER} (wave 2) was touched"
        rows = status(inventory)
        assert not rows[TARGET]["reachable"] and rows[TARGET]["drift"] == ["unreachable"], rows[TARGET]
        canary_attempts = ledger(sandbox, CANARY)["attempts"]
    finally:
        if read_state(RigSpec.from_name(TARGET)).get("state") == "stopped":
            manager.power_on(TARGET, log=print)
    # the cut swap left the ledger whole, still on the previous release
    book = json.loads(ledger_bytes(TARGET))
    assert book["current"]["release_id"] == json.loads(target_before)["current"]["release_id"], book["current"]

    resume(sandbox, inventory, target, canary_attempts)
