"""Where rigfleet's own files are: resolved from the package, never from the CWD."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent
CATALOG_DIR = PACKAGE_DIR / "catalog"
TEMPLATES_DIR = REPO_ROOT / "templates"
INVENTORIES_DIR = REPO_ROOT / "inventory"
DEFAULT_INVENTORY = INVENTORIES_DIR / "sandbox"


def inventory_dir() -> Path:
    """The inventory both `pyinfra inventory.py deploy.py` and the CLI use."""
    chosen = os.environ.get("RIGFLEET_INVENTORY")
    return Path(chosen).expanduser().resolve() if chosen else DEFAULT_INVENTORY
