"""Wave logic of `rigfleet repin` with a scripted converge (the sandbox tier runs the real one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rigfleet import rollout
from rigfleet.errors import InputError
from rigfleet.loader import Fleet, load_fleet
from rigfleet.runner import RigOutcome


class Script:
    """A converge that fails the rigs it is told to, and records every call."""

    def __init__(self, failing: frozenset[str] = frozenset(), unreachable: frozenset[str] = frozenset()) -> None:
        self.failing, self.unreachable = set(failing), set(unreachable)
        self.calls: list[list[str]] = []
        self.gates: dict[str, str] = {}

    def __call__(self, fleet: Fleet, rigs: list[str]) -> dict[str, RigOutcome]:
        self.calls.append(list(rigs))
        outcomes = {}
        for name in rigs:
            self.gates[name] = fleet.rig(name).gate
            if name in self.unreachable:
                outcomes[name] = RigOutcome(name, reachable=False, ok=False)
            else:
                outcomes[name] = RigOutcome(name, ok=name not in self.failing,
                                            errors=["gate failed"] if name in self.failing else [])
        return outcomes


@pytest.fixture
def fleet(example_inventory: Path) -> Fleet:
    return load_fleet(example_inventory)


def test_plan_canary_then_waves(fleet: Fleet) -> None:
    names = rollout.scope(fleet, None, None)
    assert rollout.plan_waves(names, None, 2) == [["rig-01"], ["rig-02", "rig-11"], ["rig-12"]]
    assert rollout.plan_waves(names, "rig-11", 3) == [["rig-11"], ["rig-01", "rig-02", "rig-12"]]


def test_scope_by_group_and_bad_names(fleet: Fleet) -> None:
    assert rollout.scope(fleet, "prod", None) == ["rig-11", "rig-12"]
    with pytest.raises(InputError, match="no such group"):
        rollout.scope(fleet, "stage", None)
    with pytest.raises(InputError, match="rig-12"):
        rollout.scope(fleet, None, ["rig-13"])
    with pytest.raises(InputError, match="canary"):
        rollout.plan_waves(["rig-11"], "rig-01", 1)


def test_all_waves_succeed(fleet: Fleet) -> None:
    script = Script()
    result = rollout.run(fleet, [["rig-01"], ["rig-02", "rig-11"], ["rig-12"]], script)
    assert result.ok and result.untouched == [] and script.calls == [["rig-01"], ["rig-02", "rig-11"], ["rig-12"]]


def test_failed_canary_touches_nothing_else(fleet: Fleet) -> None:
    script = Script(failing=frozenset({"rig-01"}))
    result = rollout.run(fleet, [["rig-01"], ["rig-02", "rig-11"], ["rig-12"]], script)
    assert result.halted and result.failed == ["rig-01"]
    assert script.calls == [["rig-01"]] and result.untouched == ["rig-02", "rig-11", "rig-12"]


def test_canary_is_gated_full_and_the_rest_as_declared(fleet: Fleet) -> None:
    script = Script()
    rollout.run(fleet, [["rig-01"], ["rig-02"]], script)
    assert script.gates == {"rig-01": "full", "rig-02": "basic"}


def test_the_canary_wave_keeps_the_mirror_map(example_inventory: Path) -> None:
    # the canary's converge once lost mirrors.yml, so an air-gapped canary cloned from the upstream URL
    (example_inventory / "mirrors.yml").write_text("prefixes:\n  https://git.example/tree.git: /srv/tree.bundle\n")
    fleet = load_fleet(example_inventory)
    seen: list[dict[str, str]] = []
    rollout.run(fleet, [["rig-01"], ["rig-02"]],
                lambda f, rigs: seen.append(dict(f.mirrors.prefixes)) or Script()(f, rigs))
    assert seen == [{"https://git.example/tree.git": "/srv/tree.bundle"}] * 2


def test_failure_in_wave_two_leaves_later_waves_untouched(fleet: Fleet) -> None:
    script = Script(failing=frozenset({"rig-11"}))
    result = rollout.run(fleet, [["rig-01"], ["rig-02"], ["rig-11"], ["rig-12"]], script)
    assert result.failed == ["rig-11"] and result.untouched == ["rig-12"]
    assert [w.rigs for w in result.waves] == [["rig-01"], ["rig-02"], ["rig-11"]]


def test_unreachable_rig_stops_the_rollout(fleet: Fleet) -> None:
    script = Script(unreachable=frozenset({"rig-02"}))
    result = rollout.run(fleet, [["rig-01"], ["rig-02", "rig-11"], ["rig-12"]], script)
    assert result.halted and "rig-02" in result.failed and result.untouched == ["rig-12"]
    assert result.waves[1].outcomes["rig-02"].summary == "unreachable"
    assert result.unreachable == ["rig-02"]


def test_max_failures_lets_the_rollout_absorb_some(fleet: Fleet) -> None:
    script = Script(failing=frozenset({"rig-02"}))
    result = rollout.run(fleet, [["rig-01"], ["rig-02"], ["rig-11"], ["rig-12"]], script, max_failures=2)
    assert not result.halted and result.failed == ["rig-02"] and result.untouched == []


def test_pyinfra_log_gives_the_summary_its_reason() -> None:
    """pyinfra only logs a callback's exception and a connect error; the runner keeps both."""
    import logging

    from rigfleet.runner import RigOutcome, _PyinfraLog

    pyinfra_log = logging.getLogger("pyinfra")
    with _PyinfraLog() as log:
        pyinfra_log.warning("Traceback (most recent call last):\n  File x\nrigfleet.operations.serving.ServingError: x")
        pyinfra_log.warning("\x1b[1m[rig-03]\x1b[0m  Unexpected error in Python callback: "
                            "ServingError('rig-03: release r2 failed the basic gate; previous release r1 "
                            "is serving again',)")
        pyinfra_log.error("[rig-04] Could not connect (Connection refused)")
    assert log.raised == {"rig-03": ["rig-03: release r2 failed the basic gate; previous release r1 "
                                     "is serving again"]}
    assert log.errors == {"rig-04": ["Could not connect (Connection refused)"]}
    assert log not in pyinfra_log.filters
    down = RigOutcome("rig-04", reachable=False, ok=False, errors=log.errors["rig-04"])
    assert down.summary == "unreachable (Could not connect (Connection refused))"


def test_insecure_fleet_registry_in_daemon_json(fleet: Fleet) -> None:
    from rigfleet.roles.docker_engine import daemon_settings

    rig = fleet.rigs[0]
    assert "insecure-registries" not in daemon_settings(rig)
    secure = rig.model_copy(update={"registry": "10.0.0.5:5000"})
    assert "insecure-registries" not in daemon_settings(secure)
    insecure = secure.model_copy(update={"registry_insecure": True})
    assert daemon_settings(insecure)["insecure-registries"] == ["10.0.0.5:5000"]
