"""Roles: one @deploy function per layer, each fed by the validated RigContext."""

from collections.abc import Callable
from typing import Any

from roles.apt_base import apt_base
from roles.container_toolkit import container_toolkit
from roles.docker_engine import docker_engine
from roles.gpu_tuning import gpu_tuning
from roles.model_weights import model_weights
from roles.nvidia_driver import nvidia_driver
from roles.preflight import preflight
from roles.serving import serving
from roles.vllm_image import vllm_image

# In layer order. The host layer: preflight, apt_base, nvidia_driver, docker_engine,
# container_toolkit, gpu_tuning; then model_weights, vllm_image, serving.
HOST_LAYER: list[Callable[..., Any]] = [
    preflight,
    apt_base,
    nvidia_driver,
    docker_engine,
    container_toolkit,
    gpu_tuning,
]
ROLES: list[Callable[..., Any]] = [*HOST_LAYER, model_weights, vllm_image, serving]
