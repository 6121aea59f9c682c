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


@dataclass(frozen=True)
class SourceEntry:
    """One `deb` source: a URI, a suite and its components (`Types: deb` in deb822)."""

    uri: str
    suite: str
    components: tuple[str, ...]
    signed_by: str | None = None


def _one_line(line: str) -> SourceEntry | None:
    words = line.split("#", 1)[0].split()
    if not words or words[0] != "deb":
        return None
    words, signed_by = words[1:], None
    if words and words[0].startswith("["):
        options = []
        while words:
            options.append(words.pop(0))
            if options[-1].endswith("]"):
                break
        for option in " ".join(options).strip("[]").split():
            if option.startswith("signed-by="):
                signed_by = option.removeprefix("signed-by=")
    if len(words) < 2:
        return None
    return SourceEntry(words[0].rstrip("/"), words[1], tuple(words[2:]), signed_by)


def _deb822(stanza: list[str]) -> list[SourceEntry]:
    fields: dict[str, str] = {}
    key = ""
    for line in stanza:
        if line[:1] in (" ", "\t") and key:
            fields[key] += " " + line.strip()
        elif ":" in line:
            key, _, value = line.partition(":")
            key = key.strip().lower()
            fields[key] = value.strip()
    if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes").lower() == "no":
        return []
    components = tuple(fields.get("components", "").split())
    signed_by = fields.get("signed-by") or None
    return [
        SourceEntry(uri.rstrip("/"), suite, components, signed_by)
        for uri in fields.get("uris", "").split()
        for suite in fields.get("suites", "").split()
    ]


def parse_sources(lines: list[str]) -> list[SourceEntry]:
    """Files as `==> PATH` then their text: one-line `.list` and deb822 `.sources` files."""
    entries: list[SourceEntry] = []
    path, stanza = "", list[str]()
    for line in [*lines, "==> "]:
        if line.startswith("==> ") or (path.endswith(".sources") and not line.strip()):
            entries += _deb822([s for s in stanza if not s.lstrip().startswith("#")])
            stanza = []
            if line.startswith("==> "):
                path = line[4:].strip()
            continue
        if path.endswith(".sources"):
            stanza.append(line)
        else:
            entry = _one_line(line)
            if entry:
                entries.append(entry)
    return entries


class AptSourceEntries(FactBase[list[SourceEntry]]):
    """Every enabled `deb` source in /etc/apt, except the file `exclude` (the one being managed)."""

    @override
    def command(self, exclude: str) -> str:
        return (
            "for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list "
            "/etc/apt/sources.list.d/*.sources; do "
            f'if [ -f "$f" ] && [ "$f" != {shlex.quote(exclude)} ]; then echo "==> $f"; cat "$f"; echo; fi; '
            "done"
        )

    @override
    @staticmethod
    def default() -> list[SourceEntry]:
        return []

    @override
    def process(self, output: list[str]) -> list[SourceEntry]:
        return parse_sources(output)
