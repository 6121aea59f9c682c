"""The rig lock (rigfleet.riglock): its rig-side script run for real here (sh + flock(1)), and the
control side driving it through a channel like paramiko's, so two deploys of one rig cannot overlap."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pyinfra.api import Config, Inventory, State

from rigfleet import riglock


class LocalChannel:
    """What riglock.take uses of a paramiko channel, running the command in a local shell."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.closed = False

    def settimeout(self, _: float | None) -> None:
        pass

    def exec_command(self, command: str) -> None:
        self.proc = subprocess.Popen(["sh", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)

    class _Lines:
        def __init__(self, stream: Any) -> None:
            self.stream = stream

        def readline(self) -> str:
            return str(self.stream.readline().decode())

        def read(self) -> bytes:
            return bytes(self.stream.read())

    def makefile(self, _: str) -> Any:
        assert self.proc is not None
        return self._Lines(self.proc.stdout)

    def makefile_stderr(self, _: str) -> Any:
        assert self.proc is not None
        return self._Lines(self.proc.stderr)

    def recv_exit_status(self) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=30)

    def shutdown_write(self) -> None:  # EOF on the rig side's stdin, the channel stays open
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.close()

    def exit_status_ready(self) -> bool:
        assert self.proc is not None
        return self.proc.poll() is not None

    def close(self) -> None:  # the connection ends: the rig side sees EOF on stdin
        assert self.proc is not None
        self.closed = True
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


class Transport:
    opened: list[Transport] = []  # every one, so each test ends with no rig-side shell left

    def __init__(self) -> None:
        self.channels: list[LocalChannel] = []
        Transport.opened.append(self)

    def open_session(self) -> LocalChannel:
        self.channels.append(LocalChannel())
        return self.channels[-1]


def connected_rig(name: str, **data: Any) -> Any:
    """A pyinfra host whose SSH connection is `Transport` (so the real command builder runs)."""
    inventory = Inventory(([(name, data)], {}))
    state = State(inventory, Config())
    host = inventory.get_host(name)
    transport = Transport()
    host.connector = SimpleNamespace(client=SimpleNamespace(get_transport=lambda: transport))
    host.state = state
    return host, transport


@pytest.fixture(autouse=True)
def no_shell_left() -> Any:
    yield
    for transport in Transport.opened:
        for channel in transport.channels:
            if channel.proc is not None and channel.proc.poll() is None:
                channel.close()
    Transport.opened.clear()


@pytest.fixture()
def lock_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(riglock, "LOCK_PATH", str(tmp_path / "rigfleet" / "deploy.lock"))
    monkeypatch.setattr(riglock, "HOLDER_PATH", str(tmp_path / "rigfleet" / "deploy.holder"))
    return tmp_path


def test_the_rig_side_script_takes_the_lock_and_a_second_one_is_told_who_holds_it(tmp_path: Path) -> None:
    lock, holder = tmp_path / "d" / "deploy.lock", tmp_path / "d" / "deploy.holder"
    first = subprocess.Popen(["sh", "-c", riglock.holder_script("ann@ctl (pyinfra, pid 7)", str(lock), str(holder))],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout is not None and first.stdout.readline().strip() == riglock.TAKEN
        second = subprocess.run(["sh", "-c", riglock.holder_script("bob@ctl2", str(lock), str(holder))],
                                stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
        assert second.returncode == 3
        answer = riglock.parse_answer(second.stdout, second.stderr, second.returncode)
        assert not answer.taken and not answer.error
        assert answer.holder == f"ann@ctl (pyinfra, pid 7) (pid {first.pid} on the rig)"
    finally:
        assert first.stdin is not None
        first.stdin.close()  # the first deploy's connection ends
        assert first.wait(timeout=30) == 0
    third = subprocess.Popen(["sh", "-c", riglock.holder_script("bob@ctl2", str(lock), str(holder))],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert third.stdout is not None and third.stdout.readline().strip() == riglock.TAKEN, "released at EOF"
    assert third.stdin is not None
    third.stdin.close()
    third.wait(timeout=30)


def test_take_holds_the_lock_for_the_connection_and_refuses_a_second_deploy(lock_files: Path) -> None:
    first, first_transport = connected_rig("rig-01")
    second, _ = connected_rig("rig-01")
    assert riglock.take(first).taken
    assert riglock.take(first).taken, "the same connection asking again holds it already"
    assert len(first_transport.channels) == 1
    busy = riglock.take(second)
    assert not busy.taken and not busy.error
    assert riglock.who_am_i().split(" since ")[0] in busy.holder
    message = riglock.refusal("rig-01", busy)
    assert message.startswith(f"rig-01: another deploy holds the rig lock {riglock.LOCK_PATH}: ")
    assert busy.holder in message and message.endswith("then run again") and len(message) < 300
    first_transport.channels[0].close()  # disconnect_all
    again, _ = connected_rig("rig-01")
    assert riglock.take(again).taken


def test_release_frees_the_lock_at_once_for_the_next_converge_of_this_process(lock_files: Path) -> None:
    """repin/rollback (and tests) converge a rig twice in one process, over a connection pyinfra
    keeps open: the end of the first converge must let the lock go before the second asks."""
    host, transport = connected_rig("rig-01")
    assert riglock.take(host).taken
    holder = transport.channels[0]
    riglock.release(host)
    assert holder.proc is not None and holder.proc.poll() == 0, "the rig side has exited: the lock is free"
    assert riglock.take(host).taken, "the next converge over the same connection takes it anew"
    assert len(transport.channels) == 2
    other, _ = connected_rig("rig-01")
    assert not riglock.take(other).taken, "and holds it again against another deploy"
    riglock.release(other)  # not held there: nothing happens


def test_sudo_wraps_the_rig_side_when_the_rig_uses_it(lock_files: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    commands: list[str] = []
    original = LocalChannel.exec_command

    def record(self: LocalChannel, command: str) -> None:
        commands.append(command)
        original(self, command.replace("sudo -H -n ", ""))

    monkeypatch.setattr(LocalChannel, "exec_command", record)
    host, transport = connected_rig("rig-02", _sudo=True)
    assert riglock.take(host).taken
    assert commands and commands[0].startswith("sudo -H -n sh -c "), commands
    transport.channels[0].close()


def test_an_error_is_not_called_a_busy_rig() -> None:
    answer = riglock.parse_answer("", "sudo: a password is required\n", 1)
    assert not answer.taken and answer.error == "sudo: a password is required"
    assert riglock.refusal("rig-03", answer) == (
        f"rig-03: could not take the rig lock {riglock.LOCK_PATH}: sudo: a password is required")
    no_ssh = riglock.take(SimpleNamespace(connector=SimpleNamespace(), name="rig-03"))
    assert not no_ssh.taken and "SSH connection" in no_ssh.error


def reboot(host: Any, transport: Transport) -> Transport:
    """The rig reboots: the connection (and with it the lock) is gone; the host gets a new one."""
    for channel in transport.channels:
        if not channel.closed:
            channel.close()
    host.connector = connected_rig(host.name)[0].connector
    return host.connector.client.get_transport()  # type: ignore[no-any-return]


def test_after_a_reboot_the_deploy_takes_the_lock_again_before_going_on(lock_files: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from rigfleet.operations import server as rig_server

    host, transport = connected_rig("rig-01")
    monkeypatch.setattr(host, "connect", lambda **_: setattr(host, "connected", True))
    monkeypatch.setattr(host, "disconnect", lambda: setattr(host, "connected", False))
    monkeypatch.setattr(host, "get_fact", lambda fact: "boot-2")
    assert riglock.take(host).taken
    transport = reboot(host, transport)
    rig_server.wait_for_new_boot(None, host, ["boot-1"], 0, 0, 10)
    assert len(transport.channels) == 1 and not transport.channels[0].closed, "the new connection holds it"
    other, _ = connected_rig("rig-01")
    assert not riglock.take(other).taken

    transport = reboot(host, transport)
    other, _ = connected_rig("rig-01")  # another deploy took the rig while it rebooted
    assert riglock.take(other).taken
    with pytest.raises(RuntimeError, match="rig-01: another deploy holds the rig lock"):
        rig_server.wait_for_new_boot(None, host, ["boot-1"], 0, 0, 10)
