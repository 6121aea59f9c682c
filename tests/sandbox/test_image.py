"""Sandbox tier for the image and weights roles, on a SIMULATED rig over real SSH.

The base image, Genesis repo, overlays and weights are the sandbox's stand-ins (served from the
host at 10.231.0.1:8080, see sandbox/rigfleet_sandbox/engine.py); the build itself is a real `docker
build` in the rig. Tests run in file order and share one rig.
"""

from __future__ import annotations

import dataclasses
import json
import shlex

import pytest

from rigfleet import catalog, render, runner
from rigfleet.loader import Fleet, load_fleet
from rigfleet.operations import image as image_ops
from rigfleet.operations import weights as weights_ops
from rigfleet.roles import HOST_LAYER
from rigfleet.roles.model_weights import model_weights
from rigfleet.roles.vllm_image import vllm_image
from rigfleet.schema import PinSet

from .conftest import Sandbox

RIG = "rig-01"
SANDBOX_FRESH = True  # the first deploy must find a bare rig
SUBDIR = "qwen3.6-27b-autoround-int4"
GENESIS_MARKER = r"#\s*\[Genesis P\w+ "  # what the stand-in apply_all writes into vllm files


@pytest.fixture(scope="module")
def fleet(sandbox: Sandbox) -> Fleet:
    # the machine running the sandbox may have less disk than preflight's default wants for a
    # real rig (80 GiB; the stand-ins need a few hundred MB), and rigs reach no registry (the
    # GPU smoke container uses the local image)
    (sandbox.host_vars_dir / f"{RIG}.yml").write_text("min_free_disk_gib: 5\nsmoke_image: local\n")
    loaded = load_fleet(sandbox.inventory_dir)
    if not loaded.rig(RIG).pinset.startswith("sandbox-") or not loaded.pinsets:
        pytest.skip("the sandbox inventory has no engine pin sets (rigfleet_sandbox.engine did not run)")
    return loaded


def template_path(fleet: Fleet) -> str:
    rig = fleet.rig(RIG)
    return f"{rig.model_dir}/chat-templates/{catalog.variants()[rig.variant].chat_template}.jinja"


def mirror_has_template(sandbox: Sandbox, fleet: Fleet) -> bool:
    rig = fleet.rig(RIG)
    assert rig.weights_source.url, "the sandbox inventory points weights_source at its mirror"
    name = catalog.variants()[rig.variant].chat_template
    urls = [f"{weights_ops.mirror_root_url(rig.weights_source.url, SUBDIR)}chat-templates/{name}.jinja",
            f"{weights_ops.mirror_dir_url(rig.weights_source.url, SUBDIR)}chat_template.jinja"]
    return any(rig_sh(sandbox, f"curl -fsS -o /dev/null {shlex.quote(u)} && echo yes || true").strip() == "yes"
               for u in urls)


def place_operator_template(sandbox: Sandbox, fleet: Fleet) -> None:
    """What an operator does where the mirror has no chat template (the role keeps it)."""
    path = template_path(fleet)
    rig_sh(sandbox, f"mkdir -p $(dirname {path}) && echo '{{{{ messages }}}}' > {path}")


@pytest.fixture(scope="module")
def deployed(sandbox: Sandbox, fleet: Fleet) -> dict[str, str]:
    """A fresh rig, one deploy run as deploy.py does it: the host layer (Docker is not on the rig
    when pyinfra plans), then model_weights and vllm_image. Returns what the tests compare with."""
    assert rig_sh(sandbox, "command -v docker || echo none").strip() == "none", "the rig should be fresh"
    if not mirror_has_template(sandbox, fleet):
        place_operator_template(sandbox, fleet)
    outcome = runner.converge(fleet, [RIG], roles=[*HOST_LAYER, model_weights, vllm_image])[RIG]
    assert outcome.ok, f"first deploy: {outcome.summary}"
    return {"tag": render.image_tag(pinset(fleet))}


def pinset(fleet: Fleet) -> PinSet:
    return fleet.pinsets[fleet.rig(RIG).pinset]


def rig_sh(sandbox: Sandbox, command: str, check: bool = True) -> str:
    return sandbox.ssh(RIG, f"sudo -n sh -c {shlex.quote(command)}", check=check).stdout


def image_info(sandbox: Sandbox, tag: str) -> dict | None:
    out = rig_sh(sandbox, f"docker image inspect {shlex.quote(tag)} 2>/dev/null || true").strip()
    found = json.loads(out) if out else []  # a missing image prints []
    return found[0] if found else None


def builds(sandbox: Sandbox, tag: str) -> int:
    out = rig_sh(sandbox, f"cat {image_ops.BUILDS_LEDGER} 2>/dev/null || true")
    return sum(1 for line in out.splitlines() if line.strip() and json.loads(line)["tag"] == tag)


@pytest.mark.sandbox
def test_deploy_builds_the_content_tagged_image_with_its_provenance(sandbox: Sandbox, fleet: Fleet,
                                                                     deployed: dict[str, str]) -> None:
    pins = pinset(fleet)
    tag = render.image_tag(pins)
    assert tag == deployed["tag"]
    info = image_info(sandbox, tag)
    assert info is not None, f"{tag} is not on the rig"
    labels = info["Config"]["Labels"]
    assert labels["io.rigfleet.image-tag"] == tag
    assert labels["io.rigfleet.pinset"] == pins.name
    assert labels["io.rigfleet.vllm-version"] == pins.vllm_version
    assert labels["io.rigfleet.base-digest"] == pins.base_image.digest
    assert pins.genesis is not None and labels["io.rigfleet.genesis-commit"] == pins.genesis.commit
    for overlay in pins.overlays:
        for file in overlay.files:
            assert f"{overlay.name}:{file.target}@{file.sha256}" in labels["io.rigfleet.overlays"]
    assert builds(sandbox, tag) == 1
    assert rig_sh(sandbox, f"test -e {image_ops.build_dir(tag)} && echo left || echo gone").strip() == "gone"
    assert "built" in rig_sh(sandbox, f"cat {image_ops.build_log(tag)}")

    # inside: Genesis in the vllm package found by importlib, its plugin's entry point, the
    # overlays byte for byte, and no Genesis patch applied at build time (apply_all needs the GPU)
    probe = (
        "import hashlib, importlib.metadata as md, importlib.util, json, os, pathlib, re\n"
        "d = pathlib.Path(importlib.util.find_spec('vllm').origin).parent\n"
        "eps = [e.name for e in md.entry_points(group='vllm.general_plugins')]\n"
        "files = {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in d.rglob('*.py')}\n"
        "marked = [f for f in files if not f.startswith('_genesis/') "
        f"and re.search({GENESIS_MARKER!r}, (d / f).read_text(errors='replace'))]\n"
        "print(json.dumps({'genesis': (d / '_genesis/patches/apply_all.py').is_file(), 'eps': eps, "
        "'files': files, 'marked': marked}))\n"
    )
    out = rig_sh(sandbox, f"docker run --rm --entrypoint python3 {shlex.quote(tag)} -c {shlex.quote(probe)}")
    inside = json.loads(out.strip().splitlines()[-1])
    assert inside["genesis"] and "genesis_v7" in inside["eps"]
    for overlay in pins.overlays:
        for file in overlay.files:
            assert inside["files"][file.target] == file.sha256
    assert inside["marked"] == []


@pytest.mark.sandbox
def test_second_deploy_changes_nothing_and_skips_the_build(sandbox: Sandbox, fleet: Fleet,
                                                           deployed: dict[str, str]) -> None:
    tag = deployed["tag"]
    before = image_info(sandbox, tag)
    assert before is not None
    stamp = weights_ops.stamp_path(fleet.rig(RIG).model_dir, SUBDIR)
    stamp_before = rig_sh(sandbox, f"stat -c %Y {stamp}")
    outcome = runner.converge(fleet, [RIG], roles=[model_weights, vllm_image])[RIG]
    assert outcome.ok and outcome.changed == 0, outcome.summary
    after = image_info(sandbox, tag)
    assert after is not None and (after["Id"], after["Created"]) == (before["Id"], before["Created"])
    assert builds(sandbox, tag) == 1
    assert rig_sh(sandbox, f"stat -c %Y {stamp}") == stamp_before  # weights not even re-stamped


@pytest.mark.sandbox
def test_wrong_overlay_checksum_is_refused_before_anything_is_stopped(sandbox: Sandbox, fleet: Fleet,
                                                                      deployed: dict[str, str]) -> None:
    pins = pinset(fleet)
    overlay = pins.overlays[0]
    first = overlay.files[0]
    wrong = "0" * 64
    bad_overlay = overlay.model_copy(update={"files": (first.model_copy(update={"sha256": wrong}),
                                                       *overlay.files[1:])})
    bad = pins.model_copy(update={"overlays": (bad_overlay, *pins.overlays[1:])})
    bad_fleet = dataclasses.replace(fleet, pinsets={**fleet.pinsets, pins.name: bad})
    bad_tag = render.image_tag(bad)
    assert bad_tag != render.image_tag(pins)

    # what runs on the rig now (a serving container, when an earlier module deployed one)
    running = rig_sh(sandbox, "docker ps -q --no-trunc | sort").split()
    good_builds = builds(sandbox, render.image_tag(pins))
    roles = [vllm_image]
    try:
        from rigfleet.roles.serving import serving

        roles.append(serving)  # the deploy order: a refused image must keep serving from running
    except ImportError:
        pass
    outcome = runner.converge(bad_fleet, [RIG], roles=roles)[RIG]
    assert not outcome.ok
    message = " ".join(outcome.errors)
    actual = rig_sh(sandbox, f"curl -fsSL {shlex.quote(first.source)} | sha256sum").split()[0]
    # the runner keeps the tail of the output; the full line is in the build log
    assert overlay.name in message and f"sha256 mismatch: expected {wrong}, got {actual}" in message
    log = rig_sh(sandbox, f"cat {image_ops.build_log(bad_tag)}")
    assert f"overlay {overlay.name} file {first.target}: sha256 mismatch: expected {wrong}, got {actual}" in log
    assert "docker build" not in log
    assert image_info(sandbox, bad_tag) is None and builds(sandbox, bad_tag) == 0
    assert builds(sandbox, render.image_tag(pins)) == good_builds
    assert rig_sh(sandbox, "docker ps -q --no-trunc | sort").split() == running  # nothing stopped or started


@pytest.mark.sandbox
def test_weights_are_the_mirrors_verified_and_stamped(sandbox: Sandbox, fleet: Fleet,
                                                      deployed: dict[str, str]) -> None:
    rig = fleet.rig(RIG)
    assert rig.weights_source.url
    dest = f"{rig.model_dir}/{SUBDIR}"
    manifest = rig_sh(sandbox, f"curl -fsSL {shlex.quote(weights_ops.mirror_dir_url(rig.weights_source.url, SUBDIR))}"
                               "SHA256SUMS")
    check = rig_sh(sandbox, f"cd {shlex.quote(dest)} && sha256sum -c --quiet - <<'EOF'\n{manifest}EOF\necho rc=$?")
    assert check.strip().endswith("rc=0")
    stamp = rig_sh(sandbox, f"cat {weights_ops.stamp_path(rig.model_dir, SUBDIR)}")
    assert len(stamp.splitlines()) == len([line for line in manifest.splitlines() if line.strip()])
    assert rig_sh(sandbox, f"find {shlex.quote(dest)} -name '*.part'").strip() == ""


@pytest.mark.sandbox
def test_chat_template_rule(sandbox: Sandbox, fleet: Fleet, deployed: dict[str, str]) -> None:
    """Mirror's chat-templates/NAME.jinja, else the weights' chat_template.jinja, else fail naming both."""
    path = template_path(fleet)
    rig_sh(sandbox, f"rm -f {path}")
    try:
        outcome = runner.converge(fleet, [RIG], roles=[model_weights])[RIG]
        if mirror_has_template(sandbox, fleet):
            assert outcome.ok, outcome.summary
            assert rig_sh(sandbox, f"test -s {path} && echo ok").strip() == "ok"
        else:
            assert not outcome.ok and "neither" in " ".join(outcome.errors)
            assert rig_sh(sandbox, f"test -e {path} || echo absent").strip() == "absent"
    finally:
        if rig_sh(sandbox, f"test -e {path} || echo absent").strip() == "absent":
            place_operator_template(sandbox, fleet)


@pytest.mark.sandbox
def test_refused_pin_leaves_the_running_release_alone(sandbox: Sandbox, fleet: Fleet,
                                                      deployed: dict[str, str]) -> None:
    """With a release serving, a re-pin whose overlay hash is wrong changes nothing on the rig."""
    from rigfleet.roles.serving import serving

    variant = catalog.variants()[fleet.rig(RIG).variant]
    good = runner.converge(fleet, [RIG], roles=[model_weights, vllm_image, serving])[RIG]
    if not good.ok:
        pytest.skip(f"the serving role does not deploy on the sandbox yet: {good.summary}")
    container = variant.container_name
    before = rig_sh(sandbox, f"docker inspect -f '{{{{.Id}}}} {{{{.State.StartedAt}}}}' {container}").strip()

    pins = pinset(fleet)
    overlay = pins.overlays[0]
    bad_overlay = overlay.model_copy(update={"files": (overlay.files[0].model_copy(update={"sha256": "0" * 64}),
                                                       *overlay.files[1:])})
    bad = pins.model_copy(update={"overlays": (bad_overlay, *pins.overlays[1:])})
    bad_fleet = dataclasses.replace(fleet, pinsets={**fleet.pinsets, pins.name: bad})
    outcome = runner.converge(bad_fleet, [RIG], roles=[model_weights, vllm_image, serving])[RIG]
    assert not outcome.ok and "sha256 mismatch" in " ".join(outcome.errors)
    after = rig_sh(sandbox, f"docker inspect -f '{{{{.Id}}}} {{{{.State.StartedAt}}}}' {container}").strip()
    assert after == before  # same container, never restarted
    assert rig_sh(sandbox, f"docker inspect -f '{{{{.State.Running}}}}' {container}").strip() == "true"
