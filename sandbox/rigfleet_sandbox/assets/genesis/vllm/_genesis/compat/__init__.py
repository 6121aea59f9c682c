"""Genesis compat tooling (SIMULATED stand-in)."""
