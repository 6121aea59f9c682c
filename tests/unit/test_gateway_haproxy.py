"""The generated gateway configuration, run by the distribution's HAProxy on loopback in front of two
tiny stub engines: model-name routing from the JSON body, SSE streams passed through, the API key
checked at the gateway, /v1/models answered, health checks on /health, and the runtime-API commands
the drain uses (drain, maint, ready, `show stat`) doing what rigfleet.gateway expects of them."""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from rigfleet import gateway
from rigfleet.gateway import Gateway, Route, Server
from rigfleet.operations.serving import Drain, DrainSpec, Remote
from rigfleet.schema import SecretRef

HAPROXY = shutil.which("haproxy")
pytestmark = pytest.mark.skipif(HAPROXY is None, reason="haproxy is not installed (make test installs it)")
KEY = "test-key-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Stub(BaseHTTPRequestHandler):
    """A stand-in engine: /health, and chat completions naming which stub answered."""

    protocol_version = "HTTP/1.1"
    server: ThreadingHTTPServer

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/metrics":
            running = self.server.inflight  # type: ignore[attr-defined]
            self._send(200, f'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{model_name="m"}} '
                            f'{running}.0\n'.encode(), "text/plain")
            return
        healthy = getattr(self.server, "healthy", True)
        self._send(200 if healthy and self.path == "/health" else 503, b"")

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        name = getattr(self.server, "name", "?")
        self.server.seen.append(self.headers.get("Authorization"))  # type: ignore[attr-defined]
        self.server.inflight += 1  # type: ignore[attr-defined]
        try:
            self._answer(body, name)
        finally:
            self.server.inflight -= 1  # type: ignore[attr-defined]

    def _answer(self, body: dict[str, object], name: str) -> None:
        if body.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (name, " ok"):
                chunk = f"data: {json.dumps({'choices': [{'delta': {'content': part}}]})}\n\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
                time.sleep(getattr(self.server, "delay", 0.05))
            self.wfile.write(b"%x\r\n%s\r\n" % (len(b"data: [DONE]\n\n"), b"data: [DONE]\n\n"))
            self.wfile.write(b"0\r\n\r\n")
            return
        self._send(200, json.dumps({"model": body["model"], "served_by": name}).encode())


def stub(name: str) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Stub)
    server.name = name  # type: ignore[attr-defined]
    server.seen = []  # type: ignore[attr-defined]
    server.inflight = 0  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def fleet_gateway(tmp_path: Path) -> Iterator[tuple[Gateway, dict[str, ThreadingHTTPServer], Path]]:
    stubs = {"rig-01": stub("rig-01"), "rig-02": stub("rig-02"), "rig-03": stub("rig-03")}
    port = free_port()

    def server(rig: str, weight: int) -> Server:
        return Server(rig, "127.0.0.1", stubs[rig].server_address[1], weight)

    gw = Gateway("rig-01", "127.0.0.1", "127.0.0.1", port, (
        Route("model-a", gateway.backend_name("model-a"), (server("rig-01", 64), server("rig-02", 32))),
        Route("org/model-b", gateway.backend_name("org/model-b"), (server("rig-03", 8),)),
    ), (SecretRef(env="K"),))
    sock = tmp_path / "admin.sock"
    (tmp_path / "keys").write_text(gateway.keys_text([KEY]))
    (tmp_path / "models.json").write_text(gateway.models_json(gw))
    config = gateway.config_text(gw, admin_socket=str(sock), state_file=str(tmp_path / "state"),
                                 keys_file=str(tmp_path / "keys"), models_file=str(tmp_path / "models.json"))
    # run in the foreground as this user, without the chroot and syslog of a real host
    config = "\n".join(line for line in config.splitlines()
                       if line.strip().split(" ")[0] not in ("chroot", "user", "group", "daemon", "log")) + "\n"
    (tmp_path / "haproxy.cfg").write_text(config)
    check = subprocess.run([HAPROXY, "-c", "-f", str(tmp_path / "haproxy.cfg")], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    proc = subprocess.Popen([HAPROXY, "-db", "-f", str(tmp_path / "haproxy.cfg")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        for _ in range(100):
            if sock.exists() and all(row.get("status") == "UP" for row in stat(sock).values()):
                break
            time.sleep(0.1)
        yield gw, stubs, sock
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        for s in stubs.values():
            s.shutdown()


def runtime(sock: Path, command: str) -> str:
    """What gateway.runtime_command runs on the gateway host, run here against the test's socket."""
    out = subprocess.run(["python3", "-c", gateway.RUNTIME_CLIENT, str(sock), command],
                         capture_output=True, text=True, timeout=20)
    assert out.returncode == 0, out.stderr
    return out.stdout


def stat(sock: Path) -> dict[tuple[str, str], dict[str, str]]:
    return gateway.parse_stat(runtime(sock, "show stat"))


def post(gw: Gateway, body: dict[str, object], key: str | None = KEY) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=20)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers=headers)
    response = conn.getresponse()
    return response.status, response.read()


def test_the_model_in_the_body_picks_the_backend(fleet_gateway: tuple) -> None:
    gw, stubs, _ = fleet_gateway
    status, body = post(gw, {"model": "org/model-b", "messages": []})
    assert status == 200 and json.loads(body)["served_by"] == "rig-03"
    served = {json.loads(post(gw, {"model": "model-a", "messages": []})[1])["served_by"] for _ in range(6)}
    assert served <= {"rig-01", "rig-02"} and served
    status, body = post(gw, {"model": "nobody-serves-this", "messages": []})
    assert status == 404 and b"no rig serves that model" in body
    assert stubs["rig-03"].seen[0] == f"Bearer {KEY}"  # the key passes through to the engine


def test_the_key_is_checked_at_the_gateway(fleet_gateway: tuple) -> None:
    gw, stubs, _ = fleet_gateway
    assert post(gw, {"model": "model-a"}, key=None)[0] == 401
    assert post(gw, {"model": "model-a"}, key="wrong")[0] == 401
    assert not stubs["rig-01"].seen and not stubs["rig-02"].seen


def test_streams_pass_through_to_done(fleet_gateway: tuple) -> None:
    gw, _, _ = fleet_gateway
    status, body = post(gw, {"model": "org/model-b", "stream": True})
    events = [line for line in body.decode().splitlines() if line.startswith("data: ")]
    assert status == 200 and events[-1] == "data: [DONE]" and len(events) == 3


def test_models_lists_every_route(fleet_gateway: tuple) -> None:
    gw, _, _ = fleet_gateway
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
    conn.request("GET", "/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    data = json.loads(conn.getresponse().read())
    assert [m["id"] for m in data["data"]] == ["model-a", "org/model-b"]
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
    conn.request("GET", gateway.MONITOR_URI)
    assert conn.getresponse().status == 200


def test_weights_come_from_the_inventory(fleet_gateway: tuple) -> None:
    _, _, sock = fleet_gateway
    rows = stat(sock)
    backend = gateway.backend_name("model-a")
    assert rows[(backend, "rig-01")]["weight"] == "64" and rows[(backend, "rig-02")]["weight"] == "32"


def test_a_drained_server_gets_no_new_requests_and_comes_back_when_ready(fleet_gateway: tuple) -> None:
    gw, stubs, sock = fleet_gateway
    backend = gateway.backend_name("model-a")
    runtime(sock, gateway.set_state(backend, "rig-01", "drain"))
    assert gateway.rig_state(stat(sock), gw, "rig-01") == "draining"
    before = len(stubs["rig-01"].seen)
    for _ in range(6):
        assert json.loads(post(gw, {"model": "model-a"})[1])["served_by"] == "rig-02"
    runtime(sock, gateway.set_state(backend, "rig-01", "maint"))
    assert gateway.rig_state(stat(sock), gw, "rig-01") == "out"
    assert stat(sock)[(backend, "rig-01")]["scur"] == "0"
    assert len(stubs["rig-01"].seen) == before
    runtime(sock, gateway.set_state(backend, "rig-01", "ready"))
    assert gateway.rig_state(stat(sock), gw, "rig-01") == "in"
    served = {json.loads(post(gw, {"model": "model-a"})[1])["served_by"] for _ in range(10)}
    assert "rig-01" in served


def test_an_unhealthy_engine_is_taken_out_by_the_health_check(fleet_gateway: tuple) -> None:
    gw, stubs, sock = fleet_gateway
    stubs["rig-02"].healthy = False  # type: ignore[attr-defined]
    for _ in range(100):
        if gateway.rig_state(stat(sock), gw, "rig-02") == "out":
            break
        time.sleep(0.1)
    assert gateway.rig_state(stat(sock), gw, "rig-02") == "out"
    for _ in range(4):
        assert json.loads(post(gw, {"model": "model-a"})[1])["served_by"] == "rig-01"


class LocalRemote(Remote):
    """The swap's Remote, running its commands here (the rig and the gateway host are this machine)."""

    def __init__(self) -> None:
        super().__init__(host=None)  # type: ignore[arg-type]

    def run(self, command: str, *, stdin: str | None = None, timeout: float | None = None) -> tuple[bool, str, str]:
        out = subprocess.run(["bash", "-c", command], input=stdin, capture_output=True, text=True, timeout=60)
        return out.returncode == 0, out.stdout, out.stderr


class Said:
    """Stands in for the pyinfra host the swap reports through."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def log_styled(self, message: str, **_: object) -> None:
        self.lines.append(message)


def drain_for(sock: Path, timeout_s: int) -> Drain:
    drain = Drain.__new__(Drain)
    drain.spec = DrainSpec("rig-01", "rig-01", (gateway.backend_name("model-a"),), timeout_s, poll_s=0.1)
    drain.rig = LocalRemote()
    drain.gateway = LocalRemote()
    # the runtime client on the gateway host talks to the test's socket
    drain._runtime = lambda command: runtime(sock, command)  # type: ignore[method-assign]
    return drain


def stream_in_background(gw: Gateway, results: list[tuple[int, bytes]]) -> threading.Thread:
    thread = threading.Thread(target=lambda: results.append(post(gw, {"model": "model-a", "stream": True})))
    thread.start()
    return thread


def test_drain_waits_for_the_running_stream_and_sends_nothing_new(fleet_gateway: tuple) -> None:
    gw, stubs, sock = fleet_gateway
    stubs["rig-02"].healthy = False  # type: ignore[attr-defined]  # the stream goes to rig-01
    for _ in range(100):
        if gateway.rig_state(stat(sock), gw, "rig-02") == "out":
            break
        time.sleep(0.1)
    stubs["rig-01"].delay = 1.0  # type: ignore[attr-defined]
    results: list[tuple[int, bytes]] = []
    thread = stream_in_background(gw, results)
    while stubs["rig-01"].inflight == 0:  # type: ignore[attr-defined]
        time.sleep(0.02)
    stubs["rig-02"].healthy = True  # type: ignore[attr-defined]
    drain, said = drain_for(sock, timeout_s=30), Said()
    engine = f"http://127.0.0.1:{stubs['rig-01'].server_address[1]}"
    assert drain.running(engine) == 1 and drain.sessions() == 1
    took = drain.out(said, engine)  # type: ignore[arg-type]
    thread.join()
    # the stream finished before the drain said it was done: complete, ending with [DONE]
    assert took is not None and results[0][0] == 200 and results[0][1].decode().rstrip().endswith("data: [DONE]")
    assert stubs["rig-01"].inflight == 0 and drain.sessions() == 0  # type: ignore[attr-defined]
    assert gateway.rig_state(stat(sock), gw, "rig-01") == "out"
    assert any("drained from the gateway" in line for line in said.lines)
    seen = len(stubs["rig-01"].seen)
    for _ in range(50):
        if gateway.rig_state(stat(sock), gw, "rig-02") == "in":
            break
        time.sleep(0.1)
    for _ in range(4):
        assert json.loads(post(gw, {"model": "model-a"})[1])["served_by"] == "rig-02"
    assert len(stubs["rig-01"].seen) == seen
    drain.back(said)  # type: ignore[arg-type]
    assert gateway.rig_state(stat(sock), gw, "rig-01") == "in"


def test_a_drain_that_runs_out_of_time_says_so_and_takes_the_rig_out(fleet_gateway: tuple) -> None:
    gw, stubs, sock = fleet_gateway
    stubs["rig-01"].delay = 3.0  # type: ignore[attr-defined]
    stubs["rig-02"].delay = 3.0  # type: ignore[attr-defined]
    results: list[tuple[int, bytes]] = []
    threads = [stream_in_background(gw, results) for _ in range(2)]
    while stubs["rig-01"].inflight == 0:  # type: ignore[attr-defined]
        time.sleep(0.02)
    drain, said = drain_for(sock, timeout_s=0), Said()
    drain.out(said, f"http://127.0.0.1:{stubs['rig-01'].server_address[1]}")  # type: ignore[arg-type]
    assert any("drain timed out" in line for line in said.lines)
    assert gateway.rig_state(stat(sock), gw, "rig-01") == "out"
    for thread in threads:
        thread.join()


def test_an_engine_that_does_not_answer_has_nothing_running() -> None:
    drain = Drain.__new__(Drain)
    drain.rig = LocalRemote()
    assert drain.running(f"http://127.0.0.1:{free_port()}") == 0
    assert drain.running(None) == 0
