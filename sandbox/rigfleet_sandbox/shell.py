"""Running host commands for the sandbox, with the failing command named in the error."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence

Log = Callable[[str], None]


class SandboxError(RuntimeError):
    """A sandbox step failed; the message says which and why."""


def run(
    cmd: Sequence[str], *, check: bool = True, input: str | None = None, timeout: float | None = 600,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(list(cmd), input=input, capture_output=True, text=True, timeout=timeout, check=False,
                              env=env)
    except FileNotFoundError as exc:
        raise SandboxError(f"command not found: {cmd[0]} (is its package installed?)") from exc
    except subprocess.TimeoutExpired as exc:
        raise SandboxError(f"timed out after {timeout}s: {' '.join(cmd)}") from exc
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip()[-2000:]
        raise SandboxError(f"`{' '.join(cmd)}` failed with {proc.returncode}: {detail}")
    return proc


# Host tools the sandbox needs, and the Debian package that ships each.
HOST_TOOLS = {
    "debootstrap": "debootstrap",
    "systemd-nspawn": "systemd-container",
    "ip": "iproute2",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "nsenter": "util-linux",
    "gzip": "gzip",
    "docker-registry": "docker-registry",  # the fleet and the upstream registry (rigfleet_sandbox.registry)
    "openssl": "openssl",  # the upstream registry's TLS (rigfleet_sandbox.upstream_registry)
    "tmux": "tmux",  # a real terminal for `status --watch` (tests/sandbox/test_report.py)
}


def ensure_host_tools(log: Log) -> None:
    """apt-get install whatever is missing: CI starts on a fresh machine."""
    missing = {pkg for tool, pkg in HOST_TOOLS.items() if shutil.which(tool) is None}
    if not os.path.exists("/usr/share/keyrings/debian-archive-keyring.gpg"):
        missing.add("debian-archive-keyring")  # debootstrap verifies the Release file with it
    if not missing:
        return
    log(f"installing host tools: {' '.join(sorted(missing))}")
    apt_install(missing)


# one host-wide lock for the sandbox's own installs: on a fresh machine two test shards (two
# sandbox instances) and the repository builders ask for their tools at the same moment
APT_LOCK = "/run/lock/rigfleet-sandbox-apt.lock"
APT_LOCK_TIMEOUT_S = 900  # dpkg's own lock, held by an install outside the sandbox


def apt_install(packages: Iterable[str], *, recommends: bool = True) -> None:
    """`apt-get install` on this host, one at a time and waiting for dpkg's lock; the package
    lists are fetched only when the install fails without them."""
    apt = ["apt-get", "-o", f"DPkg::Lock::Timeout={APT_LOCK_TIMEOUT_S}"]
    install = [*apt, "install", "-y", *([] if recommends else ["--no-install-recommends"]), *sorted(set(packages))]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with open(APT_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if run(install, check=False, timeout=APT_LOCK_TIMEOUT_S * 2, env=env).returncode != 0:
            run([*apt, "update"], timeout=APT_LOCK_TIMEOUT_S * 2, env=env)
            run(install, timeout=APT_LOCK_TIMEOUT_S * 2, env=env)
