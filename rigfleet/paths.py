"""Where rigfleet's own data is (inside the package) and which inventory a command works on.

There is no built-in default inventory. In order, the first that applies wins:
1. `rigfleet -i DIR` (or an entry file that selected one: see rigfleet.inventory);
2. the RIGFLEET_INVENTORY environment variable;
3. the directory an operator repo's own inventory.py names (its ./inventory);
4. ./inventory when it holds a hosts.yml (the layout `rigfleet init` writes);
otherwise the command stops with one line saying how to name one.
"""

from __future__ import annotations

import os
from pathlib import Path

from rigfleet.errors import FLEET, InputError, Problem

PACKAGE_DIR = Path(__file__).resolve().parent
CATALOG_DIR = PACKAGE_DIR / "catalog"
ENV = "RIGFLEET_INVENTORY"
HOW_TO_NAME = (f"set {ENV}=DIR or pass `rigfleet -i DIR` (a directory with hosts.yml), or work in an "
               "operator repo with ./inventory/hosts.yml (`rigfleet init DIR` writes one)")

_selected: Path | None = None


def select(directory: Path | str | None) -> None:
    """Fix the inventory for the rest of this process (`-i DIR`, or an entry file's choice)."""
    global _selected
    _selected = Path(directory).expanduser().resolve() if directory is not None else None


def inventory_dir(default: Path | str | None = None) -> Path:
    """The inventory the CLI, `pyinfra inventory.py deploy.py` and the roles all use."""
    if _selected is not None:
        return _selected
    chosen = os.environ.get(ENV)
    if chosen:
        return Path(chosen).expanduser().resolve()
    if default is not None:
        return Path(default).expanduser().resolve()
    here = Path("inventory")
    if (here / "hosts.yml").is_file():
        return here.resolve()
    raise InputError([Problem(FLEET, "inventory", None, "no inventory given", HOW_TO_NAME)])
