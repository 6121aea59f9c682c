"""The swap's remote commands, run here through bash against a stand-in `docker` on PATH: the old
release is stopped (compose down, or rm -f when its dir is gone) and the rig's clock read in the
same command; `compose up` and the gate run as one command, the gate only after `up` succeeded."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from rigfleet import rigstate
from rigfleet.operations import serving
from rigfleet.operations.serving import Remote, ServingError, stop_others


class LocalRemote(Remote):
    """Remote's commands on this machine (bash), with the stand-in docker first on PATH."""

    def __init__(self, bin_dir: Path) -> None:
        super().__init__(host=None)  # type: ignore[arg-type]
        self.env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
        self.commands: list[str] = []

    def run(self, command: str, *, stdin: str | None = None, timeout: float | None = None) -> tuple[bool, str, str]:
        self.commands.append(command)
        out = subprocess.run(["bash", "-c", command], input=stdin, capture_output=True, text=True, timeout=60,
                             env=self.env, check=False)
        return out.returncode == 0, out.stdout, out.stderr


@pytest.fixture
def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[LocalRemote, Path]:
    """A stand-in docker that logs `cwd: args` and fails `compose up` when $tmp/up-fails exists; a
    stand-in probe that logs its run and prints a passed gate."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text(f'#!/bin/sh\necho "$PWD: $*" >> {log}\n'
                      f'case "$*" in "compose up"*) [ -e {tmp_path}/up-fails ] && {{ echo boom >&2; exit 1; }};; esac\n'
                      'echo "docker output" ; exit 0\n')
    docker.chmod(0o755)
    gate_dir = tmp_path / "gate"
    gate_dir.mkdir()
    probe = f"import json, sys\nopen({str(log)!r}, 'a').write('probe ' + sys.argv[1] + '\\n')\n"
    (gate_dir / "probe.py").write_text(probe + "print(json.dumps({'ok': True, 'ready_epoch': 1.0, 'checks': []}))\n")
    monkeypatch.setattr(serving, "GATE_DIR", str(gate_dir))
    monkeypatch.setattr(rigstate, "RELEASES_DIR", str(tmp_path / "releases"))
    return LocalRemote(bin_dir), log


def calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_up_then_gate_in_one_command(rig: tuple[LocalRemote, Path], tmp_path: Path) -> None:
    remote, log = rig
    target = tmp_path / "releases" / "r2"
    target.mkdir(parents=True)
    result = remote.start_and_gate(str(target), "basic", 30, "starting release r2")
    assert result["ok"] is True and len(remote.commands) == 1
    assert calls(log) == [f"{target}: compose up -d --force-recreate --remove-orphans", f"probe {target}"]


def test_a_failed_up_raises_and_the_gate_never_runs(rig: tuple[LocalRemote, Path], tmp_path: Path) -> None:
    remote, log = rig
    (tmp_path / "up-fails").touch()
    target = tmp_path / "releases" / "r2"
    target.mkdir(parents=True)
    with pytest.raises(ServingError, match="starting release r2: .*boom"):
        remote.start_and_gate(str(target), "basic", 30, "starting release r2")
    assert not any(line.startswith("probe") for line in calls(log))


def test_stop_others_downs_each_release_and_reads_the_clock(rig: tuple[LocalRemote, Path], tmp_path: Path) -> None:
    remote, log = rig
    old = tmp_path / "releases" / "r1"
    old.mkdir(parents=True)
    (old / "compose.yaml").write_text("services: {}\n")
    observed = {"containers": [{"id": "c1", "release": "r1", "status": "running"},
                               {"id": "c0", "release": "r0", "status": "exited"},  # its dir is gone
                               {"id": "c2", "release": "r2", "status": "running"}]}
    stopped_at, stopped = stop_others(remote, observed, keep="r2")
    assert sorted(stopped) == ["r0", "r1"] and len(remote.commands) == 2
    assert isinstance(stopped_at, float) and stopped_at > 0
    assert sorted(calls(log)) == sorted([f"{old}: compose down", f"{os.getcwd()}: rm -f c0"])
    nothing_ran = {"containers": [{"id": "c0", "release": "r0", "status": "exited"}]}
    assert stop_others(remote, nothing_ran, keep="r2")[0] is None
