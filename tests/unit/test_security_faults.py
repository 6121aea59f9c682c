"""Faults whose handling is shell run on the rig, run here: a dpkg run cut off mid-install is
finished (waiting for the dpkg lock); disk full while the image build fetches its inputs (the
real fetch step of the image and weights scripts writing into /dev/full, ENOSPC) fails with one
clear line that says the disk is full and that nothing was stopped. The sandbox tier repeats the
disk-full case on a rig with a full build dir (tests/sandbox/test_security.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from rigfleet.operations.apt import repair_script
from rigfleet.operations.shell import script


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_full_disk_during_a_fetch_says_so_and_that_nothing_was_stopped(tmp_path: Path) -> None:
    source = tmp_path / "overlay.py"
    source.write_text("x = 1\n" * 1000)
    dest = tmp_path / "build" / "overlay.py"
    dest.parent.mkdir()
    (tmp_path / "build" / "overlay.py.part").symlink_to("/dev/full")  # every write: ENOSPC
    command = script("image t: overlay", str(tmp_path / "log" / "build.log"),
                     f"fetch file://{source} {dest} 'overlay o file a.py'")
    proc = subprocess.run(["sh", "-c", command.get_raw_value()], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    [line] = [line for line in proc.stderr.splitlines() if line.startswith("rigfleet: ")]
    assert line.startswith(f"rigfleet: overlay o file a.py: no space left to write {dest}.part (")
    assert " free on /" in line
    assert line.endswith("nothing was stopped: a running release keeps serving")


def test_a_plain_download_failure_is_not_called_a_full_disk(tmp_path: Path) -> None:
    dest = tmp_path / "build" / "overlay.py"
    dest.parent.mkdir()
    command = script("image t: overlay", str(tmp_path / "build.log"),
                     f"fetch file://{tmp_path}/missing.py {dest} 'overlay o file a.py'")
    proc = subprocess.run(["sh", "-c", command.get_raw_value()], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "download of file://" in proc.stderr and "no space" not in proc.stderr


def fake_tools(tmp_path: Path, dpkg_body: str) -> dict[str, str]:
    """PATH with a scripted `dpkg` and an `apt-get` that records its call."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "dpkg").write_text(f"#!/bin/sh\n{dpkg_body}\n")
    (bin_dir / "apt-get").write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/apt-get.called\n")
    for tool in ("dpkg", "apt-get"):
        (bin_dir / tool).chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_interrupted_dpkg_is_finished_after_waiting_for_the_lock(tmp_path: Path) -> None:
    """A re-run after a cut: the lock is still held for a while (dpkg fails at once on it), then free."""
    env = fake_tools(tmp_path, f'n=$(cat {tmp_path}/n 2>/dev/null || echo 0); echo $((n+1)) > {tmp_path}/n\n'
                               'if [ "$n" -lt 2 ]; then echo "dpkg: error: dpkg frontend lock was locked by '
                               'another process with pid 7" >&2; exit 2; fi; exit 0')
    proc = subprocess.run(["sh", "-c", repair_script(30)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "n").read_text().strip() == "3"  # two refusals on the lock, then configured
    assert "install -f" in (tmp_path / "apt-get.called").read_text()


def test_a_lock_held_past_the_timeout_or_another_dpkg_error_fails_clearly(tmp_path: Path) -> None:
    env = fake_tools(tmp_path, 'echo "dpkg: error: dpkg frontend lock was locked by another process" >&2; exit 2')
    proc = subprocess.run(["sh", "-c", repair_script(3)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "frontend lock was locked" in proc.stderr
    assert "dpkg --configure -a failed" in proc.stderr and not (tmp_path / "apt-get.called").exists()
    (tmp_path / "bin").rename(tmp_path / "old")
    calls = tmp_path / "calls"
    env = fake_tools(tmp_path, f'echo x >> {calls}; echo "dpkg: error processing package x (--configure)" >&2; exit 1')
    proc = subprocess.run(["sh", "-c", repair_script(600)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "error processing package x" in proc.stderr
    assert calls.read_text().count("x") == 1  # not a lock: no second try, no waiting
