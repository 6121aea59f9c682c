"""Notice, in bounded time, a rig that vanished in the middle of a command (power cut, pulled cable).

A rig that reboots closes its TCP connections; one that loses power sends nothing at all. pyinfra's
SSH connection (paramiko) sets no keepalive, so a command waiting for the output of a rig that
went dark waits until TCP gives up, which is forever when the control machine has nothing left to
send (it is only reading) and about 15 minutes otherwise (tcp_retries2), with paramiko's one-hour
channel timeout on top. A re-pin wave would hang there instead of halting and reporting the rig.

`DeadPeerDetection` arms each rig's SSH socket as soon as it is used: TCP keepalive probes after
KEEPALIVE_IDLE_S of silence and TCP_USER_TIMEOUT, so the kernel drops the connection once the rig
has acknowledged nothing for DEAD_AFTER_S (keepalive probes and unacknowledged data alike). A live
rig's kernel acknowledges within milliseconds however busy the rig is; only a dead or cut-off rig
stays silent that long. The dropped connection fails the running command and the rig's converge,
so the wave ends and the rollout halts naming the rig.

`converge` is runner.converge with that detection, for the fleet commands: a rig whose connection
dropped mid-converge (it rebooted, lost power or left the network) is reported as LOST with the
connection error, not with paramiko's traceback, since it may be half-way through a step: its
ledger names the release it last passed, and the next run continues from what is on the rig.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any

import click
from pyinfra.api import BaseStateCallback

from rigfleet import runner
from rigfleet.deadpeer import DEAD_AFTER_S, KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, arm
from rigfleet.loader import Fleet
from rigfleet.runner import RigOutcome

__all__ = ["DEAD_AFTER_S", "KEEPALIVE_IDLE_S", "KEEPALIVE_INTERVAL_S", "LOST", "DeadPeerDetection", "arm",
           "converge", "lost"]


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


def lost(outcome: RigOutcome) -> bool:
    return outcome.reachable and not outcome.ok and any(LOST in error for error in outcome.errors)


class _QuietConnectionLoss(logging.Filter):
    """Drops pyinfra's traceback of an operation that died with its connection (the rig's summary
    carries the error); every other record passes unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = click.unstyle(record.getMessage()).strip()
        if text.startswith("Traceback (most recent call last)"):
            return not _CONNECTION_LOSS.search(text.splitlines()[-1])
        return True


def converge(fleet: Fleet, names: Iterable[str]) -> dict[str, RigOutcome]:
    """runner.converge with dead-peer detection; a connection lost mid-converge is named as such."""
    quiet = _QuietConnectionLoss()
    pyinfra_log = logging.getLogger("pyinfra")
    pyinfra_log.addFilter(quiet)
    try:
        outcomes = runner.converge(fleet, names, callbacks=[DeadPeerDetection()])
    finally:
        pyinfra_log.removeFilter(quiet)
    for outcome in outcomes.values():
        if outcome.reachable and not outcome.ok:
            outcome.errors = [_name_loss(error) for error in outcome.errors]
    return outcomes


def _name_loss(error: str) -> str:
    if LOST in error or not _CONNECTION_LOSS.search(error):
        return error
    step, _, detail = error.partition(": ")
    return f"{step}: {LOST} ({detail or error}): the rig rebooted, lost power or left the network"
