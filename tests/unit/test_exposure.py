"""Secure exposure default (issue 18, finding 4): loopback unless the inventory says otherwise; beyond
loopback only with an API key or the explicit insecure_public opt-in; `status` says who can reach."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from rigfleet import exposure, loader, status
from rigfleet.cli import main
from rigfleet.release import resolve
from tests.conftest import write_yaml

RIGS = ("rig-01", "rig-02", "rig-11", "rig-12")


def run(inventory: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), env={"RIGFLEET_INVENTORY": str(inventory), "COLUMNS": "300"})
    crashed = result.exception is not None and not isinstance(result.exception, SystemExit)
    return result.exit_code, result.output + (repr(result.exception) if crashed else "")


def without_bind(inventory: Path) -> None:
    """The example fleet with no bind_address (nor exposure settings) anywhere."""
    prod = inventory / "group_vars" / "prod.yml"
    body = yaml.safe_load(prod.read_text())
    for key in ("bind_address", "api_allow"):
        body.pop(key)
    write_yaml(prod, body)


def published(compose_text: str) -> list[str]:
    [service] = yaml.safe_load(compose_text)["services"].values()
    return list(service["ports"])


def test_four_rigs_without_bind_address_publish_on_loopback_only(example_inventory: Path, tmp_path: Path) -> None:
    without_bind(example_inventory)
    code, out = run(example_inventory, "check")
    assert code == 0, out
    fleet = loader.load_fleet(example_inventory)
    assert sorted(r.name for r in fleet.rigs) == list(RIGS)
    for rig in RIGS:
        target = tmp_path / rig
        code, out = run(example_inventory, "render", rig, "-o", str(target))
        assert code == 0, out
        ports = published((target / "compose.yaml").read_text())
        assert len(ports) == 1 and ports[0].startswith("127.0.0.1:"), (rig, ports)


def test_public_bind_without_api_key_is_refused_naming_rig_field_and_fix(example_inventory: Path) -> None:
    write_yaml(example_inventory / "host_vars" / "rig-01.yml", {"bind_address": "0.0.0.0"})
    code, out = run(example_inventory, "check")
    assert code == 2, out
    [line] = [line for line in out.splitlines() if line.startswith("error:")]
    assert line.startswith("error: rig-01: bind_address = '0.0.0.0': ")
    assert "no API key" in line and "api_key: {file:" in line and "insecure_public: true" in line
    assert "Traceback" not in out
    code, out = run(example_inventory, "plan", "--json")
    assert code == 2 and "rig-01: bind_address" in out


def test_the_opt_in_turns_the_refusal_into_a_warning(example_inventory: Path) -> None:
    write_yaml(example_inventory / "host_vars" / "rig-01.yml", {"bind_address": "0.0.0.0", "insecure_public": True})
    code, out = run(example_inventory, "check")
    assert code == 0, out
    assert "warning: rig-01: insecure_public = True: the API listens on 0.0.0.0:" in out


def test_an_api_key_allows_a_bind_beyond_loopback(example_inventory: Path) -> None:
    write_yaml(example_inventory / "host_vars" / "rig-01.yml",
               {"bind_address": "192.0.2.10", "api_key": {"env": "RIG01_KEY"}})
    code, out = run(example_inventory, "check")
    assert code == 0, out
    assert "rig-01: bind_address" not in out and "rig-01: insecure_public" not in out


@pytest.mark.parametrize(("value", "message"), [
    (["10.0.0.0/33"], "not an IPv4 address or CIDR network"),
    (["10.0.0.5/24"], "host bits set"),
    (["0.0.0.0/0"], "admits every source"),
    (["2001:db8::/32"], "not an IPv4 address"),
    (["gateway.lab"], "not an IPv4 address"),
    ("10.0.0.0/8", "list"),
])
def test_bad_allowlists_are_refused(example_inventory: Path, value: Any, message: str) -> None:
    write_yaml(example_inventory / "host_vars" / "rig-11.yml", {"api_allow": value})
    code, out = run(example_inventory, "check")
    assert code == 2, out
    assert "rig-11: api_allow" in out and message in out, out


def test_stale_exposure_settings_on_a_loopback_rig_are_warned(example_inventory: Path) -> None:
    write_yaml(example_inventory / "host_vars" / "rig-01.yml", {"api_allow": ["10.0.0.5"], "insecure_public": True})
    code, out = run(example_inventory, "check")
    assert code == 0, out
    assert "warning: rig-01: api_allow = ['10.0.0.5/32']: has no effect" in out
    assert "warning: rig-01: insecure_public = True: has no effect" in out


def test_reach_of_each_rig(example_inventory: Path) -> None:
    write_yaml(example_inventory / "host_vars" / "rig-12.yml", {"api_allow": [], "api_key": None,
                                                                "insecure_public": True})
    fleet = loader.load_fleet(example_inventory)
    labels = {rig.name: exposure.reach(rig).label() for rig in fleet.rigs}
    assert labels == {
        "rig-01": "loopback only",
        "rig-02": "loopback only",
        "rig-11": "allowlist 10.0.0.5/32, 10.0.0.6/32, 10.0.8.0/24 (key)",
        "rig-12": "public (NO key)",
    }
    assert exposure.firewalled(fleet.rig("rig-11")) and not exposure.firewalled(fleet.rig("rig-12"))


def test_status_json_and_table_show_api_reach(example_inventory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fleet = loader.load_fleet(example_inventory)

    def unreachable(fleet: Any, names: list[str], fact: Any) -> tuple[dict, dict]:
        class Outcome:
            reachable = False
        return {}, {name: Outcome() for name in names}

    monkeypatch.setattr(status.runner, "read_facts", unreachable)
    rows = {row["rig"]: row for row in status.collect(fleet)}
    assert rows["rig-01"]["api_reach"] == {"kind": "loopback", "sources": [], "api_key": False,
                                           "label": "loopback only"}
    assert rows["rig-11"]["api_reach"]["kind"] == "allowlist"
    assert rows["rig-11"]["api_reach"]["sources"] == ["10.0.0.5/32", "10.0.0.6/32", "10.0.8.0/24"]
    code, out = run(example_inventory, "status", "--json")
    assert code == 0, out
    assert {row["rig"]: row["api_reach"]["kind"] for row in json.loads(out)} == {
        "rig-01": "loopback", "rig-02": "loopback", "rig-11": "allowlist", "rig-12": "allowlist"}
    code, out = run(example_inventory, "status")
    assert code == 0 and "API reach" in out and "loopback only" in out, out
    assert resolve(fleet, fleet.rig("rig-11")).port_mapping().startswith("10.0.0.1:")
