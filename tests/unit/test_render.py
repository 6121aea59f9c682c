"""Template renders: golden files for every variant, Compose schema validity, seed recipe facts."""

from __future__ import annotations

import json
import os
from pathlib import Path

import jsonschema
import pytest
import yaml

from rigfleet import catalog
from rigfleet.loader import load_fleet
from rigfleet.render import Release, image_tag

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
SCHEMA = json.loads((Path(__file__).resolve().parent.parent / "fixtures" / "compose-spec" / "compose_spec.json")
                    .read_text())
UPDATE = os.environ.get("RIGFLEET_UPDATE_GOLDEN") == "1"


def releases(inventory: Path) -> dict[str, Release]:
    fleet = load_fleet(inventory)
    return {rig.variant: Release(rig, fleet.pinsets[rig.pinset], catalog.variants()[rig.variant])
            for rig in fleet.rigs}


def assert_golden(golden: Path, text: str) -> None:
    if UPDATE:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text, encoding="utf-8")
    assert golden.is_file(), f"missing golden file {golden}; run with RIGFLEET_UPDATE_GOLDEN=1"
    assert text == golden.read_text(encoding="utf-8"), f"{golden} differs from the render"


@pytest.mark.parametrize("variant", sorted(catalog.variants()))
def test_golden_render(golden_inventory: Path, variant: str) -> None:
    """Per variant: the compose file and env file. The image files depend on the pin set only."""
    release = releases(golden_inventory)[variant]
    files = release.files(secrets=None, release_id=release.release_id())
    for name in ("compose.yaml", "rigfleet.env"):
        assert_golden(GOLDEN / variant / name, files[name])
    for name in ("Dockerfile", "entrypoint.sh", "rigfleet-build.sh"):
        assert_golden(GOLDEN / f"image-{release.pinset.name}" / name, files[name])


@pytest.mark.parametrize("variant", sorted(catalog.variants()))
def test_compose_is_valid_compose(golden_inventory: Path, variant: str) -> None:
    document = yaml.safe_load(releases(golden_inventory)[variant].compose("r1"))
    assert document.pop("name") == "rigfleet"  # newer than the vendored schema (see its SOURCE.md)
    jsonschema.Draft201909Validator(SCHEMA).validate(document)


def test_schema_validation_catches_a_broken_compose() -> None:
    """Negative control: the vendored schema does reject a wrong shape."""
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft201909Validator(SCHEMA).validate({"services": {"vllm": {"shm_size": ["16gb"], "ipc": 1}}})


def test_tq3_mtp_genesis_carries_the_seed_recipe(golden_inventory: Path) -> None:
    release = releases(golden_inventory)["tq3-mtp-genesis"]
    service = yaml.safe_load(release.compose("r1"))["services"]["vllm"]
    args, env = service["command"], service["environment"]

    def arg(flag: str) -> str:
        return args[args.index(flag) + 1]

    assert arg("--tensor-parallel-size") == "2"
    assert arg("--max-model-len") == "262144"
    assert arg("--max-num-seqs") == "2"
    assert arg("--kv-cache-dtype") == "turboquant_3bit_nc"
    assert json.loads(arg("--speculative-config")) == {"method": "mtp", "num_speculative_tokens": 3}
    assert env["GENESIS_ENABLE_P66_CUDAGRAPH_SIZE_FILTER"] == "1"
    assert env["GENESIS_ENABLE_P67_TQ_MULTI_QUERY_KERNEL"] == "1"
    assert not any(key.startswith("GENESIS_ENABLE_P65") for key in env)
    assert env["GENESIS_ENABLE_P87"] == "0"
    assert arg("--max-num-batched-tokens") == "4128"
    assert env["GENESIS_PROFILE_RUN_CAP_M"] == env["GENESIS_PREALLOC_TOKEN_BUDGET"] == "4128"
    assert env["NCCL_P2P_DISABLE"] == "1"
    assert service["shm_size"] == "16gb" and service["ipc"] == "host"
    assert service["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert service["restart"] == "unless-stopped"
    assert "--disable-custom-all-reduce" in args


def test_full_genesis_flag_set_is_rendered(golden_inventory: Path) -> None:
    env = releases(golden_inventory)["tq3-mtp-genesis"].environment()
    genesis = {k: v for k, v in env.items() if k.startswith("GENESIS_")}
    # 37 on (P4 is legacy: applied unconditionally, no flag), 6 explicitly off, 6 tunables,
    # 2 budgets, the pin policy
    assert sum(v == "1" for k, v in genesis.items() if k.startswith("GENESIS_ENABLE_")) == 37
    assert "GENESIS_ENABLE_P4" not in genesis
    assert sorted(k for k, v in genesis.items() if k.startswith("GENESIS_ENABLE_") and v == "0") == sorted(
        f"GENESIS_ENABLE_{f}" for f in ("P87", "P78_TOLIST_CAPTURE_GUARD", "P81_FP8_BLOCK_SCALED_M_LE_8",
                                         "P40", "PN54_GDN_CONTIGUOUS_DEDUP", "P82"))
    assert env["GENESIS_VLLM_PIN_POLICY"] == "strict"


def test_secrets_stay_out_of_compose_and_image(golden_inventory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    release = releases(golden_inventory)["int8"]
    secret = "hf_TOPSECRET_do_not_leak"
    files = release.files(secrets={"hf_token": secret, "api_key": "sk-also-secret"})
    assert secret in files["rigfleet.env"]
    for name in ("compose.yaml", "Dockerfile", "entrypoint.sh"):
        assert secret not in files[name] and "sk-also-secret" not in files[name]
    assert "HF_TOKEN" in release.files(secrets=None)["rigfleet.env"]  # the reference, not a value
    assert "--api-key" not in release.serve_args()


def test_image_tag_is_a_content_hash(golden_inventory: Path) -> None:
    fleet = load_fleet(golden_inventory)
    pinset = fleet.pinsets["seed-2026-05"]
    assert image_tag(pinset) == image_tag(pinset.model_copy())
    moved = pinset.model_copy(update={"python_deps": {**pinset.python_deps, "xxhash": "3.6.0"}})
    assert image_tag(moved) != image_tag(pinset)
    genesis = pinset.genesis.model_copy(update={"commit": "f" * 40})  # type: ignore[union-attr]
    assert image_tag(pinset.model_copy(update={"genesis": genesis})) != image_tag(pinset)


def test_release_id_is_stable_and_variant_specific(golden_inventory: Path) -> None:
    rel = releases(golden_inventory)
    assert rel["int8"].release_id() == rel["int8"].release_id()
    assert rel["int8"].release_id() != rel["turbo"].release_id()


@pytest.mark.parametrize("variant", sorted(catalog.variants()))
def test_nvlink_rig_gets_nccl_over_nvlink_and_no_expandable_segments(golden_inventory: Path, variant: str) -> None:
    pcie = releases(golden_inventory)[variant]
    nvlinked = Release(pcie.rig.model_copy(update={"nvlink": True}), pcie.pinset, pcie.variant)
    env = nvlinked.environment()
    assert env["NCCL_P2P_LEVEL"] == "NVL"
    assert "NCCL_P2P_DISABLE" not in env
    assert "expandable_segments" not in env.get("PYTORCH_CUDA_ALLOC_CONF", "")
    before = pcie.environment()
    assert before["NCCL_P2P_DISABLE"] == "1" and "NCCL_P2P_LEVEL" not in before
    # the other allocator settings stay
    kept = [p for p in before.get("PYTORCH_CUDA_ALLOC_CONF", "").split(",") if p and "expandable" not in p]
    assert [p for p in env.get("PYTORCH_CUDA_ALLOC_CONF", "").split(",") if p] == kept
    custom = "--disable-custom-all-reduce" in nvlinked.serve_args()
    assert custom == (pcie.variant.custom_all_reduce == "disabled")


@pytest.mark.parametrize("variant", sorted(catalog.variants()))
def test_engine_caches_live_on_a_host_dir_keyed_by_image(golden_inventory: Path, variant: str) -> None:
    """vLLM's whole cache root (torch.compile, inductor) and Triton's cache dir are bind mounts from
    a host dir named by the image's content tag, at the paths the container's env points them to:
    a restart or rollback of one image finds its compiled artifacts, another image never does."""
    release = releases(golden_inventory)[variant]
    service = yaml.safe_load(release.compose("r1"))["services"]["vllm"]
    env = service["environment"]
    mounts = {m["target"]: m for m in service["volumes"]}
    tag = release.image.split(":", 1)[1]
    for name, leaf in (("VLLM_CACHE_ROOT", "vllm"), ("TRITON_CACHE_DIR", "triton")):
        mount = mounts[env[name]]
        assert mount["source"] == f"{release.rig.cache_dir}/compile/{tag}/{leaf}"
        assert mount["read_only"] is False
    same = Release(release.rig, release.pinset, release.variant)
    assert same.cache_mounts() == release.cache_mounts()
    moved = release.pinset.model_copy(update={"python_deps": {**release.pinset.python_deps, "xxhash": "3.6.0"}})
    other = Release(release.rig, moved, release.variant)
    assert set(other.cache_mounts().values()).isdisjoint(release.cache_mounts().values())


def test_a_rig_moving_a_cache_dir_moves_its_mount(golden_inventory: Path) -> None:
    release = releases(golden_inventory)["int8"]
    rig = release.rig.model_copy(update={"engine_env": {**release.rig.engine_env, "TRITON_CACHE_DIR": "/cache/t"}})
    volumes = yaml.safe_load(Release(rig, release.pinset, release.variant).compose("r1"))["services"]["vllm"]["volumes"]
    assert {m["target"] for m in volumes} >= {"/cache/t", "/root/.cache/vllm"}
