"""The byte counter of the sandbox's stand-in upstream (rigfleet_sandbox.services, .registry).

Every response the host services send (the apt proxy's relayed and cached files, its CONNECT
tunnels to the Python index, the www server's files: the SIMULATED vendor repositories, base
images, overlays, weights; the stand-in upstream container registry's manifests and layers, see
rigfleet_sandbox.upstream_registry) appends one JSON line to logs/upstream.jsonl: which server,
the client address, the URL, the status and the body bytes sent. The fleet registry is not
upstream and is not counted. Rigs have no other way out, so the sum of a rig's lines is what
that rig pulled from "upstream". The tests and the bench read it back here.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from rigfleet_sandbox.layout import LOG_DIR

LOG = LOG_DIR / "upstream.jsonl"
REGISTRY_SERVER = "registry-upstream"  # the server name of the stand-in upstream registry's lines
_lock = threading.Lock()


class Writer:
    """Appends records from the services' handler threads (one line per write, under a lock)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path

    def __call__(self, server: str, client: str, method: str, url: str, status: int, sent: int,
                 hit: bool = False) -> None:
        if self.path is None:
            return
        line = json.dumps({"t": round(time.time(), 3), "server": server, "client": client, "method": method,
                           "url": url, "status": status, "bytes": sent, "hit": hit})
        with _lock, open(self.path, "a", encoding="utf-8") as out:
            out.write(line + "\n")


@dataclass(frozen=True)
class Mark:
    """A position in the log: records after it are what happened since."""

    offset: int


def mark(path: Path = LOG) -> Mark:
    return Mark(path.stat().st_size if path.is_file() else 0)


def records(path: Path = LOG, since: Mark | None = None) -> list[dict[str, object]]:
    if not path.is_file():
        return []
    with open(path, "rb") as src:
        src.seek(since.offset if since else 0)
        return [json.loads(line) for line in src.read().splitlines() if line.strip()]


def kind(record: dict[str, object]) -> str:
    """package (.deb), index (apt's other files), python (the CONNECT tunnel to the Python index:
    wheels and index pages, TLS, not told apart; and the host's own PEP 503 index, www/simple/),
    image (base image tarballs; all the stand-in upstream container registry sent), other (weights,
    overlays, the Genesis git repo, keys)."""
    url = str(record["url"]).split("?", 1)[0]
    if record["server"] == REGISTRY_SERVER:
        return "image"  # manifests, configs and layers alike: all of a `docker pull`
    if record["server"] == "tunnel" or "/simple/" in url:
        return "python"
    if url.endswith(".deb"):
        return "package"
    if "/images/" in url and url.endswith(".tar"):
        return "image"
    if url.endswith(("/key.asc", "/gpg")):
        return "other"  # repository keys, fetched by curl, not apt
    if record["server"] == "proxy" or any(part in url for part in ("/dists/", "/nvidia/", "/docker/")):
        return "index"
    return "other"


def pulled(entries: Iterable[dict[str, object]], clients: Iterable[str]) -> dict[str, int]:
    """Body bytes sent to `clients`, by kind (every kind present, 0 when none)."""
    wanted = set(clients)
    totals = dict.fromkeys(("package", "index", "python", "image", "other"), 0)
    for record in entries:
        if record["client"] in wanted:
            totals[kind(record)] += int(str(record["bytes"]))
    return totals


def files(entries: Iterable[dict[str, object]], clients: Iterable[str], of_kind: str = "package") -> set[str]:
    """The file names (last URL segment) of `of_kind` sent to `clients` with a body."""
    wanted = set(clients)
    return {unquote(str(r["url"]).split("?", 1)[0].rsplit("/", 1)[-1]) for r in entries
            if r["client"] in wanted and kind(r) == of_kind and int(str(r["bytes"])) > 0}
