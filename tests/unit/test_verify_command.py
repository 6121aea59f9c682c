"""`rigfleet verify` end to end on the control side, against the SIMULATED engine served locally.

Each "rig" is a directory standing for its filesystem root (the release under opt/rigfleet, the
ledger under var/lib/rigfleet), a fake `docker` that reports the container and the engine's boot
log, and a local shell in place of SSH. The command, its stdin (the probe's files) and the ledger
writes are the ones a real rig gets; only the paths are moved under the rig's root.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from rigfleet import ledger, verify
from rigfleet.cli import main
from rigfleet_sandbox import aptrepo, engine
from tests.unit.test_guard import set_host
from tests.unit.test_sim_engine import PIN_A, Served
from tests.unit.test_verify_ladder import ARGS, GATE

RELEASE = "int8-mtp-abc"
FAKE_DOCKER = """#!/bin/sh
case "$1" in
  inspect) cat "$RIG_ROOT/inspect.json" ;;
  logs) cat "$RIG_ROOT/engine.log" ;;
  *) exit 1 ;;
esac
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("verify-site")
    engine.install_standin_vllm(root / "site", PIN_A, overlays=True)
    engine.build_weights(root)
    return root


def mapped(text: str, root: Path) -> str:
    """Rig paths moved under the rig's root."""
    for path in ("/opt/rigfleet", "/var/lib/rigfleet"):
        text = text.replace(path, f"{root}{path}")
    return text


def local_exec(root: Path) -> verify.Exec:
    """A shell on the 'rig': rig paths mapped under root, stderr handed over line by line."""
    bin_dir = root / "bin"
    env = {**os.environ, "RIG_ROOT": str(root), "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "RIGFLEET_SIM_NVIDIA_STATE_DIR": str(root / "nvidia-state")}

    def execute(command: str, stdin: str, on_line: Callable[[str], None], timeout: float) -> tuple[int, str]:
        proc = subprocess.Popen(["sh", "-c", mapped(command, root)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)
        out: list[str] = []
        reader = threading.Thread(target=lambda: out.append(proc.stdout.read() if proc.stdout else ""))
        reader.start()
        assert proc.stdin and proc.stderr
        proc.stdin.write(mapped(stdin, root))
        proc.stdin.close()
        for line in proc.stderr:
            on_line(line.rstrip("\n"))
        reader.join(timeout)
        return proc.wait(timeout), "".join(out)

    return execute


@pytest.fixture
def rigs(site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Path]]:
    """add(name, fault) -> the root of a 'rig' serving the simulated engine with that fault."""
    started: list[Served] = []
    execs: dict[str, verify.Exec] = {}

    def add(name: str, fault: str = "", **engine_env: str) -> Path:
        root = tmp_path / name
        state = root / "nvidia-state"  # the stand-in nvidia-smi's GPUs, which the engine's memory lands on
        state.mkdir(parents=True)
        (state / "module-version").write_text(aptrepo.DRIVER_VERSIONS[0] + "\n")
        served = Served(site / "site", site / "weights" / engine.WEIGHTS_NAME, ARGS,
                        {"RIGFLEET_SANDBOX_FAULT": fault, "RIGFLEET_SIM_NVIDIA_STATE_DIR": str(state), **engine_env})
        started.append(served)
        assert served.wait_ready(), served.log
        release = root / "opt/rigfleet/current"
        release.mkdir(parents=True)
        meta = {"release_id": RELEASE, "container_name": "vllm-test", "base_url": served.url(""),
                "served_model_names": ["qwen3.6-27b-autoround"], "needs_genesis": False, "mtp_tokens": 3,
                "max_model_len": 24576, "kv_predicted": None, "gate": GATE}
        (release / "release.json").write_text(json.dumps(meta))
        (release / "rigfleet.env").write_text("VLLM_API_KEY=\n")
        (root / "engine.log").write_text(served.log + "\n")
        (root / "inspect.json").write_text(json.dumps([{"Id": "c0ffee", "RestartCount": 0, "State": {
            "Status": "running", "ExitCode": 0}, "Config": {"Labels": {"io.rigfleet.release": RELEASE}}}]))
        book = {"schema": 1, "rig": name, "current": {"release_id": RELEASE, "variant": "int8-mtp"},
                "previous": None, "attempts": []}
        (root / "var/lib/rigfleet").mkdir(parents=True)
        (root / "var/lib/rigfleet/ledger.json").write_text(json.dumps(book))
        (root / "bin").mkdir()
        (root / "bin/docker").write_text(FAKE_DOCKER)
        (root / "bin/docker").chmod(0o755)
        (root / "bin/nvidia-smi").write_bytes(aptrepo.render_asset("bin/nvidia-smi", aptrepo.DRIVER_VERSIONS[0]))
        (root / "bin/nvidia-smi").chmod(0o755)
        (root / "engine.url").write_text(served.url(""))
        execs[name] = local_exec(root)
        return root

    @contextlib.contextmanager
    def connect(names: list[str]) -> Iterator[dict[str, verify.Exec | str]]:
        yield {name: execs.get(name) or "Connection refused" for name in names}

    monkeypatch.setattr(verify, "ssh_connect", lambda fleet: connect)
    yield add
    for served in started:
        served.stop()


def run(inventory: Path, *args: str) -> Any:
    return CliRunner().invoke(main, ["verify", *args], env={"RIGFLEET_INVENTORY": str(inventory), "COLUMNS": "80"})


def verifications(root: Path) -> list[dict[str, Any]]:
    return list(json.loads((root / "var/lib/rigfleet/ledger.json").read_text()).get("verifications", []))


def test_healthy_rig_passes_smoke_and_full_and_both_land_in_its_ledger(rigs: Any, example_inventory: Path) -> None:
    root = rigs("rig-01")
    smoke = run(example_inventory, "rig-01", "--level", "smoke", "--timeout", "60")
    assert smoke.exit_code == 0, smoke.output
    full = run(example_inventory, "rig-01", "--level", "full", "--timeout", "120", "--json")
    assert full.exit_code == 0, full.output
    rows = json.loads(full.stdout)
    assert [(r["rig"], r["ok"], r["level"], r["release_id"], r["recorded"]) for r in rows] == [
        ("rig-01", True, "full", RELEASE, True)]
    assert {"streaming", "tool_call", "degeneracy", "needle_2k", "soak", "mtp_acceptance"} <= {
        c["name"] for c in rows[0]["checks"]}
    # progress per rig as it went (stderr), then the summary table within 80 columns
    assert "rig-01  verify full of int8-mtp-abc" in full.stderr and "rig-01  streaming" in full.stderr
    table = smoke.stdout.splitlines()
    assert any(line.split("│")[1:3] and "rig-01" in line and "pass" in line for line in table), smoke.stdout
    assert max(len(line) for line in table) <= 80
    recorded = verifications(root)
    assert [(v["kind"], v["level"], v["result"], v["release_id"]) for v in recorded] == [
        ("verify", "smoke", "passed", RELEASE), ("verify", "full", "passed", RELEASE)]
    book = json.loads((root / "var/lib/rigfleet/ledger.json").read_text())
    assert book["current"]["release_id"] == RELEASE and book["attempts"] == []  # serving state untouched


def test_a_fault_fails_its_rig_naming_the_check_and_not_the_others(rigs: Any, example_inventory: Path) -> None:
    healthy, broken = rigs("rig-01"), rigs("rig-02", "bang-flood")
    result = run(example_inventory, "rig-01", "rig-02", "--level", "full", "--timeout", "120", "--json")
    assert result.exit_code == 1, result.output
    rows = {r["rig"]: r for r in json.loads(result.stdout)}
    assert rows["rig-01"]["ok"] and not rows["rig-02"]["ok"]
    assert "degeneracy" in rows["rig-02"]["failed"]
    assert "rig-02  FAILED: " in result.stderr and "degeneracy" in result.stderr
    assert verifications(healthy)[-1]["result"] == "passed"
    last = verifications(broken)[-1]
    assert last["result"] == "failed" and "degeneracy" in {c["name"] for c in last["gate"]["checks"] if not c["ok"]}


def test_soak_catches_a_late_failure_that_full_lets_through(rigs: Any, example_inventory: Path) -> None:
    root = rigs("rig-01", "late-failure", RIGFLEET_SANDBOX_LATE_AFTER="40")
    full = run(example_inventory, "rig-01", "--level", "full", "--timeout", "120")
    assert full.exit_code == 0, full.output
    soak = run(example_inventory, "rig-01", "--level", "soak", "--timeout", "120", "--json")
    assert soak.exit_code == 1, soak.output
    assert "soak_long" in json.loads(soak.stdout)[0]["failed"]
    assert [(v["level"], v["result"]) for v in verifications(root)] == [("full", "passed"), ("soak", "failed")]


def test_vram_growth_fails_full_and_the_inventory_limit_reaches_the_probe(rigs: Any, example_inventory: Path) -> None:
    """The engine's memory grows 64 MiB per GPU each request: the full level's short soak (2 x 3
    turns here) grows it by 768 MiB, over the default 200; a rig whose inventory allows 5000 passes
    (verify hands the inventory's limit to the probe, over the release.json it was deployed with)."""
    rigs("rig-01", "vram-growth")
    failed = run(example_inventory, "rig-01", "--level", "full", "--timeout", "120", "--json")
    assert failed.exit_code == 1, failed.output
    [row] = json.loads(failed.stdout)
    assert row["failed"] == ["vram_growth"]
    assert "more than 200 MiB" in next(c["detail"] for c in row["checks"] if c["name"] == "vram_growth")
    set_host(example_inventory, "rig-01", vram_growth_max_mib=5000)
    loose = run(example_inventory, "rig-01", "--level", "full", "--timeout", "120", "--json")
    assert loose.exit_code == 0, loose.output
    assert "at most 5000 MiB" in next(c["detail"] for c in json.loads(loose.stdout)[0]["checks"]
                                      if c["name"] == "vram_growth")


def test_unreachable_and_not_serving_rigs_fail(rigs: Any, example_inventory: Path) -> None:
    root = rigs("rig-01")
    book = {"schema": 1, "rig": "rig-01", "current": None, "previous": None, "attempts": []}
    (root / "var/lib/rigfleet/ledger.json").write_text(json.dumps(book))
    result = run(example_inventory, "rig-01", "rig-11", "--level", "smoke", "--timeout", "30", "--json")
    assert result.exit_code == 1
    rows = {r["rig"]: r for r in json.loads(result.stdout)}
    assert not rows["rig-01"]["ok"] and "not serving" in rows["rig-01"]["error"]
    assert not rows["rig-11"]["reachable"] and "Connection refused" in rows["rig-11"]["error"]
    assert verifications(root) == []  # nothing to record against


@pytest.mark.parametrize(("args", "needles"), [
    (["rig-01", "--level", "fast"], ["--level", "'fast'", "smoke, full, stress, soak"]),
    (["rig-99", "--level", "full"], ["rig-99", "no such rig", "rig-01"]),
    (["rig-01", "--timeout", "soon"], ["--timeout", "'soon'", "1 to 3600"]),
    (["--group", "nope"], ["--group", "'nope'", "groups: lab, prod"]),
])
def test_bad_input_is_one_line_exit_2_and_contacts_nothing(example_inventory: Path, monkeypatch: pytest.MonkeyPatch,
                                                          args: list[str], needles: list[str]) -> None:
    def refuse(fleet: Any) -> Any:
        raise AssertionError("a rig was contacted")

    monkeypatch.setattr(verify, "ssh_connect", refuse)
    result = run(example_inventory, *args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert all(needle in lines[0] for needle in needles), lines[0]
    assert "Traceback" not in result.output


def test_the_ledger_keeps_every_other_key_and_the_last_verifications_only() -> None:
    raw = {"schema": 1, "rig": "rig-01", "current": {"release_id": RELEASE}, "attempts": [{"result": "passed"}],
           "someone_elses": {"x": 1}}
    record = ledger.verification({"ok": False, "level": "soak", "checks": [
        {"name": "vram_growth", "ok": False, "detail": "+900 MiB", "warning": False}]}, "t0", release_id=RELEASE)
    book = ledger.record_verification(raw, record)
    assert {k: v for k, v in book.items() if k != "verifications"} == raw
    assert book["verifications"] == [record] and record["result"] == "failed" and record["level"] == "soak"
    for _ in range(ledger.MAX_VERIFICATIONS + 5):
        book = ledger.record_verification(book, record)
    assert len(book["verifications"]) == ledger.MAX_VERIFICATIONS
