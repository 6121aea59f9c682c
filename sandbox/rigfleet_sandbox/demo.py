"""`make demo`: the product end to end on one SIMULATED rig.

Boots a sandbox rig (real systemd, sshd, apt, Docker; simulated NVIDIA stack and engine), runs the
real `pyinfra inventory.py deploy.py` against it twice (the second run must change nothing), shows
`rigfleet plan` and, once serving exists, a chat completion answered by the rig. The rig stays up
for exploring: `rigfleet sandbox ssh rig-01`, `rigfleet sandbox down` when done.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

from rigfleet import paths
from rigfleet_sandbox.layout import repo_root

ANSI = re.compile(r"\x1b\[[0-9;]*m")
OP_START = re.compile(r"^--> Starting (?:[\w ,]+ )?operation: (?P<name>.+?)(?: \(.*\))?$")
HOST_LINE = re.compile(r"^\[(?P<rig>[^\]]+)\]\s+(?P<rest>.*)$")
RESULTS = ("Success", "No changes", "Error", "Skipped")


def say(text: str) -> None:
    print(f"\n=== {text}", flush=True)


class Progress:
    """pyinfra's log turned into progress lines as they come: elapsed time, rig, operation, result."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, warned: set[str] | None = None) -> None:
        self.clock = clock
        self.warned = warned if warned is not None else set()  # shown by an earlier command of the demo
        self.started = clock()
        self.operation = ""
        self.op_started = self.started

    def line(self, raw: str) -> str | None:
        text = ANSI.sub("", raw).rstrip()
        if not text.strip():
            return None
        if text.startswith("warning:"):
            if text in self.warned:
                return None
            self.warned.add(text)
        now = self.clock()
        stamp = f"[{now - self.started:6.1f}s]"
        start = OP_START.match(text.strip())
        if start:
            self.operation, self.op_started = start["name"], now
            return f"{stamp} {self.operation}"
        host = HOST_LINE.match(text.strip())
        if host and self.operation and host["rest"].startswith(RESULTS):
            took = now - self.op_started
            return f"{stamp}   {host['rig']}: {self.operation}: {host['rest']} ({took:.1f} s)"
        return f"{stamp} {text.strip().removeprefix('--> ')}"


WARNED: set[str] = set()  # each warning once in the whole demo (plan, then two deploys)


def stream(argv: Sequence[str], cwd: Path, env: dict[str, str], out: IO[str] = sys.stdout,
           warned: set[str] = WARNED) -> tuple[int, str]:
    """Run `argv`, printing a progress line to `out` for each line it logs, as it logs it."""
    progress = Progress(warned=warned)
    seen: list[str] = []
    with subprocess.Popen(list(argv), cwd=cwd, env={**env, "PYTHONUNBUFFERED": "1"}, text=True, bufsize=1,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as proc:
        assert proc.stdout is not None
        for raw in proc.stdout:
            seen.append(raw)
            shown = progress.line(raw)
            if shown is not None:
                print(shown, file=out, flush=True)
        code = proc.wait()
    return code, "".join(seen)


def print_once(output: str, warned: set[str] = WARNED) -> None:
    """A command's output as it is, less the warnings an earlier command of the demo printed."""
    for line in output.splitlines():
        text = ANSI.sub("", line).rstrip()
        if text.startswith("warning:"):
            if text in warned:
                continue
            warned.add(text)
        print(line)


def run_deploy(env: dict[str, str]) -> tuple[int, str]:
    started = time.monotonic()
    code, output = stream([str(Path(sys.executable).parent / "pyinfra"), "-y", "inventory.py", "deploy.py"],
                          repo_root(), env)
    print(f"(deploy took {time.monotonic() - started:.0f} s, exit {code})")
    return code, output


def changes_reported(output: str) -> int | None:
    """Operations that changed something: the Success column of pyinfra's "Grand total" row.

    pyinfra's results table has the columns Hosts, Success, Error, No change ("-" for zero); an
    operation that changed nothing counts under No change. None when the row is missing.
    """
    for line in output.splitlines():
        if line.strip().startswith("Grand total"):
            cells = line.split()[2:]
            if len(cells) >= 2:
                return 0 if cells[1] == "-" else int(cells[1])
    return None


def chat(address: str, port: int) -> str | None:
    body = json.dumps({"model": "qwen3.6-27b-autoround", "temperature": 0, "max_tokens": 30,
                       "messages": [{"role": "user", "content": "What is the capital of France?"}]})
    request = urllib.request.Request(f"http://{address}:{port}/v1/chat/completions", data=body.encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return str(json.load(response)["choices"][0]["message"]["content"])
    except OSError:
        return None


def main() -> int:
    if os.geteuid() != 0:
        print("make demo boots simulated rigs with systemd-nspawn: run it as root", file=sys.stderr)
        return 2
    from rigfleet_sandbox import manager

    say("booting one SIMULATED dual-3090 rig (rigfleet sandbox up --rigs 1)")
    # One sandbox per machine: wait for a test run or benchmark that is using it.
    lock = open("/tmp/rigfleet-e2e.lock", "w")  # noqa: SIM115 - held until the demo ends
    fcntl.flock(lock, fcntl.LOCK_EX)
    info = manager.up(rigs=1)
    paths.select(info.inventory_dir)
    env = {**os.environ, "RIGFLEET_INVENTORY": str(info.inventory_dir)}

    say("rigfleet plan")
    plan = subprocess.run([str(Path(sys.executable).parent / "rigfleet"), "plan"], cwd=repo_root(), env=env,
                          check=False, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    print_once(plan.stdout)

    say("pyinfra inventory.py deploy.py (first run: converge)")
    code, _ = run_deploy(env)
    if code != 0:
        print("deploy failed; the rig is still up for inspection: rigfleet sandbox ssh rig-01")
        return code
    say("pyinfra inventory.py deploy.py (second run: must change nothing)")
    code, output = run_deploy(env)
    changed = changes_reported(output)
    print(f"operations changed by the second run: {changed if changed is not None else 'unknown'}")
    if changed:
        code = code or 1  # a converged rig must not change on a second run

    from rigfleet import release
    from rigfleet.loader import load_fleet

    rig = info.rigs[0]
    # the release alone (not the guarded load): its warnings were shown by `rigfleet plan` above
    resolved = release.resolve(load_fleet(Path(info.inventory_dir)), rig.name)
    say(f"chat completion from {rig.name} ({resolved.variant.name}, SIMULATED engine)")
    answer = chat(rig.address, resolved.port)
    print(answer if answer is not None else "(no serving layer answered yet on this rig)")
    print("\nThe rig stays up: `rigfleet sandbox ssh rig-01`, `rigfleet sandbox down` when done.")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
