"""Fixtures for the sandbox tier: SIMULATED rigs booted by `rigfleet sandbox up` (root, Linux).

Use the module-scoped `sandbox` fixture. A module asks for more rigs (or a fresh boot) with
module-level constants; the session keeps one sandbox and only re-runs `up` when a module needs
more rigs than are up, asks for a fresh one, or an earlier test took it down:

    SANDBOX_RIGS = 3        # default 1
    SANDBOX_FRESH = True    # default False: reuse the rigs as the previous module left them
    SANDBOX_DISTRO = "bookworm"  # default: env RIGFLEET_SANDBOX_DISTRO or trixie

The rigs are not reset between modules unless SANDBOX_FRESH is set; host_vars/ of the generated
inventory is emptied for every module so faults set by one module do not leak into the next.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from rigfleet_sandbox import manager, procs
from rigfleet_sandbox.aptrepo import packages as aptrepo_packages
from rigfleet_sandbox.invfiles import GATEWAY_GROUP, GATEWAY_MIN_RIGS

DEFAULT_DISTRO = os.environ.get("RIGFLEET_SANDBOX_DISTRO", "trixie")


def sandbox_unavailable() -> str | None:
    if platform.system() != "Linux":
        return "the sandbox needs Linux"
    if os.geteuid() != 0:
        return "the sandbox needs root"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = sandbox_unavailable()
    if reason:
        for item in items:
            if item.get_closest_marker("sandbox"):
                item.add_marker(pytest.mark.skip(reason=reason))


@dataclass
class Sandbox:
    """What a test needs of the running sandbox."""

    info: manager.SandboxInfo
    rigs: list[str]

    @property
    def inventory_dir(self) -> Path:
        return Path(self.info.inventory_dir)

    @property
    def host_vars_dir(self) -> Path:
        return self.inventory_dir / "host_vars"

    def address(self, rig: str) -> str:
        return next(r.address for r in self.info.rigs if r.name == rig)

    def ssh(
        self, rig: str, command: str, *, check: bool = True, timeout: float = 120, user: str = "rigop"
    ) -> subprocess.CompletedProcess[str]:
        """Run `command` on a rig as the operator, the way the deploy connects (strict host keys)."""
        argv = [*manager.ssh_command(self.inventory_dir, self.address(rig), user), command]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=check)


class SandboxSession:
    def __init__(self) -> None:
        self.info: manager.SandboxInfo | None = None

    def ensure(self, rigs: int, distro: str, fresh: bool) -> manager.SandboxInfo:
        current = self.info
        reusable = (
            current is not None
            and not fresh
            and current.distro == distro
            and len(current.rigs) >= rigs
            and all(procs.alive(s.supervisor_pid) for s in manager.status()[:rigs])
        )
        if not reusable:
            self.info = manager.up(rigs=rigs, distro=distro, log=print)
        assert self.info is not None
        return self.info

    def mark_down(self) -> None:
        """A test ran `down` itself; the next module gets a new `up`."""
        self.info = None

    def close(self) -> None:
        if self.info is not None:
            manager.down(log=print)
            self.info = None


@pytest.fixture(scope="session")
def sandbox_session() -> Iterator[SandboxSession]:
    reason = sandbox_unavailable()
    if reason:
        pytest.skip(reason)
    session = SandboxSession()
    try:
        yield session
    finally:
        session.close()


@pytest.fixture(scope="module")
def sandbox(request: pytest.FixtureRequest, sandbox_session: SandboxSession) -> Sandbox:
    rigs = int(getattr(request.module, "SANDBOX_RIGS", 1))
    distro = str(getattr(request.module, "SANDBOX_DISTRO", DEFAULT_DISTRO))
    fresh = bool(getattr(request.module, "SANDBOX_FRESH", False))
    info = sandbox_session.ensure(rigs, distro, fresh)
    handle = Sandbox(info, [r.name for r in info.rigs[:rigs]])
    for stale in handle.host_vars_dir.glob("*"):
        stale.unlink()
    return handle


def module_inventory(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory, *,
                   pinsets: Iterable[str] | None = None, group: dict[str, Any] | None = None,
                   rig_vars: dict[str, dict[str, Any]] | None = None) -> Path:
    """A module's own copy of the sandbox inventory (its edits stay its own), host_vars/ empty but
    for `rig_vars`, group_vars/all.yml updated with `group`, and only `pinsets` when given (the
    sandbox also publishes a deliberately bad pin set for the guard's tests). A module of one rig
    gets no gateway group (as `up --rigs 1` writes it); one of more keeps the gateway on rig-01."""
    copy = tmp_path_factory.mktemp("inventory") / "sandbox"
    shutil.copytree(sandbox.inventory_dir, copy)
    if pinsets is not None:
        published = yaml.safe_load((copy / "pinsets.yml").read_text())
        (copy / "pinsets.yml").write_text(yaml.safe_dump({name: published[name] for name in pinsets}))
    if group:
        path = copy / "group_vars" / "all.yml"
        path.write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()), **group}))
    if len(sandbox.rigs) < GATEWAY_MIN_RIGS:
        # what `up --rigs 1` writes: no gateway, even when this module reuses a bigger sandbox
        hosts = yaml.safe_load((copy / "hosts.yml").read_text())
        hosts["all"]["children"].pop(GATEWAY_GROUP, None)
        (copy / "hosts.yml").write_text(yaml.safe_dump(hosts, sort_keys=False))
    shutil.rmtree(copy / "host_vars", ignore_errors=True)
    (copy / "host_vars").mkdir()
    for rig, values in (rig_vars or {}).items():
        (copy / "host_vars" / f"{rig}.yml").write_text(yaml.safe_dump(values))
    return copy


def group_pinset(sandbox: Sandbox) -> str:
    """The pin set the sandbox's group_vars give every rig."""
    return str(yaml.safe_load((sandbox.inventory_dir / "group_vars" / "all.yml").read_text())["pinset"])


def move_driver_behind_rigfleets_back(sandbox: Sandbox, rig: str, version: str) -> None:
    """What an unattended or manual apt run does: unhold the driver stack and move every installed
    versioned stand-in to `version` (apt does not pick older dependencies by itself)."""
    held = sandbox.ssh(rig, "apt-mark showhold").stdout.split()
    driver_held = sorted(p for p in held if "nvidia" in p and "container" not in p)
    sandbox.ssh(rig, "sudo apt-mark unhold " + " ".join(driver_held), timeout=300)
    installed = set(sandbox.ssh(rig, "dpkg-query -W -f '${Package}\\n'").stdout.split())
    versioned = {p.name for p in aptrepo_packages() if p.repo == "cuda" and "pinning" not in p.name}
    sandbox.ssh(rig, "sudo DEBIAN_FRONTEND=noninteractive apt-get install -y --allow-downgrades "
                + " ".join(f"{p}={version}-1" for p in sorted(installed & versioned)), timeout=300)


def chat_completion(address: str, port: int, api_key: str | None = None, max_tokens: int = 30) -> str:
    """One chat completion from a rig's API, straight from this machine (no proxy)."""
    body = json.dumps({"model": "qwen3.6-27b-autoround", "temperature": 0, "max_tokens": max_tokens,
                       "messages": [{"role": "user", "content": "What is the capital of France?"}]}).encode()
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {api_key}"} if api_key else {})
    request = urllib.request.Request(f"http://{address}:{port}/v1/chat/completions", data=body, headers=headers)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=60) as response:
        return str(json.load(response)["choices"][0]["message"]["content"])
