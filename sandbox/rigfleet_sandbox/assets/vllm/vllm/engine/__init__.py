"""SIMULATED stand-in (rigfleet sandbox)."""
