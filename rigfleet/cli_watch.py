"""`rigfleet status --watch`: the live view (rigfleet.live collects, rigfleet.watch draws)."""

from __future__ import annotations

import contextlib

import gevent
from rich.console import Console

from rigfleet import live, watch
from rigfleet.cli_common import load_checked
from rigfleet.errors import InputError, Problem

MIN_INTERVAL_S = 1.0  # each refresh samples /metrics over one second on the rig


def check_options(interval: str, count: str | None) -> tuple[float, int | None]:
    """Bad options are input errors, before anything is contacted."""
    problems = []
    try:
        seconds = float(interval)
    except ValueError:
        seconds = 0.0
    if not MIN_INTERVAL_S <= seconds <= 3600:
        problems.append(Problem("fleet", "--interval", interval, "not a number of seconds between refreshes",
                                f"use {MIN_INTERVAL_S:g} to 3600"))
    frames = None
    if count is not None:
        frames = int(count) if count.strip().isdigit() else 0
        if frames < 1:
            problems.append(Problem("fleet", "--count", count, "not a number of frames", "use 1 or more, "
                                    "or leave it out to watch until Ctrl-C"))
    if problems:
        raise InputError(problems)
    return seconds, frames


def run(interval: str, count: str | None) -> None:
    seconds, frames = check_options(interval, count)
    fleet, _ = load_checked()
    # An unreachable rig is a row saying `offline`; gevent's own report of the failed connect
    # greenlet would otherwise be written through the frame.
    hub = gevent.get_hub()
    hub.exception_stream = None
    try:
        with contextlib.suppress(KeyboardInterrupt):  # the way out of an unbounded watch
            watch.watch(lambda: live.collect(fleet), seconds, frames, Console(highlight=False))
    finally:
        del hub.exception_stream  # back to gevent's default (sys.stderr)
