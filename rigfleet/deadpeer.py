"""TCP keepalive and a user timeout on a rig's SSH socket, so a rig that went dark (power cut,
pulled cable) fails the command waiting on it within about a minute instead of never.

pyinfra's SSH connection (paramiko) sets no keepalive: a command reading the output of a silent rig
waits until TCP gives up, which is forever when nothing is left to send. A live rig's kernel
acknowledges the probes within milliseconds however busy the rig is; only a dead or cut-off rig
stays silent for DEAD_AFTER_S. See rigfleet.liveness for how a lost rig is reported.
"""

from __future__ import annotations

import contextlib
import socket
from typing import Any

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
