"""Faults around a serving rig, on one SIMULATED rig, in file order (each test builds on the last):

1. a second operator deploys to the rig while a first deploy converges it (a variant swap, and a
   package to reinstall that waits behind dpkg locks the test holds): the
   second, through `pyinfra deploy.py` and through `rigfleet repin`, is refused at once naming the
   rig and the holder (the first deploy's user, machine, program and pid); `rigfleet status` still
   answers; the first deploy completes, its swap is the only ledger entry, and the lock is free after;
2. the engine dies after its gate passed (its container killed: `docker kill` also keeps Docker's
   restart policy from bringing it back, so it stays down, as an engine whose restarts keep failing
   does): `rigfleet status` shows it not healthy with the container's state; the next converge
   restarts that release through the gate and the ledger records a `recover` attempt saying why;
3. the disk fills during the weights download (the model dir on a 256 KiB tmpfs): the deploy fails
   saying so and that nothing was stopped; the same container keeps serving, the ledger unchanged;
4. drift made by hand that no shortcut may skip: a rigfleet file on the rig edited (the next
   converge writes it back, no swap), a held package unheld and removed (the next converge
   reinstalls it at its pin and holds it) and the serving container removed (the next converge
   recovers the release through its gate, a `recover` attempt in the ledger).

Runs after test_serving.py in CI (the rig serves already: the first converge here changes little).
Run it under the shared sandbox lock:
    flock /tmp/rigfleet-e2e.lock pytest tests/sandbox/test_serving_faults.py
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from rigfleet.riglock import LOCK_PATH
from tests import REPO_ROOT

from .conftest import Sandbox, group_pinset, module_inventory
from .test_faults import hold_locks, release_locks
from .test_serving import bin_path, chat, port_of

RIG = "rig-01"
SANDBOX_RIGS = 1
DEPLOY_TIMEOUT_S = 1800
GATE_TIMEOUT_S = 120
LEDGER = "/var/lib/rigfleet/ledger.json"
LOCK_SEEN_TIMEOUT_S = 120

pytestmark = pytest.mark.sandbox
seen: dict[str, Any] = {}


@pytest.fixture(scope="module")
def inventory(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return module_inventory(sandbox, tmp_path_factory, pinsets=[group_pinset(sandbox)],
                            rig_vars={RIG: {"gate_timeout_s": GATE_TIMEOUT_S}})


def host_vars(inventory: Path, **values: Any) -> None:
    (inventory / "host_vars" / f"{RIG}.yml").write_text(yaml.safe_dump({"gate_timeout_s": GATE_TIMEOUT_S, **values}))


def env(inventory: Path) -> dict[str, str]:
    return {**os.environ, "RIGFLEET_INVENTORY": str(inventory), "COLUMNS": "200"}


def deploy_argv() -> list[str]:
    return [bin_path("pyinfra"), "-y", "--json", "inventory.py", "deploy.py"]


def run(inventory: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, cwd=REPO_ROOT, env=env(inventory), capture_output=True, text=True,
                          timeout=DEPLOY_TIMEOUT_S)
    print(f"$ {' '.join(argv[:2])} -> exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}")
    return proc


def ledger(sandbox: Sandbox) -> dict[str, Any]:
    return dict(json.loads(sandbox.ssh(RIG, f"sudo cat {LEDGER}").stdout))


def lock_held(sandbox: Sandbox) -> bool:
    return sandbox.ssh(RIG, f"sudo flock -n {LOCK_PATH} true", check=False).returncode != 0


def status_row(inventory: Path) -> dict[str, Any]:
    proc = run(inventory, [bin_path("rigfleet"), "status", "--json"])
    assert proc.returncode == 0, proc.stderr
    return next(dict(row) for row in json.loads(proc.stdout) if row["rig"] == RIG)


def running_containers(sandbox: Sandbox) -> list[str]:
    out = sandbox.ssh(RIG, "sudo docker ps --filter label=io.rigfleet.release --format "
                           "'{{.ID}} {{.Label \"io.rigfleet.release\"}}'").stdout
    return out.split()


def test_the_rig_serves(sandbox: Sandbox, inventory: Path) -> None:
    sandbox.ssh(RIG, "sudo mkdir -p /srv/models/chat-templates && "
                     "{ [ -s /srv/models/chat-templates/froggeric.jinja ] || "
                     "echo '{{ messages }}' | sudo tee /srv/models/chat-templates/froggeric.jinja >/dev/null; }")
    proc = run(inventory, deploy_argv())
    assert proc.returncode == 0, "the first converge failed (its log is above)"
    assert not lock_held(sandbox), "the lock went with the deploy's connection"
    seen["a"] = ledger(sandbox)["current"]["release_id"]


def test_a_second_deploy_of_the_same_rig_is_refused_naming_the_holder(sandbox: Sandbox, inventory: Path,
                                                                      tmp_path: Path) -> None:
    host_vars(inventory, variant="tq3-nomtp")  # real work for the first deploy: a gated swap
    attempts = len(ledger(sandbox)["attempts"])
    # and a package to reinstall behind held dpkg locks: the first deploy waits there (apt's
    # DPkg::Lock::Timeout) while the others run, however fast the rest of its converge is
    sandbox.ssh(RIG, "sudo apt-mark unhold nvidia-container-toolkit >/dev/null && "
                     "sudo DEBIAN_FRONTEND=noninteractive apt-get remove -y nvidia-container-toolkit", timeout=300)
    locks = hold_locks(sandbox, 600)
    log = tmp_path / "first.log"
    with open(log, "wb") as out:
        first = subprocess.Popen(deploy_argv(), cwd=REPO_ROOT, env=env(inventory), stdout=out,
                                 stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + LOCK_SEEN_TIMEOUT_S
        while not lock_held(sandbox) and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert lock_held(sandbox), f"the first deploy never held the rig lock: {log.read_text()[-3000:]}"
        holder = f"(pyinfra, pid {first.pid})"
        second = run(inventory, deploy_argv())
        repin = run(inventory, [bin_path("rigfleet"), "repin", "--limit", RIG])
        during = status_row(inventory)  # status only reads: it takes no lock
        assert first.poll() is None, "the first deploy ended before the others ran: the test proved nothing"
    finally:
        release_locks(sandbox, locks)
        first_rc = first.wait(timeout=DEPLOY_TIMEOUT_S)
    print(log.read_text()[-4000:])
    refused = f"{RIG}: another deploy holds the rig lock {LOCK_PATH}: "
    out = second.stdout + second.stderr
    assert second.returncode != 0 and "Traceback" not in out
    assert refused in out and holder in out, out[-3000:]
    assert repin.returncode == 1 and "Traceback" not in repin.stdout + repin.stderr
    assert f"{RIG}: failed: rig lock" in repin.stdout and refused in repin.stdout and holder in repin.stdout
    assert during["reachable"]
    assert first_rc == 0, "the first deploy completed"
    book = ledger(sandbox)
    assert len(book["attempts"]) == attempts + 1, "only the first deploy's swap is in the ledger"
    assert book["attempts"][-1]["result"] == "passed" and book["current"]["variant"] == "tq3-nomtp"
    assert book["previous"]["release_id"] == seen["a"]
    assert running_containers(sandbox)[1::2] == [book["current"]["release_id"]]
    assert not lock_held(sandbox), "the lock went with the first deploy"
    seen["b"] = book["current"]["release_id"]


def test_engine_crash_after_the_gate_is_shown_and_the_next_converge_recovers_it(sandbox: Sandbox,
                                                                                inventory: Path) -> None:
    assert seen.get("b"), "needs the release the previous test deployed"
    b = seen["b"]
    [container, release] = running_containers(sandbox)
    assert release == b
    sandbox.ssh(RIG, f"sudo docker kill {container}")
    crashed = status_row(inventory)
    assert crashed["release_id"] == b and crashed["healthy"] is False
    assert any(d.startswith(f"serving: release {b} exited (Exited (137)") for d in crashed["drift"]), crashed
    attempts = len(ledger(sandbox)["attempts"])
    proc = run(inventory, deploy_argv())
    assert proc.returncode == 0, "the converge after the crash failed (its log is above)"
    assert f"release {b} passed its gate but its engine is not running (exited" in proc.stderr
    book = ledger(sandbox)
    assert len(book["attempts"]) == attempts + 1
    attempt = book["attempts"][-1]
    assert attempt["kind"] == "recover" and attempt["result"] == "passed" and attempt["release_id"] == b
    assert attempt["reason"].startswith(f"release {b} passed its gate but its engine is not running")
    assert attempt["from_release"] == seen["a"], "the previous release was the fallback"
    assert book["current"]["release_id"] == b and book["previous"]["release_id"] == seen["a"]
    assert running_containers(sandbox)[1::2] == [b]
    assert "Paris" in chat(sandbox, port_of(sandbox, b))
    after = status_row(inventory)
    assert after["healthy"] is True and not any(d.startswith("serving:") for d in after["drift"]), after


def test_disk_full_during_the_weights_download_keeps_the_release_serving(sandbox: Sandbox, inventory: Path) -> None:
    """The rig's model dir moves to a file system with room for the small files only (a 256 KiB
    tmpfs), so the download of the weights fills it: the deploy fails saying so, nothing stops."""
    assert seen.get("b"), "needs the release the earlier tests deployed"
    serving_before = running_containers(sandbox)
    attempts = len(ledger(sandbox)["attempts"])
    small = "/srv/models-small"
    sandbox.ssh(RIG, f"sudo sh -c 'mkdir -p {small} && mount -t tmpfs -o size=256k rigfleet-test-small {small}'")
    try:
        host_vars(inventory, variant="tq3-nomtp", model_dir=small, min_free_disk_gib=0)  # preflight lets it by
        proc = run(inventory, deploy_argv())
    finally:
        sandbox.ssh(RIG, f"sudo umount {small}; true", check=False)
        host_vars(inventory, variant="tq3-nomtp")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out
    assert f"no space left to write {small}/" in out, out[-3000:]
    assert "nothing was stopped: a running release keeps serving" in out and RIG in out
    book = ledger(sandbox)
    assert len(book["attempts"]) == attempts and book["current"]["release_id"] == seen["b"], "no swap was tried"
    assert running_containers(sandbox) == serving_before, "the same container keeps serving"
    assert "Paris" in chat(sandbox, port_of(sandbox, seen["b"]))


def test_a_file_edited_on_the_rig_by_hand_is_repaired_by_the_next_converge(sandbox: Sandbox,
                                                                           inventory: Path) -> None:
    """Drift no shortcut may skip: the apt fragment that keeps unattended-upgrades off the held
    stack, emptied by hand, is written back by the next converge; nothing else changes."""
    fragment = "/etc/apt/apt.conf.d/51rigfleet-unattended-blacklist"
    want = sandbox.ssh(RIG, f"sudo sha256sum {fragment}").stdout.split()[0]
    serving_before = running_containers(sandbox)
    sandbox.ssh(RIG, f"echo '// edited by hand' | sudo tee {fragment} >/dev/null")
    proc = run(inventory, deploy_argv())
    assert proc.returncode == 0, "the converge after the edit failed (its log is above)"
    assert sandbox.ssh(RIG, f"sudo sha256sum {fragment}").stdout.split()[0] == want, "the fragment is back"
    assert running_containers(sandbox) == serving_before, "a host file's repair swaps no release"


def test_a_held_package_removed_by_hand_is_reinstalled_and_held_by_the_next_converge(sandbox: Sandbox,
                                                                                    inventory: Path) -> None:
    """Package drift no shortcut may skip (the no-op reads package state once, in one batch): the
    toolkit's CLI package unheld and removed by hand, a pinned and held package on the converged
    rig, comes back at the same version and held, and the rig still answers."""
    package = "nvidia-container-toolkit"
    version = sandbox.ssh(RIG, f"dpkg-query -W -f '${{Version}}' {package}").stdout.strip()
    assert version and package in sandbox.ssh(RIG, "apt-mark showhold").stdout.split()
    sandbox.ssh(RIG, f"sudo apt-mark unhold {package} >/dev/null && "
                     f"sudo DEBIAN_FRONTEND=noninteractive apt-get remove -y {package}", timeout=300)
    assert sandbox.ssh(RIG, f"dpkg-query -W -f '${{Status}}' {package}", check=False).stdout.strip() != \
        "install ok installed", "removed by hand"
    proc = run(inventory, deploy_argv())
    assert proc.returncode == 0, "the converge after the removal failed (its log is above)"
    assert sandbox.ssh(RIG, f"dpkg-query -W -f '${{Status}} ${{Version}}' {package}").stdout.strip() == \
        f"hold ok installed {version}", "reinstalled at the pinned version, and held"
    assert package in sandbox.ssh(RIG, "apt-mark showhold").stdout.split(), "held again"
    assert "Paris" in chat(sandbox, port_of(sandbox, seen["b"]))


def test_a_container_removed_by_hand_is_recovered_by_the_next_converge(sandbox: Sandbox, inventory: Path) -> None:
    assert seen.get("b"), "needs the release the earlier tests deployed"
    b = seen["b"]
    [container, release] = running_containers(sandbox)
    assert release == b
    sandbox.ssh(RIG, f"sudo docker rm -f {container} >/dev/null")
    attempts = len(ledger(sandbox)["attempts"])
    proc = run(inventory, deploy_argv())
    assert proc.returncode == 0, "the converge after the removal failed (its log is above)"
    assert f"release {b} passed its gate but has no container any more" in proc.stderr
    book = ledger(sandbox)
    assert len(book["attempts"]) == attempts + 1 and book["attempts"][-1]["kind"] == "recover"
    assert book["attempts"][-1]["result"] == "passed" and book["current"]["release_id"] == b
    assert running_containers(sandbox)[1::2] == [b]
    assert "Paris" in chat(sandbox, port_of(sandbox, b))
