"""No traceback, no hang (issue 18, finding 6): bounded YAML depth and alias expansion on every
inventory file, a bounded value in every message, names on one line, `name:` inside a pin set,
duplicate rigs on one host and port, two vars files for one name."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from rigfleet.cli import main
from rigfleet.errors import Problem
from tests.conftest import write_yaml

DEEP = "a: " + "[" * 3000 + "]" * 3000 + "\n"
LAUGHS = "lol0: &l0 [lol]\n" + "".join(
    f"lol{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]\n" for i in range(1, 10))
SELF = "loop: &x [*x]\n"


def check(inventory: Path) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["check"], env={"RIGFLEET_INVENTORY": str(inventory)})
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


@pytest.mark.parametrize("relative", ["hosts.yml", "group_vars/all.yml", "host_vars/rig-01.yml", "pinsets.yml"])
@pytest.mark.parametrize("text", [DEEP, LAUGHS, SELF], ids=["deep", "laughs", "self"])
def test_deep_or_exploding_yaml_in_any_file_is_refused_quickly(example_inventory: Path, relative: str,
                                                               text: str) -> None:
    path = example_inventory / relative
    if relative == "hosts.yml" or text is DEEP:
        path.write_text(text)
    else:  # the bomb under an unknown key of an otherwise valid file
        before = path.read_text() if path.exists() else ""
        path.write_text(before + "\nbomb:\n" + "".join(f"  {line}\n" for line in text.splitlines()))
    code, out = check(example_inventory)
    assert code == 2 and "Traceback" not in out, out
    assert ("deeper than" in out) or ("aliases expand" in out) or ("must be" in out), out
    assert len(out) < 4000


def test_a_huge_value_is_truncated_and_a_newline_in_a_name_escaped() -> None:
    big = Problem("rig\nx", "port", "9" * 100_000, "bad", "fix").render()
    assert len(big) < 400 and "\n" not in big and "rig\\nx" in big
    shared: list[object] = ["x"]
    for _ in range(40):  # 2**40 leaves if printed in full
        shared = [shared, shared]
    assert len(Problem("r", "f", shared, "bad", "fix").render()) < 400


def test_name_inside_a_pin_set_is_refused(example_inventory: Path) -> None:
    path = example_inventory / "pinsets.yml"
    path.write_text(path.read_text().replace("seed-2026-05:\n", "seed-2026-05:\n  name: other\n", 1))
    code, out = check(example_inventory)
    assert code == 2 and "pinset seed-2026-05: name" in out and "named by its key" in out


def test_two_rigs_on_one_host_and_port_are_refused(example_inventory: Path) -> None:
    write_yaml(example_inventory / "host_vars" / "rig-12.yml", {"ssh_hostname": "192.0.2.21"})
    code, out = check(example_inventory)
    assert code == 2 and "rig-12: ssh_hostname" in out and "as rig 'rig-11'" in out


def test_yml_and_yaml_for_one_group_are_refused(example_inventory: Path) -> None:
    write_yaml(example_inventory / "group_vars" / "lab.yaml", {"gate": "full"})
    write_yaml(example_inventory / "group_vars" / "lab.yml", {"gate": "basic"})
    code, out = check(example_inventory)
    assert code == 2 and "'lab.yml, lab.yaml'" in out and "merge them" in out
