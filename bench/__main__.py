"""`make bench`: rigfleet's costs on SIMULATED sandbox rigs, min/median/max over repeated runs.

    python -m bench [--repeats 3] [--json out/bench.json] [--skip fresh,repin]

Measures (issue "Benchmarks"): fresh converge of one rig (split into waiting on downloads and
rigfleet's own time), no-op converge of one rig (wall, remote commands, bytes sent), no-op
converge of 1/2/4 rigs (ratio), swap downtime minus the engine's own ready time, and a 4-rig
re-pin (image builds, total, per wave). Runs as root; holds the sandbox lock for its duration.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import platform
import re
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


@contextlib.contextmanager
def counting() -> Iterator[Wire]:
    wire = Wire()
    exec_command, putfo = paramiko.SSHClient.exec_command, paramiko.SFTPClient.putfo

    def counted_exec(self: Any, command: str, *args: Any, **kwargs: Any) -> Any:
        wire.commands += 1
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


@dataclass
class Metric:
    name: str
    unit: str
    values: list[float] = field(default_factory=list)
    target: str = ""

    def row(self) -> list[str]:
        if not self.values:
            return [self.name, "-", "-", "-", self.unit, self.target]
        return [self.name, *(f"{v:.2f}" for v in (min(self.values), statistics.median(self.values),
                                                  max(self.values))), self.unit, self.target]


def sandbox_up(rigs: int) -> Fleet:
    from rigfleet_sandbox import manager

    info = manager.up(rigs=rigs, log=lambda _msg: None)
    return load_fleet(Path(info.inventory_dir))


def converge_timed(fleet: Fleet, names: list[str], timer: OpTimer | None = None) -> tuple[float, dict]:
    callbacks = [timer] if timer else []
    started = time.monotonic()
    outcomes = runner.converge(fleet, names, callbacks=callbacks)
    elapsed = time.monotonic() - started
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


def run(args: argparse.Namespace, say: Callable[[str], None]) -> tuple[list[Metric], list[dict[str, float]]]:
    repeats, skip = args.repeats, set(args.skip.split(",")) if args.skip else set()
    metrics: dict[str, Metric] = {}
    slowest: list[dict[str, float]] = []  # the fresh converges' slowest operations: where the time goes

    def metric(name: str, unit: str, target: str = "") -> Metric:
        return metrics.setdefault(name, Metric(name, unit, target=target))

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

    say("booting 4 rigs and converging them")
    fleet = sandbox_up(4)
    all_rigs = [rig.name for rig in fleet.rigs]
    converge_timed(fleet, all_rigs)
    for attempt in range(repeats):
        say(f"no-op converges ({attempt + 1}/{repeats})")
        for count in (1, 2, 4):
            with counting() as wire:
                wall, outcomes = converge_timed(fleet, all_rigs[:count])
            changed = sum(o.changed for o in outcomes.values())
            if changed:
                raise SystemExit(f"bench: a no-op converge changed {changed} operations")
            metric(f"no-op converge, {count} rig(s): wall", "s", "< 10 s" if count == 1 else "").values.append(wall)
            if count == 1:
                metric("  remote commands", "count", "< 60").values.append(wire.commands)
                metric("  bytes sent", "KiB").values.append(wire.bytes_sent / 1024)
        ones, fours = metric("no-op converge, 1 rig(s): wall", "s"), metric("no-op converge, 4 rig(s): wall", "s")
        metric("no-op 4 rigs / 1 rig", "ratio", "< 1.5").values.append(fours.values[-1] / ones.values[-1])

    variants = ["tq3-nomtp", fleet.rig("rig-01").variant]
    for attempt in range(repeats):
        variant = variants[attempt % 2]
        say(f"swap rig-01 to {variant} ({attempt + 1}/{repeats})")
        swapped = with_rigs(fleet, variant=variant)
        converge_timed(swapped, ["rig-01"])
        downtime, ready = last_downtime(fleet, "rig-01"), engine_ready_seconds(swapped, "rig-01")
        if downtime is not None and ready is not None:
            metric("swap downtime", "s").values.append(downtime)
            metric("  engine's own ready time", "s").values.append(ready)
            metric("  rigfleet overhead", "s", "< 3 s").values.append(downtime - ready)
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
    parser.add_argument("--json", default=str(repo_root() / "out" / "bench.json"))
    parser.add_argument("--skip", default="", help="comma list of: fresh, repin")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench runs on sandbox rigs (systemd-nspawn): run it as root", file=sys.stderr)
        return 2
    console = Console()
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        metrics, slowest = run(args, lambda text: console.print(f"[dim]bench:[/dim] {text}"))
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    machine = f"{platform.node()} ({os.cpu_count()} cores, {platform.release()})"
    table = Table(title=f"rigfleet bench, {stamp}, {machine}, SIMULATED rigs, {args.repeats} runs")
    for column in ("measure", "min", "median", "max", "unit", "target"):
        table.add_column(column)
    for m in metrics:
        table.add_row(*m.row())
    console.print(table)
    if slowest:
        console.print("slowest operations of the last fresh converge (s):")
        for name, seconds in slowest[-1].items():
            console.print(f"  {seconds:7.1f}  {name}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"date": stamp, "machine": machine, "repeats": args.repeats,
                                           "metrics": [m.__dict__ for m in metrics],
                                           "fresh_slowest_operations": slowest}, indent=2))
    console.print(f"written: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
