"""How rigfleet's own Python reaches a rig: stdlib-only source, base64 in the command line,
decoded and piped into the rig's `python3 -` (python3 is on every supported distro).

Nothing is left on the rig and a read-only fact needs no upload before it: the serving state
(rigfleet.facts.serving), the status probe (rigfleet.status), the live view (rigfleet.live) and
the triage report (rigfleet.report) use `command`. Two programs still travel as files, for
reasons of their own: the health gate (rigfleet/gate/, uploaded to rigstate.GATE_DIR so an
operator can re-run it by hand; `rigfleet verify` sends the same files on stdin) and the hub
fetch helper (rigfleet/operations/hub_fetch.py, which reads the token on stdin, so its source cannot come that way).
"""

from __future__ import annotations

import base64
import shlex


def encoded(source: str) -> str:
    return base64.b64encode(source.encode()).decode()


def command(source: str, *args: str) -> str:
    """The shell command that runs `source` with `args` on the rig (stdin carries the source)."""
    tail = "".join(f" {shlex.quote(arg)}" for arg in args)
    return f"echo {encoded(source)} | base64 -d | python3 -{tail}"
