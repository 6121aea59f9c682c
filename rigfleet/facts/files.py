"""Facts about files rigfleet manages: mode and digest in one round trip, not pyinfra's three."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from pyinfra.api import FactBase
from typing_extensions import override


@dataclass(frozen=True)
class FileDigest:
    mode: str  # octal, as `stat -c %a` prints it: "644"
    sha256: str


def digest_command(path: str) -> str:
    quoted = shlex.quote(path)
    return (
        f"if [ -f {quoted} ]; then echo \"mode=$(stat -c %a {quoted})\"; "
        f"echo \"sha256=$(sha256sum < {quoted} | cut -d' ' -f1)\"; fi"
    )


def parse_digest(output: list[str]) -> FileDigest | None:
    values = dict(line.strip().partition("=")[::2] for line in output if "=" in line)
    if not values.get("sha256"):
        return None
    return FileDigest(values.get("mode", ""), values["sha256"])


class ManagedFile(FactBase["FileDigest | None"]):
    """A regular file's mode and sha256; None when it is absent.

    pyinfra's files.put reads three facts (the file, its directory, its sha1) for every file on
    every run; a converged rig needs only this one to say "no change".
    """

    @override
    def command(self, path: str) -> str:
        return digest_command(path)

    @override
    def process(self, output: list[str]) -> FileDigest | None:
        return parse_digest(output)


class ManagedFiles(FactBase[dict[str, FileDigest]]):
    """ManagedFile for many files in two programs, not two per file: {path: digest} of those that
    are regular files (a file absent, or not a regular file, is left out, as ManagedFile says None).
    Paths with a newline or a backslash would be escaped in the output: read those one by one."""

    @override
    def command(self, paths: list[str]) -> str:
        quoted = " ".join(shlex.quote(path) for path in paths)
        # the mode of the path itself (`stat` without -L) and the digest of what it points to, as
        # ManagedFile's `[ -f ]`, `stat -c %a` and `sha256sum <` give them
        return (f'set --; for f in {quoted}; do if [ -f "$f" ]; then set -- "$@" "$f"; fi; done; '
                "if [ $# -gt 0 ]; then stat -c 'mode=%a %n' -- \"$@\" && sha256sum -- \"$@\"; fi")

    @override
    @staticmethod
    def default() -> dict[str, FileDigest]:
        return {}

    @override
    def process(self, output: list[str]) -> dict[str, FileDigest]:
        modes, digests = {}, {}
        for line in output:
            if line.startswith("mode="):
                mode, _, path = line[len("mode="):].partition(" ")
                modes[path] = mode
            elif len(line) > 66 and line[64:66] == "  ":  # sha256sum's "<digest>  <path>"
                digests[line[66:]] = line[:64]
        return {path: FileDigest(modes.get(path, ""), digest) for path, digest in digests.items()}
