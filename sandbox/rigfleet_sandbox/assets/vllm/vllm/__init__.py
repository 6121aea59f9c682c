"""SIMULATED stand-in for the vLLM package (rigfleet sandbox).

No model runs and no GPU is used: `vllm serve` parses the real flags, prints the boot-log lines a
health gate reads, and serves deterministic OpenAI-compatible answers. Importing this package is
cheap on purpose (Genesis `apply_all` imports it to read `__version__`).
"""

from vllm.version import __version__, __version_tuple__

SIMULATED = True

__all__ = ["SIMULATED", "__version__", "__version_tuple__"]
