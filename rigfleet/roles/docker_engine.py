"""Docker Engine from Docker's repository (docker_source: docker-ce) or the distribution
(docker_source: distro), held, with Compose v2; daemon.json merged, never overwritten.

Compose v2 with docker_source: distro: Ubuntu has docker-compose-v2 and Debian 13 has
docker-compose 2.x, but Debian 12 has only Compose v1 (docker-compose 1.29, no `docker compose`),
in main and in backports. There it comes from Debian 13's docker-compose package (a static CLI
plugin that needs only libc >= 2.34): a trixie source pinned so that nothing else comes from it.
"""

from __future__ import annotations

from typing import Any

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.apt import AptSources

from rigfleet import catalog, render
from rigfleet.context import RigContext
from rigfleet.facts import cache
from rigfleet.operations import apt as apt_ops
from rigfleet.operations import docker as docker_ops
from rigfleet.operations import files as files_ops
from rigfleet.operations import systemd as systemd_ops
from rigfleet.operations.ordering import role_scope
from rigfleet.roles.preflight import Target, target
from rigfleet.schema import AptRepo, Rig

DOCKER_KEYRING = "/etc/apt/keyrings/rigfleet-docker.gpg"
DEBIAN_ARCHIVE_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
# docker-ce-rootless-extras is a Recommends of docker-ce: installed and held with the rest, or an
# upgrade would move it alone (https://docs.docker.com/engine/install/debian/)
DOCKER_CE = [
    "docker-ce",
    "docker-ce-cli",
    "containerd.io",
    "docker-buildx-plugin",
    "docker-compose-plugin",
    "docker-ce-rootless-extras",
]
# same version string as docker-ce (5:28.3.3-1~debian.12~bookworm)
DOCKER_CE_VERSIONED = ("docker-ce", "docker-ce-cli", "docker-ce-rootless-extras")
# Docker's install guide: packages that conflict with Docker CE
CONFLICTS = [
    "docker.io",
    "docker-doc",
    "docker-compose",
    "docker-compose-v2",
    "podman-docker",
    "containerd",
    "runc",
]
# what rigfleet owns in daemon.json (every other key is left as it is)
LOG_ROTATION = {"log-driver": "json-file", "log-opts": {"max-size": "100m", "max-file": "5"}}


def docker_repo(rig: Rig, where: Target) -> AptRepo:
    if rig.docker_repo is not None:
        return rig.docker_repo
    docker = catalog.repos()["docker"]
    return AptRepo(
        url=docker[where.distro]["url"],
        key_url=docker[where.distro]["key_url"],
        key_fingerprint=docker["key_fingerprint"],
    )


def daemon_settings(rig: Rig) -> dict[str, Any]:
    # live-restore: restarting dockerd (a toolkit change) does not stop the serving container
    settings: dict[str, Any] = {**LOG_ROTATION, "live-restore": True}
    if rig.docker_data_root:
        settings["data-root"] = rig.docker_data_root
    if rig.registry and rig.registry_insecure:
        # rigfleet owns this key: a plain-HTTP fleet registry must be named or Docker refuses it
        settings["insecure-registries"] = [rig.registry]
    return settings


def debian_mirror() -> str:
    """The Debian archive the rig already uses (its mirror or proxy path), for the trixie source."""
    sources = [repo for repo in cache.fact(AptSources) if "main" in repo.components]
    for repo in sources:
        if repo.distribution == "bookworm":
            return str(repo.url)
    if not sources:
        raise ValueError(f"{host.name}: no Debian archive with 'main' in the rig's apt sources; add one")
    return str(sources[0].url)


def _docker_ce(context: RigContext, where: Target) -> list[str]:
    repo = docker_repo(context.rig, where)
    apt_ops.absent(name="Remove packages that conflict with Docker CE", packages=CONFLICTS)
    apt_ops.vendor_repository(
        name="Docker repository: key checked by fingerprint, deb822 source",
        description="Docker CE repository",
        repo=repo,
        keyring=DOCKER_KEYRING,
        stem="/etc/apt/sources.list.d/docker",
        suite=where.codename,
        components=["stable"],
        architectures=["amd64"],
    )
    apt_ops.install(name="Docker CE", packages=docker_ce_specs(context.pinset.docker.version))
    return DOCKER_CE


def docker_ce_specs(version: str | None) -> list[str]:
    """apt specs of Docker CE at the pin set's version (all of it at the newest without one)."""
    # Docker CE versions carry epoch 5: 5:28.3.3-1~debian.12~bookworm
    return [f"{name}=5:{version}-*" if version and name in DOCKER_CE_VERSIONED else name for name in DOCKER_CE]


def _distro(where: Target) -> list[str]:
    packages = list(where.facts["docker_distro"]["packages"])
    if where.compose_v2_from is not None:
        files_ops.config_file(
            name="Debian 13 source for Compose v2 only",
            dest="/etc/apt/sources.list.d/rigfleet-trixie-compose.sources",
            content=render.render(
                "apt/rigfleet-repo.sources.j2",
                description="Debian 13, for docker-compose (Compose v2) only",
                url=debian_mirror(),
                suite=where.compose_v2_from,
                components=["main"],
                architectures=["amd64"],
                keyring=DEBIAN_ARCHIVE_KEYRING,
            ),
        )
        files_ops.config_file(
            name="Take nothing but docker-compose from Debian 13",
            dest="/etc/apt/preferences.d/rigfleet-compose-from-trixie.pref",
            content=render.render("apt/rigfleet-compose-from-trixie.pref.j2"),
        )
    apt_ops.install(name="Docker from the distribution", packages=packages)
    return packages


@deploy("Docker Engine")
def docker_engine(context: RigContext) -> None:
    with role_scope(4):
        where = target(context)
        if where is None:
            return  # preflight refuses this rig
        packages = _docker_ce(context, where) if context.rig.docker_source == "docker-ce" else _distro(where)
        apt_ops.hold(name="Hold the Docker packages", packages=packages)

        merged = docker_ops.daemon_json(
            name="Merge rigfleet's settings into daemon.json", settings=daemon_settings(context.rig)
        )
        systemd_ops.service(
            name="Docker enabled and running", service="docker.service", running=True, enabled=True
        )
        systemd_ops.service(
            name="Restart Docker for the new daemon.json",
            service="docker.service",
            running=True,
            restarted=True,
            _if=merged.did_change,
        )
