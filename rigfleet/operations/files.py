"""A file rigfleet owns, checked in one round trip when nothing changed."""

from __future__ import annotations

import hashlib
from io import StringIO

from pyinfra import host
from pyinfra.operations import files

from rigfleet.facts import cache
from rigfleet.facts.files import FileDigest, ManagedFile


def matches(current: FileDigest | None, content: str, mode: str) -> bool:
    return (current is not None and current.sha256 == hashlib.sha256(content.encode()).hexdigest()
            and current.mode == mode.lstrip("0"))


@cache.operation(reads=lambda dest, **_: [cache.reading(ManagedFile, path=dest)])
def config_file(dest: str, content: str, mode: str = "0644"):
    """
    Write `content` to `dest` with `mode` unless it is there already.

    Like files.put (which it uses to write), but a converged rig costs one fact, not three.

    + dest: absolute path on the rig (its directory is created when missing)
    + content: the whole file
    + mode: octal permissions
    """
    if matches(cache.fact(ManagedFile, path=dest), content, mode):
        host.noop(f"{dest} is up to date")
        return
    yield from files.put._inner(src=StringIO(content), dest=dest, mode=mode)
