"""Plan-level tests of the API allowlist role: installed only when the API is published beyond
loopback with api_allow, zero changes once converged, re-applied when the kernel lost the rules,
taken out when no longer needed. The rules themselves meet real iptables in tests/sandbox."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rigfleet import render
from rigfleet.roles.api_firewall import UNIT_PATH, api_firewall
from tests.plan.fakerig import FakeRig, Plan, context_for, plan
from tests.plan.scenarios import fresh

ALLOW: dict[str, Any] = {"bind_address": "192.0.2.10", "api_key": {"env": "K"},
                         "api_allow": ["198.51.100.7/32", "203.0.113.0/24"]}


def run(rig: FakeRig, **fields: Any) -> Plan:
    return plan(context_for("debian-13", **fields), rig, roles=[api_firewall])


def installed(**fields: Any) -> FakeRig:
    context = context_for("debian-13", **fields)
    rendered = render.allowlist_files(context.rig, context.release.port)
    return fresh("debian-13").with_(
        files={render.ALLOWLIST_SCRIPT: rendered["script"], UNIT_PATH: rendered["unit"]},
        modes={render.ALLOWLIST_SCRIPT: "755"},
        services={render.ALLOWLIST_UNIT: (True, True)},
        allowlist_live=True,
    )


def test_a_loopback_rig_gets_no_firewall() -> None:
    result = run(fresh("debian-13"))
    assert not result.failed and result.changes == []


def test_a_published_api_gets_the_allowlist_unit_and_script() -> None:
    result = run(fresh("debian-13"), **ALLOW)
    assert not result.failed
    script = result.uploads[render.ALLOWLIST_SCRIPT]
    port = context_for("debian-13").variant.port
    assert f"-A RIGFLEET-API -s 198.51.100.7/32 -p tcp -m conntrack --ctstate DNAT --ctorigdst 192.0.2.10 " \
           f"--ctorigdstport {port} --ctdir ORIGINAL -j RETURN" in script
    assert "-s 203.0.113.0/24" in script
    assert script.count("-j RETURN\n") == 2 and script.count("-j DROP\n") == 1
    unit = result.uploads[UNIT_PATH]
    assert "After=docker.service" in unit and "PartOf=docker.service" in unit and "WantedBy=docker.service" in unit
    assert any(f"systemctl start {render.ALLOWLIST_UNIT}" in c for c in result.commands)
    assert any(f"systemctl enable {render.ALLOWLIST_UNIT}" in c for c in result.commands)


def test_a_wildcard_bind_matches_the_port_alone() -> None:
    result = run(fresh("debian-13"), **{**ALLOW, "bind_address": "0.0.0.0"})
    assert "--ctorigdst " not in result.uploads[render.ALLOWLIST_SCRIPT]


def test_converged_allowlist_plans_nothing() -> None:
    result = run(installed(**ALLOW), **ALLOW)
    assert not result.failed and result.changes == []


def test_rules_lost_behind_rigfleets_back_are_reapplied() -> None:
    result = run(installed(**ALLOW).with_(allowlist_live=False), **ALLOW)
    assert any(f"systemctl restart {render.ALLOWLIST_UNIT}" in c for c in result.commands)
    assert not result.uploads


def test_a_changed_allowlist_is_rewritten_and_reapplied() -> None:
    result = run(installed(**ALLOW), **{**ALLOW, "api_allow": ["198.51.100.7/32"]})
    assert "-s 203.0.113.0/24" not in result.uploads[render.ALLOWLIST_SCRIPT]
    assert any(f"systemctl restart {render.ALLOWLIST_UNIT}" in c for c in result.commands)


def test_an_allowlist_no_longer_needed_is_removed() -> None:
    result = run(installed(**ALLOW))  # the rig went back to loopback
    assert any(f"systemctl stop {render.ALLOWLIST_UNIT}" in c for c in result.commands)
    assert any(f"systemctl disable {render.ALLOWLIST_UNIT}" in c for c in result.commands)
    assert any("rm" in c and render.ALLOWLIST_SCRIPT in c for c in result.commands)
    assert any("rm" in c and UNIT_PATH in c for c in result.commands)


def test_a_rig_without_the_allowlist_reads_as_not_installed(tmp_path: Path) -> None:
    """Nothing installed: the fact's command prints nothing, and pyinfra then gives the fact its
    default() (not process()); that must be a state, not None (the role reads `.installed`)."""
    import subprocess

    from rigfleet.facts.firewall import AllowlistState, ApiAllowlist

    fact = ApiAllowlist()
    printed = subprocess.run(["sh", "-c", fact.command(str(tmp_path / "script"), str(tmp_path / "unit"))],
                             capture_output=True, text=True, timeout=30).stdout
    assert printed == ""
    assert fact.default() == AllowlistState(installed=False, live=False)
