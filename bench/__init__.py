"""Benchmarks on sandbox rigs: `make bench` (python -m bench)."""
