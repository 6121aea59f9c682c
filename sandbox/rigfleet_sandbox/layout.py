"""Where the sandbox keeps things, and the names and addresses of its simulated rigs.

One sandbox per machine: the state dir, the 10.231.0.0/16 range and the `rf-` interface
names are fixed so that `up` can find and clear whatever a killed earlier run left.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

STATE_DIR = Path(os.environ.get("RIGFLEET_SANDBOX_STATE", "/var/lib/rigfleet-sandbox"))
# The cache lives outside the checkout and survives `down` (debootstrap takes about a minute).
CACHE_DIR = Path(os.environ.get("RIGFLEET_SANDBOX_CACHE", "/var/cache/rigfleet"))

RIGS_DIR = STATE_DIR / "rigs"
WWW_DIR = STATE_DIR / "www"
LOG_DIR = STATE_DIR / "logs"
SSH_DIR = STATE_DIR / "ssh"
STATE_FILE = STATE_DIR / "sandbox.json"
SERVICES_PIDFILE = STATE_DIR / "services.pid"
LOCK_FILE = Path("/run/lock/rigfleet-sandbox.lock")
APT_CACHE_DIR = CACHE_DIR / "apt-proxy"
LAST_LOGS_DIR = CACHE_DIR / "logs" / "last-sandbox"

# Shared host-side service address: every rig reaches it through its default route.
SERVICE_ADDR = "10.231.0.1"
SERVICE_IF = "rf-svc0"
SERVICE_LABEL = "lo:rfsvc"  # when it has to live on lo (no dummy driver)
APT_PROXY_PORT = 3142
WWW_PORT = 8080
REGISTRY_PORT = 5000
REGISTRY_DIR = STATE_DIR / "registry"

OPERATOR = "rigop"
DISTROS = ("trixie", "bookworm")
MAX_RIGS = 250

NETNS_PREFIX = "rf-"
HOST_VETH_PREFIX = "rfv-"


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
    def host_addr(self) -> str:
        return f"10.231.{self.index}.1"

    @property
    def address(self) -> str:
        return f"10.231.{self.index}.2"

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
    return Path(env) if env else repo_root() / "inventory" / "sandbox"
