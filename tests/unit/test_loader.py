"""Inventory loading: Ansible precedence, provenance, and refusals of malformed files."""

from __future__ import annotations

from pathlib import Path

import pytest

from rigfleet.errors import InputError
from rigfleet.loader import load_fleet
from tests.conftest import write_yaml


def test_example_inventory_precedence(example_inventory: Path) -> None:
    fleet = load_fleet(example_inventory)
    rig01, rig02, rig11 = fleet.rig("rig-01"), fleet.rig("rig-02"), fleet.rig("rig-11")
    assert rig01.variant == "tq3-mtp-genesis" and rig02.variant == "turbo"  # host beats all
    assert rig02.power_limit_w == 280 and rig01.power_limit_w == 290
    assert rig02.port == 8011 and rig02.ssh_port == 2222
    assert rig01.ssh_user == "ops"
    assert rig11.bind_address == "10.0.0.1" and rig11.gate == "full"  # group beats all
    assert rig01.groups == ("lab",)
    assert fleet.sources["rig-02"]["variant"].endswith("host_vars/rig-02.yml")
    assert fleet.sources["rig-01"]["variant"].endswith("group_vars/all.yml")


def test_the_issue_shape_loads(tmp_path: Path) -> None:
    write_yaml(tmp_path / "hosts.yml", {"all": {"children": {"lab": {"hosts": {
        "rig-01": {"ssh_hostname": "192.0.2.10", "ssh_user": "ops"},
        "rig-02": {"ssh_hostname": "192.0.2.11", "ssh_port": 2222}}}}}})
    write_yaml(tmp_path / "group_vars" / "all.yml",
               {"pinset": "seed-2026-05", "variant": "tq3-mtp-genesis", "model_dir": "/srv/models"})
    write_yaml(tmp_path / "host_vars" / "rig-02.yml", {"variant": "turbo", "power_limit_w": 280, "port": 8011})
    fleet = load_fleet(tmp_path)
    assert [r.name for r in fleet.rigs] == ["rig-01", "rig-02"]
    assert fleet.rig("rig-02").variant == "turbo"


def test_child_group_beats_parent(tmp_path: Path) -> None:
    write_yaml(tmp_path / "hosts.yml", {"all": {"children": {"dc": {"children": {"rack1": {"hosts": {
        "r1": {"ssh_hostname": "192.0.2.1"}}}}}}}})
    write_yaml(tmp_path / "group_vars" / "all.yml", {"pinset": "p", "variant": "int8", "model_dir": "/m"})
    write_yaml(tmp_path / "group_vars" / "dc.yml", {"power_limit_w": 250, "port": 9000})
    write_yaml(tmp_path / "group_vars" / "rack1.yml", {"power_limit_w": 260})
    rig = load_fleet(tmp_path).rig("r1")
    assert rig.power_limit_w == 260 and rig.port == 9000 and rig.groups == ("dc", "rack1")


@pytest.mark.parametrize("text,needle", [
    ("all:\n  hosts:\n    r1: {ssh_hostname: 192.0.2.1}\n    r1: {ssh_hostname: 192.0.2.2}\n", "duplicate key"),
    ("all:\n\thosts: {}\n", "not valid YAML"),
    ("- just\n- a list\n", "must be a mapping"),
    ("rigs: {}\n", "single key `all`"),
    ("all:\n  hosts: {}\n", "no rigs"),
])
def test_malformed_hosts_file(tmp_path: Path, text: str, needle: str) -> None:
    (tmp_path / "hosts.yml").write_text(text)
    with pytest.raises(InputError) as caught:
        load_fleet(tmp_path)
    assert needle in str(caught.value)


def test_stray_host_vars_file_is_named(example_inventory: Path) -> None:
    write_yaml(example_inventory / "host_vars" / "rig-2.yml", {"port": 8099})
    with pytest.raises(InputError) as caught:
        load_fleet(example_inventory)
    assert "rig-2.yml" in str(caught.value) and "rig-02" in str(caught.value)


def test_inline_secret_is_refused_without_echoing_it(example_inventory: Path) -> None:
    write_yaml(example_inventory / "host_vars" / "rig-01.yml", {"hf_token": "hf_secretvalue123"})
    with pytest.raises(InputError) as caught:
        load_fleet(example_inventory)
    text = str(caught.value)
    assert "rig-01" in text and "hf_token" in text and "hf_secretvalue123" not in text


def test_missing_inventory_says_how_to_create_one(tmp_path: Path) -> None:
    with pytest.raises(InputError) as caught:
        load_fleet(tmp_path / "nowhere")
    assert "rigfleet init DIR" in str(caught.value) and "sandbox" not in str(caught.value)


def test_data_overrides_beat_every_file_and_are_validated(example_inventory: Path) -> None:
    from rigfleet.context import cli_data_overrides

    overrides = cli_data_overrides(["pyinfra", "inventory.py", "deploy.py", "--data", "power_limit_w=260",
                                    "--data=gate=full"])
    assert overrides == {"power_limit_w": 260, "gate": "full"}
    fleet = load_fleet(example_inventory, overrides)
    assert {r.power_limit_w for r in fleet.rigs} == {260} and fleet.sources["rig-02"]["power_limit_w"] == "--data"
    with pytest.raises(InputError) as caught:
        load_fleet(example_inventory, cli_data_overrides(["--data", "gate=fast"]))
    assert "rig-01: gate" in str(caught.value) and "--data" in str(caught.value)
