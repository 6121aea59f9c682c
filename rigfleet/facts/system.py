"""Facts about the rig's operating system: platform, Secure Boot, boot id, disk, kernel headers,
initramfs."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Literal

from pyinfra.api import FactBase
from pyinfra.facts.server import RebootRequired
from typing_extensions import override

__all__ = [
    "BootId", "DiskSpace", "KernelHeaders", "Platform", "RebootRequired", "SecureBoot", "StaleInitramfs",
]


def _key_values(lines: list[str]) -> dict[str, str]:
    values = {}
    for line in lines:
        key, sep, value = line.strip().partition("=")
        if sep and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            # os-release values may be quoted (shell syntax)
            try:
                parts = shlex.split(value)
            except ValueError:
                parts = [value]
            values[key] = parts[0] if parts else ""
    return values


@dataclass(frozen=True)
class PlatformInfo:
    """/etc/os-release and uname, read in one round trip."""

    id: str  # "ubuntu", "debian", ...
    version_id: str  # "24.04", "12", ...
    codename: str  # "noble", "bookworm", ...
    pretty_name: str
    arch: str  # uname -m
    kernel: str  # uname -r


class Platform(FactBase[PlatformInfo]):
    @override
    def command(self) -> str:
        return (
            "cat /etc/os-release 2>/dev/null || cat /usr/lib/os-release 2>/dev/null || true; "
            'echo "RIGFLEET_ARCH=$(uname -m)"; echo "RIGFLEET_KERNEL=$(uname -r)"'
        )

    @override
    @staticmethod
    def default() -> PlatformInfo:
        return PlatformInfo("", "", "", "", "", "")

    @override
    def process(self, output: list[str]) -> PlatformInfo:
        values = _key_values(output)
        return PlatformInfo(
            id=values.get("ID", "").lower(),
            version_id=values.get("VERSION_ID", ""),
            codename=values.get("VERSION_CODENAME", "") or values.get("UBUNTU_CODENAME", ""),
            pretty_name=values.get("PRETTY_NAME", ""),
            arch=values.get("RIGFLEET_ARCH", ""),
            kernel=values.get("RIGFLEET_KERNEL", ""),
        )


SecureBootStatus = Literal["enabled", "disabled", "unsupported", "unknown"]
# EFI global variable GUID of SecureBoot (UEFI spec)
SECURE_BOOT_EFIVAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"


@dataclass(frozen=True)
class SecureBootState:
    status: SecureBootStatus
    source: str  # mokutil | efivars | none
    detail: str = ""

    @property
    def enabled(self) -> bool:
        return self.status == "enabled"


def parse_secure_boot(lines: list[str]) -> SecureBootState:
    lines = [line.strip() for line in lines if line.strip()]
    source = lines[0].removeprefix("source=") if lines and lines[0].startswith("source=") else "none"
    body = [line for line in lines if not line.startswith("source=")]
    text = "\n".join(body)
    if source == "mokutil":
        lowered = text.lower()
        if "secureboot enabled" in lowered:
            return SecureBootState("enabled", source, text)
        if "secureboot disabled" in lowered:
            return SecureBootState("disabled", source, text)
        if "not supported" in lowered or "doesn't support" in lowered:
            return SecureBootState("unsupported", source, text)
        return SecureBootState("unknown", source, text)
    if source == "efivars":
        # the variable is 4 attribute bytes then one data byte: 1 = enabled
        match = re.search(r"efivar=(\d+)", text)
        if match:
            return SecureBootState("enabled" if match.group(1) == "1" else "disabled", source, text)
        return SecureBootState("unknown", source, text)
    return SecureBootState(
        "unsupported", "none", "no EFI firmware interface (legacy BIOS boot or a container)"
    )


class SecureBoot(FactBase[SecureBootState]):
    """Secure Boot state from `mokutil --sb-state`, else from the EFI variable, else legacy boot."""

    @override
    def command(self) -> str:
        return (
            "if command -v mokutil >/dev/null 2>&1; then echo source=mokutil; mokutil --sb-state 2>&1 || "
            "true; "
            "elif [ -d /sys/firmware/efi ]; then echo source=efivars; "
            f"if [ -r {SECURE_BOOT_EFIVAR} ]; then "
            f"echo efivar=$(od -An -t u1 {SECURE_BOOT_EFIVAR} | awk '{{print $NF}}'); fi; "
            "else echo source=none; fi"
        )

    @override
    @staticmethod
    def default() -> SecureBootState:
        return SecureBootState("unknown", "none")

    @override
    def process(self, output: list[str]) -> SecureBootState:
        return parse_secure_boot(output)


class BootId(FactBase[str]):
    """The kernel's boot id: changes on every boot (unlike uptime, also inside containers)."""

    @override
    def command(self) -> str:
        return "cat /proc/sys/kernel/random/boot_id"

    @override
    def process(self, output: list[str]) -> str:
        return output[0].strip()


@dataclass(frozen=True)
class DiskUsage:
    path: str
    mount: str
    avail_kib: int
    # what `path` itself already holds: data that is already there counts as room
    used_kib: int

    @property
    def room_gib(self) -> float:
        return (self.avail_kib + self.used_kib) / 1024 / 1024


class DiskSpace(FactBase[dict[str, DiskUsage]]):
    """Free space on the filesystem of each path (its nearest existing parent if it is absent),
    and for the `measured` paths also what they already hold (`du`)."""

    @override
    def command(self, paths: list[str], measured: list[str] | None = None) -> str:
        parts = []
        for path in paths:
            quoted = shlex.quote(path)
            used = (
                f'if [ -d {quoted} ]; then echo "used=$(du -skx {quoted} 2>/dev/null | cut -f1)"; '
                "else echo used=0; fi"
                if path in (measured or [])
                else "echo used=0"
            )
            parts.append(
                f'p={quoted}; while [ ! -e "$p" ]; do p=$(dirname "$p"); done; '
                f'df -Pk "$p" | awk -v path={quoted} '
                f'\'NR==2{{print "path=" path " avail=" $4 " mount=" $6}}\'; '
                f"{used}"
            )
        return "; ".join(parts)

    @override
    @staticmethod
    def default() -> dict[str, DiskUsage]:
        return {}

    @override
    def process(self, output: list[str]) -> dict[str, DiskUsage]:
        result: dict[str, DiskUsage] = {}
        current: dict[str, str] = {}
        for line in output:
            line = line.strip()
            if line.startswith("path="):
                match = re.match(r"^path=(.*) avail=(\d+) mount=(.*)$", line)
                if match:
                    current = {"path": match.group(1), "avail": match.group(2), "mount": match.group(3)}
            elif line.startswith("used=") and current:
                used = line.removeprefix("used=").strip() or "0"
                result[current["path"]] = DiskUsage(
                    current["path"],
                    current["mount"],
                    int(current["avail"]),
                    int(used) if used.isdigit() else 0,
                )
                current = {}
        return result


@dataclass(frozen=True)
class HeadersState:
    kernel: str
    installed: bool  # /lib/modules/<kernel>/build exists
    candidate: str | None  # apt candidate of linux-headers-<kernel>
    meta_candidate: str | None  # apt candidate of the distribution's headers metapackage
    apt_lists: bool  # whether apt has package lists at all (else the candidate is unknown)


class KernelHeaders(FactBase[HeadersState]):
    """Headers for the running kernel: installed, installable, or neither (DKMS needs them);
    and whether the headers metapackage `meta` (which follows new kernels) is installable.

    The candidates are asked of apt only while the headers are missing, both in one apt-cache
    call: nothing reads them once the headers are installed, and apt-cache loading its package
    cache is most of what a converged rig spends on its state read (~0.1 s a call)."""

    @override
    def command(self, meta: str) -> str:
        # apt-cache prints a "<package>:" line before each package's Candidate (none for a
        # package it does not know)
        candidates = (
            f'apt-cache policy "linux-headers-$k" {shlex.quote(meta)} 2>/dev/null | '
            f"awk -v k=\"linux-headers-$k:\" -v m={shlex.quote(meta + ':')} "
            "'/^[^ ]/{p=$1} /Candidate:/{if (p==k) print \"candidate=\" $2; else if (p==m) "
            "print \"meta_candidate=\" $2}'"
        )
        return (
            'k=$(uname -r); echo "kernel=$k"; '
            'if [ -e "/lib/modules/$k/build" ]; then echo installed=yes; else echo installed=no; '
            f"{candidates}; fi; "
            "if ls /var/lib/apt/lists/*_Packages* >/dev/null 2>&1; then echo lists=yes; else echo "
            "lists=no; fi"
        )

    @override
    @staticmethod
    def default() -> HeadersState:
        return HeadersState("", False, None, None, False)

    @override
    def process(self, output: list[str]) -> HeadersState:
        values = _key_values(output)

        def candidate(key: str) -> str | None:
            value = values.get(key, "")
            return None if value in ("", "(none)") else value

        return HeadersState(
            kernel=values.get("kernel", ""),
            installed=values.get("installed") == "yes",
            candidate=candidate("candidate"),
            meta_candidate=candidate("meta_candidate"),
            apt_lists=values.get("lists") == "yes",
        )


class StaleInitramfs(FactBase[str | None]):
    """The initramfs the next `update-initramfs -u` would rebuild, when it predates `since` (a file
    it must hold, like a module blacklist); None when it is current, or there is none to rebuild
    (no initramfs-tools, no initramfs yet).

    update-initramfs -u picks the highest kernel version (`linux-version sort`) that has a
    /boot/initrd.img-<version>; this asks the same question the same way."""

    @override
    def command(self, since: str) -> str:
        return (
            "if command -v update-initramfs >/dev/null 2>&1 && command -v linux-version >/dev/null 2>&1; "
            "then v=$(linux-version list | while read -r v; do if [ -e \"/boot/initrd.img-$v\" ]; then "
            "echo \"$v\"; fi; done | linux-version sort --reverse | head -n 1); "
            f'if [ -n "$v" ] && [ ! "/boot/initrd.img-$v" -nt {shlex.quote(since)} ]; then '
            'echo "/boot/initrd.img-$v"; fi; fi'
        )

    @override
    def process(self, output: list[str]) -> str | None:
        return output[0].strip() if output and output[0].strip() else None
