"""What changes per rig between pin sets: `plan --from` and `repin --from` (dry run), and the known
risks `status` shows per rig. Renders only; contacts nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from rigfleet import pindiff, runner, status
from rigfleet.cli import main
from rigfleet.loader import load_fleet
from rigfleet.release import resolve
from rigfleet.rigstate import LedgerEntry
from rigfleet.runner import RigOutcome
from tests.conftest import write_yaml


def run(inventory: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), env={"RIGFLEET_INVENTORY": str(inventory)})
    return result.exit_code, result.output


def repin_to(inventory: Path, pinset: str, variant: str) -> None:
    write_yaml(inventory / "host_vars" / "rig-01.yml", {"pinset": pinset, "variant": variant})


def test_stock_to_sndr_names_image_vllm_tree_flags_and_env(example_inventory: Path) -> None:
    repin_to(example_inventory, "sndr-v12", "tq3-mtp-sndr")
    fleet = load_fleet(example_inventory)
    lines = pindiff.changes_from(fleet, ["rig-01"], "stock-v0-27-1:fp8-mtp")["rig-01"]
    after = resolve(fleet, "rig-01")
    before = resolve(fleet, fleet.rig("rig-01").model_copy(update={"pinset": "stock-v0-27-1", "variant": "fp8-mtp"}))
    assert lines[:5] == [
        "pinset: stock-v0-27-1 -> sndr-v12",
        f"image: {before.image} -> {after.image}",
        "vllm: 0.27.1 -> 0.23.1rc1.dev424+g3f5a1e173",
        "patch tree: none -> sndr-v12 v12.0.0 7aa66f9ac6bc",
        "variant: fp8-mtp -> tq3-mtp-sndr",
    ]
    assert "flag ~ --kv-cache-dtype fp8_e4m3 -> turboquant_3bit_nc" in lines
    assert "flag - --long-prefill-token-threshold 2048" in lines
    assert "env + GENESIS_LEGACY_DEFAULT_ON 1" in lines and "env ~ RIGFLEET_NEEDS_GENESIS 0 -> 1" in lines
    # the same release on both sides: nothing
    assert pindiff.diff(after, after) == []


def test_seed_to_sndr_keeps_the_flags_and_changes_the_tree(example_inventory: Path) -> None:
    repin_to(example_inventory, "sndr-v12", "tq3-mtp-sndr")
    lines = pindiff.changes_from(load_fleet(example_inventory), ["rig-01"], "seed-2026-05:tq3-mtp-genesis")["rig-01"]
    assert "patch tree: genesis-v7 v7.72.2 7b9fd3194ee6 -> sndr-v12 v12.0.0 7aa66f9ac6bc" in lines
    assert not [line for line in lines if line.startswith("flag")]  # same serve flags on both trees
    # v12 turns on its legacy default-on cohort and leaves out the patches its registry retired
    retired = ["P61_QWEN3_MULTI_TOOL", "P83", "P94", "PN13_CUDA_GRAPH_LAMBDA_ARITY", "PN19_SCOPED_MAX_SPLIT",
               "PN22_LOCAL_ARGMAX_TP", "PN34_WORKSPACE_LOCK_RELAX", "PN9_INDEPENDENT_DRAFTER_ATTN"]
    assert sorted(line for line in lines if line.startswith("env")) == sorted(
        ["env + GENESIS_LEGACY_DEFAULT_ON 1", *(f"env - GENESIS_ENABLE_{flag} 1" for flag in retired)])


def test_plan_and_repin_dry_run_print_the_changes(example_inventory: Path) -> None:
    repin_to(example_inventory, "stock-v0-27-1", "int8")
    code, out = run(example_inventory, "plan", "--json", "--from", "seed-2026-05")
    assert code == 0, out
    rows = {r["rig"]: r for r in json.loads(out[out.index("["):])}
    assert "patch tree: genesis-v7 v7.72.2 7b9fd3194ee6 -> none" in rows["rig-01"]["changes_from"]["changes"]
    assert rows["rig-11"]["changes_from"] == {"from": "seed-2026-05", "changes": []}
    code, out = run(example_inventory, "repin", "--dry-run", "--limit", "rig-01", "--from", "seed-2026-05")
    assert code == 0, out
    assert "rig-01: from seed-2026-05:" in out and "  vllm: 0.20.2rc1.dev9+g01d4d1ad3 -> 0.27.1" in out


def test_from_an_unknown_pin_set_is_one_line_exit_2(example_inventory: Path) -> None:
    code, out = run(example_inventory, "plan", "--from", "stock-v0-27")
    assert code == 2 and "--from" in out and "stock-v0-27" in out and "Traceback" not in out


def test_status_risks_follow_the_running_pin_set_and_the_drafter(example_inventory: Path) -> None:
    fleet = load_fleet(example_inventory)
    rig = fleet.rig("rig-01")
    [risk] = status.risks(fleet, rig, "stock-v0-27-1", "fp8-mtp")
    assert risk.startswith("https://github.com/vllm-project/vllm/issues/50021: MTP on hybrid GDN models")
    assert "mtp_drafter off" in risk
    assert status.risks(fleet, rig, "seed-2026-05", "tq3-mtp-genesis") == []
    assert status.risks(fleet, rig.model_copy(update={"mtp_drafter": "off"}), "stock-v0-27-1", "fp8-mtp") == []


def record(pinset: str, variant: str) -> LedgerEntry:
    return LedgerEntry(release_id=f"r-{pinset}-{variant}", pinset=pinset, variant=variant)


def test_the_running_pin_set_comes_from_each_rigs_release_record(example_inventory: Path) -> None:
    repin_to(example_inventory, "sndr-v12", "tq3-mtp-sndr")
    fleet = load_fleet(example_inventory)
    records = {"rig-01": record("stock-v0-27-1", "fp8-mtp"), "rig-02": None, "rig-11": record("gone-2025", "bf16")}
    found = pindiff.changes_from_records(fleet, ["rig-01", "rig-02", "rig-11", "rig-12"], records)
    label, lines = found["rig-01"]
    assert label == "from stock-v0-27-1:fp8-mtp (its release record)"
    assert lines == pindiff.changes_from(fleet, ["rig-01"], "stock-v0-27-1:fp8-mtp")["rig-01"]
    assert lines is not None and "patch tree: none -> sndr-v12 v12.0.0 7aa66f9ac6bc" in lines
    assert found["rig-02"] == (pindiff.NO_RECORD, None)
    assert found["rig-12"] == (pindiff.UNREACHABLE, None)
    assert found["rig-11"][1] is None and "gone-2025" in found["rig-11"][0] and "--from" in found["rig-11"][0]


def test_a_rig_recorded_on_what_it_declares_has_no_change(example_inventory: Path) -> None:
    fleet = load_fleet(example_inventory)
    rig = fleet.rig("rig-01")
    found = pindiff.changes_from_records(fleet, ["rig-01"], {"rig-01": record(rig.pinset, rig.variant)})
    assert found["rig-01"] == (f"from {rig.pinset}:{rig.variant} (its release record)", [])


def test_repin_without_from_diffs_from_the_release_records(example_inventory: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    repin_to(example_inventory, "stock-v0-27-1", "int8")
    asked: list[list[str]] = []

    def read_facts(fleet: object, names: list[str], fact: type) -> tuple[dict, dict]:
        asked.append(list(names))
        ledger = {"schema": 1, "rig": "rig-01", "current": {"release_id": "r1", "pinset": "seed-2026-05",
                                                            "variant": "tq3-mtp-genesis"}}
        return {"rig-01": {"ledger": ledger}}, {"rig-01": RigOutcome("rig-01")}

    monkeypatch.setattr(runner, "read_facts", read_facts)
    code, out = run(example_inventory, "repin", "--dry-run", "--limit", "rig-01")
    assert code == 0, out
    assert asked == [["rig-01"]]
    assert "rig-01: from seed-2026-05:tq3-mtp-genesis (its release record): " in out
    assert "  vllm: 0.20.2rc1.dev9+g01d4d1ad3 -> 0.27.1" in out
    assert "  variant: tq3-mtp-genesis -> int8" in out


def test_repin_with_from_reads_no_rig(example_inventory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def read_facts(*_: object) -> None:
        raise AssertionError("--from given: no rig may be contacted for the diff")

    monkeypatch.setattr(runner, "read_facts", read_facts)
    code, out = run(example_inventory, "repin", "--dry-run", "--limit", "rig-01", "--from", "seed-2026-05")
    assert code == 0, out
