"""GPU tuning: persistence mode and the power cap (clamped to the card's range) applied by a oneshot
unit at every boot, and the udev rule that keeps /dev/char symlinks for the NVIDIA device nodes so
a `systemctl daemon-reload` does not take the GPUs away from running containers."""

from __future__ import annotations

from pyinfra.api import deploy
from pyinfra.operations import server, systemd

from rigfleet import render
from rigfleet.context import RigContext
from rigfleet.facts import cache
from rigfleet.facts.nvidia import NvidiaSmi
from rigfleet.operations import files as files_ops
from rigfleet.operations import systemd as systemd_ops
from rigfleet.operations.ordering import role_scope
from rigfleet.roles.preflight import target
from rigfleet.schema import Rig

UDEV_RULE = "/etc/udev/rules.d/71-nvidia-dev-char.rules"
UNIT = "rigfleet-gpu-tuning.service"


def drifted(rig: Rig) -> bool:
    """Whether the GPUs run without persistence mode or at another power limit than the unit sets."""
    smi = cache.fact(NvidiaSmi)
    if not smi.ok:
        return False
    limit = render.clamped_power_limit(rig)
    return any(
        gpu.persistence_mode is False
        or (limit is not None and gpu.power_limit_w is not None and abs(gpu.power_limit_w - limit) > 0.5)
        for gpu in smi.gpus
    )


@deploy("GPU tuning")
def gpu_tuning(context: RigContext) -> None:
    with role_scope(6):
        if target(context) is None:
            return  # preflight refuses this rig
        rig = context.rig
        rendered = render.host_files(rig)
        rule = files_ops.config_file(
            name="udev rule: /dev/char symlinks for NVIDIA devices",
            dest=UDEV_RULE,
            content=rendered["udev/71-nvidia-dev-char.rules"],
        )
        server.shell(
            name="Create the /dev/char symlinks now (the rule acts from the next driver load)",
            commands=[
                # best effort: udevd may not run (containers); the rule is read at boot regardless
                "if command -v udevadm >/dev/null 2>&1; then udevadm control --reload-rules || true; fi",
                "nvidia-ctk system create-dev-char-symlinks --create-all",
            ],
            _if=rule.did_change,
        )
        unit = files_ops.config_file(
            name="Power cap and persistence unit",
            dest=f"/etc/systemd/system/{UNIT}",
            content=rendered[f"systemd/{UNIT}"],
        )
        systemd.daemon_reload(name="Reload systemd for the unit", _if=unit.did_change)
        systemd_ops.service(name="Enable and start the tuning unit", service=UNIT, running=True, enabled=True)
        # a oneshot that already ran applies new values only when restarted
        systemd_ops.service(
            name="Re-apply persistence mode and the power cap",
            service=UNIT,
            running=True,
            restarted=True,
            _if=lambda: drifted(rig),
        )
