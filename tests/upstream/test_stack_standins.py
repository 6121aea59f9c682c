"""The sandbox's SIMULATED stand-ins for the shipped stacks (rigfleet_sandbox.stacks) against the
real pin sets and the real vLLM release wheels: they drift from neither.

* the stand-in images carry each shipped pin set's tag and exact vLLM version;
* a sandbox pin set differs from the shipped one only in what a sandbox cannot have;
* the SIMULATED engine, holding a release's real CLI surface, accepts every serve command rigfleet
  renders for that pin set's variants and refuses what the real release does not know.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rigfleet import catalog, render
from rigfleet.loader import load_fleet
from rigfleet.render import Release
from rigfleet.upstream.verify import probe_rig
from rigfleet_sandbox import engine, stacks

pytestmark = pytest.mark.usefixtures("real_upstream_cache")
PARSE = ("import sys; from vllm.entrypoints.openai.cli_args import make_arg_parser as m; "
         "m().parse_args(sys.argv[1:])")


def test_stand_in_images_carry_the_shipped_tags_and_versions() -> None:
    real = stacks.shipped()
    assert set(real) == set(stacks.STACKS)
    specs = dict(zip(real, stacks.images(real), strict=True))
    for name, spec in specs.items():
        assert (spec.tag, spec.vllm_version) == (real[name]["base_image"]["tag"], real[name]["vllm_version"])
    assert specs["seed-2026-05"] in engine.IMAGES  # the sandbox's own seed stand-in, not a second one
    assert specs["stock-v0-27-1"].tag == "v0.27.1" and specs["sndr-v12"].pinset == "stack-sndr-v12"


def test_a_sandbox_pin_set_differs_only_in_what_a_sandbox_cannot_have() -> None:
    for name, real in stacks.shipped().items():
        derived = stacks.derive(name, real, "sha256:" + "0" * 64, "http://h/images/x.tar", [{"name": "o"}],
                                "http://h/simple/")
        changed = {key for key in real.keys() | derived.keys() if real.get(key) != derived.get(key)}
        assert changed <= set(stacks.SANDBOX_FIELDS), (name, changed)
        assert derived["base_image"]["repository"] == real["base_image"]["repository"]
        assert derived["base_image"]["tag"] == real["base_image"]["tag"]
        assert derived.get("genesis") == real.get("genesis")  # the real tree at its real commit


def test_the_index_holds_what_the_sndr_build_installs(real_inventory: Path) -> None:
    pinset = load_fleet(real_inventory).pinsets["sndr-v12"]
    assert stacks.build_requirements() == render.wheel_deps(pinset.model_copy(update={"python_deps": {}}))
    assert stacks.build_requirements()  # setuptools and wheel, pinned by the kind


def _site(tmp_path: Path, version: str) -> Path:
    site = tmp_path / version
    engine.install_standin_vllm(site, version)
    data = stacks.surface_file(version)
    assert data is not None, f"no real CLI surface for vLLM {version}"
    (site / stacks.SURFACE_FILE).write_bytes(data)
    return site


def _parse(site: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", PARSE, *argv], env={"PYTHONPATH": str(site)},
                          capture_output=True, text=True, timeout=60)


def test_the_stand_ins_carry_the_real_debian_programs_the_trees_run(tmp_path: Path) -> None:
    """GNU patch (PN119 of SNDR v12 runs it; the real vllm-openai image has it) comes from Debian's
    own .deb of the root's suite, as an executable that runs."""
    kinds = catalog.patch_tree_kinds()
    assert stacks.runtime_packages() == sorted(kinds["sndr-v12"]["runtime_programs"].values()) == ["patch"]
    files = stacks.debian_files(stacks.runtime_packages(), "trixie", tmp_path)
    data, mode = files["usr/bin/patch"]
    assert mode == 0o755 and "usr/share/doc/patch/copyright" in files
    binary = tmp_path / "patch"
    binary.write_bytes(data)
    binary.chmod(mode)
    assert "GNU patch" in subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=True).stdout


def test_the_engine_accepts_what_rigfleet_renders_for_each_stack(tmp_path: Path, real_inventory: Path) -> None:
    fleet = load_fleet(real_inventory)
    for name in stacks.STACKS:
        pinset = fleet.pinsets[name]
        site = _site(tmp_path, pinset.vllm_version)
        for variant in pinset.variants:
            release = Release(probe_rig(pinset, variant), pinset, catalog.variants()[variant])
            args = release.serve_args()
            done = _parse(site, args)
            assert done.returncode == 0, (name, variant, done.stderr[-500:])


def test_the_engine_refuses_what_the_real_release_lacks(tmp_path: Path) -> None:
    site = _site(tmp_path, "0.27.1")
    gone = _parse(site, ["--swap-space", "4"])  # modelled by the stand-in, gone from real 0.27.1
    assert gone.returncode == 2 and "unrecognized arguments: --swap-space" in gone.stderr
    assert "vLLM 0.27.1" in gone.stderr
    assert _parse(site, ["--max-cudagraph-capture-size", "8"]).returncode == 0  # real, not modelled
    bogus = _parse(site, ["--kv-cache-dtype", "fp8_e4m3", "--no-such-flag"])
    assert bogus.returncode == 2 and "--no-such-flag" in bogus.stderr
