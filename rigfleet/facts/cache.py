"""Facts read once per rig while nothing changes there, and many facts in one round trip.

pyinfra 3 keeps no fact cache: every `host.get_fact` runs its command. A no-op converge asks the
same questions many times (the package list before every install and hold step, nvidia-smi,
daemon.json) and some forty different ones, one command each. pyinfra has no batched fact
either, so this module adds both on top of its own fact classes, commands and parsers:

- `fact(cls, **kwargs)`: the value already read for this rig in this run, as long as nothing
  has been executed on the rig since; otherwise a real `host.get_fact` (kept for the next reader).
  The rig's values are dropped whenever something may have changed there: when an operation that
  ran a command ends (`Invalidate`, any operation, pyinfra's own included), and inside an
  operation of ours before each command it yields (`operation`), so a read after a change,
  even in the same operation, is a real read. A converge that changes things is as fresh as
  before; one that changes nothing reads each fact once.
- `want(...)` at plan time, `read_wanted()` after planning: the facts the planned operations
  will read, in one command. Each fact's own command runs in a subshell between markers and its
  own `process` parses its part. A fact whose command fails, whose program is missing or whose
  parser raises is not kept: its reader then reads it alone, so its errors are pyinfra's own.
- Reads of one fact for different units or files are merged into one read of them all
  (`MERGES`): a converged rig answers fourteen `systemctl show` and twenty digest commands in
  two and one, and each reader is kept its own part, the value its own read would give.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, field
from functools import wraps
from typing import Any, TypeVar, cast
from weakref import WeakKeyDictionary

from pyinfra import host
from pyinfra.api import BaseStateCallback, FactBase
from pyinfra.api import operation as pyinfra_operation
from pyinfra.context import ctx_host, ctx_state
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus
from typing_extensions import override

from rigfleet.facts.files import ManagedFile, ManagedFiles

T = TypeVar("T")
MARK = "@@rigfleet-fact"


@dataclass(frozen=True)
class Read:
    """One fact of one rig: its class and its arguments (defaults filled in, as pyinfra does)."""

    cls: type[FactBase[Any]]
    kwargs: dict[str, Any] = field(hash=False)

    @property
    def key(self) -> tuple[type, str]:
        return self.cls, repr(sorted(self.kwargs.items()))


def reading(cls: type[FactBase[Any]], **kwargs: Any) -> Read:
    command = cls().command
    if callable(command):
        kwargs = inspect.getcallargs(command, **kwargs)
        kwargs.pop("self", None)
    return Read(cls, kwargs)


def batchable(cls: type[FactBase[Any]]) -> bool:
    """Facts whose command needs nothing from pyinfra at read time: no precondition, no other shell."""
    return cls.check_preconditions is FactBase.check_preconditions and cls.shell_executable is None


# --- the rig's values ---------------------------------------------------------------------------

_values: WeakKeyDictionary[Any, dict[tuple[type, str], Any]] = WeakKeyDictionary()
_wanted: WeakKeyDictionary[Any, dict[tuple[type, str], Read]] = WeakKeyDictionary()


def _host() -> Any:
    return ctx_host.get()  # the Host object itself: a new one every run


def drop(rig: Any) -> None:
    """Something may have changed on `rig`: every later read is a real one."""
    if rig is not None:
        _values.pop(rig, None)


def fact(cls: type[FactBase[T]], **kwargs: Any) -> T:
    """`host.get_fact(cls, **kwargs)`, answered from this run's earlier read while nothing changed."""
    wanted = reading(cls, **kwargs)
    values = _values.setdefault(_host(), {})
    if wanted.key not in values:
        values[wanted.key] = host.get_fact(cls, **wanted.kwargs)
    return cast(T, values[wanted.key])


def want(cls: type[FactBase[Any]], **kwargs: Any) -> None:
    """At plan time: an operation added for this rig will read this fact (see read_wanted)."""
    if batchable(cls):
        wanted = reading(cls, **kwargs)
        _wanted.setdefault(_host(), {})[wanted.key] = wanted


def read_wanted() -> None:
    """Read every wanted fact not read yet, in one round trip."""
    rig = _host()
    pending = list(_wanted.pop(rig, {}).values())
    read(pending)


def read(reads: Iterable[Read]) -> None:
    """Read these facts in one command and keep their values (see the module's docstring)."""
    rig = _host()
    values = _values.setdefault(rig, {})
    pending = [r for r in reads if r.key not in values and batchable(r.cls)]
    planned = merged(pending)
    if len(planned) < 2:
        for one, readers in planned:
            keep(values, one, readers, host.get_fact(one.cls, **one.kwargs))
        return
    answers = host.get_fact(Batch, reads=tuple(one for one, _ in planned))
    for (one, readers), answer in zip(planned, answers or (), strict=False):
        if answer is not MISSING:
            keep(values, one, readers, answer)


@dataclass(frozen=True)
class Merge:
    """Reads of a fact that one read of `into` answers together: `arg` is what each read asks for
    (one path, or a list of units), `into_arg` the list the merged read takes; `into`'s value is a
    dict by path or unit, the same values the single reads give."""

    into: type[FactBase[Any]]
    arg: str
    into_arg: str


MERGES: dict[type, Merge] = {
    SystemdStatus: Merge(SystemdStatus, "services", "services"),  # systemctl show takes many units
    SystemdEnabled: Merge(SystemdEnabled, "services", "services"),
    ManagedFile: Merge(ManagedFiles, "path", "paths"),
}


def _items(one: Read, merge: Merge) -> list[str] | None:
    """What this read asks for, when it can be merged: not "every unit" (None), no odd path."""
    asked = one.kwargs.get(merge.arg)
    items = [asked] if isinstance(asked, str) else list(asked) if isinstance(asked, list | tuple) else None
    if not items or any("\n" in item or "\\" in item for item in items):
        return None
    return items


def merged(pending: list[Read]) -> list[tuple[Read, list[Read]]]:
    """The reads to make, each with the reads it answers (several where MERGES joins them)."""
    groups: dict[tuple[type, str], tuple[Merge, dict[str, Any], list[Read], set[str]]] = {}
    planned: list[tuple[Read, list[Read]]] = []
    for one in pending:
        merge = MERGES.get(one.cls)
        items = _items(one, merge) if merge else None
        if merge is None or items is None:
            planned.append((one, [one]))
            continue
        rest = {k: v for k, v in one.kwargs.items() if k != merge.arg}
        group = groups.setdefault((one.cls, repr(sorted(rest.items()))), (merge, rest, [], set()))
        group[2].append(one)
        group[3].update(items)
    for merge, rest, readers, asked in groups.values():
        if len(readers) == 1:
            planned.append((readers[0], readers))
        else:
            planned.append((Read(merge.into, {**rest, merge.into_arg: sorted(asked)}), readers))
    return planned


def keep(values: dict[tuple[type, str], Any], one: Read, readers: list[Read], answer: Any) -> None:
    """Keep `answer` of the read `one` as the value of each of its readers (their own part)."""
    if readers == [one]:
        values[one.key] = answer
        return
    for reader in readers:
        merge = MERGES[reader.cls]
        asked = reader.kwargs[merge.arg]
        values[reader.key] = (answer.get(asked) if isinstance(asked, str)
                              else {item: state for item, state in answer.items() if item in asked})


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()  # a fact of the batch that its own read must answer


def _fact_command(fact_instance: FactBase[Any], kwargs: dict[str, Any]) -> str:
    command = fact_instance.command(**kwargs) if callable(fact_instance.command) else fact_instance.command
    text = command if isinstance(command, str) else command.get_raw_value()
    required = fact_instance.requires_command(**kwargs)
    if required:
        text = f"if command -v {required} >/dev/null 2>&1; then\n{text}\nelse exit 127; fi"
    return text


class Batch(FactBase[list[Any]]):
    """Several facts in one round trip; MISSING for each one that its own read must answer."""

    @override
    def command(self, reads: tuple[Read, ...]) -> str:
        self.facts = [(one.cls(), one.kwargs) for one in reads]
        parts = []
        for index, (instance, kwargs) in enumerate(self.facts):
            # a subshell each: a fact's `exit`, `cd` or `set` stays its own; the newline before
            # the end marker keeps a last line without one apart from the marker
            parts.append(f"echo '{MARK} {index}'\n(\n{_fact_command(instance, kwargs)}\n)\n"
                         f"printf '\\n{MARK}-rc {index} %s\\n' \"$?\"")
        return "\n".join(parts)

    @override
    @staticmethod
    def default() -> list[Any]:
        return []

    @override
    def process(self, output: list[str]) -> list[Any]:
        return [self._one(index, instance, lines) for index, (instance, lines) in
                enumerate(zip([i for i, _ in self.facts], split(output, len(self.facts)), strict=True))]

    @staticmethod
    def _one(index: int, instance: FactBase[Any], lines: list[str] | None) -> Any:
        if lines is None:
            return MISSING
        try:
            return instance.process(lines) if lines else instance.default()
        except Exception:  # noqa: BLE001 - its own read reports it as pyinfra does
            return MISSING


def split(output: list[str], count: int) -> list[list[str] | None]:
    """Each fact's stdout lines (None: its command failed or was not run) from the batch's output."""
    parts: list[list[str] | None] = [None] * count
    current: list[str] | None = None
    for line in output:
        if line.startswith(f"{MARK} "):
            current = []
        elif line.startswith(f"{MARK}-rc ") and current is not None:
            _, index, rc = line.split()
            if current and current[-1] == "":
                current.pop()  # the newline the end marker put before itself
            if rc == "0" and 0 <= int(index) < count:
                parts[int(index)] = current
            current = None
        elif current is not None:
            current.append(line)
    return parts


# --- dropping the values when the rig may have changed ------------------------------------------

class Invalidate(BaseStateCallback):
    """Drops a rig's values at the start of each operation there when one before it ran a command
    (pyinfra's own operations too, which read their facts themselves)."""

    def __init__(self) -> None:
        self.pending: WeakKeyDictionary[Any, list[str]] = WeakKeyDictionary()  # started, not yet looked at

    def operation_host_start(self, state: Any, host: Any, op_hash: str) -> None:  # type: ignore[override]
        ops = state.ops.get(host, {})
        if op_hash not in ops:
            return  # not this rig's: pyinfra skips it here
        running = []
        for before in self.pending.get(host, []):
            meta = ops[before].operation_meta
            if not meta.is_complete():
                running.append(before)  # this one runs inside it (a nested operation)
                drop(host)
            elif meta.executed or meta.did_error():
                drop(host)
        self.pending[host] = [*running, op_hash]


def attach(state: Any) -> None:
    """Watch this state's operations (once per state)."""
    if not any(isinstance(handler, Invalidate) for handler in state.callback_handlers):
        state.add_callback_handler(Invalidate())


P = Callable[..., Generator[Any, None, None]]


def operation(reads: Callable[..., Iterable[Read]] | None = None, **options: Any) -> Callable[[P], Any]:
    """pyinfra's @operation, plus: `reads(**arguments)` names the facts the operation will read,
    wanted for the rig's batch when it is added at plan time; and the rig's values are dropped
    before each command it yields is executed."""

    def decorator(func: P) -> Any:
        @wraps(func)
        def commands(*args: Any, **kwargs: Any) -> Generator[Any, None, None]:
            for command in func(*args, **kwargs):
                state = ctx_state.get()
                if state is not None and state.is_executing:
                    drop(_host())
                yield command

        op = pyinfra_operation(**options)(commands)
        if reads is None:
            return op
        signature = inspect.signature(func)

        @wraps(op)
        def planned(*args: Any, **kwargs: Any) -> Any:
            own = {k: v for k, v in kwargs.items() if k in signature.parameters}
            try:
                bound = signature.bind(*args, **own)
            except TypeError:
                return op(*args, **kwargs)  # pyinfra names the mistake
            bound.apply_defaults()
            for one in reads(**bound.arguments):
                want(one.cls, **one.kwargs)
            return op(*args, **kwargs)

        return planned

    return decorator
