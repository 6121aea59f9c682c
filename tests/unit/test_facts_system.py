"""Parsers of the system, Docker and apt facts, and their commands run for real on this machine."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from rigfleet.facts.apt import AptRepositoryFiles, HeldPackages, KeyringFingerprints
from rigfleet.facts.docker import DockerDaemonConfig, DockerImagePresent, DockerRuntimes
from rigfleet.facts.files import ManagedFile
from rigfleet.facts.nvidia import CdiDevices
from rigfleet.facts.system import (
    BootId,
    DiskSpace,
    KernelHeaders,
    Platform,
    PlatformInfo,
    SecureBoot,
    SecureBootState,
    StaleInitramfs,
)
from rigfleet.operations.apt import keyring_script


def sh(command: str) -> list[str]:
    """Run a fact command the way pyinfra does (sh -c) and return its stdout lines."""
    result = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60, check=True)
    return result.stdout.splitlines()


OS_RELEASE_NOBLE = """PRETTY_NAME="Ubuntu 24.04.3 LTS"
NAME="Ubuntu"
VERSION_ID="24.04"
VERSION="24.04.3 LTS (Noble Numbat)"
VERSION_CODENAME=noble
ID=ubuntu
ID_LIKE=debian
UBUNTU_CODENAME=noble""".splitlines()


def test_platform_from_os_release() -> None:
    info = Platform().process([*OS_RELEASE_NOBLE, "RIGFLEET_ARCH=x86_64", "RIGFLEET_KERNEL=6.8.0-90-generic"])
    assert info == PlatformInfo(
        "ubuntu", "24.04", "noble", "Ubuntu 24.04.3 LTS", "x86_64", "6.8.0-90-generic"
    )
    info = Platform().process(sh(Platform().command()))  # this machine
    assert info.arch and info.kernel and info.id


@pytest.mark.parametrize(
    ("lines", "status"),
    [
        (["source=mokutil", "SecureBoot enabled"], "enabled"),
        (["source=mokutil", "SecureBoot disabled", "Platform is in Setup Mode"], "disabled"),
        (["source=mokutil", "EFI variables are not supported on this system"], "unsupported"),
        (["source=mokutil", "This system doesn't support Secure Boot"], "unsupported"),
        (["source=efivars", "efivar=1"], "enabled"),
        (["source=efivars", "efivar=0"], "disabled"),
        (["source=efivars"], "unknown"),
        (["source=none"], "unsupported"),
    ],
)
def test_secure_boot(lines: list[str], status: str) -> None:
    assert SecureBoot().process(lines).status == status


def test_secure_boot_command_runs() -> None:
    state = SecureBoot().process(sh(SecureBoot().command()))
    assert isinstance(state, SecureBootState)


def test_boot_id() -> None:
    assert (
        BootId().process(["7387d958-b990-4776-aef7-ed12016075a4\n"]) == "7387d958-b990-4776-aef7-ed12016075a4"
    )
    assert len(BootId().process(sh(BootId().command()))) == 36


def test_disk_space_for_absent_and_measured_paths(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "w.bin").write_bytes(b"\0" * 300_000)
    command = DiskSpace().command(
        paths=[str(tmp_path / "models"), str(tmp_path / "not" / "yet")], measured=[str(tmp_path / "models")]
    )
    usage = DiskSpace().process(sh(command))
    models, absent = usage[str(tmp_path / "models")], usage[str(tmp_path / "not" / "yet")]
    assert models.used_kib >= 290 and absent.used_kib == 0
    assert models.mount == absent.mount and models.avail_kib > 0
    parsed = DiskSpace().process(["path=/srv/models avail=104857600 mount=/srv", "used=52428800"])
    assert parsed["/srv/models"].room_gib == 150


def test_kernel_headers() -> None:
    lines = [
        "kernel=6.1.0-41-amd64",
        "installed=no",
        "candidate=(none)",
        "meta_candidate=6.1.158-1",
        "lists=yes",
    ]
    headers = KernelHeaders().process(lines)
    assert (
        headers.kernel,
        headers.installed,
        headers.candidate,
        headers.meta_candidate,
        headers.apt_lists,
    ) == ("6.1.0-41-amd64", False, None, "6.1.158-1", True)
    if shutil.which("apt-cache"):
        assert KernelHeaders().process(sh(KernelHeaders().command(meta="linux-headers-amd64"))).kernel



@pytest.mark.parametrize("installed", [True, False])
def test_kernel_headers_asks_apt_only_while_they_are_missing(tmp_path: Path, installed: bool) -> None:
    """The command run for real with stand-in uname and apt-cache on PATH and /lib/modules moved
    under tmp_path: apt's candidates are read (and reported) only when the build dir is absent."""
    bin_dir, modules, calls = tmp_path / "bin", tmp_path / "modules", tmp_path / "apt-cache.calls"
    bin_dir.mkdir()
    (bin_dir / "uname").write_text("#!/bin/sh\necho 6.1.0-41-amd64\n")
    # as apt-cache prints it: a block per package it knows (it knows no headers of this kernel)
    (bin_dir / "apt-cache").write_text(
        f"#!/bin/sh\necho \"$*\" >> {calls}\n"
        "printf 'linux-headers-amd64:\\n  Installed: (none)\\n  Candidate: 6.1.158-1\\n  Version table:\\n'\n")
    for tool in ("uname", "apt-cache"):
        (bin_dir / tool).chmod(0o755)
    if installed:
        (modules / "6.1.0-41-amd64" / "build").mkdir(parents=True)
    command = KernelHeaders().command(meta="linux-headers-amd64").replace("/lib/modules/", f"{modules}/")
    lines = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60, check=True,
                           env={"PATH": f"{bin_dir}:/usr/bin:/bin"}).stdout.splitlines()
    headers = KernelHeaders().process(lines)
    assert (headers.kernel, headers.installed) == ("6.1.0-41-amd64", installed)
    if installed:
        assert not calls.exists()  # a converged rig's no-op does not load apt's cache
        assert (headers.candidate, headers.meta_candidate) == (None, None)
    else:
        # one apt-cache call (one load of its package cache) for both packages
        assert calls.read_text() == "policy linux-headers-6.1.0-41-amd64 linux-headers-amd64\n"
        assert (headers.candidate, headers.meta_candidate) == (None, "6.1.158-1")

def stale_initramfs(tmp_path: Path, versions: list[str], initrds: dict[str, int], blacklist_age: int,
                    tools: bool = True) -> str | None:
    """StaleInitramfs run for real with a stand-in `linux-version` (list; sort --reverse, as
    linux-base's compares kernel versions) and /boot moved under tmp_path; mtimes in seconds ago."""
    bin_dir, boot = tmp_path / "bin", tmp_path / "boot"
    bin_dir.mkdir(parents=True)
    boot.mkdir()
    if tools:
        listing = "\\n".join(versions)
        (bin_dir / "linux-version").write_text(
            '#!/bin/sh\ncase "$1" in list) printf "' + listing + '\\n";; '
            "sort) if [ \"$2\" = --reverse ]; then sort -rV; else sort -V; fi;; esac\n")
        (bin_dir / "update-initramfs").write_text("#!/bin/sh\nexit 0\n")
        for tool in ("linux-version", "update-initramfs"):
            (bin_dir / tool).chmod(0o755)
    now = time.time()
    for version, age in initrds.items():
        image = boot / f"initrd.img-{version}"
        image.write_text("")
        os.utime(image, (now - age, now - age))
    blacklist = tmp_path / "blacklist.conf"
    blacklist.write_text("blacklist nouveau\n")
    os.utime(blacklist, (now - blacklist_age, now - blacklist_age))
    command = StaleInitramfs().command(since=str(blacklist)).replace("/boot/", f"{boot}/")
    lines = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60, check=True,
                           env={"PATH": f"{bin_dir}:/usr/bin:/bin"}).stdout.splitlines()
    found = StaleInitramfs().process(lines)
    return found.replace(f"{boot}/", "/boot/") if found else None


def test_stale_initramfs_is_the_one_update_initramfs_would_rebuild(tmp_path: Path) -> None:
    versions = ["6.1.0-40-amd64", "6.1.0-41-amd64", "6.1.0-9-amd64"]
    # the highest version with an initramfs (6.1.0-41, not 6.1.0-9 by string order) predates it
    assert stale_initramfs(tmp_path / "a", versions, {v: 100 for v in versions}, 50) == (
        "/boot/initrd.img-6.1.0-41-amd64")
    # rebuilt after the blacklist was written (by a package trigger, say): current
    assert stale_initramfs(tmp_path / "b", versions, {v: 10 for v in versions}, 50) is None
    # an older kernel's stale initramfs is not the one -u rebuilds
    assert stale_initramfs(tmp_path / "c", versions, {"6.1.0-40-amd64": 100, "6.1.0-41-amd64": 10}, 50) is None
    # a kernel without an initramfs is skipped, as update-initramfs skips it
    assert stale_initramfs(tmp_path / "d", versions, {"6.1.0-40-amd64": 100}, 50) == "/boot/initrd.img-6.1.0-40-amd64"
    # nothing to rebuild: no initramfs at all, or no initramfs-tools
    assert stale_initramfs(tmp_path / "e", versions, {}, 50) is None
    assert stale_initramfs(tmp_path / "f", versions, {v: 100 for v in versions}, 50, tools=False) is None


def test_daemon_json() -> None:
    fact = DockerDaemonConfig()
    assert fact.process(["absent"]).exists is False
    assert fact.process(["present"]).config == {}
    config = {"bip": "172.31.0.1/16", "log-driver": "local"}
    parsed = fact.process(["present", *json.dumps(config, indent=2).splitlines()])
    assert parsed.exists and parsed.config == config and parsed.error is None
    broken = fact.process(["present", '{"bip": "172.31.0.1/16",'])
    assert broken.exists and broken.error is not None and broken.error.startswith("not valid JSON")
    assert fact.process(["present", "[1, 2]"]).error == "the top level is not a JSON object"


def test_docker_runtimes() -> None:
    info = {
        "io.containerd.runc.v2": {"path": "runc"},
        "nvidia": {"path": "nvidia-container-runtime"},
        "runc": {"path": "runc"},
    }
    assert DockerRuntimes().process([json.dumps(info), "rc=0"]) == ["io.containerd.runc.v2", "nvidia", "runc"]
    assert DockerRuntimes().process(["rc=1"]) is None  # daemon down
    assert DockerRuntimes().process(["rc=absent"]) is None
    assert DockerImagePresent().process(["yes"]) and not DockerImagePresent().process(["no"])


def test_held_packages_and_cdi_devices() -> None:
    assert HeldPackages().process(["nvidia-open", "libnvidia-compute:amd64", "nvidia-open"]) == [
        "libnvidia-compute",
        "nvidia-open",
    ]
    assert CdiDevices().process(["nvidia.com/gpu=0", "nvidia.com/gpu=1", "nvidia.com/gpu=all"]) == [
        "nvidia.com/gpu=0",
        "nvidia.com/gpu=1",
        "nvidia.com/gpu=all",
    ]


@pytest.mark.skipif(not shutil.which("gpg") or not shutil.which("curl"), reason="needs gpg and curl")
def test_keyring_fetch_checks_the_fingerprint(tmp_path: Path) -> None:
    home = tmp_path / "gnupg"
    home.mkdir(mode=0o700)
    env = {"GNUPGHOME": str(home), "PATH": "/usr/bin:/bin"}
    subprocess.run(
        [
            "gpg",
            "--batch",
            "--passphrase",
            "",
            "--quick-gen-key",
            "rigfleet test <t@example.invalid>",
            "ed25519",
            "sign",
            "never",
        ],
        env=env,
        check=True,
        capture_output=True,
    )
    listing = subprocess.run(
        ["gpg", "--batch", "--with-colons", "--list-keys"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    fingerprint = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr"))
    armored = subprocess.run(
        ["gpg", "--batch", "--armor", "--export", fingerprint], env=env, check=True, capture_output=True
    ).stdout
    (tmp_path / "key.asc").write_bytes(armored)
    subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "all"], check=False)

    dest = tmp_path / "keyrings" / "vendor.gpg"
    sh(keyring_script(str(tmp_path / "key.asc"), str(dest), fingerprint))
    assert KeyringFingerprints().process(sh(KeyringFingerprints().command(path=str(dest)))) == [fingerprint]

    wrong = tmp_path / "keyrings" / "wrong.gpg"
    result = subprocess.run(
        ["sh", "-c", keyring_script(str(tmp_path / "key.asc"), str(wrong), "0" * 40)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1 and "does not have fingerprint" in result.stderr and not wrong.exists()
    assert KeyringFingerprints().process(sh(KeyringFingerprints().command(path=str(wrong)))) is None


def test_managed_file_mode_and_digest_run_for_real(tmp_path: Path) -> None:
    path = tmp_path / "unit.service"
    fact = ManagedFile()
    assert fact.process(sh(fact.command(path=str(path)))) is None
    path.write_text("[Unit]\n")
    path.chmod(0o640)
    digest = fact.process(sh(fact.command(path=str(path))))
    assert digest is not None and digest.mode == "640"
    assert digest.sha256 == hashlib.sha256(b"[Unit]\n").hexdigest()


def test_apt_repository_files_in_one_command(tmp_path: Path) -> None:
    source, legacy, gone = tmp_path / "vendor.sources", tmp_path / "vendor.list", tmp_path / "other.list"
    fact = AptRepositoryFiles()
    command = fact.command(keyring=str(tmp_path / "none.gpg"), source=str(source), legacy=[str(legacy), str(gone)])
    empty = fact.process(sh(command))
    assert (empty.fingerprints, empty.source, empty.legacy) == (None, None, [])
    source.write_text("Types: deb\n")
    legacy.write_text("deb x /\n")
    found = fact.process(sh(command))
    assert found.source is not None and found.source.mode == "644" and found.legacy == [str(legacy)]
