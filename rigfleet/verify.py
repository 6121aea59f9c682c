"""`rigfleet verify`: the verify ladder on serving rigs, on demand, without changing what serves.

It runs the swap gate's own probe (rigfleet/gate/probe.py with checks.py: one implementation)
against each rig's current release, ON the rig (the API may bind where only the rig reaches it),
every rig at once, one thread each. The probe's files travel on stdin into a temp dir that is
removed afterwards, so a rig deployed before a level existed is still verified by this version.
Every loop of the probe is bounded in requests (its settings) and in time (`--timeout` per
phase); the SSH read is bounded too. The verdict is appended to the rig's ledger
(`verifications`); nothing else on the rig changes.
"""

from __future__ import annotations

import base64
import contextlib
import json
import shlex
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from rigfleet import gate, ledger, rigstate
from rigfleet.errors import InputError, Problem
from rigfleet.gate import probe

LEVELS = probe.LEVELS
DEFAULT_TIMEOUT_S = 600  # per phase, as the swap gate's default
MAX_TIMEOUT_S = 3600
SSH_MARGIN_S = 120
# Phases the probe runs per level, each within --timeout: readiness, then full, stress or soak checks.
PHASES = {"smoke": 1, "full": 2, "stress": 3, "soak": 3}
# Module attributes, read at call time (tests point them at a local release).
RELEASE_DIR = rigstate.CURRENT_LINK
LEDGER_PATH = rigstate.LEDGER_PATH

q = shlex.quote

# Runs on the rig (stdlib only): the probe's files from stdin into a temp dir, the probe, cleanup.
_BOOT = r'''
import json, os, shutil, subprocess, sys, tempfile
spec = json.loads(sys.stdin.read())
d = tempfile.mkdtemp(prefix="rigfleet-verify-")
try:
    for name, text in spec["files"].items():
        with open(os.path.join(d, name), "w", encoding="utf-8") as f:
            f.write(text)
    code = subprocess.call([sys.executable, os.path.join(d, "probe.py"), *spec["args"]], stdin=subprocess.DEVNULL)
finally:
    shutil.rmtree(d, ignore_errors=True)
sys.exit(code)
'''
BOOT_COMMAND = "python3 -c " + q("import base64; exec(base64.b64decode('"
                                 + base64.b64encode(_BOOT.encode()).decode() + "').decode())")


class Exec(Protocol):
    """One command on one rig: (command, stdin, called with each stderr line, timeout) -> (exit code, stdout)."""

    def __call__(self, command: str, stdin: str, on_line: Callable[[str], None], timeout: float) -> tuple[int, str]:
        ...


@dataclass
class RigResult:
    rig: str
    level: str
    ok: bool = False
    reachable: bool = True
    release_id: str | None = None
    seconds: float = 0.0
    checks: list[dict[str, Any]] = field(default_factory=list)
    acceptance_length: float | None = None
    recorded: bool = False  # appended to the rig's ledger
    error: str | None = None

    @property
    def failed(self) -> list[str]:
        return [c["name"] for c in self.checks if not c.get("ok") and not c.get("warning")]

    @property
    def warnings(self) -> list[str]:
        return [c["name"] for c in self.checks if c.get("warning")]

    def summary(self) -> str:
        if self.error:
            return self.error
        if self.ok:
            return f"passed ({len(self.checks)} checks)"
        return "failed: " + "; ".join(gate.failures({"checks": self.checks}) or ["no check passed"])

    def to_dict(self) -> dict[str, Any]:
        return {"rig": self.rig, "level": self.level, "ok": self.ok, "reachable": self.reachable,
                "release_id": self.release_id, "seconds": round(self.seconds, 1), "failed": self.failed,
                "warnings": self.warnings, "checks": self.checks, "acceptance_length": self.acceptance_length,
                "recorded": self.recorded, "error": self.error}


def check_options(level: str, timeout: str) -> int:
    """Bad options are input errors, before anything is contacted; the timeout in seconds."""
    problems = []
    if level not in LEVELS:
        problems.append(Problem("fleet", "--level", level, "not a level of the verify ladder",
                                f"use one of {', '.join(LEVELS)} (each includes the ones before)"))
    seconds = int(timeout) if timeout.strip().isdigit() else 0
    if not 1 <= seconds <= MAX_TIMEOUT_S:
        problems.append(Problem("fleet", "--timeout", timeout, "not a number of seconds per phase in range",
                                f"use 1 to {MAX_TIMEOUT_S} (default {DEFAULT_TIMEOUT_S})"))
    if problems:
        raise InputError(problems)
    return seconds


def budget_s(level: str, timeout_s: int) -> float:
    """The longest the probe may take on one rig (it bounds itself; this bounds the SSH read)."""
    return PHASES[level] * timeout_s + SSH_MARGIN_S


def probe_spec(level: str, timeout_s: int, settings: dict[str, Any] | None = None) -> str:
    """The probe's files and arguments; `settings` (the rig's inventory thresholds now) win over
    the ones its release.json was written with."""
    args = [RELEASE_DIR, "--level", level, "--timeout", str(timeout_s)]
    if settings:
        args += ["--settings", json.dumps(settings, sort_keys=True)]
    return json.dumps({"files": gate.rig_files(), "args": args})


def read_ledger(run: Exec) -> dict[str, Any] | None:
    """The rig's ledger file as JSON; None when there is none or it is unreadable (then nothing is written)."""
    code, out = run(f"cat {q(LEDGER_PATH)}", "", lambda _: None, 60)
    if code != 0:
        return None
    try:
        raw = json.loads(out)
    except ValueError:
        return None
    return raw if isinstance(raw, dict) else None


def current_release(raw: dict[str, Any] | None) -> str | None:
    current = (raw or {}).get("current")
    return current.get("release_id") if isinstance(current, dict) else None


def write_ledger(run: Exec, raw: dict[str, Any]) -> bool:
    """Atomic, as the serving operation writes it: temp file in the same dir, then rename."""
    directory = LEDGER_PATH.rsplit("/", 1)[0]
    command = (f'set -e; t=$(mktemp {q(directory)}/.rigfleet.XXXXXX); cat > "$t"; chmod 0644 "$t"; '
               f'mv -f "$t" {q(LEDGER_PATH)}')
    code, _ = run(command, json.dumps(raw, indent=2) + "\n", lambda _: None, 60)
    return code == 0


def verify_rig(rig: str, run: Exec, level: str, timeout_s: int, say: Callable[[str, str], None],
               settings: dict[str, Any] | None = None) -> RigResult:
    """The ladder up to `level` on one rig, then its verdict in the rig's ledger."""
    result = RigResult(rig, level)
    started, clock = ledger.now(), time.monotonic()
    try:
        result.release_id = current_release(read_ledger(run))
        if result.release_id is None:
            result.error = "not serving: the rig's ledger names no current release (deploy it first)"
            say(rig, result.error)
            return result
        say(rig, f"verify {level} of {result.release_id}")

        def progress(line: str) -> None:
            line = line.strip()
            if line.startswith("[gate] "):
                say(rig, line[len("[gate] "):])

        _, out = run(BOOT_COMMAND, probe_spec(level, timeout_s, settings), progress, budget_s(level, timeout_s))
        verdict = gate.parse_output(out)
        result.ok = bool(verdict.get("ok"))
        result.checks = [{k: c.get(k) for k in ("name", "ok", "detail", "warning")} for c in verdict.get("checks", [])]
        result.acceptance_length = verdict.get("acceptance_length")
        verdict.setdefault("level", level)
        record = ledger.verification(verdict, started, release_id=result.release_id)
        book = read_ledger(run)  # again: a deploy may have written it meanwhile
        if book is not None:
            result.recorded = write_ledger(run, ledger.record_verification(book, record))
    except Exception as exc:  # a dropped or silent channel (socket, paramiko): this rig fails, not the run
        result.error = f"no answer from the rig: {type(exc).__name__}: {exc}".strip()
    finally:
        result.seconds = time.monotonic() - clock
    say(rig, ("passed" if result.ok else "FAILED: " + (", ".join(result.failed) or result.summary()))
        + f" in {result.seconds:.0f} s" + ("" if result.recorded or result.error else " (ledger NOT updated)"))
    return result


Connect = Callable[[list[str]], contextlib.AbstractContextManager[dict[str, Exec | str]]]


def run(names: list[str], level: str, timeout_s: int, connect: Connect,
        say: Callable[[str, str], None], settings: dict[str, dict[str, Any]] | None = None) -> list[RigResult]:
    """Every rig at once, one thread each; results in the order given. `settings`: per rig, the
    probe settings from the inventory (gate.rig_settings)."""
    with connect(names) as execs:
        results: dict[str, RigResult] = {}
        workers = [name for name in names if callable(execs.get(name))]
        for name in names:
            reason = execs.get(name)
            if not callable(reason):
                why = f"unreachable: {reason or 'no connection'}"
                results[name] = RigResult(name, level, reachable=False, error=why)
                say(name, results[name].error or "")
        with ThreadPoolExecutor(max_workers=max(1, len(workers))) as pool:
            futures = {name: pool.submit(verify_rig, name, execs[name], level, timeout_s, say,  # type: ignore[arg-type]
                                         (settings or {}).get(name))
                       for name in workers}
            for name, future in futures.items():
                results[name] = future.result()
    return [results[name] for name in names]


# --- production transport: pyinfra's SSH connection, stderr read line by line as it comes -------


def _ssh_exec(host: Any, auth: dict[str, Any]) -> Exec:
    from pyinfra.api import StringCommand
    from pyinfra.connectors.util import make_unix_command_for_host

    def execute(command: str, stdin: str, on_line: Callable[[str], None], timeout: float) -> tuple[int, str]:
        client = getattr(host.connector, "client", None)
        if client is None:  # not an SSH connector: the same command, progress when it ends
            ok, output = host.run_shell_command(StringCommand(command), _stdin=stdin, _timeout=int(timeout), **auth)
            for line in output.stderr_lines:
                on_line(line)
            return (0 if ok else 1), output.stdout
        full = make_unix_command_for_host(host.state, host, StringCommand(command), **auth).get_raw_value()
        chan_in, chan_out, chan_err = client.exec_command(full, timeout=timeout)
        if stdin:
            chan_in.write(stdin)
        chan_in.channel.shutdown_write()
        chunks: list[bytes] = []
        reader = threading.Thread(target=lambda: chunks.append(chan_out.read()), daemon=True)
        reader.start()
        for line in chan_err:
            on_line(line.decode("utf-8", "replace") if isinstance(line, bytes) else line)
        reader.join(timeout)
        if reader.is_alive():
            raise TimeoutError(f"no result within {timeout:.0f} s")
        return chan_out.channel.recv_exit_status(), b"".join(chunks).decode("utf-8", "replace")

    return execute


AUTH_KEYS = ("_sudo", "_sudo_user", "_sudo_password", "_use_sudo_login", "_preserve_sudo_env", "_su_user",
             "_doas", "_doas_user")


def ssh_connect(fleet: Any) -> Connect:
    """Connect through rigfleet's pyinfra state (strict host keys, the rig's sudo settings)."""
    from rigfleet import runner

    @contextlib.contextmanager
    def connect(names: list[str]) -> Iterator[dict[str, Exec | str]]:
        with runner.connected(fleet, names) as (state, outcomes):
            execs: dict[str, Exec | str] = {}
            active = {host.name: host for host in state.active_hosts}
            for name in names:
                host = active.get(name)
                if host is None:
                    execs[name] = "; ".join(outcomes[name].errors[-1:]) or "could not connect"
                    continue
                auth = {k: host.data.get(k) for k in AUTH_KEYS if host.data.get(k) is not None}
                execs[name] = _ssh_exec(host, auth)
            yield execs

    return connect
