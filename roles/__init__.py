"""Roles: one @deploy function per layer, each fed by the validated RigContext."""

from collections.abc import Callable
from typing import Any

from roles.model_weights import model_weights
from roles.vllm_image import vllm_image

# Filled in layer order as roles land: preflight, apt_base, nvidia_driver, docker_engine,
# container_toolkit, gpu_tuning, model_weights, vllm_image, serving.
ROLES: list[Callable[..., Any]] = [model_weights, vllm_image]
