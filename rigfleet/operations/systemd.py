"""systemd units: pyinfra's systemd.service, with the "nothing to do" answer from facts read once."""

from __future__ import annotations

from pyinfra import host
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus
from pyinfra.operations import systemd

from rigfleet.facts import cache


def unit_name(service: str) -> str:
    return service if "." in service else f"{service}.service"  # pyinfra's default unit type


def _reads(service: str, enabled: bool | None, **_: object) -> list[cache.Read]:
    unit = unit_name(service)
    reads = [cache.reading(SystemdStatus, services=[unit])]
    if enabled is not None:
        reads.append(cache.reading(SystemdEnabled, services=[unit]))
    return reads


@cache.operation(reads=_reads)
def service(service: str, running: bool = True, restarted: bool = False, enabled: bool | None = None):
    """
    A unit running (and enabled), restarted when asked: pyinfra's systemd.service, which reads
    its two facts again itself only when something is to be done.

    + service: the unit (".service" when it names no type)
    + running: whether it should run
    + restarted: restart it (when it runs)
    + enabled: whether it should start at boot (None: leave it)
    """
    unit = unit_name(service)
    is_running = cache.fact(SystemdStatus, services=[unit]).get(unit)
    settled = bool(is_running) == running and not (restarted and is_running)
    if settled and enabled is not None:
        settled = bool(cache.fact(SystemdEnabled, services=[unit]).get(unit, False)) == enabled
    if settled:
        host.noop(f"{unit}: {'running' if running else 'stopped'}"
                  + ("" if enabled is None else f", {'enabled' if enabled else 'disabled'}"))
        return
    yield from systemd.service._inner(service=unit, running=running, restarted=restarted, enabled=enabled)
