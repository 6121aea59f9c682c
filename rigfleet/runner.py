"""Run the deploy (every role) or read facts on a chosen set of rigs through pyinfra's Python API.

`pyinfra inventory.py deploy.py` is the operator's converge; the fleet commands (repin, status,
rollback) need the same thing for a subset of rigs with per-rig outcomes, so they drive pyinfra
through its API: one fresh State per call (pyinfra keeps per-run state globally). The roles run
through rigfleet.roles.run_roles, the one role loop; every rig's connection is watched by
rigfleet.liveness (a rig that goes dark fails its converge as LOST instead of hanging).
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import click
import gevent
import pyinfra
from pyinfra.api import BaseStateCallback, Config, Inventory, State
from pyinfra.api.connect import connect_all, disconnect_all
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.facts import get_facts
from pyinfra.api.operations import run_ops
from pyinfra.api.state import StateStage
from pyinfra.connectors.sshuserclient.client import get_host_keys
from pyinfra.context import ctx_config, ctx_host, ctx_state

from rigfleet import gateway, hostkeys, liveness, release, riglock
from rigfleet.context import context_of, pyinfra_host_data
from rigfleet.loader import Fleet
from rigfleet.roles import ROLES, run_roles


@dataclass
class RigOutcome:
    rig: str
    reachable: bool = True
    ok: bool = True
    changed: int = 0
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # `rigfleet: warning:` lines of operations that passed
    image: str | None = None  # where the serving image came from: one of IMAGE_SOURCES, None if not looked at

    @property
    def summary(self) -> str:
        if not self.reachable:
            return "unreachable" + (f" ({self.errors[-1]})" if self.errors else "")
        return "ok" if self.ok else "failed: " + "; ".join(self.errors[-3:])


def _state(fleet: Fleet, names: Iterable[str], extra: Iterable[str] = (),
           **config: Any) -> tuple[State, dict[str, RigOutcome]]:
    """`extra`: hosts connected but not deployed (the gateway, which the serving swap drains)."""
    chosen = set(names) | set(extra)
    hosts = [(rig.name, pyinfra_host_data(fleet, rig)) for rig in fleet.rigs if rig.name in chosen]
    outcomes = {name: RigOutcome(name) for name, _ in hosts}
    # No change preview: pyinfra would otherwise run every operation's fact reads twice (once to
    # preview, again at execution) and the preview pass runs host by host. `pyinfra -y` does the same.
    state = State(Inventory((hosts, {})), Config(CONNECT_TIMEOUT=config.pop("connect_timeout", 10), **config),
                  check_for_changes=False)
    hostkeys.install_hints()  # a refused host key is reported with the way to record it
    # pyinfra memoizes each known_hosts file for the life of the process; a long-running caller
    # (a re-pin's waves, the bench) must see the file as it is now: a key recorded, a rig rebuilt
    get_host_keys.cache.clear()  # type: ignore[attr-defined]
    # "No hosts remaining!" when every host failed to connect: reported per rig below.
    with contextlib.suppress(PyinfraError), _PyinfraLog() as log:
        connect_all(state)
    for host in state.active_hosts:
        liveness.arm(host.connector)  # a rig that goes dark mid-command fails it instead of hanging
    for host in state.inventory:
        if host not in state.active_hosts:
            outcomes[host.name].reachable = False
            outcomes[host.name].ok = False
            outcomes[host.name].errors += log.errors.get(host.name, [])
    return state, outcomes


Role = Callable[..., Any]

_CALLBACK_ERROR = re.compile(r"\[(\S+)\]\s+(?:nested\s+)?Unexpected error in Python callback: (.*)", re.S)


class _PyinfraLog(logging.Filter):
    """Reads pyinfra's log as it passes (a filter, so pyinfra's own output is unchanged).

    pyinfra logs the exception of a Python callback (the serving swap raises with the gate's
    verdict) and a connect error, but keeps neither as output: without this a failed rig's
    summary would be empty and an unreachable rig's would lack the reason. The traceback of
    rigfleet's own deliberate errors is dropped: the summary carries their complete message.
    """

    def __init__(self) -> None:
        super().__init__()
        self.raised: dict[str, list[str]] = {}
        self.errors: dict[str, list[str]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        text = click.unstyle(record.getMessage())
        if text.startswith("Traceback (most recent call last)"):
            return not text.strip().splitlines()[-1].startswith("rigfleet.")
        match = _CALLBACK_ERROR.match(text)
        if match:
            self.raised.setdefault(match[1], []).append(_exception_text(match[2]))
        elif record.levelno >= logging.ERROR and (host := re.match(r"\[(\S+)\]\s+(.*)", text, re.S)):
            self.errors.setdefault(host[1], []).append(host[2].strip())
        return True

    def __enter__(self) -> _PyinfraLog:
        logging.getLogger("pyinfra").addFilter(self)
        return self

    def __exit__(self, *_: object) -> None:
        logging.getLogger("pyinfra").removeFilter(self)


def _exception_text(formatted: str) -> str:
    # pyinfra formats it as ClassName('message',): keep the message
    inner = re.fullmatch(r"\w+\(\s*(['\"])(.*)\1,?\s*\)", formatted.strip(), re.S)
    return inner[2] if inner else formatted.strip()


def converge(fleet: Fleet, names: Iterable[str], roles: list[Role] | None = None,
             callbacks: Iterable[BaseStateCallback] = ()) -> dict[str, RigOutcome]:
    """Run the roles (default: all) on these rigs in parallel; per-rig outcome, a failing rig never
    stops the others, a connection lost mid-converge is named as such (rigfleet.liveness)."""
    chosen = list(ROLES if roles is None else roles)
    wanted = set(names)
    # the serving swap drains a rig at the fleet's gateway over the gateway host's connection
    extra = [rig.name for rig in gateway.gateway_rigs(fleet) if rig.name not in wanted]
    state, outcomes = _state(fleet, wanted, extra)
    for callback in [liveness.DeadPeerDetection(), *callbacks]:
        state.add_callback_handler(callback)
    log = _PyinfraLog()
    try:
        if state.active_hosts:
            contexts = {
                rig.name: context_of(fleet, release.resolve(fleet, rig))
                for rig in fleet.rigs if rig.name in outcomes
            }

            def deploy_rig() -> None:
                from pyinfra import host

                if host.name not in wanted:  # connected for the drain only
                    return
                if not riglock.hold_or_refuse(host):  # another deploy is converging this rig
                    return
                run_roles(contexts[host.name], chosen)

            _prepare_in_parallel(state, deploy_rig)
            try:
                with log, liveness.watching():
                    run_ops(state)
            except PyinfraError as exc:  # raised when no host is left; per-host errors are below
                logging.getLogger(__name__).debug("run_ops: %s", exc)
        _collect(state, outcomes, log.raised)
    finally:
        for host in state.activated_hosts:
            riglock.release(host)  # this process may converge the rig again (repin, rollback, tests)
        disconnect_all(state)
    for name in extra:
        outcomes.pop(name, None)
    for outcome in outcomes.values():
        if outcome.reachable and not outcome.ok:
            outcome.errors = liveness.name_losses(outcome.errors)
    return outcomes


def _prepare_in_parallel(state: State, deploy: Callable[[], None]) -> None:
    """Run the deploy code of every host at once, one greenlet each, as `pyinfra deploy.py` does.

    The roles read facts while they decide which operations to add; pyinfra's add_deploy runs
    them host after host, so that read time would add up with every rig in the call.

    The operations get the identities `pyinfra deploy.py` gives them: the line numbers of the
    calls (pyinfra's CLI mode, for the planning only). Its API mode numbers each host's
    operations in the order they were added, so one rig's fifth operation and another's are
    one operation whatever they are, and an operation the roles share on purpose is not:
    rigfleet.roles.model_weights relies on the shared one to run the other rigs' fetch from
    the fleet cache after the cache host's download, in the fleet commands as in the CLI.
    """

    def prepare(host: Any) -> BaseException | None:
        try:
            with ctx_config.use(state.config.copy()), ctx_host.use(host):
                deploy()
        except Exception as exc:  # re-raised below, in the caller's greenlet
            return exc
        return None

    state.set_stage(StateStage.Prepare)
    was_cli, pyinfra.is_cli = pyinfra.is_cli, True
    try:
        with ctx_state.use(state):
            greenlets = [state.pool.spawn(prepare, host) for host in state.inventory.get_active_hosts()]
            gevent.joinall(greenlets)
    finally:
        pyinfra.is_cli = was_cli
    for greenlet in greenlets:
        if isinstance(greenlet.value, BaseException):
            raise greenlet.value


# What the image operations say on the rig (operations.image) -> where the rig got its image.
BUILT, PULLED, PRESENT = "built here", "pulled from the fleet registry", "already present"
IMAGE_SAID = ((re.compile(r"^rigfleet: image \S+: built \("), BUILT),
              (re.compile(r"^rigfleet: image \S+: pulled from the fleet registry"), PULLED))
BUILD_OP = "Build "  # roles.vllm_image names its last image operation `Build TAG` (after `role | `)


def _image_source(meta: Any) -> str | None:
    try:
        lines = meta.stdout_lines
    except (AssertionError, RuntimeError):
        return None
    for line in lines:
        for said, source in IMAGE_SAID:
            if said.match(line.strip()):
                return source
    return None


def _collect(state: State, outcomes: dict[str, RigOutcome], raised: dict[str, list[str]] | None = None) -> None:
    for host in state.inventory:
        outcome = outcomes[host.name]
        if not outcome.reachable:
            continue
        for op_hash, op_data in state.ops[host].items():
            meta = op_data.operation_meta
            if not meta.is_complete():
                continue
            if meta.did_error():
                outcome.ok = False
                detail = _output(meta) or "; ".join((raised or {}).pop(host.name, [])) or "no output"
                outcome.errors.append(f"{', '.join(sorted(state.op_meta[op_hash].names))}: {detail}")
            else:
                outcome.warnings += _warnings(meta)
                if meta.did_change():
                    outcome.changed += 1
                    outcome.image = _image_source(meta) or outcome.image
                names = state.op_meta[op_hash].names
                if outcome.image is None and any(n.rsplit(" | ", 1)[-1].startswith(BUILD_OP) for n in names):
                    outcome.image = PRESENT  # the build step ran and neither pulled nor built: it was there
        if host in state.failed_hosts:
            outcome.ok = False


def _warnings(meta: Any) -> list[str]:
    # a passing operation's output is not shown by pyinfra; its warnings (e.g. a fleet registry
    # outage, the image built here instead) must still reach the operator
    try:
        lines = meta.stderr_lines
    except (AssertionError, RuntimeError):
        return []
    return [line.strip() for line in lines if "rigfleet: warning:" in line]


def _output(meta: Any) -> str:
    try:
        text = meta.stderr or meta.stdout
    except (AssertionError, RuntimeError):  # no output was captured (e.g. a Python callback raised)
        text = ""
    return text.strip()[-300:]


@contextlib.contextmanager
def connected(fleet: Fleet, names: Iterable[str]) -> Iterator[tuple[State, dict[str, RigOutcome]]]:
    """Connected pyinfra hosts for these rigs (unreachable ones reported in the outcomes), then disconnect."""
    state, outcomes = _state(fleet, names)
    try:
        yield state, outcomes
    finally:
        disconnect_all(state)


def read_facts(fleet: Fleet, names: Iterable[str], fact: type, **kwargs: Any) -> tuple[dict[str, Any],
                                                                                         dict[str, RigOutcome]]:
    """One fact from each reachable rig (read-only); unreachable rigs are reported, not skipped."""
    state, outcomes = _state(fleet, names)
    try:
        results = get_facts(state, fact, kwargs=kwargs) if state.active_hosts else {}
        return {host.name: value for host, value in results.items()}, outcomes
    finally:
        disconnect_all(state)
