"""Mixed-precision linear kernel base (SIMULATED stand-in, upstream state before vllm#40361)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class MPLinearLayerConfig:
    full_weight_shape: tuple[int, int]
    partition_weight_shape: tuple[int, int]
    weight_type: str = "uint4b8"
    group_size: int = 128
