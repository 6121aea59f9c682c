"""Marlin mixed-precision linear kernel (SIMULATED stand-in, upstream state before vllm#40361).

Upstream refuses a GPTQ/AutoRound INT4 shard whose output size per partition is below
GPTQ_MARLIN_MIN_THREAD_N; Qwen3.6-27B AutoRound INT4 hits that at TP=2. The vllm#40361 overlay
(marlin-pad-sub-tile-n) replaces this file with one that pads N; Genesis P87 is the same fix as a
text patch on the anchor below.
"""

from __future__ import annotations

GPTQ_MARLIN_MIN_THREAD_N = 64

# [anchor P87]


def check_marlin_supports_shape(output_size_per_partition: int) -> tuple[bool, str | None]:
    if output_size_per_partition % GPTQ_MARLIN_MIN_THREAD_N != 0:
        return False, (
            f"Weight output_size_per_partition = {output_size_per_partition} is not divisible by "
            f"min_thread_n = {GPTQ_MARLIN_MIN_THREAD_N}. Consider reducing tensor_parallel_size or running "
            "with --quantization gptq."
        )
    return True, None
