"""Patch wiring (SIMULATED stand-in): only text patches are modelled."""
