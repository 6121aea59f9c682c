"""Host layer end to end on a SIMULATED rig: the real `pyinfra -y --json inventory.py deploy.py`.

A freshly booted sandbox rig (Debian, stand-in NVIDIA packages from the sandbox's signed apt
repositories, real apt/systemd/Docker) is taken to: driver packages installed and held, nvidia-smi
showing two GPUs with persistence on and the configured power limit, Docker running with the
nvidia runtime and a daemon.json that kept a pre-seeded foreign key, a GPU smoke container run;
then a second run changes nothing; then the driver packages are moved behind rigfleet's back, so
nvidia-smi reports a driver/library mismatch, and the next deploy reboots the rig exactly once and
leaves it healthy with a new boot id.

Docker takes the product's default path (docker_source: docker-ce) from the sandbox's SIMULATED
Docker CE repository (Docker's package names, versions and relations around Debian's Docker
binaries, rigfleet_sandbox/dockerrepo.py). test_host_layer_bookworm.py runs the converge on
Debian 12 and test_host_layer_distro.py the distribution's docker.io as a variation: each sets
the module constants below and reuses these tests.

The tests run in file order and build on each other. Run through the slot wrapper:
/work/coord/e2e pytest tests/sandbox/test_host_layer.py
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from rigfleet import catalog
from rigfleet.facts.system import StaleInitramfs
from rigfleet.loader import load_fleet
from rigfleet.roles.docker_engine import DOCKER_CE
from rigfleet_sandbox import aptrepo, dockerrepo
from rigfleet_sandbox.aptrepo import DRIVER_VERSIONS
from rigfleet_sandbox.layout import WWW_DIR, RigSpec
from rigfleet_sandbox.supervisor import read_boots
from tests import REPO_ROOT

from .conftest import Sandbox, group_pinset, module_inventory, move_driver_behind_rigfleets_back

RIG = "rig-01"
SANDBOX_RIGS = 1
SANDBOX_FRESH = True  # a rig nothing was deployed to
DOCKER_SOURCE = "docker-ce"  # the product's default; a variation module sets "distro"
DEPLOY_TIMEOUT_S = 1800
# deploy.py runs every layer; tests/sandbox/host_layer_deploy.py only the host layer
DEPLOY_FILE = os.environ.get("RIGFLEET_E2E_DEPLOY", "deploy.py")
POWER_LIMIT_W = 280
DISTRO_DOCKER_HELD = {"docker.io", "docker-compose"}  # both Debian releases' distro path
FOREIGN = {"max-concurrent-downloads": 4, "labels": ["rigfleet-test=foreign-key"]}
DRIVER_HELD = {"nvidia-driver-pinning-580", "nvidia-open", "nvidia-kernel-open-dkms", "nvidia-driver-cuda"}
TOOLKIT_HELD = {
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
    "libnvidia-container-tools",
    "libnvidia-container1",
}
REBOOT_OP = "NVIDIA driver | Reboot if the driver needs it, then check the GPUs"
SMOKE_OP = "NVIDIA Container Toolkit | GPU smoke container"
REHEARSAL_CONF = "/etc/apt/apt.conf.d/52rigfleet-rehearsal-all-origins"

pytestmark = pytest.mark.sandbox
seen: dict[str, Any] = {}


@pytest.fixture(scope="module")
def docker_source(request: pytest.FixtureRequest) -> str:
    """The running module's Docker path (this module's tests are reused by the variations)."""
    return str(getattr(request.module, "DOCKER_SOURCE", DOCKER_SOURCE))


@pytest.fixture(scope="module")
def inventory(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory, docker_source: str) -> Path:
    return module_inventory(sandbox, tmp_path_factory, pinsets=[group_pinset(sandbox)],
                          group={"docker_source": docker_source},
                          rig_vars={RIG: {"power_limit_w": POWER_LIMIT_W}})


def installed_versions(sandbox: Sandbox) -> dict[str, str]:
    out = run(sandbox, "dpkg-query -W -f '${db:Status-Abbrev} ${Package} ${Version}\\n'").stdout
    # "ii" installed, "hi" installed and held (rigfleet holds what it installs)
    return {f[1]: f[2] for f in (line.split() for line in out.splitlines()) if len(f) == 3 and f[0] in ("ii", "hi")}


def deploy(inventory: Path) -> dict[str, Any]:
    """The operator's converge; pyinfra's JSON results (its log goes to stderr, printed on failure)."""
    env = {**os.environ, "RIGFLEET_INVENTORY": str(inventory)}
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "pyinfra"), "-y", "--json", "inventory.py", DEPLOY_FILE],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=DEPLOY_TIMEOUT_S,
    )
    print(proc.stderr[-8000:])
    assert proc.returncode == 0, "the deploy failed (its log is above)"
    results = dict(json.loads(proc.stdout)["results"])
    assert results["failed_hosts"] == [] and results["totals"]["error"] == 0
    return results


def op(results: dict[str, Any], name: str) -> dict[str, Any]:
    [found] = [o for o in results["operations"] if name in o.get("names", [])]
    return dict(found)


def changed(results: dict[str, Any]) -> list[str]:
    return [" / ".join(o["names"]) for o in results["operations"] if o.get("success")]


def run(sandbox: Sandbox, command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return sandbox.ssh(RIG, command, check=check, timeout=300)


def gpus(sandbox: Sandbox) -> list[list[str]]:
    out = run(
        sandbox,
        "nvidia-smi --query-gpu=index,name,persistence_mode,power.limit,driver_version "
        "--format=csv,noheader,nounits",
    ).stdout
    return [[cell.strip() for cell in line.split(",")] for line in out.splitlines() if line.strip()]


def held(sandbox: Sandbox) -> set[str]:
    return set(run(sandbox, "apt-mark showhold").stdout.split())


def boots() -> int:
    """Boots of the rig so far, as its supervisor recorded them."""
    return sum(1 for record in read_boots(RigSpec.from_name(RIG)) if "started" in record)


def boot_id(sandbox: Sandbox) -> str:
    return run(sandbox, "cat /proc/sys/kernel/random/boot_id").stdout.strip()


def test_fresh_rig_converges(sandbox: Sandbox, inventory: Path, docker_source: str) -> None:
    # an operator's own daemon.json before rigfleet ever ran: its keys must survive
    run(
        sandbox,
        f"sudo mkdir -p /etc/docker && echo {json.dumps(json.dumps(FOREIGN))} | sudo tee "
        "/etc/docker/daemon.json",
    )
    # the serving layer needs the variant's chat template; where the sandbox's weights mirror has
    # none, do what an operator does (the weights role keeps a template that is in place)
    rig = load_fleet(inventory).rig(RIG)
    template = catalog.variants()[rig.variant].chat_template
    if template:
        path = shlex.quote(f"{rig.model_dir}/chat-templates/{template}.jinja")
        run(sandbox, f"sudo mkdir -p $(dirname {path}) && [ -f {path} ] || "
                     f"echo '{{{{ messages }}}}' | sudo tee {path}")
    seen["boots"] = boots()

    results = deploy(inventory)
    assert op(results, SMOKE_OP)["success"] == [RIG], "the GPU smoke container ran"

    docker_held = set(DOCKER_CE) if docker_source == "docker-ce" else DISTRO_DOCKER_HELD
    assert DRIVER_HELD | TOOLKIT_HELD | docker_held <= held(sandbox)
    versions = installed_versions(sandbox)
    if docker_source == "docker-ce":
        suite = sandbox.info.distro
        assert {name: versions.get(name) for name in DOCKER_CE} == {
            name: dockerrepo.version(name, suite) for name in DOCKER_CE
        }, "Docker CE's packages at Docker's version strings"
        assert "docker.io" not in versions and "containerd" not in versions, "nothing of the distro's Docker"
        # Debian's real engine inside the SIMULATED packaging
        assert run(sandbox, "sudo docker version --format '{{.Server.Version}}'").stdout.strip()
        apt_source = run(sandbox, "cat /etc/apt/sources.list.d/docker.sources").stdout
        assert re.search(r"^URIs: \S+/linux/debian/?$", apt_source, re.M), apt_source
        assert f"Suites: {suite}" in apt_source and "Components: stable" in apt_source
    else:
        assert not set(DOCKER_CE) & set(versions), "no Docker CE package on the distro path"
    rows = gpus(sandbox)
    assert [row[:4] for row in rows] == [
        ["0", "NVIDIA GeForce RTX 3090", "Enabled", f"{POWER_LIMIT_W:.2f}"],
        ["1", "NVIDIA GeForce RTX 3090", "Enabled", f"{POWER_LIMIT_W:.2f}"],
    ]
    seen["driver"] = rows[0][4]

    assert run(sandbox, "systemctl is-active docker").stdout.strip() == "active"
    runtimes = json.loads(run(sandbox, "sudo docker info --format '{{json .Runtimes}}'").stdout)
    assert "nvidia" in runtimes
    daemon = json.loads(run(sandbox, "sudo cat /etc/docker/daemon.json").stdout)
    assert {k: daemon[k] for k in FOREIGN} == FOREIGN, "foreign keys kept"
    assert daemon["live-restore"] is True and daemon["log-driver"] == "json-file"
    assert daemon["log-opts"] == {"max-size": "100m", "max-file": "5"}
    assert daemon["runtimes"]["nvidia"]["path"] == "nvidia-container-runtime"
    assert re.match(r"Docker Compose version v?2\.", run(sandbox, "sudo docker compose version").stdout)
    smoke = run(sandbox, "sudo docker run --rm --gpus all rigfleet/smoke:local nvidia-smi -L").stdout
    assert smoke.count("GPU ") == 2 and "NVIDIA GeForce RTX 3090" in smoke
    assert run(sandbox, "cat /var/lib/rigfleet/gpu-smoke").stdout.startswith("image=rigfleet/smoke:local ")
    # the initramfs update-initramfs -u keeps (the real one of the rig's kernel package) holds the
    # nouveau blacklist, whichever step rebuilt it: the driver packages' trigger or rigfleet
    blacklist = "etc/modprobe.d/rigfleet-blacklist-nouveau.conf"
    assert run(sandbox, f"sudo sh -c {shlex.quote(StaleInitramfs().command(since='/' + blacklist))}").stdout == ""
    newest = run(sandbox, "linux-version list | linux-version sort --reverse | head -n 1").stdout.strip()
    assert blacklist in run(sandbox, f"sudo lsinitramfs /boot/initrd.img-{newest}").stdout.split()


def test_second_run_changes_nothing(sandbox: Sandbox, inventory: Path) -> None:
    results = deploy(inventory)
    assert results["totals"]["success"] == 0, f"changed on a converged rig: {changed(results)}"
    assert boots() == seen["boots"], "no reboot on a converged rig"


def test_driver_change_behind_rigfleets_back_reboots_once(sandbox: Sandbox, inventory: Path) -> None:
    # the sandbox repository has two 580 versions; the unpinned pin set installed the newest, so
    # "the other" version is the one an unattended or manual apt run could move the rig to
    other = next(v for v in DRIVER_VERSIONS if v != seen["driver"])
    move_driver_behind_rigfleets_back(sandbox, RIG, other)
    broken = run(sandbox, "nvidia-smi -L", check=False)
    assert broken.returncode != 0 and "Driver/library version mismatch" in broken.stdout + broken.stderr
    before, booted = boot_id(sandbox), boots()

    results = deploy(inventory)
    assert op(results, REBOOT_OP)["success"] == [RIG], "the deploy rebooted the rig"
    assert boots() == booted + 1, "exactly one reboot"
    assert boot_id(sandbox) != before
    rows = gpus(sandbox)
    assert [row[:4] for row in rows] == [
        ["0", "NVIDIA GeForce RTX 3090", "Enabled", f"{POWER_LIMIT_W:.2f}"],
        ["1", "NVIDIA GeForce RTX 3090", "Enabled", f"{POWER_LIMIT_W:.2f}"],
    ]
    assert {row[4] for row in rows} == {other}
    assert held(sandbox) >= DRIVER_HELD, "held again"

    again = deploy(inventory)
    assert again["totals"]["success"] == 0, f"changed after the reboot: {changed(again)}"


def test_kernel_update_rehearsal_kernel_stays_with_its_module(sandbox: Sandbox, inventory: Path) -> None:
    """A newer kernel metapackage (SIMULATED, published in the stand-in repository) offered while the
    driver is held; Debian's unattended-upgrades, really run, with every origin allowed; reboot. The
    kernel rigfleet holds must not have moved, the NVIDIA module must answer, and status says so."""
    meta = aptrepo.KERNEL_META
    installed = run(sandbox, f"dpkg-query -W -f '${{Version}}' {meta}").stdout.strip()
    driver_before = gpus(sandbox)[0][4]
    newer = aptrepo.kernel_meta_package(f"{installed}+sim1")
    aptrepo.republish(WWW_DIR, [newer])
    try:
        sandbox.ssh(RIG, "sudo DEBIAN_FRONTEND=noninteractive apt-get install -y unattended-upgrades", timeout=900)
        # an operator who lets unattended-upgrades take every origin, the (stand-in) NVIDIA one too
        run(sandbox, "echo 'Unattended-Upgrade::Origins-Pattern { \"origin=NVIDIA\"; };' | "
                     f"sudo tee {REHEARSAL_CONF}")
        run(sandbox, "sudo apt-get update")
        policy = run(sandbox, f"apt-cache policy {meta}").stdout
        assert f"Candidate: {newer.version}" in policy, policy
        assert meta in held(sandbox)

        # control: were the kernel not held, this unattended-upgrades would take the newer one
        dry = sandbox.ssh(RIG, f"sudo apt-mark unhold {meta} >/dev/null && sudo unattended-upgrade --dry-run -v; "
                               f"rc=$?; sudo apt-mark hold {meta} >/dev/null; exit $rc", timeout=600)
        assert re.search(rf"Packages that will be upgraded:.*\b{re.escape(meta)}\b", dry.stdout + dry.stderr), (
            dry.stdout + dry.stderr)
        assert meta in held(sandbox)

        real = sandbox.ssh(RIG, "sudo unattended-upgrade -v", timeout=600)
        print(real.stdout[-4000:], real.stderr[-2000:])
        assert run(sandbox, f"dpkg-query -W -f '${{Version}}' {meta}").stdout.strip() == installed, (
            "the held kernel moved")

        before = boot_id(sandbox)
        sandbox.ssh(RIG, "sudo -n systemctl reboot", check=False, timeout=30)
        wait_for_new_boot(sandbox, before)
        assert [row[4] for row in gpus(sandbox)] == [driver_before, driver_before], "the module answers"

        proc = subprocess.run([str(Path(sys.executable).parent / "rigfleet"), "status", "--json"], cwd="/",
                              env={**os.environ, "RIGFLEET_INVENTORY": str(inventory)},
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        [row] = [r for r in json.loads(proc.stdout) if r["rig"] == RIG]
        print(row["kernel_policy"])
        assert f"{meta} held at {installed} (not moved); {newer.version} waits for a rigfleet converge" in (
            row["kernel_policy"])
        assert "NVIDIA module answers on running kernel" in row["kernel_policy"]
        assert (row["kernel"]["state"], row["kernel"]["waiting"], row["kernel"]["module"]) == (
            "waiting", newer.version, True)
        assert not any(d.startswith("kernel:") for d in row["drift"])
    finally:
        aptrepo.republish(WWW_DIR, [], drop=(newer.filename,))
        run(sandbox, f"sudo rm -f {REHEARSAL_CONF} && sudo apt-get update", check=False)


def wait_for_new_boot(sandbox: Sandbox, old: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc = sandbox.ssh(RIG, "cat /proc/sys/kernel/random/boot_id", check=False, timeout=15)
        if proc.returncode == 0 and proc.stdout.strip() not in ("", old):
            sandbox.ssh(RIG, "systemctl is-system-running --wait", check=False, timeout=120)
            return
        time.sleep(1)
    raise AssertionError(f"{RIG} did not come back within {timeout:.0f}s")
