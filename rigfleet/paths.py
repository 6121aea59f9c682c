"""Where rigfleet's own data is (inside the package) and which inventory a command works on."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
CATALOG_DIR = PACKAGE_DIR / "catalog"


def inventory_dir() -> Path:
    """The inventory both `pyinfra inventory.py deploy.py` and the CLI use: RIGFLEET_INVENTORY."""
    chosen = os.environ.get("RIGFLEET_INVENTORY")
    return Path(chosen).expanduser().resolve() if chosen else Path("inventory").resolve()
