"""The fleet's one OpenAI-compatible endpoint, decided from the inventory alone.

The rig of the `gateway` group runs HAProxy (rigfleet.roles.gateway). Every served model name is
one route (a backend) holding one server per rig that serves it, weighted by the variant's
max_num_seqs; the gateway checks the fleet's API keys and health-checks each engine's /health.
The serving swap drains a rig's servers here before it stops the engine (operations.serving).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from ipaddress import ip_address
from typing import Any

from rigfleet import catalog, release, render, rigpython
from rigfleet.errors import Problem, one_host_group
from rigfleet.loader import Fleet
from rigfleet.schema import Rig, SecretRef

GROUP = "gateway"
MAX_WEIGHT = 256  # HAProxy's server weight range is 0..256
KEYS_FILE = "/etc/haproxy/rigfleet-api-keys"
NAME = re.compile(r"[^A-Za-z0-9._-]")


def facts() -> dict[str, Any]:
    """catalog/gateway.yaml: HAProxy's package, socket and states, the engine's gauge."""
    return catalog.gateway()


@dataclass(frozen=True)
class Server:
    rig: str  # also the HAProxy server name (rig names are [a-z0-9._-])
    address: str
    port: int
    weight: int


@dataclass(frozen=True)
class Route:
    model: str
    backend: str
    servers: tuple[Server, ...]


@dataclass(frozen=True)
class Gateway:
    rig: str  # the host it runs on
    address: str  # where clients reach it
    bind_address: str
    port: int
    routes: tuple[Route, ...]
    keys: tuple[SecretRef, ...]  # distinct references; empty: the gateway admits any client

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}/v1"

    def backends_of(self, rig: str) -> tuple[str, ...]:
        return tuple(route.backend for route in self.routes if any(s.rig == rig for s in route.servers))

    def fronts(self, rig: str) -> bool:
        return bool(self.backends_of(rig))


def backend_name(model: str) -> str:
    """An HAProxy proxy name for a model name ('/' separates backend and server in the runtime API)."""
    clean = NAME.sub("_", model)
    if clean != model:
        clean += "-" + hashlib.sha256(model.encode()).hexdigest()[:8]
    return f"model-{clean}"


def gateway_rigs(fleet: Fleet) -> list[Rig]:
    return [rig for rig in fleet.rigs if GROUP in rig.groups]


def _reach(rig: Rig, gateway_rig: Rig) -> str | None:
    """The address the gateway uses for a rig's API; None when it cannot reach it (loopback elsewhere)."""
    address = ip_address(rig.bind_address)
    if address.is_loopback:
        return str(address) if rig.name == gateway_rig.name else None
    if address.is_unspecified:
        return "127.0.0.1" if rig.name == gateway_rig.name else rig.ssh_hostname
    return str(address)


def client_address(rig: Rig) -> str:
    address = ip_address(rig.gateway_bind_address)
    return rig.ssh_hostname if address.is_unspecified else str(address)


def of(fleet: Fleet) -> Gateway | None:
    """The fleet's gateway, or None when no rig is in the `gateway` group."""
    hosts = gateway_rigs(fleet)
    if not hosts:
        return None
    gw = hosts[0]
    by_model: dict[str, list[Server]] = {}
    keys: dict[tuple[str | None, str | None], SecretRef] = {}
    for rig in fleet.rigs:
        address = _reach(rig, gw)
        if address is None:
            continue
        try:
            resolved = release.resolve(fleet, rig)
        except Exception:  # noqa: BLE001 - an unresolvable rig is the guard's to report, not routed
            continue
        server = Server(rig.name, address, resolved.port, min(resolved.variant.max_num_seqs, MAX_WEIGHT))
        for model in resolved.variant.served_model_names:
            by_model.setdefault(model, []).append(server)
        if rig.api_key is not None:
            keys.setdefault((rig.api_key.env, rig.api_key.file), rig.api_key)
    routes = tuple(Route(model, backend_name(model), tuple(servers)) for model, servers in sorted(by_model.items()))
    return Gateway(gw.name, client_address(gw), gw.gateway_bind_address, gw.gateway_port, routes,
                   tuple(keys.values()))


def allow_sources(fleet: Fleet, rig: Rig) -> tuple[str, ...]:
    """The rig's API allowlist: api_allow, plus the gateway's address when the rig admits only it."""
    if not rig.gateway_only:
        return rig.api_allow
    hosts = gateway_rigs(fleet)
    if not hosts:
        return rig.api_allow
    source = gateway_source(hosts[0])
    return tuple(dict.fromkeys([*rig.api_allow, f"{source}/32"])) if source else rig.api_allow


def gateway_source(gw: Rig) -> str | None:
    """The address the gateway's connections come from, as rigs see it: its IPv4 ssh_hostname."""
    try:
        address = ip_address(gw.ssh_hostname)
    except ValueError:
        return None
    return str(address) if address.version == 4 else None


def problems(fleet: Fleet) -> list[Problem]:
    """Inventory mistakes about the gateway, each naming the rig, the field and the fix."""
    hosts = gateway_rigs(fleet)
    found = one_host_group("gateway", [r.name for r in hosts])
    if not hosts:
        for rig in fleet.rigs:
            if rig.gateway_only:
                found.append(Problem(rig.name, "gateway_only", True, "the inventory has no gateway group",
                                     "add a gateway group with the host that runs the gateway, or remove gateway_only"))
        return found
    gw = hosts[0]
    if not ip_address(gw.gateway_bind_address).is_loopback and not any(r.api_key for r in fleet.rigs) \
            and not gw.insecure_public:
        found.append(Problem(gw.name, "gateway_bind_address", gw.gateway_bind_address,
                             "the gateway would listen beyond loopback and no rig has an API key to check",
                             "set api_key on the rigs (the gateway checks the same keys), or accept an open "
                             "gateway with insecure_public: true on the gateway host"))
    for rig in fleet.rigs:
        if _reach(rig, gw) is None:
            found.append(Problem(rig.name, "bind_address", rig.bind_address,
                                 f"the gateway on {gw.name} cannot reach this rig's API on loopback",
                                 "bind the rig's API to an address the gateway host reaches (with api_allow or "
                                 "gateway_only to limit who else can)"))
        if rig.gateway_only and gateway_source(gw) is None:
            found.append(Problem(rig.name, "gateway_only", True,
                                 f"the gateway host {gw.name} has no IPv4 ssh_hostname to admit",
                                 f"give {gw.name} its IPv4 address as ssh_hostname, or list it in api_allow"))
        if rig.gateway_only and ip_address(rig.bind_address).is_loopback:
            found.append(Problem(rig.name, "gateway_only", True, "has no effect: the API listens on loopback only",
                                 "bind the API to the rig's address", warning=True))
    return found


# --- what the gateway host receives ----------------------------------------------------------------

STATE_FILE = "/var/lib/haproxy/rigfleet-server-state"
MODELS_FILE = "/etc/haproxy/rigfleet-models.json"
MONITOR_URI = "/rigfleet/gateway-health"


def config_text(gw: Gateway, *, admin_socket: str | None = None, state_file: str = STATE_FILE,
                keys_file: str = KEYS_FILE, models_file: str = MODELS_FILE) -> str:
    """haproxy.cfg for the gateway (the paths are arguments so a test can run it unprivileged)."""
    haproxy, engine = facts()["haproxy"], facts()["engine"]
    return render.render("gateway/haproxy.cfg.j2", gw=gw, bind=gw.bind_address, keys=bool(gw.keys),
                         keys_file=keys_file, models_file=models_file,
                         admin_socket=admin_socket or haproxy["admin_socket"], state_file=state_file,
                         monitor_uri=MONITOR_URI, health_path=engine["health_path"])


def models_json(gw: Gateway) -> str:
    """The static answer to GET /v1/models: every model the fleet serves."""
    models = {"object": "list", "data": [{"id": route.model, "object": "model", "owned_by": "rigfleet"}
                                         for route in gw.routes]}
    return json.dumps(models, sort_keys=True) + "\n"


def files(gw: Gateway) -> dict[str, str]:
    """The HAProxy configuration and the /v1/models answer, by path on the gateway host."""
    return {facts()["haproxy"]["config"]: config_text(gw), MODELS_FILE: models_json(gw)}


def keys_text(values: list[str]) -> str:
    """The key file HAProxy matches the Authorization header against: one `Bearer KEY` a line."""
    return "".join(f"Bearer {value}\n" for value in sorted(set(values)))


# --- the runtime API, from the control machine over SSH ------------------------------------------

# Rig-side, stdlib only: send one command to the admin socket, print the answer.
RUNTIME_CLIENT = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(10)
s.connect(sys.argv[1])
s.sendall(sys.argv[2].encode() + b"\\n")
out = b""
while True:
    chunk = s.recv(65536)
    if not chunk:
        break
    out += chunk
sys.stdout.write(out.decode())
"""


def runtime_command(command: str) -> str:
    """The shell command that runs one runtime-API command on the gateway host."""
    return rigpython.command(RUNTIME_CLIENT, facts()["haproxy"]["admin_socket"], command)


def set_state(backend: str, server: str, state: str) -> str:
    if state not in facts()["haproxy"]["server_states"]:
        raise ValueError(f"not a server state: {state}")
    return f"set server {backend}/{server} state {state}"


def parse_stat(text: str) -> dict[tuple[str, str], dict[str, str]]:
    """`show stat` CSV -> (backend, server) -> its row (scur: current sessions, status: UP/DOWN/
    DRAIN/MAINT ...); the FRONTEND/BACKEND summary rows are left out."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or not lines[0].startswith("# "):
        return {}
    header = lines[0][2:].split(",")
    rows: dict[tuple[str, str], dict[str, str]] = {}
    for line in lines[1:]:
        row = dict(zip(header, line.split(","), strict=False))
        if row.get("svname") in ("FRONTEND", "BACKEND"):
            continue
        rows[(row.get("pxname", ""), row.get("svname", ""))] = row
    return rows


def rig_state(stat: dict[tuple[str, str], dict[str, str]], gw: Gateway, rig: str) -> str:
    """in / draining / out for a rig across its backends (out wins: one model unreachable is out)."""
    states = []
    for backend in gw.backends_of(rig):
        row = stat.get((backend, rig))
        status = (row or {}).get("status", "")
        if row is None or status.startswith(("MAINT", "DOWN")) or status == "NOLB":
            states.append("out")
        elif status.startswith("DRAIN"):
            states.append("draining")
        else:
            states.append("in")
    for state in ("out", "draining"):
        if state in states:
            return state
    return "in" if states else "not fronted"
