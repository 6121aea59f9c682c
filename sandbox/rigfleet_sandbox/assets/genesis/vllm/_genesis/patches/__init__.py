"""Genesis patch entry points (SIMULATED stand-in)."""
