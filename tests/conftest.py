"""Shared helpers: inventories built in temporary directories."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import yaml

# `make test` runs the sandbox tier on two xdist workers, gw0 and gw1: each boots its own sandbox
# instance (rigfleet_sandbox.layout reads this at import). A value set by the caller wins.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER.startswith("gw") and _WORKER[2:].isdigit():
    os.environ.setdefault("RIGFLEET_SANDBOX_INSTANCE", _WORKER[2:])

FIXTURES = Path(__file__).parent / "fixtures"
SANDBOX_TIER = Path(__file__).parent / "sandbox"
EXAMPLE = Path(__file__).resolve().parent.parent / "inventory" / "example"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Everything under tests/sandbox is of the sandbox tier (`make test` runs `-m sandbox` and
    `-m "not sandbox"` side by side), marked or not."""
    for item in items:
        if SANDBOX_TIER in item.path.parents and not item.get_closest_marker("sandbox"):
            item.add_marker(pytest.mark.sandbox)


@pytest.fixture(autouse=True)
def _private_upstream_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
                            request: pytest.FixtureRequest) -> None:
    """Upstream derivations are cached per user: tests must not see (or fill) the operator's cache.
    tests/upstream brings its own cache of the real artifacts."""
    if "real_upstream_cache" not in request.fixturenames:
        monkeypatch.setenv("RIGFLEET_UPSTREAM_CACHE", str(tmp_path_factory.getbasetemp() / "no-upstream-cache"))


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
