"""Shared helpers: inventories built in temporary directories."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import yaml

FIXTURES = Path(__file__).parent / "fixtures"
SANDBOX_TIER = Path(__file__).parent / "sandbox"
EXAMPLE = Path(__file__).resolve().parent.parent / "inventory" / "example"


# Rough minutes of each sandbox module in CI, to balance RIGFLEET_TEST_SHARD; a module not listed
# counts DEFAULT_MODULE_MINUTES. Only the balance depends on these, never a result.
SANDBOX_MODULE_MINUTES = {
    "test_fleet": 15, "test_fleet_faults": 9, "test_serving": 6, "test_serving_verify": 6,
    "test_faults": 5, "test_serving_faults": 5, "test_host_layer": 8, "test_security": 4,
    "test_image": 3, "test_serving_allowlist": 3, "test_lifecycle": 2, "test_status": 2,
    "test_hostkeys": 1, "test_host_layer_bookworm": 7, "test_host_layer_distro": 7,
    "test_monitoring": 10, "test_host_faults": 9, "test_report": 4, "test_repin_stacks": 6,
    "test_gateway": 10,
    "test_verify_faults": 5,
}
DEFAULT_MODULE_MINUTES = 5


def sandbox_shard(modules: list[str], index: int, count: int) -> set[str]:
    """The modules of shard `index` of `count`: greedy by cost, ties by name, so every process
    that asks gets the same split."""
    loads = [0] * count
    shards: list[set[str]] = [set() for _ in range(count)]
    for name in sorted(modules, key=lambda m: (-SANDBOX_MODULE_MINUTES.get(m, DEFAULT_MODULE_MINUTES), m)):
        k = loads.index(min(loads))
        shards[k].add(name)
        loads[k] += SANDBOX_MODULE_MINUTES.get(name, DEFAULT_MODULE_MINUTES)
    return shards[index]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Everything under tests/sandbox is of the sandbox tier (`make test` runs `-m sandbox` and
    `-m "not sandbox"` side by side), marked or not. With RIGFLEET_TEST_SHARD=K/N only shard K's
    sandbox modules run: `make test` runs two shards at once, each on its own sandbox instance."""
    for item in items:
        if SANDBOX_TIER in item.path.parents and not item.get_closest_marker("sandbox"):
            item.add_marker(pytest.mark.sandbox)
    shard = os.environ.get("RIGFLEET_TEST_SHARD")
    if not shard:
        return
    index, count = (int(part) for part in shard.split("/"))
    modules = sorted({item.path.stem for item in items if SANDBOX_TIER in item.path.parents})
    mine = sandbox_shard(modules, index, count)
    keep = [item for item in items if SANDBOX_TIER not in item.path.parents or item.path.stem in mine]
    dropped = [item for item in items if item not in keep]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


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
