"""Where the sandbox keeps things, and the names and addresses of its simulated rigs.

A machine holds up to MAX_INSTANCES sandboxes side by side, chosen by RIGFLEET_SANDBOX_INSTANCE
(default 0). Each instance's state dir, address range (10.231.0.0/16 for instance 0, 10.232 for
1, ...) and interface, netns and machine names are fixed per instance, so that its `up` can find
and clear whatever a killed earlier run of the same instance left, and never touches another's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

MAX_INSTANCES = 4


def _instance() -> int:
    raw = os.environ.get("RIGFLEET_SANDBOX_INSTANCE", "0") or "0"
    if not raw.isdigit() or int(raw) >= MAX_INSTANCES:
        raise SystemExit(f"RIGFLEET_SANDBOX_INSTANCE={raw!r}: expected 0..{MAX_INSTANCES - 1}")
    return int(raw)


INSTANCE = _instance()
_SUFFIX = f"-{INSTANCE}" if INSTANCE else ""
_TAG = str(INSTANCE) if INSTANCE else ""
NET = f"10.{231 + INSTANCE}"  # the instance's /16

STATE_DIR = Path(os.environ.get("RIGFLEET_SANDBOX_STATE", f"/var/lib/rigfleet-sandbox{_SUFFIX}"))
# The cache lives outside the checkout and survives `down` (debootstrap takes about a minute).
CACHE_DIR = Path(os.environ.get("RIGFLEET_SANDBOX_CACHE", "/var/cache/rigfleet"))

RIGS_DIR = STATE_DIR / "rigs"
WWW_DIR = STATE_DIR / "www"
LOG_DIR = STATE_DIR / "logs"
SSH_DIR = STATE_DIR / "ssh"
STATE_FILE = STATE_DIR / "sandbox.json"
SERVICES_PIDFILE = STATE_DIR / "services.pid"
LOCK_FILE = Path(f"/run/lock/rigfleet-sandbox{_SUFFIX}.lock")
APT_CACHE_DIR = CACHE_DIR / "apt-proxy"
LAST_LOGS_DIR = CACHE_DIR / "logs" / f"last-sandbox{_SUFFIX}"

# Shared host-side service address: every rig reaches it through its default route.
SERVICE_ADDR = f"{NET}.0.1"
SERVICE_IF = f"rf{_TAG}-svc0"
SERVICE_LABEL = f"lo:rfsvc{_TAG}"  # when it has to live on lo (no dummy driver)
APT_PROXY_PORT = 3142
WWW_PORT = 8080
HOST_URL = f"http://{SERVICE_ADDR}:{WWW_PORT}/"  # the host's web server, as rigs reach it
REGISTRY_PORT = 5000
REGISTRY_DIR = STATE_DIR / "registry"
# The stand-in upstream registry (a Docker Hub / nvcr.io of the sandbox: rigfleet_sandbox.
# upstream_registry): TLS, counted in the upstream log, on the same address as the fleet registry.
UPSTREAM_REGISTRY_PORT = 5443
UPSTREAM_REGISTRY_DIR = STATE_DIR / "registry-upstream"

OPERATOR = "rigop"
DISTROS = ("trixie", "bookworm")
MAX_RIGS = 250

NETNS_PREFIX = f"rf{_TAG}-"
HOST_VETH_PREFIX = f"rfv{_TAG}-"
MACHINE_PREFIX = f"rf{_TAG}-" if INSTANCE else ""  # systemd-machined names are machine-wide


@dataclass(frozen=True)
class RigSpec:
    """Names and addresses of one simulated rig (index 1..MAX_RIGS)."""

    index: int

    @property
    def name(self) -> str:
        return f"rig-{self.index:02d}"

    @property
    def netns(self) -> str:
        return f"{NETNS_PREFIX}{self.name}"

    @property
    def host_if(self) -> str:
        return f"{HOST_VETH_PREFIX}{self.name}"

    @property
    def machine(self) -> str:
        return f"{MACHINE_PREFIX}{self.name}"

    @property
    def host_addr(self) -> str:
        return f"{NET}.{self.index}.1"

    @property
    def address(self) -> str:
        return f"{NET}.{self.index}.2"

    @property
    def dir(self) -> Path:
        return RIGS_DIR / self.name

    @property
    def root(self) -> Path:
        return self.dir / "root"

    @staticmethod
    def from_name(name: str) -> RigSpec:
        if not name.startswith("rig-") or not name[4:].isdigit():
            raise ValueError(f"not a sandbox rig name: {name!r} (expected rig-NN)")
        return RigSpec(int(name[4:]))


def rig_specs(count: int) -> list[RigSpec]:
    if not 1 <= count <= MAX_RIGS:
        raise ValueError(f"--rigs must be between 1 and {MAX_RIGS}, got {count}")
    return [RigSpec(i) for i in range(1, count + 1)]


def repo_root() -> Path:
    # sandbox/rigfleet_sandbox/layout.py -> repo root; independent of the caller's CWD.
    return Path(__file__).resolve().parents[2]


def inventory_dir() -> Path:
    env = os.environ.get("RIGFLEET_INVENTORY")
    return Path(env) if env else repo_root() / "inventory" / f"sandbox{_SUFFIX}"
