"""Roles: one @deploy function per layer, each fed by the validated RigContext.

`run_roles` is THE role loop: `pyinfra deploy.py` (rigfleet.deploy), the fleet commands
(rigfleet.runner) and every partial deploy (a role subset) go through it.
"""

from collections.abc import Callable, Sequence
from typing import Any

from rigfleet.roles.api_firewall import api_firewall
from rigfleet.roles.api_firewall import planning_reads as api_firewall_reads
from rigfleet.roles.apt_base import apt_base
from rigfleet.roles.container_toolkit import container_toolkit
from rigfleet.roles.docker_engine import docker_engine
from rigfleet.roles.fleet_cache import fleet_cache
from rigfleet.roles.gateway import gateway_role
from rigfleet.roles.gpu_tuning import gpu_tuning
from rigfleet.roles.model_weights import model_weights
from rigfleet.roles.model_weights import planning_reads as model_weights_reads
from rigfleet.roles.monitor import monitor
from rigfleet.roles.node_exporter import node_exporter
from rigfleet.roles.nvidia_driver import nvidia_driver
from rigfleet.roles.preflight import planning_reads as preflight_reads
from rigfleet.roles.preflight import preflight
from rigfleet.roles.serving import serving
from rigfleet.roles.vllm_image import planning_reads as vllm_image_reads
from rigfleet.roles.vllm_image import vllm_image

# In layer order. The host layer: preflight, fleet_cache (apt-cacher-ng on the `cache` group),
# apt_base, nvidia_driver, docker_engine, container_toolkit, gpu_tuning; then model_weights,
# vllm_image, api_firewall (the DOCKER-USER allowlist, before a release can listen), serving; the
# gateway (on its host only); then monitoring: node_exporter (every rig) and monitor (Prometheus,
# on the `monitor` group).
HOST_LAYER: list[Callable[..., Any]] = [
    preflight,
    fleet_cache,
    apt_base,
    nvidia_driver,
    docker_engine,
    container_toolkit,
    gpu_tuning,
]
ROLES: list[Callable[..., Any]] = [*HOST_LAYER, model_weights, vllm_image, api_firewall, serving, gateway_role,
                                   node_exporter, monitor]


# deploy code that reads facts before it adds operations: what it reads, read in one round trip
# before the roles run (rigfleet.facts.cache; a fact left out here is only read on its own)
PLANNING_READS: dict[Callable[..., Any], Callable[[Any], list[Any]]] = {
    preflight: preflight_reads,
    model_weights: model_weights_reads,
    vllm_image: vllm_image_reads,
    api_firewall: api_firewall_reads,
}


def run_roles(context: Any, roles: Sequence[Callable[..., Any]] | None = None) -> None:
    """Call each role (default: all of ROLES, in layer order) for the rig pyinfra is on now.

    host.loop gives each role its own place in pyinfra's operation order: without it, operations
    of two roles called from this one line could share an identity and tangle the order.
    After planning, the facts the added operations will read are read in one command
    (rigfleet.facts.cache): on a converged rig they answer every operation's "no change".
    """
    from pyinfra import host

    from rigfleet.facts import cache

    chosen = list(ROLES if roles is None else roles)
    cache.attach(host.state)  # a rig's facts are read again once something was executed there
    cache.read([read for role in chosen if role in PLANNING_READS for read in PLANNING_READS[role](context)])
    for role in host.loop(chosen):
        role(context)
    cache.read_wanted()  # what the operations will read, in one round trip
