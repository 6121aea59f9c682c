"""Secrets on a SIMULATED rig: an API key and a (fake) HF token set by reference (environment
variables on the control machine), one full deploy (every role), then every place a secret could
leak is searched for both values: pyinfra's output, every file rigfleet writes on the rig except
the 0600 env file (whose mode is checked), the ledger, the process arguments sampled on the rig all
through the deploy, `docker history` / `docker inspect` of the images, the build directory and
/var/log/rigfleet.

The same converged rig then takes the disk-full fault: the build dir is a full tmpfs when a re-pin
needs a new image -> the deploy fails saying the disk is full and that nothing was stopped, and the
running release keeps serving (same release, same container, answers with the key).

Binding and 401-without-the-key are proven in test_serving.py
(test_variant_change_swaps_and_records_downtime); this module does not repeat them.

Run under the shared sandbox lock: flock /tmp/rigfleet-e2e.lock pytest tests/sandbox/test_security.py
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rigfleet import render
from rigfleet.loader import load_fleet
from rigfleet_sandbox import layout
from tests import REPO_ROOT

from .conftest import Sandbox, chat_completion, group_pinset, module_inventory

RIG = "rig-01"
SANDBOX_RIGS = 1
DEPLOY_TIMEOUT_S = 1800
API_KEY = "sk-rigfleet-sec-" + os.urandom(12).hex()
HF_TOKEN = "hf_rigfleetsec" + os.urandom(12).hex()
SAMPLER = "/run/rigfleet-test-ps.log"
OTHER_PINSET = "sandbox-b"
BUILD_ROOT = "/var/lib/rigfleet/build"

pytestmark = pytest.mark.sandbox


@pytest.fixture(scope="module")
def inventory(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Path:
    # the other pin set: a new image to build in the disk-full test
    return module_inventory(sandbox, tmp_path_factory, pinsets=sorted({group_pinset(sandbox), OTHER_PINSET}),
                          rig_vars={RIG: {"api_key": {"env": "RIGFLEET_SEC_API_KEY"},
                                          "hf_token": {"env": "RIGFLEET_SEC_HF_TOKEN"},
                                          "gate_timeout_s": 120, "variant": "tq3-nomtp"}})


def rig(sandbox: Sandbox, command: str, check: bool = True) -> str:
    return sandbox.ssh(RIG, f"sudo sh -c {shlex.quote(command)}", check=check, timeout=300).stdout


@pytest.fixture(scope="module")
def deployed(sandbox: Sandbox, inventory: Path) -> str:
    """One deploy with both secrets, the rig's process table sampled every 50 ms all through it."""
    rig(sandbox, f"rm -f {SAMPLER} {SAMPLER}.pid; setsid -f sh -c 'echo $$ > {SAMPLER}.pid; "
                 f"while :; do ps -eww -o args >> {SAMPLER}; sleep 0.05; done' </dev/null >/dev/null 2>&1")
    try:
        proc = subprocess.run(
            [str(Path(sys.executable).parent / "pyinfra"), "-y", "-vvv", "inventory.py", "deploy.py"],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=DEPLOY_TIMEOUT_S,
            env={**os.environ, "RIGFLEET_INVENTORY": str(inventory), "RIGFLEET_SEC_API_KEY": API_KEY,
                 "RIGFLEET_SEC_HF_TOKEN": HF_TOKEN})
    finally:
        rig(sandbox, f"kill $(cat {SAMPLER}.pid); true", check=False)
    print(proc.stderr[-4000:])
    assert proc.returncode == 0, "the deploy failed (its log is above)"
    return proc.stdout + proc.stderr


def test_wrong_host_key_is_refused_and_nothing_changes(sandbox: Sandbox, inventory: Path, tmp_path: Path) -> None:
    """Strict host keys through the real deploy: the inventory's known_hosts has another key for
    the rig -> pyinfra refuses to connect, the file is not rewritten, nothing on the rig changes."""
    wrong = copy_inventory(inventory, tmp_path)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    key = (tmp_path / "other.pub").read_text().split()[:2]
    address = sandbox.address(RIG)
    (wrong / "known_hosts").write_text(f"{address} {' '.join(key)}\n")
    before = (wrong / "known_hosts").read_text()
    rig(sandbox, "touch /run/rigfleet-test-marker")
    proc = subprocess.run([str(Path(sys.executable).parent / "pyinfra"), "-y", "inventory.py", "deploy.py"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "RIGFLEET_INVENTORY": str(wrong), "RIGFLEET_SEC_API_KEY": API_KEY,
                               "RIGFLEET_SEC_HF_TOKEN": HF_TOKEN})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert RIG in out and ("host key" in out.lower() or "Host key" in out), out[-3000:]
    assert (wrong / "known_hosts").read_text() == before
    changed = rig(sandbox, "find /etc /opt/rigfleet /var/lib/rigfleet -newer /run/rigfleet-test-marker "
                           "-type f 2>/dev/null; true").split()
    assert changed == []
    assert leaks(out) == []


def copy_inventory(inventory: Path, tmp_path: Path) -> Path:
    target = tmp_path / "inv"
    shutil.copytree(inventory, target)
    return target


def leaks(text: str) -> list[str]:
    return [name for name, value in (("api key", API_KEY), ("hf token", HF_TOKEN)) if value in text]


def test_secrets_not_in_pyinfra_output_even_at_vvv(deployed: str) -> None:
    assert "Serve release" in deployed or "serving" in deployed.lower()  # the output is the deploy's
    assert leaks(deployed) == []


def test_only_the_0600_env_file_holds_them(sandbox: Sandbox, deployed: str) -> None:
    env_files = rig(sandbox, "grep -rlsF -e " + shlex.quote(API_KEY) + " /opt/rigfleet /etc /var/lib/rigfleet "
                             "/var/log/rigfleet /srv /root /home /tmp; true").split()
    token_files = rig(sandbox, "grep -rlsF -e " + shlex.quote(HF_TOKEN) + " /opt/rigfleet /etc /var/lib/rigfleet "
                               "/var/log/rigfleet /srv /root /home /tmp; true").split()
    found = set(env_files) | set(token_files)
    # (not searched: /run and /var/lib/docker, where the container runtime keeps the running
    # container's environment by design; images are checked below)
    assert found, "the env file must hold them (else the search could not find anything)"
    assert all(path.startswith("/opt/rigfleet/releases/") and path.endswith("/rigfleet.env") for path in found), found
    for path in found:
        assert rig(sandbox, f"stat -c %a:%U {shlex.quote(path)}").strip() == "600:root"


def test_not_in_the_ledger_or_process_arguments(sandbox: Sandbox, deployed: str) -> None:
    assert leaks(rig(sandbox, "cat /var/lib/rigfleet/ledger.json")) == []
    samples = rig(sandbox, f"cat {SAMPLER}")
    assert samples.count("\n") > 100, "the sampler ran through the deploy"
    assert leaks(samples) == []
    assert leaks(rig(sandbox, "ps -eww -o args")) == []


def test_not_in_images_build_dir_or_logs(sandbox: Sandbox, deployed: str) -> None:
    images = rig(sandbox, "docker images -q --no-trunc | sort -u").split()
    assert images
    for image in images:
        assert leaks(rig(sandbox, f"docker history --no-trunc {image}")) == [], image
        assert leaks(rig(sandbox, f"docker image inspect {image}")) == [], image
    # the running container gets them through --env-file: its config holds them by design; the image does not
    assert leaks(rig(sandbox, "find /var/lib/rigfleet/build -type f -exec cat {} + 2>/dev/null")) == []
    assert leaks(rig(sandbox, "find /var/log/rigfleet -type f -exec cat {} + 2>/dev/null")) == []


def serving(sandbox: Sandbox) -> tuple[str, str]:
    """(release id, container id) of the one running rigfleet container."""
    out = rig(sandbox, "docker ps --filter label=io.rigfleet.release --format "
                       "'{{.Label \"io.rigfleet.release\"}} {{.ID}}'").split()
    assert len(out) == 2, out
    return out[0], out[1]


def answers(sandbox: Sandbox, release_id: str) -> str:
    port = json.loads(rig(sandbox, f"cat /opt/rigfleet/releases/{release_id}/release.json"))["port"]
    address = sandbox.address(RIG)
    assert address.startswith(f"{layout.NET}.")
    return chat_completion(address, port, API_KEY, max_tokens=20)


def test_disk_full_during_the_image_build_keeps_the_running_release(sandbox: Sandbox, inventory: Path,
                                                                    deployed: str) -> None:
    release, container = serving(sandbox)
    values = yaml.safe_load((inventory / "host_vars" / f"{RIG}.yml").read_text())
    tag = render.image_tag(load_fleet(inventory).pinsets[OTHER_PINSET])
    rig(sandbox, f"docker rmi -f {shlex.quote(tag)} >/dev/null 2>&1; rm -rf {BUILD_ROOT}; mkdir -p {BUILD_ROOT} && "
                 f"mount -t tmpfs -o size=512k rigfleet-test-full {BUILD_ROOT} && "
                 f"{{ dd if=/dev/zero of={BUILD_ROOT}/filler bs=4k 2>/dev/null; true; }}")
    try:
        assert rig(sandbox, f"df --output=avail {BUILD_ROOT} | tail -n 1").strip() == "0"
        (inventory / "host_vars" / f"{RIG}.yml").write_text(yaml.safe_dump({**values, "pinset": OTHER_PINSET}))
        proc = subprocess.run(
            [str(Path(sys.executable).parent / "pyinfra"), "-y", "inventory.py", "deploy.py"],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=DEPLOY_TIMEOUT_S,
            env={**os.environ, "RIGFLEET_INVENTORY": str(inventory), "RIGFLEET_SEC_API_KEY": API_KEY,
                 "RIGFLEET_SEC_HF_TOKEN": HF_TOKEN})
        out = proc.stdout + proc.stderr
        print(out[-3000:])
    finally:
        rig(sandbox, f"umount {BUILD_ROOT}; true", check=False)
        (inventory / "host_vars" / f"{RIG}.yml").write_text(yaml.safe_dump(values))
    assert proc.returncode != 0
    assert "no space left" in out and "nothing was stopped: a running release keeps serving" in out, out[-3000:]
    assert RIG in out
    assert serving(sandbox) == (release, container)
    assert json.loads(rig(sandbox, "cat /var/lib/rigfleet/ledger.json"))["current"]["release_id"] == release
    assert "Paris" in answers(sandbox, release)
