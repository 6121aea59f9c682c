"""Swap a serving release in behind the health gate, roll back on failure, keep the ledger.

`release(spec)` yields NOTHING when the ledger's current release is the desired one and its
container runs and is not unhealthy (a second deploy reports no change and leaves the container
alone). Otherwise it yields one FunctionCommand that, on that rig only:

1. resolves the secrets on the control machine and writes the release into
   /opt/rigfleet/releases/<id>/ (compose.yaml, 0600 env file, release.json, Dockerfile and
   entrypoint for provenance) through stdin, so no secret is ever in a process argument or log;
2. validates it with `docker compose config -q` and refuses unless the image is on the rig,
   before anything is stopped;
3. stops the serving release (`docker compose down` in its dir: containers are recreated,
   never stop/started, since a stop/start re-runs Genesis on already-patched files), starts the
   new one with `up -d --force-recreate` and runs the gate ON the rig (rigfleet/gate/probe.py);
4. passed: points /opt/rigfleet/current at it and records it; failed: stops it, starts the
   previous release again, waits for it to pass the basic gate, records the failed attempt and
   raises with the engine's last log lines (which fails this rig and no other).

Downtime is measured on the rig's clock: previous release stopped -> new release answered the
gate's chat completion. `rollback()` runs the same swap towards the ledger's previous release.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gevent.lock import BoundedSemaphore
from pyinfra import host as pyinfra_host
from pyinfra import logger
from pyinfra.api import FunctionCommand, StringCommand, operation
from pyinfra.api.host import Host
from pyinfra.api.state import State

from rigfleet import gate, gateway, ledger, rigpython
from rigfleet.facts import cache
from rigfleet.facts.serving import RELEASE_LABEL, ServingState, parse_state
from rigfleet.rigstate import (
    CURRENT_LINK,
    GATE_DIR,
    LEDGER_PATH,
    RELEASES_DIR,
    ROOT,
    Ledger,
    ReleaseRecord,
    release_dir,
    release_record_path,
)

q = shlex.quote

ENV_FILE = "rigfleet.env"
# Connector arguments that decide who runs a command; everything else stays per command.
AUTH_KEYS = ("_sudo", "_sudo_user", "_use_sudo_login", "_sudo_password", "_preserve_sudo_env", "_su_user",
             "_use_su_login", "_preserve_su_env", "_su_shell", "_su_password", "_doas", "_doas_user", "_dzdo",
             "_dzdo_user")
UP_FAILED = "rigfleet: compose up failed"  # start_and_gate's stdout when the gate never ran
SSH_MARGIN_S = 300  # the probe bounds itself; this only guards against a hung SSH channel


class ServingError(Exception):
    """The swap failed on this rig; raised from the FunctionCommand, so only this rig fails."""


class SecretError(ServingError):
    pass


@dataclass(frozen=True)
class SecretSource:
    """Where the control machine reads a secret: an environment variable or a file (absolute)."""

    field: str  # the Rig field (api_key, hf_token)
    env: str | None = None
    path: str | None = None

    def read(self) -> str:
        if self.env is not None:
            value = os.environ.get(self.env)
            if value is None:
                raise SecretError(f"{self.field}: environment variable {self.env} is not set on the control machine")
        else:
            assert self.path is not None
            try:
                value = Path(self.path).read_text(encoding="utf-8")
            except OSError as exc:
                raise SecretError(f"{self.field}: cannot read {self.path} ({exc.strerror})") from None
        value = value.strip()
        if not value or "\n" in value or "\r" in value:
            raise SecretError(f"{self.field}: the secret must be one non-empty line")
        return value


class SecretStdin:
    """A secret as an op's `_stdin`, read from its source only when pyinfra writes it to the rig.

    pyinfra keeps an op's global arguments and prints them (`--debug-operations`, `--json`), via
    repr/to_json for objects it does not know; a str (or a StringIO) there is printed verbatim.
    This object is printed as its reference only, and pyinfra's write_stdin calls readlines()."""

    def __init__(self, source: SecretSource):
        self.source = source

    def readlines(self) -> list[str]:
        return [self.source.read() + "\n"]

    def __iter__(self) -> Iterator[str]:
        return iter(self.readlines())

    def __repr__(self) -> str:
        origin = f"env {self.source.env}" if self.source.env else f"file {self.source.path}"
        return f"<secret {self.source.field} from {origin}>"

    to_json = __repr__


@dataclass(frozen=True)
class DrainSpec:
    """Where the rig sits in the gateway: the gateway's host, the backends holding this rig's server
    (named after the rig), how long in-flight requests may take to finish."""

    gateway: str  # the pyinfra host name of the gateway
    server: str
    backends: tuple[str, ...]
    timeout_s: int
    poll_s: float = 0.5


# Every rig of a wave drains over the gateway host's one SSH connection, each command a session on
# it, and sshd refuses sessions beyond its MaxSessions (default 10) per connection ("open failed:
# Connect failed", seen with 16 rigs at once): at most this many runtime-API commands at a time.
GATEWAY_SESSIONS = 4
_gateway_sessions: dict[str, BoundedSemaphore] = {}


def gateway_session(name: str) -> BoundedSemaphore:
    return _gateway_sessions.setdefault(name, BoundedSemaphore(GATEWAY_SESSIONS))


class Drain:
    """The rig's servers in the gateway, over the gateway host's SSH connection (runtime API)."""

    drained = False  # set once the gateway took the rig out

    def __init__(self, spec: DrainSpec, remote: Remote, state: State):
        self.spec = spec
        self.rig = remote
        gateway_host = state.inventory.get_host(spec.gateway, None)
        active = gateway_host is not None and gateway_host in state.active_hosts
        self.gateway = Remote(gateway_host, remote.auth) if active else None

    def _runtime(self, command: str) -> str:
        assert self.gateway is not None
        with gateway_session(self.spec.gateway):
            return self.gateway.must(gateway.runtime_command(command), f"gateway runtime API: {command}")

    def set(self, state: str) -> None:
        for backend in self.spec.backends:
            self._runtime(gateway.set_state(backend, self.spec.server, state))

    def sessions(self) -> int:
        rows = gateway.parse_stat(self._runtime("show stat"))
        return sum(int(rows.get((b, self.spec.server), {}).get("scur") or 0) for b in self.spec.backends)

    def running(self, base_url: str | None) -> int:
        """The engine's running-requests gauge; an engine that does not answer has none."""
        if not base_url:
            return 0
        gauge = gateway.facts()["engine"]["running_gauge"]
        ok, out, _ = self.rig.run(rigpython.command(ENGINE_RUNNING, base_url, gauge))
        try:
            return int(out.strip()) if ok else 0
        except ValueError:
            return 0

    def out(self, host: Host, base_url: str | None) -> float | None:
        """Drain, wait (bounded) until nothing is in flight, then maint. Seconds it took, or None
        when the gateway cannot be reached (the swap goes on: its health checks take the rig out)."""
        if self.gateway is None:
            _say(host, f"gateway {self.spec.gateway} not connected: swapping without a drain", fg="yellow")
            return None
        started = time.monotonic()
        try:
            self.set("drain")
        except ServingError as exc:
            # HAProxy not (yet) running there: the first deploy of a gateway onto a serving fleet
            # swaps the rigs before the gateway role ran; no client reaches a gateway that is down
            _say(host, f"gateway {self.spec.gateway} does not answer ({exc}): swapping without a drain",
                 fg="yellow")
            return None
        self.drained = True
        deadline = started + self.spec.timeout_s
        sessions = running = -1
        while True:
            sessions, running = self.sessions(), self.running(base_url)
            if (sessions == 0 and running == 0) or time.monotonic() >= deadline:
                break
            time.sleep(self.spec.poll_s)
        self.set("maint")
        took = time.monotonic() - started
        if sessions or running:
            _say(host, f"drain timed out after {took:.1f} s ({sessions} sessions at the gateway, {running} "
                       "requests running): stopping anyway", fg="yellow")
        else:
            _say(host, f"drained from the gateway in {took:.1f} s (nothing in flight)")
        return took

    def back(self, host: Host) -> None:
        """Ready in the gateway. A rig this swap drained must get back (or the swap fails: a rollout
        that only takes rigs out empties the gateway); one it did not is put in where HAProxy answers."""
        if self.gateway is None:
            return
        try:
            self.set("ready")
        except ServingError as exc:
            if self.drained:
                raise
            _say(host, f"gateway {self.spec.gateway} does not answer ({exc}): its health checks take the "
                       "rig in once it runs", fg="yellow")
            return
        _say(host, "back in the gateway", fg="green")


# Rig-side, stdlib only: the sum of one gauge of the engine's /metrics (prometheus text format).
ENGINE_RUNNING = """
import sys, urllib.request
try:
    text = urllib.request.urlopen(sys.argv[1] + "/metrics", timeout=5).read().decode()
except Exception:
    print(0)
    sys.exit(0)
total = 0.0
for line in text.splitlines():
    if line.startswith("#"):
        continue
    name = line.split("{", 1)[0].split(" ", 1)[0]
    if name == sys.argv[2]:
        total += float(line.rsplit(" ", 1)[1])
print(int(total))
"""


@dataclass(frozen=True, repr=False, eq=False)
class ReleaseSpec:
    """Everything the swap needs, computed at plan time from the rig's model. Holds no secret:
    `render_env(secrets)` builds the env file from values resolved at execute time."""

    rig: str
    release_id: str
    image: str
    files: dict[str, str]  # non-secret files of the release dir, by name
    meta: ReleaseRecord  # release.json: what the gate and the ledger need
    render_env: Callable[[dict[str, str]], str]
    secrets: tuple[SecretSource, ...] = ()
    cache_dirs: tuple[str, ...] = ()
    level: str = "basic"
    timeout_s: int = 600
    drain: DrainSpec | None = None  # the rig is behind the fleet's gateway: drained around the swap

    def __repr__(self) -> str:  # pyinfra prints commands' args with -vv: keep it short and secret-free
        return f"ReleaseSpec({self.rig}, {self.release_id})"

    @property
    def release_dir(self) -> str:
        return release_dir(self.release_id)

    def resolve_secrets(self) -> dict[str, str]:
        return {source.field: source.read() for source in self.secrets}

    def env_text(self, secrets: dict[str, str]) -> str:
        return self.render_env(secrets)


def env_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def is_current(spec: ReleaseSpec, observed: dict[str, Any], want_env_sha256: str | None) -> tuple[bool, str]:
    """(True, why) when nothing needs doing: the ledger's current release is the desired one, its
    container runs and is not unhealthy, no other release runs, and the env file is unchanged."""
    current = ledger.current_id(ledger.load(observed.get("ledger"), spec.rig))
    if current != spec.release_id:
        return False, f"ledger's current release is {current or 'none'}"
    containers = observed.get("containers") or []
    mine = [c for c in containers if c.get("release") == spec.release_id]
    if not any(c.get("status") == "running" for c in mine):
        return False, f"release {spec.release_id} is not running"
    if any(c.get("health") == "unhealthy" for c in mine):
        return False, f"release {spec.release_id} is unhealthy"
    if any(c.get("release") != spec.release_id and c.get("status") == "running" for c in containers):
        return False, "another release is running too"
    if want_env_sha256 is None or observed.get("env_sha256") != want_env_sha256:
        return False, "the env file (secrets) changed"
    return True, f"release {spec.release_id} is current and running"


class Auth(dict[str, Any]):
    """The op's auth arguments; its repr names the keys only (a sudo password may be among them and
    pyinfra prints a FunctionCommand's args in debug output)."""

    def __repr__(self) -> str:
        return f"Auth({', '.join(sorted(self))})"


def auth_arguments(global_arguments: dict[str, Any] | None) -> Auth:
    return Auth({k: v for k, v in (global_arguments or {}).items() if k in AUTH_KEYS and v not in (None, False, "")})


@cache.operation(reads=lambda spec, **_: [cache.reading(ServingState, release_id=spec.release_id)],
                 is_idempotent=True)
def release(spec: ReleaseSpec) -> Generator[FunctionCommand, None, None]:
    """Serve `spec`: nothing when it is current and healthy, else one gated swap (see module doc)."""
    observed = cache.fact(ServingState, release_id=spec.release_id)
    try:
        want = env_digest(spec.env_text(spec.resolve_secrets()))
    except SecretError:
        want = None  # the swap reports the missing secret, failing this rig only
    current, why = is_current(spec, observed, want)
    if current:
        pyinfra_host.noop(why)
        return
    auth = auth_arguments(pyinfra_host.current_op_global_arguments)  # type: ignore[arg-type]
    yield FunctionCommand(apply_release, (spec, auth), {})


@operation(is_idempotent=False)
def rollback(rig: str, level: str = "basic", timeout_s: int = 600,
             drain: DrainSpec | None = None) -> Generator[FunctionCommand, None, None]:
    """Return the rig to the ledger's previous release through the same gate (always a swap)."""
    auth = auth_arguments(pyinfra_host.current_op_global_arguments)  # type: ignore[arg-type]
    yield FunctionCommand(apply_rollback, (rig, level, timeout_s, auth, drain), {})


# --- execution (on the control machine, one rig) -------------------------------------------------


@dataclass
class Remote:
    """Commands on one rig as the deploy user (with the op's sudo settings)."""

    host: Host
    auth: dict[str, Any] = field(default_factory=dict)

    def run(self, command: str, *, stdin: str | None = None, timeout: float | None = None) -> tuple[bool, str, str]:
        kwargs: dict[str, Any] = dict(self.auth)
        if stdin is not None:
            kwargs["_stdin"] = stdin
        if timeout is not None:
            kwargs["_timeout"] = int(timeout)
        ok, output = self.host.run_shell_command(StringCommand(command), **kwargs)
        return bool(ok), "\n".join(output.stdout_lines), "\n".join(output.stderr_lines)

    def must(self, command: str, what: str, **kwargs: Any) -> str:
        ok, out, err = self.run(command, **kwargs)
        if not ok:
            raise ServingError(f"{what}: {(err or out).strip()[-600:]}")
        return out

    def write(self, path: str, text: str, mode: str) -> None:
        """Atomic write through stdin: temp file (0600 from mktemp) in the same dir, chmod, rename."""
        directory = os.path.dirname(path)
        self.must(
            f'set -e; t=$(mktemp {q(directory)}/.rigfleet.XXXXXX); cat > "$t"; chmod {mode} "$t"; '
            f'mv -f "$t" {q(path)}',
            f"writing {path}", stdin=text if text.endswith("\n") else text + "\n")

    def observe(self, release_id: str = "") -> dict[str, Any]:
        ok, out, _ = self.run(ServingState().command(release_id))
        return parse_state(out.splitlines()) if ok else parse_state([])

    def compose(self, release_dir: str, args: str, what: str) -> str:
        return self.must(f"cd {q(release_dir)} && docker compose {args}", what)

    def start_and_gate(self, release_dir: str, level: str, timeout_s: int, what: str) -> dict[str, Any]:
        """`compose up` of the release, then its gate, in ONE remote command: the gate starts
        probing as soon as the container exists, with no SSH round trip inside the downtime.
        A failed `up` raises as `compose` does (the gate never ran)."""
        up = f"cd {q(release_dir)} && docker compose up -d --force-recreate --remove-orphans"
        return self.gate(release_dir, level, timeout_s, before=up, what=what)

    def gate(self, release_dir: str, level: str, timeout_s: int, before: str = "",
             what: str = "") -> dict[str, Any]:
        budget = timeout_s * (2 if level == "full" else 1) + SSH_MARGIN_S
        command = f"python3 {GATE_DIR}/probe.py {q(release_dir)} --level {q(level)} --timeout {int(timeout_s)}"
        if before:  # its output to stderr: stdout is the gate's JSON, or the marker that `before` failed
            command = f"( {before} ) >&2 || {{ echo {q(UP_FAILED)}; exit 1; }}; {command}"
        try:
            _, out, err = self.run(command, timeout=budget)
        except Exception as exc:  # a hung channel or a dropped connection is a failed gate, not a crash
            return {"ok": False, "level": level, "checks": [
                {"name": "gate", "ok": False, "warning": False, "detail": f"{type(exc).__name__}: {exc}"}]}
        if before and out.strip() == UP_FAILED:
            raise ServingError(f"{what}: {err.strip()[-600:]}")
        result = gate.parse_output(out)
        if not out.strip() and err.strip():
            result["checks"][0]["detail"] += " | " + err.strip()[-300:]
        return result

    def log_tail(self, container: str, lines: int = 40) -> list[str]:
        _, out, _ = self.run(f"docker logs --tail {lines} {q(container)} 2>&1")
        return out.splitlines()[-lines:]


def _say(host: Host, message: str, **style: Any) -> None:
    host.log_styled(message, log_func=logger.warning if style.get("fg") == "red" else logger.info, **style)


def install_gate(remote: Remote) -> None:
    remote.must(f"mkdir -p {GATE_DIR}", "creating the gate dir")
    for name, text in gate.rig_files().items():
        remote.write(f"{GATE_DIR}/{name}", text, "0644")


def write_release(remote: Remote, spec: ReleaseSpec, env_text: str) -> None:
    dirs = " ".join(q(d) for d in (ROOT, RELEASES_DIR, GATE_DIR, os.path.dirname(LEDGER_PATH), *spec.cache_dirs))
    remote.must(f"mkdir -p {dirs} && install -d -m 0750 {q(spec.release_dir)}", "creating the release dirs")
    for name, text in spec.files.items():
        remote.write(f"{spec.release_dir}/{name}", text, "0640")
    remote.write(f"{spec.release_dir}/{ENV_FILE}", env_text, "0600")
    record = json.dumps(spec.meta.to_json(), indent=2, sort_keys=True)
    remote.write(release_record_path(spec.release_id), record, "0644")
    install_gate(remote)


def refuse_unless_ready(remote: Remote, release_dir: str, image: str) -> None:
    """Checks that must pass before anything is stopped."""
    remote.must(f"cd {q(release_dir)} && docker compose config -q", f"docker compose config rejected {release_dir}")
    ok, _, _ = remote.run(f"docker image inspect {q(image)} >/dev/null 2>&1")
    if not ok:
        raise ServingError(f"image {image} is not on the rig (the vllm_image role builds it): refusing to stop "
                           "the serving release")


def link_current(remote: Remote, release_dir: str) -> None:
    tmp = f"{ROOT}/.current.tmp"
    remote.must(f"ln -sfn {q(release_dir)} {q(tmp)} && mv -T {q(tmp)} {q(CURRENT_LINK)}",
                f"pointing {CURRENT_LINK} at {release_dir}")


def read_meta(remote: Remote, release_id: str) -> ReleaseRecord | None:
    ok, out, _ = remote.run(f"cat {q(release_record_path(release_id))}")
    if not ok:
        return None
    try:
        return ReleaseRecord.model_validate_json(out)
    except ValueError:  # not JSON, or not a release record (pydantic's ValidationError is one)
        return None


def stop_others(remote: Remote, observed: dict[str, Any], keep: str) -> tuple[float | None, list[str]]:
    """Stop every rigfleet container not of release `keep` (compose down in its dir when it has
    one). Returns (the rig's clock when the last one stopped, None when none was running; what was
    stopped)."""
    was_running = False
    stopped: list[str] = []
    by_release: dict[str, list[dict[str, Any]]] = {}
    for c in observed.get("containers") or []:
        if c.get("release") != keep:
            by_release.setdefault(str(c.get("release")), []).append(c)
    stopped_at: float | None = None
    for rid, containers in by_release.items():
        was_running |= any(c.get("status") in ("running", "restarting") for c in containers)
        directory = release_dir(rid)
        ids = " ".join(q(c["id"]) for c in containers)
        # one round trip per release: compose down in its dir, or (its dir is gone) remove the
        # containers by id; then the rig's clock, the moment it stopped serving (downtime's start)
        out = remote.must(f"if test -f {q(directory)}/compose.yaml; then cd {q(directory)} && docker compose down; "
                          f"else docker rm -f {ids}; fi >&2 && date +%s.%N", f"stopping release {rid}")
        stopped_at = float(out.split()[-1])
        stopped.append(rid)
    return (stopped_at if was_running else None), stopped


@dataclass
class Swap:
    """One swap on one rig: towards `target` (a release dir with release.json), back to
    `fallback` on failure."""

    host: Host
    remote: Remote
    rig: str
    kind: str  # deploy | rollback | recover
    target: ReleaseRecord  # the target's release.json
    level: str
    timeout_s: int
    reason: str | None = None  # why a recovery was needed (what the rig showed)
    drain: Drain | None = None  # out of the gateway before the stop, back after the gate passes

    @property
    def target_id(self) -> str:
        return self.target.release_id

    @property
    def target_dir(self) -> str:
        return release_dir(self.target_id)

    def run(self, book: Ledger, fallback: str | None, started: str) -> None:
        remote, host = self.remote, self.host
        record = ledger.attempt(self.kind, self.target, started, from_release=fallback)
        if self.reason:
            record = record.model_copy(update={"reason": self.reason})
        try:
            refuse_unless_ready(remote, self.target_dir, str(self.target.image))
        except ServingError as exc:
            remote.write(LEDGER_PATH, ledger.dumps(ledger.record(book, ledger.finish(record, "refused",
                                                                                     error=str(exc)))), "0644")
            raise
        observed = remote.observe(self.target_id)
        stopped_at: float | None = None
        if self.drain is not None and _serving(observed):
            previous = read_meta(remote, fallback) if fallback else None
            self.drain.out(host, str(previous.base_url) if previous and previous.base_url else None)
        try:  # from here on, whatever goes wrong ends with the fallback started again
            stopped_at, stopped = stop_others(remote, observed, keep=self.target_id)
            if stopped:
                _say(host, f"stopped release {', '.join(stopped)}")
            result = remote.start_and_gate(self.target_dir, self.level, self.timeout_s,
                                           f"starting release {self.target_id}")
        except Exception as exc:  # noqa: BLE001 - a dropped SSH channel must still restore the fallback
            result = {"ok": False, "level": self.level, "checks": [
                {"name": "swap", "ok": False, "warning": False, "detail": f"{type(exc).__name__}: {exc}"}]}
        downtime = _downtime(stopped_at, result)
        if result.get("ok"):
            link_current(remote, self.target_dir)
            record = ledger.finish(record, "passed", gate=result, downtime_s=downtime)
            book = ledger.record(book, record, became_current=ledger.entry(self.target, result, downtime))
            remote.write(LEDGER_PATH, ledger.dumps(book), "0644")
            for warning in gate.warnings(result):
                _say(host, f"gate warning: {warning}", fg="yellow")
            _say(host, f"release {self.target_id} serving ({self.kind}); gate {self.level} "
                       f"{gate.summary(result)}; KV pool {result.get('kv_pool_tokens')} tokens", fg="green")
            _say(host, "downtime: " + (f"{downtime:.1f} s (previous stopped -> new healthy)" if downtime is not None
                                      else "none (no release was serving)"), fg="green")
            if self.drain is not None:
                self.drain.back(host)  # only now: a failed gate leaves the rig out of the gateway
            return
        self.fail(book, record, result, fallback, stopped_at)

    def fail(self, book: Ledger, record: ledger.Attempt, result: dict[str, Any], fallback: str | None,
             stopped_at: float | None) -> None:
        remote, host = self.remote, self.host
        container = str(self.target.container_name)
        tail = [str(line) for line in result.get("log_tail") or []] or remote.log_tail(container)
        _say(host, f"release {self.target_id} failed the {self.level} gate: {gate.summary(result)}", fg="red")
        remote.run(f"cd {q(self.target_dir)} && docker compose down")
        restored, restore_ok, downtime = None, None, None
        if fallback:
            restored = fallback
            fallback_dir = release_dir(fallback)
            try:
                again = remote.start_and_gate(fallback_dir, "basic", self.timeout_s, f"restarting {fallback}")
            except ServingError as exc:
                again = {"ok": False, "checks": [{"name": "restart", "ok": False, "detail": str(exc)}]}
            restore_ok = bool(again.get("ok"))
            downtime = _downtime(stopped_at, again)
            if restore_ok:
                link_current(remote, fallback_dir)
        record = ledger.finish(record, "failed", gate=result, downtime_s=downtime, log_tail=tail,
                               error=gate.summary(result), restored=restored, restore_ok=restore_ok)
        back = None  # the ledger follows what serves: a failed recovery's fallback is the previous release
        if restore_ok and fallback and fallback != ledger.current_id(book):
            back = ledger.entry(read_meta(remote, fallback) or ReleaseRecord(release_id=fallback), again, downtime)
        remote.write(LEDGER_PATH, ledger.dumps(ledger.record(book, record, became_current=back)), "0644")
        if fallback is None:
            after = "no previous release to return to; nothing is serving"
        elif restore_ok:
            after = f"previous release {fallback} is serving again (downtime {downtime:.1f} s)" if downtime \
                else f"previous release {fallback} is serving again"
        else:
            after = f"previous release {fallback} did NOT come back healthy: {gate.summary(again)}"
        _say(host, after, fg="yellow" if restore_ok else "red")
        _say(host, f"engine log (last lines) of {self.target_id}:", fg="red")
        for line in tail[-20:]:
            _say(host, f"    {line}")
        raise ServingError(f"{self.rig}: release {self.target_id} failed the {self.level} gate "
                           f"({gate.summary(result)}); {after}")


def _serving(observed: dict[str, Any]) -> bool:
    return any(c.get("status") in ("running", "restarting") for c in observed.get("containers") or [])


def _downtime(stopped_at: float | None, result: dict[str, Any]) -> float | None:
    ready = result.get("ready_epoch")
    if stopped_at is None or not isinstance(ready, (int, float)):
        return None
    return max(0.0, float(ready) - stopped_at)


def serving_release(book: Ledger, observed: dict[str, Any], remote: Remote, exclude: str) -> str | None:
    """The release to return to on failure: the ledger's current one, else the running container's,
    else (the current one is the target: a recovery) the ledger's previous one, the last good before."""
    candidates = [ledger.current_id(book)]
    candidates += [c.get("release") for c in observed.get("containers") or [] if c.get("status") == "running"]
    candidates.append(ledger.previous_id(book))
    for rid in candidates:
        if rid and rid != exclude and read_meta(remote, rid) is not None:
            return str(rid)
    return None


def apply_release(state: State, host: Host, spec: ReleaseSpec, auth: dict[str, Any]) -> None:
    """The FunctionCommand of `release`: write, validate, swap, gate, record (module doc)."""
    remote = Remote(host, auth)
    started = ledger.now()
    env_text = spec.env_text(spec.resolve_secrets())  # before anything is touched
    observed = remote.observe(spec.release_id)
    book = ledger.load(observed.get("ledger"), spec.rig)
    write_release(remote, spec, env_text)
    fallback = serving_release(book, observed, remote, exclude=spec.release_id)
    reason = crashed(book, observed, spec.release_id)
    if reason:
        _say(host, f"{reason}: restarting it through the {spec.level} gate; on failure "
                   + (f"the previous release {fallback} is restored" if fallback else "nothing is left serving"),
             fg="yellow")
    drain = Drain(spec.drain, remote, state) if spec.drain is not None else None
    Swap(host, remote, spec.rig, "recover" if reason else "deploy", spec.meta, spec.level, spec.timeout_s,
         reason, drain).run(book, fallback, started)


def crashed(book: Ledger, observed: dict[str, Any], release_id: str) -> str | None:
    """Why the ledger's current release, the one to serve, needs recovering (its engine died or
    turned unhealthy after its gate passed), or None when this is not a recovery."""
    if ledger.current_id(book) != release_id:
        return None
    mine = [c for c in observed.get("containers") or [] if c.get("release") == release_id]
    if not mine:
        return f"release {release_id} passed its gate but has no container any more"
    if not any(c.get("status") == "running" for c in mine):
        states = ", ".join(f"{c.get('status')}, {c.get('restart_count', 0)} restarts" for c in mine)
        return f"release {release_id} passed its gate but its engine is not running ({states})"
    if any(c.get("health") == "unhealthy" for c in mine):
        return f"release {release_id} passed its gate but its engine is unhealthy"
    return None


def apply_rollback(state: State, host: Host, rig: str, level: str, timeout_s: int, auth: dict[str, Any],
                   drain_spec: DrainSpec | None = None) -> None:
    """The FunctionCommand of `rollback`: swap to the ledger's previous release, same gate."""
    remote = Remote(host, auth)
    started = ledger.now()
    observed = remote.observe()
    book = ledger.load(observed.get("ledger"), rig)
    target_id = ledger.previous_id(book)
    if target_id is None:
        raise ServingError(f"{rig}: the ledger has no previous release to roll back to")
    meta = read_meta(remote, target_id)
    if meta is None:
        raise ServingError(f"{rig}: release {target_id} is not on the rig any more ({release_dir(target_id)})")
    install_gate(remote)  # the gate of this rigfleet version, whatever wrote the release
    fallback = serving_release(book, observed, remote, exclude=target_id)
    drain = Drain(drain_spec, remote, state) if drain_spec is not None else None
    Swap(host, remote, rig, "rollback", meta, level, timeout_s, drain=drain).run(book, fallback, started)


__all__ = ["RELEASE_LABEL", "DrainSpec", "ReleaseSpec", "SecretSource", "ServingError", "apply_release",
           "apply_rollback", "is_current", "release", "rollback"]
