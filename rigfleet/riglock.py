"""One converge at a time per rig: a lock ON THE RIG, held for as long as the deploy is connected.

Two operators (or one in two terminals) converging the same rig at once would interleave apt, the
image build and the serving swap, and both would write the ledger. The first deploy to reach the rig
takes an exclusive flock(2) on LOCK_PATH. The holder is a shell on the rig that keeps the lock's file
descriptor open and waits for end-of-file on its stdin, a channel of the deploy's own SSH connection:
the lock goes when the deploy disconnects, is killed, or its connection drops (a rig that reboots
drops it too). A control machine that vanishes without closing TCP leaves it until the rig's sshd
notices; the refusal names the holder's pid on the rig for that case.

A second deploy does not wait: that rig's one operation fails at once with one line naming the rig
and the holder (who, from which machine, which command, since when, its pid on the rig); the other
rigs of its run carry on. `rigfleet status` takes no lock (it only reads).
"""

from __future__ import annotations

import getpass
import os
import shlex
import socket
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from pyinfra.api import StringCommand
from pyinfra.api.arguments import pop_global_arguments
from pyinfra.connectors.util import make_unix_command_for_host

from rigfleet.rigstate import STATE_DIR

LOCK_PATH = f"{STATE_DIR}/deploy.lock"
HOLDER_PATH = f"{STATE_DIR}/deploy.holder"
TAKEN = "RIGFLEET-LOCK-TAKEN"
BUSY = "RIGFLEET-LOCK-BUSY"
ANSWER_TIMEOUT_S = 60  # the answer is immediate (flock -n); this only bounds a stuck channel
# who runs a command: the keys of pyinfra's global arguments that decide it (sudo and friends)
AUTH_KEYS = ("_sudo", "_sudo_user", "_use_sudo_login", "_sudo_password", "_preserve_sudo_env", "_su_user",
             "_use_su_login", "_preserve_su_env", "_su_shell", "_su_password", "_doas", "_doas_user", "_dzdo",
             "_dzdo_user")
_HELD = "_rigfleet_rig_lock"

q = shlex.quote


def holder_script(who: str, lock: str = LOCK_PATH, holder: str = HOLDER_PATH) -> str:
    """The rig side: take the lock or say who has it. Holding it, it reads stdin until EOF."""
    return "\n".join([
        f"mkdir -p {q(os.path.dirname(lock))} && exec 9>>{q(lock)} || exit 2",
        "if flock -n 9; then",
        f"  printf '%s (pid %s on the rig)\\n' {q(who)} \"$$\" > {q(holder)}",
        f"  echo {TAKEN}",
        "  cat >/dev/null",  # EOF: the deploy's connection ended; exiting closes fd 9, the lock goes
        "  exit 0",
        "fi",
        f"echo {BUSY}",
        f"cat {q(holder)} 2>/dev/null || echo 'an unknown holder (it wrote nothing)'",
        "exit 3",
    ])


def who_am_i(program: str | None = None) -> str:
    """Who holds the lock, as another operator needs it: user@machine, command, start time."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    program = program or os.path.basename(sys.argv[0] or "python")
    since = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{user}@{socket.gethostname()} ({program}, pid {os.getpid()}) since {since}"


@dataclass(frozen=True)
class Answer:
    taken: bool
    holder: str = ""
    error: str = ""


def parse_answer(stdout: str, stderr: str = "", status: int | None = None) -> Answer:
    """What the holder script said: taken, busy (and the holder), or an error (sudo refused ...)."""
    lines = stdout.splitlines()
    first = lines[0].strip() if lines else ""
    if first == TAKEN:
        return Answer(True)
    if first == BUSY:
        return Answer(False, holder=" ".join(line.strip() for line in lines[1:] if line.strip())[:300])
    detail = (stderr or stdout).strip().splitlines()
    return Answer(False, error=(detail[-1] if detail else f"exit status {status}")[:300])


def refusal(rig: str, answer: Answer) -> str:
    if answer.error:
        return f"{rig}: could not take the rig lock {LOCK_PATH}: {answer.error}"
    # kept short: a failed rig's summary shows the last 300 characters of its error
    return (f"{rig}: another deploy holds the rig lock {LOCK_PATH}: {answer.holder}; nothing was changed here: "
            "wait for it to end, then run again")


def take(host: Any) -> Answer:
    """Take the rig lock on `host` (connected) for the life of its SSH connection."""
    client = getattr(host.connector, "client", None)
    transport = client.get_transport() if client is not None else None
    if transport is None:
        return Answer(False, error="the rig lock needs the rig's SSH connection (none is open)")
    if getattr(transport, _HELD, None) is not None:
        return Answer(True)  # this connection holds it already
    arguments, _ = pop_global_arguments(host.state, host, {})
    auth = {k: v for k, v in arguments.items() if k in AUTH_KEYS and v not in (None, False, "")}
    script = holder_script(who_am_i(), LOCK_PATH, HOLDER_PATH)
    command = make_unix_command_for_host(host.state, host, StringCommand(script), **auth)
    channel = transport.open_session()
    channel.settimeout(ANSWER_TIMEOUT_S)
    channel.exec_command(command.get_raw_value())
    stdout = channel.makefile("r")
    try:
        first = stdout.readline()
    except OSError as exc:  # no answer in time: treat as not taken, say why
        channel.close()
        return Answer(False, error=f"no answer from the rig ({type(exc).__name__})")
    if first.strip() == TAKEN:
        channel.settimeout(None)
        setattr(transport, _HELD, channel)  # keeps the channel (and so the lock) open until disconnect
        return Answer(True)
    rest = _text(stdout.read())
    stderr = _text(channel.makefile_stderr("r").read())
    status = channel.recv_exit_status()
    channel.close()
    return parse_answer(_text(first) + rest, stderr, status)


def release(host: Any) -> None:
    """Let the rig's lock go at the end of a converge, in a process that lives on (repin's and
    rollback's runner converge rig after rig; pyinfra's disconnect keeps the SSH connection open).
    EOF on the holder's stdin, then wait (bounded) until it has exited, so the lock is free."""
    client = getattr(host.connector, "client", None)
    transport = client.get_transport() if client is not None else None
    channel = getattr(transport, _HELD, None) if transport is not None else None
    if channel is None:
        return
    setattr(transport, _HELD, None)
    try:
        channel.shutdown_write()
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        while not channel.exit_status_ready() and time.monotonic() < deadline:
            time.sleep(0.05)
    except OSError:  # the connection is gone already: so is the lock
        pass
    finally:
        channel.close()


def _text(data: str | bytes) -> str:  # paramiko's read() gives bytes, readline() str
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def hold_or_refuse(host: Any) -> bool:
    """Call first in a rig's deploy code: True when this run holds the rig's lock; otherwise the
    rig gets one operation that fails with the refusal, and the caller adds nothing more."""
    answer = take(host)
    if answer.taken:
        return True
    from pyinfra.operations import server

    message = refusal(host.name, answer)
    server.shell(name="rig lock: another deploy holds this rig", commands=[f"printf '%s\\n' {q(message)} >&2; exit 1"])
    return False
