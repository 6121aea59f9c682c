"""`rigfleet sandbox ...`: SIMULATED dual-3090 rigs on this machine (root, Linux).

The main CLI does `main.add_command(sandbox)`.
"""

from __future__ import annotations

import os
import shutil
import sys

import click
from rich.console import Console
from rich.table import Table

from rigfleet_sandbox import manager
from rigfleet_sandbox.invfiles import read_hosts
from rigfleet_sandbox.layout import DISTROS, MAX_RIGS, OPERATOR, inventory_dir
from rigfleet_sandbox.shell import SandboxError


def _console() -> Console:
    # Wide enough for boot ids and pids even when piped (rich assumes 80 columns then).
    return Console(width=max(shutil.get_terminal_size((160, 24)).columns, 140))


def _fail(exc: SandboxError) -> None:
    raise click.ClickException(str(exc)) from exc


@click.group(help="Simulated dual-RTX-3090 rigs on this machine, for rehearsal and tests (root, Linux).")
def sandbox() -> None:
    pass


@sandbox.command(help="Clear leftovers, boot N simulated rigs, write inventory/sandbox/.")
@click.option("--rigs", "count", type=click.IntRange(1, MAX_RIGS), default=1, show_default=True)
@click.option("--distro", type=click.Choice(DISTROS), default="trixie", show_default=True)
def up(count: int, distro: str) -> None:
    try:
        info = manager.up(rigs=count, distro=distro, log=click.echo)
    except SandboxError as exc:
        click.echo("hint: `rigfleet sandbox down` clears a half-built sandbox", err=True)
        _fail(exc)
        return
    table = Table(title=f"simulated rigs ({distro}); inventory {info.inventory_dir}")
    for col in ("rig", "address", "boot to sshd", "boot id"):
        table.add_column(col)
    for rig in info.rigs:
        table.add_row(rig.name, rig.address, f"{rig.boot_seconds:.1f} s", rig.boot_id or "-")
    _console().print(table)


@sandbox.command(help="Power the rigs off, stop host services, remove everything but the cache.")
@click.option(
    "--timeout",
    type=float,
    default=manager.POWEROFF_TIMEOUT_S,
    show_default=True,
    help="seconds to wait for an orderly poweroff before killing",
)
def down(timeout: float) -> None:
    try:
        left = manager.down(log=click.echo, timeout=timeout)
    except SandboxError as exc:
        _fail(exc)
        return
    if any(left.values()):
        sys.exit(1)


@sandbox.command(help="One row per simulated rig: running?, address, boot id, uptime, pids.")
def status() -> None:
    rows = manager.status()
    if not rows:
        click.echo("sandbox is down (no simulated rigs)")
        return
    table = Table(title="rigfleet sandbox (simulated rigs)")
    for col in (
        "rig",
        "state",
        "sshd",
        "address",
        "boot id",
        "up since boot",
        "boots",
        "pids sup/nspawn/init",
    ):
        table.add_column(col)
    for r in rows:
        up_s = f"{r.uptime_s:.0f} s" if r.uptime_s is not None else "-"
        pids = "/".join(str(p) if p else "-" for p in (r.supervisor_pid, r.nspawn_pid, r.init_pid))
        table.add_row(r.name, r.state, "yes" if r.sshd else "no", r.address, r.boot_id or "-", up_s, str(r.boots), pids)
    _console().print(table)


@sandbox.command(
    context_settings={"ignore_unknown_options": True},
    help="ssh into a simulated rig as the operator, with strict host-key checking.",
)
@click.argument("rig")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def ssh(rig: str, command: tuple[str, ...]) -> None:
    inv = inventory_dir()
    try:
        hosts = read_hosts(inv)
    except SandboxError as exc:
        _fail(exc)
        return
    if rig not in hosts:
        raise click.ClickException(f"no rig {rig!r} in {inv}/hosts.yml (have: {', '.join(hosts)})")
    argv = manager.ssh_command(inv, hosts[rig], OPERATOR)
    if not command:
        argv.insert(1, "-t")  # an interactive login
    os.execvp(shutil.which("ssh") or "ssh", [*argv, *command])
