"""Rigs' SSH host keys against the known_hosts file each rig uses (`rigfleet hostkeys`).

Converges and status check host keys strictly (rigfleet.context.pyinfra_host_data): a rig whose
key is not in its known_hosts file is refused, never accepted on first contact. This module is the
deliberate way to record a key: it fetches the key the rig presents (an SSH key exchange only, no
authentication), compares it with the file and, only when asked, appends the key of a rig that has
no entry yet. A key that differs from the recorded one is never replaced here.

The lookup mirrors paramiko's SSHClient, which pyinfra uses: the entry is `host` on port 22 and
`[host]:port` otherwise, the recorded key type is offered first, and a known entry whose type the
rig does not present counts as a mismatch.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import logging
import os
import re
import socket
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import click
import paramiko

from rigfleet.context import pyinfra_host_data
from rigfleet.errors import InputError, Problem
from rigfleet.loader import Fleet
from rigfleet.schema import Rig

CONNECT_TIMEOUT_S = 10.0
PARALLEL = 16
_PARAMIKO_LOG = "rigfleet.hostkeys.paramiko"
logging.getLogger(_PARAMIKO_LOG).setLevel(logging.CRITICAL)

OK = "ok"
MISSING = "missing"
MISMATCH = "MISMATCH"
UNREACHABLE = "unreachable"

# ssh-keygen's names for key types (sshkey_type() in OpenSSH)
_KEYGEN_TYPES = {
    "ssh-rsa": "RSA",
    "ssh-dss": "DSA",
    "ssh-ed25519": "ED25519",
    "sk-ssh-ed25519@openssh.com": "ED25519-SK",
    "sk-ecdsa-sha2-nistp256@openssh.com": "ECDSA-SK",
}


@dataclass(frozen=True)
class Target:
    """Where a rig's key is checked: the address, the known_hosts entry name and the file."""

    rig: str
    hostname: str
    port: int
    known_hosts: Path

    @property
    def entry(self) -> str:
        return host_entry(self.hostname, self.port)


@dataclass(frozen=True)
class Check:
    target: Target
    state: str  # OK, MISSING, MISMATCH or UNREACHABLE
    key: paramiko.PKey | None = None  # what the rig presents
    known: paramiko.PKey | None = None  # what the file holds for it (MISMATCH)
    reason: str = ""  # why UNREACHABLE


def host_entry(hostname: str, port: int) -> str:
    """The known_hosts name OpenSSH and paramiko look up: `host`, or `[host]:port` off port 22."""
    return hostname if port == 22 else f"[{hostname}]:{port}"


def fingerprint(key: paramiko.PKey) -> str:
    """As `ssh-keygen -l` prints it (without the comment): `256 SHA256:... (ED25519)`."""
    digest = base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
    name = key.get_name()
    kind = _KEYGEN_TYPES.get(name) or ("ECDSA" if name.startswith("ecdsa-") else name.upper())
    return f"{key.get_bits()} SHA256:{digest} ({kind})"


# -- known_hosts --------------------------------------------------------------------------------


def load(path: Path, rig: str = "fleet") -> paramiko.HostKeys:
    """The file's keys (none if it does not exist); a file paramiko cannot read is bad input."""
    keys = paramiko.HostKeys()
    if not path.exists():
        return keys
    try:
        keys.load(str(path))
    except (OSError, UnicodeDecodeError, ValueError, paramiko.SSHException) as exc:
        raise InputError([Problem(rig, "ssh_known_hosts_file", str(path), f"cannot be read ({exc})",
                                  "fix or remove the bad line (OpenSSH known_hosts format)")]) from None
    return keys


def known_for(keys: paramiko.HostKeys, entry: str) -> dict[str, paramiko.PKey]:
    """key type -> key recorded for `entry` (hashed names included), in file order."""
    found = keys.lookup(entry)
    return {} if found is None else {name: found[name] for name in found}


def compare(target: Target, keys: paramiko.HostKeys, presented: paramiko.PKey) -> Check:
    """ok, missing or MISMATCH, exactly as paramiko's strict check would decide."""
    known = known_for(keys, target.entry)
    if not known:
        return Check(target, MISSING, presented)
    same_type = known.get(presented.get_name())
    if same_type == presented:
        return Check(target, OK, presented)
    return Check(target, MISMATCH, presented, same_type or next(iter(known.values())))


def append(path: Path, entry: str, key: paramiko.PKey) -> bool:
    """Append `entry key` in OpenSSH format; existing bytes are kept as they are.

    Creates the file 0644 when absent. Returns False (and writes nothing) when the file already
    holds a key for `entry` by the time the lock is held: a concurrent record, or a mismatch.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    with os.fdopen(fd, "r+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        existing = handle.read()
        if not existing:
            os.fchmod(handle.fileno(), 0o644)
        elif known_for(load(path), entry):
            return False
        line = paramiko.hostkeys.HostKeyEntry([entry], key).to_line()
        assert line is not None
        prefix = b"" if not existing or existing.endswith(b"\n") else b"\n"
        handle.write(prefix + line.encode())
        handle.flush()
        os.fsync(handle.fileno())
    return True


# -- the rigs -----------------------------------------------------------------------------------


def target(fleet: Fleet, rig: Rig) -> Target:
    """The address and the known_hosts file pyinfra uses for this rig."""
    data = pyinfra_host_data(fleet, rig)
    return Target(rig.name, str(data["ssh_hostname"]), int(data.get("ssh_port") or 22),
                  Path(data["ssh_known_hosts_file"]))


def _ssh_config(hostname: str, port: int) -> tuple[str, int, str | None]:
    """Hostname and Port as ~/.ssh/config rewrites them for pyinfra; a proxy is not followed."""
    path = Path("~/.ssh/config").expanduser()
    if not path.is_file():
        return hostname, port, None
    config = paramiko.SSHConfig.from_path(str(path)).lookup(hostname)
    proxy = next((f"{name} in {path}" for name in ("proxyjump", "proxycommand") if name in config), None)
    return config.get("hostname", hostname), int(config.get("port", port)), proxy


def fetch(hostname: str, port: int, prefer: Iterable[str] = (),
          timeout: float = CONNECT_TIMEOUT_S) -> paramiko.PKey:
    """The host key the server presents: a key exchange only, nothing is authenticated or sent."""
    sock = socket.create_connection((hostname, port), timeout=timeout)
    transport = paramiko.Transport(sock)
    transport.set_log_channel(_PARAMIKO_LOG)  # its socket chatter would reach stderr; errors are raised
    try:
        transport.banner_timeout = timeout
        transport.handshake_timeout = timeout
        first = list(prefer)[:1]
        if first:
            options = transport.get_security_options()
            options.key_types = first + [name for name in options.key_types if name not in first]
        transport.start_client(timeout=timeout)
        return transport.get_remote_server_key()
    finally:
        transport.close()
        sock.close()
        transport.join(timeout)  # its reader thread ends once the socket is closed


def check(fleet: Fleet, rig: Rig, keys: paramiko.HostKeys, timeout: float = CONNECT_TIMEOUT_S) -> Check:
    where = target(fleet, rig)
    try:
        hostname, port, proxy = _ssh_config(where.hostname, where.port)
    except (OSError, ValueError) as exc:
        return Check(where, UNREACHABLE, reason=f"~/.ssh/config: {exc}")
    if proxy:
        return Check(where, UNREACHABLE, reason=f"reached through {proxy}: not followed by `rigfleet hostkeys`")
    where = Target(where.rig, hostname, port, where.known_hosts)
    try:
        presented = fetch(hostname, port, known_for(keys, where.entry), timeout)
    except (OSError, EOFError, paramiko.SSHException) as exc:
        return Check(where, UNREACHABLE, reason=f"{where.hostname}:{where.port}: {_reason(exc)}")
    return compare(where, keys, presented)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, socket.timeout | TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__


def check_all(fleet: Fleet, names: list[str], timeout: float = CONNECT_TIMEOUT_S) -> list[Check]:
    """Every named rig, in parallel; the known_hosts files are read (and checked) before any connect."""
    rigs = [fleet.rig(name) for name in names]
    files: dict[Path, paramiko.HostKeys] = {}
    for rig in rigs:
        path = target(fleet, rig).known_hosts
        if path not in files:
            files[path] = load(path, rig.name)
    with ThreadPoolExecutor(max_workers=min(PARALLEL, len(rigs)) or 1) as pool:
        return list(pool.map(lambda rig: check(fleet, rig, files[target(fleet, rig).known_hosts], timeout), rigs))


def refusal(result: Check) -> str:
    """--record never replaces a key: what the operator must do instead."""
    where = result.target
    assert result.key is not None and result.known is not None
    return (f"error: {where.rig}: host key MISMATCH for {where.entry}: {where.known_hosts} has "
            f"{fingerprint(result.known)}, the rig presents {fingerprint(result.key)}; not recorded "
            f"(possible man-in-the-middle, or the rig was reinstalled). Fix: verify the rig's key out of band "
            f"(on its console: ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub); only if it is the rig's, remove the "
            f"old entry deliberately with `ssh-keygen -f {where.known_hosts} -R {where.entry}` and run "
            f"`rigfleet hostkeys --record {where.rig}`")


# -- hints on pyinfra's connect errors -------------------------------------------------------------

_PREFIXED = re.compile(r"\[(\S+)\]\s+(.*)", re.S)
HINT_MARK = "rigfleet hostkeys"


def explain(rig: str, error: str) -> str:
    """A connect error with the way out added when it is a host key refusal (idempotent)."""
    if HINT_MARK in error:
        return error
    if "No host key for" in error:
        return (f"{error}; the rig's host key is not in its known_hosts (first contact): compare "
                f"`rigfleet hostkeys {rig}` with the rig's own fingerprint, then run "
                f"`rigfleet hostkeys --record {rig}`")
    if "does not match" in error and "Host key" in error:
        return (f"{error}; the rig presents another host key than its known_hosts holds: see "
                f"`rigfleet hostkeys {rig}` for both fingerprints and the fix (never replaced automatically; "
                f"a bare `ssh-keygen -R` edits ~/.ssh/known_hosts, not the inventory's file)")
    return error


class ConnectErrorHints(logging.Filter):
    """Adds `explain`'s hint to pyinfra's `[rig] SSH error (...)` lines as they are logged.

    Installed on the `pyinfra` logger by inventory.py (`pyinfra inventory.py deploy.py`) and by the
    `rigfleet` CLI, before anything connects: the operator's output and rigfleet.runner's collected
    connect errors then both carry the hint.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR or not isinstance(record.msg, str) or record.args:
            return True
        match = _PREFIXED.match(click.unstyle(record.msg))
        if match and ("host key" in match[2].lower()):
            hinted = explain(match[1], match[2])
            if hinted != match[2]:
                record.msg = record.msg + hinted[len(match[2]):]
        return True


def install_hints(logger: logging.Logger | None = None) -> None:
    target_logger = logger or logging.getLogger("pyinfra")
    if not any(isinstance(f, ConnectErrorHints) for f in target_logger.filters):
        target_logger.addFilter(ConnectErrorHints())
