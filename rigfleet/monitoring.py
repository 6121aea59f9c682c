"""What the monitoring roles write: the node exporter's arguments and the GPU collector on every rig,
and, on the rigs of the `monitor` group, Prometheus' arguments, scrape targets and alert rules.

Packages, files and ports come from catalog/monitoring.yaml; thresholds and `for:` durations from
the rig's `monitoring` settings (rigfleet.schema.Monitoring). The scrape targets are generated from
the inventory: each rig's node exporter (which also carries the GPU collector's textfile) and its
engine's own /metrics, labelled with the rig and the release the inventory declares for it, so
Prometheus itself can tell a rig that drifted from its pins.
"""

from __future__ import annotations

import json
from ipaddress import ip_address
from typing import Any

import yaml

from rigfleet import catalog, release
from rigfleet.errors import InputError
from rigfleet.loader import Fleet
from rigfleet.render import Release, clamped_power_limit, render
from rigfleet.rigstate import COLLECTOR_CONFIG, CURRENT_LINK, LEDGER_PATH
from rigfleet.schema import Rig

MONITOR_GROUP = "monitor"
COLLECTOR_SCRIPT = "/usr/local/lib/rigfleet/rigfleet-collector.py"
COLLECTOR_UNIT = "rigfleet-collector.service"
COLLECTOR_TIMER = "rigfleet-collector.timer"
COLLECTOR_FILE = "rigfleet.prom"
NODE_JOB, ENGINE_JOB = "node", "vllm"
EXPORTER_ALLOWLIST_SCRIPT = "/usr/local/sbin/rigfleet-exporter-allowlist"
EXPORTER_ALLOWLIST_UNIT = "rigfleet-exporter-allowlist.service"


def node() -> dict[str, Any]:
    return dict(catalog.monitoring()["node_exporter"])


def prometheus() -> dict[str, Any]:
    return dict(catalog.monitoring()["prometheus"])


def is_monitor(rig: Rig) -> bool:
    return MONITOR_GROUP in rig.groups


def _hostport(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def exporter_address(rig: Rig) -> str:
    return rig.monitoring.exporter_address or rig.bind_address


def node_exporter_defaults(rig: Rig) -> str:
    """/etc/default/prometheus-node-exporter: listen on the declared address only, read our textfile."""
    args = [f"--web.listen-address={_hostport(exporter_address(rig), node()['port'])}",
            f"--collector.textfile.directory={node()['textfile_dir']}"]
    return ("# Written by rigfleet (roles/node_exporter): the exporter listens only where the inventory says.\n"
            f'ARGS="{" ".join(args)}"\n')


def monitor_sources(fleet: Fleet) -> list[str]:
    """The addresses the monitor hosts scrape from: their ssh_hostname (the inventory's address of them)."""
    return list(dict.fromkeys(rig.ssh_hostname for rig in fleet.rigs if is_monitor(rig)))


def exporter_allowlist(fleet: Fleet, rig: Rig) -> dict[str, str] | None:
    """The INPUT allowlist of an exporter listening beyond loopback; None when it listens on loopback."""
    if ip_address(exporter_address(rig)).is_loopback:
        return None
    context = {"rig": rig, "port": node()["port"], "sources": monitor_sources(fleet),
               "script": EXPORTER_ALLOWLIST_SCRIPT}
    return {"script": render("firewall/rigfleet-exporter-allowlist.sh.j2", **context),
            "unit": render(f"systemd/{EXPORTER_ALLOWLIST_UNIT}.j2", **context)}


def collector_files(rig: Rig) -> dict[str, str]:
    """The GPU collector: its script and configuration, the oneshot unit that runs it and the timer."""
    data = catalog.monitoring()
    fields = {name: value for name, value in data["nvidia_smi"]["query_gpu"].items()}
    out = f"{node()['textfile_dir']}/{COLLECTOR_FILE}"
    config = {"out": out, "fields": fields, "xid_mark": data["xid"]["marker"], "journal": data["xid"]["journal_argv"],
              "ledger": LEDGER_PATH, "current": CURRENT_LINK, "declared_cap_w": clamped_power_limit(rig)}
    return {
        "script": render("monitoring/rigfleet-collector.py.j2"),
        "config": json.dumps(config, indent=1) + "\n",
        "service": render(f"monitoring/{COLLECTOR_UNIT}.j2", out=out, script=COLLECTOR_SCRIPT, config=COLLECTOR_CONFIG),
        "timer": render(f"monitoring/{COLLECTOR_TIMER}.j2", interval_s=rig.monitoring.collector_interval_s),
    }


def _scrape_address(address: str, rig: Rig, monitor: Rig) -> str | None:
    """Where the monitor reaches a rig's listener on `address`; None when it cannot (another rig's loopback)."""
    parsed = ip_address(address)
    if parsed.is_unspecified:
        return rig.ssh_hostname
    if parsed.is_loopback and rig.name != monitor.name:
        return None
    return address


def targets(fleet: Fleet, monitor: Rig) -> dict[str, list[dict[str, Any]]]:
    """Static scrape targets per job, from the inventory: (node exporter, engine) of every monitored rig."""
    jobs: dict[str, list[dict[str, Any]]] = {NODE_JOB: [], ENGINE_JOB: []}
    for rig in fleet.rigs:
        if not rig.monitoring.enabled:
            continue
        try:
            declared: Release | None = release.resolve(fleet, rig)
        except InputError:  # a rig the guard refuses still gets scraped; it can serve nothing declared
            declared = None
        labels = {"rig": rig.name, "declared_release": declared.release_id() if declared else ""}
        node_at = _scrape_address(exporter_address(rig), rig, monitor)
        if node_at is not None:
            jobs[NODE_JOB].append({"targets": [_hostport(node_at, node()["port"])], "labels": labels})
        engine_at = _scrape_address(rig.bind_address, rig, monitor)
        if engine_at is not None and declared is not None:
            jobs[ENGINE_JOB].append({"targets": [_hostport(engine_at, declared.port)], "labels": {"rig": rig.name}})
    return jobs


def prometheus_config(fleet: Fleet, monitor: Rig) -> str:
    interval = f"{monitor.monitoring.scrape_interval_s}s"
    config = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval,
                   "scrape_timeout": f"{min(10, monitor.monitoring.scrape_interval_s)}s"},
        "rule_files": [prometheus()["rules"]],
        "scrape_configs": [
            {"job_name": job, "metrics_path": catalog.monitoring()["vllm"]["metrics_path"] if job == ENGINE_JOB
             else "/metrics", "static_configs": static}
            for job, static in targets(fleet, monitor).items() if static
        ],
    }
    return "# Written by rigfleet (roles/monitor) from the inventory; rewritten on every deploy.\n" + \
        yaml.safe_dump(config, sort_keys=False, default_flow_style=False)


def prometheus_defaults(monitor: Rig) -> str:
    listen = _hostport(monitor.monitoring.prometheus_address, prometheus()["port"])
    return ("# Written by rigfleet (roles/monitor): Prometheus listens only where the inventory says.\n"
            f'ARGS="--web.listen-address={listen}"\n')


def alert_rules(monitor: Rig) -> str:
    """The fleet's alert rules; thresholds and `for:` from the monitor host's `monitoring` settings."""
    m = monitor.monitoring
    kv = " or ".join(f"max by (rig) ({name})" for name in catalog.monitoring()["vllm"]["kv_cache_usage"])
    drift = ('rigfleet_release_info unless on (rig, release) '
             'label_replace(rigfleet_release_info, "release", "$1", "declared_release", "(.*)")')

    def rule(name: str, expr: str, for_s: int, summary: str) -> dict[str, Any]:
        return {"alert": name, "expr": expr, "for": f"{for_s}s", "labels": {"severity": "critical"},
                "annotations": {"summary": summary}}

    rules = [
        rule("RigDown", f'up{{job="{NODE_JOB}"}} == 0', m.rig_down_for_s,
             "rig {{ $labels.rig }}: node exporter not reachable"),
        rule("EngineUnhealthy", f'up{{job="{ENGINE_JOB}"}} == 0 or rigfleet_engine_healthy == 0',
             m.engine_unhealthy_for_s, "rig {{ $labels.rig }}: engine /health or /metrics not answering"),
        rule("KvCacheFull", f"({kv}) > {m.kv_cache_full_ratio}", m.kv_cache_full_for_s,
             "rig {{ $labels.rig }}: KV cache above " + f"{round(m.kv_cache_full_ratio * 100)} %"),
        rule("GpuXidError", f"increase(rigfleet_gpu_xid_errors_total[{m.xid_window_s}s]) > 0", 0,
             "rig {{ $labels.rig }}: NVIDIA Xid error in the kernel log"),
        rule("GpuTooHot", f"rigfleet_gpu_temperature_celsius > {m.gpu_hot_c}", m.gpu_hot_for_s,
             "rig {{ $labels.rig }} GPU {{ $labels.gpu }}: above " + f"{m.gpu_hot_c} C"),
        rule("PowerCapNotDeclared", "abs(rigfleet_gpu_power_limit_watts - rigfleet_gpu_power_cap_declared_watts) > 1",
             m.power_cap_for_s, "rig {{ $labels.rig }} GPU {{ $labels.gpu }}: power cap is not the declared one"),
        rule("GateOrVerifyFailed", "rigfleet_last_result_ok == 0", 0,
             "rig {{ $labels.rig }}: last {{ $labels.kind }} failed"),
        rule("PinDrift", drift, m.drift_for_s,
             "rig {{ $labels.rig }} serves {{ $labels.release }}, "
             "the inventory declares {{ $labels.declared_release }}"),
    ]
    return "# Written by rigfleet (roles/monitor); rewritten on every deploy.\n" + \
        yaml.safe_dump({"groups": [{"name": "rigfleet", "rules": rules}]}, sort_keys=False, default_flow_style=False)
