"""Monitoring on two SIMULATED rigs: the distribution's node exporter and Prometheus, for real.

rig-01 is the `monitor` host. The deploy installs prometheus-node-exporter and the GPU collector on
both rigs and Prometheus on rig-01 with targets from the inventory; Prometheus must scrape every
target of both rigs across the network (`up == 1`; the host routes between the rigs' links), promtool
must accept the alert rules, and the alerts must fire in Prometheus' own /api/v1/alerts and resolve
for rig-02 powered off (its plug pulled, then powered on again), an engine that stopped answering (its
container paused) and a simulated Xid (rigfleet_sandbox.xid). A second converge changes nothing.
The `for:` durations and the Xid window are shortened for the module (the operator-tunable
`monitoring` settings); scrapes and the collector run every 2 s.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from rigfleet import monitoring, runner
from rigfleet.loader import load_fleet
from rigfleet_sandbox import manager, xid

from .conftest import Sandbox, group_pinset, module_inventory

RIG = "rig-01"  # the monitor host
OTHER = "rig-02"
RIGS = [RIG, OTHER]
SANDBOX_RIGS = 2
WAIT_S = 150  # bounded waits: scrape and evaluation every 2 s, `for:` 4 s, Xid window 20 s

pytestmark = pytest.mark.sandbox


@pytest.fixture(scope="module")
def inventory(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Path:
    settings: dict[str, Any] = {"prometheus_address": sandbox.address(RIG), "scrape_interval_s": 2,
                                "collector_interval_s": 2, "rig_down_for_s": 4, "engine_unhealthy_for_s": 4,
                                "xid_window_s": 20, "enabled": True}
    inv = module_inventory(sandbox, tmp_path_factory, pinsets=[group_pinset(sandbox)],
                           rig_vars={name: {"bind_address": sandbox.address(name), "gate_timeout_s": 120,
                                            "monitoring": settings} for name in RIGS})
    # rig-01 is the monitor host here, whatever the sandbox's inventory says, and no gateway; only
    # this module's rigs (a sandbox kept from an earlier module may have more, not converged here)
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    for group in hosts["all"]["children"].values():
        group["hosts"] = {name: spec for name, spec in (group.get("hosts") or {}).items() if name in RIGS}
    hosts["all"]["children"][monitoring.MONITOR_GROUP] = {"hosts": {RIG: None}}
    hosts["all"]["children"].pop("gateway", None)
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    return inv


def converge(inventory: Path) -> list[runner.RigOutcome]:
    outcomes = runner.converge(load_fleet(inventory), RIGS)
    assert all(outcomes[name].ok for name in RIGS), {name: outcomes[name].summary for name in RIGS}
    return [outcomes[name] for name in RIGS]


def rig(sandbox: Sandbox, command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return sandbox.ssh(RIG, f"sudo sh -c {shlex.quote(command)}", check=check, timeout=300)


def api(sandbox: Sandbox, path: str, **query: str) -> Any:
    url = f"http://{sandbox.address(RIG)}:{monitoring.prometheus()['port']}{path}"
    if query:
        url += "?" + urllib.parse.urlencode(query)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=10) as resp:
        body = json.load(resp)
    assert body["status"] == "success", body
    return body["data"]


def firing(sandbox: Sandbox, rig: str | None = None) -> set[str]:
    """Names of the alerts firing now (for one rig when given)."""
    return {a["labels"]["alertname"] for a in api(sandbox, "/api/v1/alerts")["alerts"]
            if a["state"] == "firing" and rig in (None, a["labels"].get("rig"))}


def wait_for(what: str, check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass  # Prometheus restarting
        time.sleep(2)
    raise AssertionError(f"not within {WAIT_S} s: {what}")


@pytest.fixture(scope="module")
def deployed(sandbox: Sandbox, inventory: Path) -> None:
    converge(inventory)

    last: list[Any] = []

    def all_up() -> bool:
        active = api(sandbox, "/api/v1/targets")["activeTargets"]
        last[:] = [(t["labels"].get("rig"), t["scrapePool"], t["scrapeUrl"], t["health"], t["lastError"])
                   for t in active]
        return len(active) == 2 * len(RIGS) and all(t["health"] == "up" for t in active)

    try:
        wait_for("every target up", all_up)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; targets (rig, job, url, health, error): {last}") from None


def test_every_target_is_scraped(sandbox: Sandbox, deployed: None) -> None:
    up = api(sandbox, "/api/v1/query", query="up")["result"]
    assert sorted((r["metric"]["job"], r["metric"]["rig"]) for r in up) == sorted(
        (job, name) for job in (monitoring.NODE_JOB, monitoring.ENGINE_JOB) for name in RIGS), up
    assert all(r["value"][1] == "1" for r in up), up
    # rig-02's targets are its own addresses, scraped from rig-01 across the network
    instances = {r["metric"]["instance"].rsplit(":", 1)[0] for r in up if r["metric"]["rig"] == OTHER}
    assert instances == {sandbox.address(OTHER)}, up
    gpus = api(sandbox, "/api/v1/query", query="rigfleet_gpu_temperature_celsius")["result"]
    # the collector, via the textfile: two GPUs per rig
    assert sorted((r["metric"]["rig"], r["metric"]["gpu"]) for r in gpus) == [
        (name, gpu) for name in RIGS for gpu in ("0", "1")], gpus
    cap = api(sandbox, "/api/v1/query", query="rigfleet_gpu_power_limit_watts")["result"]
    assert len(cap) == 2 * len(RIGS) and all(float(r["value"][1]) > 0 for r in cap)
    engine = api(sandbox, "/api/v1/query", query="vllm:num_requests_running")["result"]
    assert sorted(r["metric"]["rig"] for r in engine) == RIGS
    assert all(r["metric"]["job"] == monitoring.ENGINE_JOB for r in engine)
    healthy = api(sandbox, "/api/v1/query", query="rigfleet_engine_healthy")["result"]
    assert sorted(r["metric"]["rig"] for r in healthy) == RIGS and all(r["value"][1] == "1" for r in healthy)


def test_listeners_are_only_the_declared_addresses(sandbox: Sandbox, deployed: None) -> None:
    listening = rig(sandbox, "ss -Htlnp").stdout
    address = sandbox.address(RIG)
    for port in (monitoring.node()["port"], monitoring.prometheus()["port"]):
        lines = [line for line in listening.splitlines() if f":{port} " in line]
        assert lines and all(f"{address}:{port}" in line for line in lines), listening


def test_promtool_accepts_the_rules(sandbox: Sandbox, deployed: None) -> None:
    prom = monitoring.prometheus()
    checked = rig(sandbox, f"{prom['promtool']} check rules {prom['rules']}", check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 8 rules found" in checked.stdout + checked.stderr


def test_a_healthy_rig_on_its_pins_raises_no_alert(sandbox: Sandbox, deployed: None) -> None:
    time.sleep(8)  # past every shortened `for:`
    assert firing(sandbox) == set()


def test_second_converge_changes_nothing(inventory: Path, deployed: None) -> None:
    outcomes = converge(inventory)
    assert [o.changed for o in outcomes] == [0, 0], [o.summary for o in outcomes]


def test_a_simulated_xid_fires_and_resolves(sandbox: Sandbox, deployed: None) -> None:
    sandbox.ssh(RIG, xid.inject_command(79))
    wait_for("GpuXidError firing", lambda: "GpuXidError" in firing(sandbox))
    wait_for("GpuXidError resolved", lambda: "GpuXidError" not in firing(sandbox))


def test_an_engine_that_stops_answering_fires_and_resolves(sandbox: Sandbox, deployed: None) -> None:
    rig(sandbox, "docker ps -q | xargs -r docker pause")
    try:
        wait_for("EngineUnhealthy firing", lambda: "EngineUnhealthy" in firing(sandbox))
    finally:
        rig(sandbox, "docker ps -q --filter status=paused | xargs -r docker unpause")
    wait_for("EngineUnhealthy resolved", lambda: "EngineUnhealthy" not in firing(sandbox))


def test_a_powered_off_rig_fires_and_resolves(sandbox: Sandbox, deployed: None) -> None:
    """rig-02's plug is pulled (its link dark, no orderly shutdown): the monitor on rig-01 sees its
    targets go down and RigDown fires for rig-02 alone; powered on again, the alert resolves."""
    manager.power_off(OTHER, log=print)
    try:
        wait_for("RigDown firing for rig-02", lambda: "RigDown" in firing(sandbox, OTHER))
        assert "RigDown" not in firing(sandbox, RIG)
    finally:
        manager.power_on(OTHER, log=print)
    wait_for("RigDown resolved", lambda: "RigDown" not in firing(sandbox))
