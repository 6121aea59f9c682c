"""Mixed-precision linear kernel base — SIMULATED stand-in of the vllm#40361 overlay.

rigfleet sandbox: replaces vllm/model_executor/kernels/linear/mixed_precision/MPLinearKernel.py
in the stand-in image; the config remembers the unpadded N so outputs can be sliced back.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class MPLinearLayerConfig:
    full_weight_shape: tuple[int, int]
    partition_weight_shape: tuple[int, int]
    weight_type: str = "uint4b8"
    group_size: int = 128
    orig_output_size_per_partition: int | None = None  # set when Marlin padded N (vllm#40361)
