"""Compatibility guard: each rule refuses what cannot work, and a good fleet passes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rigfleet import guard
from rigfleet.loader import load_fleet
from tests.conftest import write_yaml


def errors(inventory: Path) -> list[str]:
    return [p.render() for p in guard.check(load_fleet(inventory)) if not p.warning]


def warnings(inventory: Path) -> list[str]:
    return [p.render() for p in guard.check(load_fleet(inventory)) if p.warning]


def set_host(inventory: Path, rig: str, **values: object) -> None:
    path = inventory / "host_vars" / f"{rig}.yml"
    current = yaml.safe_load(path.read_text()) if path.exists() else {}
    write_yaml(path, {**(current or {}), **values})


def edit_pinset(inventory: Path, **changes: object) -> None:
    path = inventory / "pinsets.yml"
    data = yaml.safe_load(path.read_text())
    data["seed-2026-05"].update(changes)
    write_yaml(path, data)


def test_example_fleet_passes_with_supply_chain_warnings(example_inventory: Path) -> None:
    assert errors(example_inventory) == []
    text = "\n".join(warnings(example_inventory))
    assert "base_image.digest" in text and "not checksummed" in text


def test_unknown_variant_lists_valid_ones_and_the_closest(example_inventory: Path) -> None:
    set_host(example_inventory, "rig-01", variant="tq3-mtp-genesys")
    (message,) = errors(example_inventory)
    assert "rig-01" in message and "variant" in message and "'tq3-mtp-genesys'" in message
    assert "did you mean 'tq3-mtp-genesis'" in message and "int8" in message and "fp8-mtp" in message


def test_genesis_pin_must_allow_the_vllm_version(example_inventory: Path) -> None:
    edit_pinset(example_inventory, vllm_version="0.20.2rc1.dev5+g1acd67a79")
    text = "\n".join(errors(example_inventory))
    assert "vllm_version" in text and "0.20.2rc1.dev9+g01d4d1ad3" in text


def test_tq3_mtp_needs_genesis(example_inventory: Path) -> None:
    edit_pinset(example_inventory, genesis=None)
    text = "\n".join(errors(example_inventory))
    assert "rig-01" in text and "needs Genesis" in text


def test_cuda13_needs_driver_580(example_inventory: Path) -> None:
    edit_pinset(example_inventory, driver={"branch": 570})
    assert any("driver.branch" in e and "580" in e for e in errors(example_inventory))


def test_fp8_e4m3_on_sm86_needs_a_vllm_that_runs_it(example_inventory: Path) -> None:
    """club-3090's dual-3090 default (fp8-mtp, fp8_e4m3 KV) is fine on the stock v0.27.1 pin set and
    refused on the seed's 0.20.2 nightly, whose builds fail on sm_86 (vllm#26431)."""
    set_host(example_inventory, "rig-01", variant="fp8-mtp", pinset="stock-v0-27-1")
    assert not [e for e in errors(example_inventory) if "rig-01" in e], errors(example_inventory)
    set_host(example_inventory, "rig-01", variant="fp8-mtp", pinset="seed-2026-05")
    refused = [e for e in errors(example_inventory) if "rig-01" in e and "fp8_e4m3" in e]
    assert refused and "sm_8.6" in refused[0] and "0.27.1" in refused[0], errors(example_inventory)


def test_batched_token_budgets_must_match(example_inventory: Path) -> None:
    set_host(example_inventory, "rig-01", engine_env={"GENESIS_PROFILE_RUN_CAP_M": "8192"})
    assert any("GENESIS_PROFILE_RUN_CAP_M" in e and "4128" in e for e in errors(example_inventory))


def test_p65_never_with_p67(example_inventory: Path) -> None:
    set_host(example_inventory, "rig-01", engine_env={"GENESIS_ENABLE_P65_TURBOQUANT_SPEC_CG_DOWNGRADE": "1"})
    assert any("P65" in e and "P67" in e for e in errors(example_inventory))


def test_p87_off_while_marlin_is_overlaid(example_inventory: Path) -> None:
    set_host(example_inventory, "rig-01", engine_env={"GENESIS_ENABLE_P87": "1"})
    assert any("P87" in e and "marlin.py" in e for e in errors(example_inventory))


def test_tp_times_pp_must_equal_the_gpus(example_inventory: Path) -> None:
    set_host(example_inventory, "rig-01", pipeline_parallel_size=2)
    assert any("TP 2 x PP 2" in e for e in errors(example_inventory))


def test_port_clash_with_ssh(example_inventory: Path) -> None:
    set_host(example_inventory, "rig-01", ssh_port=8015)
    assert any("SSH port" in e for e in errors(example_inventory))


@pytest.mark.parametrize("watts,ok", [(99, False), (100, True), (290, True), (350, True), (351, False)])
def test_power_limit_inside_the_card_range(example_inventory: Path, watts: int, ok: bool) -> None:
    set_host(example_inventory, "rig-01", power_limit_w=watts)
    found = [e for e in errors(example_inventory) if "power_limit_w" in e]
    assert (found == []) == ok


def test_unknown_pinset_names_the_closest(example_inventory: Path) -> None:
    set_host(example_inventory, "rig-02", pinset="seed-2026-5")
    (message,) = errors(example_inventory)
    assert "rig-02" in message and "pinset" in message and "seed-2026-05" in message


def test_problems_of_an_unused_pinset_only_warn(example_inventory: Path) -> None:
    path = example_inventory / "pinsets.yml"
    data = yaml.safe_load(path.read_text())
    data["draft"] = {**data["seed-2026-05"], "vllm_version": "0.99.0"}
    write_yaml(path, data)
    assert errors(example_inventory) == []
    assert any("unused pin set" in w and "draft" in w for w in warnings(example_inventory))
    set_host(example_inventory, "rig-01", pinset="draft")
    assert any("rig-01" not in e and "pinset draft: vllm_version" in e for e in errors(example_inventory))
