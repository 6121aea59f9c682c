"""The driver facts the host layer branches on come from catalog/platforms.yaml, not role code."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from rigfleet import catalog
from rigfleet.roles.preflight import Target, uses_dkms


@pytest.mark.parametrize("key", sorted(catalog.platforms()["platforms"]))
def test_every_platform_names_its_driver_source_with_a_public_page(key: str) -> None:
    driver = catalog.platforms()["platforms"][key]["driver"]
    assert driver["from"] in ("ubuntu-archive", "cuda-repo")
    assert isinstance(driver["prebuilt_modules"], bool)
    assert str(driver["source"]).startswith("https://")


def target(facts: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Target:
    monkeypatch.setattr(Target, "facts", property(lambda self: facts))
    return Target("somedistro", "1", "some", "6.1.0")


def test_dkms_follows_the_catalog_not_the_distro_name(monkeypatch: pytest.MonkeyPatch) -> None:
    prebuilt = {"driver": {"from": "cuda-repo", "prebuilt_modules": True}, "docker_distro": {}}
    where = target(prebuilt, monkeypatch)
    assert not uses_dkms(SimpleNamespace(driver_install="prebuilt"), where)  # type: ignore[arg-type]
    assert uses_dkms(SimpleNamespace(driver_install="dkms"), where)  # type: ignore[arg-type]
    where = target({"driver": {"from": "cuda-repo", "prebuilt_modules": False}, "docker_distro": {}}, monkeypatch)
    assert uses_dkms(SimpleNamespace(driver_install="prebuilt"), where)  # type: ignore[arg-type]
    assert where.driver_source == "cuda-repo" and where.compose_v2_from is None


def test_the_shipped_platforms_keep_their_driver_paths() -> None:
    platforms = catalog.platforms()["platforms"]
    assert {k: (p["driver"]["from"], p["driver"]["prebuilt_modules"]) for k, p in platforms.items()} == {
        "ubuntu-22.04": ("ubuntu-archive", True), "ubuntu-24.04": ("ubuntu-archive", True),
        "debian-12": ("cuda-repo", False), "debian-13": ("cuda-repo", False)}
    assert Target("debian", "12", "bookworm", "6.1.0").compose_v2_from == "trixie"
    assert Target("debian", "13", "trixie", "6.12.0").compose_v2_from is None
