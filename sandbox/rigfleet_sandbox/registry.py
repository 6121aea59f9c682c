"""The sandbox's registries: Debian's `docker-registry` (the Docker distribution registry).

Two instances run on SERVICE_ADDR, each with storage under the sandbox state dir:
- the fleet registry on :5000, plain HTTP (`--addr A --port P --storage DIR`);
- the stand-in upstream registry on :5443 (rigfleet_sandbox.upstream_registry), the sandbox's
  Docker Hub / nvcr.io: TLS (`--tls-cert/--tls-key`) and counted (`--upstream-log`): every
  response it sends appends a line to the upstream byte counter (rigfleet_sandbox.upstreamlog).

`python -m rigfleet_sandbox.registry ...` runs one until SIGTERM. The wrapper exists so that the
sandbox's process finder (`-m rigfleet_sandbox.*`) sees it and `down`/`up` end it like the other
host services; the registry dies with the wrapper.

The counter reads the registry's access log. In this registry (2.8) that is not the JSON log:
`log.formatter: json` shapes the application log on stderr, whose "response completed" entries
miss responses outside the /v2 API routes; the access log is the Apache combined format on
stdout, one line per response of any kind, so that is what the wrapper converts (and relays).
"""

from __future__ import annotations

import argparse
import ctypes
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO

import yaml

from rigfleet_sandbox.upstreamlog import REGISTRY_SERVER, Writer

REGISTRY_BIN = "/usr/bin/docker-registry"
_PR_SET_PDEATHSIG = 1
# 10.231.3.2 - - [06/Dec/2026:23:49:28 +0000] "GET /v2/ HTTP/1.1" 200 2 "" "docker/28.0.1 ..."
_ACCESS = re.compile(r'^(?P<client>\S+) \S+ \S+ \[[^]]*\] "(?P<method>\S+) (?P<url>\S+) [^"]*" '
                     r"(?P<status>\d{3}) (?P<sent>\d+|-)")


def config(addr: str, port: int, storage: Path, tls: tuple[Path, Path] | None = None) -> dict[str, object]:
    """The registry's config; `tls` (certificate, key) makes it the counted upstream stand-in."""
    log: dict[str, object] = {"level": "info", "fields": {"service": "rigfleet-sandbox-registry"}}
    http: dict[str, object] = {"addr": f"{addr}:{port}", "headers": {"X-Content-Type-Options": ["nosniff"]}}
    if tls:
        log = {"level": "info", "formatter": "json", "accesslog": {"disabled": False},
               "fields": {"service": "rigfleet-sandbox-registry-upstream"}}
        http["tls"] = {"certificate": str(tls[0]), "key": str(tls[1])}
    return {
        "version": 0.1,
        "log": log,
        "storage": {"filesystem": {"rootdirectory": str(storage)}, "delete": {"enabled": True}},
        "http": http,
    }


def access_record(line: str) -> tuple[str, str, str, int, int] | None:
    """(client, method, url, status, body bytes) of an access-log line; None for other lines.

    HEAD counts 0: the registry's counter includes the body its handler wrote, which Go's server
    drops for HEAD (a manifest HEAD logs the manifest's size, but none of it is sent).
    """
    match = _ACCESS.match(line)
    if match is None:
        return None
    method = match["method"]
    sent = 0 if method == "HEAD" or match["sent"] == "-" else int(match["sent"])
    return match["client"], method, match["url"], int(match["status"]), sent


def _die_with_parent() -> None:
    # a SIGKILLed wrapper must not leave an orphaned registry holding the port
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _count(stdout: IO[bytes] | None, record: Writer) -> None:
    """Relay the registry's stdout (the access log) and count each response it lists."""
    assert stdout is not None
    for raw in stdout:
        line = raw.decode(errors="replace")
        sys.stdout.write(line)
        sys.stdout.flush()
        found = access_record(line)
        if found:
            client, method, url, status, sent = found
            record(REGISTRY_SERVER, client, method, url, status, sent)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rigfleet_sandbox.registry")
    parser.add_argument("--addr", required=True)
    parser.add_argument("--port", type=int, default=5000)
    parser.add_argument("--storage", type=Path, required=True)
    parser.add_argument("--tls-cert", type=Path, help="serve HTTPS with this certificate (and --tls-key)")
    parser.add_argument("--tls-key", type=Path)
    parser.add_argument("--upstream-log", type=Path, help="count every response here (rigfleet_sandbox.upstreamlog)")
    args = parser.parse_args(argv)
    if (args.tls_cert is None) != (args.tls_key is None) or (args.upstream_log and not args.tls_cert):
        parser.error("--tls-cert and --tls-key go together; --upstream-log needs them (the upstream stand-in)")
    args.storage.mkdir(parents=True, exist_ok=True)
    conf = args.storage.parent / "registry.yml"
    tls = (args.tls_cert, args.tls_key) if args.tls_cert else None
    conf.write_text(yaml.safe_dump(config(args.addr, args.port, args.storage, tls)))
    proc = subprocess.Popen(  # noqa: PLW1509
        [REGISTRY_BIN, "serve", str(conf)],
        preexec_fn=_die_with_parent,
        stdout=subprocess.PIPE if args.upstream_log else None,
    )

    def stop(*_: object) -> None:
        proc.terminate()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        if args.upstream_log:
            _count(proc.stdout, Writer(args.upstream_log))  # until the registry closes its stdout
        return proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()


if __name__ == "__main__":
    sys.exit(main())
