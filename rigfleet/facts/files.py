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
