"""The SNDR v12 build path against the REAL v12.0.0 tree (the shared mirror's bundle): what the image
build and the entrypoint rely on is what the tree declares, the rendered install and plugin check
work on the tree's own files, and the v12 pin set and its variant verify against the real tree and
wheel (its nightly is not on PyPI: the nearest release stands in, and says so)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tarfile
from dataclasses import replace
from io import BytesIO
from pathlib import Path

import pytest
import tomllib

from rigfleet import catalog, render
from rigfleet.loader import load_fleet
from rigfleet.operations import image as image_ops
from rigfleet.render import Release
from rigfleet.roles.vllm_image import vllm_image
from rigfleet.schema import MirrorMap
from rigfleet.upstream.sources import tree_facts, tree_repo
from rigfleet.upstream.verify import probe_rig, releases_for, verify
from tests.plan.test_image_weights import DIGEST, converge, make_ctx, pinset_data
from tests.upstream.conftest import TREE_SOURCE

V12_TREE = "7aa66f9ac6bc22b8e0d71cff75bf26ebbbd5ae97"

pytestmark = pytest.mark.usefixtures("real_upstream_cache")


def git_show(mirrors: MirrorMap, path: str) -> str:
    repo = tree_repo(TREE_SOURCE, V12_TREE, mirrors, False)
    return subprocess.run(["git", "show", f"{V12_TREE}:{path}"], cwd=repo, check=True,
                          capture_output=True, text=True).stdout


def test_kind_data_is_what_the_real_v12_tree_declares(mirrors: MirrorMap) -> None:
    kind = catalog.patch_tree_kinds()["sndr-v12"]
    project = tomllib.loads(git_show(mirrors, "pyproject.toml"))
    plugin = kind["plugin"]
    assert project["project"]["entry-points"][plugin["group"]] == {plugin["name"]: plugin["target"]}
    module, _, func = plugin["target"].partition(":")
    assert f"def {func}(" in git_show(mirrors, module.replace(".", "/") + ".py")
    assert git_show(mirrors, kind["apply_module"].replace(".", "/") + "/__main__.py")
    assert kind["entry_point"] == f"python3 -m {kind['apply_module']}"
    # every program the build checks for is one the tree really runs (subprocess argv[0])
    repo = tree_repo(TREE_SOURCE, V12_TREE, mirrors, False)
    for program in kind["runtime_programs"]:
        runs = subprocess.run(["git", "grep", "-l", "-F", f'["{program}", ', V12_TREE, "--", "sndr/"], cwd=repo,
                              capture_output=True, text=True).stdout
        assert runs.strip(), f"the v12 tree runs no {program}"


def test_shipped_v12_pin_sets_verify_against_the_real_tree_and_wheel(real_inventory: Path) -> None:
    fleet = load_fleet(real_inventory)
    for name in ("sndr-v12", "sndr-v12-dev301"):
        pinset = fleet.pinsets[name]
        verdict = verify(name, pinset, releases_for(pinset, catalog.variants(), fleet.rigs), fleet.mirrors)
        assert verdict.ok, [p.render() for p in verdict.problems] or verdict.unavailable
        assert (verdict.tree_kind, verdict.checked, verdict.surface_release) == ("sndr-v12", ["tq3-mtp-sndr"], "0.23.0")
        assert verdict.notes == [f"vLLM {pinset.vllm_version} is not on PyPI: checked against release 0.23.0"]


def test_v12_variant_with_a_flag_the_real_tree_never_reads_is_refused(real_inventory: Path) -> None:
    fleet = load_fleet(real_inventory)
    pinset = fleet.pinsets["sndr-v12"]
    rig = probe_rig(pinset, "tq3-mtp-sndr").model_copy(update={"engine_env": {"GENESIS_ENABLE_P67_TQ_MULTIQUERY": "1"}})
    verdict = verify(pinset.name, pinset, {"tq3-mtp-sndr": Release(rig, pinset, catalog.variants()["tq3-mtp-sndr"])},
                     fleet.mirrors)
    assert [p.render() for p in verdict.problems] == [
        "error: pinset sndr-v12: variant tq3-mtp-sndr: env = 'GENESIS_ENABLE_P67_TQ_MULTIQUERY': the sndr-v12 tree "
        "at 7aa66f9ac6bc reads no such flag (its registry does not list it). "
        "Fix: use GENESIS_ENABLE_P67_TQ_MULTI_QUERY_KERNEL"]


def registry_lifecycles(source: str) -> dict[str, str]:
    """env flag -> "lifecycle" of each PATCH_REGISTRY entry of the real registry.py (read as data)."""
    module = ast.parse(source)
    value = next(node.value for node in module.body if isinstance(node, (ast.Assign, ast.AnnAssign))
                 and "PATCH_REGISTRY" in [t.id for t in getattr(node, "targets", [getattr(node, "target", None)])
                                          if isinstance(t, ast.Name)])
    assert isinstance(value, ast.Dict)
    out = {}
    for entry in value.values:
        fields = {k.value: v.value for k, v in zip(entry.keys, entry.values, strict=True)  # type: ignore[union-attr]
                  if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)} if isinstance(entry, ast.Dict) else {}
        if fields.get("env_flag"):
            out[str(fields["env_flag"])] = str(fields.get("lifecycle"))
    return out


def test_v12_variants_switch_on_no_patch_the_real_registry_retired(mirrors: MirrorMap) -> None:
    """A retired patch switched on does nothing at best; P61 and P83 are DRIFT skips on the real
    0.23.0 sources, which the health gate refuses."""
    lifecycle = registry_lifecycles(git_show(mirrors, catalog.patch_tree_kinds()["sndr-v12"]["registry"]))
    assert lifecycle["GENESIS_ENABLE_P83"] == lifecycle["GENESIS_ENABLE_P61_QWEN3_MULTI_TOOL"] == "retired"
    variants = {name: v for name, v in catalog.variants().items() if v.genesis and v.genesis.kind == "sndr-v12"}
    assert variants, "no shipped variant on the v12 tree"
    for name, variant in variants.items():
        assert variant.genesis is not None
        on = [flag for flag, value in variant.genesis.env(variant.max_num_batched_tokens).items() if value == "1"]
        retired = [flag for flag in on if lifecycle.get(flag) == "retired"]
        assert not retired, f"{name} switches on patches the v12 tree retired: {retired}"
        assert len(on) > 20, on


def test_rendered_install_and_plugin_check_work_on_the_real_tree(real_inventory: Path, tmp_path: Path) -> None:
    """The build script's own lines (pip install -e --no-deps, the entry-point and module checks) run
    against the real v12.0.0 files in a fresh venv: they fail before the install, pass after it."""
    fleet = load_fleet(real_inventory)
    repo = tree_repo(TREE_SOURCE, V12_TREE, fleet.mirrors, False)
    archive = subprocess.run(["git", "archive", "--format=tar", V12_TREE], cwd=repo, check=True,
                             capture_output=True).stdout
    tree = tmp_path / "tree"
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(tree, filter="data")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    wheels = tmp_path / "wheels"  # the kind's build requirements, fetched as the image build does
    build_requires = catalog.patch_tree_kinds()["sndr-v12"]["build_requires"]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "-d", str(wheels), *(f"{n}=={v}" for n, v in build_requires.items())], check=True)
    build = render.image_files(fleet.pinsets["sndr-v12"])["rigfleet-build.sh"]
    lines = [line for line in build.splitlines()
             if line.startswith(("TREE=", "python3 -m pip install --no-deps", "python3 -c"))]
    assert len(lines) == 4, lines
    checks = "\n".join(["set -eu", *lines[2:]])
    script = "\n".join(["set -eu", f"TREE={tree}", *lines[1:]])

    def run(text: str) -> subprocess.CompletedProcess[str]:
        text = re.sub(r"^python3 ", f"{venv}/bin/python ", text, flags=re.M)
        text = text.replace("/tmp/rigfleet/wheels", str(wheels))
        return subprocess.run(["sh", "-c", text], capture_output=True, text=True)

    before = run(checks)
    assert before.returncode != 0 and "plugin entry point vllm.general_plugins genesis_v7 is missing" in before.stderr
    after = run(script)
    assert after.returncode == 0, after.stderr[-2000:]


def test_guard_allowlist_for_v12_is_the_real_trees(mirrors: MirrorMap) -> None:
    facts = tree_facts(TREE_SOURCE, V12_TREE, mirrors, False)
    versions = list(dict.fromkeys(v for v in facts.allowlist if v[0].isdigit()))  # docker tags left out
    assert catalog.compat()["genesis_known_good_vllm"][V12_TREE] == versions
    assert {"0.23.1rc1.dev424+g3f5a1e173", "0.23.1rc1.dev301+g04c2a8dea"} <= set(versions)


def test_image_build_clones_the_real_v12_tree_through_the_mirror_map(mirrors: MirrorMap, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The vllm_image role for real (@local): the pin set names the GitHub source, mirrors.yml maps
    it to the shared mirror's git bundle, the bundle is uploaded and the real v12.0.0 tree lands in
    the build dir at the pinned SHA; the image tag does not depend on where the tree came from."""
    monkeypatch.setattr(image_ops, "LOG_DIR", str(tmp_path / "log"))
    monkeypatch.setattr(image_ops, "BUILD_ROOT", str(tmp_path / "build"))
    data = pinset_data(name="pin-sndr", vllm_version="0.23.1rc1.dev424+g3f5a1e173", overlays=[],
                       genesis={"source": TREE_SOURCE, "commit": V12_TREE, "kind": "sndr-v12"},
                       base_image={"repository": "vllm/vllm-openai", "tag": "nightly-x", "digest": DIGEST,
                                   "archive": str(tmp_path / "missing-base.tar")})
    direct = make_ctx(data, variant="tq3-mtp-sndr")
    ctx = replace(direct, fleet=replace(direct.fleet, mirrors=mirrors))
    tag = render.image_tag(ctx.pinset)
    state, host = converge(vllm_image, ctx)
    assert host in state.failed_hosts  # the base image step fails (no archive): the tree step ran before it
    tree = Path(image_ops.build_dir(tag)) / "genesis"
    assert (tree / "sndr" / "apply" / "__main__.py").is_file() and not (tree / "vllm" / "_genesis").exists()
    assert 'genesis_v7 = "sndr.plugin:register"' in (tree / "pyproject.toml").read_text()
    assert (Path(image_ops.build_dir(tag)) / ".rigfleet-steps" / "genesis").read_text().strip() == V12_TREE
    log = Path(image_ops.build_log(tag)).read_text()
    assert f"Genesis {V12_TREE} from {mirrors.prefixes[TREE_SOURCE]} verified" in log
