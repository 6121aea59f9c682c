"""`repin` ends with how many images were built and where each rig got its image (built here,
pulled from the fleet registry, already present), read from what the image operations did."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from rigfleet import runner, status
from rigfleet.cli import main
from rigfleet.loader import Fleet
from rigfleet.runner import BUILT, PRESENT, PULLED, RigOutcome

TAG = "rigfleet/vllm:0.27.1-0123456789abcdef"


def op(changed: bool, stdout: tuple[str, ...] = ()) -> Any:
    return SimpleNamespace(operation_meta=SimpleNamespace(
        is_complete=lambda: True, did_error=lambda: False, did_change=lambda: changed,
        stdout_lines=list(stdout), stderr_lines=[]))


class Host:
    def __init__(self, name: str) -> None:
        self.name = name


def fake_state(per_rig: dict[str, list[tuple[str, Any]]]) -> Any:
    hosts = {name: Host(name) for name in per_rig}
    ops: dict[Any, dict[str, Any]] = {}
    names: dict[str, Any] = {}
    for rig, steps in per_rig.items():
        ops[hosts[rig]] = {}
        for index, (name, data) in enumerate(steps):
            ops[hosts[rig]][f"{rig}-{index}"] = data
            names[f"{rig}-{index}"] = SimpleNamespace(names={f"vllm_image | {name}"} if name else {"other"})
    return SimpleNamespace(inventory=list(hosts.values()), ops=ops, op_meta=names, failed_hosts=set())


def test_where_each_rig_got_its_image_comes_from_the_image_operations() -> None:
    pull, build = f"Image {TAG} from the fleet registry", f"Build {TAG}"
    state = fake_state({
        "rig-01": [(pull, op(True, (f"rigfleet: image {TAG}: not in the fleet registry r:5000; building it here",))),
                   (build, op(True, (f"rigfleet: image {TAG}: docker build (log: /x)",
                                     f"rigfleet: image {TAG}: built (sha256:abc)")))],
        "rig-02": [(pull, op(True, (f"rigfleet: image {TAG}: pulled from the fleet registry r:5000",))),
                   (build, op(False))],
        "rig-03": [(pull, op(False)), (build, op(False))],
        "rig-04": [("", op(True))],  # the image role did not run (e.g. serving only)
    })
    outcomes = {name: RigOutcome(name) for name in ("rig-01", "rig-02", "rig-03", "rig-04")}
    runner._collect(state, outcomes)
    assert {name: o.image for name, o in outcomes.items()} == {
        "rig-01": BUILT, "rig-02": PULLED, "rig-03": PRESENT, "rig-04": None}


def test_repin_ends_with_the_build_count_and_each_rig_image_source(
        example_inventory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sources = {"rig-01": BUILT, "rig-02": PULLED, "rig-11": PULLED, "rig-12": PRESENT}

    def converge(fleet: Fleet, rigs: list[str]) -> dict[str, RigOutcome]:
        return {rig: RigOutcome(rig, image=sources[rig]) for rig in rigs}

    monkeypatch.setattr(runner, "converge", converge)
    monkeypatch.setattr(status, "recorded", lambda fleet, names: dict.fromkeys(names))
    result = CliRunner().invoke(main, ["repin", "--canary", "rig-01"],
                                env={"RIGFLEET_INVENTORY": str(example_inventory), "COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    tail = result.stdout.strip().splitlines()
    assert "re-pin complete" in tail[-6]
    assert tail[-5] == "images built: 1 (on rig-01)"
    assert sorted(line.strip() for line in tail[-4:]) == [
        "rig-01: image built here", "rig-02: image pulled from the fleet registry",
        "rig-11: image pulled from the fleet registry", "rig-12: image already present"]
