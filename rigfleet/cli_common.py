"""What every `rigfleet` command module shares: the error console, the exit-2 wrapper for bad
input, warnings, and the guarded fleet load. A lower layer than cli.py, so the command modules
import it and cli.py imports them (no import back up)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

from rich.console import Console

from rigfleet import guard
from rigfleet.errors import InputError, Problem, unseen_warnings
from rigfleet.loader import Fleet, load_fleet
from rigfleet.paths import inventory_dir

F = TypeVar("F", bound=Callable[..., Any])
USER_ERROR = 2

err = Console(stderr=True, highlight=False, soft_wrap=True)


def user_errors(func: F) -> F:
    """Bad input: one line per problem, exit 2, no traceback."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except InputError as exc:
            for problem in exc.problems:
                err.print(problem.render(), markup=False)
            sys.exit(USER_ERROR)

    return wrapper  # type: ignore[return-value]


def warn(problems: list[Problem]) -> None:
    for problem in unseen_warnings(problems, inventory_dir()):
        err.print(problem.render(), style="yellow", markup=False)


def load_checked() -> tuple[Fleet, list[Problem]]:
    fleet = load_fleet(inventory_dir())
    return fleet, guard.enforce(fleet)
