"""Serving end to end on a SIMULATED rig: swap, no-op, gate faults with rollback, `rigfleet rollback`.

The real `pyinfra -y inventory.py deploy.py` (every role) and the real `rigfleet rollback` run
against the sandbox rig over SSH; the engine is the stand-in vLLM, steered by its fault switch
in `engine_env` (rigfleet_sandbox.invfiles.fault_vars).
The tests run in file order and build on each other (release A, then B, then failed attempts
that must leave B serving, then a rollback to A). Serving state left by earlier modules is
cleared first, so the rig starts with no release whatever ran before. Like the other sandbox
modules, it deploys from a copy of the sandbox inventory holding only the pin set in use (the
sandbox also publishes a deliberately bad one for the guard's tests).

Run it under the shared sandbox lock: flock /tmp/rigfleet-e2e.lock pytest tests/sandbox/test_serving.py
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from rigfleet_sandbox import layout
from rigfleet_sandbox.invfiles import fault_vars
from tests import REPO_ROOT

from .conftest import Sandbox, chat_completion, group_pinset, module_inventory

RIG = "rig-01"
SANDBOX_RIGS = 1
SANDBOX_FRESH = os.environ.get("RIGFLEET_SERVING_FRESH") == "1"  # a freshly booted rig (slower)
DEPLOY_TIMEOUT_S = 1800
GATE_TIMEOUT_S = 120  # the stand-in engine boots in seconds; keeps the fault cases short
API_KEY = "sk-rigfleet-e2e-" + os.urandom(8).hex()  # release B requires it; read from the control machine's env
B = {"variant": "tq3-nomtp", "api_key": {"env": "RIGFLEET_E2E_API_KEY"}}

pytestmark = pytest.mark.sandbox

# What the module learns as it goes (the tests build on each other).
seen: dict[str, Any] = {}


def bin_path(name: str) -> str:
    return str(Path(sys.executable).parent / name)


@pytest.fixture(scope="module")
def inventory(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return module_inventory(sandbox, tmp_path_factory, pinsets=[group_pinset(sandbox)])


def host_vars(inventory: Path, **values: Any) -> None:
    values.setdefault("gate_timeout_s", GATE_TIMEOUT_S)
    (inventory / "host_vars" / f"{RIG}.yml").write_text(yaml.safe_dump(values), encoding="utf-8")


def env(inventory: Path) -> dict[str, str]:
    return {**os.environ, "RIGFLEET_INVENTORY": str(inventory), "RIGFLEET_E2E_API_KEY": API_KEY}


def deploy(inventory: Path) -> subprocess.CompletedProcess[str]:
    """The operator's converge, with pyinfra's JSON results on stdout and its log on stderr."""
    proc = subprocess.run([bin_path("pyinfra"), "-y", "--json", "inventory.py", "deploy.py"], cwd=REPO_ROOT,
                          env=env(inventory), capture_output=True, text=True, timeout=DEPLOY_TIMEOUT_S)
    print(proc.stderr[-6000:])
    return proc


def results(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    return dict(json.loads(proc.stdout)["results"])


def serving_op(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    ops = [op for op in results(proc)["operations"] if any("Serve release" in n for n in op.get("names", []))]
    assert len(ops) == 1, [op.get("names") for op in results(proc)["operations"]]
    return dict(ops[0])


def ledger(sandbox: Sandbox) -> dict[str, Any]:
    return dict(json.loads(sandbox.ssh(RIG, "sudo cat /var/lib/rigfleet/ledger.json").stdout))


def containers(sandbox: Sandbox) -> list[dict[str, str]]:
    out = sandbox.ssh(RIG, "sudo docker ps -a --filter label=io.rigfleet.release --format "
                           "'{{.ID}} {{.State}} {{.Label \"io.rigfleet.release\"}}'").stdout
    return [dict(zip(("id", "state", "release"), line.split(), strict=True)) for line in out.splitlines()]


def chat(sandbox: Sandbox, port: int, api_key: str | None = None) -> str:
    """A chat completion from the rig's port, from this machine (the rig's veth address only)."""
    address = sandbox.address(RIG)
    assert re.fullmatch(re.escape(layout.NET) + r"\.\d+\.2", address)
    return chat_completion(address, port, api_key)


def port_of(sandbox: Sandbox, release_id: str) -> int:
    meta = json.loads(sandbox.ssh(RIG, f"sudo cat /opt/rigfleet/releases/{release_id}/release.json").stdout)
    return int(meta["port"])


def serving_release(sandbox: Sandbox) -> str:
    running = [c for c in containers(sandbox) if c["state"] == "running"]
    assert len(running) == 1, running
    return running[0]["release"]


def test_clear_serving_state(sandbox: Sandbox, inventory: Path) -> None:
    """Whatever an earlier module left: no release, no ledger (the host layer and images stay).
    The chat template goes where model_weights looks when the sandbox mirror has none (the
    operator's documented step; the stand-in engine does not read it)."""
    sandbox.ssh(RIG, "for d in /opt/rigfleet/releases/*/; do [ -f \"$d/compose.yaml\" ] && "
                     "(cd \"$d\" && sudo docker compose down) ; done; "
                     "sudo rm -rf /opt/rigfleet/releases /opt/rigfleet/current /var/lib/rigfleet/ledger.json; true",
                check=False, timeout=300)
    sandbox.ssh(RIG, "sudo mkdir -p /srv/models/chat-templates && "
                     "{ [ -s /srv/models/chat-templates/froggeric.jinja ] || "
                     "echo '{{ messages }}' | sudo tee /srv/models/chat-templates/froggeric.jinja >/dev/null; }")
    host_vars(inventory)


def test_fresh_rig_serves(sandbox: Sandbox, inventory: Path) -> None:
    host_vars(inventory, gate="full")  # a healthy engine passes the canary's full gate too
    proc = deploy(inventory)
    assert proc.returncode == 0, proc.stderr[-3000:]
    book = ledger(sandbox)
    current = book["current"]
    assert current["variant"] == "tq3-mtp-genesis" and book["previous"] is None
    assert [a["result"] for a in book["attempts"]] == ["passed"]
    checks = {c["name"] for c in book["attempts"][0]["gate"]["checks"] if c["ok"]}
    assert {"genesis", "kv_pool", "needle_60k", "soak", "mtp_acceptance"} <= checks
    assert book["attempts"][0]["acceptance_length"] >= 2.0
    assert current["kv_pool_tokens"] and current["kv_pool_tokens"] > 0
    assert serving_release(sandbox) == current["release_id"]
    assert "Paris" in chat(sandbox, port_of(sandbox, current["release_id"]))
    link = sandbox.ssh(RIG, "readlink /opt/rigfleet/current").stdout.strip()
    assert link == f"/opt/rigfleet/releases/{current['release_id']}"
    mode = sandbox.ssh(RIG, f"sudo stat -c %a /opt/rigfleet/releases/{current['release_id']}/rigfleet.env").stdout
    assert mode.strip() == "600"
    seen["a"] = current["release_id"]
    seen["a_container"] = containers(sandbox)[0]["id"]


def test_second_deploy_changes_nothing(sandbox: Sandbox, inventory: Path) -> None:
    host_vars(inventory)
    proc = deploy(inventory)
    assert proc.returncode == 0, proc.stderr[-3000:]
    op = serving_op(proc)
    assert op.get("success", []) == [] and op.get("no_change"), op
    totals = results(proc)["totals"]
    print("second deploy totals:", totals)
    assert containers(sandbox)[0]["id"] == seen["a_container"]  # not restarted
    assert len(ledger(sandbox)["attempts"]) == 1


def test_variant_change_swaps_and_records_downtime(sandbox: Sandbox, inventory: Path) -> None:
    host_vars(inventory, **B)
    proc = deploy(inventory)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert API_KEY not in proc.stderr + proc.stdout  # passed on stdin into the 0600 env file only
    match = re.search(r"downtime: ([\d.]+) s", proc.stderr)
    assert match, "the measured downtime is printed"
    book = ledger(sandbox)
    assert book["current"]["variant"] == "tq3-nomtp" and book["previous"]["release_id"] == seen["a"]
    attempt = book["attempts"][-1]
    assert attempt["result"] == "passed" and attempt["downtime_s"] == pytest.approx(float(match.group(1)), abs=0.1)
    seen["b"] = book["current"]["release_id"]
    assert serving_release(sandbox) == seen["b"]
    assert not any(c["release"] == seen["a"] for c in containers(sandbox))  # compose down, not just stopped
    # The old container was stopped only after the new image existed.
    image = book["current"]["image"]
    created = sandbox.ssh(RIG, f"sudo docker image inspect --format '{{{{.Created}}}}' {image}").stdout.strip()
    stop = sandbox.ssh(RIG, f"sudo docker events --since {attempt_epoch(attempt['started'])} --until "
                            f"$(date +%s) --filter container={seen['a_container']} --filter event=die "
                            "--format '{{.Time}}'", timeout=60).stdout.split()
    assert stop and int(stop[0]) >= iso_epoch(created)
    assert "Paris" in chat(sandbox, port_of(sandbox, seen["b"]), API_KEY)  # the gate authenticated too
    with pytest.raises(urllib.error.HTTPError, match="401"):
        chat(sandbox, port_of(sandbox, seen["b"]))
    assert API_KEY not in sandbox.ssh(RIG, "ps -eo args").stdout


def attempt_epoch(iso: str) -> int:
    return iso_epoch(iso) - 5


def iso_epoch(iso: str) -> int:
    from datetime import datetime

    text = re.sub(r"(\.\d{6})\d*", r"\1", iso.strip().replace("Z", "+00:00"))
    text = re.sub(r" \+0000 UTC$", "+00:00", text)
    return int(datetime.fromisoformat(text).timestamp())


@pytest.mark.parametrize(("fault", "gate"), [("boot-crash", "basic"), ("unhealthy", "basic"),
                                             ("garbage-output", "full")])
def test_fault_restores_the_previous_release(sandbox: Sandbox, inventory: Path, fault: str, gate: str) -> None:
    host_vars(inventory, **B, **fault_vars(fault), gate=gate)
    attempts = len(ledger(sandbox)["attempts"])
    proc = deploy(inventory)
    assert proc.returncode != 0
    if proc.stdout.strip():  # with its only host failed, pyinfra stops at "No hosts remaining!" without JSON
        assert RIG in results(proc)["failed_hosts"]
    assert f"previous release {seen['b']} is serving again" in proc.stderr
    assert "engine log (last lines)" in proc.stderr
    book = ledger(sandbox)
    attempt = book["attempts"][-1]
    assert len(book["attempts"]) == attempts + 1
    assert attempt["result"] == "failed" and attempt["restored"] == seen["b"] and attempt["restore_ok"] is True
    assert attempt["gate"]["level"] == gate and attempt["log_tail"]
    assert book["current"]["release_id"] == seen["b"]
    assert serving_release(sandbox) == seen["b"]
    assert "Paris" in chat(sandbox, port_of(sandbox, seen["b"]), API_KEY)
    if fault == "garbage-output":  # a basic gate would have let it through: the full checks caught it
        failed = {c["name"] for c in attempt["gate"]["checks"] if not c["ok"] and not c["warning"]}
        assert failed & {"long_output", "needle_10k", "needle_30k", "needle_60k", "soak", "mtp_acceptance"}


def test_rollback_returns_to_the_previous_release(sandbox: Sandbox, inventory: Path) -> None:
    host_vars(inventory, **B)
    proc = subprocess.run([bin_path("rigfleet"), "rollback", RIG], cwd=REPO_ROOT, env=env(inventory),
                          capture_output=True, text=True, timeout=DEPLOY_TIMEOUT_S)
    print(proc.stdout, proc.stderr[-3000:])
    assert proc.returncode == 0
    assert re.search(r"downtime: [\d.]+ s", proc.stdout)
    book = ledger(sandbox)
    assert book["current"]["release_id"] == seen["a"] and book["previous"]["release_id"] == seen["b"]
    assert book["attempts"][-1]["kind"] == "rollback" and book["attempts"][-1]["result"] == "passed"
    assert serving_release(sandbox) == seen["a"]
    assert "Paris" in chat(sandbox, port_of(sandbox, seen["a"]))


def test_inventory_matching_the_rolled_back_release_is_a_no_op(sandbox: Sandbox, inventory: Path) -> None:
    host_vars(inventory)  # the inventory's own variant again: release A, which serves after the rollback
    proc = deploy(inventory)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert serving_op(proc).get("success", []) == []
    (inventory / "host_vars" / f"{RIG}.yml").unlink()
