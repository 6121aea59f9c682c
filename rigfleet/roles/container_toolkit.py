"""NVIDIA Container Toolkit: NVIDIA's repository (keyring checked by fingerprint), all four
packages at one version and held, the nvidia runtime registered only when it is missing, optional
CDI, then a GPU smoke container."""

from __future__ import annotations

from pyinfra.api import deploy

from rigfleet import catalog
from rigfleet.context import RigContext
from rigfleet.facts import cache
from rigfleet.facts.docker import DockerRuntimes
from rigfleet.operations import apt as apt_ops
from rigfleet.operations import docker as docker_ops
from rigfleet.operations import systemd as systemd_ops
from rigfleet.operations.ordering import role_scope
from rigfleet.roles.preflight import target
from rigfleet.schema import AptRepo, Rig

TOOLKIT_KEYRING = "/etc/apt/keyrings/rigfleet-nvidia-container-toolkit.gpg"
TOOLKIT_SOURCES = "/etc/apt/sources.list.d/nvidia-container-toolkit"
# all four at one version: a partial pin does not resolve (nvidia-container-toolkit #1142)
TOOLKIT = [
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
    "libnvidia-container-tools",
    "libnvidia-container1",
]
LOCAL_SMOKE_IMAGE = "rigfleet/smoke:local"


def toolkit_repo(rig: Rig) -> AptRepo:
    if rig.toolkit_repo is not None:
        return rig.toolkit_repo
    return AptRepo(**catalog.repos()["toolkit"])


def first_of_registry(context: RigContext) -> str:
    """The rig that puts the smoke image into the fleet registry: the first in the inventory of
    those with this rig's registry and smoke image (in one run of several fresh rigs it pulls the
    image alone; the others then take its copy)."""
    rig = context.rig
    return next(r.name for r in context.fleet.rigs
                if (r.registry, r.smoke_image) == (rig.registry, rig.smoke_image))


def nvidia_registered() -> bool:
    return "nvidia" in (cache.fact(DockerRuntimes) or [])


@deploy("NVIDIA Container Toolkit")
def container_toolkit(context: RigContext) -> None:
    with role_scope(5):
        if target(context) is None:
            return  # preflight refuses this rig
        rig = context.rig
        repo = toolkit_repo(rig)
        apt_ops.vendor_repository(
            name="Toolkit repository: key checked by fingerprint, deb822 source",
            description="NVIDIA Container Toolkit repository",
            repo=repo,
            keyring=TOOLKIT_KEYRING,
            stem=TOOLKIT_SOURCES,
        )
        version = context.pinset.toolkit.version
        installed = apt_ops.install(
            name="NVIDIA Container Toolkit",
            packages=[f"{name}={version}-*" if version else name for name in TOOLKIT],
        )
        apt_ops.hold(name="Hold the toolkit packages", packages=TOOLKIT)

        runtime = docker_ops.nvidia_runtime(
            name="Register the nvidia runtime with Docker (if missing)", cdi=rig.cdi
        )
        # dockerd registers --gpus support only if the toolkit's hook was in PATH when it started
        cache.want(DockerRuntimes)  # read by the condition at execution
        systemd_ops.service(
            name="Restart Docker for the toolkit",
            service="docker.service",
            running=True,
            restarted=True,
            _if=lambda: installed.did_change() or runtime.did_change() or not nvidia_registered(),
        )
        if rig.cdi:
            docker_ops.cdi_spec(name="CDI spec for the GPUs")

        image = rig.smoke_image
        if image == "local":
            docker_ops.local_image(
                name="Smoke image from the rig's own root filesystem", tag=LOCAL_SMOKE_IMAGE
            )
            image = LOCAL_SMOKE_IMAGE
        elif rig.registry and docker_ops.fleet_copy(image, rig.registry):
            if first_of_registry(context) == rig.name:
                # this rig's copy is in the fleet registry before the others' shared operation
                # below starts (pyinfra runs it on them all once this one has ended everywhere)
                docker_ops.smoke_image_pulled(
                    name=f"Smoke image {image} into the fleet registry (the first of its rigs)",
                    image=image, registry=rig.registry,
                )
            docker_ops.smoke_image_pulled(
                name=f"Smoke image {image} through the fleet registry", image=image, registry=rig.registry
            )
        docker_ops.gpu_smoke(name="GPU smoke container", image=image, expected_gpus=rig.gpu_count)
