"""Plan-level tests of the host layer: what the roles would run on each supported distro, per state.

Each test plans preflight, apt_base, nvidia_driver, docker_engine, container_toolkit and gpu_tuning
against a FakeRig (facts only; see fakerig.py) and asserts the exact commands, uploads and Python
callbacks. Full fresh plans are golden files (tests/plan/golden/host-layer, RIGFLEET_UPDATE_GOLDEN=1
rewrites them); every other expectation is written out here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from rigfleet.context import RigContext
from rigfleet.facts.nvidia import NvidiaSmiState
from rigfleet.facts.system import PlatformInfo, SecureBootState
from rigfleet.loader import Fleet
from rigfleet.operations.docker import fleet_copy
from rigfleet.rigstate import SMOKE_STAMP
from rigfleet.schema import DriverPin, PackagePin
from tests.plan import scenarios
from tests.plan.fakerig import DISTROS, PLATFORMS, FakeRig, Plan, context_for, gpus_3090, plan, with_pins

GOLDEN = Path(__file__).resolve().parent / "golden" / "host-layer"
UPDATE = os.environ.get("RIGFLEET_UPDATE_GOLDEN") == "1"
APT_INSTALL = (
    'DEBIAN_FRONTEND=noninteractive apt-get -y -o Dpkg::Options::="--force-confdef" '
    '-o Dpkg::Options::="--force-confold" install --allow-change-held-packages --allow-downgrades'
)
REBOOT = [
    (
        "run",
        "if [ -f /opt/rigfleet/current/compose.yaml ] && command -v docker >/dev/null 2>&1; then "
        "docker compose -f /opt/rigfleet/current/compose.yaml stop; fi",
    ),
    ("call", "forget_askpass"),
    ("call", "record_boot_id"),
    ("run", "( sleep 1 && reboot ) </dev/null >/dev/null 2>&1 &"),
    ("call", "wait_for_new_boot"),
    ("call", "verify_gpus"),
    (
        "run",
        "if [ -f /opt/rigfleet/current/compose.yaml ] && command -v docker >/dev/null 2>&1; then "
        "docker compose -f /opt/rigfleet/current/compose.yaml start; fi",
    ),
]
RESTART_DOCKER = ("run", "systemctl restart docker.service")


def render_plan(result: Plan) -> str:
    lines = []
    for kind, what in result.events:
        lines.append(f"{kind}: {what}")
        if kind == "upload":
            lines += [f"    | {line}" for line in result.uploads[what].splitlines()]
    return "\n".join(lines) + "\n"


def check_golden(name: str, result: Plan) -> None:
    text = render_plan(result)
    golden = GOLDEN / f"{name}.txt"
    if UPDATE:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text, encoding="utf-8")
    assert golden.is_file(), f"missing golden file {golden}; run with RIGFLEET_UPDATE_GOLDEN=1"
    assert text == golden.read_text(encoding="utf-8"), f"the plan differs from {golden}"


def refusal(*problems: str) -> list[tuple[str, str]]:
    quoted = " ".join(
        f"'{line}'" for line in ("rigfleet: refusing to deploy rig-01:", *(f"  - {p}" for p in problems))
    )
    return [("run", f"printf '%s\\n' {quoted} >&2; exit 1")]


# --- fresh -----------------------------------------------------------------------------------


@pytest.mark.parametrize("docker_source", ["docker-ce", "distro"])
@pytest.mark.parametrize("distro", DISTROS)
def test_fresh(distro: str, docker_source: str) -> None:
    result = plan(context_for(distro, docker_source=docker_source), scenarios.fresh(distro))
    assert not result.failed
    check_golden(f"fresh-{distro}-{docker_source}", result)


@pytest.mark.parametrize("distro", DISTROS)
def test_fresh_key_steps(distro: str) -> None:
    """The decisions in the fresh goldens that matter most, spelled out."""
    result = plan(context_for(distro), scenarios.fresh(distro))
    commands = result.commands
    if distro.startswith("ubuntu"):
        abi = PLATFORMS[distro].kernel
        assert (
            f"{APT_INSTALL} linux-modules-nvidia-580-server-open-{abi} "
            "linux-modules-nvidia-580-server-open-generic "
            "nvidia-headless-no-dkms-580-server-open "
            "nvidia-utils-580-server" in commands
        )
        assert (
            "apt-mark hold linux-generic linux-headers-generic linux-image-generic "
            f"linux-modules-nvidia-580-server-open-{abi} linux-modules-nvidia-580-server-open-generic "
            "nvidia-headless-no-dkms-580-server-open nvidia-utils-580-server" in commands
        )
        assert not any("cuda" in c and "sources" in c for c in commands)
    else:
        slug = PLATFORMS[distro].id + PLATFORMS[distro].version_id
        pinning, driver = f"{APT_INSTALL} nvidia-driver-pinning-580", f"{APT_INSTALL} nvidia-open"
        assert commands.index(pinning) < commands.index(driver), "the pinning package goes in first"
        assert (
            "apt-mark hold linux-headers-amd64 linux-image-amd64 nvidia-driver-pinning-580 nvidia-open"
            in commands
        )
        assert result.uploads[f"/etc/apt/sources.list.d/cuda-{slug}-x86_64.sources"].splitlines()[1:] == [
            "Types: deb",
            f"URIs: https://developer.download.nvidia.com/compute/cuda/repos/{slug}/x86_64/",
            "Suites: /",
            "Signed-By: /etc/apt/keyrings/rigfleet-cuda.gpg",
        ]
        headers = next(c for c in commands if "linux-headers-amd64" in c)
        assert commands.index(headers) < commands.index(driver), "DKMS needs the headers before the driver"
    assert result.events[-7:] == [
        ("upload", "/etc/udev/rules.d/71-nvidia-dev-char.rules"),
        ("run", "if command -v udevadm >/dev/null 2>&1; then udevadm control --reload-rules || true; fi"),
        ("run", "nvidia-ctk system create-dev-char-symlinks --create-all"),
        ("upload", "/etc/systemd/system/rigfleet-gpu-tuning.service"),
        ("run", "systemctl daemon-reload"),
        ("run", "systemctl start rigfleet-gpu-tuning.service"),
        ("run", "systemctl enable rigfleet-gpu-tuning.service"),
    ]
    unit = result.uploads["/etc/systemd/system/rigfleet-gpu-tuning.service"]
    assert (
        "ExecStart=/usr/bin/nvidia-smi -i 0 -pl 290" in unit
        and "ExecStart=/usr/bin/nvidia-smi -i 1 -pl 290" in unit
    )


def test_bookworm_compose_v2_comes_from_trixie_only() -> None:
    result = plan(context_for("debian-12", docker_source="distro"), scenarios.fresh("debian-12"))
    assert result.uploads["/etc/apt/preferences.d/rigfleet-compose-from-trixie.pref"].endswith(
        "Package: *\nPin: release n=trixie\nPin-Priority: -1\n\n"
        "Explanation: rigfleet: but Compose v2 from trixie\n"
        "Package: docker-compose\nPin: release n=trixie\nPin-Priority: 990\n"
    )
    assert (
        "Suites: trixie\nComponents: main\n"
        in result.uploads["/etc/apt/sources.list.d/rigfleet-trixie-compose.sources"]
    )
    assert f"{APT_INSTALL} docker.io docker-compose" in result.commands


# --- converged: a second run changes nothing -------------------------------------------------


@pytest.mark.parametrize("docker_source", ["docker-ce", "distro"])
@pytest.mark.parametrize("distro", DISTROS)
def test_converged_is_zero_changes(distro: str, docker_source: str) -> None:
    context = context_for(distro, docker_source=docker_source)
    result = plan(context, scenarios.converged(context, distro))
    assert (result.events, result.failed) == ([], False)


@pytest.mark.parametrize("distro", ["ubuntu-24.04", "debian-13"])
def test_converged_variants_are_zero_changes(distro: str) -> None:
    for fields in (
        {"driver_install": "dkms"},
        {"driver_module": "proprietary"},
        {"smoke_image": "local"},
        {"cdi": True},
    ):
        context = context_for(distro, **fields)
        rig = scenarios.converged(context, distro)
        if fields.get("cdi"):
            rig = rig.with_(cdi_devices=["nvidia.com/gpu=0", "nvidia.com/gpu=1", "nvidia.com/gpu=all"])
            daemon = json.loads(rig.files["/etc/docker/daemon.json"])
            rig.files["/etc/docker/daemon.json"] = json.dumps({**daemon, "features": {"cdi": True}})
        assert plan(context, rig).events == [], fields


# --- driver/library mismatch: one reboot, checked by boot id and nvidia-smi ----------------


@pytest.mark.parametrize("distro", DISTROS)
def test_driver_mismatch_plans_one_reboot(distro: str) -> None:
    context = context_for(distro)
    result = plan(context, scenarios.mismatched(context, distro))
    assert (result.events, result.failed) == (REBOOT, False)


@pytest.mark.parametrize("distro", DISTROS)
def test_reboot_required_or_module_not_loaded(distro: str) -> None:
    context = context_for(distro)
    healthy = scenarios.converged(context, distro, boot_id="after")
    pending = scenarios.converged(context, distro, reboot_required=True, after_reboot=healthy)
    assert plan(context, pending).events == REBOOT
    unloaded = scenarios.converged(
        context, distro, smi=NvidiaSmiState("no_driver", exit_code=9), after_reboot=healthy
    )
    assert plan(context, unloaded).events == REBOOT


# --- Secure Boot with a DKMS module: refused before anything changes -----------------------

SB_ON = SecureBootState("enabled", "mokutil", "SecureBoot enabled")


@pytest.mark.parametrize("distro", ["debian-12", "debian-13"])
def test_secure_boot_dkms_debian_refused(distro: str) -> None:
    result = plan(context_for(distro), scenarios.fresh(distro, secure_boot=SB_ON))
    assert result.failed
    assert result.events == [
        (
            "run",
            (
                "printf '%s\\n' 'rigfleet: refusing to deploy rig-01:' '  - Secure Boot is enabled and "
                "the NVIDIA module would be built by DKMS and not be signed by an enrolled key, so it would "
                "not load; enroll a DKMS signing key (MOK) from the rig'\"'\"'s console, then set "
                "secure_boot_key_enrolled: true; or turn Secure Boot off in the firmware' >&2; exit 1"
            ),
        )
    ]


@pytest.mark.parametrize("distro", ["ubuntu-22.04", "ubuntu-24.04"])
def test_secure_boot_dkms_ubuntu_refused(distro: str) -> None:
    result = plan(context_for(distro, driver_install="dkms"), scenarios.fresh(distro, secure_boot=SB_ON))
    assert result.failed
    assert result.events == [
        (
            "run",
            (
                "printf '%s\\n' 'rigfleet: refusing to deploy rig-01:' '  - Secure Boot is enabled and "
                "the NVIDIA module would be built by DKMS and not be signed by an enrolled key, so it would "
                "not load; use driver_install: prebuilt (Canonical-signed modules), or enroll a DKMS signing "
                "key (MOK) and set secure_boot_key_enrolled: true' >&2; exit 1"
            ),
        )
    ]


@pytest.mark.parametrize("distro", DISTROS)
def test_secure_boot_allowed_with_signed_modules_or_enrolled_key(distro: str) -> None:
    context = context_for(distro, secure_boot_key_enrolled=distro.startswith("debian"))
    result = plan(context, scenarios.converged(context, distro, secure_boot=SB_ON))
    assert (result.events, result.failed) == ([], False)


# --- daemon.json with keys rigfleet does not own: kept --------------------------------------

FOREIGN = {
    "bip": "172.31.0.1/16",
    "registry-mirrors": ["https://mirror.example.internal"],
    "log-driver": "syslog",
    "log-opts": {"tag": "{{.Name}}"},
    "default-ulimits": {"memlock": {"Name": "memlock", "Hard": -1, "Soft": -1}},
}


@pytest.mark.parametrize("distro", DISTROS)
def test_daemon_json_foreign_keys_kept(distro: str) -> None:
    context = context_for(distro, docker_data_root="/data/docker")
    rig = scenarios.converged(context, distro)
    current = {**FOREIGN, "runtimes": scenarios.NVIDIA_RUNTIME}
    rig.files["/etc/docker/daemon.json"] = json.dumps(current, indent=2)
    result = plan(context, rig)
    staged = "/etc/docker/daemon.json.rigfleet-new"
    assert result.events == [
        ("upload", staged),
        (
            "run",
            "if dockerd --help 2>&1 | grep -q -- --validate; then "
            f"dockerd --validate --config-file {staged}; fi "
            "&& if [ -f /etc/docker/daemon.json ]; then cp -p /etc/docker/daemon.json "
            f"/etc/docker/daemon.json.rigfleet-prev; fi && mv -f {staged} /etc/docker/daemon.json",
        ),
        RESTART_DOCKER,
    ]
    assert result.modes[staged] == "0644"
    assert json.loads(result.uploads[staged]) == {
        "bip": "172.31.0.1/16",
        "registry-mirrors": ["https://mirror.example.internal"],
        "default-ulimits": {"memlock": {"Name": "memlock", "Hard": -1, "Soft": -1}},
        "runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}},
        "log-driver": "json-file",
        "log-opts": {"tag": "{{.Name}}", "max-size": "100m", "max-file": "5"},
        "live-restore": True,
        "data-root": "/data/docker",
    }


def test_daemon_json_that_is_not_json_fails_only_this_rig() -> None:
    context = context_for("debian-13")
    rig = scenarios.converged(context, "debian-13")
    rig.files["/etc/docker/daemon.json"] = '{"bip": "172.31.0.1/16",'
    result = plan(context, rig)
    assert result.failed
    assert result.events[0][1].startswith("echo 'rigfleet: /etc/docker/daemon.json is not valid JSON:")
    assert len(result.events) == 1


def test_runtime_missing_from_daemon_json_runs_nvidia_ctk_and_restarts() -> None:
    context = context_for("ubuntu-24.04")
    rig = scenarios.converged(context, "ubuntu-24.04", runtimes=["io.containerd.runc.v2", "runc"])
    daemon = json.loads(rig.files["/etc/docker/daemon.json"])
    del daemon["runtimes"]
    rig.files["/etc/docker/daemon.json"] = json.dumps(daemon, indent=4, sort_keys=True) + "\n"
    assert plan(context, rig).events == [
        ("run", "nvidia-ctk runtime configure --runtime=docker"),
        RESTART_DOCKER,
    ]


# --- unsupported platforms: refused ----------------------------------------------------------


@pytest.mark.parametrize(
    ("platform", "found"),
    [
        (
            PlatformInfo("ubuntu", "20.04", "focal", "Ubuntu 20.04.6 LTS", "x86_64", "5.4.0-200-generic"),
            "Ubuntu 20.04.6 LTS on x86_64",
        ),
        (
            PlatformInfo(
                "debian", "11", "bullseye", "Debian GNU/Linux 11 (bullseye)", "x86_64", "5.10.0-35-amd64"
            ),
            "Debian GNU/Linux 11 (bullseye) on x86_64",
        ),
        (
            PlatformInfo("ubuntu", "24.04", "noble", "Ubuntu 24.04.3 LTS", "aarch64", "6.8.0-90-generic"),
            "Ubuntu 24.04.3 LTS on aarch64",
        ),
        (
            PlatformInfo(
                "rocky", "9.6", "", "Rocky Linux 9.6 (Blue Onyx)", "x86_64", "5.14.0-570.el9.x86_64"
            ),
            "Rocky Linux 9.6 (Blue Onyx) on x86_64",
        ),
    ],
)
def test_unsupported_platform_refused(platform: PlatformInfo, found: str) -> None:
    from tests.plan.fakerig import FakeRig

    result = plan(context_for("debian-13"), FakeRig(platform))
    assert result.failed
    assert result.events == refusal(
        f"{found} is not supported: rigfleet needs Ubuntu 22.04, Ubuntu 24.04, Debian 12 or Debian 13 "
        "on x86_64; "
        "reinstall the rig or take it out of the inventory"
    )


# --- other preflight refusals -----------------------------------------------------------------


def test_gpus_seen_against_expected() -> None:
    context = context_for("ubuntu-24.04")
    one_gpu = NvidiaSmiState("ok", gpus_3090(scenarios.DRIVER)[:1], exit_code=0)
    result = plan(context, scenarios.converged(context, "ubuntu-24.04", smi=one_gpu))
    assert result.events == refusal(
        "nvidia-smi sees 1 GPU(s), the rig expects 2; check the cards' seating and power, "
        "or set gpu_count".replace("'", "'\"'\"'")
    )
    assert result.failed


def test_not_enough_disk() -> None:
    context = context_for("debian-13", min_free_disk_gib=80)
    result = plan(context, scenarios.fresh("debian-13", free_gib=40))
    assert result.events == refusal(
        "/srv/models (filesystem /) has 40 GiB for images and weights, the rig needs 80 GiB; "
        "free space there, or lower min_free_disk_gib"
    )


def test_dkms_without_any_kernel_headers_refused() -> None:

    def no_headers(self: FakeRig, meta: str) -> object:
        from rigfleet.facts.system import HeadersState

        return HeadersState(self.platform.kernel, False, None, None, True)

    rig = scenarios.fresh("debian-12")
    with pytest.MonkeyPatch.context() as patch:
        from rigfleet.facts import system
        from tests.plan import fakerig

        patch.setitem(fakerig.FACTS, system.KernelHeaders, no_headers)
        result = plan(context_for("debian-12"), rig)
    assert result.events == refusal(
        "DKMS needs kernel headers, and neither linux-headers-6.1.0-41-amd64 nor linux-headers-amd64 "
        "is available from the configured apt sources; add the distribution'\"'\"'s sources, or boot a "
        "distribution kernel"
    )


# --- drift and re-pins -------------------------------------------------------------------------


def test_power_limit_drift_reapplies_the_unit() -> None:
    context = context_for("debian-13")
    reset = NvidiaSmiState("ok", gpus_3090(scenarios.DRIVER, persistence=False, limit=350.0), exit_code=0)
    result = plan(context, scenarios.converged(context, "debian-13", smi=reset))
    assert result.events == [("run", "systemctl restart rigfleet-gpu-tuning.service")]


def test_repin_moves_held_packages_to_the_pinned_versions() -> None:
    context = with_pins(
        context_for("debian-12"),
        driver=DriverPin(branch=580, version="580.105.08"),
        toolkit=PackagePin(version="1.18.1"),
        docker=PackagePin(version="28.5.2"),
    )
    result = plan(context, scenarios.converged(context, "debian-12"))
    assert [c for c in result.commands if c.startswith(APT_INSTALL) or c.startswith("apt-mark")] == [
        f"{APT_INSTALL} nvidia-driver-pinning-580.105.08",
        f"{APT_INSTALL} 'nvidia-open=580.105.08-*'",
        "apt-mark hold nvidia-driver-pinning-580.105.08",
        f"{APT_INSTALL} 'docker-ce=5:28.5.2-*' 'docker-ce-cli=5:28.5.2-*' containerd.io docker-buildx-plugin "
        "docker-compose-plugin 'docker-ce-rootless-extras=5:28.5.2-*'",
        f"{APT_INSTALL} 'nvidia-container-toolkit=1.18.1-*' 'nvidia-container-toolkit-base=1.18.1-*' "
        "'libnvidia-container-tools=1.18.1-*' 'libnvidia-container1=1.18.1-*'",
    ]


def test_legacy_source_lists_removed_and_nothing_else() -> None:
    """A vendor's one-line list for the same repository (another Signed-By: apt refuses both) goes."""
    context = context_for("debian-13", docker_source="docker-ce")
    legacy = [
        "/etc/apt/sources.list.d/cuda-debian13-x86_64.list",
        "/etc/apt/sources.list.d/docker.list",
        "/etc/apt/sources.list.d/nvidia-container-toolkit.list",
    ]
    rig = scenarios.converged(context, "debian-13")
    rig = rig.with_(files={**rig.files, **{path: "deb https://example.invalid/ /\n" for path in legacy}})
    assert plan(context, rig).events == [("run", f"rm -f {path}") for path in legacy]


def test_edited_config_file_is_rewritten() -> None:
    context = context_for("debian-13")
    rig = scenarios.converged(context, "debian-13")
    unit = "/etc/systemd/system/rigfleet-gpu-tuning.service"
    result = plan(context, rig.with_(files={**rig.files, unit: rig.files[unit] + "# edited by hand\n"}))
    assert ("upload", unit) in result.events
    assert result.uploads[unit] == rig.files[unit]


# --- the initramfs: rebuilt when it predates the nouveau blacklist, after the driver ----------

NOUVEAU = "/etc/modprobe.d/rigfleet-blacklist-nouveau.conf"


def initramfs_step(result: Plan) -> list[str]:
    return [c for c in result.commands if "update-initramfs -u" in c]


@pytest.mark.parametrize("distro", DISTROS)
def test_initramfs_older_than_the_blacklist_is_rebuilt(distro: str) -> None:
    """A run cut off after the blacklist was written left an initramfs without it: the next run
    rebuilds it though the blacklist itself is unchanged."""
    context = context_for(distro)
    stale = scenarios.converged(context, distro, stale_initramfs="/boot/initrd.img-6.1.0-41-amd64")
    result = plan(context, stale)
    assert len(initramfs_step(result)) == 1 and len(result.events) == 1


@pytest.mark.parametrize("distro", DISTROS)
def test_initramfs_rebuilt_after_the_driver_only_when_still_stale(distro: str) -> None:
    """The step reads the initramfs when its turn comes, after the driver packages (whose own
    trigger may have rebuilt it) and before the driver's reboot: rebuilt when still older than
    the blacklist, left alone when the packages rebuilt it."""
    context = context_for(distro)
    stale = plan(context, scenarios.fresh(distro, stale_initramfs="/boot/initrd.img-6.1.0-41-amd64"))
    commands = stale.commands
    assert initramfs_step(stale) == ["update-initramfs -u"]
    driver = next(i for i, c in enumerate(commands) if "apt-mark hold" in c and "nvidia" in c)
    reboot = next(i for i, c in enumerate(commands) if "compose.yaml stop" in c)
    assert driver < commands.index("update-initramfs -u") < reboot
    assert ("upload", NOUVEAU) in stale.events
    assert initramfs_step(plan(context, scenarios.fresh(distro))) == []


# --- the GPU smoke image through the fleet registry ------------------------------------------

FLEET_REGISTRY = "10.0.0.5:5000"
CUDA = "nvidia/cuda:13.0.2-base-ubuntu22.04"


def smoke_pulls(result: Plan) -> list[str]:
    return [c for c in result.commands if c.startswith("if out=$(docker pull ")]


def smoke_due(context: RigContext, distro: str, **changes: Any) -> FakeRig:
    """Converged but for the smoke test (a driver update, or a fresh rig at that point): it runs again."""
    rig = scenarios.converged(context, distro, **changes)
    return rig.with_(files={p: c for p, c in rig.files.items() if p != SMOKE_STAMP})


def in_fleet(context: RigContext, before: str, **fields: Any) -> RigContext:
    """The same rig in a fleet whose inventory lists the rig `before` first (alike but for its name
    and `fields`)."""
    others = (context.rig.model_copy(update={"name": before, "ssh_hostname": "192.0.2.20", **fields}),)
    fleet = Fleet(context.fleet.inventory_dir, (*others, context.rig), context.fleet.pinsets)
    return RigContext(fleet, context.rig, context.pinset, context.variant)


def test_smoke_image_copy_names() -> None:
    assert fleet_copy(CUDA, FLEET_REGISTRY) == f"{FLEET_REGISTRY}/{CUDA}"
    assert fleet_copy("nvcr.io/nvidia/cuda:13.0.2-base-ubuntu22.04", FLEET_REGISTRY) == f"{FLEET_REGISTRY}/{CUDA}"
    assert fleet_copy("mirror:5000/nvidia/cuda", FLEET_REGISTRY) == f"{FLEET_REGISTRY}/nvidia/cuda"
    assert fleet_copy("localhost/smoke:1", FLEET_REGISTRY) == f"{FLEET_REGISTRY}/smoke:1"
    assert fleet_copy("ubuntu:24.04", FLEET_REGISTRY) == f"{FLEET_REGISTRY}/ubuntu:24.04"
    assert fleet_copy(f"{FLEET_REGISTRY}/nvidia/cuda:13", FLEET_REGISTRY) is None  # it is the copy
    assert fleet_copy(f"{CUDA}@sha256:{'a' * 64}", FLEET_REGISTRY) is None  # a copy could not be checked


@pytest.mark.parametrize("distro", ["ubuntu-24.04", "debian-13"])
def test_smoke_image_through_the_fleet_registry(distro: str) -> None:
    context = context_for(distro, registry=FLEET_REGISTRY, registry_insecure=True)
    assert plan(context, scenarios.converged(context, distro)).events == []  # converged: no pull, no push
    result = plan(context, smoke_due(context, distro))
    pulls = smoke_pulls(result)
    assert pulls, "the smoke image was not fetched through the fleet registry"
    script = pulls[0]
    copy = f"{FLEET_REGISTRY}/{CUDA}"
    # the registry's copy first; only without it the image's own registry, and then a push for the others
    assert script.index(f"docker pull {copy}") < script.index(f"docker pull {CUDA}") < script.index(
        f"docker push {copy}")
    smoke = next(i for i, c in enumerate(result.commands) if "docker run --rm --gpus all" in c)
    assert result.commands.index(script) < smoke
    assert f"docker run --rm --gpus all {CUDA} " in result.commands[smoke]


def test_smoke_image_first_rig_of_the_registry_goes_first() -> None:
    """In one run of several fresh rigs, the first in the inventory pulls the image in an operation
    of its own, which ends before the others' shared one starts; the others do not have it."""
    context = context_for("debian-13", registry=FLEET_REGISTRY, registry_insecure=True)
    first = plan(context, smoke_due(context, "debian-13"))
    other = in_fleet(context, "rig-00")
    second = plan(other, smoke_due(other, "debian-13"))
    assert len(smoke_pulls(first)) == 2 and len(smoke_pulls(second)) == 1
    for fields in ({"registry": "10.0.0.6:5000"}, {"smoke_image": "nvidia/cuda:12.9.1-base-ubuntu22.04"}):
        # rig-00 uses another registry or image: rig-01 is still the first of its own
        alone = in_fleet(context, "rig-00", **fields)
        assert len(smoke_pulls(plan(alone, smoke_due(alone, "debian-13")))) == 2, fields


def test_smoke_image_no_pull_when_on_the_rig_pinned_by_digest_or_without_registry() -> None:
    context = context_for("debian-13", registry=FLEET_REGISTRY, registry_insecure=True)
    present = smoke_due(context, "debian-13", images={CUDA})
    result = plan(context, present)
    assert smoke_pulls(result) == [] and any("docker run --rm --gpus all" in c for c in result.commands)
    pinned = f"{CUDA}@sha256:{'b' * 64}"
    for fields in ({"smoke_image": pinned}, {"registry": None}):
        context = context_for("debian-13", **{"registry": FLEET_REGISTRY, "registry_insecure": True, **fields})
        assert smoke_pulls(plan(context, smoke_due(context, "debian-13"))) == [], fields
