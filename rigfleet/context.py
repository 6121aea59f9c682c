"""The one validated view of the fleet shared by inventory.py, deploy.py and the roles.

pyinfra executes inventory.py and deploy.py in one process: the fleet is loaded and guarded
once, and each role gets the RigContext of the host it runs on (never raw host.data).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, NoReturn

import pyinfra

from rigfleet import guard, release
from rigfleet.errors import FLEET, InputError, Problem, unseen_warnings
from rigfleet.loader import Fleet, load_fleet, pyinfra_name
from rigfleet.paths import inventory_dir
from rigfleet.render import Release
from rigfleet.schema import PinSet, Rig, Variant


@dataclass(frozen=True)
class RigContext:
    fleet: Fleet
    rig: Rig
    pinset: PinSet
    variant: Variant

    @property
    def release(self) -> Release:
        return Release(self.rig, self.pinset, self.variant)


def cli_data_overrides(argv: list[str]) -> dict[str, Any]:
    """pyinfra's `--data key=value` overrides, parsed as pyinfra parses them.

    pyinfra applies them to host.data only after inventory.py ran; the roles read the validated
    model, so the overrides are validated here too (a bad one exits 2 before any connect).
    """
    from pyinfra_cli.util import parse_cli_arg

    raw: list[str] = []
    for index, arg in enumerate(argv):
        if arg == "--data" and index + 1 < len(argv):
            raw.append(argv[index + 1])
        elif arg.startswith("--data="):
            raw.append(arg.removeprefix("--data="))
    overrides: dict[str, Any] = {}
    for item in raw:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InputError([Problem(FLEET, "--data", item, "not in key=value form", "write --data key=value")])
        overrides[key] = parse_cli_arg(value)
    return overrides


def check_cli_data() -> None:
    """Refuse a malformed `--data` before pyinfra parses it (exit 2, one message).

    pyinfra runs the operator repository's config.py before it splits `--data key=value` itself,
    and its own split crashes on `--data oops`; config.py calls this so that never happens.
    """
    if pyinfra.is_cli:
        try:
            cli_data_overrides(sys.argv)
        except InputError as exc:
            _exit_with(exc)


def fleet(path: Path | None = None) -> Fleet:
    """Load and guard the fleet; on bad input print the problems and exit 2 before any connect.

    Loaded once per inventory and process: inventory.py and deploy.py share it (and its
    warnings are printed once).
    """
    try:
        chosen = Path(path).resolve() if path is not None else inventory_dir()
    except InputError as exc:
        _exit_with(exc)
    return _fleet(chosen)


def _exit_with(exc: InputError) -> NoReturn:
    for problem in exc.problems:
        print(problem.render(), file=sys.stderr)
    raise SystemExit(2) from None


@cache
def _fleet(path: Path) -> Fleet:
    try:
        overrides = cli_data_overrides(sys.argv) if pyinfra.is_cli else {}
        loaded = load_fleet(path, overrides)
        for warning in unseen_warnings(guard.enforce(loaded), path):
            print(warning.render(), file=sys.stderr)
    except InputError as exc:
        _exit_with(exc)
    return loaded


def for_rig(name: str) -> RigContext:
    loaded = fleet()
    return context_of(loaded, release.resolve(loaded, name))


def context_of(loaded: Fleet, resolved: Release) -> RigContext:
    return RigContext(loaded, resolved.rig, resolved.pinset, resolved.variant)


def pyinfra_host_data(loaded: Fleet, rig: Rig) -> dict[str, Any]:
    """Connection settings pyinfra needs; host keys are checked strictly, never accept-new."""
    data: dict[str, Any] = {"ssh_hostname": rig.ssh_hostname, "ssh_port": rig.ssh_port}
    if rig.ssh_user:
        data["ssh_user"] = rig.ssh_user
        if rig.ssh_user != "root":
            data["_sudo"] = True
    if rig.ssh_key:
        data["ssh_key"] = str(loaded.path(rig.ssh_key))
    known_hosts = loaded.path(rig.ssh_known_hosts_file or "known_hosts")
    data["ssh_known_hosts_file"] = str(known_hosts)
    data["ssh_strict_host_key_checking"] = "yes"
    data |= loaded.pyinfra_data.get(rig.name, {})
    return data


def pyinfra_groups(loaded: Fleet) -> dict[str, Any]:
    """inventory.py's module-level names, as pyinfra's CLI reads them: `all` holds every rig with
    its connection data; every inventory group is a list of rig names (so `--limit lab` works).
    The loader refused reserved and clashing names, so no group can replace `all` or another."""
    groups: dict[str, Any] = {"all": ([(rig.name, pyinfra_host_data(loaded, rig)) for rig in loaded.rigs], {})}
    for group in sorted({g for rig in loaded.rigs for g in rig.groups}):
        groups[pyinfra_name(group)] = [rig.name for rig in loaded.rigs if group in rig.groups]
    return groups
