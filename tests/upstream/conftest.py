"""The real upstream artifacts: vLLM release wheels from the package index (through pip, once per
run, only the parser's sources kept) and the real Genesis/SNDR tree from the shared mirror bundle."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from rigfleet.schema import MirrorMap
from rigfleet.upstream import sources

REPO = Path(__file__).resolve().parents[2]
# The mirror of what this machine cannot download (see the project README): ../shared/mirror
MIRROR_CANDIDATES = [os.environ.get("RIGFLEET_SHARED_MIRROR", ""), str(REPO.parent / "shared" / "mirror"),
                     "/work/shared/mirror"]
TREE_SOURCE = "https://github.com/Sandermage/genesis-vllm-patches.git"
# The releases the shipped pin sets need (a nightly stands on its nearest release): three wheels.
RELEASES = ("0.20.2rc1.dev9+g01d4d1ad3", "0.23.1rc1.dev424+g3f5a1e173", "0.27.1")


def shared_mirror() -> Path:
    for candidate in MIRROR_CANDIDATES:
        if candidate and (Path(candidate) / "genesis-vllm-patches.bundle").is_file():
            return Path(candidate)
    pytest.fail("the shared mirror (genesis-vllm-patches.bundle) is missing: set RIGFLEET_SHARED_MIRROR")


def _cache_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache that outlives the run where the machine allows it (CI keeps /var/cache between steps)."""
    chosen = os.environ.get("RIGFLEET_TEST_UPSTREAM_CACHE")
    if chosen:
        return Path(chosen)
    var = Path("/var/cache/rigfleet-test")
    try:
        var.mkdir(parents=True, exist_ok=True)
        if os.access(var, os.W_OK):
            return var / "upstream"
    except OSError:
        pass
    return tmp_path_factory.getbasetemp() / "upstream-cache"


@pytest.fixture(scope="session")
def _real_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = _cache_root(tmp_path_factory)
    old = os.environ.get(sources.CACHE_ENV)
    os.environ[sources.CACHE_ENV] = str(root)
    try:
        for version in RELEASES:  # downloads what is not cached yet; keeps only the derivation
            sources.vllm_surface(version, MirrorMap(), online=True)
        yield root
    finally:
        if old is None:
            os.environ.pop(sources.CACHE_ENV, None)
        else:
            os.environ[sources.CACHE_ENV] = old


@pytest.fixture
def real_upstream_cache(_real_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(sources.CACHE_ENV, str(_real_cache))
    return _real_cache


@pytest.fixture
def mirrors() -> MirrorMap:
    return MirrorMap(prefixes={TREE_SOURCE: str(shared_mirror() / "genesis-vllm-patches.bundle")})


@pytest.fixture
def real_inventory(tmp_path: Path, mirrors: MirrorMap) -> Path:
    """The shipped example inventory, its mirror map pointed at the shared mirror."""
    target = tmp_path / "inventory"
    shutil.copytree(REPO / "inventory" / "example", target)
    (target / "mirrors.yml").write_text(
        f"prefixes:\n  {TREE_SOURCE}: {mirrors.prefixes[TREE_SOURCE]}\n", encoding="utf-8")
    return target
