"""The sandbox's fleet registry: Debian's `docker-registry` (the Docker distribution registry)
on 10.231.0.1:5000, plain HTTP, storage under the sandbox state dir.

`python -m rigfleet_sandbox.registry --addr A --port P --storage DIR` runs it until SIGTERM.
The wrapper exists so that the sandbox's process finder (`-m rigfleet_sandbox.*`) sees it and
`down`/`up` end it like the other host services; the registry dies with the wrapper.
"""

from __future__ import annotations

import argparse
import ctypes
import signal
import subprocess
import sys
from pathlib import Path

import yaml

REGISTRY_BIN = "/usr/bin/docker-registry"
_PR_SET_PDEATHSIG = 1


def config(addr: str, port: int, storage: Path) -> dict[str, object]:
    return {
        "version": 0.1,
        "log": {"level": "info", "fields": {"service": "rigfleet-sandbox-registry"}},
        "storage": {"filesystem": {"rootdirectory": str(storage)}, "delete": {"enabled": True}},
        "http": {"addr": f"{addr}:{port}", "headers": {"X-Content-Type-Options": ["nosniff"]}},
    }


def _die_with_parent() -> None:
    # a SIGKILLed wrapper must not leave an orphaned registry holding the port
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rigfleet_sandbox.registry")
    parser.add_argument("--addr", required=True)
    parser.add_argument("--port", type=int, default=5000)
    parser.add_argument("--storage", type=Path, required=True)
    args = parser.parse_args(argv)
    args.storage.mkdir(parents=True, exist_ok=True)
    conf = args.storage.parent / "registry.yml"
    conf.write_text(yaml.safe_dump(config(args.addr, args.port, args.storage)))
    proc = subprocess.Popen([REGISTRY_BIN, "serve", str(conf)], preexec_fn=_die_with_parent)  # noqa: PLW1509

    def stop(*_: object) -> None:
        proc.terminate()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        return proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()


if __name__ == "__main__":
    sys.exit(main())
