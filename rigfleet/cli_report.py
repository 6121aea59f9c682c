"""`rigfleet report RIG`: the redacted triage bundle (rigfleet/report.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import click
import gevent

from rigfleet import report
from rigfleet.cli_common import err, load_checked, user_errors

UNREACHABLE = 1


@click.command("report")
@click.argument("rig")
@click.option("-o", "--output", "output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="the bundle to write (default: ./rigfleet-report-rig-TIMESTAMP.tar.gz); never overwritten")
@click.option("--no-redact", "keep_identity", is_flag=True,
              help="keep host names, addresses and home paths (secrets are redacted all the same)")
@click.option("--log-lines", default=str(report.DEFAULT_LOG_LINES), show_default=True,
              help="engine log lines to include")
@user_errors
def report_command(rig: str, output: Path | None, keep_identity: bool, log_lines: str) -> None:
    """A triage bundle (tar.gz) of RIG for an upstream bug report: host, kernel, driver, Docker,
    toolkit, containers, release record, ledger, last gate/verify, engine log, nvidia-smi -q.
    Read-only, one SSH session; secrets, host names and addresses redacted by default."""
    lines = report.check_log_lines(log_lines)
    fleet, _ = load_checked()
    # gevent's own report of a failed connect greenlet would come before the one line that says so
    hub = gevent.get_hub()
    hub.exception_stream = None
    try:
        bundle = report.write(fleet, rig, output, keep_identity, lines)
    except report.Unreachable as exc:
        err.print(f"rigfleet report: {rig}: {exc}; nothing written", markup=False)
        sys.exit(UNREACHABLE)
    finally:
        del hub.exception_stream  # back to gevent's default (sys.stderr)
    replaced = ", ".join(f"{kind} x{n}" for kind, n in sorted(bundle.counts.items()) if n) or "nothing"
    click.echo(f"wrote {bundle.path} ({len(bundle.files)} files, see MANIFEST.md); redacted: {replaced}")
