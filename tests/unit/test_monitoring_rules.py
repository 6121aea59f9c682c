"""The alert rules under Prometheus' own rule tester (`promtool test rules`), with the operator
defaults: each alert fires on the failure it names, after its `for:`, and not on a healthy rig.

promtool ships with the distribution's prometheus package; the test runs it from PATH or from
RIGFLEET_PROMTOOL (a promtool extracted from that package: `apt-get download prometheus` and
`dpkg-deb -x`), and is skipped where there is none. The sandbox's monitor host runs the
package's own promtool over the deployed rules in any case (tests/sandbox/test_monitoring.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from rigfleet import monitoring
from tests.plan.fakerig import context_for

PROMTOOL = os.environ.get("RIGFLEET_PROMTOOL") or shutil.which("promtool")
pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="no promtool (the prometheus package's) here")

NODE = {"job": "node", "instance": "192.0.2.10:9100", "rig": "rig-01", "declared_release": "int8-aaa"}
ENGINE = {"job": "vllm", "instance": "192.0.2.10:8011", "rig": "rig-01"}


def series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


def alert(labels: dict[str, str], summary: str) -> dict[str, Any]:
    return {"exp_labels": {"severity": "critical", **labels}, "exp_annotations": {"summary": summary}}


def test_the_rules_fire_for_what_they_name_and_only_then(tmp_path: Path) -> None:
    rig = context_for("debian-13").rig
    (tmp_path / "rules.yml").write_text(monitoring.alert_rules(rig))
    gpu0 = {**NODE, "gpu": "0"}
    healthy_engine = series("rigfleet_engine_healthy", NODE, "1x20")
    cases = [
        # a rig whose exporter stops answering: RigDown after 2 min, not before
        ([series("up", NODE, "1 1 0x10")],
         [("1m", "RigDown", []), ("3m", "RigDown", []),
          ("5m", "RigDown", [alert(NODE, "rig rig-01: node exporter not reachable")])]),
        # an engine whose /health fails while /metrics still answers
        ([series("up", ENGINE, "1x20"), series("rigfleet_engine_healthy", NODE, "1 0x20")],
         [("2m", "EngineUnhealthy", []),
          ("4m", "EngineUnhealthy", [alert(NODE, "rig rig-01: engine /health or /metrics not answering")])]),
        # KV cache above 95 % for 5 min (the pre-0.10 name counts too); 90 % never
        ([series("vllm:gpu_cache_usage_perc", ENGINE, "0.97x10"),
          series("vllm:kv_cache_usage_perc", {**ENGINE, "rig": "rig-02"}, "0.90x10")],
         [("4m", "KvCacheFull", []),
          ("6m", "KvCacheFull", [alert({"rig": "rig-01"}, "rig rig-01: KV cache above 95 %")])]),
        # one Xid: fires at once, resolves when the window (1 h) has passed
        ([series("rigfleet_gpu_xid_errors_total", NODE, "0 0 1x100")],
         [("1m", "GpuXidError", []),
          ("3m", "GpuXidError", [alert(NODE, "rig rig-01: NVIDIA Xid error in the kernel log")]),
          ("70m", "GpuXidError", [])]),
        # 86 C for 3 min
        ([series("rigfleet_gpu_temperature_celsius", gpu0, "86x5"),
          series("rigfleet_gpu_temperature_celsius", {**gpu0, "gpu": "1"}, "80x5")],
         [("3m", "GpuTooHot", [alert(gpu0, "rig rig-01 GPU 0: above 85 C")])]),
        # a cap a reboot lost (350 W instead of the declared 290 W), 10 min later
        ([series("rigfleet_gpu_power_limit_watts", gpu0, "350x15"),
          series("rigfleet_gpu_power_cap_declared_watts", gpu0, "290x15"),
          series("rigfleet_gpu_power_limit_watts", {**gpu0, "gpu": "1"}, "290x15"),
          series("rigfleet_gpu_power_cap_declared_watts", {**gpu0, "gpu": "1"}, "290x15")],
         [("5m", "PowerCapNotDeclared", []),
          ("11m", "PowerCapNotDeclared", [alert(gpu0, "rig rig-01 GPU 0: power cap is not the declared one")])]),
        # the last gate failed; the last verify passed
        ([series("rigfleet_last_result_ok", {**NODE, "kind": "gate"}, "0x3"),
          series("rigfleet_last_result_ok", {**NODE, "kind": "verify"}, "1x3"), healthy_engine],
         [("1m", "GateOrVerifyFailed", [alert({**NODE, "kind": "gate"}, "rig rig-01: last gate failed")])]),
        # rig-02 serves another release than the inventory declares, for 30 min; rig-01 its own
        ([series("rigfleet_release_info", {**NODE, "release": "int8-aaa"}, "1x40"),
          series("rigfleet_release_info", {**NODE, "rig": "rig-02", "instance": "192.0.2.12:9100",
                                           "release": "int8-old"}, "1x40")],
         [("20m", "PinDrift", []),
          ("31m", "PinDrift", [alert({**NODE, "rig": "rig-02", "instance": "192.0.2.12:9100", "release": "int8-old"},
                                     "rig rig-02 serves int8-old, the inventory declares int8-aaa")])]),
    ]
    tests = [{"interval": "1m", "input_series": inputs,
              "alert_rule_test": [{"eval_time": at, "alertname": name, "exp_alerts": expected}
                                  for at, name, expected in checks]}
             for inputs, checks in cases]
    (tmp_path / "tests.yml").write_text(yaml.safe_dump({"rule_files": ["rules.yml"], "evaluation_interval": "1m",
                                                        "tests": tests}))
    assert PROMTOOL is not None
    checked = subprocess.run([PROMTOOL, "check", "rules", "rules.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run([PROMTOOL, "test", "rules", "tests.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert tested.returncode == 0, tested.stdout + tested.stderr
