"""Finding and ending the processes of the sandbox, including ones a killed earlier run orphaned.

A SIMULATED rig's processes run in their own PID and mount namespaces, and when its nspawn is
killed its systemd lives on, orphaned. They are recognised by the root of their mount
namespace (the rig's root dir), so `up` and `down` can end them by pid, one by one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from rigfleet_sandbox.layout import INSTANCE, RIGS_DIR

SANDBOX_MODULES = ("rigfleet_sandbox.supervisor", "rigfleet_sandbox.services", "rigfleet_sandbox.registry")


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    what: str  # supervisor | services | registry | upstream-registry | nspawn | in-rig
    cmd: str


def _stat(pid: int) -> tuple[str, int] | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1])


def _argv(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _fs_location(path: Path) -> tuple[str, str] | None:
    """(device, path inside that filesystem) of `path`, as mountinfo's root field spells it."""
    best: tuple[str, str, str] | None = None
    path_s = str(path.resolve() if path.exists() else path)
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        f = line.split()
        root, mnt, dev = f[3], f[4], f[2]
        inside = path_s == mnt or path_s.startswith(mnt.rstrip("/") + "/")
        if inside and (best is None or len(mnt) >= len(best[1])):
            best = (root, mnt, dev)
    if best is None:
        return None
    root, mnt, dev = best
    rel = path_s[len(mnt.rstrip("/")) :]
    return dev, (root.rstrip("/") + rel) or "/"


def _mount_root(pid: int) -> tuple[str, str] | None:
    try:
        lines = Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        f = line.split()
        if f[4] == "/":
            return f[2], f[3]
    return None


def _instance_of(pid: int) -> int:
    """The sandbox instance a host-side sandbox process was started for (its environment says)."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return -1
    for item in env:
        if item.startswith(b"RIGFLEET_SANDBOX_INSTANCE="):
            value = item.split(b"=", 1)[1]
            return int(value) if value.isdigit() else 0
    return 0


def _classify(pid: int, argv: list[str], rigs_fs: tuple[str, str] | None) -> str | None:
    for i, arg in enumerate(argv[:-1]):
        if arg == "-m" and argv[i + 1] in SANDBOX_MODULES:
            if _instance_of(pid) != INSTANCE:
                return None
            what = argv[i + 1].rsplit(".", 1)[1]
            # the stand-in upstream registry runs the fleet registry's wrapper: told apart, so that
            # the fleet registry alone can be stopped (a fleet registry outage)
            return "upstream-registry" if what == "registry" and "--upstream-log" in argv else what
    if argv and argv[0].endswith("systemd-nspawn"):
        for i, arg in enumerate(argv[:-1]):
            if arg == "-D" and argv[i + 1].startswith(str(RIGS_DIR) + "/"):
                return "nspawn"
    try:
        if os.readlink(f"/proc/{pid}/root").startswith(str(RIGS_DIR) + "/"):
            return "in-rig"  # e.g. a chroot into a rig root
    except OSError:
        return None
    if rigs_fs is not None:
        root = _mount_root(pid)
        if root and root[0] == rigs_fs[0] and root[1].startswith(rigs_fs[1].rstrip("/") + "/"):
            return "in-rig"
    return None


def sandbox_processes() -> list[Proc]:
    """Live (non-zombie) processes belonging to the sandbox, ours or left by an earlier run."""
    rigs_fs = _fs_location(RIGS_DIR)
    me = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        st = _stat(pid)
        if st is None or st[0] in ("Z", "X"):
            continue
        argv = _argv(pid)
        what = _classify(pid, argv, rigs_fs)
        if what:
            found.append(Proc(pid, st[1], what, " ".join(argv)[:160]))
    return found


def kill_all(procs: list[Proc], wait_s: float = 10.0) -> list[Proc]:
    """SIGKILL each process by pid (supervisors first, so none restarts a rig); return survivors."""
    order = {"supervisor": 0, "services": 1, "registry": 1, "upstream-registry": 1, "nspawn": 2, "in-rig": 3}
    for proc in sorted(procs, key=lambda p: order[p.what]):
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + wait_s
    pids = {p.pid for p in procs}
    while time.monotonic() < deadline:
        alive = [p for p in sandbox_processes() if p.pid in pids]
        if not alive:
            return []
        time.sleep(0.2)
    return alive


def children_of(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            st = _stat(int(entry.name))
            if st and st[1] == pid and st[0] not in ("Z", "X"):
                out.append(int(entry.name))
    return out


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    st = _stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def start_time(pid: int) -> float | None:
    """Wall-clock start of a process (for uptime since the rig booted)."""
    try:
        ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(
            float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime ")
        )
    except (OSError, StopIteration, IndexError, ValueError):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")
