"""Real Debian Packages indexes, fetched through the machine's own apt mirror (read from its apt
sources, never written down here) and cached, for checking the stand-ins against the archive."""

from __future__ import annotations

import glob
import lzma
import os
import re
import urllib.request
from pathlib import Path

CACHE = Path(os.environ.get("RIGFLEET_DEBIAN_INDEX_CACHE", Path.home() / ".cache" / "rigfleet" / "debian-index"))


def debian_mirror(etc: Path = Path("/etc/apt")) -> str:
    """The first Debian archive URI in the machine's apt sources (deb822 or one-line)."""
    files = [str(etc / "sources.list"), *sorted(glob.glob(str(etc / "sources.list.d" / "*")))]
    for path in files:
        if not (path.endswith(".list") or path.endswith(".sources")) or not os.path.isfile(path):
            continue
        text = Path(path).read_text(encoding="utf-8", errors="replace")
        for uri in re.findall(r"^\s*URIs:\s*(\S+)", text, re.M) + re.findall(
            r"^\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)", text, re.M
        ):
            if uri.rstrip("/").endswith("/debian"):
                return uri.rstrip("/")
    raise RuntimeError("no Debian archive in the machine's apt sources (/etc/apt); add one to run this check")


def apt_hosts(etc: Path = Path("/etc/apt")) -> frozenset[str]:
    """Every host the machine's apt sources name: the mirrors the sandbox's proxy may forward to."""
    files = [str(etc / "sources.list"), *sorted(glob.glob(str(etc / "sources.list.d" / "*")))]
    hosts: set[str] = set()
    for path in files:
        if os.path.isfile(path):
            text = Path(path).read_text(encoding="utf-8", errors="replace")
            hosts.update(h.lower() for h in re.findall(r"https?://([A-Za-z0-9.-]+)", text))
    return frozenset(hosts - {"localhost"})


def packages_index(suite: str, component: str, mirror: str | None = None) -> dict[str, dict[str, str]]:
    """Package name -> control fields (the highest version when several), from the real index."""
    cached = CACHE / f"{suite}_{component}_Packages"
    if not cached.is_file():
        url = f"{mirror or debian_mirror()}/dists/{suite}/{component}/binary-amd64/Packages.xz"
        with urllib.request.urlopen(url, timeout=120) as resp:  # noqa: S310 - the apt mirror
            data = lzma.decompress(resp.read())
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(".partial")
        tmp.write_bytes(data)
        tmp.replace(cached)
    return parse_index(cached.read_text(encoding="utf-8", errors="replace"))


def parse_index(text: str) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        key = ""
        for line in stanza.splitlines():
            if line[:1] in (" ", "\t") and key:
                fields[key] += "\n" + line
            elif ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if "Package" in fields:
            out.setdefault(fields["Package"], fields)  # the index lists the newest first per name
    return out
