"""`status` behind the fleet's gateway: each fronted rig's state there (in, draining, out) read from
the gateway's `show stat`, the gateway's own health, and `gateway_url` on each rig it fronts."""

from __future__ import annotations

from typing import Any

import pytest

from rigfleet import runner, status
from rigfleet.runner import RigOutcome
from tests.plan.test_gateway import fleet_of, four, rig

BACKEND = "model-qwen3.6-27b-autoround"
STAT = ("# pxname,svname,qcur,scur,status,weight\n"
        "rigfleet-api,FRONTEND,,0,OPEN,\n"
        f"{BACKEND},rig-01,0,1,UP,2\n{BACKEND},rig-02,0,1,DRAIN,2\n{BACKEND},rig-03,0,0,MAINT,2\n"
        f"{BACKEND},rig-04,0,0,DOWN,1\n{BACKEND},BACKEND,0,2,UP,7\n")


def answering(monkeypatch: pytest.MonkeyPatch, text: str, reachable: bool = True) -> list[str]:
    asked: list[str] = []

    def read_facts(fleet: Any, names: list[str], fact: type, **_: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        asked.extend(names)
        assert fact is status.GatewayStat
        return ({names[0]: {"stat": text}} if reachable else {}), {names[0]: RigOutcome(names[0], reachable)}

    monkeypatch.setattr(runner, "read_facts", read_facts)
    return asked


def rows_for(names: list[str]) -> list[dict[str, Any]]:
    return [{"rig": name} for name in names]


def test_each_rig_shows_its_gateway_state_and_the_url(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = answering(monkeypatch, STAT)
    rows = status.gateway_rows(four(), rows_for(["rig-01", "rig-02", "rig-03", "rig-04"]))
    assert asked == ["rig-01"]  # one command, on the gateway host
    assert [r["gateway"] for r in rows] == ["in", "draining", "out", "out"]
    assert {r["gateway_url"] for r in rows} == {"http://127.0.0.1:4000/v1"}
    assert {r["gateway_health"] for r in rows} == {"up"}


def test_a_gateway_that_does_not_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    answering(monkeypatch, "")
    rows = status.gateway_rows(four(), rows_for(["rig-01", "rig-02"]))
    assert {(r["gateway"], r["gateway_health"]) for r in rows} == {("unknown", "down")}
    answering(monkeypatch, "", reachable=False)
    rows = status.gateway_rows(four(), rows_for(["rig-01"]))
    assert rows[0]["gateway_health"] == "unreachable"


def test_no_gateway_no_gateway_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = answering(monkeypatch, STAT)
    plain = fleet_of(rig("rig-01", "192.0.2.11"))
    assert status.gateway_rows(plain, rows_for(["rig-01"])) == [{"rig": "rig-01"}] and asked == []


def test_the_client_url_is_the_gateways_bind_address() -> None:
    fleet = four(gateway_bind_address="0.0.0.0", gateway_port=8443)
    from rigfleet import gateway

    gw = gateway.of(fleet)
    assert gw is not None and gw.url == "http://192.0.2.11:8443/v1"
