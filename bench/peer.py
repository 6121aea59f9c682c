"""The peer, side by side: bench/peer/ansible/site.yml against the same converged sandbox rigs.

The playbook's inputs are what rigfleet converged on each rig: the files its roles manage (fetched
from the rig after rigfleet's converge, so both tools want the same bytes), the packages at the
pin set's versions, what is held, the release's files, container, image and weights. ansible-core
is installed from the pin in bench/peer/ansible/requirements.txt into out/peer-venv.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rigfleet import catalog, release, render, rigstate
from rigfleet.context import context_of
from rigfleet.loader import Fleet
from rigfleet.operations import weights as weights_ops
from rigfleet.roles.container_toolkit import TOOLKIT, TOOLKIT_KEYRING, TOOLKIT_SOURCES
from rigfleet.roles.docker_engine import CONFLICTS, DOCKER_KEYRING, docker_ce_specs
from rigfleet.roles.model_weights import weights_spec
from rigfleet.roles.nvidia_driver import ARCHIVE_COMPONENTS, CUDA_KEYRING, NOUVEAU_CONF, pinned
from rigfleet_sandbox.layout import INSTANCE, repo_root

PLAYBOOK_DIR = Path(__file__).parent / "peer" / "ansible"
VENV = repo_root() / "out" / "peer-venv"
WORK = repo_root() / "out" / f"peer-{INSTANCE}"
RECAP = re.compile(r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)
# Files the host layer writes on a Debian rig with the CUDA repository (the sandbox's platform);
# daemon.json, the nouveau blacklist and the tuning unit have their own tasks (handlers).
HOST_FILES = [
    "/etc/apt/apt.conf.d/99rigfleet-lock-timeout",
    "/etc/apt/apt.conf.d/51rigfleet-unattended-blacklist",
    ARCHIVE_COMPONENTS,
    CUDA_KEYRING,
    "/etc/apt/sources.list.d/cuda-{slug}-x86_64.sources",
    TOOLKIT_KEYRING,
    f"{TOOLKIT_SOURCES}.sources",
    "/etc/udev/rules.d/71-nvidia-dev-char.rules",
]
# Docker's repository with docker_source: docker-ce (the default), the trixie Compose source with
# distro Docker on Debian 12: whichever the rig has is managed, the other is absent
DOCKER_FILES = [
    DOCKER_KEYRING,
    "/etc/apt/sources.list.d/docker.sources",
    "/etc/apt/sources.list.d/rigfleet-trixie-compose.sources",
    "/etc/apt/preferences.d/rigfleet-compose-from-trixie.pref",
]
OWN_TASK_FILES = [
    NOUVEAU_CONF,
    "/etc/docker/daemon.json",
    "/etc/systemd/system/rigfleet-gpu-tuning.service",
]


@dataclass
class PeerRun:
    wall: float
    changed: int
    failed: int
    output: str
    task_seconds: dict[str, float]


def ansible_playbook() -> Path:
    """out/peer-venv/bin/ansible-playbook, installed from the pinned requirements when missing."""
    requirements = PLAYBOOK_DIR / "requirements.txt"
    stamp = VENV / ".requirements"
    binary = VENV / "bin" / "ansible-playbook"
    if not binary.exists() or not stamp.exists() or stamp.read_text() != requirements.read_text():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
        subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", "-r", str(requirements)], check=True)
        stamp.write_text(requirements.read_text())
    return binary


def _ssh(fleet: Fleet, rig: str, command: str) -> str:
    from rigfleet_sandbox.manager import ssh_command

    proc = subprocess.run([*ssh_command(fleet.inventory_dir, fleet.rig(rig).ssh_hostname), command],
                          capture_output=True, text=True, timeout=120, check=True)
    return proc.stdout


def _fetch(fleet: Fleet, rig: str, paths: list[str], into: Path) -> list[dict[str, str]]:
    """Copy `paths` from the rig into `into` (same layout); returns [{path, mode}] of those present."""
    script = "; ".join(
        f"if [ -f {q} ]; then echo \"== $(stat -c %a {q}) {p}\"; base64 -w0 {q}; echo; fi"
        for p, q in ((p, shlex.quote(p)) for p in paths)
    )
    out = _ssh(fleet, rig, f"sudo sh -c {shlex.quote(script)}").splitlines()
    found = []
    for header, body in zip(out[::2], out[1::2], strict=False):
        _, mode, path = header.split(" ", 2)
        local = into / path.lstrip("/")
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(base64.b64decode(body))
        found.append({"path": path, "mode": mode.zfill(4)})
    return found


def docker_packages(source: str, version: str | None, platform: dict[str, Any]) -> list[str]:
    """What the Docker role installs: Docker CE at the pin or the distribution's packages."""
    return docker_ce_specs(version) if source == "docker-ce" else list(platform["docker_distro"]["packages"])


def host_vars(fleet: Fleet, name: str) -> dict[str, Any]:
    """The playbook's variables for one rig, from rigfleet's inventory and the converged rig."""
    resolved = release.resolve(fleet, name)
    ctx = context_of(fleet, resolved)
    rig, pinset, variant = ctx.rig, ctx.pinset, ctx.variant
    files = WORK / "files" / name
    known_hosts = fleet.inventory_dir / (rig.ssh_known_hosts_file or "known_hosts")
    os_release = _ssh(fleet, name, "cat /etc/os-release")
    version = re.search(r'^VERSION_ID="?([0-9.]+)', os_release, re.M)
    slug = next(p["cuda_slug"] for p in catalog.platforms()["platforms"].values()
                if version and p["version"] == version.group(1))
    managed = _fetch(fleet, name, [p.format(slug=slug) for p in HOST_FILES] + DOCKER_FILES, files)
    _fetch(fleet, name, OWN_TASK_FILES, files)
    release_id = resolved.release_id()
    release_dir = rigstate.release_dir(release_id)
    listed = _ssh(fleet, name, f"sudo find {shlex.quote(release_dir)} -maxdepth 1 -type f").split()
    release_files = _fetch(fleet, name, sorted(listed), files)
    spec = weights_spec(ctx)
    pin = pinset.driver
    toolkit = pinset.toolkit.version
    packages = [
        *["ca-certificates", "curl", "gpg"],
        "linux-image-amd64",
        f"nvidia-driver-pinning-{pin.version or pin.branch}",
        pinned("nvidia-open" if rig.driver_module == "open" else "cuda-drivers", pin.version),
        *docker_packages(rig.docker_source, pinset.docker.version,
                         catalog.platforms()["platforms"][f"debian-{version.group(1) if version else ''}"]),
        *[f"{p}={toolkit}-*" if toolkit else p for p in TOOLKIT],
    ]
    return {
        "ansible_host": rig.ssh_hostname,
        "ansible_user": rig.ssh_user,
        "ansible_port": rig.ssh_port,
        "ansible_ssh_private_key_file": str(fleet.inventory_dir / (rig.ssh_key or "id_ed25519")),
        "ansible_ssh_common_args": f"-o UserKnownHostsFile={known_hosts} -o StrictHostKeyChecking=yes"
                                   " -o GlobalKnownHostsFile=/dev/null",
        "peer_files": str(files),
        "peer_supported_versions": sorted({str(p["version"]) for p in catalog.platforms()["platforms"].values()}),
        "peer_model_dir": rig.model_dir,
        "peer_gpu_count": rig.gpu_count,
        "peer_managed_files": managed,
        "peer_packages": packages,
        "peer_absent": CONFLICTS if rig.docker_source == "docker-ce" else [],
        "peer_held": _ssh(fleet, name, "apt-mark showhold").split(),
        "peer_services": ["docker.service", "rigfleet-gpu-tuning.service"],
        "peer_weights_dir": f"{rig.model_dir}/{spec['subdir']}",
        "peer_weights_stamp": weights_ops.stamp_path(rig.model_dir, spec["subdir"]),
        "peer_image": render.image_tag(pinset),
        "peer_release_id": release_id,
        "peer_release_files": release_files,
        "peer_container": variant.container_name,
    }


def prepare(fleet: Fleet, names: list[str]) -> Path:
    """Write out/peer-N/inventory.yml for `names` (after rigfleet converged them)."""
    ansible_playbook()
    hosts = {name: host_vars(fleet, name) for name in names}
    inventory = WORK / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {"rigs": {"hosts": hosts}}}}, sort_keys=False))
    return inventory


def run(names: list[str], *extra: str) -> PeerRun:
    env = {**os.environ, "ANSIBLE_CONFIG": str(PLAYBOOK_DIR / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_LOCAL_TEMP": str(WORK / "tmp-local"), "ANSIBLE_SSH_CONTROL_PATH_DIR": str(WORK / "cp"),
           "PEER_TASK_SECONDS": str(WORK / "task-seconds.json")}
    (WORK / "task-seconds.json").unlink(missing_ok=True)
    argv = [str(ansible_playbook()), "-i", str(WORK / "inventory.yml"), "--limit", ",".join(names),
            str(PLAYBOOK_DIR / "site.yml"), *extra]
    started = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900, check=False)
    wall = time.monotonic() - started
    recap = {m.group(1): (int(m.group(3)), int(m.group(4)) + int(m.group(5))) for m in RECAP.finditer(proc.stdout)}
    missing = [n for n in names if n not in recap]
    failed = sum(f for _, f in recap.values()) + len(missing)
    seconds_file = WORK / "task-seconds.json"
    seconds = json.loads(seconds_file.read_text()) if seconds_file.exists() else {}
    return PeerRun(wall, sum(c for c, _ in recap.values()), failed, proc.stdout + proc.stderr, seconds)


def drift_check(fleet: Fleet, name: str, path: str) -> PeerRun:
    """--check --diff after a hand edit of `path` on the rig: the peer must see the drift (changed
    >= 1); the file is put back from the fetched copy afterwards."""
    _ssh(fleet, name, f"echo '# edited by hand' | sudo tee -a {shlex.quote(path)} >/dev/null")
    try:
        result = run([name], "--check", "--diff")
        (WORK / "drift-check.log").write_text(result.output)
        return result
    finally:
        original = (WORK / "files" / name / path.lstrip("/")).read_bytes()
        encoded = base64.b64encode(original).decode()
        _ssh(fleet, name, f"echo {encoded} | base64 -d | sudo tee {shlex.quote(path)} >/dev/null")


def summary(result: PeerRun) -> str:
    return json.dumps({"wall": round(result.wall, 2), "changed": result.changed, "failed": result.failed})
