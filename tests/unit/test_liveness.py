"""Dead-peer detection on the rigs' SSH sockets (the sandbox tier proves it on a powered-off rig:
tests/sandbox/test_fleet_faults.py)."""

from __future__ import annotations

import logging
import socket
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from rigfleet import liveness


def connector(sock: Any) -> SimpleNamespace:
    transport = SimpleNamespace(sock=sock)
    return SimpleNamespace(client=SimpleNamespace(get_transport=lambda: transport))


@pytest.fixture
def connected() -> Any:
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    yield client
    client.close()
    server.close()


@pytest.mark.skipif(sys.platform != "linux", reason="TCP_USER_TIMEOUT and the keepalive knobs are Linux's")
def test_arm_bounds_how_long_a_silent_rig_is_waited_for(connected: socket.socket) -> None:
    assert connected.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 0
    assert connected.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 0  # the default: wait forever
    conn = connector(connected)
    assert liveness.arm(conn)
    assert connected.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
    assert connected.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == liveness.KEEPALIVE_IDLE_S
    assert connected.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == liveness.KEEPALIVE_INTERVAL_S
    assert connected.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == liveness.DEAD_AFTER_S * 1000
    assert liveness.KEEPALIVE_IDLE_S + liveness.DEAD_AFTER_S <= 90, "a dead rig is noticed within 90 s"
    assert liveness.arm(conn), "arming twice is harmless"


def test_nothing_to_arm_is_not_an_error() -> None:
    assert not liveness.arm(SimpleNamespace())  # e.g. the local or docker connector
    assert not liveness.arm(SimpleNamespace(client=None))  # not connected yet
    assert not liveness.arm(connector(object()))  # a ProxyCommand instead of a socket


def test_the_callback_arms_on_connect_and_before_each_operation(connected: socket.socket) -> None:
    host = SimpleNamespace(connector=connector(connected))
    liveness.DeadPeerDetection.operation_host_start(None, host, "op")
    assert connected.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
    other = socket.socket()
    try:
        liveness.DeadPeerDetection.host_connect(None, SimpleNamespace(connector=connector(other)))
        assert other.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
    finally:
        other.close()


LOST_ERRORS = [
    "Serving | Serve release x (gate basic): ConnectionResetError(104, 'Connection reset by peer')",
    "Serving | Serve release x (gate basic): SSHException('SSH session not active')",
    "Serving | Serve release x (gate basic): SSH session not active",
    "Serving | Serve release x (gate basic): TimeoutError(110, 'Connection timed out')",
    "Docker | Install: EOFError()",
]
NOT_LOST_ERRORS = [
    "Serving | Serve release x (gate basic): rig-01: release x failed the basic gate (health: HTTP 500)",
    "Apt | Install: E: Could not get lock /var/lib/dpkg/lock-frontend",
    "Serving | Serve release x (gate basic): TimeoutError('the gate did not pass in 600 s')",
    "vllm_image | Build t: curl: (56) Recv failure: Connection reset by peer",
]


@pytest.mark.parametrize("error", LOST_ERRORS)
def test_a_dropped_connection_is_named_as_such(error: str) -> None:
    named = liveness._name_loss(error)
    step = error.split(": ", 1)[0]
    assert named.startswith(f"{step}: {liveness.LOST} (") and error.split(": ", 1)[1] in named
    assert liveness._name_loss(named) == named, "naming it twice changes nothing"
    from rigfleet.runner import RigOutcome

    assert liveness.lost(RigOutcome("rig-01", ok=False, errors=[named]))
    assert not liveness.lost(RigOutcome("rig-01", reachable=False, ok=False, errors=[named]))


@pytest.mark.parametrize("error", NOT_LOST_ERRORS)
def test_other_failures_are_left_as_they_are(error: str) -> None:
    assert liveness._name_loss(error) == error


def test_only_the_traceback_of_a_dropped_connection_is_dropped() -> None:
    quiet = liveness._QuietConnectionLoss()

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("pyinfra", logging.WARNING, __file__, 1, message, None, None)

    lost = "Traceback (most recent call last):\n  File \"x.py\", line 1, in f\nConnectionResetError: [Errno 104] reset"
    other = "Traceback (most recent call last):\n  File \"x.py\", line 1, in f\nKeyError: 'image'"
    assert not quiet.filter(record(lost))
    assert quiet.filter(record(other)), "a real bug keeps its traceback"
    assert quiet.filter(record("[rig-01] Unexpected error in Python callback: ConnectionResetError(104, 'x')"))
