"""The simulated GPUs: 2x RTX 3090 (sm_86, 24 GiB) unless the env hides some. SIMULATED."""

from __future__ import annotations

import os

DEVICE_NAME = "NVIDIA GeForce RTX 3090"
COMPUTE_CAPABILITY = (8, 6)
GPU_MEMORY_GIB = 24.0
PHYSICAL_GPUS = 2
_NONE = {"", "none", "void", "nodevfiles", "-1"}


def _count(value: str | None) -> int | None:
    if value is None:
        return None
    value = value.strip()
    if value.lower() == "all":
        return PHYSICAL_GPUS
    if value.lower() in _NONE:
        return 0
    return len([item for item in value.split(",") if item.strip()])


def visible_gpu_count() -> int:
    """NVIDIA_VISIBLE_DEVICES picks what the runtime exposes; CUDA_VISIBLE_DEVICES narrows it.

    "all" or unset means the two simulated cards; a list counts its items (indices or UUIDs).
    """
    counts = [
        c
        for c in (
            _count(os.environ.get("NVIDIA_VISIBLE_DEVICES")),
            _count(os.environ.get("CUDA_VISIBLE_DEVICES")),
        )
        if c is not None
    ]
    return min(counts) if counts else PHYSICAL_GPUS


def capability_str() -> str:
    return f"{COMPUTE_CAPABILITY[0]}.{COMPUTE_CAPABILITY[1]}"
