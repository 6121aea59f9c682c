"""Keep the operations of different roles apart in pyinfra's operation graph."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from pyinfra import host


@contextmanager
def role_scope(tag: int) -> Iterator[None]:
    """
    pyinfra identifies an operation by the line numbers of its call stack below the deploy file.
    deploy.py calls every role from one line, so two roles' operations at equal line numbers in
    their own files would share one identity; on a mixed fleet (one rig refused, one not) that can
    even make the operation graph cyclic and abort the run for every rig. A loop position unique to
    the role (what `host.loop` uses) keeps the identities apart.
    """
    host.loop_position.append(tag)
    try:
        yield
    finally:
        host.loop_position.pop()
