"""Facts the weights role reads: what is on disk (cheap: sizes and mtimes, never hashes) and the
mirror's manifest.

The verification stamp is the proof a file was hashed: one line per verified file,
`<sha256> <size> <mtime> <name>`. A file whose size and mtime still match its stamp line is not
rehashed; anything else is (see rigfleet.operations.weights).
"""

from __future__ import annotations

import re
import shlex
from pathlib import PurePosixPath
from typing import Any, NamedTuple

from pyinfra.api import FactBase

SHA256SUMS_LINE = re.compile(r"^([0-9a-fA-F]{64}) [ *](.+)$")


class Stamped(NamedTuple):
    sha256: str
    size: int
    mtime: int


class OnDisk(NamedTuple):
    size: int
    mtime: int


def safe_name(name: str) -> bool:
    """A manifest entry must stay inside the weights dir (no absolute paths, no '..')."""
    path = PurePosixPath(name)
    return bool(name) and not path.is_absolute() and ".." not in path.parts and "\n" not in name


class WeightsState(FactBase[dict[str, Any]]):
    """{"stamp": {name: Stamped}, "files": {name: OnDisk}} of one weights dir.

    `files` lists every regular file (including `*.part` downloads in progress) except the hub
    client's own cache dir; `stamp` is the verification stamp (empty when there is none).
    """

    def command(self, dest: str, stamp: str) -> str:
        return (f"cat {shlex.quote(stamp)} 2>/dev/null | sed 's/^/S /'; "
                f"(cd {shlex.quote(dest)} 2>/dev/null && find . -path ./.cache -prune -o -type f "
                f"-exec stat -c 'F %s %Y %n' {{}} +) 2>/dev/null; true")

    @staticmethod
    def default() -> dict[str, Any]:
        return {"stamp": {}, "files": {}}

    def process(self, output: list[str]) -> dict[str, Any]:
        stamp: dict[str, Stamped] = {}
        files: dict[str, OnDisk] = {}
        for line in output:
            kind, _, rest = line.rstrip("\n").partition(" ")
            if kind == "S":
                parts = rest.split(" ", 3)
                if len(parts) == 4 and parts[1].isdigit() and parts[2].isdigit():
                    stamp[parts[3]] = Stamped(parts[0], int(parts[1]), int(parts[2]))
            elif kind == "F":
                parts = rest.split(" ", 2)
                if len(parts) == 3 and parts[0].isdigit() and parts[1].lstrip("-").isdigit():
                    files[parts[2].removeprefix("./")] = OnDisk(int(parts[0]), int(parts[1]))
        return {"stamp": stamp, "files": files}


class WeightsManifest(FactBase[dict[str, Any] | None]):
    """A SHA256SUMS read on the rig (a mirror's, or the fleet cache host's manifest copy):
    {"files": {name: sha256}, "bad": [lines]} or None when it cannot be read (no curl yet, server
    down). For a mirror the operation turns None into a clear failure; for the fleet cache it means
    the cache host does not hold the weights, and the rig fetches from its own source."""

    def command(self, url: str) -> str:
        return (f"if command -v curl >/dev/null 2>&1; then "
                f"curl -fsSL --connect-timeout 10 --max-time 60 {shlex.quote(url)} 2>/dev/null || true; fi")

    def process(self, output: list[str]) -> dict[str, Any] | None:
        files: dict[str, str] = {}
        bad: list[str] = []
        for raw in output:
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            match = SHA256SUMS_LINE.match(line)
            if match and safe_name(match.group(2).removeprefix("./")):
                files[match.group(2).removeprefix("./")] = match.group(1).lower()
            else:
                bad.append(line)
        if not files and not bad:
            return None
        return {"files": files, "bad": bad}
