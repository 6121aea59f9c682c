"""Facts about apt: holds, the fingerprints of keyring files, a dpkg run left half-done."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from pyinfra.api import FactBase
from typing_extensions import override

from rigfleet.facts.files import FileDigest, digest_command, parse_digest


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


def fingerprints_command(path: str) -> str:
    quoted = shlex.quote(path)
    return (
        f"if [ -f {quoted} ] && command -v gpg >/dev/null 2>&1; then "
        f"gpg --batch --show-keys --with-colons {quoted} 2>/dev/null "
        '| awk -F: \'$1=="pub"{pub=1; next} $1=="fpr" && pub{print $10; pub=0}\'; echo rc=0; fi'
    )


def parse_fingerprints(output: list[str]) -> list[str] | None:
    lines = [line.strip() for line in output if line.strip()]
    if not lines or lines[-1] != "rc=0":
        return None
    return sorted({line.upper() for line in lines[:-1]})


class KeyringFingerprints(FactBase["list[str] | None"]):
    """Fingerprints of the keys in a keyring file; None when the file is absent or unreadable."""

    @override
    def command(self, path: str) -> str:
        return fingerprints_command(path)

    @override
    def process(self, output: list[str]) -> list[str] | None:
        return parse_fingerprints(output)


@dataclass(frozen=True)
class RepositoryFiles:
    fingerprints: list[str] | None  # of the keyring; None when it is absent
    source: FileDigest | None  # the deb822 source
    legacy: list[str]  # other source lists for the same repository that are still there


class AptRepositoryFiles(FactBase[RepositoryFiles]):
    """A third-party repository's keyring, deb822 source and legacy lists, in one round trip."""

    @override
    def command(self, keyring: str, source: str, legacy: list[str]) -> str:
        present = " ".join(shlex.quote(path) for path in legacy)
        return (
            f"echo '#keyring'; {fingerprints_command(keyring)}; echo '#source'; {digest_command(source)}; "
            f"echo '#legacy'; for f in {present}; do if [ -e \"$f\" ]; then echo \"$f\"; fi; done; true"
        )

    @override
    def process(self, output: list[str]) -> RepositoryFiles:
        sections: dict[str, list[str]] = {}
        current: list[str] = []
        for line in output:
            if line.strip() in ("#keyring", "#source", "#legacy"):
                current = sections.setdefault(line.strip()[1:], [])
            else:
                current.append(line)
        return RepositoryFiles(
            parse_fingerprints(sections.get("keyring", [])),
            parse_digest(sections.get("source", [])),
            [line.strip() for line in sections.get("legacy", []) if line.strip()],
        )


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
