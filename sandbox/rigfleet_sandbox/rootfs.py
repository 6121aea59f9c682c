"""The cached debootstrap root per distro, and one writable copy of it per simulated rig.

The tarball is built once (about a minute of debootstrap) and kept under CACHE_DIR, outside
the checkout, so CI and later `up`s only unpack it (a few seconds per rig).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rigfleet_sandbox.debindex import debian_mirror
from rigfleet_sandbox.layout import CACHE_DIR, DISTROS, OPERATOR, RigSpec
from rigfleet_sandbox.shell import Log, SandboxError, run

# Bump when the customisation below changes so stale caches are rebuilt, not reused.
ROOTFS_VERSION = 2
# linux-image-amd64: a real Debian rig has the distribution kernel's metapackage, which rigfleet
# holds with the driver (the container boots the host's kernel; the package is only apt state)
INCLUDE = (
    "openssh-server,python3,sudo,ca-certificates,gnupg,curl,systemd,systemd-sysv,dbus,iproute2,"
    "linux-image-amd64"
)
HOST_LOCAL_CAS = Path("/usr/local/share/ca-certificates")
_TAR_FLAGS = ["--numeric-owner", "--xattrs", "--xattrs-include=*"]

SSHD_CONF = """\
# rigfleet sandbox (SIMULATED rig): key-only operator access, like a hardened real rig.
HostKey /etc/ssh/ssh_host_ed25519_key
PermitRootLogin no
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
UseDNS no
"""
MARKER = """\
This machine is a SIMULATED rig of the rigfleet sandbox: a systemd-nspawn container on the
sandbox host. systemd, sshd, apt and Docker here are real; its GPUs, NVIDIA stack and vLLM
engine are simulated stand-ins.
"""
# Units that cannot work in a container and would only leave the rig "degraded".
MASKED_UNITS = ("systemd-modules-load.service",)


def tarball_path(distro: str) -> Path:
    return CACHE_DIR / f"rootfs-{distro}-v{ROOTFS_VERSION}.tar.gz"


@contextmanager
def locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def ensure_tarball(distro: str, log: Log) -> Path:
    """Return the cached root tarball for `distro`, building it when absent."""
    if distro not in DISTROS:
        raise SandboxError(f"unsupported distro {distro!r}; choose one of {', '.join(DISTROS)}")
    target = tarball_path(distro)
    with locked(CACHE_DIR / f".rootfs-{distro}.lock"):
        if target.exists():
            log(f"reusing cached {distro} root {target}")
            return target
        build = CACHE_DIR / f"build-{distro}"
        unmount_under(build)  # a killed earlier debootstrap may leave its /proc mounted there
        remove_tree(build)
        started = time.monotonic()
        log(f"debootstrap {distro} (minbase) into {build}; cached afterwards, about a minute once")
        cmd = ["debootstrap", "--variant=minbase", f"--include={INCLUDE}", distro, str(build), debian_mirror()]
        try:
            run(cmd, timeout=1800)
        except SandboxError as exc:
            # One retry: a mirror hiccup should not fail a whole CI run.
            log(f"debootstrap failed, retrying once: {str(exc)[-300:]}")
            unmount_under(build)
            remove_tree(build)
            run(cmd, timeout=1800)
        customise(build)
        tmp = target.with_suffix(".partial")
        run(["tar", *_TAR_FLAGS, "--use-compress-program=gzip -1", "-C", str(build), "-cf", str(tmp), "."])
        os.replace(tmp, target)
        remove_tree(build)
        log(f"cached {distro} root {target} in {time.monotonic() - started:.0f}s")
    return target


def customise(root: Path) -> None:
    """Turn a fresh debootstrap root into the rig image every copy starts from."""
    run(
        [
            "chroot",
            str(root),
            "useradd",
            "--create-home",
            "--shell",
            "/bin/bash",
            "--comment",
            "rigfleet operator",
            OPERATOR,
        ]
    )
    sudoers = root / "etc/sudoers.d" / OPERATOR
    sudoers.write_text(f"{OPERATOR} ALL=(ALL:ALL) NOPASSWD: ALL\n")
    sudoers.chmod(0o440)
    run(["chroot", str(root), "visudo", "-cf", f"/etc/sudoers.d/{OPERATOR}"])
    (root / "etc/ssh/sshd_config.d/rigfleet-sandbox.conf").write_text(SSHD_CONF)
    # Host keys are made per rig copy, so every rig has its own identity.
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    for unit in MASKED_UNITS:
        link = root / "etc/systemd/system" / unit
        link.unlink(missing_ok=True)
        link.symlink_to("/dev/null")
    (root / "etc/rigfleet-sandbox").write_text(MARKER)
    (root / "etc/motd").write_text("rigfleet sandbox: SIMULATED rig (see /etc/rigfleet-sandbox)\n")
    (root / "etc/machine-id").write_text("")
    run(["chroot", str(root), "apt-get", "clean"])
    for lists in (root / "var/lib/apt/lists").glob("*_*"):
        lists.unlink()


def install_rig_root(tarball: Path, rig: RigSpec, authorized_key: str) -> str:
    """Unpack a fresh root for `rig`; return its new ed25519 host public key line."""
    remove_tree(rig.dir)
    rig.root.mkdir(parents=True)
    run(["tar", *_TAR_FLAGS, "-xzf", str(tarball), "-C", str(rig.root)])
    root = rig.root
    key = root / "etc/ssh/ssh_host_ed25519_key"
    run(
        [
            "ssh-keygen",
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            f"root@{rig.name} (simulated rig)",
            "-f",
            str(key),
        ]
    )
    (root / "etc/machine-id").write_text(uuid.uuid4().hex + "\n")
    (root / "etc/hostname").write_text(rig.name + "\n")
    (root / "etc/hosts").write_text(
        f"127.0.0.1\tlocalhost\n{rig.address}\t{rig.name}\n::1\tlocalhost ip6-localhost ip6-loopback\n"
    )
    _trust_host_cas(root)
    uid, gid = _passwd_ids(root, OPERATOR)
    ssh_dir = root / "home" / OPERATOR / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    auth = ssh_dir / "authorized_keys"
    auth.write_text(authorized_key.strip() + "\n")
    auth.chmod(0o600)
    for path in (ssh_dir, auth):
        os.chown(path, uid, gid)
    pub = key.with_suffix(".pub").read_text().split()
    return f"{pub[0]} {pub[1]}"


def _trust_host_cas(root: Path) -> None:
    """Give the rig the host's local CAs: where the host's egress re-signs TLS, pip through the
    proxy's CONNECT tunnel must trust what the host trusts. No-op on a host without any."""
    bundle = root / "etc/ssl/certs/ca-certificates.crt"
    local = root / "usr/local/share/ca-certificates"
    for cert in sorted(HOST_LOCAL_CAS.glob("*.crt")) if HOST_LOCAL_CAS.is_dir() else []:
        local.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(cert, local / cert.name)  # kept by a later update-ca-certificates in the rig
        pem = cert.read_text()
        if bundle.exists() and pem.strip() not in bundle.read_text():
            with open(bundle, "a") as fh:
                fh.write("\n" + pem.strip() + "\n")


def _passwd_ids(root: Path, user: str) -> tuple[int, int]:
    for line in (root / "etc/passwd").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == user:
            return int(fields[2]), int(fields[3])
    raise SandboxError(f"user {user} missing from {root}/etc/passwd; delete {CACHE_DIR} tarballs")


def unmount_under(path: Path) -> None:
    prefix = str(path).rstrip("/") + "/"
    points = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
        run(["umount", "-l", point], check=False)


def remove_tree(path: Path) -> None:
    """rm -rf that refuses to cross into mounts (a stale mount must be unmounted first)."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        # --one-file-system: never delete through a leftover bind mount into the host.
        run(["rm", "-rf", "--one-file-system", str(path)])
