"""Marlin mixed-precision linear kernel — SIMULATED stand-in of the vllm#40361 overlay.

rigfleet sandbox: this file replaces vllm/model_executor/kernels/linear/mixed_precision/marlin.py
in the stand-in image. Like the real PR (marlin-pad-sub-tile-n), it pads the output dimension of
a shard up to GPTQ_MARLIN_MIN_THREAD_N and slices the result back (_marlin_orig_n), so AutoRound
INT4 loads at TP=2. No vLLM code; nothing here touches a GPU.
"""

from __future__ import annotations

GPTQ_MARLIN_MIN_THREAD_N = 64


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _maybe_pad_n(output_size_per_partition: int) -> tuple[int, int]:
    """(padded N, original N): pad sub-tile N so the Marlin kernel accepts the shard."""
    _marlin_orig_n = output_size_per_partition
    return round_up(output_size_per_partition, GPTQ_MARLIN_MIN_THREAD_N), _marlin_orig_n


def check_marlin_supports_shape(output_size_per_partition: int) -> tuple[bool, str | None]:
    padded, _ = _maybe_pad_n(output_size_per_partition)
    return padded % GPTQ_MARLIN_MIN_THREAD_N == 0, None
