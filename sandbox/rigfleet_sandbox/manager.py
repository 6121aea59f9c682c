"""`up`, `down` and `status` of the sandbox of SIMULATED rigs.

State lives in STATE_DIR (/var/lib/rigfleet-sandbox): rigs/rig-NN/{root,console.log,boots.jsonl,
supervisor.json}, www/, logs/, ssh/ and sandbox.json. The debootstrap tarballs and the apt
proxy's .deb cache live in CACHE_DIR (/var/cache/rigfleet) and survive `down`.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rigfleet_sandbox import invfiles, net, procs, rootfs, upstream_registry, upstreamlog
from rigfleet_sandbox.layout import (
    APT_CACHE_DIR,
    APT_PROXY_PORT,
    LAST_LOGS_DIR,
    LOCK_FILE,
    LOG_DIR,
    MACHINE_PREFIX,
    NETNS_PREFIX,
    REGISTRY_DIR,
    REGISTRY_PORT,
    RIGS_DIR,
    SERVICE_ADDR,
    SSH_DIR,
    STATE_DIR,
    STATE_FILE,
    UPSTREAM_REGISTRY_PORT,
    WWW_DIR,
    WWW_PORT,
    RigSpec,
    inventory_dir,
    rig_specs,
)
from rigfleet_sandbox.shell import Log, SandboxError, ensure_host_tools, run
from rigfleet_sandbox.supervisor import read_state

BOOT_TIMEOUT_S = 120.0
# the sandbox's host-side processes that `down` asks to stop (SIGTERM) before clearing the rest
_HOST_SERVICES = ("supervisor", "services", "registry", "upstream-registry")
POWEROFF_TIMEOUT_S = 30.0
NSPAWN_RUN_DIRS = (Path("/run/systemd/nspawn/propagate"), Path("/run/systemd/nspawn/unix-export"))

# Detached children started by this process; kept so `down` can reap them (no zombies).
_CHILDREN: list[subprocess.Popen[bytes]] = []


@dataclass
class RigInfo:
    name: str
    address: str
    netns: str
    root: str
    host_key: str
    boot_seconds: float | None = None
    boot_id: str | None = None


@dataclass
class SandboxInfo:
    """What `up` made; also saved as STATE_DIR/sandbox.json."""

    distro: str
    state_dir: str
    inventory_dir: str
    tarball: str
    service_addr: str
    rigs: list[RigInfo]
    hooks: dict[str, Any] = field(default_factory=dict)
    unpack_seconds: float = 0.0

    @property
    def rig_names(self) -> list[str]:
        return [r.name for r in self.rigs]

    @staticmethod
    def load() -> SandboxInfo | None:
        try:
            data = json.loads(STATE_FILE.read_text())
        except (OSError, ValueError):
            return None
        data["rigs"] = [RigInfo(**r) for r in data["rigs"]]
        return SandboxInfo(**data)


def _echo(msg: str) -> None:
    print(msg, flush=True)


def _require_root_linux() -> None:
    if platform.system() != "Linux":
        raise SandboxError("the sandbox needs Linux (systemd-nspawn, network namespaces)")
    if os.geteuid() != 0:
        raise SandboxError("the sandbox needs root (network namespaces, nspawn); run it with sudo")


@contextmanager
def _exclusive() -> Iterator[None]:
    LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
    with open(LOCK_FILE, "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise SandboxError(f"another `rigfleet sandbox` up/down holds {LOCK_FILE}; wait for it") from exc
        yield


def _spawn(module: str, args: list[str], logfile: Path) -> subprocess.Popen[bytes]:
    logfile.parent.mkdir(parents=True, exist_ok=True)
    with open(logfile, "ab") as out:
        child = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd="/",
            start_new_session=True,  # detached, like setsid
        )
    _CHILDREN.append(child)
    return child


def _reap() -> None:
    for child in list(_CHILDREN):
        if child.poll() is not None:
            _CHILDREN.remove(child)


def _wait_port(addr: str, port: int, timeout: float, banner: bytes = b"") -> float | None:
    """Poll until something listens (and sends `banner`); return when it answered, or None."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((addr, port), timeout=1.0) as sock:
                if not banner:
                    return time.time()
                sock.settimeout(2.0)
                if sock.recv(64).startswith(banner):
                    return time.time()
        except OSError:
            pass
        time.sleep(0.1)
    return None


# -- cleanup --------------------------------------------------------------------------------


def _our_mounts() -> list[str]:
    # Not the rootfs build dirs under CACHE_DIR: every instance shares them, and a build clears its
    # own stale mounts under its lock (rootfs.ensure_tarball); another instance may be building now.
    prefixes = (
        str(STATE_DIR) + "/",
        f"{net.NETNS_DIR}/{NETNS_PREFIX}",
        *(str(d) + "/" for d in NSPAWN_RUN_DIRS),
    )
    mounts = []
    for line in Path("/proc/mounts").read_text().splitlines():
        point = line.split()[1].replace("\\040", " ")
        if point.startswith(prefixes) or point == str(STATE_DIR):
            mounts.append(point)
    return mounts


def leftovers() -> dict[str, list[str]]:
    """Everything of the sandbox still on the host; all lists empty after a clean `down`."""
    netns, links = net.list_ours()
    run_dirs = [str(p) for d in NSPAWN_RUN_DIRS if d.is_dir() for p in d.glob(f"{MACHINE_PREFIX}rig-*")]
    return {
        "processes": [f"{p.pid} {p.what}: {p.cmd}" for p in procs.sandbox_processes()],
        "mounts": _our_mounts(),
        "netns": netns,
        "links": links,
        "rules": net.our_rules(),
        "dirs": [str(p) for p in (RIGS_DIR, WWW_DIR, STATE_FILE) if p.exists()] + run_dirs,
    }


def clear(log: Log = _echo) -> None:
    """Remove whatever an earlier run left, killed or not: processes, mounts, links, netns, dirs."""
    found = procs.sandbox_processes()
    if found:
        log(
            f"ending {len(found)} leftover sandbox process(es): "
            + ", ".join(f"{p.pid} ({p.what})" for p in found[:8])
            + (" ..." if len(found) > 8 else "")
        )
        survivors = procs.kill_all(found)
        if survivors:
            raise SandboxError(f"could not end sandbox processes: {survivors}")
    _reap()
    # Netns bind mounts go with their namespaces in net.teardown; anything else here is stale.
    stale = [m for m in _our_mounts() if not m.startswith(str(net.NETNS_DIR) + "/")]
    for point in sorted(stale, key=len, reverse=True):
        log(f"unmounting leftover {point}")
        run(["umount", "-l", point], check=False)
    net.teardown(log)
    for d in NSPAWN_RUN_DIRS:
        for p in d.glob(f"{MACHINE_PREFIX}rig-*") if d.is_dir() else []:
            rootfs.remove_tree(p)
    if LOG_DIR.is_dir():
        # Keep the last run's logs for debugging; the state dir itself goes.
        rootfs.remove_tree(LAST_LOGS_DIR)
        LAST_LOGS_DIR.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(LOG_DIR), str(LAST_LOGS_DIR))
    for rig_dir in sorted(RIGS_DIR.glob("rig-*")) if RIGS_DIR.is_dir() else []:
        rootfs.remove_tree(rig_dir)
    rootfs.remove_tree(STATE_DIR)


# -- up -------------------------------------------------------------------------------------


def _client_key() -> Path:
    SSH_DIR.mkdir(parents=True, exist_ok=True)
    key = SSH_DIR / "id_ed25519"
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "rigfleet-sandbox-operator", "-f", str(key)])
    return key


def ssh_command(inv: Path, address: str, user: str = "rigop") -> list[str]:
    """ssh argv for a sandbox rig: the inventory's key, strict checking against its known_hosts."""
    return [
        "ssh",
        "-i",
        str(inv / "id_ed25519"),
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        f"UserKnownHostsFile={inv / 'known_hosts'}",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        "ConnectTimeout=10",
        "-o",
        "LogLevel=ERROR",
        f"{user}@{address}",
    ]


def _run_hooks(tarball: Path, distro: str, log: Log) -> dict[str, Any]:
    """Let the simulated-repo modules fill www; each returns inventory values."""
    results: dict[str, Any] = {}
    hooks = (
        ("rigfleet_sandbox.aptrepo", "build_apt_repo", (WWW_DIR,)),
        ("rigfleet_sandbox.dockerrepo", "build_docker_repo", (WWW_DIR,)),  # the default Docker path
        ("rigfleet_sandbox.engine", "build_engine_artifacts", (WWW_DIR, tarball)),
    )
    # stand-ins shaped like this suite's packages
    kwargs = {"build_apt_repo": {"suite": distro}, "build_docker_repo": {"suite": distro}}
    for module, func, args in hooks:
        try:
            mod = __import__(module, fromlist=[func])
            hook = getattr(mod, func)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            log(f"warning: {module} is not there yet; skipping {func} (www has no such content)")
            continue
        except AttributeError:
            log(f"warning: {module} has no {func} yet; skipping it")
            continue
        started = time.monotonic()
        results[func] = hook(*args, **kwargs.get(func, {})) or {}
        log(f"{func}: done in {time.monotonic() - started:.1f}s")
    return results


def up(rigs: int = 1, distro: str = "trixie", log: Log = _echo) -> SandboxInfo:
    """Boot `rigs` SIMULATED rigs and write the sandbox inventory; returns what was made."""
    _require_root_linux()
    specs = rig_specs(rigs)
    with _exclusive():
        began = time.monotonic()
        ensure_host_tools(log)  # first: clearing leftovers needs ip(8) already
        clear(log)
        tarball = rootfs.ensure_tarball(distro, log)
        for d in (STATE_DIR, RIGS_DIR, WWW_DIR, LOG_DIR):
            d.mkdir(parents=True, exist_ok=True)
        key = _client_key()
        authorized = key.with_suffix(".pub").read_text()
        upstream_registry.ensure_tls(log)

        net.setup_service_address()
        for spec in specs:
            net.setup_rig(spec)
        net.setup_rig_routing(specs)
        log(net.rp_filter_report(specs))
        _spawn(
            "rigfleet_sandbox.services",
            [
                "--addr",
                SERVICE_ADDR,
                "--www",
                str(WWW_DIR),
                "--cache",
                str(APT_CACHE_DIR),
                "--proxy-port",
                str(APT_PROXY_PORT),
                "--www-port",
                str(WWW_PORT),
                "--access-log",
                str(upstreamlog.LOG),
            ],
            LOG_DIR / "services.log",
        )
        _spawn(
            "rigfleet_sandbox.registry",
            ["--addr", SERVICE_ADDR, "--port", str(REGISTRY_PORT), "--storage", str(REGISTRY_DIR / "data")],
            LOG_DIR / "registry.log",
        )
        _spawn("rigfleet_sandbox.registry", upstream_registry.registry_args(), LOG_DIR / "registry-upstream.log")

        started = time.monotonic()
        infos = [_install_rig(tarball, s, authorized) for s in specs]
        unpack = time.monotonic() - started
        log(f"unpacked {len(specs)} rig root(s) from {tarball.name} in {unpack:.1f}s")
        inv = inventory_dir()
        info = SandboxInfo(
            distro,
            str(STATE_DIR),
            str(inv),
            str(tarball),
            SERVICE_ADDR,
            infos,
            unpack_seconds=round(unpack, 2),
        )
        _save(info)
        for spec in specs:
            _spawn("rigfleet_sandbox.supervisor", [spec.name], LOG_DIR / f"{spec.name}.log")
        for port in (APT_PROXY_PORT, WWW_PORT, REGISTRY_PORT, UPSTREAM_REGISTRY_PORT):
            if _wait_port(SERVICE_ADDR, port, 15.0) is None:
                raise SandboxError(f"sandbox services did not listen on {SERVICE_ADDR}:{port}; see {LOG_DIR}")
        for spec, rig in zip(specs, infos, strict=True):
            rig.boot_seconds = _wait_boot(spec)
            log(
                f"{spec.name} (simulated rig) at {spec.address}: sshd answered {rig.boot_seconds:.1f}s "
                "after systemd-nspawn started"
            )

        hooks = _run_hooks(tarball, distro, log)
        group_vars: dict[str, Any] = {}
        pinsets: dict[str, Any] = {}
        for result in hooks.values():
            group_vars.update(result.get("group_vars") or {})
            pinsets.update(result.get("pinsets") or {})
        info.hooks = hooks
        invfiles.write_inventory(inv, [(r.name, r.address, r.host_key) for r in infos], key, group_vars, pinsets)
        for rig in infos:
            rig.boot_id = _ssh_check(inv, rig)
        _save(info)
        log(f"sandbox up in {time.monotonic() - began:.0f}s: {len(infos)} simulated rig(s), inventory {inv}")
        return info


def _install_rig(tarball: Path, spec: RigSpec, authorized: str) -> RigInfo:
    """A fresh root for the rig, its Docker trusting the stand-in upstream registry before any deploy."""
    host_key = rootfs.install_rig_root(tarball, spec, authorized)
    upstream_registry.trust(spec.root)
    return RigInfo(spec.name, spec.address, spec.netns, str(spec.root), host_key)


def _save(info: SandboxInfo) -> None:
    tmp = STATE_FILE.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(info), indent=2, default=str))
    os.replace(tmp, STATE_FILE)


def _wait_boot(spec: RigSpec) -> float:
    answered = _wait_port(spec.address, 22, BOOT_TIMEOUT_S, banner=b"SSH-")
    state = read_state(spec)
    if answered is None:
        raise SandboxError(
            f"{spec.name} (simulated rig): sshd did not answer on {spec.address}:22 within "
            f"{BOOT_TIMEOUT_S:.0f}s; see {LOG_DIR / spec.name}.log and {spec.dir}/console.log"
        )
    return round(answered - float(state.get("started", answered)), 2)


def _ssh_check(inv: Path, rig: RigInfo) -> str:
    """Log in as the operator with strict host keys and sudo, the way the deploy will."""
    proc = run(
        [*ssh_command(inv, rig.address), "sudo", "-n", "cat", "/proc/sys/kernel/random/boot_id"],
        check=False,
        timeout=60,
    )
    if proc.returncode != 0:
        raise SandboxError(f"{rig.name} (simulated rig): ssh/sudo check failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


# -- down -----------------------------------------------------------------------------------


def down(log: Log = _echo, timeout: float = POWEROFF_TIMEOUT_S) -> dict[str, list[str]]:
    """Power the rigs off (kill after `timeout`), stop services, remove all but the cache.

    Returns leftovers() afterwards: every list is empty when the host is clean.
    """
    _require_root_linux()
    with _exclusive():
        running = [p for p in procs.sandbox_processes() if p.what in _HOST_SERVICES]
        for p in running:
            os.kill(p.pid, signal.SIGTERM)  # supervisors power their rig off in order
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(procs.alive(p.pid) for p in running):
            _reap()
            time.sleep(0.2)
        slow = [p for p in running if procs.alive(p.pid)]
        if slow:
            log(f"{len(slow)} process(es) did not stop within {timeout:.0f}s; killing them")
        clear(log)
        _reap()
        left = leftovers()
        if any(left.values()):
            log(f"warning: left behind after down: {left}")
        else:
            log("sandbox down: no process, mount, netns, veth or rig dir left")
        return left


# -- power one rig off and on -----------------------------------------------------------------


def _running_init(spec: RigSpec) -> int | None:
    st = read_state(spec)
    return _rig_init(st.get("nspawn_pid")) if st.get("state") == "running" else None


def power_off(name: str, timeout: float = POWEROFF_TIMEOUT_S, log: Log = _echo) -> None:
    """Cut one rig's power, as a pulled plug would, and leave it off (power_on brings it back).

    Its NIC goes dark first (the rig side of its veth down), so nothing of a dying box reaches the
    wire: no FIN, no RST, and afterwards no ARP answer; a peer sees silence, as with real hardware.
    Then the container dies at once (`systemctl poweroff --force --force` inside it: reboot(2)
    with no orderly shutdown). nspawn reports a poweroff, so the supervisor ends and the rig
    stays down. The other rigs and the host services are not touched.
    """
    _require_root_linux()
    spec = RigSpec.from_name(name)
    init = _running_init(spec)
    supervisor = read_state(spec).get("supervisor_pid")
    if not init or not procs.alive(supervisor):
        raise SandboxError(f"{name} (simulated rig) is not running; nothing to power off")
    run(["ip", "-n", spec.netns, "link", "set", "eth0", "down"])
    run(["nsenter", "-t", str(init), "-a", "systemctl", "poweroff", "--force", "--force"], check=False, timeout=30)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and procs.alive(supervisor):
        _reap()
        time.sleep(0.1)
    if procs.alive(supervisor):
        raise SandboxError(f"{name} (simulated rig) did not power off within {timeout:.0f}s; see {LOG_DIR / name}.log")
    log(f"{name} (simulated rig) powered off (power cut: no orderly shutdown, link dark)")


def power_on(name: str, log: Log = _echo) -> float:
    """Power a rig that power_off (or a poweroff inside it) left down on again: its link back up,
    a supervisor started as `up` starts it. Returns seconds from nspawn's start to sshd answering."""
    _require_root_linux()
    spec = RigSpec.from_name(name)
    if procs.alive(read_state(spec).get("supervisor_pid")):
        raise SandboxError(f"{name} (simulated rig) is already on")
    ns = ["ip", "-n", spec.netns]
    run([*ns, "link", "set", "eth0", "up"])
    # a link taken down loses its routes; the connected one comes back with the link, this one not
    run([*ns, "route", "replace", "default", "via", spec.host_addr])
    _spawn("rigfleet_sandbox.supervisor", [spec.name], LOG_DIR / f"{spec.name}.log")
    seconds = _wait_boot(spec)
    log(f"{name} (simulated rig) powered on: sshd answered {seconds:.1f}s after systemd-nspawn started")
    return seconds


# -- status ---------------------------------------------------------------------------------


@dataclass
class RigStatus:
    name: str
    address: str
    state: str
    sshd: bool
    boot_id: str | None
    uptime_s: float | None
    boots: int
    supervisor_pid: int | None
    nspawn_pid: int | None
    init_pid: int | None


def _rig_init(nspawn_pid: int | None) -> int | None:
    kids = procs.children_of(nspawn_pid) if nspawn_pid and procs.alive(nspawn_pid) else []
    return kids[0] if kids else None


def boot_id(init_pid: int) -> str | None:
    """The rig's boot id as its processes see it (nspawn gives every boot a random one)."""
    proc = run(
        ["nsenter", "-t", str(init_pid), "-m", "cat", "/proc/sys/kernel/random/boot_id"],
        check=False,
        timeout=10,
    )
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def status() -> list[RigStatus]:
    info = SandboxInfo.load()
    if info is None:
        return []
    out = []
    for rig in info.rigs:
        spec = RigSpec.from_name(rig.name)
        st = read_state(spec)
        sup = st.get("supervisor_pid")
        nspawn = st.get("nspawn_pid") if st.get("state") == "running" else None
        init = _rig_init(nspawn)
        started = procs.start_time(init) if init else None
        sshd = _wait_port(rig.address, 22, 0.5, banner=b"SSH-") is not None if init else False
        state = st.get("state", "unknown") if procs.alive(sup) else "down"
        out.append(
            RigStatus(
                rig.name,
                rig.address,
                state,
                sshd,
                boot_id(init) if init else None,
                round(time.time() - started, 1) if started else None,
                int(st.get("boot", 0)),
                sup if procs.alive(sup) else None,
                nspawn if procs.alive(nspawn) else None,
                init,
            )
        )
    return out
