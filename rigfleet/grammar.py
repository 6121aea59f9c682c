"""Validation by type: each kind of value is parsed by its own grammar, never matched against a
list of bad characters. Every check raises ValueError("<problem> [fix: <fix>]"); the loader turns
that into one line naming the rig, the field, the value and the fix.
"""

from __future__ import annotations

import re
from ipaddress import IPv4Address, IPv4Network, IPv6Address, ip_address
from pathlib import PurePosixPath
from urllib.parse import urlsplit, urlunsplit

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from rigfleet.escape import IMAGE_NAME, IMAGE_REFERENCE, IMAGE_TAG

FIX = re.compile(r"^(?P<message>.*) \[fix: (?P<fix>.*)\]$", re.S)

# One grammar for every name an operator chooses (rig, group, pin set): it reaches file names,
# labels and pyinfra's inventory, so it is short, lower-case and free of separators.
NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
NAME_RULE = "lower-case letters, digits, '-' and '_', starting with a letter or digit, at most 63"
# A rig name may also carry dots (rig-01.lab): it is only ever a pyinfra host name, never a group.
RIG_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
HOSTNAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*$")
# PEP 508 project names
PACKAGE_NAME = re.compile(r"^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])$", re.I)
# Debian package versions (deb-version(7)): [epoch:]upstream[-revision]
DEB_VERSION = re.compile(r"^([0-9]+:)?[0-9][A-Za-z0-9.+~-]*$")
POSIX_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")


def bad(message: str, fix: str) -> ValueError:
    return ValueError(f"{message} [fix: {fix}]")


def name(value: str, what: str) -> str:
    if not NAME.match(value):
        raise bad(f"not a valid {what} name", f"use {NAME_RULE}")
    return value


def rig_name(value: str) -> str:
    if not RIG_NAME.match(value):
        raise bad("not a valid rig name", "use lower-case letters, digits, '.', '-' and '_' (at most 63)")
    return value


def host(value: str) -> str:
    """An IP address or a DNS name (no scheme, port or path)."""
    try:
        ip_address(value)
    except ValueError:
        if not HOSTNAME.match(value):
            raise bad("not an IP address or DNS name",
                      "write the bare address, e.g. 192.0.2.10 or rig-01.lab") from None
    return value


def port(value: str, what: str) -> int:
    if not value.isdigit() or not 1 <= int(value) <= 65535:
        raise bad(f"{what} port {value!r} is not a TCP port", "use a port from 1 to 65535")
    return int(value)


def url(value: str, schemes: tuple[str, ...], absolute_path: bool = False) -> str:
    """Parse, check scheme/host/port, and return the URL re-serialised from its parts."""
    if absolute_path and value.startswith("/"):
        return path(value)
    if any(ch.isspace() or ord(ch) < 0x20 or ch in '"\\<>`' for ch in value):
        raise bad("a URL cannot hold spaces, quotes, backslashes or control characters",
                  "percent-encode them (%20, %22)")
    try:
        parts = urlsplit(value)
        parts_port = parts.port
    except ValueError as exc:
        raise bad(f"not a URL ({exc})", "write SCHEME://HOST[:PORT]/PATH") from None
    allowed = ", ".join(f"{s}://" for s in schemes) + (" or an absolute path" if absolute_path else "")
    if parts.scheme not in schemes:
        raise bad(f"scheme {parts.scheme or 'missing'} is not allowed here", f"use {allowed}")
    if parts.scheme != "file":
        if not parts.hostname:
            raise bad("the URL has no host", "write SCHEME://HOST[:PORT]/PATH")
        bracketed = parts.netloc.rsplit("@", 1)[-1].startswith("[")
        if not bracketed:
            host(parts.hostname)
        if parts_port == 0:
            raise bad("port 0 is not a TCP port", "use a port from 1 to 65535")
    return urlunsplit(parts)


def http_endpoint(value: str) -> str:
    """http(s)://HOST[:PORT][/] (an apt proxy): nothing after the port."""
    normalised = url(value, ("http", "https"))
    parts = urlsplit(normalised)
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise bad("a proxy URL is only scheme, host and port", "write http://HOST:PORT")
    return normalised


def host_port(value: str) -> str:
    """HOST[:PORT] (a Docker registry)."""
    hostname, sep, port_text = value.rpartition(":") if ":" in value else (value, "", "")
    host(hostname)
    if sep:
        port(port_text, "registry")
    return value


def path(value: str) -> str:
    """An absolute path on the rig, with nothing a mount spec, unit file or shell could split on."""
    parts = PurePosixPath(value)
    if not parts.is_absolute() or ".." in parts.parts:
        raise bad("not an absolute path without '..'", "write a path such as /srv/models")
    if any(ch in value for ch in ":$\\\"'`") or any(ch.isspace() or ord(ch) < 0x20 for ch in value):
        raise bad("a path cannot hold ':', '$', quotes, backslashes, spaces or control characters",
                  "choose a plain path such as /srv/models")
    return value


def bind_address(value: str) -> str:
    try:
        address = ip_address(value)
    except ValueError:
        raise bad("not an IP address", "write 127.0.0.1, 0.0.0.0 or the rig's own address") from None
    if address.is_multicast or (isinstance(address, IPv4Address) and address == IPv4Address("255.255.255.255")):
        raise bad("a multicast or broadcast address cannot be listened on", "use a unicast address of the rig")
    if isinstance(address, IPv6Address) and address.ipv4_mapped:
        raise bad("an IPv4-mapped IPv6 address", f"write {address.ipv4_mapped}")
    return str(address)


def ipv4_network(value: str) -> str:
    """A source for the DOCKER-USER allowlist: an IPv4 address or network, host bits clear."""
    try:
        network = IPv4Network(value, strict=False)
    except ValueError:
        raise bad("not an IPv4 address or CIDR network", "write e.g. 192.0.2.10 or 192.0.2.0/24") from None
    try:
        IPv4Network(value)
    except ValueError:
        raise bad("host bits set in a network", f"write {network} (or the single address as /32)") from None
    if network.prefixlen == 0:
        raise bad("0.0.0.0/0 admits every source", "list the sources, or remove api_allow (any source may connect)")
    return str(network)


def pep440(value: str, what: str = "version") -> str:
    try:
        Version(value)
    except InvalidVersion:
        raise bad(f"not a PEP 440 {what}",
                  "write it as pip reports it, e.g. 0.20.2 or 0.20.2rc1.dev9+g01d4d1ad3") from None
    return value


def python_requirement(package: str, version: str) -> tuple[str, str]:
    if not PACKAGE_NAME.match(package):
        raise bad(f"{package!r:.80} is not a Python package name", "use the name as on the index, e.g. xxhash")
    pep440(version, f"version of {canonicalize_name(package)}")
    return package, version


def deb_version(value: str) -> str:
    if not DEB_VERSION.match(value):
        raise bad("not a Debian package version", "write it as apt-cache policy shows it, e.g. 580.95.05-1")
    return value


def image_repository(value: str) -> str:
    if len(value) > 255 or not IMAGE_NAME.match(value):
        raise bad("not an image repository", "write [REGISTRY[:PORT]/]NAME in lower case, e.g. vllm/vllm-openai")
    return value


def image_tag(value: str) -> str:
    if not IMAGE_TAG.match(value):
        raise bad("not an image tag", "use letters, digits, '_', '.' and '-' (at most 128, not starting with . or -)")
    return value


def image_reference(value: str) -> str:
    if len(value) > 255 or not IMAGE_REFERENCE.match(value):
        raise bad("not an image reference", "write REPOSITORY[:TAG][@sha256:DIGEST], e.g. nvidia/cuda:13.0.2-base")
    return value


def source(value: str) -> str:
    """Where a pinned input comes from: an http(s)/file/ssh/git URL or an absolute path."""
    if value.startswith("-"):
        raise bad("a source cannot start with '-' (it would be read as an option)", "write a URL or absolute path")
    return url(value, ("https", "http", "file", "ssh", "git"), absolute_path=True)
