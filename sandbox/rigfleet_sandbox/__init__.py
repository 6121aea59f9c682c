"""The sandbox: simulated dual-3090 rigs on the local machine.

Everything under this package is for rehearsal and tests. The NVIDIA stack, the vLLM engine,
the Genesis tree and the weights served here are SIMULATED stand-ins; systemd, sshd, apt, Docker
and compose inside the rigs are real. Production code (rigfleet/* outside this package, roles/,
deploy.py) never imports this package.
"""
