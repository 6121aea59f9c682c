"""vLLM version of this SIMULATED stand-in; the rigfleet image builder rewrites both values."""

__version__ = "0.0.0+sim"
__version_tuple__: tuple[int | str, ...] = (0, 0, 0, "sim")
