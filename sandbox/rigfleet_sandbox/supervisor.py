"""Supervisor of one SIMULATED rig: runs its systemd-nspawn container and reboots it.

`python -m rigfleet_sandbox.supervisor rig-01` is started detached by `rigfleet sandbox up`.
On hardware a reboot keeps the machine; here a reboot is nspawn exiting with status 133, so
this loop starts the container again (with a fresh random boot id). Poweroff (exit 0) or a
failure ends the loop: the rig stays down, as a powered-off box would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from rigfleet_sandbox.layout import RigSpec

EXIT_REBOOT = 133
# More reboots than this within REBOOT_WINDOW_S is a boot loop; stop instead of spinning.
MAX_QUICK_REBOOTS = 5
REBOOT_WINDOW_S = 60.0


def nspawn_command(rig: RigSpec) -> list[str]:
    return [
        "systemd-nspawn",
        "-D",
        str(rig.root),
        "--boot",
        "--register=no",
        "--keep-unit",
        "--console=pipe",
        f"--machine={rig.machine}",
        f"--network-namespace-path=/run/netns/{rig.netns}",
        # All capabilities and a private netns let dockerd inside create its bridge and chains.
        "--capability=all",
        "--system-call-filter=@keyring @mount bpf",
    ]


def nspawn_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "LISTEN_FDS", "LISTEN_PID")}
    # cgroup v2 inside the rig even on a hybrid host, else containers in the rig hit a read-only cgroupfs.
    env["SYSTEMD_NSPAWN_UNIFIED_HIERARCHY"] = "1"
    # nspawn mounts /proc/sys read-only unless it made the netns itself; the rig owns its netns, so
    # let it write /proc/sys/net (dockerd sets ip_forward and per-interface IPv6 there).
    env["SYSTEMD_NSPAWN_API_VFS_WRITABLE"] = "network"
    return env


def state_path(rig: RigSpec) -> Path:
    return rig.dir / "supervisor.json"


def boots_path(rig: RigSpec) -> Path:
    return rig.dir / "boots.jsonl"


def read_state(rig: RigSpec) -> dict[str, Any]:
    try:
        return dict(json.loads(state_path(rig).read_text()))
    except (OSError, ValueError):
        return {}


def read_boots(rig: RigSpec) -> list[dict[str, Any]]:
    try:
        return [json.loads(line) for line in boots_path(rig).read_text().splitlines() if line.strip()]
    except OSError:
        return []


class Supervisor:
    def __init__(self, rig: RigSpec) -> None:
        self.rig = rig
        self.stopping = False
        self.proc: subprocess.Popen[bytes] | None = None

    def log(self, msg: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} [{self.rig.name}, simulated rig] {msg}", flush=True)

    def write_state(self, **fields: Any) -> None:
        data = {"supervisor_pid": os.getpid(), "rig": self.rig.name, **fields}
        tmp = state_path(self.rig).with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, state_path(self.rig))

    def on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.log(f"got signal {signum}: powering the rig off")
        self.stopping = True
        if self.proc and self.proc.poll() is None:
            # nspawn turns SIGTERM into SIGRTMIN+3 for the rig's systemd: an orderly poweroff.
            self.proc.send_signal(signal.SIGTERM)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, self.on_signal)
        boot = 0
        reboots: list[float] = []
        with open(self.rig.dir / "console.log", "ab") as console:
            while not self.stopping:
                boot += 1
                started = time.time()
                self.proc = subprocess.Popen(
                    nspawn_command(self.rig),
                    env=nspawn_env(),
                    stdin=subprocess.DEVNULL,
                    stdout=console,
                    stderr=subprocess.STDOUT,
                    cwd="/",
                )
                self.write_state(state="running", boot=boot, started=started, nspawn_pid=self.proc.pid)
                self._append_boot({"boot": boot, "started": started, "nspawn_pid": self.proc.pid})
                self.log(f"boot {boot}: systemd-nspawn pid {self.proc.pid}")
                rc = self.proc.wait()
                self._append_boot({"boot": boot, "ended": time.time(), "exit": rc})
                if self.stopping or rc != EXIT_REBOOT:
                    what = "powered off" if rc == 0 else f"systemd-nspawn exited with {rc}"
                    self.log(f"boot {boot}: {what}; the rig stays down")
                    self.write_state(state="stopped", boot=boot, exit=rc, ended=time.time())
                    return 0 if rc == 0 else 1
                now = time.time()
                reboots = [t for t in reboots if now - t < REBOOT_WINDOW_S] + [now]
                if len(reboots) > MAX_QUICK_REBOOTS:
                    self.log(f"{len(reboots)} reboots within {REBOOT_WINDOW_S:.0f}s: boot loop, giving up")
                    self.write_state(state="stopped", boot=boot, exit=rc, ended=now)
                    return 1
                self.log(f"boot {boot}: the rig's systemd asked for a reboot; starting it again")
                self.write_state(state="rebooting", boot=boot)
        return 0

    def _append_boot(self, record: dict[str, Any]) -> None:
        with open(boots_path(self.rig), "a") as fh:
            fh.write(json.dumps(record) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m rigfleet_sandbox.supervisor RIG", file=sys.stderr)
        return 2
    return Supervisor(RigSpec.from_name(args[0])).run()


if __name__ == "__main__":
    sys.exit(main())
