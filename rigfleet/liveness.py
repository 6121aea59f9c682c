"""Liveness of a rig's SSH connection: notice, in bounded time, a rig that vanished in the middle
of a command (power cut, pulled cable), and name it as such.

A rig that reboots closes its TCP connections; one that loses power sends nothing at all. pyinfra's
SSH connection (paramiko) sets no keepalive, so a command waiting for the output of a rig that
went dark waits until TCP gives up, which is forever when the control machine has nothing left to
send (it is only reading) and about 15 minutes otherwise (tcp_retries2), with paramiko's one-hour
channel timeout on top. A re-pin wave would hang there instead of halting and reporting the rig.

The API (one concern, one module; rigfleet.runner.converge and rigfleet.deploy use it):
- `arm(connector)`: TCP keepalive probes after KEEPALIVE_IDLE_S of silence and TCP_USER_TIMEOUT, so
  the kernel drops the connection once the rig has acknowledged nothing for DEAD_AFTER_S. A live
  rig's kernel acknowledges within milliseconds however busy the rig is; only a dead or cut-off
  rig stays silent that long.
- `DeadPeerDetection`: a pyinfra state callback that arms each rig's connection as it is used.
- `watching()`: while a converge runs, drop pyinfra's traceback of a connection that died (the
  rig's summary carries the error); `name_losses(errors)` then names such an error LOST: the rig
  may be half-way through a step, its ledger names the release it last passed, and the next run
  continues from what is on the rig. `lost(outcome)` tells such a rig apart.
"""

from __future__ import annotations

import contextlib
import logging
import re
import socket
from collections.abc import Iterator
from typing import Any, Protocol

import click
from pyinfra.api import BaseStateCallback

KEEPALIVE_IDLE_S = 15
KEEPALIVE_INTERVAL_S = 5
DEAD_AFTER_S = 45

_ARMED = "_rigfleet_dead_peer_detection"


def arm(connection: Any) -> bool:
    """Arm the TCP socket under a pyinfra SSH connector (`host.connector`); False when there is
    none (not connected yet, another connector, a proxy command instead of a socket)."""
    client = getattr(connection, "client", None)
    get_transport = getattr(client, "get_transport", None)
    transport = get_transport() if callable(get_transport) else None
    sock = getattr(transport, "sock", None)
    if not isinstance(sock, socket.socket):
        return False
    if getattr(transport, _ARMED, False):
        return True
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE_S), ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
                            ("TCP_KEEPCNT", DEAD_AFTER_S // KEEPALIVE_INTERVAL_S),
                            ("TCP_USER_TIMEOUT", DEAD_AFTER_S * 1000)):
            option = getattr(socket, name, None)
            if option is not None:  # Linux has them all; elsewhere keepalive alone still helps
                sock.setsockopt(socket.IPPROTO_TCP, option, value)
        setattr(transport, _ARMED, True)
    return True


class DeadPeerDetection(BaseStateCallback):
    """pyinfra state callback: arm each rig's connection on connect and before each operation
    (a converge adds its callbacks after connecting, so the first operation is the first chance)."""

    @staticmethod
    def host_connect(state: Any, host: Any) -> None:
        arm(host.connector)

    @staticmethod
    def operation_host_start(state: Any, host: Any, op_hash: Any) -> None:
        arm(host.connector)


LOST = "connection lost mid-converge"
# how a dropped SSH connection surfaces: the socket's error, or paramiko's once its transport is
# gone (pyinfra reports a raised exception by its message only); not curl's or apt's own
# "Connection reset by peer" inside a command's output
_CONNECTION_LOSS = re.compile(
    r"\b(ConnectionResetError|ConnectionAbortedError|BrokenPipeError|EOFError)\b|TimeoutError(\(110|: \[Errno 110\])"
    r"|\bSSH session not active\b|\bSocket is closed\b|\[Errno (104|110|113|32)\]")


class _Outcome(Protocol):  # rigfleet.runner.RigOutcome (the runner sits above this module)
    reachable: bool
    ok: bool
    errors: list[str]


def lost(outcome: _Outcome) -> bool:
    return outcome.reachable and not outcome.ok and any(LOST in error for error in outcome.errors)


class _QuietConnectionLoss(logging.Filter):
    """Drops pyinfra's traceback of an operation that died with its connection (the rig's summary
    carries the error); every other record passes unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = click.unstyle(record.getMessage()).strip()
        if text.startswith("Traceback (most recent call last)"):
            return not _CONNECTION_LOSS.search(text.splitlines()[-1])
        return True


@contextlib.contextmanager
def watching() -> Iterator[None]:
    """While a converge runs: a dropped connection's traceback is not logged (see name_losses)."""
    quiet = _QuietConnectionLoss()
    pyinfra_log = logging.getLogger("pyinfra")
    pyinfra_log.addFilter(quiet)
    try:
        yield
    finally:
        pyinfra_log.removeFilter(quiet)


def name_losses(errors: list[str]) -> list[str]:
    """A failed rig's errors, a connection lost mid-converge named as such (LOST)."""
    return [_name_loss(error) for error in errors]


def _name_loss(error: str) -> str:
    if LOST in error or not _CONNECTION_LOSS.search(error):
        return error
    step, _, detail = error.partition(": ")
    return f"{step}: {LOST} ({detail or error}): the rig rebooted, lost power or left the network"
