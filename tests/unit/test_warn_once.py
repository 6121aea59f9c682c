"""Each warning is printed once per command: however often the fleet is loaded in one process (the
CLI, then a rollout's runner or pyinfra's entry files), and across the demo's commands."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from rigfleet import cli_common, context, errors, paths
from rigfleet.cli import main
from rigfleet_sandbox.demo import Progress, print_once


@pytest.fixture
def unused_bad_pinset(example_inventory: Path) -> Path:
    """The example plus a pin set no rig uses whose vLLM its patch tree refuses (a warning)."""
    path = example_inventory / "pinsets.yml"
    data = yaml.safe_load(path.read_text())
    bad = copy.deepcopy(data["seed-2026-05"])
    bad["vllm_version"] = "0.20.2rc2.dev672+g1acd67a79"
    data["bad-one"] = bad
    path.unlink()
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return example_inventory


def test_the_cli_and_the_runner_loading_one_fleet_print_its_warnings_once(
        unused_bad_pinset: Path, capsys: pytest.CaptureFixture[str]) -> None:
    errors.forget_shown()
    paths.select(unused_bad_pinset)
    try:
        _, warnings = cli_common.load_checked()
        cli_common.warn(warnings)
        context.fleet()  # what repin's runner and pyinfra's entry files load in the same process
        cli_common.warn(warnings)
    finally:
        paths.select(None)
    printed = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert any("(unused pin set)" in line for line in printed)
    assert len(printed) == len(set(printed)) == len({p.render() for p in warnings if p.warning})


def test_every_command_shows_its_warnings_again(unused_bad_pinset: Path) -> None:
    env = {"RIGFLEET_INVENTORY": str(unused_bad_pinset)}
    for command in ("check", "plan"):
        output = CliRunner().invoke(main, [command], env=env).output
        assert output.count("(unused pin set)") == 1, output


def test_the_demo_shows_a_warning_once_over_its_commands(capsys: pytest.CaptureFixture[str]) -> None:
    warned: set[str] = set()
    line = "warning: pinset bad-one: vllm_version = 'x': (unused pin set) refused. Fix: pin another"
    print_once(f"{line}\n  table\n", warned)  # rigfleet plan
    deploy = Progress(warned=warned)
    assert deploy.line(line + "\n") is None  # the deploys load the same fleet: not again
    assert deploy.line("warning: another one\n") is not None
    assert capsys.readouterr().out.count("(unused pin set)") == 1
