"""Pin sets against the REAL upstream: vLLM release wheels (pip) and the real Genesis/SNDR tree
(the shared mirror's bundle). Each failure class is provoked on real artifacts and must produce one
error naming the pin set, the variant, the flag and the closest real name."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from rigfleet import catalog
from rigfleet.cli import main
from rigfleet.loader import load_fleet
from rigfleet.render import Release
from rigfleet.schema import GenesisPin, MirrorMap, PinSet
from rigfleet.upstream import fleet as upstream_fleet
from rigfleet.upstream.sources import tree_facts, vllm_surface
from rigfleet.upstream.verify import probe_rig, verify

SEED_TREE = "7b9fd3194ee6efa1644973383cd44ee5604a5d85"
V12_TREE = "7aa66f9ac6bc22b8e0d71cff75bf26ebbbd5ae97"

pytestmark = pytest.mark.usefixtures("real_upstream_cache")


def seed(inventory: Path) -> PinSet:
    return load_fleet(inventory).pinsets["seed-2026-05"]


def one_error(pinset: PinSet, variant: str, mirrors: MirrorMap, **overrides: object) -> str:
    rig = probe_rig(pinset, variant).model_copy(update=overrides)
    verdict = verify(pinset.name, pinset, {variant: Release(rig, pinset, catalog.variants()[variant])}, mirrors)
    assert verdict.unavailable is None, verdict.unavailable
    assert len(verdict.problems) == 1, [p.render() for p in verdict.problems]
    return verdict.problems[0].render()


def test_every_shipped_pin_set_and_variant_passes(real_inventory: Path) -> None:
    fleet = load_fleet(real_inventory)
    verdicts = upstream_fleet.verdicts(fleet)
    assert verdicts, "the example inventory ships no pin set"
    for name, verdict in verdicts.items():
        assert verdict.unavailable is None, verdict.unavailable
        assert verdict.problems == [], [p.render() for p in verdict.problems]
        assert verdict.checked, f"{name}: no variant was rendered and checked"
        wanted = set(fleet.pinsets[name].variants) | {r.variant for r in fleet.rigs if r.pinset == name}
        assert set(verdict.checked) == wanted


def test_seed_nightly_is_checked_against_its_nearest_release_and_says_so(real_inventory: Path) -> None:
    verdict = upstream_fleet.verdicts(load_fleet(real_inventory))["seed-2026-05"]
    assert verdict.surface_release == "0.20.2"
    assert verdict.notes == ["vLLM 0.20.2rc1.dev9+g01d4d1ad3 is not on PyPI: checked against release 0.20.2"]


def test_real_wheels_carry_what_the_catalog_assumes() -> None:
    old, new = vllm_surface("0.20.2", MirrorMap(), False).surface, vllm_surface("0.27.1", MirrorMap(), False).surface
    for surface in (old, new):
        assert {"--kv-cache-dtype", "--speculative-config", "--tool-call-parser", "--enable-prefix-caching",
                "--no-enable-prefix-caching", "--long-prefill-token-threshold"} <= set(surface.flags)
        assert "mtp" in surface.speculative_methods and "qwen3_coder" in surface.tool_parsers
        assert "qwen3" in surface.reasoning_parsers and "VLLM_WORKER_MULTIPROC_METHOD" in surface.env
    # catalog/kv_dtypes.yaml may only describe dtypes some shipped vLLM really lists
    assert set(catalog.kv_dtypes()) <= set(old.choices["--kv-cache-dtype"]) | set(new.choices["--kv-cache-dtype"])


def test_unknown_flag(real_inventory: Path, mirrors: MirrorMap, monkeypatch: pytest.MonkeyPatch) -> None:
    old, new = vllm_surface("0.20.2", MirrorMap(), False).surface, vllm_surface("0.27.1", MirrorMap(), False).surface
    flag = sorted(set(new.flags) - set(old.flags))[0]  # real in 0.27.1, unknown to the seed's 0.20.2
    original = Release.serve_args
    monkeypatch.setattr(Release, "serve_args", lambda self: [*original(self), flag, "1"])
    text = one_error(seed(real_inventory), "tq3-mtp-genesis", mirrors)
    assert text.startswith(f"error: pinset seed-2026-05: variant tq3-mtp-genesis: flag = '{flag}': "
                           "vLLM 0.20.2 has no such flag")


def test_misspelt_flag_names_the_closest_real_flag(real_inventory: Path, mirrors: MirrorMap,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    original = Release.serve_args
    monkeypatch.setattr(Release, "serve_args", lambda self: [*original(self), "--enable-prefix-cacheing"])
    text = one_error(seed(real_inventory), "tq3-mtp-genesis", mirrors)
    assert "flag = '--enable-prefix-cacheing'" in text and text.endswith("Fix: use --enable-prefix-caching")


@pytest.mark.parametrize(("dtype", "closest"), [("turboquant_3bit", "turboquant_3bit_nc"),
                                                ("int4_per_token_head", "int8_per_token_head")])
def test_unlisted_kv_dtype(real_inventory: Path, mirrors: MirrorMap, monkeypatch: pytest.MonkeyPatch,
                           dtype: str, closest: str) -> None:
    # int4_per_token_head is real in 0.27.1 but the seed's 0.20.2 does not list it
    variant = catalog.variants()["tq3-nomtp"].model_copy(update={"kv_cache_dtype": dtype})
    monkeypatch.setitem(catalog.variants(), "tq3-nomtp", variant)
    text = one_error(seed(real_inventory), "tq3-nomtp", mirrors)
    assert f"variant tq3-nomtp: --kv-cache-dtype = '{dtype}': vLLM 0.20.2 does not list this value" in text
    assert f"did you mean {closest}?" in text


def test_dead_genesis_flag_names_the_real_one(real_inventory: Path, mirrors: MirrorMap) -> None:
    """The seed catalog's GENESIS_ENABLE_PN54=0 was read by nothing in the real tree."""
    text = one_error(seed(real_inventory), "tq3-mtp-genesis", mirrors, engine_env={"GENESIS_ENABLE_PN54": "0"})
    assert text == ("error: pinset seed-2026-05: variant tq3-mtp-genesis: env = 'GENESIS_ENABLE_PN54': the "
                    "genesis-v7 tree at 7b9fd3194ee6 reads no such flag (its registry does not list it). "
                    "Fix: use GENESIS_ENABLE_PN54_GDN_CONTIGUOUS_DEDUP")


def test_dead_tunable_is_refused(real_inventory: Path, mirrors: MirrorMap) -> None:
    text = one_error(seed(real_inventory), "tq3-mtp-genesis", mirrors,
                     engine_env={"GENESIS_PN26_SPARSE_V_BLOCKKV": "8"})
    assert "never reads it" in text and text.endswith("Fix: use GENESIS_PN26_SPARSE_V_BLOCK_KV")


def test_v12_tree_declared_as_v7(real_inventory: Path, mirrors: MirrorMap) -> None:
    base = seed(real_inventory)
    assert base.genesis is not None
    wrong = base.model_copy(update={"genesis": GenesisPin(source=base.genesis.source, commit=V12_TREE,
                                                          kind="genesis-v7")})
    text = one_error(wrong, "tq3-mtp-genesis", mirrors)
    assert text == ("error: pinset seed-2026-05: genesis.kind = 'genesis-v7': the tree at 7aa66f9ac6bc has the "
                    "sndr-v12 layout. Fix: set kind: sndr-v12")


def test_vllm_outside_the_tree_allowlist(real_inventory: Path, mirrors: MirrorMap) -> None:
    wrong = seed(real_inventory).model_copy(update={"vllm_version": "0.27.1"})
    text = one_error(wrong, "tq3-mtp-genesis", mirrors)
    assert text.startswith("error: pinset seed-2026-05: vllm_version = '0.27.1': not in the genesis-v7 tree's "
                           "allowlist at 7b9fd3194ee6")


def test_tree_registry_is_the_real_one(mirrors: MirrorMap) -> None:
    v7 = tree_facts("https://github.com/Sandermage/genesis-vllm-patches.git", SEED_TREE, mirrors, False)
    v12 = tree_facts("https://github.com/Sandermage/genesis-vllm-patches.git", V12_TREE, mirrors, False)
    assert (v7.kind, v12.kind) == ("genesis-v7", "sndr-v12")
    assert v7.registry["PN54"] == "GENESIS_ENABLE_PN54_GDN_CONTIGUOUS_DEDUP"
    assert v7.allowlist == ["0.20.1rc1.dev16+g7a1eb8ac2", "0.20.2rc1.dev9+g01d4d1ad3"]
    assert "0.23.1rc1.dev424+g3f5a1e173" in v12.allowlist
    assert (v7.entry_point, v12.entry_point) == ("python3 -m vllm._genesis.patches.apply_all", "python3 -m sndr.apply")
    # catalog/compat.yaml's hand-written allowlist must be the tree's own
    assert catalog.compat()["genesis_known_good_vllm"][SEED_TREE] == v7.allowlist


def test_pins_command_fails_with_the_one_error(real_inventory: Path) -> None:
    group_vars = real_inventory / "group_vars" / "all.yml"
    group_vars.write_text(group_vars.read_text() + "engine_env: {GENESIS_ENABLE_PN54: '0'}\n")
    result = CliRunner().invoke(main, ["pins"], env={"RIGFLEET_INVENTORY": str(real_inventory)})
    assert result.exit_code == 2
    assert "Fix: use GENESIS_ENABLE_PN54_GDN_CONTIGUOUS_DEDUP" in result.output
    check = CliRunner().invoke(main, ["check"], env={"RIGFLEET_INVENTORY": str(real_inventory)})
    assert check.exit_code == 2 and "GENESIS_ENABLE_PN54_GDN_CONTIGUOUS_DEDUP" in check.output


def test_check_without_cache_or_mirror_says_so(example_inventory: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["check"], env={"RIGFLEET_INVENTORY": str(example_inventory),
                                                      "RIGFLEET_UPSTREAM_CACHE": str(tmp_path / "empty")})
    assert result.exit_code == 0
    assert ("warning: pinset seed-2026-05: upstream = None: not verified: no cached derivation of vLLM 0.20.2"
            in result.output)
