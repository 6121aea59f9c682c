"""The fleet's download cache, decided from the inventory alone.

The rig of the `cache` group runs apt-cacher-ng (rigfleet.roles.fleet_cache): a caching HTTP proxy
for apt. With a cache group every rig's apt sends its http:// traffic there, the fleet's own
plain-HTTP repositories included, so a package the first rig downloaded is served to the next from
the cache host's disk. The cache host's own apt goes through it as well; its `apt_proxy`, when set,
is where the cache downloads from (the way out of a network without NAT), and the other rigs'
apt_proxy is not used while the cache is their proxy.

Weights go from rig to rig the same way: apt-cacher-ng also serves the cache host's MODEL_DIR as
plain files (its LocalDirs, at /rigfleet-models/), and a rig whose weights the cache host already
holds, verified, fetches them from there instead of the hub or the mirror (rigfleet.roles.model_weights).
`cache_weights: false` on the cache host keeps its model directory off the network; on another rig
it makes that rig fetch from its own source.

HTTPS repositories are not cached: apt keeps reaching them directly, TLS end to end, as without a
cache (the rigs' apt configuration proxies http:// only). apt-cacher-ng could cache them only with
the http://HTTPS/// remap, which rewrites every rig's sources and moves TLS to the cache host; its
PassThroughPattern is narrowed to the fleet's HTTPS repository hosts instead, so a rig that sends
https through the cache anyway gets a tunnel to those hosts and nowhere else.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from ipaddress import ip_address
from typing import Any
from urllib.parse import urlsplit

from rigfleet import catalog
from rigfleet.errors import Problem, one_host_group
from rigfleet.loader import Fleet
from rigfleet.schema import Rig

GROUP = "cache"
# the URL path under which the cache host's MODEL_DIR is served (apt-cacher-ng's LocalDirs)
WEIGHTS_PATH = "rigfleet-models"
# how long a rig's apt waits for the cache's port before it stops with the fix
CHECK_TIMEOUT_S = 5


def facts() -> dict[str, Any]:
    """catalog/fleet_cache.yaml: apt-cacher-ng's package, configuration file and port."""
    return dict(catalog.fleet_cache()["apt_cacher_ng"])


@dataclass(frozen=True)
class Cache:
    rig: str  # the host it runs on
    bind_address: str  # where it listens
    address: str  # where the rigs reach it
    port: int
    upstream: str | None  # the proxy it downloads through (the cache host's apt_proxy)
    https_hosts: tuple[str, ...]  # the fleet's HTTPS repository hosts, tunnelled but not cached
    http_ports: tuple[int, ...]  # ports of the fleet's plain-HTTP repositories, besides 80
    model_dir: str | None = None  # the cache host's MODEL_DIR, served to the rigs (None: not served)

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}"

    @property
    def weights_url(self) -> str | None:
        """Where the rigs read the cache host's MODEL_DIR (None: it is not served)."""
        return f"{self.url}/{WEIGHTS_PATH}/" if self.model_dir else None


@dataclass(frozen=True)
class AptRoute:
    """How one rig's apt reaches the archives: its http proxy, whether the fleet's own plain-HTTP
    mirrors are reached directly, and the check apt runs before each update (None: none)."""

    proxy: str | None
    direct_mirrors: bool
    check: str | None = None


def cache_rigs(fleet: Fleet) -> list[Rig]:
    return [rig for rig in fleet.rigs if GROUP in rig.groups]


def _literal(value: str) -> str | None:
    try:
        return str(ip_address(value))
    except ValueError:
        return None


def _repo_urls(fleet: Fleet) -> list[str]:
    return [repo.url for rig in fleet.rigs for repo in (rig.cuda_repo, rig.toolkit_repo, rig.docker_repo) if repo]


def _https_hosts(fleet: Fleet) -> tuple[str, ...]:
    hosts = {parts.hostname for parts in map(urlsplit, _repo_urls(fleet)) if parts.scheme == "https" and parts.hostname}
    return tuple(sorted(hosts))


def _http_ports(fleet: Fleet) -> tuple[int, ...]:
    ports = {parts.port for parts in map(urlsplit, _repo_urls(fleet)) if parts.scheme == "http" and parts.port}
    return tuple(sorted(ports - {80}))


def of(fleet: Fleet) -> Cache | None:
    """The fleet's cache, or None without a `cache` group (or when it cannot be placed: problems())."""
    hosts = cache_rigs(fleet)
    if not hosts:
        return None
    rig = hosts[0]
    bind = rig.cache_bind_address or _literal(rig.ssh_hostname)
    if bind is None:
        return None
    address = rig.ssh_hostname if ip_address(bind).is_unspecified else bind
    port = rig.cache_port or int(facts()["port"])
    model_dir = rig.model_dir if rig.cache_weights else None
    return Cache(rig.name, bind, address, port, rig.apt_proxy, _https_hosts(fleet), _http_ports(fleet), model_dir)


def weights_from(fleet: Fleet, rig: Rig) -> Cache | None:
    """The cache the rig fetches its weights through, or None (no cache, the cache host itself, a
    cache that serves no weights, or the rig's cache_weights is off)."""
    found = of(fleet)
    if found is None or found.model_dir is None or found.rig == rig.name or not rig.cache_weights:
        return None
    return found


def check_command(found: Cache, rig: Rig) -> str:
    """The shell line apt runs before an update on a rig that uses the cache: a cache that does not
    answer stops the update with the rig, the cache and the fix, instead of a connect error per
    file. (bash's /dev/tcp: the check needs nothing installed.)"""
    probe = shlex.quote(f"exec 3<>/dev/tcp/{found.address}/{found.port}")
    message = (f"rigfleet: {rig.name} downloads its packages through the fleet cache on {found.rig} "
               f"({found.url}), which does not answer. Fix: converge {found.rig} first (its fleet_cache "
               f"role installs and starts apt-cacher-ng) or start apt-cacher-ng there; or take {found.rig} "
               f"out of the {GROUP} group, and every rig downloads on its own again")
    return (f"timeout {CHECK_TIMEOUT_S} bash -c {probe} 2>/dev/null || "
            f"{{ echo {shlex.quote(message)} >&2; exit 1; }}")


def apt_route(fleet: Fleet, rig: Rig) -> AptRoute:
    """The way the rig's apt goes: without a cache group, its own apt_proxy as before; with one,
    the cache (the cache host's apt_proxy becomes the cache's way out)."""
    found = of(fleet)
    if found is None:
        return AptRoute(rig.apt_proxy, direct_mirrors=True)
    # the cache host's own apt is checked by its role, right after it (re)starts the cache
    check = None if rig.name == found.rig else check_command(found, rig)
    return AptRoute(found.url, direct_mirrors=False, check=check)


def bootstrap_proxy(found: Cache) -> str:
    """The proxy the cache host installs apt-cacher-ng through, before its apt points at the cache."""
    return found.upstream or "DIRECT"


def config_text(found: Cache) -> str:
    """zzz_rigfleet.conf: the settings rigfleet owns, over the package's and debconf's."""
    tunnel = "|".join(re.escape(host) for host in found.https_hosts)
    lines = [
        f"# rigfleet: the fleet's download cache on {found.rig}. Generated from the inventory by the",
        "# fleet_cache role; a change here is lost at the next deploy.",
        f"Port: {found.port}",
        f"BindAddress: {found.bind_address}",
        # an empty Proxy: downloads go direct (it also clears what debconf may have set)
        f"Proxy: {found.upstream or ''}".rstrip(),
        # the fleet's plain-HTTP repositories on other ports than 80 (apt-cacher-ng refuses them)
        "AllowUserPorts: " + " ".join(str(port) for port in (80, *found.http_ports)),
        f"PassThroughPattern: ^({tunnel}):443$" if tunnel else "# no HTTPS repositories: only the default tunnels",
        # the package's own pair, and this host's MODEL_DIR for the other rigs' weights
        "LocalDirs: " + " ; ".join([facts()["package_local_dirs"],
                                    *([f"{WEIGHTS_PATH} {found.model_dir}"] if found.model_dir else [])]),
    ]
    return "\n".join(lines) + "\n"


def problems(fleet: Fleet) -> list[Problem]:
    """Inventory mistakes about the cache, each naming the rig, the field and the fix."""
    hosts = cache_rigs(fleet)
    found = one_host_group("cache", [r.name for r in hosts])
    for rig in fleet.rigs:
        if GROUP in rig.groups:
            continue
        for field in ("cache_bind_address", "cache_port"):
            value = getattr(rig, field)
            # the same value as the cache host's (a group-wide setting) is harmless
            if value is not None and all(getattr(h, field) != value for h in hosts):
                found.append(Problem(rig.name, field, value,
                                     f"this rig is not in the {GROUP} group, so it runs no cache",
                                     f"set {field} on the host of the {GROUP} group, or remove it here"))
    if not hosts:
        return found
    rig = hosts[0]
    port = rig.cache_port or int(facts()["port"])
    if rig.cache_bind_address is None and _literal(rig.ssh_hostname) is None:
        found.append(Problem(rig.name, "cache_bind_address", None,
                             f"the cache would listen on every interface: ssh_hostname {rig.ssh_hostname} is "
                             "not an address to bind",
                             "set cache_bind_address to the address the other rigs reach this host at"))
    elif rig.cache_bind_address and ip_address(rig.cache_bind_address).is_loopback and len(fleet.rigs) > 1:
        found.append(Problem(rig.name, "cache_bind_address", rig.cache_bind_address,
                             "the other rigs cannot reach a cache that listens on loopback",
                             "bind the cache to the address the other rigs reach this host at"))
    if rig.cache_weights and any(ch in rig.model_dir for ch in ";#"):
        found.append(Problem(rig.name, "model_dir", rig.model_dir,
                             "the cache serves this directory to the other rigs, and apt-cacher-ng's "
                             "configuration cannot hold ';' or '#' in a path",
                             "choose a model_dir without ';' and '#', or set cache_weights: false"))
    taken = {"ssh_port": rig.ssh_port, "port (the API)": rig.port}
    if "gateway" in rig.groups:
        taken["gateway_port"] = rig.gateway_port
    for field, value in taken.items():
        if value == port:
            found.append(Problem(rig.name, "cache_port", port, f"the rig's {field} already uses port {port}",
                                 f"set cache_port to a free port other than {port}"))
    return found
