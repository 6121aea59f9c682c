"""Plan tier for the vllm_image and model_weights roles.

Two harnesses:
- `plan()`: the role against a @fake host whose facts are scripted; returns the operations with
  commands, in order, exactly as pyinfra would run them (nothing executes).
- `converge()`: the role run for real through pyinfra's @local connector in a temp dir (weights
  from a file:// or HTTP mirror, the overlay check), with real facts and real `sh` scripts.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.command import FileUploadCommand, StringCommand
from pyinfra.api.connect import connect_all
from pyinfra.api.deploy import add_deploy
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.operations import run_ops
from pyinfra.context import ctx_host, ctx_state

from rigfleet import catalog, render, runner
from rigfleet.context import RigContext
from rigfleet.loader import Fleet
from rigfleet.operations import image as image_ops
from rigfleet.operations import weights as weights_ops
from rigfleet.operations.files import FileWriteCommand
from rigfleet.roles.model_weights import model_weights
from rigfleet.roles.vllm_image import vllm_image
from rigfleet.schema import PinSet, Rig

SHA_GENESIS = "7b9fd3194ee6efa1644973383cd44ee5604a5d85"
DIGEST = "sha256:" + "d" * 64
OVERLAY_SHA = "c" * 64
SUBDIR = "qwen3.6-27b-autoround-int4"
VARIANT = "tq3-mtp-genesis"


def make_ctx(pinset: dict[str, Any] | None = None, **rig: Any) -> RigContext:
    ps = PinSet(**(pinset or pinset_data()))
    fields = {"name": "rig-01", "ssh_hostname": "10.0.0.2", "pinset": ps.name, "variant": VARIANT,
              "model_dir": "/srv/models", "weights_source": {"url": "http://mirror/weights/"}} | rig
    r = Rig(**fields)
    return RigContext(Fleet(Path("/nonexistent"), (r,), {ps.name: ps}), r, ps, catalog.variants()[r.variant])


def pinset_data(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "pin-a",
        "base_image": {"repository": "vllm/vllm-openai", "tag": "nightly-x", "digest": DIGEST,
                       "archive": "http://mirror/images/vllm-openai-nightly-x.tar"},
        "vllm_version": "0.20.2rc1.dev9+g01d4d1ad3",
        "genesis": {"source": "http://mirror/genesis.git", "commit": SHA_GENESIS},
        "overlays": [{"name": "marlin-pad", "pr": 40361, "files": [
            {"source": "http://mirror/overlays/marlin.py", "target": "model_executor/marlin.py",
             "sha256": OVERLAY_SHA},
            {"source": "http://mirror/overlays/MPLinearKernel.py", "target": "model_executor/MPLinearKernel.py",
             "sha256": "e" * 64}]}],
    }
    return data | changes


# --- harness 1: @fake host, scripted facts, commands as planned -----------------------------------


@dataclass
class Step:
    name: str
    commands: list[str]
    stdin: Any = None

    @property
    def text(self) -> str:
        return "\n".join(self.commands)


def _text(command: Any) -> str:
    if isinstance(command, FileWriteCommand):
        return f"upload {command.dest} mode {command.mode}"
    if isinstance(command, StringCommand):
        return command.get_raw_value()
    if isinstance(command, FileUploadCommand):
        return f"upload {command.dest}"
    return repr(command)


def fake_state(*responses: dict[Any, Any]) -> tuple[State, Any]:
    """One @fake rig per responses dict; returns the state and the first rig."""
    hosts = [(f"@fake/rig-{i:02d}", {"fake_responses": r, "fake_delay": 0, "fake_delay_jitter": 0})
             for i, r in enumerate(responses, start=1)]
    inventory = Inventory((hosts, {}))
    state = State(inventory, Config())
    connect_all(state)
    return state, inventory.get_host("@fake/rig-01")


def plan(role: Callable[..., Any], ctx: RigContext, responses: dict[Any, Any]) -> list[Step]:
    """The operations that would run, with their commands (operations that would do nothing left out)."""
    state, host = fake_state(responses)
    add_deploy(state, role, ctx)
    steps = []
    for op_hash in state.get_op_order():
        data = state.get_op_data_for_host(host, op_hash)
        with ctx_state.use(state), ctx_host.use(host):
            commands = [_text(c) for c in data.command_generator()]
        if commands:
            name = next(iter(state.get_op_meta(op_hash).names))
            steps.append(Step(name, commands, data.global_arguments.get("_stdin")))
    return steps


def inspect_json(image_id: str, **labels: str) -> str:
    return json.dumps({"Id": image_id, "RepoTags": [], "RepoDigests": [], "Created": "2026-01-01T00:00:00Z",
                       "Config": {"Labels": labels}})


TOOLS = {re.compile(r"^command -v (curl|git|python3) "): "/usr/bin/tool"}


def image_facts(tag_exists: bool = False, base_present: bool = False) -> dict[Any, Any]:
    tag = render.image_tag(PinSet(**pinset_data()))
    responses: dict[Any, Any] = dict(TOOLS)
    if tag_exists:
        responses[f"docker image inspect --format '{{{{json .}}}}' {tag}"] = inspect_json("sha256:" + "1" * 64)
    if base_present:
        responses["docker image inspect --format '{{json .}}' vllm/vllm-openai:nightly-x"] = inspect_json(DIGEST)
    return responses


def test_image_tag_exists_plans_nothing() -> None:
    assert plan(vllm_image, make_ctx(), image_facts(tag_exists=True)) == []


def test_image_missing_plans_verify_then_build_in_order() -> None:
    ctx = make_ctx()
    tag = render.image_tag(ctx.pinset)
    steps = plan(vllm_image, ctx, image_facts())
    names = [s.name for s in steps]
    assert names == [
        "vllm_image | Overlay marlin-pad: fetch and verify model_executor/marlin.py",
        "vllm_image | Overlay marlin-pad: fetch and verify model_executor/MPLinearKernel.py",
        f"vllm_image | Genesis {SHA_GENESIS[:12]}: fetch and verify",
        "vllm_image | Base image vllm/vllm-openai:nightly-x: get and verify",
        "vllm_image | Dockerfile and entrypoint",
        f"vllm_image | Build {tag}",
    ]
    overlay, _, genesis, base, context, build = steps
    assert "fetch http://mirror/overlays/marlin.py" in overlay.text
    assert f'if [ "$actual" != {OVERLAY_SHA} ]' in overlay.text
    assert "sha256 mismatch: expected" in overlay.text and "nothing was stopped" in overlay.text
    assert f"checkout --quiet --detach {SHA_GENESIS}" in genesis.text
    assert f'[ "$head" = {SHA_GENESIS} ]' in genesis.text
    assert "docker load -i" in base.text and DIGEST in base.text and "refusing to build on it" in base.text
    build_dir = image_ops.build_dir(tag)
    assert f"upload {build_dir}/Dockerfile mode 0644" in context.commands
    assert f"upload {build_dir}/entrypoint.sh mode 0755" in context.commands
    assert f"docker build --pull=false -t {tag}" in build.text
    assert build.text.index("docker build") < build.text.index(f"rm -rf {build_dir}")
    assert image_ops.BUILDS_LEDGER in build.text
    # Genesis apply_all needs the GPU: never at build time
    assert not any("apply_all" in s.text for s in steps)
    # nothing before the overlay checks touches Docker
    assert "docker" not in overlay.text and "docker" not in genesis.text


def test_image_base_already_loaded_is_not_fetched_again() -> None:
    names = [s.name for s in plan(vllm_image, make_ctx(), image_facts(base_present=True))]
    assert not any(n.startswith("vllm_image | Base image") for n in names)


def test_image_registry_pull_first_and_push_after() -> None:
    steps = plan(vllm_image, make_ctx(registry="registry.fleet:5000"), image_facts())
    assert steps[0].name.startswith("vllm_image | Image rigfleet/vllm:")
    assert "docker pull registry.fleet:5000/rigfleet/vllm:" in steps[0].text
    assert "docker push registry.fleet:5000/rigfleet/vllm:" in steps[-1].text


FAKE_DOCKER = """#!/bin/sh
# docker as a rig with this fleet registry sees it: upstream lost the pinned tag (and serves nothing
# of it); the registry holds the pinned digest when $HAS_IT is set
echo "$*" >> "$CALLS"
case "$1 $2" in
  "pull registry.fleet:5000/"*) [ -n "$HAS_IT" ] || { echo "manifest unknown" >&2; exit 1; } ;;
  "pull "*) echo "Error response from daemon: manifest for $2 not found" >&2; exit 1 ;;
  "tag "*) [ -n "$HAS_IT" ] || exit 1; touch "$CALLS.tagged" ;;
  "image inspect") [ -f "$CALLS.tagged" ] || exit 1
    case "$*" in *RepoDigests*) echo "registry.fleet:5000/vllm/vllm-openai@$DIGEST " ;; *) echo sha256:abc ;; esac ;;
esac
"""


@pytest.mark.parametrize("in_registry", [True, False])
def test_a_base_tag_gone_upstream_comes_from_the_fleet_registry_by_digest_or_is_refused(
        tmp_path: Path, in_registry: bool) -> None:
    """The pinned base image's tag vanished upstream; the fleet registry may hold the pinned digest.
    The planned step runs for real in sh with a stand-in `docker` on PATH."""
    data = pinset_data()
    data["base_image"] = {k: v for k, v in data["base_image"].items() if k != "archive"}  # pulled, not loaded
    ctx = make_ctx(data, registry="registry.fleet:5000")
    [base] = [s for s in plan(vllm_image, ctx, image_facts()) if s.name.startswith("vllm_image | Base image")]
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "docker").write_text(FAKE_DOCKER)
    (bindir / "docker").chmod(0o755)
    calls = tmp_path / "calls"
    text = base.text.replace(image_ops.build_log(render.image_tag(ctx.pinset)), str(tmp_path / "build.log"))
    proc = subprocess.run(["sh", "-c", text], capture_output=True, text=True, timeout=60, env={
        "PATH": f"{bindir}:/usr/bin:/bin", "CALLS": str(calls), "DIGEST": DIGEST, "HAS_IT": "1" if in_registry else ""})
    pulls = [line.split()[1] for line in calls.read_text().splitlines() if line.startswith("pull ")]
    assert pulls[0] == f"registry.fleet:5000/vllm/vllm-openai@{DIGEST}", "the fleet registry's copy first"
    assert all(p.endswith(f"@{DIGEST}") for p in pulls), f"never the bare (moving) tag: {pulls}"
    if in_registry:
        assert proc.returncode == 0, proc.stderr
        assert pulls == [f"registry.fleet:5000/vllm/vllm-openai@{DIGEST}"]
        assert f"tag registry.fleet:5000/vllm/vllm-openai@{DIGEST} vllm/vllm-openai:nightly-x" in calls.read_text()
        assert "verified" in proc.stdout
    else:
        assert proc.returncode == 1
        assert pulls[1] == f"vllm/vllm-openai:nightly-x@{DIGEST}"
        assert proc.stderr.strip().splitlines()[-1] == (
            f"rigfleet: base image: vllm/vllm-openai@{DIGEST} is in neither the fleet registry registry.fleet:5000 "
            f"nor upstream (vllm/vllm-openai:nightly-x@{DIGEST}; see {tmp_path / 'build.log'}); the pin is never "
            "replaced by what the tag nightly-x means now: push that digest to registry.fleet:5000/vllm/vllm-openai "
            "or give the pin set an archive")


def test_image_python_deps_become_wheels_from_the_base_image() -> None:
    ctx = make_ctx(pinset_data(python_deps={"xxhash": "3.5.0"}, pip_index_url="https://pypi.example/simple"))
    wheels = next(s for s in plan(vllm_image, ctx, image_facts()) if "wheels" in s.name)
    assert "docker run --rm --entrypoint python3" in wheels.text
    assert "vllm/vllm-openai:nightly-x -m pip download" in wheels.text
    assert "--index-url https://pypi.example/simple" in wheels.text and "xxhash==3.5.0" in wheels.text
    assert "--trusted-host" not in wheels.text


def test_a_plain_http_index_is_trusted_for_the_download() -> None:
    # pip ignores an http:// index without --trusted-host, so the download found "versions: none"
    ctx = make_ctx(pinset_data(python_deps={"xxhash": "3.5.0"}, pip_index_url="http://mirror.lan:8080/simple/"))
    wheels = next(s for s in plan(vllm_image, ctx, image_facts()) if "wheels" in s.name)
    assert "--index-url http://mirror.lan:8080/simple/ --trusted-host mirror.lan" in wheels.text


def test_image_genesis_tarball_verified_by_sha256() -> None:
    genesis = {"source": "http://mirror/genesis-7b9fd319.tar.gz", "commit": SHA_GENESIS, "sha256": "f" * 64}
    steps = plan(vllm_image, make_ctx(pinset_data(genesis=genesis)), image_facts())
    text = next(s for s in steps if "Genesis" in s.name).text
    assert f'[ "$actual" = {"f" * 64} ]' in text and "git get-tar-commit-id" in text


def test_changed_overlay_checksum_fails_the_rig_before_anything_is_built() -> None:
    """The overlay check fails on the rig: pyinfra stops that rig there, so no docker command runs."""
    responses = {re.compile(r"# rigfleet: image .*overlay marlin-pad file model_executor/marlin.py"):
                 {"success": False, "stderr": "rigfleet: overlay marlin-pad ...: sha256 mismatch"}}
    responses |= image_facts()
    state, host = fake_state(responses, image_facts())
    add_deploy(state, vllm_image, make_ctx())
    run_ops(state)
    assert state.failed_hosts == {host}
    ran = host.connector.executed_commands
    assert any("overlay marlin-pad file model_executor/marlin.py" in c for c in ran)
    assert not any(re.search(r"docker (load|build|pull|run)|git clone", c) for c in ran)
    # the other rig (good overlays) carried on and built
    other = state.inventory.get_host("@fake/rig-02")
    assert any("docker build --pull=false -t rigfleet/vllm:" in c for c in other.connector.executed_commands)


def test_roles_build_before_serving_stops_anything() -> None:
    from rigfleet.roles import ROLES

    names = [getattr(r, "__name__", "") for r in ROLES]
    if "serving" in names:
        assert names.index("vllm_image") < names.index("serving")
        assert names.index("model_weights") < names.index("serving")


# --- weights at plan level ------------------------------------------------------------------------

FILES = {"config.json": ("a" * 64, 100), "model-00001-of-00002.safetensors": ("b" * 64, 4096),
         "model-00002-of-00002.safetensors": ("c" * 64, 2048)}


def weights_facts(stamp: dict[str, tuple[str, int, int]], disk: dict[str, tuple[int, int]],
                  template: bool = True) -> dict[Any, Any]:
    state = [f"S {sha} {size} {mtime} {name}" for name, (sha, size, mtime) in stamp.items()]
    state += [f"F {size} {mtime} ./{name}" for name, (size, mtime) in disk.items()]
    responses: dict[Any, Any] = dict(TOOLS)
    responses["stat -c 'F %s %Y %n'"] = state or {"stdout": []}
    responses[f"--max-time 60 http://mirror/weights/{SUBDIR}/SHA256SUMS"] = [
        f"{sha}  {name}" for name, (sha, _) in FILES.items()]
    if template:
        responses[re.compile(r"chat-templates/froggeric\.jinja")] = [
            "user=root group=root mode=-rw-r--r-- atime=1 mtime=1 ctime=1 size=10 '/srv/models/chat-templates/"
            "froggeric.jinja'"]
    return responses


def test_weights_verified_plans_nothing() -> None:
    stamp = {name: (sha, size, 1000) for name, (sha, size) in FILES.items()}
    disk = {name: (size, 1000) for name, (_, size) in FILES.items()}
    assert plan(model_weights, make_ctx(), weights_facts(stamp, disk)) == []


def test_weights_interrupted_first_fetch_is_resumed() -> None:
    """A first fetch was cut: config.json got its final name (not stamped yet), shard 1 is a .part."""
    name1, name2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    disk = {"config.json": (100, 1000), f"{name1}.part": (1234, 1001)}
    steps = plan(model_weights, make_ctx(), weights_facts({}, disk))
    assert steps[0].name == f"model_weights | Weights dir /srv/models/{SUBDIR}"
    weights = next(s for s in steps if s.name.startswith("model_weights | Weights qwen"))
    commands = weights.commands
    assert len(commands) == 5  # rehash config.json, resume 1, fetch 2, keep the manifest, stamp
    assert commands[0].startswith(f"# rigfleet: weights {SUBDIR}/config.json: rehash (not verified yet)")
    assert commands[1].startswith(f"# rigfleet: weights {SUBDIR}/{name1}: resume from 1234 bytes (2/3)")
    assert "-C - --progress-bar" in commands[1]
    assert f"http://mirror/weights/{SUBDIR}/{name1}" in commands[1]
    assert f'if [ "$actual" != {FILES[name1][0]} ]' in commands[1]
    assert commands[1].index("fetch http") < commands[1].index('mv -f "$F.part" "$F"')
    assert commands[2].startswith(f"# rigfleet: weights {SUBDIR}/{name2}: fetch (3/3)")
    assert "verification stamp" in commands[-1]
    assert not any(s.name.startswith("model_weights | Chat template") for s in steps)


def test_weights_changed_since_verified_are_rehashed_never_overwritten() -> None:
    stamp = {name: (sha, size, 1000) for name, (sha, size) in FILES.items()}
    disk = {name: (size, 1000) for name, (_, size) in FILES.items()}
    disk["config.json"] = (100, 2000)  # touched since it was hashed
    steps = plan(model_weights, make_ctx(), weights_facts(stamp, disk))
    weights = next(s for s in steps if s.name.startswith("model_weights | Weights qwen"))
    rehash = weights.commands[0]
    assert rehash.startswith(f"# rigfleet: weights {SUBDIR}/config.json: rehash (changed since it was verified)")
    assert "not overwriting it" in rehash and "curl" not in rehash
    assert len(weights.commands) == 3  # rehash, keep the manifest, stamp


def test_weights_missing_chat_template_is_placed_by_the_explicit_rule() -> None:
    stamp = {name: (sha, size, 1000) for name, (sha, size) in FILES.items()}
    disk = {name: (size, 1000) for name, (_, size) in FILES.items()}
    steps = plan(model_weights, make_ctx(), weights_facts(stamp, disk, template=False))
    template = steps[-1]
    assert template.name == "model_weights | Chat template froggeric"
    text = template.text
    assert text.index("http://mirror/weights/chat-templates/froggeric.jinja") < text.index(
        f"/srv/models/{SUBDIR}/chat_template.jinja")
    assert not any(s.name.startswith("model_weights | Weights qwen") for s in steps)


def test_hub_token_goes_on_stdin_only(monkeypatch: pytest.MonkeyPatch) -> None:
    token = "hf_SECRETsecretSECRET"
    monkeypatch.setenv("RIGFLEET_TEST_HF", token)
    ctx = make_ctx(weights_source={}, hf_token={"env": "RIGFLEET_TEST_HF"})
    steps = plan(model_weights, ctx, weights_facts({}, {}))
    hub = next(s for s in steps if "from the hub" in s.name)
    assert hub.stdin.readlines() == [f"{token}\n"]  # what pyinfra's write_stdin sends at execute time
    assert all(token not in s.text and token not in s.name for s in steps)
    assert "--token-stdin" in hub.text and "Lorbus/Qwen3.6-27B-int4-AutoRound" in hub.text


def test_hub_token_is_not_in_pyinfra_debug_operations_output(monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """`pyinfra ... --debug-operations` and `--json` print every op's global arguments (finding 5:
    the token was in `_stdin`); the printers are pyinfra's own."""
    from pyinfra_cli.prints import print_state_operations, print_state_operations_json

    token = "hf_SECRETsecretSECRET"
    monkeypatch.setenv("RIGFLEET_TEST_HF", token)
    ctx = make_ctx(weights_source={}, hf_token={"env": "RIGFLEET_TEST_HF"})
    state, _ = fake_state(weights_facts({}, {}))
    add_deploy(state, model_weights, ctx)
    print_state_operations(state)
    print_state_operations_json(state)
    out = capsys.readouterr()
    assert "<secret hf_token from env RIGFLEET_TEST_HF>" in out.err + out.out
    assert token not in out.err + out.out


def test_hub_token_missing_fails_that_rig_with_a_clear_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RIGFLEET_TEST_HF", raising=False)
    ctx = make_ctx(weights_source={}, hf_token={"env": "RIGFLEET_TEST_HF"})
    hub = next(s for s in plan(model_weights, ctx, weights_facts({}, {})) if "from the hub" in s.name)
    assert "environment variable RIGFLEET_TEST_HF is not set on the control machine" in hub.text
    assert "hub_fetch.py" not in hub.text


# --- weights through the fleet cache, planned for two rigs in one run ----------------------------

CACHE_URL = "http://10.0.0.2:3142/rigfleet-models/"


def cached_fleet(**other: Any) -> Fleet:
    """rig-01 (10.0.0.2) in the cache group, rig-02 not; both on the mirror, weights not there yet."""
    ps = PinSet(**pinset_data())
    rigs = tuple(Rig(**({"name": name, "ssh_hostname": address, "pinset": ps.name, "variant": VARIANT,
                        "model_dir": "/srv/models", "weights_source": {"url": "http://mirror/weights/"}} | fields))
                 for name, address, fields in (("rig-01", "10.0.0.2", {"groups": ("cache",)}),
                                               ("rig-02", "10.0.0.3", other)))
    return Fleet(Path("/nonexistent"), rigs, {ps.name: ps})


def plan_fleet(fleet: Fleet, cache_holds: bool) -> tuple[State, dict[str, list[Step]], list[str]]:
    """Both rigs in one state, planned as rigfleet.runner plans a fleet: each rig's steps, and the
    order of the operation names pyinfra will run (an operation shared by both rigs appears once)."""
    rig2 = weights_facts({}, {})
    if cache_holds:
        rig2[f"--max-time 60 {CACHE_URL}.rigfleet/{SUBDIR}.SHA256SUMS"] = [
            f"{sha}  {name}" for name, (sha, _) in FILES.items()]
    state, _ = fake_state(weights_facts({}, {}), rig2)

    def both() -> None:
        from pyinfra import host as current

        chosen = fleet.rig(current.name.removeprefix("@fake/"))
        model_weights(RigContext(fleet, chosen, fleet.pinsets[chosen.pinset], catalog.variants()[chosen.variant]))

    runner._prepare_in_parallel(state, both)  # as the fleet commands plan (and `pyinfra deploy.py`)
    steps: dict[str, list[Step]] = {}
    for host in state.inventory:
        steps[host.name.removeprefix("@fake/")] = []
        for op_hash in state.get_op_order():
            if op_hash not in state.ops[host]:
                continue
            data = state.get_op_data_for_host(host, op_hash)
            with ctx_state.use(state), ctx_host.use(host):
                commands = [_text(c) for c in data.command_generator()]
            if commands:
                name = next(iter(state.get_op_meta(op_hash).names))
                steps[host.name.removeprefix("@fake/")].append(Step(name, commands))
    order = [sorted(state.get_op_meta(op_hash).names)[0] for op_hash in state.get_op_order()]
    return state, steps, order


def test_the_other_rig_fetches_the_weights_the_cache_host_holds_from_it_after_its_download() -> None:
    state, steps, order = plan_fleet(cached_fleet(), cache_holds=True)
    mirror = order.index(f"model_weights | Weights {SUBDIR} from http://mirror/weights/")
    through = order.index(f"model_weights | Weights {SUBDIR} through the fleet cache on rig-01")
    # the shared operation waits for the cache host's download: pyinfra runs operations in this order
    assert mirror < through
    assert [s.name for s in steps["rig-01"]][-1].endswith("from http://mirror/weights/")  # the cache host itself
    [fetch] = [s for s in steps["rig-02"] if "through the fleet cache" in s.name]
    assert not any("from http://mirror" in s.name for s in steps["rig-02"])
    assert f"fetch {CACHE_URL}{SUBDIR}/config.json" in fetch.text and "http://mirror" not in fetch.text
    name = "model-00001-of-00002.safetensors"
    assert f'if [ "$actual" != {FILES[name][0]} ]' in fetch.text  # verified against the cache host's manifest
    assert "verification stamp" in fetch.commands[-1]


def test_weights_the_cache_host_does_not_hold_come_from_the_rigs_own_source() -> None:
    _, steps, _ = plan_fleet(cached_fleet(), cache_holds=False)
    [fetch] = [s for s in steps["rig-02"] if "through the fleet cache" in s.name]
    assert fetch.commands[0].startswith(f"# rigfleet: weights {SUBDIR}: not on the fleet cache")
    assert "does not hold them verified" in fetch.commands[0]
    assert f"fetch http://mirror/weights/{SUBDIR}/config.json" in fetch.text and CACHE_URL not in fetch.text


@pytest.mark.parametrize("where", ["cache host", "other rig"])
def test_cache_weights_false_keeps_the_rig_on_its_own_source(where: str) -> None:
    fleet = cached_fleet(**({"cache_weights": False} if where == "other rig" else {}))
    if where == "cache host":
        rigs = (fleet.rigs[0].model_copy(update={"cache_weights": False}), fleet.rigs[1])
        fleet = Fleet(fleet.inventory_dir, rigs, fleet.pinsets)
    _, steps, order = plan_fleet(fleet, cache_holds=True)
    assert not any("through the fleet cache" in s.name for s in steps["rig-02"])
    assert any(s.name.endswith("from http://mirror/weights/") for s in steps["rig-02"])
    if where == "cache host":  # its model directory is not served: nobody looks there
        assert not any("through the fleet cache" in name for name in order)


# --- harness 2: the real thing through @local, in a temp dir --------------------------------------


@pytest.fixture
def local_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Logs and build dirs under tmp_path instead of /var."""
    monkeypatch.setattr(weights_ops, "LOG_DIR", str(tmp_path / "log"))
    monkeypatch.setattr(image_ops, "LOG_DIR", str(tmp_path / "log"))
    monkeypatch.setattr(image_ops, "BUILD_ROOT", str(tmp_path / "build"))
    return tmp_path


def converge(role: Callable[..., Any], ctx: RigContext) -> tuple[State, Any]:
    inventory = Inventory((["@local"], {}))
    state = State(inventory, Config())
    connect_all(state)
    add_deploy(state, role, ctx)
    with contextlib.suppress(PyinfraError):  # "No hosts remaining!" when the only rig failed
        run_ops(state)
    return state, next(iter(inventory))


def changed_ops(state: State, host: Any) -> int:
    return sum(1 for op_hash in state.get_op_order()
               if state.get_op_data_for_host(host, op_hash).operation_meta.did_change())


def write_mirror(root: Path) -> dict[str, bytes]:
    files = {"config.json": b'{"model_type": "qwen3_next"}\n', "chat_template.jinja": b"{{ messages }}\n",
             "model-00001-of-00002.safetensors": bytes(range(256)) * 400,
             "model-00002-of-00002.safetensors": b"\x07" * 50_000}
    weights = root / "weights" / SUBDIR
    weights.mkdir(parents=True)
    for name, data in files.items():
        (weights / name).write_bytes(data)
    (weights / "SHA256SUMS").write_text(
        "".join(f"{hashlib.sha256(d).hexdigest()}  {n}\n" for n, d in sorted(files.items())))
    return files


@pytest.fixture
def http_mirror(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A plain http.server (no Range support, like the sandbox's): resume must fall back."""
    root = tmp_path / "www"
    root.mkdir()
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", root
    server.shutdown()


needs_tools = pytest.mark.skipif(not all(shutil.which(t) for t in ("curl", "sha256sum", "stat")),
                                 reason="needs curl, sha256sum and GNU stat")


@needs_tools
@pytest.mark.parametrize("scheme", ["file", "http"])
def test_weights_converge_for_real_then_noop(local_dirs: Path, http_mirror: tuple[str, Path], scheme: str) -> None:
    base, www = http_mirror
    files = write_mirror(www)
    url = f"{base}/weights/" if scheme == "http" else f"file://{www}/weights/"
    model_dir = local_dirs / "models"
    weights_dir = model_dir / SUBDIR
    weights_dir.mkdir(parents=True)
    # an interrupted earlier download: the first half of shard 1
    shard = "model-00001-of-00002.safetensors"
    (weights_dir / f"{shard}.part").write_bytes(files[shard][: len(files[shard]) // 2])
    ctx = make_ctx(model_dir=str(model_dir), weights_source={"url": url})

    state, host = converge(model_weights, ctx)
    assert not state.failed_hosts
    for name, data in files.items():
        assert (weights_dir / name).read_bytes() == data
    assert not list(weights_dir.glob("*.part"))
    stamp = (model_dir / ".rigfleet" / f"{SUBDIR}.verified").read_text().splitlines()
    assert len(stamp) == len(files)
    # the chat template rule: no chat-templates/ on the mirror, so the model's own template
    assert (model_dir / "chat-templates" / "froggeric.jinja").read_bytes() == files["chat_template.jinja"]
    log = (local_dirs / "log" / f"weights-{SUBDIR}.log").read_text()
    assert f"weights {SUBDIR}/{shard}: resuming from" in log
    if scheme == "http":
        assert "cannot resume" in log  # http.server ignores Range: started over

    state, host = converge(model_weights, ctx)
    assert not state.failed_hosts
    assert len(state.get_op_order()) == 0  # verified: the role adds no operation at all


@needs_tools
def test_weights_from_the_fleet_cache_for_real(local_dirs: Path, http_mirror: tuple[str, Path]) -> None:
    """The cache host's MODEL_DIR over HTTP (http.server standing in for apt-cacher-ng's LocalDirs,
    /rigfleet-models/): the rig takes the files from there, verified against the cache host's
    manifest; its own mirror does not answer, so nothing could have come from it."""
    base, www = http_mirror
    served = www / "rigfleet-models"
    files = write_mirror(www)
    served.mkdir()
    (www / "weights" / SUBDIR).rename(served / SUBDIR)
    (served / ".rigfleet").mkdir()
    (served / SUBDIR / "SHA256SUMS").rename(served / ".rigfleet" / f"{SUBDIR}.SHA256SUMS")
    port = int(base.rsplit(":", 1)[1])
    fleet = cached_fleet(model_dir=str(local_dirs / "models"), weights_source={"url": "http://127.0.0.1:9/weights/"})
    cache_host = fleet.rigs[0].model_copy(update={"ssh_hostname": "127.0.0.1", "cache_port": port})
    fleet = Fleet(fleet.inventory_dir, (cache_host, fleet.rigs[1]), fleet.pinsets)
    rig = fleet.rigs[1]
    ctx = RigContext(fleet, rig, fleet.pinsets[rig.pinset], catalog.variants()[rig.variant])

    state, host = converge(model_weights, ctx)
    assert not state.failed_hosts
    for name, data in files.items():
        assert (local_dirs / "models" / SUBDIR / name).read_bytes() == data
    assert len((local_dirs / "models" / ".rigfleet" / f"{SUBDIR}.verified").read_text().splitlines()) == len(files)
    state, _ = converge(model_weights, ctx)
    assert len(state.get_op_order()) == 0


@needs_tools
def test_weights_corrupt_mirror_file_is_refused_and_never_installed(local_dirs: Path, tmp_path: Path) -> None:
    files = write_mirror(tmp_path / "www")
    shard = tmp_path / "www" / "weights" / SUBDIR / "model-00002-of-00002.safetensors"
    shard.write_bytes(b"\x08" * 50_000)  # not what SHA256SUMS says
    model_dir = tmp_path / "models"
    ctx = make_ctx(model_dir=str(model_dir), weights_source={"url": f"file://{tmp_path}/www/weights/"})
    state, host = converge(model_weights, ctx)
    assert host in state.failed_hosts
    assert not (model_dir / SUBDIR / shard.name).exists()
    assert not (model_dir / SUBDIR / f"{shard.name}.part").exists()
    assert not (model_dir / ".rigfleet" / f"{SUBDIR}.verified").exists()
    log = (local_dirs / "log" / f"weights-{SUBDIR}.log").read_text()
    want = hashlib.sha256(b"\x07" * 50_000).hexdigest()
    assert f"sha256 mismatch: expected {want}, got {hashlib.sha256(shard.read_bytes()).hexdigest()}" in log
    assert (model_dir / SUBDIR / "config.json").read_bytes() == files["config.json"]


@needs_tools
def test_weights_file_changed_on_disk_fails_instead_of_overwriting(local_dirs: Path, tmp_path: Path) -> None:
    write_mirror(tmp_path / "www")
    model_dir = tmp_path / "models"
    ctx = make_ctx(model_dir=str(model_dir), weights_source={"url": f"file://{tmp_path}/www/weights/"})
    state, _ = converge(model_weights, ctx)
    assert not state.failed_hosts
    edited = model_dir / SUBDIR / "config.json"
    edited.write_bytes(b'{"edited": true}\n')
    state, host = converge(model_weights, ctx)
    assert host in state.failed_hosts
    assert edited.read_bytes() == b'{"edited": true}\n'  # kept: the operator decides


@needs_tools
def test_overlay_with_wrong_checksum_is_refused_for_real(local_dirs: Path, tmp_path: Path) -> None:
    overlay = tmp_path / "marlin.py"
    overlay.write_text("# overlay\n")
    actual = hashlib.sha256(overlay.read_bytes()).hexdigest()
    data = pinset_data(overlays=[{"name": "marlin-pad", "files": [
        {"source": f"file://{overlay}", "target": "model_executor/marlin.py", "sha256": OVERLAY_SHA}]}])
    ctx = make_ctx(data)
    tag = render.image_tag(ctx.pinset)
    state, host = converge(vllm_image, ctx)
    assert host in state.failed_hosts
    log = Path(image_ops.build_log(tag)).read_text()
    assert (f"overlay marlin-pad file model_executor/marlin.py: sha256 mismatch: expected {OVERLAY_SHA}, "
            f"got {actual}") in log
    build = Path(image_ops.build_dir(tag))
    assert not (build / "overlays" / "model_executor" / "marlin.py").exists()
    assert not (build / "genesis").exists() and not (build / "Dockerfile").exists()


@needs_tools
def test_genesis_git_checkout_at_the_pinned_sha(local_dirs: Path, tmp_path: Path) -> None:
    """The Genesis step for real against a local repo: detached at the SHA, verified, no .git."""
    if shutil.which("git") is None:
        pytest.skip("needs git")
    repo = tmp_path / "genesis"
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    (repo / "vllm" / "_genesis" / "patches").mkdir(parents=True)
    (repo / "vllm" / "_genesis" / "patches" / "apply_all.py").write_text("# v7\n")
    git = partial(subprocess.run, cwd=repo, env=env, check=True, capture_output=True, text=True)
    git(["git", "init", "-q", "-b", "dev"])
    git(["git", "add", "-A"])
    git(["git", "commit", "-q", "-m", "v7"])
    sha = git(["git", "rev-parse", "HEAD"]).stdout.strip()
    (repo / "vllm" / "_genesis" / "patches" / "apply_all.py").write_text("# later\n")
    git(["git", "commit", "-q", "-am", "later"])  # HEAD moves on: the pin must still get `sha`
    base = {"repository": "vllm/vllm-openai", "tag": "nightly-x", "digest": DIGEST,
            "archive": str(tmp_path / "missing-base.tar")}
    ctx = make_ctx(pinset_data(genesis={"source": str(repo), "commit": sha}, overlays=[], base_image=base))
    tag = render.image_tag(ctx.pinset)
    state, host = converge(vllm_image, ctx)
    # the base image step fails here (no archive): Genesis ran before it and is in place
    assert host in state.failed_hosts
    tree = Path(image_ops.build_dir(tag)) / "genesis"
    assert (tree / "vllm" / "_genesis" / "patches" / "apply_all.py").read_text() == "# v7\n"
    assert not (tree / ".git").exists()
    assert (Path(image_ops.build_dir(tag)) / ".rigfleet-steps" / "genesis").read_text().strip() == sha


# --- the hub helper (runs on the rig) against a fake hub ------------------------------------------


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()  # noqa: S324 - git's object id


@pytest.fixture
def fake_hub() -> Iterator[tuple[str, dict[str, bytes], list[str]]]:
    """The two hub endpoints the helper uses; Range is honoured; every request's auth is recorded."""
    files = {"config.json": b'{"a": 1}\n', "model.safetensors": bytes(range(256)) * 1000}
    lfs = {"model.safetensors"}
    seen_auth: list[str] = []

    class Hub(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 - http.server API
            seen_auth.append(self.headers.get("Authorization", ""))
            if self.path.startswith("/api/models/org/model/tree/main"):
                tree = [{"type": "file", "path": n, "size": len(d), "oid": git_blob_sha1(d),
                         **({"lfs": {"oid": hashlib.sha256(d).hexdigest(), "size": len(d)}} if n in lfs else {})}
                        for n, d in files.items()]
                body, status, extra = json.dumps(tree).encode(), 200, {}
            elif self.path.startswith("/org/model/resolve/main/"):
                data = files[self.path.rsplit("/", 1)[1]]
                start = int(re.match(r"bytes=(\d+)-", self.headers.get("Range", "bytes=0-")).group(1))  # type: ignore[union-attr]
                body, status = data[start:], 206 if start else 200
                extra = {"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"} if start else {}
            else:
                body, status, extra = b"not found", 404, {}
            self.send_response(status)
            for key, value in extra.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", files, seen_auth
    server.shutdown()


def test_hub_helper_fetches_resumes_and_verifies(tmp_path: Path, fake_hub: tuple[str, dict[str, bytes], list[str]]
                                                 ) -> None:
    endpoint, files, seen_auth = fake_hub
    dest, manifest = tmp_path / "w", tmp_path / "state" / "w.SHA256SUMS"
    dest.mkdir()
    (dest / "model.safetensors.part").write_bytes(files["model.safetensors"][:1000])  # an interrupted run
    argv = ["python3", str(weights_ops.HUB_HELPER), "--repo", "org/model", "--revision", "main", "--dest", str(dest),
            "--manifest", str(manifest), "--endpoint", endpoint, "--token-stdin"]
    done = subprocess.run(argv, input="hf_tok\n", capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "model.safetensors: resuming from 1000 bytes" in done.stderr
    assert all(auth == "Bearer hf_tok" for auth in seen_auth) and "hf_tok" not in " ".join(argv)
    for name, data in files.items():
        assert (dest / name).read_bytes() == data
    assert manifest.read_text() == "".join(f"{hashlib.sha256(d).hexdigest()}  {n}\n" for n, d in sorted(files.items()))
    # a changed file is refused, not replaced
    (dest / "config.json").write_bytes(b'{"a": 2}\n')
    again = subprocess.run(argv, input="hf_tok\n", capture_output=True, text=True, timeout=60)
    assert again.returncode == 1 and "not overwriting it" in again.stderr
    assert (dest / "config.json").read_bytes() == b'{"a": 2}\n'


@needs_tools
def test_mirror_file_names_are_data_not_shell(local_dirs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                              ) -> None:
    """A hostile manifest name is fetched under its literal name; nothing in it runs."""
    monkeypatch.chdir(tmp_path)  # where a relative `touch` would land
    files = write_mirror(tmp_path / "www")
    weights = tmp_path / "www" / "weights" / SUBDIR
    evil = 'x$(touch PWNED)`touch PWNED2`"\'.json'
    (weights / evil).write_bytes(b"{}\n")
    sums = "".join(f"{hashlib.sha256(d).hexdigest()}  {n}\n" for n, d in sorted({**files, evil: b"{}\n"}.items()))
    (weights / "SHA256SUMS").write_text(sums)
    model_dir = tmp_path / "models"
    ctx = make_ctx(model_dir=str(model_dir), weights_source={"url": f"file://{tmp_path}/www/weights/"})
    state, _ = converge(model_weights, ctx)
    assert not state.failed_hosts
    assert (model_dir / SUBDIR / evil).read_bytes() == b"{}\n"
    assert not (tmp_path / "PWNED").exists() and not (tmp_path / "PWNED2").exists()


# --- patch-tree kinds: the SNDR v12 build path beside Genesis v7 ----------------------------------

SHA_SNDR = "7aa66f9ac6bc22b8e0d71cff75bf26ebbbd5ae97"
GOLDEN_IMAGE = Path(__file__).resolve().parent / "golden" / "image"


def sndr_ctx() -> RigContext:
    """A golden-fixture rig on an SNDR v12 pin set (the shipped sndr-v12's shape, mirror sources)."""
    data = pinset_data(name="pin-sndr", vllm_version="0.23.1rc1.dev424+g3f5a1e173", overlays=[],
                       genesis={"source": "http://mirror/genesis.git", "commit": SHA_SNDR, "kind": "sndr-v12",
                                "version": "v12.0.0"},
                       python_deps={"xxhash": "3.5.0"})
    return make_ctx(data, variant="tq3-mtp-sndr")


def test_sndr_v12_image_plan_matches_its_golden_file() -> None:
    """The full plan of a v12 rig's image build and the files it ships (RIGFLEET_UPDATE_GOLDEN=1 rewrites)."""
    ctx = sndr_ctx()
    lines = [f"== {s.name}\n" + "".join(f"   {c}\n" for c in s.commands) for s in plan(vllm_image, ctx, image_facts())]
    for name, text in render.image_files(ctx.pinset).items():
        lines.append(f"== file {name}\n" + "".join(f"   | {line}\n" for line in text.splitlines()))
    text = "".join(lines)
    golden = GOLDEN_IMAGE / "sndr-v12.txt"
    if os.environ.get("RIGFLEET_UPDATE_GOLDEN") == "1":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text, encoding="utf-8")
    assert text == golden.read_text(encoding="utf-8"), f"the plan differs from {golden}"


def test_v12_build_refuses_a_base_image_without_the_programs_its_tree_runs(tmp_path: Path) -> None:
    """PN119 runs GNU patch at apply time: the v12 build checks the base image has it (the real
    vllm-openai image does), so a base without it fails the build naming program, tree and
    package, instead of the patch failing at every boot. Run for real with and without `patch`."""
    programs = catalog.patch_tree_kinds()["sndr-v12"]["runtime_programs"]
    assert programs == {"patch": "patch"}
    script = render.image_files(sndr_ctx().pinset)["rigfleet-build.sh"]
    checks = [line for line in script.splitlines() if line.startswith("command -v ")]
    assert len(checks) == 1, checks
    real = shutil.which("patch")
    assert real, "GNU patch on this machine (Debian package patch)"
    bins = {"with": tmp_path / "with", "without": tmp_path / "without"}
    for path in bins.values():
        path.mkdir()
    (bins["with"] / "patch").symlink_to(real)
    runs = {name: subprocess.run([shutil.which("sh") or "/bin/sh", "-c", "set -eu\n" + checks[0] + "\necho built"],
                                 env={"PATH": str(path)}, capture_output=True, text=True)
            for name, path in bins.items()}
    assert runs["with"].returncode == 0 and runs["with"].stdout == "built\n", runs["with"].stderr
    assert runs["without"].returncode == 1 and "built" not in runs["without"].stdout
    assert runs["without"].stderr == ("rigfleet: the base image has no patch program, which the SNDR v12 tree "
                                      "runs at apply time; install package patch in the base image\n")
    # a v7 or a stock pin set checks nothing of the kind
    for pinset in (make_ctx().pinset, PinSet(**pinset_data(genesis=None))):
        assert "command -v" not in render.image_files(pinset)["rigfleet-build.sh"]


def test_each_tree_kind_builds_and_boots_its_own_way() -> None:
    kinds = catalog.patch_tree_kinds()
    v12 = render.image_files(sndr_ctx().pinset)
    v7 = render.image_files(make_ctx().pinset)
    stock = render.image_files(PinSet(**pinset_data(genesis=None)))
    home = kinds["sndr-v12"]["home"]
    # v12: the whole tree kept at its home, pip-installed editable without deps, plugin checked
    assert f'TREE={home}\n' in v12["rigfleet-build.sh"]
    install = 'python3 -m pip install --no-deps --no-index --find-links /tmp/rigfleet/wheels -e "$TREE"'
    assert install in v12["rigfleet-build.sh"]
    assert "vllm.general_plugins genesis_v7 sndr.plugin:register" in v12["rigfleet-build.sh"]
    assert "_genesis" not in v12["rigfleet-build.sh"] and "apply_all" not in v12["entrypoint.sh"]
    assert f"\n  {kinds['sndr-v12']['entry_point']}\n" in v12["entrypoint.sh"]
    assert "vllm.general_plugins genesis_v7 sndr.plugin:register; then" in v12["entrypoint.sh"]
    # v7 (and stock, whose entrypoint refuses a Genesis variant): apply_all, nothing of v12
    for files in (v7, stock):
        assert f"\n  {kinds['genesis-v7']['entry_point']}\n" in files["entrypoint.sh"]
        assert "sndr" not in files["entrypoint.sh"] + files["rigfleet-build.sh"]
    assert 'cp -a /tmp/rigfleet/genesis/vllm/_genesis "$VLLM_DIR/_genesis"' in v7["rigfleet-build.sh"]


def test_tree_fetch_checks_the_declared_kinds_layout() -> None:
    fetch = next(s for s in plan(vllm_image, sndr_ctx(), image_facts()) if "fetch and verify" in s.name)
    assert '[ -d "$G.tmp/sndr" ] || fail' in fetch.text and "(not a SNDR v12 tree)" in fetch.text
    v7 = next(s for s in plan(vllm_image, make_ctx(), image_facts()) if "Genesis" in s.name)
    assert '[ -d "$G.tmp/vllm/_genesis" ] || fail' in v7.text and "(not a Genesis v7 tree)" in v7.text
