"""The monitoring files: the catalog's nvidia-smi fields against the real tool, the GPU collector run
against the SIMULATED nvidia-smi, the Prometheus targets and alert rules generated from an inventory.
promtool itself checks the rules on a sandbox monitor host (tests/sandbox/test_monitoring.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from rigfleet import catalog, monitoring
from rigfleet.loader import Fleet
from rigfleet.render import render
from rigfleet.schema import Rig
from rigfleet_sandbox import aptrepo, xid
from tests.plan.fakerig import context_for

REAL = Path(__file__).parents[1] / "fixtures" / "nvidia-smi" / "h200-580.159.04"
FIELDS = catalog.monitoring()["nvidia_smi"]["query_gpu"]


def real_fields() -> set[str]:
    """Every name `nvidia-smi --help-query-gpu` lists ("a" or "b" lines)."""
    names: set[str] = set()
    for line in (REAL / "help-query-gpu.txt").read_text().splitlines():
        if line.startswith('"'):
            names |= set(re.findall(r'"([^"]+)"', line))
    return names


def test_every_catalog_field_is_a_real_query_field() -> None:
    assert set(FIELDS) <= real_fields(), set(FIELDS) - real_fields()
    assert list(FIELDS)[0] == "index"  # the collector keys each row by it


@pytest.fixture
def standin(tmp_path: Path) -> dict[str, Any]:
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    version = aptrepo.DRIVER_VERSIONS[0]
    smi = bin_dir / "nvidia-smi"
    smi.write_bytes(aptrepo.render_asset("bin/nvidia-smi", version))
    smi.chmod(0o755)
    (state / "module-version").write_text(version + "\n")
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", RIGFLEET_SIM_NVIDIA_STATE_DIR=str(state))
    return {"bin": bin_dir, "env": env, "tmp": tmp_path}


def test_the_standin_answers_the_catalog_fields_as_the_real_tool_does(standin: dict[str, Any]) -> None:
    real = (REAL / "query-monitoring-csv-header.txt").read_text().splitlines()
    query = "--query-gpu=" + ",".join(FIELDS)
    header = subprocess.run([sys.executable, str(standin["bin"] / "nvidia-smi"), query, "--format=csv"],
                            capture_output=True, text=True, env=standin["env"], check=True).stdout.splitlines()
    assert header[0] == real[0]
    bare = subprocess.run([sys.executable, str(standin["bin"] / "nvidia-smi"), query, "--format=csv,noheader,nounits"],
                          capture_output=True, text=True, env=standin["env"], check=True).stdout.splitlines()
    real_bare = (REAL / "query-monitoring-csv-nounits.txt").read_text().splitlines()
    assert len(bare) == 2 and all(len(row.split(", ")) == len(real_bare[0].split(", ")) for row in bare)


def run_collector(standin: dict[str, Any], ledger: dict[str, Any], journal_lines: list[str]) -> str:
    tmp: Path = standin["tmp"]
    (tmp / "ledger.json").write_text(json.dumps(ledger))
    journal = tmp / "journal.txt"
    journal.write_text("".join(f"{line}\n" for line in journal_lines))
    out = tmp / "rigfleet.prom"
    config = {"out": str(out), "fields": FIELDS, "xid_mark": catalog.monitoring()["xid"]["marker"],
              "journal": ["cat", str(journal)], "ledger": str(tmp / "ledger.json"), "current": str(tmp / "none"),
              "declared_cap_w": 290}
    script, config_path = tmp / "collector.py", tmp / "collector.json"
    script.write_text(render("monitoring/rigfleet-collector.py.j2"))
    config_path.write_text(json.dumps(config))
    subprocess.run([sys.executable, str(script), str(config_path)], env=standin["env"], check=True)
    return out.read_text()


def test_the_collector_writes_the_gpu_fields_xids_and_ledger_results(standin: dict[str, Any]) -> None:
    ledger = {"current": {"release_id": "tq3-abc"}, "attempts": [{"result": "passed"}, {"result": "failed"}],
              "verifications": [{"result": "passed"}]}
    text = run_collector(standin, ledger, ["usb 1-1: new device", xid.line(79), xid.line(13, gpu=1)])
    assert 'rigfleet_gpu_temperature_celsius{gpu="0"} 34.0' in text
    assert 'rigfleet_gpu_memory_total_bytes{gpu="1"} ' + str(24576.0 * 1048576) in text
    assert 'rigfleet_gpu_power_limit_watts{gpu="0"} 350.0' in text
    assert 'rigfleet_gpu_power_cap_declared_watts{gpu="0"} 290' in text
    assert 'rigfleet_gpu_clock_sm_hertz{gpu="0"} 210000000.0' in text
    assert "# TYPE rigfleet_gpu_xid_errors_total counter\nrigfleet_gpu_xid_errors_total 2" in text
    assert 'rigfleet_release_info{release="tq3-abc"} 1' in text
    assert 'rigfleet_last_result_ok{kind="gate"} 0' in text and 'rigfleet_last_result_ok{kind="verify"} 1' in text
    assert "rigfleet_collector_gpu_success 1" in text
    assert "rigfleet_engine_healthy" not in text  # no release to ask


def test_the_collector_says_when_nvidia_smi_fails(standin: dict[str, Any]) -> None:
    (Path(standin["env"]["RIGFLEET_SIM_NVIDIA_STATE_DIR"]) / "module-version").write_text("1.0\n")  # mismatch
    text = run_collector(standin, {}, [])
    assert "rigfleet_collector_gpu_success 0" in text and "rigfleet_gpu_temperature" not in text
    assert "rigfleet_gpu_xid_errors_total 0" in text and 'rigfleet_release_info{release=""} 1' in text


def fleet_of(*rigs: dict[str, Any]) -> tuple[Fleet, list[Rig]]:
    base = context_for("debian-13")
    models = [base.rig.model_copy(update=fields) for fields in rigs]
    return Fleet(base.fleet.inventory_dir, tuple(models), base.fleet.pinsets), models


def test_targets_come_from_the_inventory() -> None:
    fleet, (mon, public, loop, wild) = fleet_of(
        {"name": "rig-01", "groups": ("monitor",)},
        {"name": "rig-02", "ssh_hostname": "192.0.2.12", "bind_address": "192.0.2.12"},
        {"name": "rig-03", "ssh_hostname": "192.0.2.13"},
        {"name": "rig-04", "ssh_hostname": "192.0.2.14", "bind_address": "0.0.0.0"})
    jobs = monitoring.targets(fleet, mon)
    node = {t["labels"]["rig"]: t["targets"][0] for t in jobs[monitoring.NODE_JOB]}
    # the monitor's own loopback is reachable; another rig's loopback is not scraped (it would be the monitor's)
    assert node == {"rig-01": "127.0.0.1:9100", "rig-02": "192.0.2.12:9100", "rig-04": "192.0.2.14:9100"}
    engine = {t["labels"]["rig"] for t in jobs[monitoring.ENGINE_JOB]}
    assert engine == {"rig-01", "rig-02", "rig-04"}
    assert all(t["labels"]["declared_release"].startswith("int8-") for t in jobs[monitoring.NODE_JOB])
    config = yaml.safe_load(monitoring.prometheus_config(fleet, mon))
    assert config["rule_files"] == [monitoring.prometheus()["rules"]]
    assert config["global"]["scrape_interval"] == "15s"


def test_alert_rules_cover_the_fleets_failures_with_the_operators_durations() -> None:
    rig = context_for("debian-13", monitoring={"kv_cache_full_for_s": 300, "gpu_hot_c": 85}).rig
    rules = {r["alert"]: r for r in yaml.safe_load(monitoring.alert_rules(rig))["groups"][0]["rules"]}
    assert set(rules) == {"RigDown", "EngineUnhealthy", "KvCacheFull", "GpuXidError", "GpuTooHot",
                          "PowerCapNotDeclared", "GateOrVerifyFailed", "PinDrift"}
    assert rules["KvCacheFull"]["expr"].endswith("> 0.95") and rules["KvCacheFull"]["for"] == "300s"
    assert "vllm:kv_cache_usage_perc" in rules["KvCacheFull"]["expr"]
    assert "vllm:gpu_cache_usage_perc" in rules["KvCacheFull"]["expr"]  # the name before vLLM 0.10
    assert rules["GpuTooHot"]["expr"] == "rigfleet_gpu_temperature_celsius > 85"
    assert "[3600s]" in rules["GpuXidError"]["expr"]
    assert rules["PinDrift"]["for"] == "1800s" and "declared_release" in rules["PinDrift"]["expr"]


def test_a_bad_monitoring_address_names_the_field() -> None:
    with pytest.raises(ValueError, match="exporter_address"):
        context_for("debian-13", monitoring={"exporter_address": "not-an-ip"})


def test_the_grafana_dashboard_reads_only_what_the_fleet_exports() -> None:
    from rigfleet.paths import CATALOG_DIR

    dashboard = json.loads((CATALOG_DIR / "grafana-fleet-dashboard.json").read_text())
    assert dashboard["__inputs"][0]["pluginId"] == "prometheus"
    script = render("monitoring/rigfleet-collector.py.j2")
    vllm = catalog.monitoring()["vllm"]
    known = {f"rigfleet_gpu_{suffix}" for suffix, _ in (v for v in FIELDS.values() if v)} | {
        vllm["num_requests_running"], vllm["num_requests_waiting"], *vllm["kv_cache_usage"], vllm["generation_tokens"],
        "up", "rigfleet_gpu_power_cap_declared_watts"}
    known |= set(re.findall(r'metric\("(rigfleet_\w+)"', script))
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    names = {n for e in exprs for n in re.findall(r"[a-z_:]+(?=[{\[ )/]|$)", e)
             if n.startswith(("rigfleet_", "vllm:", "up"))}
    assert names and names <= known, names - known


def test_a_rig_on_an_unknown_pin_set_is_still_scraped_and_shows_as_drift() -> None:
    fleet, (mon, lost) = fleet_of({"name": "rig-01", "groups": ("monitor",)},
                                  {"name": "rig-02", "ssh_hostname": "192.0.2.12", "bind_address": "192.0.2.12",
                                   "pinset": "gone"})
    jobs = monitoring.targets(fleet, mon)
    node = {t["labels"]["rig"]: t["labels"]["declared_release"] for t in jobs[monitoring.NODE_JOB]}
    assert node["rig-02"] == ""  # no declared release: whatever it serves is drift
    assert {t["labels"]["rig"] for t in jobs[monitoring.ENGINE_JOB]} == {"rig-01"}
