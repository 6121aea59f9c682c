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
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from rigfleet.paths import inventory_dir
from rigfleet_sandbox.layout import repo_root


def say(text: str) -> None:
    print(f"\n=== {text}", flush=True)


def run_deploy(env: dict[str, str]) -> tuple[int, str]:
    started = time.monotonic()
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "pyinfra"), "-y", "inventory.py", "deploy.py"],
        cwd=repo_root(), env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    print(proc.stdout[-4000:])
    print(f"(deploy took {time.monotonic() - started:.0f} s, exit {proc.returncode})")
    return proc.returncode, proc.stdout


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
    env = {**os.environ, "RIGFLEET_INVENTORY": str(inventory_dir())}

    say("rigfleet plan")
    subprocess.run([str(Path(sys.executable).parent / "rigfleet"), "plan"], cwd=repo_root(), env=env, check=False)

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

    from rigfleet.context import for_rig

    rig = info.rigs[0]
    context = for_rig(rig.name)
    say(f"chat completion from {rig.name} ({context.variant.name}, SIMULATED engine)")
    answer = chat(rig.address, context.release.port)
    print(answer if answer is not None else "(no serving layer answered yet on this rig)")
    print("\nThe rig stays up: `rigfleet sandbox ssh rig-01`, `rigfleet sandbox down` when done.")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
