"""`rigfleet hostkeys` on a SIMULATED rig's real sshd, run as the operator runs it (subprocesses).

(a) the sandbox's own known_hosts: ok, with the fingerprint the rig itself prints;
(b) first contact (a copy of the inventory whose known_hosts lacks the rig): `hostkeys` says missing,
    status and a deploy refuse to connect (strict, never accept-new) and say how to record the key,
    `--record` appends it, then status reaches the rig;
(c) a wrong key in the copy: MISMATCH, `--record` refuses and leaves the file byte-identical.

Read-only on the rig: only key exchanges and `rigfleet status`.

Run it under the shared sandbox lock: flock /tmp/rigfleet-e2e.lock pytest tests/sandbox/test_hostkeys.py
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import REPO_ROOT

from .conftest import Sandbox

SANDBOX_RIGS = 1
RIG = "rig-01"
RIG_KEY = "/etc/ssh/ssh_host_ed25519_key.pub"

pytestmark = pytest.mark.sandbox


def bin_path(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def rigfleet(inventory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([bin_path("rigfleet"), *args], cwd="/", capture_output=True, text=True, timeout=300,
                          env={**os.environ, "RIGFLEET_INVENTORY": str(inventory), "COLUMNS": "400"})
    print(f"$ rigfleet {' '.join(args)} -> {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def rig_fingerprint(sandbox: Sandbox) -> str:
    """The rig's own `ssh-keygen -l` of its ed25519 host key (the out-of-band check), minus the comment."""
    words = sandbox.ssh(RIG, f"ssh-keygen -l -f {RIG_KEY}").stdout.split()
    return f"{words[0]} {words[1]} {words[-1]}"


def copy_without_rig(sandbox: Sandbox, tmp_path: Path, replacement: str = "") -> Path:
    """A copy of the sandbox inventory whose known_hosts has no line for the rig (or `replacement`)."""
    copy = tmp_path / "inventory"
    shutil.copytree(sandbox.inventory_dir, copy)
    address = sandbox.address(RIG)
    lines = (copy / "known_hosts").read_text().splitlines(keepends=True)
    kept = [line for line in lines if not line.startswith(f"{address} ")]
    assert len(kept) == len(lines) - 1, lines
    (copy / "known_hosts").write_text("".join(kept) + replacement)
    return copy


def status(inventory: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, object]]:
    proc = rigfleet(inventory, "status", "--json")
    assert proc.returncode == 0, proc.stderr
    return proc, next(row for row in json.loads(proc.stdout) if row["rig"] == RIG)


def test_sandbox_known_hosts_is_ok(sandbox: Sandbox) -> None:
    proc = rigfleet(sandbox.inventory_dir, "hostkeys", RIG)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{RIG}  ok  {sandbox.address(RIG)}  {rig_fingerprint(sandbox)}" in proc.stdout


def test_first_contact_is_refused_until_recorded(sandbox: Sandbox, tmp_path: Path) -> None:
    inventory = copy_without_rig(sandbox, tmp_path)
    known = inventory / "known_hosts"
    before = known.read_bytes()
    address, fingerprint = sandbox.address(RIG), rig_fingerprint(sandbox)

    proc = rigfleet(inventory, "hostkeys", RIG)
    assert proc.returncode == 1
    assert f"{RIG}  missing  {address}  {fingerprint}" in proc.stdout and "--record" in proc.stdout

    # strict: status and a deploy refuse the unknown key, name the way out, and never write it
    proc, row = status(inventory)
    assert row["reachable"] is False
    assert f"rigfleet hostkeys --record {RIG}" in proc.stderr
    deploy = subprocess.run([bin_path("pyinfra"), "-y", "inventory.py", "deploy.py"], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=300,
                            env={**os.environ, "RIGFLEET_INVENTORY": str(inventory)})
    out = deploy.stdout + deploy.stderr
    print(out[-3000:])
    assert deploy.returncode != 0 and f"No host key for {address}" in out
    assert f"rigfleet hostkeys --record {RIG}" in out
    assert known.read_bytes() == before

    proc = rigfleet(inventory, "hostkeys", "--record", RIG)
    assert proc.returncode == 0
    assert f"recorded: {RIG} {address} {fingerprint} in {known}" in proc.stdout
    sandbox_line = next(line for line in (sandbox.inventory_dir / "known_hosts").read_text().splitlines()
                        if line.startswith(f"{address} "))
    assert known.read_bytes() == before + f"{sandbox_line}\n".encode()  # the key `sandbox up` recorded

    proc, row = status(inventory)
    assert row["reachable"] is True and str(row["os"]).startswith("debian")
    assert rigfleet(inventory, "hostkeys", RIG).returncode == 0


def test_mismatch_is_refused_and_the_file_left_as_it_is(sandbox: Sandbox, tmp_path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    other = (tmp_path / "other.pub").read_text().split()[:2]
    address = sandbox.address(RIG)
    inventory = copy_without_rig(sandbox, tmp_path, f"{address} {' '.join(other)}\n")
    known = inventory / "known_hosts"
    before = known.read_bytes()
    old = subprocess.run(["ssh-keygen", "-l", "-f", str(tmp_path / "other.pub")], capture_output=True, text=True,
                         check=True).stdout.split()
    old_fingerprint = f"{old[0]} {old[1]} {old[-1]}"

    proc = rigfleet(inventory, "hostkeys", RIG)
    assert proc.returncode == 1
    assert f"{RIG}  MISMATCH  {address}  {rig_fingerprint(sandbox)}" in proc.stdout
    assert old_fingerprint in proc.stdout

    proc = rigfleet(inventory, "hostkeys", "--record", RIG)
    assert proc.returncode == 1 and "recorded:" not in proc.stdout
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {RIG}: host key MISMATCH"), proc.stderr
    for needle in (old_fingerprint, rig_fingerprint(sandbox), "not recorded", f"ssh-keygen -f {known} -R {address}"):
        assert needle in errors[0], needle
    assert known.read_bytes() == before

    proc, row = status(inventory)  # still refused, pointing at the report
    assert row["reachable"] is False and f"rigfleet hostkeys {RIG}" in proc.stderr
    assert known.read_bytes() == before
