"""Drain vs no drain: a rolling swap of stand-in engines behind the real HAProxy, under load.

    python -m bench.gateway [--repeats 3] [--json out/bench-gateway.json]

No sandbox and no root: the distribution's HAProxy runs rigfleet's generated gateway config on
loopback in front of 4 tiny stand-in engines (SIMULATED: /health, /metrics with the running gauge,
chat completions that stream a few chunks slowly). A bounded load (a fixed number of requests,
mixed streaming and non-streaming, a few at once) runs through the gateway while every engine is
swapped in turn (stop, a short downtime, start, health) the way the serving swap does it: with the
drain (rigfleet.operations.serving.Drain: drain, wait until nothing is in flight, maint, swap,
ready) or without it (`repin --no-drain`). It reports failed requests in both modes and the time
the drain adds to the rolling swap. tests/unit/test_gateway_rolling.py runs the drain mode once
and requires zero failures.
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from rigfleet import gateway
from rigfleet.gateway import Gateway, Route, Server
from rigfleet.operations.serving import Drain, DrainSpec, Remote
from rigfleet.schema import SecretRef

MODEL = "bench-model"
KEY = "bench-key-not-a-secret"
CHUNKS = 4
CHUNK_DELAY_S = 0.08
DOWNTIME_S = 0.6  # engine stopped -> new engine listening (the sandbox measures 2.7 s)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Engine(BaseHTTPRequestHandler):
    """A SIMULATED engine: /health, /metrics (vllm:num_requests_running), chat completions."""

    protocol_version = "HTTP/1.1"
    server: EngineServer

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
            self._send(200, f"vllm:num_requests_running{{model_name=\"{MODEL}\"}} {self.server.inflight}.0\n"
                       .encode(), "text/plain")
        else:
            self._send(200 if self.path == "/health" else 404, b"")

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.inflight += 1
        self.server.served += 1
        try:
            if not body.get("stream"):
                time.sleep(CHUNK_DELAY_S * CHUNKS)
                self._send(200, json.dumps({"choices": [{"message": {"content": f"ok from {self.server.name}"}}]})
                           .encode())
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for index in range(CHUNKS):
                self._chunk(f"data: {json.dumps({'choices': [{'delta': {'content': str(index)}}]})}\n\n")
                time.sleep(CHUNK_DELAY_S)
            self._chunk("data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
        finally:
            self.server.inflight -= 1

    def _chunk(self, text: str) -> None:
        data = text.encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


class EngineServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, name: str, port: int) -> None:
        self.allow_reuse_address = True
        super().__init__(("127.0.0.1", port), Engine)
        self.name, self.inflight, self.served = name, 0, 0
        self.sockets: set[socket.socket] = set()
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def process_request(self, request: Any, client_address: Any) -> None:
        self.sockets.add(request)
        super().process_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a connection cut by kill() or by HAProxy's health check is expected here

    def kill(self) -> None:
        """What stopping the engine's container does to its connections: they are cut."""
        self.shutdown()
        self.server_close()
        for sock in list(self.sockets):
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


class Local(Remote):
    """The swap's Remote, run here: the rig and the gateway host are this machine."""

    def __init__(self) -> None:
        super().__init__(host=None)  # type: ignore[arg-type]

    def run(self, command: str, *, stdin: str | None = None, timeout: float | None = None) -> tuple[bool, str, str]:
        out = subprocess.run(["bash", "-c", command], input=stdin, capture_output=True, text=True, timeout=60)
        return out.returncode == 0, out.stdout, out.stderr


class Said:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def log_styled(self, message: str, **_: object) -> None:
        self.lines.append(message)


@dataclass
class Fleet:
    gw: Gateway
    engines: dict[str, EngineServer]
    sock: Path
    log: Path

    def runtime(self, command: str) -> str:
        out = subprocess.run(["python3", "-c", gateway.RUNTIME_CLIENT, str(self.sock), command],
                             capture_output=True, text=True, timeout=20)
        return out.stdout

    def drain(self, rig: str, timeout_s: int = 30) -> Drain:
        drain = Drain.__new__(Drain)
        drain.spec = DrainSpec("gw", rig, tuple(r.backend for r in self.gw.routes), timeout_s, poll_s=0.05)
        drain.rig = drain.gateway = Local()
        drain._runtime = self.runtime  # type: ignore[method-assign]
        return drain

    def state(self, rig: str) -> str:
        return gateway.rig_state(gateway.parse_stat(self.runtime("show stat")), self.gw, rig)


@contextmanager
def running_fleet(rigs: int = 4) -> Iterator[Fleet]:
    """rigfleet's generated config, run by the distribution's HAProxy (no chroot/user/syslog: a
    foreground process logging each request to a file through a local syslog socket)."""
    haproxy = shutil.which("haproxy")
    if haproxy is None:
        raise RuntimeError("haproxy is not installed (apt-get install haproxy)")
    work = Path(tempfile.mkdtemp(prefix="rigfleet-gw-"))
    engines = {f"rig-{i:02d}": EngineServer(f"rig-{i:02d}", free_port()) for i in range(1, rigs + 1)}
    servers = tuple(Server(name, "127.0.0.1", e.server_address[1], 2) for name, e in engines.items())
    gw = Gateway("gw", "127.0.0.1", "127.0.0.1", free_port(), (Route(MODEL, gateway.backend_name(MODEL), servers),),
                 (SecretRef(env="K", file=None),))
    (work / "keys").write_text(gateway.keys_text([KEY]))
    (work / "models.json").write_text(gateway.models_json(gw))
    sock, log = work / "admin.sock", work / "requests.log"
    config = gateway.config_text(gw, admin_socket=str(sock), state_file=str(work / "state"),
                                 keys_file=str(work / "keys"), models_file=str(work / "models.json"))
    lines = []
    for line in config.splitlines():
        word = line.strip().split(" ")[0]
        if word in ("chroot", "user", "group", "daemon"):
            continue
        lines.append(line.replace("log /dev/log local0", f"log unix@{work}/log.sock local0"))
    (work / "haproxy.cfg").write_text("\n".join(lines) + "\n")
    syslog = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    syslog.bind(str(work / "log.sock"))
    stop = threading.Event()

    def collect() -> None:
        syslog.settimeout(0.2)
        with log.open("a") as out:
            while not stop.is_set():
                try:
                    out.write(syslog.recv(65536).decode(errors="replace") + "\n")
                    out.flush()
                except TimeoutError:
                    continue

    threading.Thread(target=collect, daemon=True).start()
    proc = subprocess.Popen([haproxy, "-db", "-f", str(work / "haproxy.cfg")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    fleet = Fleet(gw, engines, sock, log)
    try:
        for _ in range(200):
            if sock.exists() and all(fleet.state(rig) == "in" for rig in engines):
                break
            time.sleep(0.05)
        yield fleet
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        stop.set()
        for engine in fleet.engines.values():
            engine.kill()
        shutil.rmtree(work, ignore_errors=True)


@dataclass
class Load:
    """A bounded load: `total` requests, `concurrency` at once, every other one streaming."""

    total: int = 80
    concurrency: int = 4
    results: list[tuple[bool, str]] = field(default_factory=list)

    def one(self, fleet: Fleet, index: int) -> tuple[bool, str]:
        stream = index % 2 == 0
        body = json.dumps({"model": MODEL, "stream": stream, "messages": [{"role": "user", "content": "hi"}]})
        try:
            conn = http.client.HTTPConnection("127.0.0.1", fleet.gw.port, timeout=30)
            conn.request("POST", "/v1/chat/completions", body=body,
                         headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
            response = conn.getresponse()
            text = response.read().decode(errors="replace")
        except (OSError, http.client.HTTPException) as exc:
            return False, f"{type(exc).__name__}: {exc}"
        if response.status != 200:
            return False, f"HTTP {response.status}"
        if stream:
            events = [line for line in text.splitlines() if line.startswith("data: ")]
            return (events[-1:] == ["data: [DONE]"] and len(events) == CHUNKS + 1), "stream cut" \
                if not events or events[-1] != "data: [DONE]" else "stream"
        try:
            content = json.loads(text)["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError):
            return False, "empty or broken reply"
        return bool(content), "reply"

    def run(self, fleet: Fleet) -> threading.Thread:
        counter = iter(range(self.total))
        lock = threading.Lock()

        def worker() -> None:
            while True:
                with lock:
                    index = next(counter, None)
                if index is None:
                    return
                result = self.one(fleet, index)
                with lock:
                    self.results.append(result)

        workers = [threading.Thread(target=worker) for _ in range(self.concurrency)]
        for w in workers:
            w.start()

        def join() -> None:
            for w in workers:
                w.join()

        joiner = threading.Thread(target=join)
        joiner.start()
        return joiner

    @property
    def failures(self) -> list[str]:
        return [why for ok, why in self.results if not ok]


def wait_healthy(port: int) -> None:
    for _ in range(200):
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.02)


def rolling_swap(fleet: Fleet, drain: bool, said: Said) -> dict[str, list[tuple[float, float]]]:
    """Swap every engine in turn; returns rig -> (out, back) wall-clock windows (time.time())."""
    windows: dict[str, list[tuple[float, float]]] = {}
    for rig in list(fleet.engines):
        d = fleet.drain(rig) if drain else None
        port = fleet.engines[rig].server_address[1]
        if d is not None:
            d.out(said, f"http://127.0.0.1:{port}")  # type: ignore[arg-type]
        out_at = time.time()
        fleet.engines[rig].kill()
        time.sleep(DOWNTIME_S)
        fleet.engines[rig] = EngineServer(rig, port)
        wait_healthy(port)  # the gate
        if d is not None:
            back_at = time.time()  # from here the rig may get requests again
            d.back(said)  # type: ignore[arg-type]
        else:
            for _ in range(200):  # the health checks bring it back
                if fleet.state(rig) == "in":
                    break
                time.sleep(0.05)
            back_at = time.time()
        windows.setdefault(rig, []).append((out_at, back_at))
    return windows


def sent_while_out(log: Path, windows: dict[str, list[tuple[float, float]]]) -> list[str]:
    """Log lines of requests HAProxy sent to a rig inside one of its out windows. httplog's accept
    date is the request's start; a request accepted before the drain and finished by it is not one."""
    found = []
    for line in log.read_text().splitlines():
        for rig, spans in windows.items():
            if f"/{rig} " not in line or "POST" not in line:
                continue
            stamp = _accept_time(line)
            if stamp is not None and any(start <= stamp <= end for start, end in spans):
                found.append(line)
    return found


def _accept_time(line: str) -> float | None:
    import datetime as dt
    import re

    match = re.search(r"\[(\d{2}/\w{3}/\d{4}:\d{2}:\d{2}:\d{2}\.\d{3})\]", line)
    if not match:
        return None
    when = dt.datetime.strptime(match[1], "%d/%b/%Y:%H:%M:%S.%f").astimezone()
    return when.timestamp()


def measure(drain: bool, total: int = 160) -> dict[str, Any]:
    with running_fleet() as fleet:
        load, said = Load(total=total), Said()
        joiner = load.run(fleet)
        time.sleep(0.3)
        started = time.monotonic()
        windows = rolling_swap(fleet, drain, said)
        swap_s = time.monotonic() - started
        joiner.join()
        time.sleep(0.3)  # the last log lines
        logged = sum(1 for line in fleet.log.read_text().splitlines() if "POST /v1/chat/completions" in line)
        return {"drain": drain, "requests": len(load.results), "failed": len(load.failures), "logged": logged,
                "drain_s": [float(line.split(" in ")[1].split(" s")[0]) for line in said.lines if "drained" in line],
                "failures": sorted(set(load.failures)), "rolling_swap_s": round(swap_s, 2),
                "sent_while_out": len(sent_while_out(fleet.log, windows)) if drain else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    runs = [measure(drain) for _ in range(args.repeats) for drain in (True, False)]
    for run in runs:
        print(json.dumps(run))
    with_drain = [r for r in runs if r["drain"]]
    without = [r for r in runs if not r["drain"]]
    summary = {
        "failed_with_drain": [r["failed"] for r in with_drain],
        "failed_without_drain": [r["failed"] for r in without],
        "rolling_swap_s_with_drain": [r["rolling_swap_s"] for r in with_drain],
        "rolling_swap_s_without_drain": [r["rolling_swap_s"] for r in without],
    }
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"runs": runs, "summary": summary}, indent=2))


if __name__ == "__main__":
    main()
