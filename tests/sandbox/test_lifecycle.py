"""Lifecycle of the SIMULATED rigs: login, boot time, reboot, killed-run recovery, clean `down`.

The tests in this module run in file order and share one sandbox; the last one takes it down.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from rigfleet_sandbox import manager, procs, services
from rigfleet_sandbox.debindex import debian_mirror
from rigfleet_sandbox.layout import (
    HOST_VETH_PREFIX,
    MACHINE_PREFIX,
    NET,
    NETNS_PREFIX,
    RIGS_DIR,
    SERVICE_ADDR,
    SERVICE_IF,
    STATE_DIR,
    RigSpec,
)
from rigfleet_sandbox.supervisor import read_boots

from .conftest import Sandbox, SandboxSession

RIG = "rig-01"


def _wait_for_new_boot(sandbox: Sandbox, old_boot_id: str, timeout: float = 90) -> tuple[str, float]:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        proc = sandbox.ssh(RIG, "cat /proc/sys/kernel/random/boot_id", check=False, timeout=15)
        boot_id = proc.stdout.strip()
        if proc.returncode == 0 and boot_id and boot_id != old_boot_id:
            return boot_id, time.monotonic() - started
        time.sleep(0.5)
    raise AssertionError(f"{RIG} did not come back with a new boot id within {timeout}s")


@pytest.mark.sandbox
def test_operator_login_with_passwordless_sudo(sandbox: Sandbox) -> None:
    assert sandbox.ssh(RIG, "id -un").stdout.strip() == "rigop"
    assert sandbox.ssh(RIG, "sudo -n id -u").stdout.strip() == "0"
    assert sandbox.ssh(RIG, "hostname").stdout.strip() == RIG
    assert "SIMULATED" in sandbox.ssh(RIG, "cat /etc/rigfleet-sandbox").stdout
    # Real rigs rarely allow root over SSH; neither do the simulated ones.
    assert sandbox.ssh(RIG, "true", user="root", check=False).returncode == 255


@pytest.mark.sandbox
def test_host_keys_are_strict_and_per_rig(sandbox: Sandbox, tmp_path: Path) -> None:
    known = (sandbox.inventory_dir / "known_hosts").read_text()
    address = sandbox.address(RIG)
    line = next(entry for entry in known.splitlines() if entry.startswith(f"{address} "))
    served = subprocess.run(
        ["ssh-keyscan", "-t", "ed25519", address], capture_output=True, text=True, check=True
    ).stdout.split()
    assert line.split()[1:3] == served[1:3], "known_hosts holds the key the rig really serves"
    # Strict checking: an unknown host key is refused, never accepted-new.
    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "id_ed25519").write_bytes((sandbox.inventory_dir / "id_ed25519").read_bytes())
    (inv / "id_ed25519").chmod(0o600)
    (inv / "known_hosts").write_text("")
    proc = subprocess.run([*manager.ssh_command(inv, address), "true"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 255 and "Host key verification failed" in proc.stderr
    assert (inv / "known_hosts").read_text() == ""


@pytest.mark.sandbox
def test_generated_inventory(sandbox: Sandbox) -> None:
    import yaml

    inv = sandbox.inventory_dir
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())["all"]["children"]["sandbox"]["hosts"]
    assert hosts[RIG] == {"ssh_hostname": sandbox.address(RIG), "bind_address": sandbox.address(RIG)}
    group_vars = yaml.safe_load((inv / "group_vars" / "all.yml").read_text())
    assert group_vars["ssh_user"] == "rigop"
    assert group_vars["apt_proxy"] == f"http://{SERVICE_ADDR}:3142"
    assert (inv / "host_vars").is_dir()
    assert oct((inv / "id_ed25519").stat().st_mode & 0o777) == "0o600"
    for name in ("hosts.yml", "group_vars/all.yml", "pinsets.yml"):
        assert "SIMULATED" in (inv / name).read_text().splitlines()[1]


@pytest.mark.sandbox
def test_boot_to_sshd_is_measured(sandbox: Sandbox) -> None:
    for rig in sandbox.info.rigs:
        assert rig.boot_seconds is not None
        print(f"{rig.name}: sshd answered {rig.boot_seconds:.1f}s after systemd-nspawn started")
        # How fast is the bench's business (no timing assertions in tests); a boot that never
        # reaches sshd fails `up` itself after its BOOT_TIMEOUT_S.
        assert rig.boot_seconds > 0


@pytest.mark.sandbox
def test_rig_reaches_host_services_only_through_the_allowlist(sandbox: Sandbox) -> None:
    www = sandbox.ssh(RIG, f"curl -s -o /dev/null -w '%{{http_code}}' http://{SERVICE_ADDR}:8080/").stdout
    assert www == "200"
    proxy = f"curl -s -o /dev/null -w '%{{http_code}}' -x http://{SERVICE_ADDR}:3142"
    # A refused host answers 403 from the proxy itself: nothing leaves the machine.
    assert sandbox.ssh(RIG, f"{proxy} http://example.invalid/", check=False).stdout == "403"
    # No NAT: the rig has no route anywhere but the sandbox addresses.
    assert sandbox.ssh(RIG, "ip route").stdout.split()[:3] == ["default", "via", RigSpec(1).host_addr]


@pytest.mark.sandbox
def test_status_reports_running_rig(sandbox: Sandbox) -> None:
    row = next(r for r in manager.status() if r.name == RIG)
    assert row.state == "running" and row.sshd
    assert row.boot_id == sandbox.ssh(RIG, "cat /proc/sys/kernel/random/boot_id").stdout.strip()
    assert row.uptime_s is not None and row.uptime_s >= 0
    assert procs.alive(row.supervisor_pid) and procs.alive(row.init_pid)


@pytest.mark.sandbox
def test_reboot_brings_rig_back_with_new_boot_id(sandbox: Sandbox) -> None:
    before = sandbox.ssh(RIG, "cat /proc/sys/kernel/random/boot_id").stdout.strip()
    boots_before = len(read_boots(RigSpec.from_name(RIG)))
    # The connection may drop while systemd goes down; that is fine.
    sandbox.ssh(RIG, "sudo -n systemctl reboot", check=False, timeout=30)
    after, took = _wait_for_new_boot(sandbox, before)
    print(f"{RIG} rebooted in {took:.1f}s: boot id {before} -> {after}")
    assert after != before
    records = read_boots(RigSpec.from_name(RIG))[boots_before:]
    assert any(r.get("exit") == 133 for r in records), "nspawn exited with the reboot status"
    assert sandbox.ssh(RIG, "systemctl is-system-running --wait", check=False).stdout.strip() in (
        "running",
        "degraded",
    )


@pytest.mark.sandbox
def test_up_clears_what_a_killed_run_left(sandbox: Sandbox, sandbox_session: SandboxSession) -> None:
    # CI starts right after everything a previous run started was SIGKILLed: supervisors and
    # nspawn die, the rig's systemd lives on orphaned, netns/veths/dirs stay.
    for proc in procs.sandbox_processes():
        if proc.what in ("supervisor", "services", "nspawn"):
            os.kill(proc.pid, signal.SIGKILL)
    time.sleep(0.5)
    assert any(p.what == "in-rig" for p in procs.sandbox_processes()), "an orphaned rig systemd"
    sandbox_session.mark_down()
    info = manager.up(rigs=1, distro=sandbox.info.distro, log=print)
    sandbox_session.info = sandbox.info = info
    left = {p.pid for p in procs.sandbox_processes()}
    row = manager.status()[0]
    assert row.state == "running" and row.init_pid in left
    assert sandbox.ssh(RIG, "sudo -n true").returncode == 0


@pytest.mark.sandbox
def test_down_leaves_nothing_behind(sandbox: Sandbox, sandbox_session: SandboxSession) -> None:
    left = manager.down(log=print)
    sandbox_session.mark_down()
    assert not any(left.values()), left
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert f"{NETNS_PREFIX}rig-" not in netns
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    assert f"{HOST_VETH_PREFIX}rig-" not in links and SERVICE_IF not in links
    addrs = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    assert f" {NET}." not in addrs
    mounts = Path("/proc/mounts").read_text()
    assert str(STATE_DIR) not in mounts and f"/run/netns/{NETNS_PREFIX}" not in mounts
    ps = subprocess.run(["ps", "-eo", "stat=,args="], capture_output=True, text=True, check=True).stdout
    live = [line for line in ps.splitlines() if not line.strip().startswith("Z")]
    # Another sandbox instance may run beside this one: its processes are not ours to see here.
    assert not [line for line in live if str(RIGS_DIR) + "/" in line]
    assert procs.sandbox_processes() == []
    assert not STATE_DIR.exists()
    assert not list(Path("/run/systemd/nspawn/propagate").glob(f"{MACHINE_PREFIX}rig-*"))


# -- the proxy's allowlist, on loopback (no root, no network) ---------------------------------


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[tuple[str, int]]:
    services.AptProxyHandler.cache_dir = tmp_path
    services.AptProxyHandler.connect_allow = frozenset({("index.example.org", 443)})  # a placeholder index
    server = ThreadingHTTPServer(("127.0.0.1", 0), services.AptProxyHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield "127.0.0.1", server.server_address[1]
    server.shutdown()
    server.server_close()


def _via_proxy(addr: tuple[str, int], request: bytes) -> bytes:
    with socket.create_connection(addr, timeout=5) as sock:
        sock.sendall(request)
        return sock.recv(4096)


def test_proxy_refuses_hosts_off_the_allowlist(proxy: tuple[str, int]) -> None:
    reply = _via_proxy(proxy, b"GET http://example.invalid/x HTTP/1.1\r\nHost: example.invalid\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 403")
    reply = _via_proxy(proxy, b"CONNECT example.invalid:443 HTTP/1.1\r\nHost: example.invalid\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 403")
    reply = _via_proxy(proxy, b"CONNECT index.example.org:22 HTTP/1.1\r\nHost: index.example.org\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 403")
    reply = _via_proxy(proxy, b"GET /not-absolute HTTP/1.1\r\nHost: x\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 400")


def test_proxy_tunnels_to_the_index_hosts_it_was_given(proxy: tuple[str, int]) -> None:
    with socket.create_server(("127.0.0.1", 0)) as index:  # stands in for pip's configured index
        port = index.getsockname()[1]
        services.AptProxyHandler.connect_allow = frozenset({("127.0.0.1", port)})
        request = f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
        assert _via_proxy(proxy, request).startswith(b"HTTP/1.1 200")
        services.AptProxyHandler.connect_allow = frozenset()
        assert _via_proxy(proxy, request).startswith(b"HTTP/1.1 403")


def test_proxy_serves_cached_debs_without_upstream(proxy: tuple[str, int], tmp_path: Path) -> None:
    mirror = urllib.parse.urlsplit(debian_mirror())  # the proxy forwards only to this machine's own mirrors
    deb = tmp_path / str(mirror.hostname) / mirror.path.strip("/") / "pool" / "main" / "h" / "hello_1.0_amd64.deb"
    deb.parent.mkdir(parents=True)
    deb.write_bytes(b"!<arch>\nsimulated")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": f"http://{proxy[0]}:{proxy[1]}"}))
    url = f"http://{mirror.hostname}{mirror.path.rstrip('/')}/pool/main/h/hello_1.0_amd64.deb"
    with opener.open(url, timeout=5) as resp:
        assert resp.headers["X-Rigfleet-Cache"] == "hit"
        assert resp.read() == b"!<arch>\nsimulated"
