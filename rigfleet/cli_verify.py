"""`rigfleet verify [RIG...] --level L`: the verify ladder on serving rigs (rigfleet/verify.py)."""

from __future__ import annotations

import json
import sys
import threading

import click
from rich.console import Console
from rich.table import Table

from rigfleet import gate, rollout, verify
from rigfleet.cli_common import err, load_checked, user_errors, warn

FAILED = 1


def summary_table(results: list[verify.RigResult]) -> Table:
    """One row per rig; the failed-checks column folds, so the table fits 80 columns."""
    table = Table(title=f"rigfleet verify {results[0].level if results else ''}".strip())
    table.add_column("rig", overflow="fold", max_width=16)
    table.add_column("result", no_wrap=True)
    table.add_column("checks", justify="right", no_wrap=True)
    table.add_column("failed / why", overflow="fold", ratio=1)
    table.add_column("s", justify="right", no_wrap=True)
    for result in results:
        if result.error:
            verdict, why = "[red]ERROR[/red]", result.error
        elif result.ok:
            verdict, why = "[green]pass[/green]", ("warn: " + ", ".join(result.warnings)) if result.warnings else "-"
        else:
            verdict, why = "[red]FAIL[/red]", ", ".join(result.failed) or result.summary()
        passed = sum(1 for c in result.checks if c.get("ok"))
        table.add_row(result.rig, verdict, f"{passed}/{len(result.checks)}" if result.checks else "-", why,
                      f"{result.seconds:.0f}")
    return table


@click.command("verify")
@click.argument("rigs", nargs=-1)
@click.option("--level", default="full", show_default=True, help=f"how far up the ladder: {' | '.join(verify.LEVELS)}")
@click.option("--group", help="only rigs of this inventory group")
@click.option("--timeout", "timeout", default=str(verify.DEFAULT_TIMEOUT_S), show_default=True,
              help="seconds per phase on each rig (readiness, then each level's checks)")
@click.option("--json", "as_json", is_flag=True, help="print a JSON list instead of the table")
@user_errors
def verify_command(rigs: tuple[str, ...], level: str, group: str | None, timeout: str, as_json: bool) -> None:
    """Run the verify ladder on serving rigs, all at once; read-only (the verdict goes to each
    rig's ledger). Exit 0 when every rig passed, 1 when one failed, 2 on bad input."""
    timeout_s = verify.check_options(level, timeout)
    fleet, warnings = load_checked()
    names = rollout.scope(fleet, group, rigs)
    warn(warnings)
    width = max(len(name) for name in names)
    lock = threading.Lock()

    def say(rig: str, line: str) -> None:
        with lock:
            err.print(f"{rig:<{width}}  {line}", markup=False, highlight=False)

    settings = {rig.name: gate.rig_settings(rig) for rig in fleet.rigs if rig.name in names}
    results = verify.run(names, level, timeout_s, verify.ssh_connect(fleet), say, settings)
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in results], indent=2))
    else:
        Console(highlight=False).print(summary_table(results))
    if not all(r.ok for r in results):
        sys.exit(FAILED)
