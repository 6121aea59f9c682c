"""The DOCKER-USER allowlist on a SIMULATED rig, against the real iptables and Docker inside it.

The rig's API is published on its veth address with an API key and `api_allow: [10.231.N.1/32]`
(this machine's side of the link: the stand-in for the gateway) and `192.0.2.10/32` (a second
host, the monitor, as a second source address on the host-side link). A source address outside
the allowlist (198.51.100.7, on the same link) is dropped while the gateway and the monitor still
connect; a second converge changes nothing; the rules come
back after a Docker restart; without api_allow the next converge takes them out again.

Named to run right after test_serving.py, whose converged rig it reuses (one rig, no fresh boot).
Run under the shared sandbox lock: flock /tmp/rigfleet-e2e.lock pytest tests/sandbox/test_serving_allowlist.py
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from rigfleet import render, runner
from rigfleet.loader import load_fleet
from rigfleet.release import resolve
from rigfleet_sandbox.layout import HOST_VETH_PREFIX

from .conftest import Sandbox, chat_completion, group_pinset, module_inventory

RIG = "rig-01"
SANDBOX_RIGS = 1
API_KEY = "sk-rigfleet-allow-" + os.urandom(8).hex()
OUTSIDER = "198.51.100.7"  # TEST-NET-2: on no allowlist
MONITOR = "192.0.2.10"  # TEST-NET-1: the monitor host, allowlisted beside the gateway
CHAIN = "RIGFLEET-API"

pytestmark = pytest.mark.sandbox


def gateway(sandbox: Sandbox) -> str:
    return sandbox.address(RIG).rsplit(".", 1)[0] + ".1"  # the host side of the rig's /30


@pytest.fixture(scope="module")
def values(sandbox: Sandbox) -> dict[str, Any]:
    return {"bind_address": sandbox.address(RIG), "api_key": {"env": "RIGFLEET_ALLOW_API_KEY"},
            "api_allow": [f"{gateway(sandbox)}/32", f"{MONITOR}/32"], "gate_timeout_s": 120, "variant": "tq3-nomtp"}


@pytest.fixture(scope="module")
def inventory(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory, values: dict[str, Any]) -> Iterator[Path]:
    old = os.environ.get("RIGFLEET_ALLOW_API_KEY")
    os.environ["RIGFLEET_ALLOW_API_KEY"] = API_KEY
    link = f"{HOST_VETH_PREFIX}{RIG}"
    for extra in (OUTSIDER, MONITOR):
        subprocess.run(["ip", "addr", "add", f"{extra}/32", "dev", link], check=True)
    try:
        yield module_inventory(sandbox, tmp_path_factory, pinsets=[group_pinset(sandbox)], rig_vars={RIG: values})
    finally:
        for extra in (OUTSIDER, MONITOR):
            subprocess.run(["ip", "addr", "del", f"{extra}/32", "dev", link], check=False)
        if old is None:
            os.environ.pop("RIGFLEET_ALLOW_API_KEY", None)
        else:
            os.environ["RIGFLEET_ALLOW_API_KEY"] = old


def rig(sandbox: Sandbox, command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return sandbox.ssh(RIG, f"sudo sh -c {shlex.quote(command)}", check=check, timeout=300)


def converge(inventory: Path) -> runner.RigOutcome:
    outcome = runner.converge(load_fleet(inventory), [RIG])[RIG]
    assert outcome.ok, outcome.summary
    return outcome


def port(inventory: Path) -> int:
    fleet = load_fleet(inventory)
    return resolve(fleet, fleet.rig(RIG)).port


def connects(address: str, port: int, source: str) -> bool:
    """A TCP handshake from `source`: False when the SYN is dropped (no answer within 3 s)."""
    try:
        with socket.create_connection((address, port), timeout=3, source_address=(source, 0)):
            return True
    except TimeoutError:
        return False


def chat(address: str, port: int) -> str:
    return chat_completion(address, port, API_KEY, max_tokens=20)


@pytest.fixture(scope="module")
def deployed(sandbox: Sandbox, inventory: Path) -> int:
    converge(inventory)
    return port(inventory)


def test_outsider_is_dropped_and_the_gateway_still_connects(sandbox: Sandbox, deployed: int) -> None:
    address = sandbox.address(RIG)
    rules = rig(sandbox, f"iptables -S {CHAIN}").stdout
    assert f"-A {CHAIN} -s {gateway(sandbox)}/32 " in rules and "-j DROP" in rules, rules
    assert f"-A {CHAIN} -s {MONITOR}/32 " in rules, rules
    assert connects(address, deployed, gateway(sandbox))
    assert "Paris" in chat(address, deployed)
    assert not connects(address, deployed, OUTSIDER)
    assert connects(address, deployed, MONITOR)  # the second allowed host, right after the drop
    drops = rig(sandbox, f"iptables -L {CHAIN} -v -n -x").stdout
    dropped = [line.split() for line in drops.splitlines() if " DROP " in f" {line} "]
    assert dropped and int(dropped[0][0]) > 0, drops  # the DROP rule counted the outsider's SYNs


def test_second_converge_changes_nothing(inventory: Path, deployed: int) -> None:
    outcome = converge(inventory)
    assert outcome.changed == 0, outcome.summary


def test_rules_survive_a_docker_restart(sandbox: Sandbox, deployed: int) -> None:
    rig(sandbox, "systemctl restart docker")
    # the unit restarts with docker.service (PartOf), ordered after it: wait for its job to finish
    waited = rig(sandbox, f"for i in $(seq 60); do {render.ALLOWLIST_SCRIPT} check && exit 0; sleep 1; done; "
                          "exit 1", check=False)
    assert waited.returncode == 0, waited.stderr
    assert not connects(sandbox.address(RIG), deployed, OUTSIDER)
    assert connects(sandbox.address(RIG), deployed, gateway(sandbox))
    assert connects(sandbox.address(RIG), deployed, MONITOR)


def test_without_api_allow_the_rules_are_removed(sandbox: Sandbox, inventory: Path, values: dict[str, Any],
                                                  deployed: int) -> None:
    host_vars = inventory / "host_vars" / f"{RIG}.yml"
    host_vars.write_text(yaml.safe_dump({k: v for k, v in values.items() if k != "api_allow"}))
    outcome = converge(inventory)
    assert outcome.changed > 0, outcome.summary
    assert rig(sandbox, f"iptables -S {CHAIN}", check=False).returncode != 0  # the chain is gone
    assert CHAIN not in rig(sandbox, "iptables -S DOCKER-USER").stdout
    assert rig(sandbox, f"test -e {render.ALLOWLIST_SCRIPT}", check=False).returncode != 0
    assert connects(sandbox.address(RIG), deployed, OUTSIDER)  # the key is now the only guard
