"""The rigfleet CLI: exit codes, files written by render, the plan's JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from rigfleet.cli import main
from tests.conftest import write_yaml


def run(inventory: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), env={"RIGFLEET_INVENTORY": str(inventory)})
    return result.exit_code, result.output


def test_check_ok(example_inventory: Path) -> None:
    code, out = run(example_inventory, "check")
    assert code == 0 and "4 rigs" in out


def test_check_bad_input_exits_2_without_traceback(example_inventory: Path) -> None:
    write_yaml(example_inventory / "host_vars" / "rig-01.yml", {"variant": "int9"})
    code, out = run(example_inventory, "check")
    assert code == 2 and "rig-01" in out and "variant" in out and "Traceback" not in out


def test_render_writes_every_file(example_inventory: Path, tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    code, _ = run(example_inventory, "render", "rig-02", "-o", str(out_dir))
    assert code == 0
    for name in ("compose.yaml", "Dockerfile", "entrypoint.sh", "rigfleet.env",
                 "host/systemd/rigfleet-gpu-tuning.service", "host/apt/99rigfleet-lock-timeout"):
        assert (out_dir / name).is_file(), name
    assert (out_dir / "rigfleet.env").stat().st_mode & 0o777 == 0o600
    assert "-pl 280" in (out_dir / "host/systemd/rigfleet-gpu-tuning.service").read_text()


def test_render_unknown_rig(example_inventory: Path, tmp_path: Path) -> None:
    code, out = run(example_inventory, "render", "rig-2", "-o", str(tmp_path))
    assert code == 2 and "rig-2" in out and "rig-02" in out


def test_plan_json_keys(example_inventory: Path) -> None:
    code, out = run(example_inventory, "plan", "--json")
    assert code == 0
    rows = json.loads(out[out.index("["):])
    assert [r["rig"] for r in rows] == ["rig-01", "rig-02", "rig-11", "rig-12"]
    for row in rows:
        assert {"rig", "variant", "pinset", "image_tag", "kv_pool_tokens", "max_full_context_streams",
                "warnings"} <= set(row)
    assert rows[0]["image_tag"] == rows[1]["image_tag"]  # one image per pin set, whatever the variant
    assert rows[1]["variant"] == "turbo" and rows[1]["max_full_context_streams"] == 4


def test_plan_table(example_inventory: Path) -> None:
    code, out = run(example_inventory, "plan")
    assert code == 0 and "rig-02" in out and "1.22M" in out


@pytest.mark.parametrize("command", [["check"], ["plan"], ["plan", "--json"]])
def test_missing_inventory(tmp_path: Path, command: list[str]) -> None:
    code, out = run(tmp_path / "none", *command)
    assert code == 2 and "no hosts.yml there" in out and "rigfleet init DIR" in out and "sandbox" not in out
