"""Network namespaces, veth pairs and the shared service address of the sandbox.

Each simulated rig lives in netns rf-rig-NN with a veth pair: host side 10.231.N.1/30, rig side
10.231.N.2/30 and a default route via the host side. Host services listen on 10.231.0.1/32,
held by a dummy interface (or lo), so every rig reaches them at one address through its default route
(the packets are addressed to the host itself, no NAT).

Rigs reach one another (a gateway or a monitor on one rig, the others behind it) through the host,
routed, not bridged: forwarding is on for the rigs' host-side veths only, and two policy rules keep it
inside the instance's /16: from the /16 to the /16 the main table routes, anything else from the /16
is refused by the host ("prohibited"), so no rig packet leaves by the host's own uplink. No NAT: a rig
sees the other rig's own address, as on a real LAN, so allowlists by source address mean the same.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from rigfleet_sandbox.layout import (
    HOST_VETH_PREFIX,
    INSTANCE,
    NET,
    NETNS_PREFIX,
    SERVICE_ADDR,
    SERVICE_IF,
    SERVICE_LABEL,
    RigSpec,
)
from rigfleet_sandbox.shell import Log, run

NETNS_DIR = Path("/run/netns")
_OURS_NETNS = re.compile(rf"^{re.escape(NETNS_PREFIX)}rig-\d+$")
# Two policy-rule priorities per instance, below the main table's 32766 and clear of the usual ones.
RULE_PRIORITY = 9200 + 2 * INSTANCE
_OURS_LINK = re.compile(rf"^({re.escape(HOST_VETH_PREFIX)}rig-\d+|{re.escape(SERVICE_IF)})$")


def _sysctl(path: str, value: str, netns: str | None = None) -> None:
    if netns is None:
        Path("/proc/sys", path).write_text(value)
    else:
        run(["ip", "netns", "exec", netns, "sh", "-c", f"echo {value} > /proc/sys/{path}"])


def setup_service_address() -> str:
    """Put SERVICE_ADDR/32 on a dummy link, or on lo where the kernel has no dummy driver."""
    if run(["ip", "link", "add", SERVICE_IF, "type", "dummy"], check=False).returncode == 0:
        # IPv4 only: keeps router solicitations and other IPv6 chatter off the sandbox links.
        _sysctl(f"net/ipv6/conf/{SERVICE_IF}/disable_ipv6", "1")
        run(["ip", "addr", "add", f"{SERVICE_ADDR}/32", "dev", SERVICE_IF])
        run(["ip", "link", "set", SERVICE_IF, "up"])
        return SERVICE_IF
    run(["ip", "addr", "add", f"{SERVICE_ADDR}/32", "dev", "lo", "label", SERVICE_LABEL])
    return "lo"


def service_address_links() -> list[str]:
    """Links that carry SERVICE_ADDR now (to find a stale one)."""
    out = run(["ip", "-j", "-4", "addr", "show"]).stdout
    return sorted(
        str(link["ifname"])
        for link in json.loads(out or "[]")
        if any(a.get("local") == SERVICE_ADDR for a in link.get("addr_info", []))
    )


def setup_rig(rig: RigSpec) -> None:
    run(["ip", "netns", "add", rig.netns])
    # New links in the netns (eth0) come up IPv4-only; the rig's loopback keeps ::1.
    _sysctl("net/ipv6/conf/default/disable_ipv6", "1", rig.netns)
    run(["ip", "link", "add", rig.host_if, "type", "veth", "peer", "name", "eth0", "netns", rig.netns])
    _sysctl(f"net/ipv6/conf/{rig.host_if}/disable_ipv6", "1")
    run(["ip", "addr", "add", f"{rig.host_addr}/30", "dev", rig.host_if])
    run(["ip", "link", "set", rig.host_if, "up"])
    ns = ["ip", "-n", rig.netns]
    run([*ns, "link", "set", "lo", "up"])
    run([*ns, "addr", "add", f"{rig.address}/30", "dev", "eth0"])
    run([*ns, "link", "set", "eth0", "up"])
    run([*ns, "route", "add", "default", "via", rig.host_addr])


def setup_rig_routing(rigs: list[RigSpec]) -> None:
    """Route between the instance's rigs (see the module doc); idempotent per rig."""
    subnet = f"{NET}.0.0/16"
    if not our_rules():
        run(["ip", "rule", "add", "priority", str(RULE_PRIORITY), "from", subnet, "to", subnet, "lookup", "main"])
        run(["ip", "rule", "add", "priority", str(RULE_PRIORITY + 1), "from", subnet, "prohibit"])
    for rig in rigs:
        _sysctl(f"net/ipv4/conf/{rig.host_if}/forwarding", "1")


def our_rules() -> list[str]:
    """This instance's policy rules, as `ip rule` prints them."""
    out = run(["ip", "-4", "rule", "show"]).stdout
    mine = (f"{RULE_PRIORITY}:", f"{RULE_PRIORITY + 1}:")
    return [line.strip() for line in out.splitlines() if line.strip().startswith(mine)]


def rp_filter_report(rigs: list[RigSpec]) -> str:
    """Strict rp_filter is fine here: replies to a rig leave by the veth its packets came in on."""

    def value(name: str) -> str:
        return Path(f"/proc/sys/net/ipv4/conf/{name}/rp_filter").read_text().strip()

    parts = [f"all={value('all')}"] + [f"{r.host_if}={value(r.host_if)}" for r in rigs[:3]]
    return "rp_filter " + " ".join(parts) + " (strict mode is fine: the reverse path is the rig's own veth)"


def list_ours() -> tuple[list[str], list[str]]:
    """Network namespaces and host links this sandbox creates, including stale ones."""
    netns = sorted(p.name for p in NETNS_DIR.iterdir() if _OURS_NETNS.match(p.name)) if NETNS_DIR.is_dir() else []
    links = json.loads(run(["ip", "-j", "link", "show"]).stdout or "[]")
    ours = sorted(str(link["ifname"]) for link in links if _OURS_LINK.match(str(link.get("ifname", ""))))
    return netns, ours + [f"{SERVICE_ADDR}@{name}" for name in service_address_links() if name not in ours]


def teardown(log: Log) -> None:
    """Delete every sandbox link and netns; tolerant of half-built or already-gone state."""
    netns, links = list_ours()
    for link in links:
        if "@" not in link:
            run(["ip", "link", "del", link], check=False)
    for link in service_address_links():
        run(["ip", "addr", "del", f"{SERVICE_ADDR}/32", "dev", link], check=False)
    rules = our_rules()
    for rule in rules:
        run(["ip", "rule", "del", "priority", rule.split(":", 1)[0]], check=False)
    for name in netns:
        if run(["ip", "netns", "del", name], check=False).returncode != 0:
            # A bind mount whose namespace file lost its name; unmount and drop it by hand.
            run(["umount", "-l", str(NETNS_DIR / name)], check=False)
            (NETNS_DIR / name).unlink(missing_ok=True)
    if netns or links or rules:
        log(f"removed netns {' '.join(netns) or '-'}; links {' '.join(links) or '-'}; policy rules {len(rules)}")
    _drop_netns_dir_mount()


def _drop_netns_dir_mount() -> None:
    # `ip netns add` makes /run/netns a shared bind mount of itself; once no namespace is left
    # there, unmount it again so the host is as before the sandbox.
    if not NETNS_DIR.is_dir() or any(NETNS_DIR.iterdir()):
        return
    if any(line.split()[1] == str(NETNS_DIR) for line in Path("/proc/mounts").read_text().splitlines()):
        run(["umount", str(NETNS_DIR)], check=False)
