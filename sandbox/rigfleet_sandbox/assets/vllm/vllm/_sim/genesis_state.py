"""Which Genesis text patches are on disk in this (SIMULATED) vllm package.

The stand-in Genesis `apply_all` replaces anchors in this package's files with marker lines
`# [Genesis <ID> <genesis-version>] <title>`; the engine reads them back here.
"""

from __future__ import annotations

import re
from pathlib import Path

import vllm

MARKER_RE = re.compile(r"#\s*\[Genesis (P\w+) ([^\]\s]+)\]")


def package_dir() -> Path:
    return Path(vllm.__file__).resolve().parent


def markers_in(relpath: str) -> set[str]:
    try:
        text = (package_dir() / relpath).read_text(encoding="utf-8")
    except OSError:
        return set()
    return {m.group(1) for m in MARKER_RE.finditer(text)}


def all_markers() -> dict[str, str]:
    """Patch id -> file (relative to the package) for every marker outside the Genesis tree."""
    found: dict[str, str] = {}
    root = package_dir()
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("_genesis/"):
            continue
        for patch_id in markers_in(rel):
            found.setdefault(patch_id, rel)
    return found


def genesis_installed() -> bool:
    return (package_dir() / "_genesis" / "patches" / "apply_all.py").is_file()
