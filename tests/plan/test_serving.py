"""Plan-level tests of the serving operation: faked facts decide between no-op and one swap, and
the swap's commands run against an in-memory rig (ordering, refusals, rollback, ledger)."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pyinfra.api import FunctionCommand
from pyinfra.connectors.util import CommandOutput, OutputLine

from rigfleet import catalog, guard, ledger
from rigfleet.context import RigContext
from rigfleet.facts.serving import RELEASES_DIR, ServingState
from rigfleet.loader import load_fleet
from rigfleet.operations import serving as ops
from rigfleet.roles.serving import base_url, release_spec
from rigfleet_sandbox.invfiles import FAULT_ENV, fault_vars
from tests.conftest import write_yaml

LEDGER = ledger.LEDGER_PATH


def context(inventory: Path, rig: str = "rig-01", **update: Any) -> RigContext:
    fleet = load_fleet(inventory)
    model = fleet.rig(rig).model_copy(update=update)
    return RigContext(fleet, model, fleet.pinsets[model.pinset], catalog.variants()[model.variant])


@pytest.fixture(autouse=True)
def hf_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")


class FakeRig:
    """Just enough of a rig for the swap: files, images, rigfleet containers, a clock and a gate."""

    def __init__(self) -> None:
        self.files: dict[str, str] = {}
        self.images: set[str] = set()
        self.containers: list[dict[str, Any]] = []
        self.gate_ok: dict[str, bool] = {}  # release id -> gate verdict (default: passes)
        self.commands: list[str] = []
        self.stdin: dict[str, str] = {}
        self.current_link: str | None = None
        self.clock = 1000.0
        self.serial = 0
        self.config_ok = True
        self.up_fails: set[str] = set()  # release ids whose `compose up` fails (port taken, ...)
        self.logs: list[str] = []
        self.name = "rig-01"
        self.print_prefix = "[rig-01] "

    # -- what the operation reads --

    def observed(self, release_id: str = "") -> dict[str, Any]:
        env = self.files.get(f"{RELEASES_DIR}/{release_id}/rigfleet.env")
        return {
            "ledger": json.loads(self.files[LEDGER]) if LEDGER in self.files else None,
            "docker": True,
            "containers": [dict(c) for c in self.containers],
            "env_sha256": hashlib.sha256(env.encode()).hexdigest() if env is not None else None,
            "release_dir": f"{RELEASES_DIR}/{release_id}/compose.yaml" in self.files,
        }

    @property
    def ledger(self) -> dict[str, Any]:
        return dict(json.loads(self.files[LEDGER]))

    def running(self) -> list[str]:
        return [c["release"] for c in self.containers if c["status"] == "running"]

    # -- pyinfra Host surface used by the FunctionCommand --

    def log_styled(self, message: str, **kwargs: Any) -> None:
        self.logs.append(message)

    def run_shell_command(self, command: Any, **kwargs: Any) -> tuple[bool, CommandOutput]:
        cmd = command.get_raw_value() if hasattr(command, "get_raw_value") else str(command)
        self.commands.append(cmd)
        assert set(kwargs) <= {"_sudo", "_stdin", "_timeout"}, kwargs
        ok, out = self.respond(cmd, kwargs.get("_stdin"))
        return ok, CommandOutput([OutputLine("stdout", line) for line in out.splitlines()])

    def respond(self, cmd: str, stdin: str | None) -> tuple[bool, str]:
        self.clock += 1  # one remote command, one tick of the rig's clock
        # the swap's compound commands: stop a release then read the clock; compose up then the gate
        if m := re.match(r"if test -f (\S+)/compose.yaml; then cd \S+ && docker compose down; "
                         r"else docker rm -f (.*); fi >&2 && date \+%s\.%N$", cmd):
            directory = m.group(1).strip("'")
            if f"{directory}/compose.yaml" in self.files:
                self.answer(f"cd {m.group(1)} && docker compose down", None)
            else:
                ids = {i.strip("'") for i in m.group(2).split()}
                self.containers = [c for c in self.containers if c["id"] not in ids]
            return True, f"{self.clock:.3f}"
        if m := re.match(r"\( (.*) \) >&2 \|\| \{ echo .*; exit 1; \}; (.*)$", cmd):
            ok, _ = self.answer(m.group(1), None)
            return self.answer(m.group(2), None) if ok else (False, ops.UP_FAILED)
        return self.answer(cmd, stdin)

    def answer(self, cmd: str, stdin: str | None) -> tuple[bool, str]:
        if "base64 -d | python3 -" in cmd:
            rid = cmd.rsplit(" ", 1)[-1].strip("'")
            return True, json.dumps(self.observed("" if rid == "-" else rid))
        if 'mv -f "$t"' in cmd:
            path = cmd.rsplit(" ", 1)[-1].strip("'")
            assert stdin is not None
            self.files[path] = stdin
            self.stdin[path] = stdin
            return True, ""
        if m := re.search(r"cd (\S+) && docker compose (.*)$", cmd):
            rid, args = m.group(1).strip("'").rsplit("/", 1)[-1], m.group(2)
            if args.startswith("config"):
                return self.config_ok, ""
            if args.startswith("down"):
                self.containers = [c for c in self.containers if c["release"] != rid]
                return True, ""
            if args.startswith("up") and rid in self.up_fails:
                return False, ""
            if args.startswith("up"):
                self.containers = [c for c in self.containers if c["release"] != rid]
                self.serial += 1
                self.containers.append({"id": f"c{self.serial}", "name": "vllm", "status": "running",
                                        "health": "starting", "restart_count": 0, "release": rid})
                return True, ""
        if m := re.search(r"docker image inspect (\S+)", cmd):
            return m.group(1).strip("'") in self.images, ""
        if m := re.search(r"test -f (\S+)/compose.yaml", cmd):
            return f"{m.group(1).strip(chr(39))}/compose.yaml" in self.files, ""
        if cmd.startswith("date"):
            return True, f"{self.clock:.3f}"
        if m := re.search(r"probe.py (\S+) --level (\S+)", cmd):
            rid = m.group(1).strip("'").rsplit("/", 1)[-1]
            ok = self.gate_ok.get(rid, True)
            running = [c for c in self.containers if c["release"] == rid]
            return ok, json.dumps({
                "ok": ok, "level": m.group(2), "ready_epoch": self.clock + 4.5, "kv_pool_tokens": 1_221_472,
                "container": {"id": running[0]["id"] if running else None},
                "checks": [{"name": "health", "ok": True, "detail": "", "warning": False},
                           {"name": "chat", "ok": ok, "detail": "" if ok else "no 'Paris'", "warning": False}],
                "log_tail": ["Traceback: boom"] if not ok else [],
            })
        if m := re.search(r"^cat (\S+)$", cmd):
            path = m.group(1).strip("'")
            return (path in self.files), self.files.get(path, "")
        if m := re.search(r"ln -sfn (\S+) ", cmd):
            self.current_link = m.group(1).strip("'")
            return True, ""
        if cmd.startswith("docker logs"):
            return True, "engine log line"
        if re.match(r"^(mkdir|set -e)", cmd):
            return True, ""
        raise AssertionError(f"unexpected command: {cmd}")


def run_swap(rig: FakeRig, spec: ops.ReleaseSpec) -> None:
    ops.apply_release(None, rig, spec, {"_sudo": True})  # type: ignore[arg-type]


def plan(rig: FakeRig, spec: ops.ReleaseSpec, monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], list[str]]:
    """Run the operation generator with facts served by the fake rig: (commands, noop reasons)."""
    noops: list[str] = []

    def get_fact(fact: type, **kwargs: Any) -> Any:
        assert fact is ServingState
        return ServingState().process([json.dumps(rig.observed(kwargs.get("release_id", "")))])

    fake = SimpleNamespace(get_fact=get_fact, noop=noops.append, current_op_global_arguments={"_sudo": True,
                                                                                               "_timeout": 5})
    monkeypatch.setattr(ops, "pyinfra_host", fake)
    monkeypatch.setattr(ops.cache, "fact", get_fact)  # the op reads its facts through rigfleet.facts.cache
    return list(ops.release._inner(spec)), noops  # type: ignore[attr-defined]


def deployed(example_inventory: Path, **update: Any) -> tuple[FakeRig, ops.ReleaseSpec]:
    rig = FakeRig()
    spec = release_spec(context(example_inventory, **update))
    rig.images.add(spec.image)
    run_swap(rig, spec)
    return rig, spec


# --- facts decide: no-op or one swap -------------------------------------------------------------

def test_fresh_rig_plans_one_swap(example_inventory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = release_spec(context(example_inventory))
    commands, noops = plan(FakeRig(), spec, monkeypatch)
    assert len(commands) == 1 and isinstance(commands[0], FunctionCommand) and not noops
    assert commands[0].function is ops.apply_release
    assert commands[0].args == (spec, {"_sudo": True})  # only who runs commands, not _timeout
    assert repr(ops.auth_arguments({"_sudo": True, "_sudo_password": "hunter2"})) == "Auth(_sudo, _sudo_password)"


def test_current_release_plans_nothing(example_inventory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rig, spec = deployed(example_inventory)
    commands, noops = plan(rig, spec, monkeypatch)
    assert commands == [] and "is current" in noops[0]


def test_other_variant_plans_one_swap(example_inventory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rig, _ = deployed(example_inventory)
    commands, _ = plan(rig, release_spec(context(example_inventory, variant="tq3-nomtp")), monkeypatch)
    assert len(commands) == 1


def test_stopped_or_unhealthy_container_plans_a_swap(example_inventory: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    rig, spec = deployed(example_inventory)
    rig.containers[0]["health"] = "unhealthy"
    assert len(plan(rig, spec, monkeypatch)[0]) == 1
    rig.containers[0].update(health="healthy", status="exited")
    assert len(plan(rig, spec, monkeypatch)[0]) == 1
    rig.containers.clear()  # the host roles took it down for a driver reboot
    assert len(plan(rig, spec, monkeypatch)[0]) == 1


def test_rotated_secret_plans_a_swap(example_inventory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rig, spec = deployed(example_inventory)
    monkeypatch.setenv("HF_TOKEN", "hf_rotated")
    assert len(plan(rig, spec, monkeypatch)[0]) == 1


def test_missing_secret_plans_a_swap_that_fails_only_this_rig(example_inventory: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    rig, spec = deployed(example_inventory)
    monkeypatch.delenv("HF_TOKEN")
    [command] = plan(rig, spec, monkeypatch)[0]  # no exception at plan time: that would abort every rig
    before = list(rig.commands)
    with pytest.raises(ops.SecretError, match="HF_TOKEN is not set"):
        run_swap(rig, spec)
    assert rig.commands == before  # refused before touching the rig


def test_spec_repr_and_release_json_hold_no_secret(example_inventory: Path) -> None:
    ctx = context(example_inventory, "rig-11")
    spec = release_spec(ctx)
    assert repr(spec) == f"ReleaseSpec(rig-11, {spec.release_id})"
    assert "hf_secret_value" not in json.dumps(spec.meta.to_json()) + json.dumps(spec.files)
    assert spec.meta.base_url == "http://10.0.0.1:8015" and spec.level == "full"
    assert "rigfleet.env" not in spec.files


def test_base_url_for_wildcard_and_ipv6_binds(example_inventory: Path) -> None:
    rig = context(example_inventory).rig
    assert base_url(rig, 8015) == "http://127.0.0.1:8015"
    assert base_url(rig.model_copy(update={"bind_address": "::"}), 1) == "http://[::1]:1"
    assert base_url(rig.model_copy(update={"bind_address": "fd00::2"}), 1) == "http://[fd00::2]:1"


# --- the swap ------------------------------------------------------------------------------------

def test_fresh_rig_release_is_written_gated_and_recorded(example_inventory: Path) -> None:
    rig, spec = deployed(example_inventory)
    directory = f"{RELEASES_DIR}/{spec.release_id}"
    assert {f"{directory}/{n}" for n in ("compose.yaml", "rigfleet.env", "release.json")} <= set(rig.files)
    assert "HUGGING_FACE_HUB_TOKEN=hf_secret_value" in rig.files[f"{directory}/rigfleet.env"]
    env_write = next(c for c in rig.commands if c.endswith(f"{directory}/rigfleet.env"))
    assert "chmod 0600" in env_write and "hf_secret_value" not in " ".join(rig.commands)  # stdin only
    assert rig.running() == [spec.release_id] and rig.current_link == directory
    book = rig.ledger
    assert book["current"]["release_id"] == spec.release_id and book["previous"] is None
    assert book["current"]["kv_pool_tokens"] == 1_221_472 and book["current"]["pinset"] == "seed-2026-05"
    [attempt] = book["attempts"]
    assert attempt["result"] == "passed" and attempt["downtime_s"] is None  # nothing was serving before
    assert any(line.startswith("downtime: none") for line in rig.logs)


def test_variant_change_stops_the_old_release_only_after_checks(example_inventory: Path) -> None:
    rig, old = deployed(example_inventory)
    new = release_spec(context(example_inventory, variant="tq3-nomtp"))
    rig.images.add(new.image)
    rig.commands.clear()
    run_swap(rig, new)
    index = {name: next(i for i, c in enumerate(rig.commands) if pattern in c) for name, pattern in {
        "config": f"{new.release_id} && docker compose config", "image": "docker image inspect",
        "down_old": f"{old.release_id} && docker compose down", "up_new": f"{new.release_id} && docker compose up",
        "gate": "python3 /opt/rigfleet/gate/probe.py"}.items()}
    assert index["config"] < index["down_old"] and index["image"] < index["down_old"]
    assert index["down_old"] < index["up_new"] == index["gate"]  # one command: up, and only then the gate
    start = rig.commands[index["gate"]]
    assert start.index("docker compose up") < start.index("|| {") < start.index("probe.py")
    assert "--force-recreate" in rig.commands[index["up_new"]]
    assert rig.running() == [new.release_id]
    book = rig.ledger
    assert book["current"]["release_id"] == new.release_id and book["previous"]["release_id"] == old.release_id
    assert book["attempts"][-1]["downtime_s"] == pytest.approx(4.5, abs=3)
    assert any(line.startswith("downtime: ") and " s " in line for line in rig.logs)


def test_missing_image_is_refused_before_anything_stops(example_inventory: Path) -> None:
    rig, old = deployed(example_inventory)
    new = release_spec(context(example_inventory, variant="tq3-nomtp"))
    rig.images.clear()  # e.g. a new pin set whose image the vllm_image role has not built
    with pytest.raises(ops.ServingError, match="refusing to stop"):
        run_swap(rig, new)
    assert rig.running() == [old.release_id]
    assert not any("docker compose down" in c for c in rig.commands)
    assert rig.ledger["attempts"][-1]["result"] == "refused"
    assert rig.ledger["current"]["release_id"] == old.release_id


def test_invalid_compose_is_refused_before_anything_stops(example_inventory: Path) -> None:
    rig, old = deployed(example_inventory)
    new = release_spec(context(example_inventory, variant="tq3-nomtp"))
    rig.images.add(new.image)
    rig.config_ok = False
    with pytest.raises(ops.ServingError, match="compose config"):
        run_swap(rig, new)
    assert rig.running() == [old.release_id]


def test_a_rehearsal_fault_reaches_the_engine_as_ordinary_engine_env(example_inventory: Path) -> None:
    # rigfleet has no fault field: the sandbox's switch is loaded, guarded and rendered like any engine setting
    before = release_spec(context(example_inventory))
    write_yaml(example_inventory / "host_vars" / "rig-01.yml", fault_vars("boot-crash"))
    fleet = load_fleet(example_inventory)
    assert not [p for p in guard.check(fleet) if not p.warning]
    faulty = release_spec(context(example_inventory))
    assert re.search(rf"^ +{FAULT_ENV}: \"?boot-crash\"?$", faulty.files["compose.yaml"], re.M)
    assert FAULT_ENV not in before.files["compose.yaml"]
    assert faulty.release_id != before.release_id  # the fault is a change to deploy, and clearing it another


def test_failed_gate_restores_the_previous_release(example_inventory: Path) -> None:
    rig, old = deployed(example_inventory)
    new = release_spec(context(example_inventory, engine_env={"VLLM_LOGGING_LEVEL": "DEBUG"}, gate="full"))
    rig.images.add(new.image)
    rig.gate_ok[new.release_id] = False
    with pytest.raises(ops.ServingError) as raised:
        run_swap(rig, new)
    message = str(raised.value)
    assert "failed the full gate" in message and f"previous release {old.release_id} is serving again" in message
    assert "Traceback: boom" in "\n".join(rig.logs)  # the engine's last log lines are printed
    assert rig.running() == [old.release_id]
    assert rig.current_link == f"{RELEASES_DIR}/{old.release_id}"
    restore_gate = [c for c in rig.commands if "probe.py" in c][-1]
    assert old.release_id in restore_gate and "--level basic" in restore_gate
    book = rig.ledger
    attempt = book["attempts"][-1]
    assert attempt["result"] == "failed" and attempt["restored"] == old.release_id and attempt["restore_ok"]
    assert attempt["gate"]["ok"] is False and attempt["downtime_s"] is not None
    assert book["current"]["release_id"] == old.release_id  # unchanged


def test_failed_start_restores_the_previous_release(example_inventory: Path) -> None:
    rig, old = deployed(example_inventory)
    new = release_spec(context(example_inventory, variant="tq3-nomtp"))
    rig.images.add(new.image)
    rig.up_fails.add(new.release_id)
    with pytest.raises(ops.ServingError, match="is serving again"):
        run_swap(rig, new)
    assert rig.running() == [old.release_id]
    assert rig.ledger["attempts"][-1]["gate"]["checks"][0]["name"] == "swap"


def test_failed_first_deploy_leaves_nothing_running(example_inventory: Path) -> None:
    rig = FakeRig()
    spec = release_spec(context(example_inventory))
    rig.images.add(spec.image)
    rig.gate_ok[spec.release_id] = False
    with pytest.raises(ops.ServingError, match="no previous release"):
        run_swap(rig, spec)
    assert rig.running() == []
    assert rig.ledger["current"] is None and rig.ledger["attempts"][-1]["result"] == "failed"


def test_rollback_returns_to_the_previous_release(example_inventory: Path) -> None:
    rig, old = deployed(example_inventory)
    new = release_spec(context(example_inventory, variant="tq3-nomtp"))
    rig.images.add(new.image)
    run_swap(rig, new)
    ops.apply_rollback(None, rig, "rig-01", "basic", 60, {"_sudo": True})  # type: ignore[arg-type]
    assert rig.running() == [old.release_id]
    book = rig.ledger
    assert book["current"]["release_id"] == old.release_id and book["previous"]["release_id"] == new.release_id
    assert book["attempts"][-1]["kind"] == "rollback" and book["attempts"][-1]["result"] == "passed"


def test_failed_rollback_restarts_what_was_serving(example_inventory: Path) -> None:
    rig, old = deployed(example_inventory)
    new = release_spec(context(example_inventory, variant="tq3-nomtp"))
    rig.images.add(new.image)
    run_swap(rig, new)
    rig.gate_ok[old.release_id] = False
    with pytest.raises(ops.ServingError):
        ops.apply_rollback(None, rig, "rig-01", "basic", 60, {"_sudo": True})  # type: ignore[arg-type]
    assert rig.running() == [new.release_id] and rig.ledger["current"]["release_id"] == new.release_id


def test_rollback_without_previous_release_is_refused(example_inventory: Path) -> None:
    rig, _ = deployed(example_inventory)
    with pytest.raises(ops.ServingError, match="no previous release"):
        ops.apply_rollback(None, rig, "rig-01", "basic", 60, {"_sudo": True})  # type: ignore[arg-type]


# --- through pyinfra's API on a @fake host: the operation's real wiring (facts, noop, change) -------

@pytest.mark.parametrize("converged", [True, False])
def test_pyinfra_plan_on_a_fake_host(example_inventory: Path, converged: bool) -> None:
    from pyinfra.api import Config, Inventory, State
    from pyinfra.api.connect import connect_all
    from pyinfra.api.operation import add_op

    rig, spec = deployed(example_inventory)
    observed = rig.observed(spec.release_id) if converged else {**rig.observed(spec.release_id), "ledger": None}
    data = {"fake_responses": {"base64 -d | python3 -": json.dumps(observed)}, "fake_delay": 0, "_sudo": True}
    state = State(Inventory(([("@fake/rig-01", data)], {})), Config())
    connect_all(state)
    [(host, meta)] = add_op(state, ops.release, spec=spec, name="serve").items()
    assert meta.will_change is (not converged)
    assert any(f"python3 - {spec.release_id}" in c for c in host.connector.executed_commands)


# --- the engine died after its gate passed (a crash, an OOM kill): the next converge recovers it ---

def crashed_after_the_gate(example_inventory: Path) -> tuple[FakeRig, ops.ReleaseSpec, ops.ReleaseSpec]:
    """Release `new` passed its gate (the ledger's current, `old` its previous), then its engine died."""
    rig, old = deployed(example_inventory)
    new = release_spec(context(example_inventory, variant="tq3-nomtp"))
    rig.images.add(new.image)
    run_swap(rig, new)
    rig.containers[0].update(status="exited", restart_count=3)
    return rig, old, new


def test_a_crashed_current_release_is_recovered_and_the_ledger_says_so(example_inventory: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    rig, old, new = crashed_after_the_gate(example_inventory)
    assert len(plan(rig, new, monkeypatch)[0]) == 1
    attempts = len(rig.ledger["attempts"])
    run_swap(rig, new)
    assert rig.running() == [new.release_id]
    book = rig.ledger
    assert len(book["attempts"]) == attempts + 1
    attempt = book["attempts"][-1]
    assert attempt["kind"] == "recover" and attempt["result"] == "passed" and attempt["from_release"] == old.release_id
    assert attempt["reason"] == (f"release {new.release_id} passed its gate but its engine is not running "
                                 "(exited, 3 restarts)")
    assert book["current"]["release_id"] == new.release_id and book["previous"]["release_id"] == old.release_id
    assert any("restarting it through the basic gate" in line for line in rig.logs)


def test_a_recovery_that_fails_its_gate_restores_the_last_good_release(example_inventory: Path) -> None:
    rig, old, new = crashed_after_the_gate(example_inventory)
    rig.gate_ok[new.release_id] = False  # it dies again: the previous release is the last good one
    with pytest.raises(ops.ServingError, match=f"previous release {old.release_id} is serving again"):
        run_swap(rig, new)
    assert rig.running() == [old.release_id] and rig.current_link == f"{RELEASES_DIR}/{old.release_id}"
    book = rig.ledger
    attempt = book["attempts"][-1]
    assert attempt["kind"] == "recover" and attempt["result"] == "failed"
    assert attempt["restored"] == old.release_id and attempt["restore_ok"] is True
    # the ledger follows what serves; the inventory still wants `new`: the next converge is a deploy
    assert book["current"]["release_id"] == old.release_id and book["previous"]["release_id"] == new.release_id
    assert ops.crashed(ledger.load(book, "rig-01"), rig.observed(new.release_id), new.release_id) is None


def test_a_healthy_current_release_or_another_target_is_no_recovery(example_inventory: Path) -> None:
    rig, spec = deployed(example_inventory)
    book = ledger.load(rig.ledger, "rig-01")
    assert ops.crashed(book, rig.observed(spec.release_id), spec.release_id) is None
    assert ops.crashed(book, rig.observed(), "another-release") is None
    rig.containers[0]["health"] = "unhealthy"
    assert ops.crashed(book, rig.observed(), spec.release_id) == (
        f"release {spec.release_id} passed its gate but its engine is unhealthy")
    rig.containers.clear()
    assert "has no container any more" in str(ops.crashed(book, rig.observed(), spec.release_id))
