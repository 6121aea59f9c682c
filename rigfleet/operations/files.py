"""A file rigfleet owns, checked in one round trip when nothing changed and written in one when
it did."""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Iterator
from io import StringIO

from pyinfra import host
from pyinfra.api import StringCommand
from pyinfra.api.command import PyinfraCommand
from pyinfra.operations import files

from rigfleet.facts import cache
from rigfleet.facts.files import FileDigest, ManagedFile

# Linux caps one argument at 128 KiB (MAX_ARG_STRLEN) and the command travels as one, quoted
# twice (here, and by pyinfra for sudo's `sh -c`): bigger files take pyinfra's upload
INLINE_MAX_BYTES = 64 * 1024


class FileWriteCommand(StringCommand):
    """`content` written to `dest` with `mode` by one remote command: a temporary file beside
    `dest` (same file system), its mode, then a rename, so a reader never sees half a file.

    pyinfra's upload under sudo costs four to six round trips (its file, directory and sha1
    facts, the SFTP upload, a copy, a removal) and files.put a chmod after it: about 0.3 s of a
    ~0.4 s config file write on a loaded rig. The content is in the command line, which other
    users of the rig can read while it runs: only for files they may read anyway (`readable`)."""

    def __init__(self, dest: str, content: str, mode: str) -> None:
        self.dest, self.content, self.mode = dest, content, mode
        quoted = shlex.quote(dest)
        super().__init__(
            f"set -e; d={quoted}; mkdir -p \"$(dirname \"$d\")\"; t=$(mktemp \"$d.rigfleet-XXXXXX\"); "
            "trap 'rm -f \"$t\"' EXIT; "
            f"printf '%s' {shlex.quote(content)} > \"$t\"; chmod {shlex.quote(mode)} \"$t\"; mv -f \"$t\" \"$d\"; "
            "trap - EXIT"
        )


def readable(mode: str) -> bool:
    """Whether every user of the rig may read a file of `mode` (octal)."""
    return bool(int(mode, 8) & 0o004)


def fits_inline(content: str) -> bool:
    """Whether `content`, quoted as it travels, stays well inside one argument's limit."""
    return len(shlex.quote(shlex.quote(content)).encode()) <= INLINE_MAX_BYTES


def write_file(dest: str, content: str, mode: str = "0644") -> Iterator[PyinfraCommand]:
    """The commands that write `content` to `dest`: one when the file is world-readable and small,
    pyinfra's upload otherwise (a secret never travels in a command line)."""
    if readable(mode) and fits_inline(content):
        yield FileWriteCommand(dest, content, mode)
        return
    yield from files.put._inner(src=StringIO(content), dest=dest, mode=mode)


def matches(current: FileDigest | None, content: str, mode: str) -> bool:
    return (current is not None and current.sha256 == hashlib.sha256(content.encode()).hexdigest()
            and current.mode == mode.lstrip("0"))


@cache.operation(reads=lambda dest, **_: [cache.reading(ManagedFile, path=dest)])
def config_file(dest: str, content: str, mode: str = "0644"):
    """
    Write `content` to `dest` with `mode` unless it is there already.

    Like files.put, but a converged rig costs one fact, not three, and a write one command
    (write_file).

    + dest: absolute path on the rig (its directory is created when missing)
    + content: the whole file
    + mode: octal permissions
    """
    if matches(cache.fact(ManagedFile, path=dest), content, mode):
        host.noop(f"{dest} is up to date")
        return
    yield from write_file(dest, content, mode)
