"""Preflight: refuse a rig early, naming it and the fix, before anything on it is changed.

Checks: a supported platform (Ubuntu 22.04/24.04, Debian 12/13 on x86_64), Secure Boot against
a DKMS-built module, kernel headers for DKMS, free disk for images and weights, and the GPUs
nvidia-smi sees against the rig's expected count and model (when the driver already works).
Facts are read here in deploy code: all of them describe the rig before this run changes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from weakref import WeakKeyDictionary

from pyinfra import logger
from pyinfra.api import deploy
from pyinfra.context import ctx_host

from rigfleet import catalog
from rigfleet.context import RigContext
from rigfleet.facts import cache
from rigfleet.facts.docker import DockerDaemonConfig
from rigfleet.facts.nvidia import NvidiaSmi, NvidiaTopology, NvlinkStatus, has_nvlink
from rigfleet.facts.system import DiskSpace, KernelHeaders, Platform, PlatformInfo, SecureBoot
from rigfleet.operations import server as server_ops
from rigfleet.operations.ordering import role_scope
from rigfleet.schema import Rig

DOCKER_DATA_ROOT = "/var/lib/docker"  # dockerd's own default when daemon.json sets none


@dataclass(frozen=True)
class Target:
    """A supported platform: what the roles branch on (its facts are in catalog/platforms.yaml)."""

    distro: str  # ubuntu | debian
    version: str  # 22.04 | 24.04 | 12 | 13
    codename: str  # jammy | noble | bookworm | trixie
    kernel: str

    @property
    def key(self) -> str:
        return f"{self.distro}-{self.version}"

    @property
    def facts(self) -> dict[str, Any]:
        return dict(catalog.platforms()["platforms"][self.key])

    @property
    def cuda_slug(self) -> str:
        """NVIDIA's name for the distro in CUDA repository URLs: ubuntu2404, debian12."""
        return str(self.facts["cuda_slug"])

    @property
    def components(self) -> list[str]:
        """The archive components the host layer installs from."""
        return list(self.facts["components"])

    @property
    def kernel_packages(self) -> dict[str, str]:
        return dict(self.facts["kernel"])

    @property
    def driver_source(self) -> str:
        """Where the driver comes from: ubuntu-archive or cuda-repo."""
        return str(self.facts["driver"]["from"])

    @property
    def prebuilt_modules(self) -> bool:
        """The distribution ships signed prebuilt kernel modules for the driver (no DKMS needed)."""
        return bool(self.facts["driver"]["prebuilt_modules"])

    @property
    def compose_v2_from(self) -> str | None:
        """The next release's suite that Compose v2 comes from, when the distribution's is v1."""
        value = self.facts["docker_distro"].get("compose_v2_from")
        return None if value is None else str(value)


def _supported() -> dict[tuple[str, str], str]:
    return {(p["distro"], p["version"]): p["codename"] for p in catalog.platforms()["platforms"].values()}


def target_of(info: PlatformInfo) -> Target | None:
    codename = _supported().get((info.id, info.version_id))
    if codename is None or info.arch != "x86_64":
        return None
    return Target(info.id, info.version_id, codename, info.kernel)


_platforms: WeakKeyDictionary[object, PlatformInfo] = WeakKeyDictionary()


def platform() -> PlatformInfo:
    """The rig's platform, read once per host and run: every role branches on it, and deploy code
    runs before anything is executed, so it cannot have changed in between."""
    key = ctx_host.get()  # the Host object itself: a new one each run
    if key not in _platforms:
        _platforms[key] = cache.fact(Platform)
    return _platforms[key]


def target(context: RigContext) -> Target | None:
    """The rig's platform, or None when it is not supported (preflight refuses it)."""
    return target_of(platform())


def planning_reads(context: RigContext) -> list[cache.Read]:
    """What preflight reads that needs nothing read before it (in the run's first batch,
    rigfleet.roles.run_roles); the kernel headers and the disk follow from these (`assess`)."""
    return [cache.reading(cls) for cls in (Platform, SecureBoot, DockerDaemonConfig, NvidiaSmi, NvidiaTopology,
                                            NvlinkStatus)]


def uses_dkms(rig: Rig, where: Target) -> bool:
    """DKMS unless the platform ships prebuilt modules (catalog/platforms.yaml) and the rig takes them."""
    return not where.prebuilt_modules or rig.driver_install == "dkms"


def headers_metapackage(where: Target) -> str:
    """Headers that follow the distribution kernel, so DKMS also builds for the next kernel."""
    return where.kernel_packages["headers"]


def assess(context: RigContext) -> list[str]:
    """Everything that stops this rig, each with its fix; empty when it may go ahead."""
    rig = context.rig
    info = platform()
    where = target_of(info)
    if where is None:
        found = (
            f"{info.pretty_name or info.id or 'an unknown OS'} on {info.arch or 'an unknown architecture'}"
        )
        return [
            f"{found} is not supported: rigfleet needs {catalog.platforms()['supported_text']}; reinstall "
            "the rig or take it out of the inventory"
        ]
    cache.read([*_headers_read(rig, where), _disk_read(rig)])  # one round trip for the two
    problems = _secure_boot(rig, where) + _headers(rig, where) + _cdi(context, where) + _disk(rig) + _gpus(rig)
    return problems


def _secure_boot(rig: Rig, where: Target) -> list[str]:
    if not uses_dkms(rig, where) or rig.secure_boot_key_enrolled:
        return []
    state = cache.fact(SecureBoot)
    if not state.enabled:
        return []
    if where.distro == "debian":
        fix = (
            "enroll a DKMS signing key (MOK) from the rig's console, then set secure_boot_key_enrolled: "
            "true; or turn Secure Boot off in the firmware"
        )
    else:
        fix = (
            "use driver_install: prebuilt (Canonical-signed modules), or enroll a DKMS signing key (MOK) "
            "and set secure_boot_key_enrolled: true"
        )
    return [
        f"Secure Boot is enabled and the NVIDIA module would be built by DKMS and not be signed by an "
        f"enrolled key, so it would not load; {fix}"
    ]


def _headers_read(rig: Rig, where: Target) -> list[cache.Read]:
    return [cache.reading(KernelHeaders, meta=headers_metapackage(where))] if uses_dkms(rig, where) else []


def _docker_root(rig: Rig) -> str:
    configured = cache.fact(DockerDaemonConfig).config.get("data-root")
    return rig.docker_data_root or (configured if isinstance(configured, str) else DOCKER_DATA_ROOT)


def _disk_read(rig: Rig) -> cache.Read:
    # weights already in model_dir count as room; Docker's store is not measured (du is slow there)
    return cache.reading(DiskSpace, paths=[rig.model_dir, _docker_root(rig)], measured=[rig.model_dir])


def _headers(rig: Rig, where: Target) -> list[str]:
    if not uses_dkms(rig, where):
        return []
    headers = cache.fact(KernelHeaders, meta=headers_metapackage(where))
    if headers.installed or not headers.apt_lists or headers.candidate or headers.meta_candidate:
        return []
    return [
        f"DKMS needs kernel headers, and neither linux-headers-{headers.kernel} nor "
        f"{headers_metapackage(where)} is available from the configured apt sources; add the "
        "distribution's sources, or boot a distribution kernel"
    ]


def _disk(rig: Rig) -> list[str]:
    docker_root = _docker_root(rig)
    read = _disk_read(rig)
    usage = cache.fact(DiskSpace, **read.kwargs)
    problems, seen = [], set()
    for path in (rig.model_dir, docker_root):
        found = usage.get(path)
        if found is None or found.mount in seen:
            continue
        seen.add(found.mount)
        same_fs = [u for u in usage.values() if u.mount == found.mount]
        room = (found.avail_kib + sum(u.used_kib for u in same_fs)) / 1024 / 1024
        if room < rig.min_free_disk_gib:
            problems.append(
                f"{path} (filesystem {found.mount}) has {room:.0f} GiB for images and weights, "
                f"the rig needs {rig.min_free_disk_gib} GiB; free space there, or lower "
                "min_free_disk_gib"
            )
    return problems


def _gpus(rig: Rig) -> list[str]:
    smi = cache.fact(NvidiaSmi)
    if smi.status == "no_devices":
        return [
            f"the NVIDIA driver is loaded but sees no GPU (expected {rig.gpu_count}); check the cards' "
            "seating, power and PCIe slots (and `dmesg | grep -i nvrm`)"
        ]
    if not smi.ok:
        return []  # no driver yet, or a mismatch the driver role reboots away
    expected = catalog.gpus()[rig.gpu_model]["name"]
    names = [gpu.name for gpu in smi.gpus]
    problems = []
    if len(names) != rig.gpu_count:
        problems.append(
            f"nvidia-smi sees {len(names)} GPU(s), the rig expects {rig.gpu_count}; check the "
            "cards' seating and power, or set gpu_count"
        )
    wrong = sorted({name for name in names if name != expected})
    if wrong:
        problems.append(
            f"nvidia-smi sees {', '.join(wrong)}, the rig expects {expected} (gpu_model: "
            f"{rig.gpu_model}); set gpu_model to the cards the rig has"
        )
    if len(names) > 1:
        linked = has_nvlink(cache.fact(NvidiaTopology), cache.fact(NvlinkStatus), len(names))
        if rig.nvlink and not linked:
            problems.append(
                "nvlink: true, but `nvidia-smi topo -m` and `nvidia-smi nvlink --status` show no NVLink "
                "between the GPUs; fit the bridge or set nvlink: false"
            )
        if linked and not rig.nvlink:
            # not a stop: the PCIe settings work over NVLink too, only slower
            logger.warning(
                f"{rig.name}: nvlink: false, but nvidia-smi shows NVLink between the GPUs; set "
                "nvlink: true to use it (NCCL_P2P_LEVEL=NVL, custom all-reduce)"
            )
    return problems


def docker_major(rig: Rig, pinned: str | None, where: Target) -> int | None:
    """The Docker Engine major version the rig will run: the pin set's, or the distribution's."""
    distro = where.facts["docker_distro"]["docker_io_version"]
    version = pinned if rig.docker_source == "docker-ce" else distro
    return int(version.split(".")[0]) if version else None


def _cdi(context: RigContext, where: Target) -> list[str]:
    rig = context.rig
    if not rig.cdi:
        return []
    needed = catalog.platforms()["cdi_min_docker"]
    major = docker_major(rig, context.pinset.docker.version, where)
    if major is None or major >= int(needed.split(".")[0]):
        return []
    if rig.docker_source == "distro":
        found, fix = f"docker_source: distro installs Docker {major} on {where.key}", "set docker_source: docker-ce"
    else:
        found, fix = f"the pin set {context.pinset.name} pins Docker {major}", f"pin Docker {needed} or newer"
    return [f"cdi: true needs Docker {needed} or newer and {found}; {fix}, or set cdi: false"]


@deploy("Preflight")
def preflight(context: RigContext) -> None:
    with role_scope(1):
        problems = assess(context)
        if problems:
            server_ops.refuse(
                name="Refuse the rig (nothing was changed on it)", rig=context.rig.name, problems=problems
            )
