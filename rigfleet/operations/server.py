"""Server operations: refusing a rig, the initramfs, and a reboot for the driver that checks the
boot id."""

from __future__ import annotations

import shlex
import time
from typing import Any

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, StringCommand
from pyinfra.connectors.util import clear_askpass_cache, remove_any_sudo_askpass_file

from rigfleet import riglock
from rigfleet.facts import cache
from rigfleet.facts.nvidia import NvidiaSmi
from rigfleet.facts.system import BootId, RebootRequired, StaleInitramfs
from rigfleet.rigstate import SERVING_COMPOSE


@cache.operation(is_idempotent=False)
def refuse(rig: str, problems: list[str]):
    """
    Stop this rig before anything is changed on it, naming each problem and its fix.

    It fails the rig with a command (an OperationError would stop every rig of the run).

    + rig: the rig's name
    + problems: one line each: what is wrong and how to fix it
    """
    lines = [f"rigfleet: refusing to deploy {rig}:", *(f"  - {problem}" for problem in problems)]
    yield StringCommand("printf '%s\\n'", *(shlex.quote(line) for line in lines), ">&2; exit 1")


@cache.operation(reads=lambda holds, **_: [cache.reading(StaleInitramfs, since=holds)])
def initramfs(holds: str):
    """
    Rebuild the initramfs (`update-initramfs -u`) when it predates `holds`, a file it must hold.

    Asked when the operation's turn comes (pyinfra runs an operation's body at execution too), so
    packages installed earlier in the same run that rebuilt it already are seen: Debian's
    glx-alternative-nvidia, a dependency of the driver, activates initramfs-tools' trigger.

    + holds: the file the initramfs must include (e.g. a modprobe.d blacklist)
    """
    stale = cache.fact(StaleInitramfs, since=holds)
    if stale is None:
        host.noop(f"the initramfs is newer than {holds}")
        return
    yield StringCommand("update-initramfs -u")


def reboot_reasons() -> list[str]:
    """Why the driver needs a reboot now (empty: it does not)."""
    smi = cache.fact(NvidiaSmi)
    reasons = []
    if smi.status == "mismatch":
        reasons.append(f"driver/library version mismatch ({smi.message})")
    elif smi.status in ("no_driver", "absent"):
        reasons.append("the NVIDIA kernel module is not loaded")
    if cache.fact(RebootRequired):
        reasons.append("/var/run/reboot-required is present")
    return reasons


def serving_command(action: str, compose_file: str) -> str:
    quoted = shlex.quote(compose_file)
    return (
        f"if [ -f {quoted} ] && command -v docker >/dev/null 2>&1; then "
        f"docker compose -f {quoted} {action}; fi"
    )


@cache.operation(reads=lambda **_: [cache.reading(NvidiaSmi), cache.reading(RebootRequired)],
                 is_idempotent=False)
def driver_reboot(
    expected_gpus: int,
    gpu_name: str | None = None,
    compose_file: str = SERVING_COMPOSE,
    delay: int = 5,
    interval: int = 2,
    reboot_timeout: int = 900,
):
    """
    Reboot the rig when the driver needs it (driver/library mismatch, module not loaded,
    /var/run/reboot-required), else nothing.

    The serving project is stopped first and started again after; the reboot is confirmed by a
    new /proc/sys/kernel/random/boot_id (not uptime, which is the host's inside containers), and
    the rig passes only when nvidia-smi then sees `expected_gpus` GPUs.

    + expected_gpus: GPUs nvidia-smi must report after the reboot
    + gpu_name: the name each of them must have (None: any)
    + compose_file: the serving compose project to stop before and start after
    + delay: seconds before the first reconnect attempt
    + interval: seconds between reconnect attempts
    + reboot_timeout: seconds until the rig counts as lost
    """
    reasons = reboot_reasons()
    if not reasons:
        host.noop("the driver is loaded and no reboot is pending")
        return
    logger.info(f"{host.print_prefix}rebooting for the driver: {'; '.join(reasons)}")
    boot_ids: list[str] = []
    yield StringCommand(serving_command("stop", compose_file))
    yield FunctionCommand(forget_askpass, (), {})
    yield FunctionCommand(record_boot_id, (boot_ids,), {})
    # detached, so the SSH channel closes before the network goes down (pyinfra #1708)
    yield StringCommand("( sleep 1 && reboot ) </dev/null >/dev/null 2>&1 &")
    yield FunctionCommand(wait_for_new_boot, (boot_ids, delay, interval, reboot_timeout), {})
    yield FunctionCommand(verify_gpus, (expected_gpus, gpu_name), {})
    yield StringCommand(serving_command("start", compose_file))


def forget_askpass(state: Any, host: Any) -> None:
    # remove the sudo askpass file now: after the reboot there is no session to clean it up
    remove_any_sudo_askpass_file(host)


def record_boot_id(state: Any, host: Any, boot_ids: list[str]) -> None:
    boot_ids.append(host.get_fact(BootId))


def wait_for_new_boot(
    state: Any, host: Any, boot_ids: list[str], delay: int, interval: int, timeout: int
) -> None:
    time.sleep(delay)
    clear_askpass_cache(host)
    host.disconnect()
    deadline = time.monotonic() + timeout
    while True:
        host.connect(show_errors=False)
        if host.connected:
            current = host.get_fact(BootId)
            if current and current != boot_ids[0]:
                logger.info(f"{host.print_prefix}back up with a new boot id")
                # the reboot ended the connection that held the rig lock: take it again on the
                # new one before anything else runs, or another deploy could step in now
                answer = riglock.take(host)
                if not answer.taken:
                    raise RuntimeError(riglock.refusal(host.name, answer))
                return
            host.disconnect()  # still the old boot: the reboot has not happened yet
        if time.monotonic() > deadline:
            raise RuntimeError(f"{host.name} did not come back with a new boot id within {timeout}s")
        time.sleep(interval)


def verify_gpus(state: Any, host: Any, expected: int, name: str | None) -> None:
    smi = host.get_fact(NvidiaSmi)
    if not smi.ok:
        raise RuntimeError(f"{host.name}: after the reboot nvidia-smi reports {smi.status}: {smi.message}")
    names = [gpu.name for gpu in smi.gpus]
    if len(names) != expected or (name and any(found != name for found in names)):
        raise RuntimeError(
            f"{host.name}: after the reboot nvidia-smi sees {names}, expected {expected} x {name}"
        )
    logger.info(f"{host.print_prefix}nvidia-smi sees {len(names)} GPUs, driver {smi.driver_version}")
