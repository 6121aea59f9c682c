"""`rigfleet init DIR`: write a minimal operator repository from the packaged skeleton."""

from __future__ import annotations

from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path

from rigfleet.errors import FLEET, InputError, Problem


def _copy(source: Traversable, target: Path, written: list[Path]) -> None:
    for entry in sorted(source.iterdir(), key=lambda e: e.name):
        if entry.name == "__pycache__":
            continue
        destination = target / entry.name
        if entry.is_dir():
            destination.mkdir(exist_ok=True)
            _copy(entry, destination, written)
        else:
            destination.write_bytes(entry.read_bytes())
            written.append(destination)


def write(directory: Path) -> list[Path]:
    """Write the skeleton into DIR (created if missing); refuse a DIR that holds anything."""
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise InputError([Problem(FLEET, "init", str(directory), "exists and is not an empty directory",
                                  "name a new or empty directory; nothing was written")])
    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    _copy(files("rigfleet") / "skeleton", directory, written)
    return written
