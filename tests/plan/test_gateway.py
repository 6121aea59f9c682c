"""Plan-level tests of the gateway role: HAProxy installed and configured from the inventory on the
gateway host only (one route per served model name, one server per rig, weights from max_num_seqs,
health checks on /health), the API keys written through stdin and never in a command or upload,
zero changes once converged, a rig added is a reload (never a restart). The configuration itself
meets the real HAProxy in tests/unit/test_gateway_haproxy.py."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from rigfleet import catalog, gateway, guard
from rigfleet.context import RigContext
from rigfleet.errors import InputError
from rigfleet.loader import Fleet
from rigfleet.roles.api_firewall import api_firewall
from rigfleet.roles.gateway import gateway_role
from rigfleet.schema import Rig
from tests.plan.fakerig import FakeRig, Plan, context_for, plan
from tests.plan.scenarios import fresh

CONFIG = "/etc/haproxy/haproxy.cfg"
KEY_VALUE = "sk-gateway-test-secret-value"


def rig(name: str, address: str, variant: str = "int8", **fields: Any) -> Rig:
    base: dict[str, Any] = {"name": name, "ssh_hostname": address, "bind_address": address, "pinset": "test",
                            "variant": variant, "model_dir": "/srv/models", "api_key": {"env": "RF_GW_KEY"}}
    return Rig(**(base | fields))


def fleet_of(*rigs: Rig) -> Fleet:
    base = context_for("debian-13")
    return Fleet(Path("/nonexistent"), rigs, base.fleet.pinsets)


def four(**extra: Any) -> Fleet:
    return fleet_of(rig("rig-01", "192.0.2.11", groups=("gateway",), **extra), rig("rig-02", "192.0.2.12", **extra),
                    rig("rig-03", "192.0.2.13", **extra), rig("rig-04", "192.0.2.14", variant="bf16", **extra))


def on(fleet: Fleet, name: str) -> RigContext:
    chosen = fleet.rig(name)
    return RigContext(fleet, chosen, fleet.pinsets["test"], catalog.variants()[chosen.variant])


def run(fleet: Fleet, name: str, state: FakeRig, roles: list[Any] | None = None) -> Plan:
    return plan(on(fleet, name), state, roles=roles or [gateway_role])


@pytest.fixture(autouse=True)
def key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RF_GW_KEY", KEY_VALUE)


def converged(fleet: Fleet) -> FakeRig:
    gw = gateway.of(fleet)
    assert gw is not None
    return fresh("debian-13").with_(
        packages={**fresh("debian-13").packages, "haproxy": ["3.0.11-1"]},
        files={**gateway.files(gw), gateway.KEYS_FILE: gateway.keys_text([KEY_VALUE])},
        modes={gateway.KEYS_FILE: "600"},
        services={"haproxy.service": (True, True)},
    )


def test_the_config_has_one_route_per_model_and_a_weighted_server_per_rig() -> None:
    fleet = four()
    result = run(fleet, "rig-01", fresh("debian-13"))
    assert not result.failed
    config = result.uploads[CONFIG]
    variants = catalog.variants()
    for model in variants["int8"].served_model_names:
        backend = gateway.backend_name(model)
        assert f"use_backend {backend} if {{ var(txn.model) -m str {model} }}" in config
        section = config.split(f"backend {backend}\n")[1].split("\nbackend ")[0]
        weight = min(variants["int8"].max_num_seqs, 256)
        port = variants["int8"].port
        for n in (1, 2, 3):
            assert f"server rig-0{n} 192.0.2.1{n}:{port} weight {weight}" in section
        # every variant serves the same name: rig-04 (bf16) is in the same route, by its own weight
        bf16 = catalog.variants()["bf16"]
        assert f"server rig-04 192.0.2.14:{bf16.port} weight {bf16.max_num_seqs}" in section
        assert "option httpchk GET /health" in section
    assert "option http-buffer-request" in config and "json_query('$.model')" in config
    assert any("apt-get" in c and "haproxy" in c for c in result.commands)
    assert any("haproxy -c -q -f /etc/haproxy/haproxy.cfg" in c for c in result.commands)
    assert any("systemctl reload haproxy.service" in c for c in result.commands)
    assert not any("systemctl restart haproxy" in c for c in result.commands)


def test_the_key_reaches_the_gateway_through_stdin_only() -> None:
    result = run(four(), "rig-01", fresh("debian-13"))
    assert any(gateway.KEYS_FILE in c and 'cat > "$t"' in c for c in result.commands)
    assert all(KEY_VALUE not in c for c in result.commands)
    assert all(KEY_VALUE not in text for text in result.uploads.values())
    assert f"-f {gateway.KEYS_FILE}" in result.uploads[CONFIG]


def test_a_rig_not_in_the_gateway_group_gets_no_gateway() -> None:
    result = run(four(), "rig-02", fresh("debian-13"))
    assert not result.failed and result.changes == []


def test_no_gateway_group_no_gateway() -> None:
    fleet = fleet_of(rig("rig-01", "192.0.2.11"), rig("rig-02", "192.0.2.12"))
    assert gateway.of(fleet) is None
    assert run(fleet, "rig-01", fresh("debian-13")).changes == []


def test_converged_gateway_plans_nothing() -> None:
    fleet = four()
    result = run(fleet, "rig-01", converged(fleet))
    assert not result.failed and result.changes == []


def test_a_rig_added_is_a_reload_not_a_restart() -> None:
    fleet = four()
    bigger = fleet_of(*fleet.rigs, rig("rig-05", "192.0.2.15"))
    result = run(bigger, "rig-01", converged(fleet))
    assert "server rig-05 192.0.2.15:" in result.uploads[CONFIG]
    assert gateway.KEYS_FILE not in result.uploads
    assert any("systemctl reload haproxy.service" in c for c in result.commands)
    assert any("show servers state" in c and gateway.STATE_FILE in c for c in result.commands)
    assert not any("restart" in c for c in result.commands)


def test_a_changed_key_is_rewritten() -> None:
    fleet = four()
    state = converged(fleet)
    os.environ["RF_GW_KEY"] = "sk-another-key-value"
    result = run(fleet, "rig-01", state)
    assert any(gateway.KEYS_FILE in c for c in result.commands)
    assert any("systemctl reload haproxy.service" in c for c in result.commands)


def test_gateway_only_adds_the_gateways_address_to_the_allowlist() -> None:
    fleet = four(gateway_only=True)
    result = run(fleet, "rig-02", fresh("debian-13"), roles=[api_firewall])
    script = result.uploads["/usr/local/lib/rigfleet/api-allowlist"]
    assert "-A RIGFLEET-API -s 192.0.2.11/32 " in script and script.count("-j RETURN\n") == 1


def test_a_loopback_rig_the_gateway_cannot_reach_is_refused() -> None:
    fleet = fleet_of(rig("rig-01", "192.0.2.11", groups=("gateway",)),
                     rig("rig-02", "192.0.2.12", bind_address="127.0.0.1"))
    problems = [p for p in gateway.problems(fleet) if not p.warning]
    assert [(p.rig, p.field) for p in problems] == [("rig-02", "bind_address")]
    with pytest.raises(InputError):
        guard.enforce(fleet)


def test_two_gateway_hosts_are_refused() -> None:
    fleet = fleet_of(rig("rig-01", "192.0.2.11", groups=("gateway",)), rig("rig-02", "192.0.2.12", groups=("gateway",)))
    assert any("more than one rig in the gateway group" in p.message for p in gateway.problems(fleet))


def test_model_names_become_safe_backend_names() -> None:
    assert gateway.backend_name("qwen3.6-27b") == "model-qwen3.6-27b"
    odd = gateway.backend_name("org/model b")
    assert "/" not in odd and " " not in odd and odd != gateway.backend_name("org/model_b")
