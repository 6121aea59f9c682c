"""Parts of the SIMULATED vLLM stand-in that have no counterpart in real vLLM.

platform: how many GPUs the container sees (from NVIDIA_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES),
faults: the RIGFLEET_SANDBOX_FAULT switches, genesis_state: which Genesis markers are on disk,
textgen: the deterministic "model", metrics: counters behind /metrics.
"""

SIM_LABEL = "vllm (simulated engine)"
