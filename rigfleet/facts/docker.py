"""Facts about Docker: the daemon.json on disk and the runtimes the running daemon knows."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Any

from pyinfra.api import FactBase
from typing_extensions import override

DAEMON_JSON = "/etc/docker/daemon.json"


@dataclass(frozen=True)
class DaemonConfig:
    """A parsed daemon.json. `exists` False: no file; `error` set: the file is not valid JSON."""

    exists: bool
    config: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def parse_daemon_json(lines: list[str]) -> DaemonConfig:
    if not lines or lines[0].strip() == "absent":
        return DaemonConfig(False)
    text = "\n".join(lines[1:]) if lines[0].strip() == "present" else "\n".join(lines)
    if not text.strip():
        return DaemonConfig(True)  # an empty file: nothing configured yet
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        return DaemonConfig(True, error=f"not valid JSON: {exc}")
    if not isinstance(data, dict):
        return DaemonConfig(True, error="the top level is not a JSON object")
    return DaemonConfig(True, data)


class DockerDaemonConfig(FactBase[DaemonConfig]):
    @override
    def command(self, path: str = DAEMON_JSON) -> str:
        quoted = shlex.quote(path)
        return f"if [ -f {quoted} ]; then echo present; cat {quoted}; else echo absent; fi"

    @override
    @staticmethod
    def default() -> DaemonConfig:
        return DaemonConfig(False)

    @override
    def process(self, output: list[str]) -> DaemonConfig:
        return parse_daemon_json(output)


def parse_runtimes(lines: list[str]) -> list[str] | None:
    """`docker info --format '{{json .Runtimes}}'` then `rc=N`; None when the daemon did not answer."""
    lines = [line for line in lines if line.strip()]
    if not lines or lines[-1].strip() != "rc=0":
        return None
    try:
        data = json.loads("\n".join(lines[:-1]))
    except json.JSONDecodeError:
        return None
    return sorted(data) if isinstance(data, dict) else None


class DockerRuntimes(FactBase["list[str] | None"]):
    """Runtimes registered in the running dockerd (None: no docker, or the daemon is down)."""

    @override
    def command(self) -> str:
        return (
            "if command -v docker >/dev/null 2>&1; then "
            "docker info --format '{{json .Runtimes}}' 2>/dev/null; echo rc=$?; else echo rc=absent; fi"
        )

    @override
    def process(self, output: list[str]) -> list[str] | None:
        return parse_runtimes(output)


class DockerImagePresent(FactBase[bool]):
    """Whether an image is in the local store (False also when docker is absent or down)."""

    @override
    def command(self, image: str) -> str:
        quoted = shlex.quote(image)
        return (
            f"if command -v docker >/dev/null 2>&1 && docker image inspect {quoted} >/dev/null 2>&1; "
            "then echo yes; else echo no; fi"
        )

    @override
    @staticmethod
    def default() -> bool:
        return False

    @override
    def process(self, output: list[str]) -> bool:
        return bool(output) and output[0].strip() == "yes"
