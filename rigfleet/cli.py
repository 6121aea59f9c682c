"""The `rigfleet` command: check, render, plan (and more layers register their commands here)."""

from __future__ import annotations

import json
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from rigfleet import errors, paths, pindiff, planner, release, tables
from rigfleet.cli_common import USER_ERROR, err, load_checked, user_errors, warn
from rigfleet.cli_fleet import repin, status_command
from rigfleet.cli_hostkeys import hostkeys_command
from rigfleet.cli_pins import pins
from rigfleet.cli_report import report_command
from rigfleet.cli_verify import verify_command
from rigfleet.errors import Problem
from rigfleet.loader import Fleet
from rigfleet.render import Release
from rigfleet.rollback import rollback

__all__ = ["USER_ERROR", "err", "load_checked", "main", "user_errors", "warn"]


def release_for(fleet: Fleet, rig_name: str) -> Release:
    return release.resolve(fleet, rig_name)


@click.group()
@click.version_option(package_name="rigfleet")
@click.option("-i", "--inventory", "inventory", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="inventory directory (its hosts.yml); default: RIGFLEET_INVENTORY, else ./inventory")
def main(inventory: Path | None) -> None:
    """Provision dual-RTX-3090 vLLM rigs and keep a fleet on one known-good pin.

    The inventory is `-i DIR`, else RIGFLEET_INVENTORY, else ./inventory when it has a
    hosts.yml (an operator repo written by `rigfleet init`). There is no other default.
    """
    paths.select(inventory)
    errors.forget_shown()


@main.command()
@user_errors
def check() -> None:
    """Validate the inventory and run the compatibility guard; contacts no host."""
    fleet, warnings = load_checked()
    warn(warnings)
    click.echo(f"ok: {len(fleet.rigs)} rigs, {len(fleet.pinsets)} pin sets in {fleet.inventory_dir}")


@main.command()
@click.argument("rig")
@click.option("-o", "--output", "output", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="directory to write the rig's files into")
@user_errors
def render(rig: str, output: Path) -> None:
    """Write every file RIG would receive (secrets only as references)."""
    fleet, warnings = load_checked()
    warn(warnings)
    release = release_for(fleet, rig)
    files = release.files(secrets=None, release_id=release.release_id())
    from rigfleet.render import host_files

    files |= {f"host/{name}": text for name, text in host_files(release.rig).items()}
    for name, text in files.items():
        target = output / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        if name.endswith(".env"):
            target.chmod(0o600)
    click.echo(f"wrote {len(files)} files for {rig} to {output}")


@main.command()
@click.argument("directory", type=click.Path(path_type=Path))
@user_errors
def init(directory: Path) -> None:
    """Write an operator repo into DIRECTORY: inventory/, pinsets, inventory.py, deploy.py."""
    from rigfleet import operator_repo

    written = operator_repo.write(directory)
    click.echo(f"wrote {len(written)} files to {directory}; next: cd {directory} && rigfleet check, "
               "then edit inventory/hosts.yml and run `pyinfra inventory.py deploy.py`")


def plan_rows(fleet: Fleet, warnings: list[Problem]) -> list[dict[str, Any]]:
    rows = []
    for rig in fleet.rigs:
        resolved = release.resolve(fleet, rig)
        variant = resolved.variant
        capacity = planner.predict(rig, variant)
        rows.append({
            "rig": rig.name,
            "variant": rig.variant,
            "pinset": rig.pinset,
            "image_tag": resolved.image,
            "port": resolved.port,
            "kv_pool_tokens": capacity.kv_pool_tokens,
            "max_full_context_streams": capacity.max_full_context_streams,
            "concurrency": capacity.concurrency,
            "warnings": [p.render() for p in warnings if p.rig in (rig.name, f"pinset {rig.pinset}")],
        })
    return rows


@main.command()
@click.option("--json", "as_json", is_flag=True, help="print a JSON list instead of a table")
@click.option("--from", "from_spec", metavar="PINSET[:VARIANT]",
              help="also show, per rig, what changes from this pin set (and variant) to the declared one")
@user_errors
def plan(as_json: bool, from_spec: str | None) -> None:
    """What every rig would run and the KV pool it would get (predicted); contacts no host."""
    fleet, warnings = load_checked()
    rows = plan_rows(fleet, warnings)
    if from_spec:
        changes = pindiff.changes_from(fleet, [row["rig"] for row in rows], from_spec)
        for row in rows:
            row["changes_from"] = {"from": from_spec, "changes": changes[row["rig"]]}
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    warn(warnings)
    table = tables.fitted(f"rigfleet plan: {fleet.inventory_dir}", [
        ("rig", "key"), ("variant", "fold"), ("pinset", "fold"), ("port", "key"), ("KV pool", "key"),
        ("262K streams", "fold"), ("image", "cut")])
    for row in rows:
        table.add_row(row["rig"], row["variant"], row["pinset"], str(row["port"]),
                      f"{row['kv_pool_tokens'] / 1e6:.2f}M", f"{row['max_full_context_streams']} "
                      f"({row['concurrency']}x)", tables.short_image(row["image_tag"]))
    Console().print(table)
    if from_spec:
        print_changes(from_spec, {row["rig"]: row["changes_from"]["changes"] for row in rows})


def print_changes(from_spec: str, changes: dict[str, list[str]]) -> None:
    for rig, lines in changes.items():
        click.echo(f"{rig}: from {from_spec}: " + ("no change" if not lines else f"{len(lines)} changes"))
        for line in lines:
            click.echo(f"  {line}")


def _register() -> None:
    """The commands of the modules above, then those other installed distributions add through
    the `rigfleet.commands` entry-point group (a click command each)."""
    for command in (repin, status_command, hostkeys_command, pins, rollback, verify_command, report_command):
        main.add_command(command)
    for entry in entry_points(group="rigfleet.commands"):
        main.add_command(entry.load(), entry.name)


_register()
