"""`rigfleet hostkeys` and the known_hosts logic, against an SSH server run in this process.

The server is paramiko's (key exchange only: it accepts no login) with keys generated here; the
sandbox tier (tests/sandbox/test_hostkeys.py) runs the same command against a real rig's sshd.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import paramiko
import pytest
from click.testing import CliRunner

from rigfleet import hostkeys
from rigfleet.cli import main
from rigfleet.errors import InputError
from rigfleet.hostkeys import MISMATCH, MISSING, OK, Target, fingerprint
from tests.conftest import EXAMPLE, write_yaml


class Server:
    """An SSH server on 127.0.0.1 with these host keys; counts the connections it gets.

    close() joins every thread it started: pyinfra_cli (imported by later tests) monkey-patches
    threading with gevent and must not find threads of this module still running.
    """

    def __init__(self, *keys: paramiko.PKey) -> None:
        self.keys = keys
        self.connections = 0
        self.transports: list[paramiko.Transport] = []
        self.threads: list[threading.Thread] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._start(self._serve)

    def _start(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self.threads.append(thread)
        thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            self._start(self._handle, conn)

    def _handle(self, conn: socket.socket) -> None:
        transport = paramiko.Transport(conn)
        self.transports.append(transport)
        for key in self.keys:
            transport.add_server_key(key)
        try:
            transport.start_server(server=paramiko.ServerInterface())
            deadline = time.monotonic() + 10
            while transport.is_active() and time.monotonic() < deadline:  # until the client hangs up
                time.sleep(0.01)
        except (paramiko.SSHException, EOFError, OSError):
            pass
        finally:
            transport.close()

    def close(self) -> None:
        self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        for transport in list(self.transports):
            transport.close()
        for thread in list(self.threads):
            thread.join(timeout=15)
        for transport in self.transports:
            transport.join(timeout=15)  # a Transport is a thread too


@pytest.fixture(scope="module")
def server_key() -> paramiko.PKey:
    return paramiko.ECDSAKey.generate()


@pytest.fixture
def server(server_key: paramiko.PKey) -> Iterator[Server]:
    running = Server(server_key)
    yield running
    running.close()


def closed_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        return int(sock.getsockname()[1])


def inventory(tmp_path: Path, rigs: dict[str, int]) -> Path:
    """rig -> port on 127.0.0.1; known_hosts in the inventory (not created)."""
    inv = tmp_path / "inventory"
    inv.mkdir()
    shutil.copy(EXAMPLE / "pinsets.yml", inv / "pinsets.yml")
    write_yaml(inv / "group_vars" / "all.yml", {"pinset": "seed-2026-05", "variant": "tq3-mtp-genesis",
                                                  "model_dir": "/srv/models", "ssh_user": "ops"})
    hosts = {name: {"ssh_hostname": "127.0.0.1", "ssh_port": port} for name, port in rigs.items()}
    write_yaml(inv / "hosts.yml", {"all": {"children": {"lab": {"hosts": hosts}}}})
    return inv


def run(inv: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["hostkeys", *args], env={"RIGFLEET_INVENTORY": str(inv), "COLUMNS": "400"})
    return result.exit_code, result.output


def keygen_fingerprint(tmp_path: Path, key: paramiko.PKey) -> str:
    """`ssh-keygen -l` of a known_hosts line holding `key`, minus the host name."""
    path = tmp_path / "one_host"
    path.write_text(f"h {key.get_name()} {key.get_base64()}\n")
    bits, digest, _, kind = subprocess.run(["ssh-keygen", "-l", "-f", str(path)], capture_output=True, text=True,
                                           check=True).stdout.split()
    return f"{bits} {digest} {kind}"


# -- known_hosts logic ---------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs ssh-keygen")
def test_fingerprint_is_what_ssh_keygen_prints(tmp_path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "ed")], check=True)
    keys = [paramiko.ECDSAKey.generate(), paramiko.RSAKey.generate(2048),
            paramiko.Ed25519Key(filename=str(tmp_path / "ed"))]
    for key in keys:
        assert fingerprint(key) == keygen_fingerprint(tmp_path, key)
    assert fingerprint(keys[2]).endswith("(ED25519)") and fingerprint(keys[0]).startswith("256 SHA256:")


def test_entry_names_the_port_only_off_22() -> None:
    assert hostkeys.host_entry("10.0.0.5", 22) == "10.0.0.5"
    assert hostkeys.host_entry("10.0.0.5", 2222) == "[10.0.0.5]:2222"


def test_compare_ok_missing_mismatch(tmp_path: Path) -> None:
    rig_key, other, rsa = paramiko.ECDSAKey.generate(), paramiko.ECDSAKey.generate(), paramiko.RSAKey.generate(2048)
    path = tmp_path / "known_hosts"
    hashed = paramiko.HostKeys.hash_host("[10.0.0.9]:2222")
    path.write_text(f"# comment\n10.0.0.5 {rig_key.get_name()} {rig_key.get_base64()}\n"
                    f"10.0.0.6 {other.get_name()} {other.get_base64()}\n"
                    f"10.0.0.7 {rsa.get_name()} {rsa.get_base64()}\n"
                    f"{hashed} {rig_key.get_name()} {rig_key.get_base64()}\n")
    keys = hostkeys.load(path)

    def state(host: str, port: int = 22, key: paramiko.PKey = rig_key) -> hostkeys.Check:
        return hostkeys.compare(Target("rig", host, port, path), keys, key)

    assert state("10.0.0.5").state == OK
    assert state("10.0.0.9", 2222).state == OK  # hashed entries are found
    assert state("10.0.0.5", 2222).state == MISSING  # [host]:port is another entry
    assert state("10.0.0.8").state == MISSING
    wrong = state("10.0.0.6")
    assert wrong.state == MISMATCH and wrong.known == other and wrong.key == rig_key
    # a known entry of another type that the rig does not present: a mismatch, as paramiko decides
    assert state("10.0.0.7").state == MISMATCH and state("10.0.0.7").known == rsa


def test_append_keeps_existing_bytes_and_uses_openssh_format(tmp_path: Path) -> None:
    path = tmp_path / "known_hosts"
    old = paramiko.ECDSAKey.generate()
    before = f"# kept as is\r\n\t10.0.0.5 {old.get_name()} {old.get_base64()}   trailing".encode()  # no newline
    path.write_bytes(before)
    new = paramiko.ECDSAKey.generate()
    assert hostkeys.append(path, "[10.0.0.6]:2222", new)
    data = path.read_bytes()
    assert data.startswith(before)
    assert data[len(before):] == f"\n[10.0.0.6]:2222 {new.get_name()} {new.get_base64()}\n".encode()
    assert hostkeys.known_for(hostkeys.load(path), "[10.0.0.6]:2222") == {new.get_name(): new}
    if shutil.which("ssh-keygen"):
        found = subprocess.run(["ssh-keygen", "-F", "[10.0.0.6]:2222", "-f", str(path)], capture_output=True,
                               text=True)
        assert found.returncode == 0 and new.get_base64() in found.stdout
    # an entry that exists by then is never added to (nor replaced)
    assert not hostkeys.append(path, "[10.0.0.6]:2222", paramiko.ECDSAKey.generate())
    assert not hostkeys.append(path, "10.0.0.5", new)
    assert path.read_bytes() == data


def test_append_creates_the_file_0644(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "known_hosts"
    old_umask = os.umask(0o077)
    try:
        assert hostkeys.append(path, "10.0.0.5", paramiko.ECDSAKey.generate())
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert path.read_text().count("\n") == 1


def test_unreadable_known_hosts_is_bad_input(tmp_path: Path) -> None:
    (tmp_path / "known_hosts").mkdir()
    with pytest.raises(InputError) as raised:
        hostkeys.load(tmp_path / "known_hosts", "rig-01")
    assert "ssh_known_hosts_file" in str(raised.value) and "rig-01" in str(raised.value)


def test_fetch_offers_the_recorded_type_first(server_key: paramiko.PKey) -> None:
    rsa = paramiko.RSAKey.generate(2048)
    two = Server(server_key, rsa)
    try:
        assert hostkeys.fetch("127.0.0.1", two.port) == server_key  # paramiko's own preference
        assert hostkeys.fetch("127.0.0.1", two.port, ["ssh-rsa"]) == rsa  # as SSHClient does for a known type
    finally:
        two.close()


# -- the command -----------------------------------------------------------------------------------


def test_missing_then_record_then_ok(tmp_path: Path, server: Server, server_key: paramiko.PKey) -> None:
    inv = inventory(tmp_path, {"rig-01": server.port})
    known = inv / "known_hosts"
    code, out = run(inv)
    assert code == 1, out
    assert "rig-01  missing" in out and fingerprint(server_key) in out and "--record" in out
    assert not known.exists()

    code, out = run(inv, "--record")
    assert code == 0, out
    assert f"recorded: rig-01 [127.0.0.1]:{server.port} {fingerprint(server_key)}" in out
    assert known.read_text() == f"[127.0.0.1]:{server.port} {server_key.get_name()} {server_key.get_base64()}\n"
    assert stat.S_IMODE(known.stat().st_mode) == 0o644

    code, out = run(inv)
    assert code == 0 and "rig-01  ok" in out and fingerprint(server_key) in out, out
    code, out = run(inv, "--record")  # nothing to record: unchanged
    assert code == 0 and "recorded" not in out
    assert known.read_text().count("\n") == 1


def test_mismatch_is_reported_and_never_recorded(tmp_path: Path, server: Server, server_key: paramiko.PKey) -> None:
    inv = inventory(tmp_path, {"rig-01": server.port})
    old = paramiko.ECDSAKey.generate()
    known = inv / "known_hosts"
    known.write_bytes(f"# ours\n[127.0.0.1]:{server.port} {old.get_name()} {old.get_base64()}\n".encode())
    before = known.read_bytes()
    code, out = run(inv)
    assert code == 1 and "rig-01  MISMATCH" in out and "man-in-the-middle" in out, out
    code, out = run(inv, "--record")
    assert code == 1, out
    assert known.read_bytes() == before
    refusal = [line for line in out.splitlines() if line.startswith("error: rig-01")]
    assert len(refusal) == 1, out
    for needle in (fingerprint(old), fingerprint(server_key), "not recorded",
                   f"ssh-keygen -f {known} -R [127.0.0.1]:{server.port}"):
        assert needle in refusal[0], refusal[0]


def test_unreachable_and_scope(tmp_path: Path, server: Server) -> None:
    port = closed_port()
    inv = inventory(tmp_path, {"rig-01": server.port, "rig-02": port})
    code, out = run(inv, "rig-02")
    assert code == 1 and "rig-02  unreachable" in out and f"127.0.0.1:{port}" in out and "rig-01" not in out, out
    assert server.connections == 0
    code, out = run(inv, "--group", "lab", "--record")
    assert code == 1 and "recorded: rig-01" in out and "rig-02  unreachable" in out, out


def test_bad_input_exits_2_and_contacts_nothing(tmp_path: Path, server: Server) -> None:
    inv = inventory(tmp_path, {"rig-01": server.port})
    for args in (("rig-1",), ("--group", "prod"), ("rig-1", "--record")):
        code, out = run(inv, *args)
        assert code == 2 and out.startswith("error: ") and out.count("\n") == 1 and "Traceback" not in out, out
    assert "did you mean 'rig-01'" in run(inv, "rig-1")[1]
    assert server.connections == 0 and not (inv / "known_hosts").exists()


# -- the hint on a refused connect ---------------------------------------------------------------------


def test_explain_points_at_hostkeys() -> None:
    missing = "SSH error (StrictPolicy: No host key for 10.0.0.5 found in known_hosts)"
    hinted = hostkeys.explain("rig-01", missing)
    assert hinted.startswith(missing) and "`rigfleet hostkeys --record rig-01`" in hinted
    assert hostkeys.explain("rig-01", hinted) == hinted
    changed = hostkeys.explain("rig-01", "SSH host key error (Host key for x does not match.)")
    assert "`rigfleet hostkeys rig-01`" in changed and "never replaced" in changed
    assert hostkeys.explain("rig-01", "Could not connect (timed out)") == "Could not connect (timed out)"


def test_filter_hints_pyinfra_log_line() -> None:
    logger = logging.getLogger("rigfleet-test-hints")
    hostkeys.install_hints(logger)
    hostkeys.install_hints(logger)
    assert len(logger.filters) == 1
    record = logger.makeRecord(logger.name, logging.ERROR, __file__, 1,
                               "\x1b[1m[rig-01] \x1b[0m\x1b[31mSSH error (StrictPolicy: No host key for 10.0.0.5 "
                               "found in known_hosts)\x1b[0m", (), None)
    assert logger.filters[0].filter(record)
    assert record.getMessage().endswith("then run `rigfleet hostkeys --record rig-01`")


def test_status_and_repin_refuse_an_unknown_key_and_say_how_to_record_it(tmp_path: Path, server: Server) -> None:
    """Through pyinfra and rigfleet.runner, as the operator runs them (subprocesses): strict, and hinted."""
    inv = inventory(tmp_path, {"rig-01": server.port})
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(inv / "id_ed25519")], check=True)
    write_yaml(inv / "host_vars" / "rig-01.yml", {"ssh_key": "id_ed25519"})
    (inv / "known_hosts").write_text("# empty\n")
    env = {**os.environ, "RIGFLEET_INVENTORY": str(inv), "COLUMNS": "400"}
    rigfleet = str(Path(sys.executable).parent / "rigfleet")
    status = subprocess.run([rigfleet, "status", "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert status.returncode == 0 and json.loads(status.stdout)[0]["reachable"] is False, status.stderr
    assert "[rig-01] SSH error (StrictPolicy: No host key" in status.stderr
    assert "then run `rigfleet hostkeys --record rig-01`" in status.stderr
    repin = subprocess.run([rigfleet, "repin"], capture_output=True, text=True, env=env, timeout=120)
    assert repin.returncode == 1
    assert "rig-01: unreachable (SSH error (StrictPolicy" in repin.stdout  # the runner's collected reason
    assert "rigfleet hostkeys --record rig-01" in repin.stdout, repin.stdout
    assert (inv / "known_hosts").read_text() == "# empty\n"  # never accept-new


def test_runner_reads_known_hosts_as_it_is_at_each_call(tmp_path: Path, server: Server,
                                                        server_key: paramiko.PKey) -> None:
    """pyinfra memoizes a known_hosts file per process; rigfleet's runner must not: a key recorded
    (or a rig rebuilt) between two calls of one process is seen by the second (a subprocess, as
    pyinfra patches the process with gevent)."""
    inv = inventory(tmp_path, {"rig-01": server.port})
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(inv / "id_ed25519")], check=True)
    write_yaml(inv / "host_vars" / "rig-01.yml", {"ssh_key": "id_ed25519"})
    entry = f"[127.0.0.1]:{server.port}"
    other = paramiko.ECDSAKey.generate()
    (inv / "known_hosts").write_text(f"{entry} {other.get_name()} {other.get_base64()}\n")
    recorded = f"{entry} {server_key.get_name()} {server_key.get_base64()}\n"
    script = f"""
import json, sys
from pathlib import Path
from rigfleet import runner
from rigfleet.loader import load_fleet
from rigfleet.facts.system import BootId
fleet = load_fleet(Path({str(inv)!r}))
_, first = runner.read_facts(fleet, ["rig-01"], BootId)
Path({str(inv / "known_hosts")!r}).write_text({recorded!r})
_, second = runner.read_facts(fleet, ["rig-01"], BootId)
print(json.dumps([first["rig-01"].errors, second["rig-01"].errors]))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    first, second = json.loads(done.stdout.strip().splitlines()[-1])
    assert any("does not match" in error for error in first), first
    # the recorded key is accepted now; the server takes no login, so the error is about authentication
    assert second and not any("does not match" in error or "host key" in error.lower() for error in second), second
