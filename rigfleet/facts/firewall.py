"""Whether the API allowlist (rigfleet.roles.api_firewall) is installed and live in the kernel."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from pyinfra.api import FactBase
from typing_extensions import override


@dataclass(frozen=True)
class AllowlistState:
    installed: bool  # the script or the unit is on disk
    live: bool  # `script check`: the chain and the jump are what the script installs


class ApiAllowlist(FactBase[AllowlistState]):
    @override
    def command(self, script: str, unit: str) -> str:
        s, u = shlex.quote(script), shlex.quote(unit)
        return (f"if [ -e {s} ] || [ -e {u} ]; then echo installed; "
                f"if [ -x {s} ] && {s} check >/dev/null 2>&1; then echo live; fi; fi")

    @override
    @staticmethod
    def default() -> AllowlistState:
        # nothing printed (no script, no unit: every rig without an allowlist) is "not installed";
        # pyinfra gives a fact with no output its default(), which would otherwise be None
        return AllowlistState(installed=False, live=False)

    @override
    def process(self, output: list[str]) -> AllowlistState:
        words = {line.strip() for line in output}
        return AllowlistState(installed="installed" in words, live="live" in words)
