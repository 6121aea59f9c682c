"""Fleet commands: `rigfleet repin` (waves, canary first) and `rigfleet status` (read-only drift)."""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from rigfleet import cli_watch, liveness, pindiff, rollout, runner, status, tables
from rigfleet.cli_common import load_checked, user_errors, warn

out = Console(highlight=False, soft_wrap=True)


@click.command()
@click.option("--group", help="only rigs of this inventory group")
@click.option("--limit", multiple=True, help="only these rigs (repeatable)")
@click.option("--canary", help="the rig that goes first, alone (default: the first rig in scope)")
@click.option("--wave", "wave_size", default=2, show_default=True, help="rigs per wave after the canary")
@click.option("--max-failures", default=1, show_default=True, help="halt once this many rigs failed")
@click.option("--dry-run", is_flag=True,
              help="print the changes and the wave plan, change nothing (reads each rig's release record "
                   "unless --from is given, then contacts nothing)")
@click.option("--from", "from_spec", metavar="PINSET[:VARIANT]",
              help="diff from this pin set instead of the one each rig's release record names")
@click.option("--no-drain", is_flag=True,
              help="do not take rigs out of the gateway before their swap (in-flight requests are cut)")
@user_errors
def repin(group: str | None, limit: tuple[str, ...], canary: str | None, wave_size: int, max_failures: int,
          dry_run: bool, from_spec: str | None, no_drain: bool) -> None:
    """Roll out what the inventory declares, canary first, then waves; halt at the first failure."""
    fleet, warnings = load_checked()
    warn(warnings)
    if no_drain:
        fleet = rollout.without_drain(fleet)
    # behind a gateway, waves are split so every model keeps gateway_min_serving backends
    plan = rollout.plan_waves(rollout.scope(fleet, group, limit), canary, wave_size, fleet)
    in_scope = [r for wave in plan for r in wave]
    changes: dict[str, tuple[str, list[str] | None]]
    if from_spec:
        changes = {rig: (f"from {from_spec}", lines)
                   for rig, lines in pindiff.changes_from(fleet, in_scope, from_spec).items()}
    else:  # before: the release each rig's ledger records as serving now
        changes = pindiff.changes_from_records(fleet, in_scope, status.recorded(fleet, in_scope))
    for rig, (label, lines) in changes.items():
        if lines is None:
            out.print(f"{rig}: {label}", markup=False)
            continue
        out.print(f"{rig}: {label}: " + (f"{len(lines)} changes" if lines else "no change"), markup=False)
        for line in lines:
            out.print(f"  {line}", markup=False)
    for index, rigs in enumerate(plan):
        label = "canary" if index == 0 else f"wave {index}"
        out.print(f"{label}: {', '.join(rigs)}")
    if dry_run:
        return

    def start(index: int, rigs: list[str]) -> None:
        label = "canary (gate full)" if index == 0 else f"wave {index}"
        out.print(f"\n[bold]{label}[/bold]: converging {', '.join(rigs)} ...")

    def done(wave: rollout.WaveResult) -> None:
        for name, outcome in wave.outcomes.items():
            style = "green" if outcome.ok else "red"
            changes = f" ({outcome.changed} changes)" if outcome.reachable else ""
            out.print(f"  {name}: [{style}]{outcome.summary}[/{style}]{changes}")
            for warning in outcome.warnings:
                out.print(f"    [yellow]{warning}[/yellow]")
        out.print(f"  wave took {wave.seconds:.0f} s")

    result = rollout.run(fleet, plan, runner.converge, max_failures, on_wave=done, on_start=start)
    out.print()
    if result.ok:
        out.print(f"[green]re-pin complete[/green]: {len(result.touched)} rigs converged")
        _images(result)
        return
    unreachable = result.unreachable
    lost = [rig for wave in result.waves for rig, outcome in wave.outcomes.items() if liveness.lost(outcome)]
    failed = [rig for rig in result.failed if rig not in unreachable and rig not in lost]
    converged = [rig for rig in result.touched if rig not in result.failed]
    out.print(f"[red]re-pin halted[/red] after {len(result.waves)} of {len(plan)} waves: "
              f"failed {', '.join(failed) or '-'}; unreachable {', '.join(unreachable) or '-'}; "
              f"{liveness.LOST} {', '.join(lost) or '-'}; "
              f"converged {', '.join(converged) or '-'}; untouched {', '.join(result.untouched) or '-'}.")
    out.print("A rig whose gate failed is back on its previous release; an unreachable rig was not changed; "
              "a rig lost mid-converge may have stopped half-way (its ledger still names the release it last "
              "passed). Fix the cause (for a lost rig: wait until it answers again) and run the same command "
              "again to continue.")
    _images(result)
    sys.exit(1)


def _images(result: rollout.Rollout) -> None:
    for line in result.image_lines():
        out.print(line, markup=False)


@click.command(name="status")
@click.option("--json", "as_json", is_flag=True, help="print a JSON list instead of a table (with the live fields)")
@click.option("--watch", is_flag=True, help="a live view of every rig (engine, GPUs, last gate/verify)")
@click.option("--interval", default="5", show_default=True, help="seconds between refreshes of --watch")
@click.option("--count", default=None, help="stop --watch after this many frames (default: until Ctrl-C)")
@user_errors
def status_command(as_json: bool, watch: bool, interval: str, count: str | None) -> None:
    """Per rig, read-only: reachability, host stack, current release, health and drift."""
    if watch:
        cli_watch.run(interval, count)
        return
    fleet, _ = load_checked()
    if as_json:
        click.echo(json.dumps(status.collect_with_live(fleet), indent=2))
        return
    rows = status.collect(fleet)
    for table in status_tables(f"rigfleet status: {fleet.inventory_dir}", rows, out.width):
        out.print(table)
    for row in rows:
        for risk in row.get("risks", ()):
            out.print(f"risk on {row['rig']}: {risk}", markup=False, style="yellow")
    fronted = [row for row in rows if "gateway_url" in row]
    if fronted:
        first = fronted[0]
        out.print(f"gateway on {first['gateway_host']} ({first['gateway_url']}): {first['gateway_health']}; "
                  + ", ".join(f"{row['rig']} {row['gateway']}" for row in fronted), markup=False)


HOST_COLUMNS: list[tuple[str, tables.Kind]] = [("rig", "key"), ("up", "key"), ("distro", "fold"),
                                               ("kernel (hold)", "fold"), ("driver", "fold"), ("docker", "fold"),
                                               ("toolkit", "fold")]
SERVING_COLUMNS: list[tuple[str, tables.Kind]] = [("release", "fold"), ("healthy", "key"), ("KV pool", "key"),
                                                  ("API reach", "cut")]
DRIFT_COLUMNS: list[tuple[str, tables.Kind]] = [("drift", "fold")]
# Below this the host stack, the serving side and the drift are three tables, each fitting the width
# (at 80 columns a drift line beside the serving cells would wrap over many lines, or rich drops it).
WIDE = 150


def status_tables(title: str, rows: list[dict[str, Any]], width: int) -> list[Table]:
    def host(row: dict[str, Any]) -> list[str]:
        distro, _, kernel = (row.get("os") or "-").partition(" / ")  # "debian 13 / <uname -r>"
        return [row["rig"], "yes" if row["reachable"] else "[red]NO[/red]", distro,
                f"{kernel or '-'} {status.kernel_label(row.get('kernel'))}", row.get("driver") or "-",
                row.get("docker") or "-", row.get("toolkit") or "-"]

    def serving(row: dict[str, Any], release_sep: str) -> list[str]:
        return [f"{row['pinset'] or '-'}{release_sep}{row['variant'] or '-'}", _yes_no(row["healthy"]),
                f"{row['kv_pool_tokens']:,}" if row["kv_pool_tokens"] else "-", row["api_reach"]["label"]]

    def drift(row: dict[str, Any]) -> str:
        return "[yellow]" + "\n".join(row["drift"]) + "[/yellow]" if row["drift"] else "[green]none[/green]"

    if width >= WIDE:
        table = tables.fitted(title, HOST_COLUMNS + SERVING_COLUMNS + DRIFT_COLUMNS)
        for row in rows:
            table.add_row(*host(row), *serving(row, " / "), drift(row))
        return [table]
    stack = tables.fitted(f"{title} (host stack)", HOST_COLUMNS)
    side = tables.fitted(f"{title} (serving)", [("rig", "key"), *SERVING_COLUMNS])
    drifts = tables.fitted(f"{title} (drift)", [("rig", "key"), *DRIFT_COLUMNS])
    for row in rows:
        stack.add_row(*host(row))
        side.add_row(row["rig"], *serving(row, " /\n"))  # pin set over variant: two short lines
        drifts.add_row(row["rig"], drift(row))
    return [stack, side, drifts]


def _yes_no(value: bool | None) -> str:
    return "-" if value is None else ("[green]yes[/green]" if value else "[red]no[/red]")
