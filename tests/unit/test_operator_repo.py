"""No default inventory, `-i DIR`, and `rigfleet init DIR` (an operator repo that works as written)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from rigfleet import paths
from rigfleet.cli import main

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = REPO_ROOT / "inventory" / "example"


@pytest.fixture(autouse=True)
def _no_selection():
    paths.select(None)
    yield
    paths.select(None)


def test_no_inventory_given_says_how_to_name_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["check"], env={"RIGFLEET_INVENTORY": None})
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1
    assert "RIGFLEET_INVENTORY" in lines[0] and "-i DIR" in lines[0] and "rigfleet init" in lines[0]
    assert "sandbox" not in result.output


def test_dash_i_names_the_inventory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["-i", str(EXAMPLE), "check"], env={"RIGFLEET_INVENTORY": None})
    assert result.exit_code == 0, result.output
    pinsets = len(yaml.safe_load((EXAMPLE / "pinsets.yml").read_text()))
    assert f"4 rigs, {pinsets} pin sets in {EXAMPLE}" in result.output


def test_init_writes_a_repo_whose_check_passes_from_its_directory(tmp_path, monkeypatch):
    ops = tmp_path / "ops"
    result = CliRunner().invoke(main, ["init", str(ops)])
    assert result.exit_code == 0, result.output
    for name in ("inventory.py", "deploy.py", "config.py", "inventory/hosts.yml", "inventory/group_vars/all.yml",
                 "inventory/host_vars/rig-02.yml", "inventory/known_hosts", "inventory/pinsets.yml"):
        assert (ops / name).is_file(), name
    hosts = yaml.safe_load((ops / "inventory" / "hosts.yml").read_text())
    assert len(hosts["all"]["children"]) == 2
    shipped = yaml.safe_load((EXAMPLE / "pinsets.yml").read_text())
    assert yaml.safe_load((ops / "inventory" / "pinsets.yml").read_text()) == shipped
    assert "rigfleet.deploy" in (ops / "deploy.py").read_text()
    assert len((ops / "deploy.py").read_text().splitlines()) <= 4
    monkeypatch.chdir(ops)
    checked = CliRunner().invoke(main, ["check"], env={"RIGFLEET_INVENTORY": None})
    assert checked.exit_code == 0, checked.output
    assert f"3 rigs, {len(shipped)} pin sets in {ops / 'inventory'}" in checked.output


def test_init_refuses_a_non_empty_directory_and_keeps_what_was_there(tmp_path):
    ops = tmp_path / "ops"
    ops.mkdir()
    (ops / "mine.txt").write_text("keep me")
    result = CliRunner().invoke(main, ["init", str(ops)])
    assert result.exit_code == 2
    assert "not an empty directory" in result.output and "Traceback" not in result.output
    assert sorted(os.listdir(ops)) == ["mine.txt"]
    assert (ops / "mine.txt").read_text() == "keep me"
