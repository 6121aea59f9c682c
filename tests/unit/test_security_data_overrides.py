"""Malformed `--data` overrides through the real `pyinfra inventory.py deploy.py --dry` CLI.

Every rig of the inventory points at a loopback port this test listens on: a connection
attempt would be accepted there, so "nothing contacted" is observed, not assumed.
"""

from __future__ import annotations

import os
import select
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests import REPO_ROOT
from tests.conftest import EXAMPLE

RIGS = ["rig-01", "rig-02", "rig-11", "rig-12"]


@pytest.fixture
def listener() -> Iterator[list[socket.socket]]:
    """One loopback listener per rig (rigs must not share a host and port), 127.0.0.1 to .4."""
    socks = []
    try:
        for n in range(len(RIGS)):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(sock)
            sock.bind((f"127.0.0.{n + 1}", 0))
            sock.listen(8)
        yield socks
    finally:
        for sock in socks:
            sock.close()


@pytest.fixture
def inventory(tmp_path: Path, listener: list[socket.socket]) -> Path:
    copy = tmp_path / "inv"
    shutil.copytree(EXAMPLE, copy)
    addresses = iter(sock.getsockname() for sock in listener)
    hosts = yaml.safe_load((copy / "hosts.yml").read_text())
    for group in hosts["all"]["children"].values():
        for rig in group["hosts"]:
            host, port = next(addresses)
            group["hosts"][rig] = {"ssh_hostname": host, "ssh_port": port}
    (copy / "hosts.yml").write_text(yaml.safe_dump(hosts))
    # a real (throwaway) key, so that a valid run gets as far as connecting (the control case)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "key")], check=True)
    all_vars = copy / "group_vars" / "all.yml"
    values = yaml.safe_load(all_vars.read_text())
    all_vars.write_text(yaml.safe_dump({**values, "ssh_key": str(tmp_path / "key")}))
    return copy


def pyinfra(inventory: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [str(Path(sys.executable).parent / "pyinfra"), "-y", str(REPO_ROOT / "inventory.py"),
            str(REPO_ROOT / "deploy.py"), "--dry", *args]
    env = {**os.environ, "RIGFLEET_INVENTORY": str(inventory), "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def contacted(listener: list[socket.socket], timeout_s: float = 0.5) -> bool:
    ready, _, _ = select.select(listener, [], [], timeout_s)
    for sock in ready:
        conn, _ = sock.accept()
        conn.close()
    return bool(ready)


def test_control_a_valid_override_does_reach_the_listener(inventory: Path, listener: list[socket.socket],
                                                          tmp_path: Path) -> None:
    """Without this the 'nothing contacted' assertions below could not fail."""
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "pyinfra"), "-y", str(REPO_ROOT / "inventory.py"),
         str(REPO_ROOT / "deploy.py"), "--dry", "--data", "port=8015"],
        cwd=tmp_path, env={**os.environ, "RIGFLEET_INVENTORY": str(inventory), "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert contacted(listener, timeout_s=60)
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize(("args", "field", "why"), [
    (["--data", "port=80"], "port", "greater than or equal to 1024"),
    (["--data=port=notaport"], "port", "integer"),
    (["--data", "gpu_count=99"], "gpu_count", "less than or equal to 8"),
    (["--data", "variant=int9"], "variant", "int9"),
    (["--data", "bind_address=300.1.1.1"], "bind_address", "300.1.1.1"),
    (["--data", "api_key=sk-inline-secret"], "api_key", "by reference"),
    (["--data", "model_dir=relative/path"], "model_dir", "relative/path"),
    (["--data", "apt_lock_timeout_s=-5"], "apt_lock_timeout_s", "greater than or equal to 0"),
    (["--data", "pinset=nope"], "pinset", "nope"),
    (["--data", "no_such_field=1"], "no_such_field", "unknown key"),
    (["--data", "powr_limit_w=250"], "powr_limit_w", "power_limit_w"),
    (["--data", "port=\uff18\uff10"], "port", "1024"),  # fullwidth digits: 80
    (["--data", "variant=t\u0131rbo"], "variant", "t\u0131rbo"),  # dotless i
    (["--data", "gate_timeout_s=" + "9" * 40], "gate_timeout_s", ""),
])
def test_malformed_data_override_exits_2_naming_every_rig_and_the_field(
        inventory: Path, listener: list[socket.socket], tmp_path: Path, args: list[str], field: str, why: str) -> None:
    proc = pyinfra(inventory, tmp_path, *args)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "Traceback" not in out, out
    for rig in RIGS:
        assert f"{rig}: {field}" in out, out
    assert why in out, out
    assert "sk-inline-secret" not in out
    assert not contacted(listener)


@pytest.mark.parametrize("args", [["--data", "oops"], ["--data=oops"], ["--data", "=1"]])
def test_data_not_in_key_value_form_exits_2_before_pyinfra_reads_it(inventory: Path, listener: list[socket.socket],
                                                                     tmp_path: Path, args: list[str]) -> None:
    """pyinfra 3.10 splits `--data` itself (and crashes on one without `=`) after it ran the
    config.py of the directory it starts in: the operator repository's config.py refuses it first.
    Started from a repository as `rigfleet init` writes it, and from this checkout."""
    ops = tmp_path / "ops"
    init = subprocess.run([str(Path(sys.executable).parent / "rigfleet"), "init", str(ops)], capture_output=True,
                          text=True)
    assert init.returncode == 0, init.stderr
    for cwd in (ops, REPO_ROOT):
        proc = pyinfra(inventory, cwd, *args)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 2, out
        assert "Traceback" not in out and "not enough values" not in out, out
        assert "--data" in out and "not in key=value form" in out and "write --data key=value" in out, out
        assert not contacted(listener)
