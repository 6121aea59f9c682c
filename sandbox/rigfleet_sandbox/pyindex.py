"""The Python package index hosts this machine's pip uses: the only HTTPS the sandbox's proxy tunnels.

Read from pip itself, the way debindex.apt_hosts reads the apt sources: `pip config list` (pip.conf
files and PIP_* environment variables alike) for index-url and extra-index-url; when no index-url
is configured, pip's own default index and the host it serves files from. Local indexes (file://,
plain paths) need no tunnel.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import urllib.parse
from collections.abc import Iterable, Mapping

HostPort = tuple[str, int]
_DEFAULT_PORTS = {"https": 443, "http": 80}


def parse_config_list(text: str) -> dict[str, list[str]]:
    """`pip config list` output (`section.key='value'` lines) -> key -> its values.

    pip prints the files first and the PIP_* variables (`:env:`) last; the later setting of a key
    replaces the earlier one, as it does in pip."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        name, sep, raw = line.partition("=")
        if not sep or "." not in name:
            continue
        key = name.rsplit(".", 1)[1].strip().replace("_", "-")
        try:
            value = ast.literal_eval(raw.strip())
        except (ValueError, SyntaxError):
            value = raw.strip()
        found[key] = str(value).split()
    return found


def hosts_of(urls: Iterable[str]) -> frozenset[HostPort]:
    """(host, port) of every network URL; file:// URLs and paths are skipped."""
    out: set[HostPort] = set()
    for url in urls:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme in _DEFAULT_PORTS and parts.hostname:
            try:
                port = parts.port or _DEFAULT_PORTS[parts.scheme]
            except ValueError:
                continue
            out.add((parts.hostname.lower(), port))
    return frozenset(out)


def pip_default_hosts() -> frozenset[HostPort]:
    """pip's built-in index and its file host, as pip itself names them (none if pip hides them)."""
    try:
        from pip._internal.models.index import PyPI
    except ImportError:
        return frozenset()
    return hosts_of([PyPI.url, f"https://{PyPI.file_storage_domain}/"])


def index_hosts(config: Mapping[str, list[str]], default: frozenset[HostPort]) -> frozenset[HostPort]:
    """The hosts pip would fetch from under `config`: its index-url (else `default`) and extras."""
    chosen = config.get("index-url")
    base = hosts_of(chosen) if chosen else default
    return base | hosts_of(config.get("extra-index-url", []))


def python_index_hosts(python: str = sys.executable, environ: Mapping[str, str] | None = None) -> frozenset[HostPort]:
    """The index hosts of this machine's pip configuration (pip.conf files and PIP_* variables)."""
    env = dict(os.environ if environ is None else environ)
    proc = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True, env=env,
                          timeout=60, check=False)
    return index_hosts(parse_config_list(proc.stdout), pip_default_hosts())
