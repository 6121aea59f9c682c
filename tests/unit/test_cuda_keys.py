"""One CUDA repository signing key per distro release (issue #14, point 2): the key NVIDIA's
repository for that release is signed with, checked by its full fingerprint."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from rigfleet import catalog
from rigfleet.roles.nvidia_driver import cuda_repo
from rigfleet.roles.preflight import Target

# the supported platforms (catalog/platforms.yaml) and NVIDIA's name for each in repository URLs
PLATFORMS = {"ubuntu-22.04": ("ubuntu", "22.04", "jammy", "ubuntu2204"),
             "ubuntu-24.04": ("ubuntu", "24.04", "noble", "ubuntu2404"),
             "debian-12": ("debian", "12", "bookworm", "debian12"),
             "debian-13": ("debian", "13", "trixie", "debian13")}


def repo_for(key: str) -> tuple[str, str]:
    distro, version, codename, _ = PLATFORMS[key]
    where = Target(distro, version, codename, "6.1.0")
    repo = cuda_repo(SimpleNamespace(cuda_repo=None), where)  # type: ignore[arg-type]
    return repo.key_url, repo.key_fingerprint


@pytest.mark.parametrize("key", sorted(PLATFORMS))
def test_every_release_has_its_key_under_its_own_repository(key: str) -> None:
    slug = PLATFORMS[key][3]
    key_url, fingerprint = repo_for(key)
    assert re.fullmatch(r"[0-9A-F]{40}", fingerprint), fingerprint
    directory, _, name = key_url.rpartition("/")
    assert f"{directory}/" == catalog.repos()["cuda"]["url_template"].format(distro=slug)
    # NVIDIA names the key file after the key's short id: the file and the fingerprint are one key
    assert name.removesuffix(".pub").upper() == fingerprint[-8:], (name, fingerprint)


@pytest.mark.parametrize(
    ("key", "short_id"),
    [("ubuntu-22.04", "3BF863CC"), ("ubuntu-24.04", "3BF863CC"), ("debian-12", "3BF863CC"),
     ("debian-13", "8793F200")],
)
def test_the_key_each_release_is_signed_with(key: str, short_id: str) -> None:
    key_url, fingerprint = repo_for(key)
    assert fingerprint.endswith(short_id) and key_url.upper().endswith(f"/{short_id}.PUB")


def test_the_platform_list_is_the_catalogs() -> None:
    platforms = catalog.platforms()["platforms"]
    assert {k: (p["distro"], p["version"], p["codename"], p["cuda_slug"]) for k, p in platforms.items()} == PLATFORMS


def test_debian_13_does_not_get_debian_12s_key() -> None:
    assert repo_for("debian-13")[1] == "02182E60104FCDC26EAE1B8597A5D4CB8793F200"
    assert repo_for("debian-13") != repo_for("debian-12")
