"""Host services the SIMULATED rigs reach at 10.231.0.1 (run by `rigfleet sandbox up`).

- :3142 an HTTP forward proxy for apt (absolute http:// GETs) to Debian mirrors only, caching
  .deb files on disk (they never change under one name), plus CONNECT tunnels to the Python
  index hosts this machine's pip is configured with (rigfleet_sandbox.pyindex) so pip in a rig
  works; anything else gets 403. Rigs have no NAT: this is their only way out.
  It also forwards http:// requests for the www server below (a rig's way out reaches the
  fleet's own mirrors too: a fleet cache on a rig downloads them through it).
- :8080 a static file server for the sandbox www dir (simulated NVIDIA apt repo, simulated
  Genesis git repo over dumb HTTP, overlays, weights, base image), filled by other modules.

Both count what they send: one line per response in the access log (--access-log,
rigfleet_sandbox.upstreamlog), the stand-in upstream's byte counter.

`python -m rigfleet_sandbox.services --addr A --www DIR --cache DIR` runs both until SIGTERM.
Stdlib only: threads per connection are plenty for a handful of rigs.
"""

from __future__ import annotations

import argparse
import functools
import http.client
import logging
import os
import selectors
import shutil
import signal
import socket
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from rigfleet_sandbox.debindex import apt_hosts
from rigfleet_sandbox.pyindex import HostPort, python_index_hosts
from rigfleet_sandbox.upstreamlog import Writer

log = logging.getLogger("rigfleet_sandbox.services")

APT_HOSTS = apt_hosts()  # the mirrors this machine's own apt sources name
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "proxy-connection",
        "keep-alive",
        "proxy-authorization",
        "proxy-authenticate",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
_CHUNK = 64 * 1024
UPSTREAM_TIMEOUT = 60


class AptProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # apt keeps connections alive and pipelines requests
    server_version = "rigfleet-sandbox-proxy"
    cache_dir: Path = Path("/var/cache/rigfleet/apt-proxy")
    connect_allow: frozenset[HostPort] = frozenset()  # (host, port) pip may tunnel to; set by serve()
    www: HostPort | None = None  # the host's own www server, which it also forwards to; set by serve()
    record: Writer = Writer(None)

    def setup(self) -> None:
        super().setup()
        self.upstreams: dict[str, http.client.HTTPConnection] = {}

    def log_message(self, format: str, *args: Any) -> None:
        log.info("proxy %s %s", self.client_address[0], format % args)

    def refuse(self, code: int, why: str) -> None:
        body = f"rigfleet sandbox proxy: {why}\n".encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        sent = 0
        if self.command != "HEAD":
            self.wfile.write(body)
            sent = len(body)
        self.count(code, sent)

    def count(self, status: int, sent: int, hit: bool = False) -> None:
        server = "tunnel" if self.command == "CONNECT" else "proxy"
        self.record(server, self.client_address[0], self.command, self.path, status, sent, hit)

    # -- CONNECT: pip's HTTPS through an allowlisted tunnel --------------------------------
    def do_CONNECT(self) -> None:
        host, _, port = self.path.rpartition(":")
        if (host.lower(), int(port) if port.isdigit() else 0) not in self.connect_allow:
            self.close_connection = True
            return self.refuse(403, f"CONNECT to {self.path} is not allowed (only pip's configured index hosts)")
        try:
            upstream = socket.create_connection((host, int(port)), timeout=UPSTREAM_TIMEOUT)
        except OSError as exc:
            self.close_connection = True
            return self.refuse(502, f"cannot reach {self.path}: {exc}")
        self.send_response(200, "Connection established")
        self.end_headers()
        self.close_connection = True
        self.count(200, _relay(self.connection, upstream))

    # -- GET/HEAD of absolute http:// URLs to Debian mirrors -------------------------------
    def do_GET(self) -> None:
        self._forward()

    def do_HEAD(self) -> None:
        self._forward()

    def _forward(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        host = (url.hostname or "").lower()
        if url.scheme != "http" or not host:
            return self.refuse(400, "this is a forward proxy: request absolute http:// URLs")
        port = url.port or 80
        if (host not in APT_HOSTS or port != 80) and (host, port) != self.www:
            return self.refuse(403, f"{host} is not an allowed Debian mirror")
        path = url.path or "/"
        target = path + (f"?{url.query}" if url.query else "")
        # only the distribution's .debs: the www server's are on this machine already
        cached = _cache_file(self.cache_dir, host, path) if path.endswith(".deb") and host in APT_HOSTS else None
        if cached and cached.is_file():
            return self._send_cached(cached)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP | {"host"}}
        try:
            resp = self._upstream(host, port, self.command, target, headers)
        except (OSError, http.client.HTTPException) as exc:
            return self.refuse(502, f"upstream {host} failed: {exc}")
        self._relay_response(resp, cached if resp.status == 200 and self.command == "GET" else None)

    def _upstream(self, host: str, port: int, method: str, target: str, headers: dict[str, str]) -> Any:
        key = f"{host}:{port}"
        for attempt in (1, 2):  # a kept-alive upstream connection may have been closed meanwhile
            conn = self.upstreams.get(key) or http.client.HTTPConnection(host, port, timeout=UPSTREAM_TIMEOUT)
            self.upstreams[key] = conn
            try:
                conn.request(method, target, headers=headers)
                return conn.getresponse()
            except (OSError, http.client.HTTPException):
                conn.close()
                self.upstreams.pop(key, None)
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _relay_response(self, resp: Any, cache_to: Path | None) -> None:
        length = resp.getheader("Content-Length")
        body: bytes | None = None
        if length is None and self.command != "HEAD" and resp.status not in (204, 304):
            body = resp.read()  # chunked upstream: buffer (index files), then send with a length
            length = str(len(body))
        self.send_response(resp.status, resp.reason)
        for key, value in resp.getheaders():
            if key.lower() not in _HOP_BY_HOP | {"content-length"}:
                self.send_header(key, value)
        if length is not None:
            self.send_header("Content-Length", length)
        self.end_headers()
        if self.command == "HEAD" or resp.status in (204, 304):
            resp.read()
            return self.count(resp.status, 0)
        if body is not None:
            self.wfile.write(body)
            return self.count(resp.status, len(body))
        tmp = None
        if cache_to is not None:
            cache_to.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache_to.with_name(f".{cache_to.name}.{threading.get_ident()}.part")
        written = 0
        with open(tmp, "wb") if tmp else _NullFile() as sink:
            while chunk := resp.read(_CHUNK):
                self.wfile.write(chunk)
                sink.write(chunk)
                written += len(chunk)
        if tmp and cache_to:
            # Cache only complete downloads; a cut transfer must not poison later installs.
            if written == int(length or -1):
                os.replace(tmp, cache_to)
            else:
                tmp.unlink(missing_ok=True)
        self.count(resp.status, written)

    def _send_cached(self, path: Path) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/vnd.debian.binary-package")
        self.send_header("Content-Length", str(path.stat().st_size))
        self.send_header("X-Rigfleet-Cache", "hit")
        self.end_headers()
        sent = 0
        if self.command == "GET":
            with open(path, "rb") as fh:
                shutil.copyfileobj(fh, self.wfile, _CHUNK)
            sent = path.stat().st_size
        self.count(200, sent, hit=True)


class _NullFile:
    def write(self, _data: bytes) -> None:
        pass

    def __enter__(self) -> _NullFile:
        return self

    def __exit__(self, *_exc: object) -> None:
        pass


def _cache_file(cache_dir: Path, host: str, path: str) -> Path | None:
    parts = [p for p in urllib.parse.unquote(path).split("/") if p]
    if not parts or any(p in (".", "..") for p in parts):
        return None
    return cache_dir.joinpath(host, *parts)


def _relay(a: socket.socket, b: socket.socket) -> int:
    """Relay both ways until either side closes; the bytes sent from b to a."""
    sel = selectors.DefaultSelector()
    sel.register(a, selectors.EVENT_READ, b)
    sel.register(b, selectors.EVENT_READ, a)
    to_a = 0
    try:
        while True:
            for key, _ in sel.select(timeout=300):
                data = key.fileobj.recv(_CHUNK)  # type: ignore[union-attr]
                if not data:
                    return to_a
                key.data.sendall(data)
                if key.data is a:
                    to_a += len(data)
    except OSError:
        return to_a
    finally:
        sel.close()
        b.close()


class WwwHandler(SimpleHTTPRequestHandler):
    server_version = "rigfleet-sandbox-www"
    record: Writer = Writer(None)

    def log_message(self, format: str, *args: Any) -> None:
        log.info("www %s %s", self.client_address[0], format % args)

    def send_response(self, code: int, message: str | None = None) -> None:
        self.status = code
        super().send_response(code, message)

    def copyfile(self, source: Any, outputfile: Any) -> None:
        start = source.tell()
        super().copyfile(source, outputfile)
        self.sent += source.tell() - start

    def handle_one_request(self) -> None:
        self.status, self.sent = 0, 0
        super().handle_one_request()
        if self.status:
            self.record("www", self.client_address[0], self.command, self.path, self.status, self.sent)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def serve(addr: str, www: Path, cache: Path, proxy_port: int = 3142, www_port: int = 8080,
          access_log: Path | None = None) -> None:
    www.mkdir(parents=True, exist_ok=True)
    cache.mkdir(parents=True, exist_ok=True)
    AptProxyHandler.cache_dir = cache
    AptProxyHandler.connect_allow = python_index_hosts()
    AptProxyHandler.www = (addr, www_port)
    AptProxyHandler.record = WwwHandler.record = Writer(access_log)
    servers = [
        _Server((addr, proxy_port), AptProxyHandler),
        _Server((addr, www_port), functools.partial(WwwHandler, directory=str(www))),
    ]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for t in threads:
        t.start()
    log.info(
        "serving apt proxy on %s:%d and www %s on %s:%d (for the simulated rigs)",
        addr,
        proxy_port,
        www,
        addr,
        www_port,
    )
    stop.wait()
    log.info("stopping")
    for s in servers:
        s.shutdown()
        s.server_close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rigfleet_sandbox.services")
    parser.add_argument("--addr", required=True)
    parser.add_argument("--www", type=Path, required=True)
    parser.add_argument("--cache", type=Path, required=True)
    parser.add_argument("--proxy-port", type=int, default=3142)
    parser.add_argument("--www-port", type=int, default=8080)
    parser.add_argument("--access-log", type=Path, default=None, help="the byte counter (upstreamlog)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(asctime)s sandbox-services %(message)s")
    serve(args.addr, args.www, args.cache, args.proxy_port, args.www_port, args.access_log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
