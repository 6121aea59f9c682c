"""`rigfleet rollback RIG`: return a rig to the ledger's previous release through the same gate.

Runs the `serving_rollback` role on that one rig through pyinfra's API (rigfleet.runner), then
reads the ledger back and prints the attempt: result, gate, downtime. Exit 0 when the previous
release passed the gate and serves; 1 otherwise (a failed rollback restarts the release that
was serving, as a failed deploy does).
"""

from __future__ import annotations

import sys
from dataclasses import replace

import click

from rigfleet import ledger, runner
from rigfleet.cli_common import load_checked, user_errors, warn
from rigfleet.facts.serving import ServingState
from rigfleet.loader import Fleet

FAILED = 1


def with_gate(fleet: Fleet, rig: str, level: str | None) -> Fleet:
    if level is None:
        return fleet
    rigs = tuple(r.model_copy(update={"gate": level}) if r.name == rig else r for r in fleet.rigs)
    return replace(fleet, rigs=rigs)


def describe(attempt: ledger.Attempt | None) -> list[str]:
    if not attempt:
        return ["no attempt recorded"]
    lines = [f"{attempt.kind} to {attempt.release_id} ({attempt.variant} on {attempt.pinset}): {attempt.result}"]
    downtime = attempt.downtime_s
    lines.append("downtime: " + (f"{downtime:.1f} s" if isinstance(downtime, (int, float)) else "not measured"))
    if attempt.kv_pool_tokens:
        lines.append(f"KV pool: {attempt.kv_pool_tokens} tokens")
    if attempt.error:
        lines.append(f"gate: {attempt.error}")
    if attempt.restored:
        health = "healthy" if attempt.restore_ok else "NOT healthy"
        lines.append(f"serving again: {attempt.restored} ({health})")
    if attempt.result == "failed" and attempt.log_tail:
        lines.append("engine log (last lines):")
        lines += [f"    {line}" for line in attempt.log_tail]
    return lines


@click.command("rollback")
@click.argument("rig")
@click.option("--gate", "level", type=click.Choice(["basic", "full"]), default=None,
              help="gate level for the previous release (default: the rig's `gate`)")
@user_errors
def rollback(rig: str, level: str | None) -> None:
    """Return RIG to its previous release (from the rig's ledger), through the health gate."""
    fleet, warnings = load_checked()
    warn(warnings)
    fleet.rig(rig)  # an unknown name is an input error, before anything is contacted
    from rigfleet.roles.serving import serving_rollback

    before, _ = runner.read_facts(fleet, [rig], ServingState)
    book_before = ledger.load((before.get(rig) or {}).get("ledger"), rig)
    outcome = runner.converge(with_gate(fleet, rig, level), [rig], roles=[serving_rollback])[rig]
    after, _ = runner.read_facts(fleet, [rig], ServingState)
    book = ledger.load((after.get(rig) or {}).get("ledger"), rig)
    attempt = ledger.last_attempt(book)
    if attempt is ledger.last_attempt(book_before) or len(book.attempts) == len(book_before.attempts):
        attempt = None  # nothing was recorded: refused before the swap (no previous release, unreachable)
    for line in describe(attempt):
        click.echo(f"{rig}: {line}")
    if not outcome.ok:
        click.echo(f"{rig}: rollback failed: {outcome.summary}", err=True)
        sys.exit(FAILED)
    click.echo(f"{rig}: now serving {ledger.current_id(book)}")
