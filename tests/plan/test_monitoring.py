"""Plan-level tests of the monitoring roles: the node exporter and GPU collector on every rig,
Prometheus only on the `monitor` group, the listen addresses written before the packages (whose
postinst starts the daemons), zero changes once converged, restarts only for what changed.
The daemons themselves meet the distribution's packages in tests/sandbox/test_monitoring.py."""

from __future__ import annotations

import json
from typing import Any

from rigfleet import monitoring
from rigfleet.roles.monitor import monitor
from rigfleet.roles.node_exporter import node_exporter
from tests.plan.fakerig import FakeRig, Plan, context_for, plan
from tests.plan.scenarios import fresh

PUBLIC: dict[str, Any] = {"bind_address": "192.0.2.10", "insecure_public": True}
MONITOR: dict[str, Any] = {**PUBLIC, "groups": ["monitor"]}
NODE, PROM = monitoring.node(), monitoring.prometheus()
UNIT_DIR = "/etc/systemd/system"


def run(rig: FakeRig, **fields: Any) -> Plan:
    return plan(context_for("debian-13", **fields), rig, roles=[node_exporter, monitor])


def converged(**fields: Any) -> FakeRig:
    context = context_for("debian-13", **fields)
    collector = monitoring.collector_files(context.rig)
    files = {NODE["defaults_file"]: monitoring.node_exporter_defaults(context.rig),
             monitoring.COLLECTOR_SCRIPT: collector["script"], monitoring.COLLECTOR_CONFIG: collector["config"],
             f"{UNIT_DIR}/{monitoring.COLLECTOR_UNIT}": collector["service"],
             f"{UNIT_DIR}/{monitoring.COLLECTOR_TIMER}": collector["timer"]}
    services = {NODE["service"]: (True, True), monitoring.COLLECTOR_TIMER: (True, True)}
    modes = {monitoring.COLLECTOR_SCRIPT: "755"}
    allowlist = monitoring.exporter_allowlist(context.fleet, context.rig)
    if allowlist is not None:
        files |= {monitoring.EXPORTER_ALLOWLIST_SCRIPT: allowlist["script"],
                  f"{UNIT_DIR}/{monitoring.EXPORTER_ALLOWLIST_UNIT}": allowlist["unit"]}
        services[monitoring.EXPORTER_ALLOWLIST_UNIT] = (True, True)
        modes[monitoring.EXPORTER_ALLOWLIST_SCRIPT] = "755"
    packages = {NODE["package"]: ["1.9.1-1"]}
    if monitoring.is_monitor(context.rig):
        files |= {PROM["defaults_file"]: monitoring.prometheus_defaults(context.rig),
                  PROM["config"]: monitoring.prometheus_config(context.fleet, context.rig),
                  PROM["rules"]: monitoring.alert_rules(context.rig)}
        services[PROM["service"]] = (True, True)
        packages[PROM["package"]] = ["2.53.3+ds1-1"]
    base = fresh("debian-13")
    return base.with_(files=files, modes=modes, services=services,
                      packages={**base.packages, **packages})


def index(result: Plan, predicate: Any) -> int:
    return next(n for n, event in enumerate(result.events) if predicate(event))


def test_every_rig_gets_the_exporter_bound_to_its_address_before_the_package() -> None:
    result = run(fresh("debian-13"), **PUBLIC)
    assert not result.failed
    defaults = result.uploads[NODE["defaults_file"]]
    assert '--web.listen-address=192.0.2.10:9100' in defaults
    assert f"--collector.textfile.directory={NODE['textfile_dir']}" in defaults
    written = index(result, lambda e: e == ("upload", NODE["defaults_file"]))
    installed = index(result, lambda e: e[0] == "run" and "install" in e[1] and NODE["package"] in e[1].split())
    assert written < installed  # the postinst starts the exporter on our address, never the wildcard
    assert "--no-install-recommends" in result.events[installed][1]
    assert any(f"systemctl start {monitoring.COLLECTOR_TIMER}" in c for c in result.commands)
    assert any(f"systemctl enable {monitoring.COLLECTOR_TIMER}" in c for c in result.commands)
    assert not any(PROM["package"] in c.split() for c in result.commands)  # not a monitor


def test_a_rig_on_loopback_keeps_its_exporter_on_loopback_without_a_firewall() -> None:
    result = run(fresh("debian-13"))
    assert "--web.listen-address=127.0.0.1:9100" in result.uploads[NODE["defaults_file"]]
    assert monitoring.EXPORTER_ALLOWLIST_SCRIPT not in result.uploads


def test_an_exporter_beyond_loopback_admits_only_the_monitor_hosts_before_it_listens() -> None:
    result = run(fresh("debian-13"), **MONITOR)  # the monitor is the rig itself (192.0.2.10)
    script = result.uploads[monitoring.EXPORTER_ALLOWLIST_SCRIPT]
    assert "-A RIGFLEET-EXPORTER -i lo -j RETURN" in script
    assert "-A RIGFLEET-EXPORTER -s 192.0.2.10 -j RETURN" in script
    assert script.count("-j RETURN\n") == 2 and "-A RIGFLEET-EXPORTER -j DROP" in script
    assert 'JUMP="-p tcp --dport 9100 -j $CHAIN"' in script
    applied = index(result, lambda e: e[0] == "run" and f"systemctl start {monitoring.EXPORTER_ALLOWLIST_UNIT}" in e[1])
    installed = index(result, lambda e: e[0] == "run" and "install" in e[1] and NODE["package"] in e[1].split())
    assert applied < installed


def test_the_collector_queries_the_catalog_fields_and_the_declared_cap() -> None:
    uploads = run(fresh("debian-13"), **PUBLIC).uploads
    config = json.loads(uploads[monitoring.COLLECTOR_CONFIG])
    assert list(config["fields"])[:2] == ["index", "temperature.gpu"] and "clocks.sm" in config["fields"]
    assert config["xid_mark"] == "NVRM: Xid" and config["declared_cap_w"] == 290
    assert monitoring.COLLECTOR_CONFIG in uploads[f"{UNIT_DIR}/{monitoring.COLLECTOR_UNIT}"]


def test_the_monitor_gets_prometheus_with_its_config_checked_by_promtool() -> None:
    result = run(fresh("debian-13"), **MONITOR)
    assert not result.failed
    assert "--web.listen-address=127.0.0.1:9090" in result.uploads[PROM["defaults_file"]]
    assert PROM["rules"] in result.uploads[PROM["config"]]
    installed = index(result, lambda e: e[0] == "run" and "install" in e[1] and PROM["package"] in e[1].split())
    for path in (PROM["defaults_file"], PROM["config"], PROM["rules"]):
        assert index(result, lambda e, p=path: e == ("upload", p)) < installed
    checked = index(result, lambda e: e[0] == "run" and "promtool check config" in e[1])
    started = index(result, lambda e: e[0] == "run" and f"systemctl start {PROM['service']}" in e[1])
    assert installed < checked < started


def test_converged_monitoring_plans_nothing() -> None:
    for fields in (PUBLIC, MONITOR):
        result = run(converged(**fields), **fields)
        assert not result.failed and result.changes == [], result.changes


def test_a_new_scrape_interval_rewrites_the_config_and_restarts_only_prometheus() -> None:
    changed = {**MONITOR, "monitoring": {"scrape_interval_s": 30}}
    result = run(converged(**MONITOR), **changed)
    assert set(result.uploads) == {PROM["config"]}
    assert any(f"systemctl restart {PROM['service']}" in c for c in result.commands)
    assert not any(f"systemctl restart {NODE['service']}" in c for c in result.commands)


def test_a_new_exporter_address_restarts_the_exporter() -> None:
    result = run(converged(**PUBLIC), **{**PUBLIC, "monitoring": {"exporter_address": "0.0.0.0"}})
    assert "--web.listen-address=0.0.0.0:9100" in result.uploads[NODE["defaults_file"]]
    assert any(f"systemctl restart {NODE['service']}" in c for c in result.commands)


def test_monitoring_off_installs_nothing() -> None:
    result = run(fresh("debian-13"), **{**MONITOR, "monitoring": {"enabled": False}})
    assert not result.failed and result.uploads.keys() <= {PROM["defaults_file"], PROM["config"], PROM["rules"]}
