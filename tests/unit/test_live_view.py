"""`rigfleet status --watch` and the live fields of `status --json`.

The on-rig snippet runs against the SIMULATED engine and stand-in nvidia-smi of a local "rig"
(tests/unit/test_verify_command.py); the frame is drawn from collected rows at 80 columns.
"""

from __future__ import annotations

import base64
import io
import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from rich.console import Console

from rigfleet import live, runner, status, watch
from rigfleet.cli import main
from tests.unit.test_verify_command import RELEASE, local_exec, mapped, rigs, site  # noqa: F401 (fixtures)


def chat(url: str) -> None:
    body = json.dumps({"model": "qwen3.6-27b-autoround", "max_tokens": 60, "temperature": 0,
                       "messages": [{"role": "user", "content": "Write a sentence about bridges."}]}).encode()
    request = urllib.request.Request(url + "/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=60) as response:
        assert response.status == 200


def probe_locally(root: Path) -> dict[str, Any]:
    assert live.LiveProbe().command().endswith("| base64 -d | python3 -")  # the snippet below, encoded
    snippet = base64.b64encode(mapped(live.SNIPPET, root).encode()).decode()
    code, out = local_exec(root)(f"echo {snippet} | base64 -d | python3 -", "", lambda _: None, 60)
    assert code == 0, out
    return live.LiveProbe().process(out.splitlines())


def test_the_rig_snippet_reads_engine_gpus_and_ledger(rigs: Any) -> None:  # noqa: F811
    root = rigs("rig-01")
    chat((root / "engine.url").read_text())
    book = json.loads((root / "var/lib/rigfleet/ledger.json").read_text())
    book["attempts"] = [{"kind": "deploy", "release_id": RELEASE, "result": "passed", "ended": "t1",
                         "gate": {"level": "full", "ok": True, "checks": []}}]
    book["verifications"] = [{"kind": "verify", "release_id": RELEASE, "level": "soak", "result": "failed",
                              "ended": "t2", "gate": {"level": "soak", "ok": False, "checks": []}}]
    (root / "var/lib/rigfleet/ledger.json").write_text(json.dumps(book))
    row = live.row("rig-01", probe_locally(root), 280)
    assert row["release_id"] == RELEASE and row["variant"] == "int8-mtp" and row["health"] == "healthy"
    assert row["requests_running"] == 0 and row["requests_waiting"] == 0
    assert row["kv_cache_pct"] is not None and 0 <= row["kv_cache_pct"] <= 100
    assert row["tokens_per_s"] == 0.0  # idle during the one-second sample
    assert row["acceptance_length"] is not None and row["acceptance_length"] > 2.0  # the chat's MTP drafts
    assert [g["index"] for g in row["gpus"]] == [0, 1]
    for gpu in row["gpus"]:
        assert gpu["temp_c"] > 0 and gpu["power_cap_w"] > 0 and gpu["memory_total_mib"] > gpu["memory_used_mib"] > 0
    assert row["last_gate"] == {"result": "passed", "level": "full", "release_id": RELEASE, "when": "t1"}
    assert row["last_verify"] == {"result": "failed", "level": "soak", "release_id": RELEASE, "when": "t2"}


def test_a_stopped_engine_is_down_and_an_unreachable_rig_says_so(rigs: Any) -> None:  # noqa: F811
    root = rigs("rig-01")
    inspect = json.loads((root / "inspect.json").read_text())
    inspect[0]["State"]["Status"] = "exited"
    (root / "inspect.json").write_text(json.dumps(inspect))
    assert live.row("rig-01", probe_locally(root), None)["health"] == "down"
    gone = live.row("rig-02", None, 280)
    assert gone["health"] == "unreachable" and gone["reachable"] is False and gone["gpus"] == []


def fake_rows(tokens_per_s: float = 812.4) -> list[dict[str, Any]]:
    gpu = {"temp_c": 64.0, "power_w": 245.3, "power_cap_w": 280.0, "memory_used_mib": 22630.0,
           "memory_total_mib": 24576.0, "clock_sm_mhz": 1860.0}
    return [
        {"rig": "rig-lab-01", "reachable": True, "release_id": "tq3-mtp-genesis-0a1b2c", "variant": "tq3-mtp-genesis",
         "health": "healthy", "requests_running": 3, "requests_waiting": 12, "kv_cache_pct": 97.2,
         "tokens_per_s": tokens_per_s, "acceptance_length": 2.85, "xid_errors": 2, "power_cap_declared_w": 280,
         "gpus": [gpu | {"index": 0}, gpu | {"index": 1, "temp_c": 88.0}],
         "last_gate": {"result": "passed", "level": "full"}, "last_verify": {"result": "failed", "level": "soak"}},
        {"rig": "rig-prod-12", "reachable": True, "release_id": "int8-mtp-99", "variant": "int8-mtp",
         "health": "unhealthy", "requests_running": 0, "requests_waiting": 0, "kv_cache_pct": 0.0,
         "tokens_per_s": 0.0, "acceptance_length": None, "xid_errors": 0, "power_cap_declared_w": 300,
         "gpus": [gpu | {"index": 0}, gpu | {"index": 1}], "last_gate": {"result": "failed", "level": "smoke"},
         "last_verify": None},
        live.row("rig-13", None, 280),
    ]


def render(rows: list[dict[str, Any]], width: int = 80) -> list[str]:
    console = Console(file=io.StringIO(), width=width, color_system=None, highlight=False)
    console.print(watch.frame(rows))
    return console.file.getvalue().splitlines()  # type: ignore[attr-defined]


def test_the_frame_fits_80_columns_one_line_per_cell() -> None:
    lines = render(fake_rows())
    assert max(len(line) for line in lines) <= 80, "\n".join(lines)
    assert not any("…" in line for line in lines), "\n".join(lines)  # nothing cut at 80 columns either
    expected = {  # every cell of a rig, whole, on that rig's one line
        "rig-lab-01": ["tq3-mtp-genesis", "healthy", "3/12", "97%", "812", "2.85", "ok full", "FAIL soak"],
        "rig-prod-12": ["int8-mtp", "unhealthy", "0/0", "0%", "FAIL smoke"],
        "rig-13": ["offline"],
    }
    for rig, cells in expected.items():
        [line] = [line for line in lines if line.startswith(rig + " ") and "GiB" not in line]
        assert [cell for cell in cells if cell not in line] == [], line
    gpu_lines = [line for line in lines if "GiB" in line]
    assert len(gpu_lines) == 4
    assert all(cell in gpu_lines[1] for cell in ("rig-lab-01", "88 C", "245/280 W", "22.1/24.0 GiB", "1860 MHz"))
    assert gpu_lines[0].endswith(" 2") and not gpu_lines[1].rstrip().endswith(" 2")  # Xid: once per rig
    assert "245/280 W (want 300)" in gpu_lines[2]  # the cap a reboot lost is shown against the declared one
    headers = " ".join(lines[:8])
    assert all(h in headers for h in ("reqs", "KV", "tok/s", "acc", "gate", "verify", "temp", "power / cap", "Xid"))


def test_watch_count_bounds_the_refreshes(example_inventory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def collect(fleet: Any, names: Any = None) -> list[dict[str, Any]]:
        calls.append(1)
        return fake_rows(tokens_per_s=100.0 * len(calls))

    monkeypatch.setattr(live, "collect", collect)
    monkeypatch.setattr(watch.time, "sleep", lambda s: None)
    result = CliRunner().invoke(main, ["status", "--watch", "--count", "3", "--interval", "1"],
                                env={"RIGFLEET_INVENTORY": str(example_inventory), "COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert len(calls) == 3
    assert "300" in result.stdout and "rig-lab-01" in result.stdout  # the last frame is what stays on screen


@pytest.mark.parametrize(("args", "needles"), [
    (["--interval", "0"], ["--interval", "'0'", "1 to 3600"]),
    (["--count", "many"], ["--count", "'many'", "1 or more"]),
])
def test_bad_watch_options_exit_2_before_contacting(example_inventory: Path, monkeypatch: pytest.MonkeyPatch,
                                                    args: list[str], needles: list[str]) -> None:
    def refuse(*_: Any, **__: Any) -> Any:
        raise AssertionError("a rig was contacted")

    monkeypatch.setattr(live, "collect", refuse)
    result = CliRunner().invoke(main, ["status", "--watch", *args], env={"RIGFLEET_INVENTORY": str(example_inventory)})
    assert result.exit_code == 2, result.output
    [line] = result.stderr.strip().splitlines()
    assert all(needle in line for needle in needles), line


def run_locally(root: Path, source: str) -> list[str]:
    encoded = base64.b64encode(mapped(source, root).encode()).decode()
    code, out = local_exec(root)(f"echo {encoded} | base64 -d | python3 -", "", lambda _: None, 60)
    assert code == 0, out
    return out.splitlines()


def test_status_json_is_one_remote_command_per_rig_with_both_probes_fields(
        rigs: Any, example_inventory: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    root = rigs("rig-01")
    assert status.StatusAndLiveProbe().command().endswith("| base64 -d | python3 -")
    both = status.StatusAndLiveProbe().process(run_locally(root, status.both_source()))
    alone = status.RigProbe().process(run_locally(root, status.PROBE))
    assert both["status"] == alone  # the status program's output, unchanged by running beside the other
    calls: list[type] = []

    def read_facts(fleet: Any, names: list[str], fact: type, **_: Any) -> Any:
        calls.append(fact)
        return {"rig-01": both}, {name: runner.RigOutcome(name, reachable=name == "rig-01") for name in names}

    monkeypatch.setattr(runner, "read_facts", read_facts)
    result = CliRunner().invoke(main, ["status", "--json"], env={"RIGFLEET_INVENTORY": str(example_inventory)})
    assert result.exit_code == 0, result.output
    assert calls == [status.StatusAndLiveProbe]  # one fact, so one command per rig
    rows = {row["rig"]: row for row in json.loads(result.stdout)}
    mine = rows["rig-01"]
    assert set(live.LIVE_FIELDS) <= set(mine) and {"os", "driver", "drift", "release_id", "api_reach"} <= set(mine)
    assert mine["reachable"] is True and mine["release_id"] == RELEASE and mine["health"] == "healthy"
    assert mine["os"] and isinstance(mine["drift"], list) and [g["index"] for g in mine["gpus"]] == [0, 1]
    assert mine["kv_cache_pct"] is not None
    gone = rows["rig-02"]
    assert gone["reachable"] is False and gone["health"] == "unreachable" and gone["drift"] == ["unreachable"]
    assert set(gone) == set(mine)


def test_one_program_that_fails_leaves_the_other_s_output(rigs: Any) -> None:  # noqa: F811
    root = rigs("rig-01")
    out = status.StatusAndLiveProbe().process(run_locally(root, status.both_source("raise SystemExit(3)")))
    assert out["status"] is None and out["live"]["ledger"]["current"]["release_id"] == RELEASE


def test_an_unreachable_rig_is_an_offline_row_not_a_torn_frame(example_inventory: Path) -> None:
    """The example rigs are on a documentation network: the connect fails, and only the row says so."""
    result = CliRunner().invoke(main, ["status", "--watch", "--count", "1"],
                                env={"RIGFLEET_INVENTORY": str(example_inventory), "COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert [line.split()[:3] for line in result.stdout.splitlines() if line.startswith("rig-")] == [
        [rig, "-", "offline"] for rig in ("rig-01", "rig-02", "rig-11", "rig-12")]
    assert "Greenlet" not in result.output and "PyinfraError" not in result.output, result.output
