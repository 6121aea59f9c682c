"""Shared helpers: inventories built in temporary directories."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

FIXTURES = Path(__file__).parent / "fixtures"
EXAMPLE = Path(__file__).resolve().parent.parent / "inventory" / "example"


def write_yaml(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")


@pytest.fixture
def example_inventory(tmp_path: Path) -> Path:
    """A private copy of inventory/example that a test may break."""
    target = tmp_path / "inventory"
    shutil.copytree(EXAMPLE, target)
    return target


@pytest.fixture
def golden_inventory() -> Path:
    return FIXTURES / "inventories" / "golden"
