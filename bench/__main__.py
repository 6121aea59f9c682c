"""`make bench`: rigfleet's costs on SIMULATED sandbox rigs, min/median/max over repeated runs.

    python -m bench [--repeats 3] [--json out/bench.json] [--skip fresh,repin] [--only noop,peer]

Measures (issue "Benchmarks"): fresh converge of one rig (split into waiting on downloads and
rigfleet's own time), no-op converge of one rig (wall, remote commands, bytes sent), no-op
converge of 1/2/4 rigs (ratio), swap downtime minus the engine's own ready time, and a 4-rig
re-pin (image builds, total, per wave); the bytes the 1st and the 2nd rig of a fleet with a
download cache pull from the sandbox's stand-in upstream (bench/cache.py); and real-upstream
verification, cold (wheels downloaded) and warm (cached), with what the warm path adds to
`rigfleet check` (bench/verify.py, no sandbox: `--only verify` runs without root or the sandbox
lock). The rest runs as root and holds the sandbox lock for its duration.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import paramiko
from pyinfra.api import BaseStateCallback
from rich.console import Console
from rich.table import Table

from bench.cache import SECOND_RIG_OPERATIONS, SECOND_RIG_SLOWEST
from rigfleet import rollout, runner
from rigfleet.loader import Fleet, load_fleet
from rigfleet_sandbox.layout import repo_root

LOCK = "/tmp/rigfleet-e2e.lock"
# Operations whose time is mostly package installs (apt-get update, download, unpack) or image,
# weights and source transfers; named as the roles name them (pyinfra prefixes the role's name).
DOWNLOAD_OPS = re.compile(
    r"^(Tools |NVIDIA driver|Driver version lock|Kernel headers|NVIDIA Container Toolkit$|Docker CE$"
    r"|Docker from the distribution|.* repository: key|Weights |Base image |Genesis |Overlay |Python deps: download"
    r"|Image .* from the fleet registry)"
)


@dataclass
class Wire:
    """Remote commands and bytes sent over SSH, counted at paramiko's level."""

    commands: int = 0
    bytes_sent: int = 0
    current: str = "planning (facts read by deploy code)"
    by_role: dict[str, int] = field(default_factory=dict)


@contextlib.contextmanager
def counting() -> Iterator[Wire]:
    wire = Wire()
    exec_command, putfo = paramiko.SSHClient.exec_command, paramiko.SFTPClient.putfo

    def counted_exec(self: Any, command: str, *args: Any, **kwargs: Any) -> Any:
        wire.commands += 1
        wire.by_role[wire.current] = wire.by_role.get(wire.current, 0) + 1
        wire.bytes_sent += len(command.encode())
        return exec_command(self, command, *args, **kwargs)

    def counted_put(self: Any, fl: Any, *args: Any, **kwargs: Any) -> Any:
        start = fl.tell()
        result = putfo(self, fl, *args, **kwargs)
        wire.bytes_sent += max(0, fl.tell() - start)
        return result

    paramiko.SSHClient.exec_command = counted_exec  # type: ignore[method-assign]
    paramiko.SFTPClient.putfo = counted_put  # type: ignore[method-assign]
    try:
        yield wire
    finally:
        paramiko.SSHClient.exec_command = exec_command  # type: ignore[method-assign]
        paramiko.SFTPClient.putfo = putfo  # type: ignore[method-assign]


class OpTimer(BaseStateCallback):
    """Wall time per operation (all hosts), to split download waiting from rigfleet's own time."""

    def __init__(self) -> None:
        self.started: dict[str, float] = {}
        self.seconds: dict[str, float] = {}

    def operation_start(self, state: Any, op_hash: str) -> None:  # type: ignore[override]
        self.started[op_hash] = time.monotonic()

    def operation_end(self, state: Any, op_hash: str) -> None:  # type: ignore[override]
        names = ", ".join(sorted(state.op_meta[op_hash].names))
        self.seconds[names] = self.seconds.get(names, 0.0) + time.monotonic() - self.started.pop(op_hash)


class RoleOfCommand(BaseStateCallback):
    """Names the role of the operation running, so the remote commands are counted per role."""

    def __init__(self, wire: Wire) -> None:
        self.wire = wire

    def operation_start(self, state: Any, op_hash: str) -> None:  # type: ignore[override]
        names = sorted(state.op_meta[op_hash].names)
        self.wire.current = names[0].split(" | ")[0] if names else "?"


@dataclass
class Metric:
    name: str
    unit: str
    values: list[float] = field(default_factory=list)
    target: str = ""

    def met(self) -> str:
        """'met' / 'NOT met' for the median against the target ('<= 1.5 s', '>= 5', '1'), else ''."""
        found = re.fullmatch(r"\s*(<=|>=|<|>)?\s*([\d.]+).*", self.target)
        if not found or not self.values:
            return ""
        value, bound = statistics.median(self.values), float(found.group(2))
        ok = {"<=": value <= bound, ">=": value >= bound, "<": value < bound, ">": value > bound,
              None: value == bound}[found.group(1)]
        return "met" if ok else "NOT met"

    def row(self) -> list[str]:
        if not self.values:
            return [self.name, "-", "-", "-", self.unit, self.target, ""]
        return [self.name, *(f"{v:.2f}" for v in (min(self.values), statistics.median(self.values),
                                                  max(self.values))), self.unit, self.target, self.met()]


def sandbox_up(rigs: int) -> Fleet:
    from rigfleet_sandbox import manager

    info = manager.up(rigs=rigs, log=lambda _msg: None)
    return load_fleet(Path(info.inventory_dir))


def own_cpu() -> float:
    """CPU seconds of this process (rigfleet's converge runs in it, SSH included: paramiko)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def host_busy_cpu() -> float:
    """CPU seconds every core of this machine has been busy (/proc/stat: all but idle and iowait):
    minus own_cpu(), what the SIMULATED rigs (sshd, sudo, dpkg, docker, their engines) spent."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def children_cpu() -> float:
    """CPU seconds of finished child processes (the peer: ansible-playbook, its forks and ssh)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


LAST_CPU: list[float] = [0.0]
LAST_RIGS_CPU: list[float] = [0.0]  # the machine's busy CPU beyond the control process, same converge
METRICS: dict[str, Metric] = {}  # filled as the run goes: an interrupted run still reports what it measured
COMMANDS_BY_ROLE: dict[str, int] = {}  # of the last 1-rig no-op
PEER_TASK_SECONDS: dict[str, float] = {}  # of the last 1-rig peer run  # control-host CPU of the last converge_timed


def converge_timed(fleet: Fleet, names: list[str], timer: BaseStateCallback | None = None) -> tuple[float, dict]:
    callbacks = [timer] if timer else []
    started, cpu, busy = time.monotonic(), own_cpu(), host_busy_cpu()
    outcomes = runner.converge(fleet, names, callbacks=callbacks)
    elapsed = time.monotonic() - started
    LAST_CPU[0] = own_cpu() - cpu
    LAST_RIGS_CPU[0] = max(0.0, host_busy_cpu() - busy - LAST_CPU[0])
    failed = {n: o.summary for n, o in outcomes.items() if not o.ok}
    if failed:
        raise SystemExit(f"bench: converge failed on {failed}")
    return elapsed, outcomes


def with_rigs(fleet: Fleet, **update: Any) -> Fleet:
    rigs = tuple(rig.model_copy(update=update) for rig in fleet.rigs)
    return Fleet(fleet.inventory_dir, rigs, fleet.pinsets, fleet.sources, fleet.pyinfra_data)


def on_rig(fleet: Fleet, rig: str, command: str) -> str:
    from rigfleet_sandbox.manager import ssh_command

    address = fleet.rig(rig).ssh_hostname
    proc = subprocess.run([*ssh_command(fleet.inventory_dir, address), command], capture_output=True, text=True,
                          timeout=60, check=False)
    return proc.stdout.strip()


def engine_ready_seconds(fleet: Fleet, rig: str) -> float | None:
    """Container start -> the engine's 'Application startup complete' (its own ready time)."""
    container = fleet.rig(rig)
    from rigfleet import catalog

    name = catalog.variants()[container.variant].container_name
    started = on_rig(fleet, rig, f"sudo docker inspect -f '{{{{.State.StartedAt}}}}' {name}")
    line = on_rig(fleet, rig, f"sudo docker logs -t {name} 2>&1 | grep -m1 'Application startup complete'")
    if not started or not line:
        return None
    return _ts(line.split()[0]) - _ts(started)


def _ts(text: str) -> float:
    whole, _, frac = text.rstrip("Z").partition(".")
    return datetime.strptime(whole, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc).timestamp() + float(
        f"0.{frac or 0}")


def last_downtime(fleet: Fleet, rig: str) -> float | None:
    raw = on_rig(fleet, rig, "sudo cat /var/lib/rigfleet/ledger.json")
    attempts = json.loads(raw).get("attempts", []) if raw else []
    passed = [a for a in attempts if a.get("result") == "passed" and a.get("downtime_s") is not None]
    return float(passed[-1]["downtime_s"]) if passed else None


def builds(fleet: Fleet, names: list[str]) -> int:
    return sum(int(on_rig(fleet, n, "sudo cat /var/lib/rigfleet/image-builds.jsonl 2>/dev/null | wc -l") or 0)
               for n in names)


SECTIONS = ("fresh", "cache", "noop", "peer", "swap", "repin", "scale", "verify")
NO_SANDBOX = {"verify"}  # sections that need no sandbox rigs (nor root, nor its lock)


def used_memory_mib() -> float:
    """Host memory in use (MemTotal - MemAvailable), MiB: per-rig memory is its growth / rigs."""
    info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    return (int(info["MemTotal"].split()[0]) - int(info["MemAvailable"].split()[0])) / 1024


def rss_mib() -> float:
    """This process's resident memory now (rigfleet's control side: connections, state, facts)."""
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def scale(args: argparse.Namespace, metric: Callable[..., Metric], say: Callable[[str], None]) -> tuple[Fleet, float]:
    """No-op converge of 1, 4, 8 and 16 rigs (--scale), rigfleet's own CPU per rig beside the wall:
    the rigs' sshd, dockerd and engines run on the same cores as the control process."""
    counts = sorted(int(c) for c in args.scale.split(","))
    before = used_memory_mib()
    say(f"scale: booting {counts[-1]} rigs and converging them")
    fleet = sandbox_up(counts[-1])
    names = [rig.name for rig in fleet.rigs]
    rss = rss_mib()
    wall, _ = converge_timed(fleet, names)
    metric(f"scale: fresh converge of {counts[-1]} rigs", "s").values.append(wall)
    metric("  memory per converged rig (host view)", "MiB").values.append((used_memory_mib() - before) / len(names))
    return fleet, rss


def scale_noops(args: argparse.Namespace, metric: Callable[..., Metric], say: Callable[[str], None], fleet: Fleet,
                rss: float) -> None:
    counts = sorted(int(c) for c in args.scale.split(","))
    names = [rig.name for rig in fleet.rigs]
    for attempt in range(args.repeats):
        say(f"scale: no-op converges ({attempt + 1}/{args.repeats})")
        for count in counts:
            wall, outcomes = converge_timed(fleet, names[:count])
            changed = sum(o.changed for o in outcomes.values())
            if changed:
                raise SystemExit(f"bench: a no-op converge of {count} rigs changed {changed} operations")
            metric(f"scale: no-op {count} rig(s): wall", "s").values.append(wall)
            metric(f"  control-host CPU per rig ({count})", "s", "<= 0.3 s").values.append(LAST_CPU[0] / count)
            metric(f"  the rigs' own CPU per rig ({count}; same cores)", "s").values.append(LAST_RIGS_CPU[0] / count)
        metric(f"  control process memory growth per rig ({counts[-1]})", "MiB").values.append(
            (rss_mib() - rss) / len(names))
        first, last = (metric(f"scale: no-op {c} rig(s): wall", "s") for c in (counts[0], counts[-1]))
        metric(f"scale: no-op {counts[-1]} rigs / {counts[0]} rig", "ratio", "<= 1.5").values.append(
            last.values[-1] / first.values[-1])


def run(args: argparse.Namespace, say: Callable[[str], None]) -> tuple[list[Metric], list[dict[str, float]]]:
    repeats, skip = args.repeats, set(args.skip.split(",")) if args.skip else set()
    if args.only:
        skip |= set(SECTIONS) - set(args.only.split(","))
    metrics = METRICS
    slowest: list[dict[str, float]] = []  # the fresh converges' slowest operations: where the time goes

    def metric(name: str, unit: str, target: str = "") -> Metric:
        return metrics.setdefault(name, Metric(name, unit, target=target))

    if "verify" not in skip:
        from bench import verify

        def record(name: str, unit: str, value: float, target: str) -> None:
            metric(name, unit, target).values.append(value)

        verify.run(repeats, record, say)
    if "fresh" not in skip:
        for attempt in range(repeats):
            say(f"fresh converge of one rig ({attempt + 1}/{repeats})")
            fleet = sandbox_up(1)
            timer = OpTimer()
            wall, _ = converge_timed(fleet, ["rig-01"], timer)
            waiting = sum(s for name, s in timer.seconds.items() if DOWNLOAD_OPS.match(name.split(" | ")[-1]))
            metric("fresh converge, 1 rig: wall", "s").values.append(wall)
            metric("  package installs and downloads", "s").values.append(waiting)
            metric("  everything else (build, engine start, gate, rigfleet)", "s").values.append(wall - waiting)
            slowest.append(dict(sorted(timer.seconds.items(), key=lambda item: -item[1])[:12]))

    if "cache" not in skip:
        from bench import cache

        cache.run(sandbox_up, converge_timed, OpTimer, metric, say, repeats)

    scaled, rss = scale(args, metric, say) if "scale" not in skip else (None, 0.0)
    if skip >= {"noop", "peer", "swap", "repin"}:
        if scaled is not None:
            scale_noops(args, metric, say, scaled, rss)
        return list(metrics.values()), slowest
    if scaled is not None and len(scaled.rigs) >= args.rigs:
        fleet = scaled  # the scale section's rigs are converged already: its first --rigs serve here
        all_rigs = [rig.name for rig in fleet.rigs][: args.rigs]
    else:
        say(f"booting {args.rigs} rigs and converging them")
        fleet = sandbox_up(args.rigs)
        all_rigs = [rig.name for rig in fleet.rigs]
        converge_timed(fleet, all_rigs)
    if "peer" not in skip:
        from bench import peer

        say("the peer: ansible-core from its pin, inventory from the converged rigs")
        peer.prepare(fleet, all_rigs)
        # the first run would install python3-apt if the rig lacked it (Ansible's apt module needs
        # it): the peer's own bootstrap, outside the measured runs, which must change nothing
        for which in ("first",):
            settled = peer.run(all_rigs)
            Path(repo_root() / "out" / f"peer-{which}.log").write_text(settled.output)
            say(f"the peer's {which} run on the converged rigs: {peer.summary(settled)}")
            if settled.failed:
                raise SystemExit(f"bench: the peer failed (out/peer-{which}.log)")
        drift = peer.drift_check(fleet, "rig-01", "/etc/apt/apt.conf.d/51rigfleet-unattended-blacklist")
        if drift.changed < 1:
            raise SystemExit(f"bench: the peer did not see a file edited by hand: {peer.summary(drift)} "
                             "(out/peer-N/drift-check.log)")
        say(f"the peer sees a hand-edited file (--check --diff: changed={drift.changed})")
    for attempt in range(repeats):
        if "noop" in skip and "peer" in skip:
            break
        say(f"no-op converges ({attempt + 1}/{repeats})")
        for count in (c for c in (1, 2, 4) if c <= len(all_rigs)):
            with counting() as wire:
                wall, outcomes = converge_timed(fleet, all_rigs[:count], RoleOfCommand(wire))
            changed = sum(o.changed for o in outcomes.values())
            if changed:
                raise SystemExit(f"bench: a no-op converge changed {changed} operations")
            metric(f"no-op converge, {count} rig(s): wall", "s", "<= 1.5 s" if count == 1 else "").values.append(wall)
            metric(f"  control-host CPU per rig, {count} rig(s)", "s", "<= 0.3 s").values.append(LAST_CPU[0] / count)
            metric(f"  the rigs' own CPU per rig, {count} rig(s)", "s").values.append(LAST_RIGS_CPU[0] / count)
            if count == 1:
                metric("  remote commands", "count", "<= 12").values.append(wire.commands)
                metric("  bytes sent", "KiB").values.append(wire.bytes_sent / 1024)
                COMMANDS_BY_ROLE.clear()
                COMMANDS_BY_ROLE.update(wire.by_role)
            if "peer" in skip or str(count) not in args.peer_rigs.split(","):
                continue
            cpu = children_cpu()
            ran = peer.run(all_rigs[:count])
            if ran.failed or ran.changed:
                raise SystemExit(f"bench: the peer's no-op on {count} rig(s): {peer.summary(ran)}")
            metric(f"Ansible peer no-op, {count} rig(s): wall", "s").values.append(ran.wall)
            metric("  its control-host CPU per rig", "s").values.append((children_cpu() - cpu) / count)
            if count == 1:
                PEER_TASK_SECONDS.clear()
                PEER_TASK_SECONDS.update(ran.task_seconds)
            metric(f"Ansible peer / rigfleet, {count} rig(s)", "ratio", ">= 5" if count == 1 else "").values.append(
                ran.wall / wall)
        ones, fours = metric("no-op converge, 1 rig(s): wall", "s"), metric("no-op converge, 4 rig(s): wall", "s")
        if fours.values:
            metric("no-op 4 rigs / 1 rig", "ratio", "< 1.5").values.append(fours.values[-1] / ones.values[-1])

    if scaled is not None:  # after the peer: the side-by-side figures come first
        scale_noops(args, metric, say, scaled, rss)
    variants = ["tq3-nomtp", fleet.rig("rig-01").variant]
    for attempt in range(repeats if "swap" not in skip else 0):
        variant = variants[attempt % 2]
        say(f"swap rig-01 to {variant} ({attempt + 1}/{repeats})")
        swapped = with_rigs(fleet, variant=variant)
        converge_timed(swapped, ["rig-01"])
        downtime, ready = last_downtime(fleet, "rig-01"), engine_ready_seconds(swapped, "rig-01")
        if downtime is not None and ready is not None:
            metric("swap downtime", "s").values.append(downtime)
            metric("  engine's own ready time", "s").values.append(ready)
            metric("  rigfleet overhead", "s", "<= 1.0 s").values.append(downtime - ready)
    if "swap" not in skip:
        converge_timed(fleet, ["rig-01"])  # back to what the inventory says

    if "repin" not in skip:
        target = next((name for name in fleet.pinsets if name != fleet.rigs[0].pinset and name != "sandbox-c"), None)
        if target:
            say(f"re-pin of 4 rigs to {target}")
            before = builds(fleet, all_rigs)
            repinned = with_rigs(fleet, pinset=target)
            plan = rollout.plan_waves(all_rigs, None, 2)
            started = time.monotonic()
            result = rollout.run(repinned, plan, runner.converge)
            metric("re-pin 4 rigs: total", "s").values.append(time.monotonic() - started)
            for wave in result.waves:
                metric(f"  wave {wave.index} ({len(wave.rigs)} rigs)", "s").values.append(wave.seconds)
            metric("  image builds", "count", "1").values.append(builds(fleet, all_rigs) - before)
            converge_timed(fleet, all_rigs)  # back to the inventory's pin set
    return list(metrics.values()), slowest


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default="", help="default: bench/results/latest.json for a whole run, "
                        "out/bench.json for a partial one (--only, --skip)")
    parser.add_argument("--skip", default="", help=f"comma list of: {', '.join(SECTIONS)}")
    parser.add_argument("--rigs", type=int, default=4, help="rigs of the no-op, peer, swap and re-pin sections")
    parser.add_argument("--peer-rigs", default="1,4", help="rig counts the peer runs on (of 1, 2, 4)")
    parser.add_argument("--scale", default="1,4,8,16", help="rig counts of the scale section")
    parser.add_argument("--only", default="", help="run only these sections (comma list, as --skip)")
    args = parser.parse_args()
    chosen = set(args.only.split(",")) if args.only else set(SECTIONS) - set(args.skip.split(","))
    if chosen <= NO_SANDBOX:
        console = Console()
        metrics, slowest = run(args, lambda text: console.print(f"[dim]bench:[/dim] {text}"))
        return report(args, console, metrics, slowest)
    if os.geteuid() != 0:
        print("bench runs on sandbox rigs (systemd-nspawn): run it as root", file=sys.stderr)
        return 2
    console = Console()
    with open(LOCK, "w") as lock:
        if "RIGFLEET_SANDBOX_INSTANCE" not in os.environ:  # /work/coord/e2e holds the slot's lock
            fcntl.flock(lock, fcntl.LOCK_EX)
        stopped = False
        try:
            metrics, slowest = run(args, lambda text: console.print(f"[dim]bench:[/dim] {text}"))
        except (KeyboardInterrupt, SystemExit) as stop:  # SIGINT, or a failed check: report what was measured
            console.print(f"bench: stopped early: {stop}")
            metrics, slowest, stopped = list(METRICS.values()), [], True
            args.json = args.json or str(repo_root() / "out" / "bench.json")
    code = report(args, console, metrics, slowest)
    return 1 if stopped else code


def report(args: argparse.Namespace, console: Console, metrics: list[Metric], slowest: list[dict[str, float]]) -> int:
    if not args.json:
        whole = not args.only and not args.skip
        args.json = str(repo_root() / ("bench/results/latest.json" if whole else "out/bench.json"))
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    machine = f"{platform.node()} ({os.cpu_count()} cores, {platform.release()})"
    table = Table(title=f"rigfleet bench, {stamp}, {machine}, SIMULATED rigs, {args.repeats} runs")
    for column in ("measure", "min", "median", "max", "unit", "target", ""):
        table.add_column(column)
    for m in metrics:
        table.add_row(*m.row())
    console.print(table)
    if COMMANDS_BY_ROLE:
        console.print("remote commands of the last 1-rig no-op converge, by role:")
        for role, count in COMMANDS_BY_ROLE.items():
            console.print(f"  {count:4d}  {role}")
    for title, operations in (("the last fresh converge", slowest[-1] if slowest else {}),
                              ("the last 2nd rig's converge, cache warm", SECOND_RIG_SLOWEST)):
        if operations:
            console.print(f"slowest operations of {title} (s):")
            for name, seconds in operations.items():
                console.print(f"  {seconds:7.1f}  {name}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"date": stamp, "machine": machine, "repeats": args.repeats,
                                           "metrics": [{**m.__dict__, "met": m.met()} for m in metrics],
                                           "fresh_slowest_operations": slowest,
                                           "second_rig_slowest_operations": SECOND_RIG_SLOWEST,
                                           "second_rig_operations": SECOND_RIG_OPERATIONS,
                                           "noop_commands_by_role": COMMANDS_BY_ROLE,
                                           "peer_task_seconds_1_rig": PEER_TASK_SECONDS}, indent=2))
    console.print(f"written: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
