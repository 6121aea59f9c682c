"""Who can reach a rig's API, decided from the inventory alone.

The API is published on the rig's loopback unless bind_address says otherwise. Beyond loopback
it needs an API key (or the explicit `insecure_public: true` opt-in), and with `api_allow` a
DOCKER-USER allowlist (rigfleet.roles.api_firewall) admits only the listed sources: a port Docker
publishes is forwarded before ufw or the INPUT chain ever see the packet.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from ipaddress import ip_address
from typing import Literal

from rigfleet.errors import Problem
from rigfleet.schema import Rig

ReachKind = Literal["loopback", "allowlist", "public"]
KEY_FIX = "set api_key: {file: /path} or api_key: {env: NAME} (the clients send it as a Bearer token)"


@dataclass(frozen=True)
class Reach:
    kind: ReachKind
    sources: tuple[str, ...]  # the allowlist (CIDRs); empty unless kind == "allowlist"
    api_key: bool

    def label(self) -> str:
        """One short cell: `loopback only`, `allowlist 10.0.0.5/32 (key)`, `public (NO key)`."""
        if self.kind == "loopback":
            return "loopback only"
        key = "key" if self.api_key else "NO key"
        where = "public" if self.kind == "public" else f"allowlist {', '.join(self.sources)}"
        return f"{where} ({key})"

    def as_json(self) -> dict[str, object]:
        return {"kind": self.kind, "sources": list(self.sources), "api_key": self.api_key, "label": self.label()}


def loopback_only(rig: Rig) -> bool:
    return ip_address(rig.bind_address).is_loopback


def firewalled(rig: Rig) -> bool:
    """Whether the rig needs the DOCKER-USER allowlist: published beyond loopback with api_allow."""
    return not loopback_only(rig) and bool(rig.api_allow)


def reach(rig: Rig) -> Reach:
    if loopback_only(rig):
        return Reach("loopback", (), rig.api_key is not None)
    if rig.api_allow:
        return Reach("allowlist", rig.api_allow, rig.api_key is not None)
    return Reach("public", (), rig.api_key is not None)


ProblemFn = Callable[..., Problem]


def problems(rig: Rig, port: int, problem: ProblemFn) -> Iterator[Problem]:
    """The exposure rules; `problem(field, value, message, fix, warning=False)` fills in rig and file."""
    address = ip_address(rig.bind_address)
    if address.is_loopback:
        if rig.api_allow:
            yield problem("api_allow", list(rig.api_allow), "has no effect: the API listens on loopback only",
                          "remove api_allow, or set bind_address to the address the clients reach", warning=True)
        if rig.insecure_public:
            yield problem("insecure_public", True, "has no effect: the API listens on loopback only",
                          "remove insecure_public", warning=True)
        return
    if rig.api_key is None and not rig.insecure_public:
        yield problem("bind_address", rig.bind_address,
                      f"the API would listen beyond loopback (port {port}) with no API key: "
                      "anyone who reaches it could use it",
                      f"{KEY_FIX}; or bind 127.0.0.1 (the default); or accept an open API with "
                      "insecure_public: true")
    elif rig.api_key is None:
        yield problem("insecure_public", True,
                      f"the API listens on {rig.bind_address}:{port} with no API key"
                      + (f" (sources limited to {', '.join(rig.api_allow)})" if rig.api_allow else " from any source"),
                      f"{KEY_FIX} and remove insecure_public", warning=True)
    elif rig.insecure_public:
        yield problem("insecure_public", True, "has no effect: the rig has an API key", "remove insecure_public",
                      warning=True)
    if rig.api_allow and address.version == 6:
        yield problem("api_allow", list(rig.api_allow),
                      "the DOCKER-USER allowlist is IPv4: Docker publishes IPv6 ports through docker-proxy "
                      "unless its ip6tables support is on, and those never cross DOCKER-USER",
                      "bind an IPv4 address of the rig, or remove api_allow and filter IPv6 in INPUT yourself")
