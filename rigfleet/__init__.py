"""rigfleet: provision dual-RTX-3090 vLLM rigs with pyinfra and keep a fleet on one pin."""

__version__ = "0.1.0"
