"""Facts about apt: holds, the fingerprints of keyring files, a dpkg run left half-done."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase
from typing_extensions import override


class HeldPackages(FactBase[list[str]]):
    """`apt-mark showhold`: packages apt will not upgrade or remove on its own."""

    @override
    def command(self) -> str:
        return "apt-mark showhold"

    @override
    def requires_command(self) -> str:
        return "apt-mark"

    @override
    @staticmethod
    def default() -> list[str]:
        return []

    @override
    def process(self, output: list[str]) -> list[str]:
        # multi-arch names come as pkg:amd64 on some releases
        return sorted({line.strip().split(":")[0] for line in output if line.strip()})


class KeyringFingerprints(FactBase["list[str] | None"]):
    """Fingerprints of the keys in a keyring file; None when the file is absent or unreadable."""

    @override
    def command(self, path: str) -> str:
        quoted = shlex.quote(path)
        return (
            f"if [ -f {quoted} ] && command -v gpg >/dev/null 2>&1; then "
            f"gpg --batch --show-keys --with-colons {quoted} 2>/dev/null "
            '| awk -F: \'$1=="pub"{pub=1; next} $1=="fpr" && pub{print $10; pub=0}\'; echo rc=0; fi'
        )

    @override
    def process(self, output: list[str]) -> list[str] | None:
        lines = [line.strip() for line in output if line.strip()]
        if not lines or lines[-1] != "rc=0":
            return None
        return sorted({line.upper() for line in lines[:-1]})


class DpkgInterrupted(FactBase[list[str]]):
    """What a dpkg run cut off mid-install left: `dpkg --audit` lines (half-installed or
    half-configured packages) and pending journal entries in /var/lib/dpkg/updates (apt then
    refuses with "dpkg was interrupted"). Empty on a clean rig."""

    @override
    def command(self) -> str:
        return "dpkg --audit 2>/dev/null; ls -A /var/lib/dpkg/updates 2>/dev/null | sed 's|^|pending update: |'; true"

    @override
    @staticmethod
    def default() -> list[str]:
        return []

    @override
    def process(self, output: list[str]) -> list[str]:
        return [line.strip() for line in output if line.strip()]
