"""The sandbox's own installs on the host wait for dpkg's lock instead of failing: on a fresh
machine the two sandbox shards ask for their host tools at the same moment, and one of them used
to fail every module it started while the other held the lock."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from rigfleet_sandbox import shell

FRONTEND = Path("/var/lib/dpkg/lock-frontend")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("apt-get") is None or not FRONTEND.exists(),
                    reason="needs root and this host's apt")
def test_an_install_behind_a_held_dpkg_lock_waits_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    held, released = threading.Event(), threading.Event()
    calls: list[list[str]] = []
    real_run = subprocess.run

    def recorded(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        calls.append(list(cmd))
        return real_run(cmd, **kwargs)

    monkeypatch.setattr(shell.subprocess, "run", recorded)

    def hold() -> None:
        fd = os.open(FRONTEND, os.O_RDWR)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX)
            held.set()
            released.wait(timeout=60)
        finally:
            os.close(fd)  # closing drops the lock

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(timeout=60)
    # the lock is dropped only once apt-get is already waiting on it
    timer = threading.Timer(3, released.set)
    timer.start()
    try:
        shell.apt_install(["gzip"])  # installed on every Debian host: apt has nothing to do
    finally:
        released.set()
        timer.cancel()
        holder.join()
    # one install, which waited: a failed first try would have fetched the lists and tried again
    assert [c[-2:] for c in calls] == [["-y", "gzip"]], calls
