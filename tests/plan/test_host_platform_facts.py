"""Plan-level tests of the host layer against the real distributions' facts (issue #14): Debian's
contrib, one CUDA key per release, NVLink, the kernel held with the driver, Docker CE's
rootless-extras and CDI against the Docker version."""

from __future__ import annotations

import logging

import pytest

from rigfleet.facts.apt import SourceEntry
from rigfleet.facts.nvidia import NvidiaSmiState, Topology
from rigfleet.roles.nvidia_driver import ARCHIVE_COMPONENTS
from rigfleet.schema import PackagePin
from tests.plan import scenarios
from tests.plan.fakerig import PLATFORMS, context_for, gpus_3090, plan, with_pins

APT_INSTALL = (
    'DEBIAN_FRONTEND=noninteractive apt-get -y -o Dpkg::Options::="--force-confdef" '
    '-o Dpkg::Options::="--force-confold" install --allow-change-held-packages --allow-downgrades'
)
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"


def _installs(commands: list[str]) -> list[str]:
    return [c for c in commands if c.startswith(APT_INSTALL)]


# --- 1. Debian: contrib and non-free for the driver stack ------------------------------------


@pytest.mark.parametrize("distro", ["debian-12", "debian-13"])
def test_debian_contrib_enabled_before_the_driver(distro: str) -> None:
    codename = PLATFORMS[distro].codename
    result = plan(context_for(distro), scenarios.fresh(distro))
    source = result.uploads[ARCHIVE_COMPONENTS]
    assert f"URIs: http://deb.example.org/debian\nSuites: {codename}\nComponents: contrib non-free\n" in source
    assert f"Suites: {codename}-security\nComponents: contrib non-free\nSigned-By: {KEYRING}" in source
    events = result.events
    upload = events.index(("upload", ARCHIVE_COMPONENTS))
    driver = events.index(("run", f"{APT_INSTALL} nvidia-open"))
    assert upload < driver and ("run", "apt-get update") in events[upload:driver]


def test_debian_components_only_what_is_missing_with_the_entrys_keyring() -> None:
    mirror = "http://mirror.example.invalid/debian"
    sources = [
        SourceEntry(mirror, "trixie", ("main", "contrib"), None),
        SourceEntry(mirror, "trixie", ("non-free",), None),
        SourceEntry(mirror, "trixie-updates", ("main",), "/etc/apt/keyrings/local.gpg"),
        SourceEntry("http://other.example.invalid/x", "stable", ("main",), None),
    ]
    result = plan(context_for("debian-13"), scenarios.fresh("debian-13", sources=sources))
    assert result.uploads[ARCHIVE_COMPONENTS].split("\n\n")[1:] == [
        f"Types: deb\nURIs: {mirror}\nSuites: trixie\nComponents: non-free-firmware",
        f"Types: deb\nURIs: {mirror}\nSuites: trixie-updates\n"
        "Components: contrib non-free non-free-firmware\nSigned-By: /etc/apt/keyrings/local.gpg\n",
    ]


def test_debian_components_already_there_write_nothing_and_drop_rigfleets_file() -> None:
    full = ("main", "contrib", "non-free", "non-free-firmware")
    sources = [SourceEntry("http://deb.example.org/debian", "trixie", full, KEYRING)]
    context = context_for("debian-13")
    rig = scenarios.converged(context, "debian-13", sources=sources)
    assert ARCHIVE_COMPONENTS in rig.files
    assert plan(context, rig).events == [("run", f"rm -f {ARCHIVE_COMPONENTS}")]
    rig.files.pop(ARCHIVE_COMPONENTS)
    assert plan(context, rig).events == []


def test_ubuntu_gets_no_debian_components() -> None:
    result = plan(context_for("ubuntu-24.04"), scenarios.fresh("ubuntu-24.04"))
    assert ARCHIVE_COMPONENTS not in result.uploads


# --- 2. one CUDA repository key per distro release ---------------------------------------------


@pytest.mark.parametrize(
    ("distro", "key_file", "fingerprint"),
    [
        ("debian-12", "3bf863cc.pub", "EB693B3035CD5710E231E123A4B469963BF863CC"),
        ("debian-13", "8793F200.pub", "02182E60104FCDC26EAE1B8597A5D4CB8793F200"),
    ],
)
def test_cuda_key_per_release(distro: str, key_file: str, fingerprint: str) -> None:
    slug = PLATFORMS[distro].id + PLATFORMS[distro].version_id
    result = plan(context_for(distro), scenarios.fresh(distro))
    fetch = next(c for c in result.commands if "rigfleet-cuda.gpg" in c and "curl" in c)
    assert f"https://developer.download.nvidia.com/compute/cuda/repos/{slug}/x86_64/{key_file}" in fetch
    assert f"--export {fingerprint} " in fetch


# --- 3. NVLink: the inventory against the hardware ---------------------------------------------

NVLINKED = Topology(("GPU0", "GPU1"), {"GPU0": {"GPU1": "NV4"}, "GPU1": {"GPU0": "NV4"}})
PCIE = Topology(("GPU0", "GPU1"), {"GPU0": {"GPU1": "PHB"}, "GPU1": {"GPU0": "PHB"}})


def _running(context: object, **changes: object) -> object:
    smi = NvidiaSmiState("ok", gpus_3090(scenarios.DRIVER), exit_code=0)
    return scenarios.converged(context, "debian-13", smi=smi, **changes)  # type: ignore[arg-type]


def test_nvlink_true_without_nvlink_refused() -> None:
    context = context_for("debian-13", nvlink=True)
    result = plan(context, _running(context, topology=PCIE, nvlink_status={}))  # type: ignore[arg-type]
    assert result.failed
    assert "nvlink: true, but `nvidia-smi topo -m` and `nvidia-smi nvlink --status` show no NVLink" in (
        result.commands[0]
    )


@pytest.mark.parametrize(
    ("topology", "status"), [(NVLINKED, {}), (PCIE, {0: 4, 1: 4})], ids=["topo", "nvlink-status"]
)
def test_nvlink_true_with_nvlink_goes_ahead(topology: Topology, status: dict[int, int]) -> None:
    context = context_for("debian-13", nvlink=True)
    result = plan(context, _running(context, topology=topology, nvlink_status=status))  # type: ignore[arg-type]
    assert (result.events, result.failed) == ([], False)


def test_nvlink_false_on_nvlinked_gpus_warns(caplog: pytest.LogCaptureFixture) -> None:
    context = context_for("debian-13")
    with caplog.at_level(logging.WARNING):
        result = plan(context, _running(context, topology=NVLINKED))  # type: ignore[arg-type]
    assert (result.events, result.failed) == ([], False)
    assert "rig-01: nvlink: false, but nvidia-smi shows NVLink between the GPUs" in caplog.text


# --- 4. the kernel is held with the driver -----------------------------------------------------


@pytest.mark.parametrize("distro", ["debian-12", "debian-13"])
def test_debian_kernel_image_and_headers_installed_and_held_together(distro: str) -> None:
    fresh = scenarios.fresh(distro, packages={})  # a rig without the kernel metapackage
    result = plan(context_for(distro), fresh)
    commands = result.commands
    image = commands.index(f"{APT_INSTALL} linux-image-amd64")
    headers = next(i for i, c in enumerate(commands) if c.endswith('linux-headers-amd64 "$@"'))
    assert image < headers < commands.index(f"{APT_INSTALL} nvidia-open")
    assert "apt-mark hold linux-headers-amd64 linux-image-amd64 nvidia-driver-pinning-580 nvidia-open" in (
        result.commands
    )


def test_ubuntu_modules_for_the_running_kernel_abi_held_with_the_kernel() -> None:
    result = plan(context_for("ubuntu-24.04"), scenarios.fresh("ubuntu-24.04"))
    assert any(
        c.startswith(f"{APT_INSTALL} linux-modules-nvidia-580-server-open-6.8.0-90-generic ")
        for c in result.commands
    )
    hold = next(c for c in result.commands if c.startswith("apt-mark hold linux-"))
    for name in ("linux-generic", "linux-image-generic", "linux-headers-generic",
                 "linux-modules-nvidia-580-server-open-6.8.0-90-generic"):
        assert f" {name} " in f"{hold} "


def test_ubuntu_hwe_kernel_metapackages_held() -> None:
    packages = {name: ["6.8.0.90.90"] for name in ("linux-generic-hwe-22.04", "linux-image-generic-hwe-22.04",
                                                     "linux-headers-generic-hwe-22.04")}
    result = plan(context_for("ubuntu-22.04"), scenarios.fresh("ubuntu-22.04", packages=packages))
    hold = next(c for c in result.commands if c.startswith("apt-mark hold linux-"))
    assert hold.startswith(
        "apt-mark hold linux-generic-hwe-22.04 linux-headers-generic-hwe-22.04 linux-image-generic-hwe-22.04 "
    )
    assert "linux-modules-nvidia-580-server-open-generic-hwe-22.04" in hold


# --- 5. Docker CE's rootless extras; CDI against the Docker version ----------------------------


@pytest.mark.parametrize("distro", ["debian-12", "ubuntu-24.04"])
def test_docker_ce_rootless_extras_pinned_and_held(distro: str) -> None:
    context = with_pins(context_for(distro), docker=PackagePin(version="27.5.1"))
    result = plan(context, scenarios.fresh(distro))
    docker = next(c for c in _installs(result.commands) if "docker-ce" in c)
    assert docker.endswith("'docker-ce-rootless-extras=5:27.5.1-*'")
    assert "apt-mark hold containerd.io docker-buildx-plugin docker-ce docker-ce-cli docker-ce-rootless-extras " \
        "docker-compose-plugin" in result.commands


def test_cdi_with_debian_12_distro_docker_refused() -> None:
    result = plan(context_for("debian-12", cdi=True, docker_source="distro"), scenarios.fresh("debian-12"))
    assert result.failed and len(result.events) == 1
    assert (
        "cdi: true needs Docker 25.0 or newer and docker_source: distro installs Docker 20 on debian-12; "
        "set docker_source: docker-ce, or set cdi: false"
    ) in result.commands[0]


def test_cdi_with_an_old_pinned_docker_ce_refused() -> None:
    context = with_pins(context_for("debian-13", cdi=True), docker=PackagePin(version="24.0.9"))
    result = plan(context, scenarios.fresh("debian-13"))
    assert result.failed
    assert "the pin set test pins Docker 24; pin Docker 25.0 or newer, or set cdi: false" in result.commands[0]


@pytest.mark.parametrize(("distro", "source"), [("debian-13", "distro"), ("debian-12", "docker-ce")])
def test_cdi_with_docker_25_or_newer_goes_ahead(distro: str, source: str) -> None:
    result = plan(context_for(distro, cdi=True, docker_source=source), scenarios.fresh(distro))
    assert not result.failed
