"""NVIDIA driver: branch-pinned and held, open kernel module by default, nouveau blacklisted, and a
reboot only when the driver needs one.

- Ubuntu: Canonical's signed prebuilt modules (`linux-modules-nvidia-<br>-server[-open]-<flavour>`)
  with the no-DKMS user space, or DKMS (`nvidia-headless-<br>-server[-open]`) per driver_install.
- Debian: NVIDIA's CUDA repository (keyring checked by fingerprint, deb822 source), the branch (or
  exact-version) pinning package first, then `nvidia-open` (open) or `cuda-drivers` (proprietary).
"""

from __future__ import annotations

from pyinfra.api import deploy
from pyinfra.facts.deb import DebPackages

from rigfleet import catalog, render
from rigfleet.context import RigContext
from rigfleet.facts import cache
from rigfleet.operations import apt as apt_ops
from rigfleet.operations import files as files_ops
from rigfleet.operations import server as server_ops
from rigfleet.operations.ordering import role_scope
from rigfleet.roles.preflight import Target, headers_metapackage, target, uses_dkms
from rigfleet.schema import AptRepo, DriverPin, Rig

CUDA_KEYRING = "/etc/apt/keyrings/rigfleet-cuda.gpg"
NOUVEAU_CONF = "/etc/modprobe.d/rigfleet-blacklist-nouveau.conf"
ARCHIVE_COMPONENTS = "/etc/apt/sources.list.d/rigfleet-debian-components.sources"
# driver packages held through these globs (dependencies the metapackages pulled in)
DEBIAN_HOLD = [
    "nvidia-*",
    "libnvidia-*",
    "libcuda*",
    "libnvcuvid*",
    "libnvoptix*",
    "cuda-drivers*",
    "firmware-nvidia-*",  # the open module's GSP firmware, versioned with the driver
]
# the toolkit is held by its own role; kernel-ABI module packages must follow the kernel
HOLD_EXCLUDE = [
    "nvidia-container-*",
    "libnvidia-container*",
    "linux-modules-nvidia-*",
    "linux-objects-nvidia-*",
    "linux-signatures-nvidia-*",
]


def cuda_repo(rig: Rig, where: Target) -> AptRepo:
    """The rig's CUDA mirror, else NVIDIA's repository for this distro."""
    if rig.cuda_repo is not None:
        return rig.cuda_repo
    cuda = catalog.repos()["cuda"]
    url = cuda["url_template"].format(distro=where.cuda_slug)
    key = cuda["keys"][where.cuda_slug]  # each release's repository has its own signing key
    return AptRepo(url=url, key_url=key["key_url"], key_fingerprint=key["fingerprint"])


def pinned(package: str, version: str | None) -> str:
    """`pkg=<version>-*`: apt's version glob over the packaging revision (580.95.05-1, -0ubuntu1)."""
    return f"{package}={version}-*" if version else package


def ubuntu_flavour(installed: dict[str, list[str]]) -> str:
    """The kernel flavour the modules must follow: generic, or generic-hwe-<release> on HWE kernels."""
    for name in sorted(installed):
        for prefix in ("linux-generic-hwe-", "linux-image-generic-hwe-"):
            if name.startswith(prefix):
                return f"generic-hwe-{name.removeprefix(prefix)}"
    return "generic"


def ubuntu_kernel(flavour: str) -> list[str]:
    """The metapackages that pull each new kernel ABI of the rig's flavour: held with the driver."""
    return [f"linux-{flavour}", f"linux-image-{flavour}", f"linux-headers-{flavour}"]


def ubuntu_packages(rig: Rig, pin: DriverPin, where: Target) -> tuple[list[str], list[str]]:
    """(install specs, names to hold) from the Ubuntu archive."""
    flavour = "-open" if rig.driver_module == "open" else ""
    branch = f"{pin.branch}-server"
    utils = f"nvidia-utils-{branch}"
    kernel_flavour = ubuntu_flavour(cache.fact(DebPackages))
    if uses_dkms(rig, where):
        userspace = f"nvidia-headless-{branch}{flavour}"
        specs = [pinned(userspace, pin.version), pinned(utils, pin.version)]
        return specs, [userspace, utils]
    userspace = f"nvidia-headless-no-dkms-{branch}{flavour}"
    # Canonical builds these per kernel ABI: the one for the running kernel, and the flavour's
    # metapackage, held together with the kernel metapackages so neither moves alone
    modules = f"linux-modules-nvidia-{branch}{flavour}-{kernel_flavour}"
    abi_modules = f"linux-modules-nvidia-{branch}{flavour}-{where.kernel}"
    specs = [abi_modules, modules, pinned(userspace, pin.version), pinned(utils, pin.version)]
    return specs, [abi_modules, modules, userspace, utils]


def kernel_holds(where: Target) -> list[str]:
    """Kernel metapackages held with the driver: the kernel moves only with a rigfleet converge."""
    if where.distro == "debian":
        return [where.kernel_packages["image"], where.kernel_packages["headers"]]
    installed = cache.fact(DebPackages)
    return [name for name in ubuntu_kernel(ubuntu_flavour(installed)) if name in installed]


@deploy("NVIDIA driver")
def nvidia_driver(context: RigContext) -> None:
    with role_scope(3):
        where = target(context)
        if where is None:
            return  # preflight refuses this rig
        rig, pin = context.rig, context.pinset.driver
        gpu_name = catalog.gpus()[rig.gpu_model]["name"]

        files_ops.config_file(
            name="Blacklist nouveau",
            dest=NOUVEAU_CONF,
            content=render.render("modprobe/rigfleet-blacklist-nouveau.conf.j2"),
        )
        if where.distro == "debian":
            apt_ops.archive_components(
                name="Debian archive: contrib and non-free for the driver stack",
                dest=ARCHIVE_COMPONENTS,
                codename=where.codename,
                components=where.components,
            )
        if uses_dkms(rig, where):
            meta = headers_metapackage(where)
            if where.distro == "ubuntu":
                meta = f"linux-headers-{ubuntu_flavour(cache.fact(DebPackages))}"
            if where.distro == "debian":
                # image and headers metapackages together: DKMS builds for the kernel that boots
                apt_ops.install(
                    name="Kernel image metapackage (held with the driver)",
                    packages=[where.kernel_packages["image"]],
                )
            apt_ops.kernel_headers(name="Kernel headers for DKMS", meta=meta)

        if where.driver_source == "ubuntu-archive":
            specs, held = ubuntu_packages(rig, pin, where)
            apt_ops.install(name="NVIDIA driver (Ubuntu archive)", packages=specs)
            apt_ops.hold(
                name="Hold the driver packages and the kernel they were built for",
                packages=held + kernel_holds(where),
                patterns=[f"*nvidia*-{pin.branch}-server", f"*nvidia*-{pin.branch}-server-*"],
                exclude=HOLD_EXCLUDE,
            )
        else:
            repo = cuda_repo(rig, where)
            slug = f"cuda-{where.cuda_slug}-x86_64"
            apt_ops.vendor_repository(
                name="CUDA repository: key checked by fingerprint, deb822 source",
                description="NVIDIA CUDA repository",
                repo=repo,
                keyring=CUDA_KEYRING,
                stem=f"/etc/apt/sources.list.d/{slug}",  # the cuda-keyring package's list is {slug}.list
            )
            pinning = f"nvidia-driver-pinning-{pin.version or pin.branch}"
            driver = "nvidia-open" if rig.driver_module == "open" else "cuda-drivers"
            apt_ops.install(name="Driver version lock first", packages=[pinning])
            apt_ops.install(
                name=f"NVIDIA driver ({driver}, CUDA repository)", packages=[pinned(driver, pin.version)]
            )
            apt_ops.hold(
                name="Hold the driver packages and the kernel they were built for",
                packages=[pinning, driver, *kernel_holds(where)],
                patterns=DEBIAN_HOLD,
                exclude=HOLD_EXCLUDE,
            )

        # after the driver: its packages may rebuild the initramfs themselves (then this is a check)
        server_ops.initramfs(name="Initramfs without nouveau", holds=NOUVEAU_CONF)
        server_ops.driver_reboot(
            name="Reboot if the driver needs it, then check the GPUs",
            expected_gpus=rig.gpu_count,
            gpu_name=gpu_name,
        )
