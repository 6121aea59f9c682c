"""A rig that exists only as facts, and a runner that plans the host-layer roles against it.

The roles run under pyinfra's API on an `@fake` host (no SSH, nothing executed); the host's
`get_fact` is answered from a FakeRig, and every command, upload and Python callback the
operations yield is recorded in order. Facts stay as given for the whole run, so the result is
what the deploy would do to a rig in that state.
"""

from __future__ import annotations

import hashlib
import inspect
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from io import StringIO
from pathlib import Path
from typing import Any
from unittest.mock import patch

from pyinfra.api import Config, FunctionCommand, Inventory, State
from pyinfra.api.connect import connect_all
from pyinfra.api.deploy import add_deploy
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.operations import run_ops
from pyinfra.facts import apt as pyinfra_apt
from pyinfra.facts import deb, files, server, systemd

from rigfleet import catalog
from rigfleet.context import RigContext
from rigfleet.facts import apt as rf_apt
from rigfleet.facts import cache as rf_cache
from rigfleet.facts import docker as rf_docker
from rigfleet.facts import files as rf_files
from rigfleet.facts import firewall as rf_firewall
from rigfleet.facts import nvidia as rf_nvidia
from rigfleet.facts import system as rf_system
from rigfleet.facts.apt import RepositoryFiles, SourceEntry
from rigfleet.facts.docker import DaemonConfig
from rigfleet.facts.files import FileDigest
from rigfleet.facts.nvidia import Gpu, NvidiaSmiState, Topology
from rigfleet.facts.system import DiskUsage, HeadersState, PlatformInfo, SecureBootState
from rigfleet.loader import Fleet
from rigfleet.operations.files import FileWriteCommand
from rigfleet.schema import ImageRef, PinSet, Rig

PLATFORMS = {
    "ubuntu-22.04": PlatformInfo(
        "ubuntu", "22.04", "jammy", "Ubuntu 22.04.5 LTS", "x86_64", "5.15.0-131-generic"
    ),
    "ubuntu-24.04": PlatformInfo(
        "ubuntu", "24.04", "noble", "Ubuntu 24.04.3 LTS", "x86_64", "6.8.0-90-generic"
    ),
    "debian-12": PlatformInfo(
        "debian", "12", "bookworm", "Debian GNU/Linux 12 (bookworm)", "x86_64", "6.1.0-41-amd64"
    ),
    "debian-13": PlatformInfo(
        "debian", "13", "trixie", "Debian GNU/Linux 13 (trixie)", "x86_64", "6.12.57+deb13-amd64"
    ),
}
DISTROS = tuple(PLATFORMS)
GIB_KIB = 1024 * 1024
SECURITY_MIRROR = "http://deb.example.org/debian-security"
RTX_3090 = "NVIDIA GeForce RTX 3090"


def gpus_3090(driver: str, persistence: bool = True, limit: float = 290.0) -> tuple[Gpu, ...]:
    return tuple(
        Gpu(
            index=i,
            name=RTX_3090,
            uuid=f"GPU-3090000{i}-0000-0000-0000-00000000000{i}",
            pci_bus_id=f"00000000:0{i + 1}:00.0",
            memory_total_mib=24576,
            driver_version=driver,
            persistence_mode=persistence,
            power_limit_w=limit,
            power_min_w=100.0,
            power_max_w=350.0,
            power_default_w=350.0,
            compute_cap="8.6",
        )
        for i in range(2)
    )


@dataclass
class FakeRig:
    """The state of a rig as its facts would report it."""

    platform: PlatformInfo
    secure_boot: SecureBootState = SecureBootState("disabled", "mokutil", "SecureBoot disabled")
    headers_installed: bool = True
    headers_candidate: str | None = "1"
    free_gib: int = 500
    smi: NvidiaSmiState = NvidiaSmiState("absent", message="nvidia-smi is not installed")
    boot_id: str = "11111111-2222-3333-4444-555555555555"
    reboot_required: bool = False
    stale_initramfs: str | None = None  # the initramfs update-initramfs -u would rebuild, if stale
    packages: dict[str, list[str]] = field(default_factory=dict)
    held: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    modes: dict[str, str] = field(default_factory=dict)  # path -> octal mode (default 644)
    allowlist_live: bool = False  # the API allowlist's chain and jump are in the kernel
    dirs: set[str] = field(
        default_factory=lambda: {
            "/etc/apt/apt.conf.d",
            "/etc/apt/sources.list.d",
            "/etc/apt/preferences.d",
            "/etc/modprobe.d",
            "/etc/systemd/system",
            "/etc/udev/rules.d",
        }
    )
    keyrings: dict[str, list[str]] = field(default_factory=dict)
    services: dict[str, tuple[bool, bool]] = field(default_factory=dict)  # unit -> (running, enabled)
    runtimes: list[str] | None = None
    images: set[str] = field(default_factory=set)
    cdi_devices: list[str] = field(default_factory=list)
    debian_mirror: str = "http://deb.example.org/debian"
    sources: list[SourceEntry] | None = None  # the rig's apt sources; None: the installer's default
    topology: Topology = Topology()
    nvlink_status: dict[int, int] = field(default_factory=dict)
    # the rig as it comes back from a reboot (a reboot is the one change a plan cannot infer)
    after_reboot: FakeRig | None = None

    def with_(self, **changes: Any) -> FakeRig:
        return replace(self, **changes)

    # --- facts -----------------------------------------------------------------------------
    def fact(self, cls: type, *args: Any, **kwargs: Any) -> Any:
        kwargs = {k: v for k, v in kwargs.items() if not k.startswith("_")}
        if args:
            kwargs = inspect.getcallargs(cls().command, *args, **kwargs)
            kwargs.pop("self", None)
        handler = FACTS.get(cls)
        if handler is None:
            raise KeyError(f"FakeRig has no answer for fact {cls.__module__}.{cls.__name__}({kwargs})")
        return handler(self, **kwargs)

    def _file(self, path: str) -> dict[str, Any] | None:
        if path not in self.files:
            return None
        return {"user": "root", "group": "root", "mode": 644, "size": len(self.files[path])}

    def _directory(self, path: str) -> dict[str, Any] | None:
        if path in self.dirs or any(p.startswith(path.rstrip("/") + "/") for p in self.files):
            return {"user": "root", "group": "root", "mode": 755}
        return None

    def _sha1(self, path: str) -> str | None:
        content = self.files.get(path)
        return hashlib.sha1(content.encode()).hexdigest() if content is not None else None  # noqa: S324

    def _digest(self, path: str) -> FileDigest | None:
        content = self.files.get(path)
        if content is None:
            return None
        return FileDigest(self.modes.get(path, "644"), hashlib.sha256(content.encode()).hexdigest())

    def _repository(self, keyring: str, source: str, legacy: list[str]) -> RepositoryFiles:
        return RepositoryFiles(self.keyrings.get(keyring), self._digest(source),
                               [path for path in legacy if path in self.files])

    def _daemon_json(self, path: str) -> DaemonConfig:
        text = self.files.get(path)
        if text is None:
            return DaemonConfig(False)
        return rf_docker.parse_daemon_json(["present", *text.splitlines()])

    def _disk(self, paths: list[str], measured: list[str] | None = None) -> dict[str, DiskUsage]:
        return {path: DiskUsage(path, "/", self.free_gib * GIB_KIB, 0) for path in paths}

    def _headers(self, meta: str) -> HeadersState:
        return HeadersState(self.platform.kernel, self.headers_installed, self.headers_candidate, "1", True)

    def _systemd(self, services: list[str] | None = None, enabled: bool = False, **_: Any) -> dict[str, bool]:
        return {
            unit: state[1 if enabled else 0]
            for unit, state in self.services.items()
            if not services or unit in services
        }

    def _source_entries(self, exclude: str) -> list[SourceEntry]:
        if self.sources is not None:
            return list(self.sources)
        # the Debian installer's default: main and non-free-firmware, no contrib
        codename, keyring = self.platform.codename, "/usr/share/keyrings/debian-archive-keyring.gpg"
        components = ("main", "non-free-firmware")
        return [
            SourceEntry(self.debian_mirror, codename, components, keyring),
            SourceEntry(self.debian_mirror, f"{codename}-updates", components, keyring),
            SourceEntry(SECURITY_MIRROR, f"{codename}-security", components, keyring),
        ]

    def _batch(self, reads: tuple[rf_cache.Read, ...]) -> list[Any]:
        """Each fact of a batched read as its own read answers it (one the rig has no answer for is
        left to its own read, which then says so)."""
        answers = []
        for one in reads:
            try:
                answers.append(self.fact(one.cls, **one.kwargs))
            except KeyError:
                answers.append(rf_cache.MISSING)
        return answers

    def _apt_sources(self) -> list[Any]:
        return [pyinfra_apt.AptRepo("deb", self.debian_mirror, self.platform.codename, ["main"], {})]


FACTS: dict[type, Callable[..., Any]] = {
    rf_system.Platform: lambda r: r.platform,
    rf_system.SecureBoot: lambda r: r.secure_boot,
    rf_system.KernelHeaders: FakeRig._headers,
    rf_system.DiskSpace: FakeRig._disk,
    rf_system.BootId: lambda r: r.boot_id,
    server.RebootRequired: lambda r: r.reboot_required,
    rf_system.StaleInitramfs: lambda r, since: r.stale_initramfs,
    server.TmpDir: lambda r: "/tmp",
    rf_nvidia.NvidiaSmi: lambda r: r.smi,
    rf_nvidia.CdiDevices: lambda r: list(r.cdi_devices),
    rf_apt.HeldPackages: lambda r: sorted(r.held),
    rf_apt.KeyringFingerprints: lambda r, path: r.keyrings.get(path),
    rf_apt.AptRepositoryFiles: FakeRig._repository,
    rf_apt.AptSourceEntries: FakeRig._source_entries,
    rf_nvidia.NvidiaTopology: lambda r: r.topology,
    rf_nvidia.NvlinkStatus: lambda r: dict(r.nvlink_status),
    rf_files.ManagedFile: FakeRig._digest,
    rf_files.ManagedFiles: lambda r, paths: {p: d for p in paths if (d := r._digest(p)) is not None},
    rf_firewall.ApiAllowlist: lambda r, script, unit: rf_firewall.AllowlistState(
        script in r.files or unit in r.files, r.allowlist_live),
    rf_apt.DpkgInterrupted: lambda r: [],
    rf_docker.DockerDaemonConfig: lambda r, path=rf_docker.DAEMON_JSON: r._daemon_json(path),
    rf_docker.DockerRuntimes: lambda r: r.runtimes,
    rf_docker.DockerImagePresent: lambda r, image: image in r.images,
    deb.DebPackages: lambda r: {name: list(v) for name, v in r.packages.items()},
    pyinfra_apt.AptSources: FakeRig._apt_sources,
    files.File: lambda r, path: r._file(path),
    files.Directory: lambda r, path: r._directory(path),
    files.Link: lambda r, path: None,
    files.Sha1File: lambda r, path: r._sha1(path),
    files.FileContents: lambda r, path: r.files[path].splitlines() if path in r.files else None,
    systemd.SystemdStatus: lambda r, **kw: r._systemd(**kw),
    systemd.SystemdEnabled: lambda r, **kw: r._systemd(enabled=True, **kw),
    rf_cache.Batch: FakeRig._batch,
}


@dataclass
class Plan:
    """What the deploy would do, in order: ("run", cmd), ("upload", dest), ("call", function).
    A file written by one command (rigfleet.operations.files.FileWriteCommand) is an upload too,
    its mode in `modes`."""

    events: list[tuple[str, str]]
    uploads: dict[str, str]
    failed: bool
    modes: dict[str, str] = field(default_factory=dict)

    @property
    def commands(self) -> list[str]:
        return [what for kind, what in self.events if kind == "run"]

    @property
    def changes(self) -> list[tuple[str, str]]:
        return self.events


def context_for(platform: str = "debian-13", **rig_fields: Any) -> RigContext:
    fields: dict[str, Any] = {
        "name": "rig-01",
        "ssh_hostname": "192.0.2.10",
        "pinset": "test",
        "variant": "int8",
        "model_dir": "/srv/models",
        "power_limit_w": 290,
    }
    fields.update(rig_fields)
    rig = Rig(**fields)
    pinset = PinSet(
        name="test", base_image=ImageRef(repository="vllm/vllm-openai", tag="v0.21.0"), vllm_version="0.21.0"
    )
    fleet = Fleet(Path("/nonexistent"), (rig,), {"test": pinset})
    return RigContext(fleet, rig, pinset, catalog.variants()[rig.variant])


def with_pins(context: RigContext, **pins: Any) -> RigContext:
    """The same rig under a pin set with driver/toolkit/docker versions."""
    pinset = context.pinset.model_copy(update=pins)
    return RigContext(context.fleet, context.rig, pinset, context.variant)


def plan(context: RigContext, rig: FakeRig, roles: Sequence[Callable[..., Any]] | None = None,
         check_for_changes: bool = True) -> Plan:
    """Run the roles against `rig` on a fake host and record what they would do (`check_for_changes`:
    pyinfra's change preview, on as in `pyinfra deploy.py`, off as in the fleet commands and `-y`)."""
    from rigfleet.roles import HOST_LAYER, run_roles

    events: list[tuple[str, str]] = []
    uploads: dict[str, str] = {}
    modes: dict[str, str] = {}
    inventory = Inventory(
        (
            [f"@fake/{context.rig.name}"],
            {
                "fake_delay": 0,
                "fake_delay_jitter": 0,
                # refusals and other deliberate stops are commands that fail on a real rig
                "fake_responses": {
                    re.compile(r"^(echo|printf) .*>&2; exit 1$"): {"success": False, "stderr": "stopped"}
                },
            },
        )
    )
    state = State(inventory, Config(FAIL_PERCENT=100), check_for_changes=check_for_changes)
    connect_all(state)
    host = next(iter(inventory))
    host.get_fact = rig.fact  # type: ignore[method-assign,assignment]
    connector = host.connector
    original_run = connector.run_shell_command

    def run_shell_command(command: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(command, FileWriteCommand):
            events.append(("upload", command.dest))
            uploads[command.dest], modes[command.dest] = command.content, command.mode
            return original_run(command, *args, **kwargs)
        text = command if isinstance(command, str) else command.get_raw_value()
        events.append(("run", text))
        return original_run(command, *args, **kwargs)

    def put_file(src: Any, dest: str, *args: Any, **kwargs: Any) -> bool:
        if isinstance(src, StringIO):
            content = src.getvalue()
        elif hasattr(src, "read"):
            src.seek(0)
            data = src.read()
            content = data.decode() if isinstance(data, bytes) else data
        else:
            content = Path(src).read_text()
        events.append(("upload", dest))
        uploads[dest] = content
        return True

    def call(self: FunctionCommand, state: Any, host: Any, connector_arguments: Any) -> None:
        events.append(("call", self.function.__name__))
        if self.function.__name__ == "wait_for_new_boot" and rig.after_reboot is not None:
            host.get_fact = rig.after_reboot.fact

    connector.run_shell_command = run_shell_command  # type: ignore[method-assign,assignment]
    connector.put_file = put_file  # type: ignore[method-assign,assignment]
    failed = False
    with patch.object(FunctionCommand, "execute", call):
        add_deploy(state, run_roles, context, HOST_LAYER if roles is None else roles)  # the deploy's role loop
        try:
            run_ops(state)
        except PyinfraError:
            failed = True
    failed = failed or bool(state.failed_hosts)
    return Plan(events, uploads, failed, modes)
