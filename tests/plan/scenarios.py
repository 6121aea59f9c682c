"""Rig states for the plan tests: fresh, converged, and variations of converged."""

from __future__ import annotations

import json
from typing import Any

from rigfleet.context import RigContext
from rigfleet.facts.nvidia import NvidiaSmiState
from rigfleet.operations.docker import SMOKE_STAMP
from tests.plan.fakerig import PLATFORMS, FakeRig, gpus_3090, plan

DRIVER = "580.95.05"
TOOLKIT = "1.18.0-1"
FINGERPRINTS = {
    "/etc/apt/keyrings/rigfleet-cuda.gpg": "EB693B3035CD5710E231E123A4B469963BF863CC",
    "/etc/apt/keyrings/rigfleet-docker.gpg": "9DC858229FC7DD38854AE2D88D81803C0EBFCD88",
    "/etc/apt/keyrings/rigfleet-nvidia-container-toolkit.gpg": "C95B321B61E88C1809C4F759DDCAE044F796ECB0",
}
# NVIDIA signs each release's CUDA repository with its own key (catalog/repos.yaml)
CUDA_KEYS = {"debian-13": "02182E60104FCDC26EAE1B8597A5D4CB8793F200"}
# what `nvidia-ctk runtime configure --runtime=docker` adds to daemon.json
NVIDIA_RUNTIME = {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}
RUNTIMES = ["io.containerd.runc.v2", "nvidia", "runc"]


# what the distribution's installer leaves: the kernel flavour's metapackages
UBUNTU_KERNEL = ("linux-generic", "linux-image-generic", "linux-headers-generic")
KERNEL_METAS = {
    "ubuntu-22.04": dict.fromkeys(UBUNTU_KERNEL, "5.15.0.131.130"),
    "ubuntu-24.04": dict.fromkeys(UBUNTU_KERNEL, "6.8.0.90.90"),
    "debian-12": {"linux-image-amd64": "6.1.158-1"},
    "debian-13": {"linux-image-amd64": "6.12.57-1"},
}


def fresh(distro: str, **changes: Any) -> FakeRig:
    """A bare install: no driver, no Docker, no rigfleet files."""
    packages = {name: [version] for name, version in KERNEL_METAS[distro].items()}
    return FakeRig(PLATFORMS[distro], headers_installed=False, packages=packages).with_(**changes)


def docker_versions(distro: str, source: str) -> dict[str, str]:
    platform = PLATFORMS[distro]
    if source == "docker-ce":
        suffix = f"{platform.id}.{platform.version_id}~{platform.codename}"
        return {
            "docker-ce": f"5:28.3.3-1~{suffix}",
            "docker-ce-cli": f"5:28.3.3-1~{suffix}",
            "containerd.io": "1.7.27-1",
            "docker-buildx-plugin": f"0.26.1-1~{suffix}",
            "docker-compose-plugin": f"2.39.1-1~{suffix}",
            "docker-ce-rootless-extras": f"5:28.3.3-1~{suffix}",
        }
    return {
        "ubuntu-22.04": {
            "docker.io": "27.5.1-0ubuntu3~22.04.2",
            "docker-compose-v2": "2.24.6-0ubuntu1~22.04.1",
            "docker-buildx": "0.21.3-0ubuntu1~22.04.1",
        },
        "ubuntu-24.04": {
            "docker.io": "27.5.1-0ubuntu3~24.04.2",
            "docker-compose-v2": "2.33.1+ds1-0ubuntu1~24.04.1",
            "docker-buildx": "0.21.3-0ubuntu1~24.04.1",
        },
        "debian-12": {"docker.io": "20.10.24+dfsg1-1+deb12u1+b6", "docker-compose": "2.26.1-4"},
        "debian-13": {
            "docker.io": "26.1.5+dfsg1-9+deb13u1+b1",
            "docker-cli": "26.1.5+dfsg1-9+deb13u1+b1",
            "docker-compose": "2.26.1-4",
            "docker-buildx": "0.13.1+ds1-3",
        },
    }[distro]


def driver_packages(context: RigContext, distro: str) -> dict[str, str]:
    rig = context.rig
    if distro.startswith("ubuntu"):
        release = PLATFORMS[distro].version_id
        deb = f"{DRIVER}-0ubuntu0.{release}.1"
        flavour = "-open" if rig.driver_module == "open" else ""
        packages = {
            "nvidia-utils-580-server": deb,
            "libnvidia-compute-580-server": deb,
            "nvidia-kernel-common-580-server": deb,
        }
        if rig.driver_install == "dkms":
            packages |= {
                f"nvidia-headless-580-server{flavour}": deb,
                f"nvidia-dkms-580-server{flavour}": deb,
                "linux-headers-generic": "6.8.0.90.90",
            }
        else:
            packages |= {
                f"nvidia-headless-no-dkms-580-server{flavour}": deb,
                f"linux-modules-nvidia-580-server{flavour}-generic": "6.8.0-90.91+1",
                f"linux-modules-nvidia-580-server{flavour}-{PLATFORMS[distro].kernel}": "6.8.0-90.91+1",
            }
        return packages | KERNEL_METAS[distro] | {"linux-headers-generic": KERNEL_METAS[distro]["linux-generic"]}
    deb = f"{DRIVER}-1"
    driver = "nvidia-open" if rig.driver_module == "open" else "cuda-drivers"
    return {
        "nvidia-driver-pinning-580": deb,
        driver: deb,
        "nvidia-kernel-open-dkms": deb,
        "nvidia-driver-cuda": deb,
        "libnvidia-compute": deb,
        "linux-headers-amd64": KERNEL_METAS[distro]["linux-image-amd64"],
    } | KERNEL_METAS[distro]


def held_packages(packages: dict[str, str]) -> list[str]:
    # the kernel metapackages and Canonical's modules for that kernel are held with the driver
    skip = ("ca-certificates", "curl", "gpg")
    return sorted(name for name in packages if not name.startswith(skip))


def converged(context: RigContext, distro: str, **changes: Any) -> FakeRig:
    """The rig after a successful deploy: what `fresh` plus that deploy's plan leaves behind."""
    rig = context.rig
    start = fresh(distro)
    written = dict(plan(context, start).uploads)
    staged = written.pop("/etc/docker/daemon.json.rigfleet-new")
    daemon = json.loads(staged)
    daemon["runtimes"] = NVIDIA_RUNTIME  # added by nvidia-ctk during the deploy
    written["/etc/docker/daemon.json"] = json.dumps(daemon, indent=4, sort_keys=True) + "\n"
    docker = docker_versions(distro, rig.docker_source)
    packages = {"ca-certificates": "20250419", "curl": "8.14.1-2", "gpg": "2.4.7-21"}
    packages |= driver_packages(context, distro) | docker
    packages |= {
        name: TOOLKIT
        for name in (
            "nvidia-container-toolkit",
            "nvidia-container-toolkit-base",
            "libnvidia-container-tools",
            "libnvidia-container1",
        )
    }
    engine = docker.get("docker-ce") or docker["docker.io"]
    image = "rigfleet/smoke:local" if rig.smoke_image == "local" else rig.smoke_image
    written[SMOKE_STAMP] = f"image={image} driver={DRIVER} toolkit={TOOLKIT} docker={engine}\n"
    keyrings = {
        path: [CUDA_KEYS.get(distro, fpr) if "cuda" in path else fpr]
        for path, fpr in FINGERPRINTS.items()
        if distro.startswith("debian") or "cuda" not in path
    }
    state = start.with_(
        headers_installed=True,
        smi=NvidiaSmiState("ok", gpus_3090(DRIVER, persistence=True, limit=290.0), exit_code=0),
        packages={name: [version] for name, version in packages.items()},
        held=held_packages(packages),
        files=written,
        keyrings=keyrings,
        services={"docker.service": (True, True), "rigfleet-gpu-tuning.service": (True, True)},
        runtimes=list(RUNTIMES),
        images={"rigfleet/smoke:local"} if rig.smoke_image == "local" else set(),
    )
    return state.with_(**changes)


def mismatched(context: RigContext, distro: str) -> FakeRig:
    """Converged, then the driver's user space moved behind rigfleet's back: NVML refuses until a reboot."""
    healthy = converged(context, distro, boot_id="99999999-8888-7777-6666-555555555555")
    smi = NvidiaSmiState(
        "mismatch",
        exit_code=18,
        message="Failed to initialize NVML: Driver/library version mismatch",
        nvml_version="580.95",
    )
    return converged(context, distro, smi=smi, after_reboot=healthy)
