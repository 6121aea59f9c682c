"""Disk full while the image build fetches its inputs: the real fetch step of the image and weights
scripts, writing into a file that fails with ENOSPC (/dev/full), must fail with one clear line that
says the disk is full and that nothing was stopped. The sandbox tier repeats it on a rig with a
full build dir (tests/sandbox/test_faults.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

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
