"""Fault suite on a SIMULATED rig: faults injected during real deploys, outcomes asserted.

One fresh rig, the host layer only (tests/sandbox/host_layer_deploy.py: the layer that runs apt),
in file order, each test building on the rig the previous one left:

1. the dpkg locks held "forever" by another process, with apt_lock_timeout_s: 5 -> the deploy
   fails with apt's lock error naming the rig and the holder's pid and name;
2. the SSH connection cut while apt is installing (the control machine's pyinfra killed, and the
   rig's orphaned apt-get/dpkg killed too, as a power cut would) -> dpkg is left half-done;
3. the dpkg locks held for 60 s when the re-run starts -> it finishes the interrupted dpkg run
   (apt_base), waits for the lock and succeeds; no half-configured
   package (`dpkg --audit`), the holds complete, no dpkg leftovers, config files whole;
4. the driver moved behind rigfleet's back -> `rigfleet status` shows the mismatch, one deploy
   reboots once and the driver drift is gone.

Serving faults (crash-loop, failing health -> rollback) live in test_serving.py; this module adds
nothing there. Run under the shared sandbox lock:
    flock /tmp/rigfleet-e2e.lock pytest tests/sandbox/test_faults.py
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from rigfleet_sandbox.aptrepo import DRIVER_VERSIONS
from rigfleet_sandbox.layout import RigSpec
from rigfleet_sandbox.supervisor import read_boots
from tests import REPO_ROOT

from .conftest import Sandbox, group_pinset, module_inventory, move_driver_behind_rigfleets_back

RIG = "rig-01"
SANDBOX_RIGS = 1
SANDBOX_FRESH = True  # the faults hit the first converge, where apt does real work
DEPLOY_FILE = "tests/sandbox/host_layer_deploy.py"
DEPLOY_TIMEOUT_S = 1800
DRIVER_HELD = {"nvidia-driver-pinning-580", "nvidia-open", "nvidia-kernel-open-dkms", "nvidia-driver-cuda"}
LOCKS = ("/var/lib/dpkg/lock-frontend", "/var/lib/dpkg/lock")
HOLDER = "/run/rigfleet-test-lock-holder.py"
# fcntl locks, as apt and dpkg take them (flock(1) would not block apt: a different lock kind)
HOLDER_SOURCE = f"""import fcntl, os, sys, time
fds = [os.open(p, os.O_RDWR | os.O_CREAT) for p in {LOCKS!r}]
for fd in fds:
    fcntl.lockf(fd, fcntl.LOCK_EX)
open("/run/rigfleet-test-lock-holder.pid", "w").write(str(os.getpid()))
time.sleep(float(sys.argv[1]))
open("/run/rigfleet-test-lock-holder.released", "w").write("held to the end")
"""

# pyinfra's log: the apt_base repair operation, then (maybe after output lines) a change on the rig
REPAIRED = re.compile(r"dpkg: finish an interrupted run[^\n]*\n(?:[ \t]+\[rig-01\][^\n]*\n)*?[ \t]+\[rig-01\] Success")

pytestmark = pytest.mark.sandbox
seen: dict[str, Any] = {}


@pytest.fixture(scope="module")
def inventory(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return module_inventory(sandbox, tmp_path_factory, pinsets=[group_pinset(sandbox)])


def host_vars(inventory: Path, **values: Any) -> None:
    (inventory / "host_vars" / f"{RIG}.yml").write_text(yaml.safe_dump(values))


def pyinfra_argv() -> list[str]:
    return [str(Path(sys.executable).parent / "pyinfra"), "-y", "--json", "inventory.py", DEPLOY_FILE]


def deploy(inventory: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(pyinfra_argv(), cwd=REPO_ROOT, env={**os.environ, "RIGFLEET_INVENTORY": str(inventory)},
                          capture_output=True, text=True, timeout=DEPLOY_TIMEOUT_S)
    print(proc.stderr[-6000:])
    return proc


def run(sandbox: Sandbox, command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return sandbox.ssh(RIG, command, check=check, timeout=300)


def hold_locks(sandbox: Sandbox, seconds: float) -> int:
    """Start a process on the rig that holds both dpkg locks for `seconds`; returns its pid."""
    run(sandbox, "sudo rm -f /run/rigfleet-test-lock-holder.pid /run/rigfleet-test-lock-holder.released; "
                 f"cat <<'EOF' | sudo tee {HOLDER} >/dev/null\n"
                 f"{HOLDER_SOURCE}EOF\n"
                 f"sudo setsid -f python3 {HOLDER} {seconds} </dev/null >/dev/null 2>&1")
    for _ in range(600):  # a dpkg still running (left by a cut) is waited for
        pid = run(sandbox, "cat /run/rigfleet-test-lock-holder.pid 2>/dev/null", check=False).stdout.strip()
        if pid:
            return int(pid)
        time.sleep(0.2)
    raise AssertionError("the lock holder did not start")


def release_locks(sandbox: Sandbox, pid: int) -> None:
    run(sandbox, f"sudo kill {pid} 2>/dev/null; true")


def rigfleet_status(inventory: Path) -> dict[str, Any]:
    proc = subprocess.run([str(Path(sys.executable).parent / "rigfleet"), "status", "--json"], cwd=REPO_ROOT,
                          env={**os.environ, "RIGFLEET_INVENTORY": str(inventory)}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [row] = [r for r in json.loads(proc.stdout) if r["rig"] == RIG]
    return dict(row)


def boots() -> int:
    return sum(1 for record in read_boots(RigSpec.from_name(RIG)) if "started" in record)


def test_apt_lock_held_forever_times_out_naming_rig_and_holder(sandbox: Sandbox, inventory: Path) -> None:
    host_vars(inventory, apt_lock_timeout_s=5)
    pid = hold_locks(sandbox, 3600)
    try:
        started = time.monotonic()
        proc = deploy(inventory)
        elapsed = time.monotonic() - started
    finally:
        release_locks(sandbox, pid)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "Traceback" not in out
    assert f"[{RIG}]" in out or f"{RIG}:" in out
    assert "Could not get lock /var/lib/dpkg/lock" in out, out[-4000:]
    assert f"held by process {pid} (python3)" in out, out[-4000:]
    print(f"lock-forever deploy failed after {elapsed:.0f} s")


def test_ssh_cut_while_apt_installs_then_a_rerun_converges(sandbox: Sandbox, inventory: Path) -> None:
    host_vars(inventory)
    proc = subprocess.Popen(pyinfra_argv(), cwd=REPO_ROOT,
                            env={**os.environ, "RIGFLEET_INVENTORY": str(inventory)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cut_during = ""
    try:
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline and proc.poll() is None:
            # dpkg as apt runs it to install (not the `dpkg -l` of a fact)
            busy = run(sandbox, "ps -eo args | grep -E '^(/usr/bin/)?dpkg .*--(unpack|configure|install)' | head -n 1",
                       check=False).stdout.strip()
            if busy:
                cut_during = busy
                break
            time.sleep(0.3)
    finally:
        proc.send_signal(signal.SIGKILL)  # the control machine vanishes: every SSH channel drops
        proc.wait()
    assert cut_during, "the deploy ended before dpkg ran; nothing was cut"
    print(f"SSH cut while the rig ran: {cut_during}")
    # the apt run the deploy started keeps going on its own after the link drops; a power cut or
    # a session teardown would not let it finish: kill it (those pids only), dpkg mid-unpack
    run(sandbox, "for p in $(pgrep -x apt-get) $(pgrep -x dpkg); do sudo kill -9 $p; done; true", check=False)
    time.sleep(1)
    left = run(sandbox, "sudo dpkg --audit; ls -A /var/lib/dpkg/updates; true", check=False).stdout.strip()
    print(f"what the cut left (dpkg --audit, pending dpkg updates):\n{left}")
    assert left, "the cut left dpkg half-done (else the re-run proves nothing)"
    seen["cut"] = cut_during


def test_rerun_waits_for_a_60s_apt_lock_and_leaves_nothing_half_done(sandbox: Sandbox, inventory: Path) -> None:
    assert seen.get("cut"), "needs the cut converge"
    host_vars(inventory)
    pid = hold_locks(sandbox, 60)
    started = time.monotonic()
    proc = deploy(inventory)
    elapsed = time.monotonic() - started
    print(f"re-run behind a 60 s dpkg lock converged in {elapsed:.0f} s")
    assert proc.returncode == 0, "the re-run failed (its log is above)"
    results = json.loads(proc.stdout)["results"]
    assert results["failed_hosts"] == [] and results["totals"]["error"] == 0
    assert run(sandbox, f"kill -0 {pid} 2>/dev/null && echo alive || echo gone", check=False).stdout.strip() == "gone"
    assert REPAIRED.search(proc.stderr), "the re-run finished the interrupted dpkg run"
    # the holder had both dpkg locks when the re-run began and kept them to its end (not killed):
    # the repair's dpkg, which succeeded, can only have run after it let go
    assert run(sandbox, "cat /run/rigfleet-test-lock-holder.released", check=False).stdout.strip() == "held to the end"
    # nothing half-done
    assert run(sandbox, "sudo dpkg --audit").stdout.strip() == ""
    assert set(run(sandbox, "apt-mark showhold").stdout.split()) >= DRIVER_HELD
    leftovers = run(sandbox, "sudo find /etc /usr/lib/systemd -name '*.dpkg-new' -o -name '*.dpkg-tmp' "
                             "-o -name '.pyinfra*' 2>/dev/null", check=False).stdout.strip()
    assert leftovers == ""
    lock_conf = run(sandbox, "cat /etc/apt/apt.conf.d/99rigfleet-lock-timeout").stdout
    assert 'DPkg::Lock::Timeout "600";' in lock_conf
    assert run(sandbox, "nvidia-smi -L").stdout.count("GPU ") == 2
    second = deploy(inventory)
    assert second.returncode == 0
    assert json.loads(second.stdout)["results"]["totals"]["success"] == 0, "converged: a third run changes nothing"


def test_driver_moved_behind_rigfleets_back_is_drift_and_one_deploy_fixes_it(sandbox: Sandbox,
                                                                             inventory: Path) -> None:
    current = run(sandbox, "nvidia-smi --query-gpu=driver_version --format=csv,noheader").stdout.split()[0]
    other = next(v for v in DRIVER_VERSIONS if v != current)
    assert not any("driver" in d for d in rigfleet_status(inventory)["drift"])
    move_driver_behind_rigfleets_back(sandbox, RIG, other)
    drifted = rigfleet_status(inventory)
    assert "driver: mismatch, reboot needed" in drifted["drift"], drifted
    booted = boots()
    proc = deploy(inventory)
    assert proc.returncode == 0
    assert boots() == booted + 1, "exactly one reboot"
    after = rigfleet_status(inventory)
    assert after["reachable"] and not any(d.startswith("driver") for d in after["drift"]), after
    assert set(run(sandbox, "apt-mark showhold").stdout.split()) >= DRIVER_HELD
    assert run(sandbox, "nvidia-smi -L").stdout.count("GPU ") == 2
