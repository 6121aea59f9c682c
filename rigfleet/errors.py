"""User-facing problems: every one names the rig, the field, the value and the fix."""

from __future__ import annotations

import difflib
import reprlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# A problem not tied to one rig (a pin set, a file) is reported under this name.
FLEET = "fleet"


@dataclass(frozen=True)
class Problem:
    rig: str
    field: str
    value: Any
    message: str
    fix: str
    source: str | None = None  # the file the value came from, when known
    warning: bool = False

    def render(self) -> str:
        where = f" (in {self.source})" if self.source else ""
        value = _short(self.value)
        kind = "warning" if self.warning else "error"
        return (f"{kind}: {one_line(self.rig)}: {one_line(self.field)} = {value}: {one_line(self.message, 400)}"
                f"{where}. Fix: {self.fix}")


_shown: set[tuple[str, str]] = set()


def one_host_group(group: str, names: list[str]) -> list[Problem]:
    """The problem of a group that takes one host (gateway, cache) listing several, if it does."""
    if len(names) <= 1:
        return []
    return [Problem(FLEET, f"hosts.yml group {group}", names, f"more than one rig in the {group} group",
                    f"put one host in the {group} group")]


def unseen_warnings(problems: Iterable[Problem], scope: object) -> list[Problem]:
    """The warnings among `problems` that this process has not shown yet for `scope` (the
    inventory): each is printed once, however often one command loads the fleet (the CLI and a
    rollout's runner, pyinfra's two entry files) or the guard reports it."""
    fresh = []
    for problem in problems:
        key = (str(scope), problem.render())
        if problem.warning and key not in _shown:
            _shown.add(key)
            fresh.append(problem)
    return fresh


def forget_shown() -> None:
    """A new command in this process (the CLI's entry): its warnings are shown afresh."""
    _shown.clear()


class InputError(Exception):
    """Bad input: the CLI prints the problems and exits 2 without contacting any host."""

    def __init__(self, problems: Iterable[Problem]):
        self.problems = [p for p in problems if not p.warning]
        super().__init__("\n".join(p.render() for p in self.problems))


def closest(value: object, choices: Iterable[str]) -> str | None:
    matches = difflib.get_close_matches(str(value), list(choices), n=1, cutoff=0.5)
    return matches[0] if matches else None


def one_of(value: object, choices: Iterable[str], what: str) -> str:
    """The fix for a value outside a closed set: the closest match, then every valid one."""
    options = sorted(choices)
    guess = closest(value, options)
    hint = f"did you mean '{guess}'? " if guess else ""
    return f"{hint}valid {what}: {', '.join(options)}"


_REPR = reprlib.Repr()  # attributes, not keywords: those arrived in Python 3.12
_REPR.maxlevel, _REPR.maxdict, _REPR.maxlist, _REPR.maxtuple, _REPR.maxset = 3, 6, 6, 6, 6
_REPR.maxstring = _REPR.maxother = 70


def _short(value: Any, limit: int = 80) -> str:
    """A bounded repr: reprlib stops at a depth and a length, so a huge or alias-shared value is
    never rendered in full (a 100 KB string or a billion-laughs list costs what 80 characters do)."""
    text = _REPR.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def one_line(text: str, limit: int = 120) -> str:
    """A name from the input, printed on one line (a newline in a rig name split the error line)."""
    escaped = text.encode("unicode_escape").decode("ascii") if not text.isprintable() else text
    return escaped if len(escaped) <= limit else escaped[: limit - 3] + "..."
