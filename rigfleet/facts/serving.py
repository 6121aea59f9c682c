"""Facts the serving operation reads: the rig's ledger and the rigfleet containers, in one command.

A stdlib-only Python snippet runs on the rig (python3 is on every supported distro) and prints
one JSON object; it never fails the host: a fresh rig without Docker or a ledger reports empty.
"""

from __future__ import annotations

import json
from typing import Any

from pyinfra.api import FactBase

from rigfleet import rigpython
from rigfleet.rigstate import LEDGER_PATH, RELEASES_DIR

RELEASE_LABEL = "io.rigfleet.release"

_SNIPPET = r'''
import hashlib, json, os, subprocess, sys
LEDGER, RELEASES, LABEL = "@LEDGER@", "@RELEASES@", "@LABEL@"
rid = sys.argv[1] if len(sys.argv) > 1 else ""
out = {"ledger": None, "docker": True, "containers": [], "env_sha256": None, "release_dir": False}
try:
    with open(LEDGER) as f:
        out["ledger"] = json.load(f)
except FileNotFoundError:
    pass
except Exception as exc:
    out["ledger"] = {"unreadable": str(exc)[:200]}
def run(*argv):
    return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=60).stdout.decode()
try:
    ids = run("docker", "ps", "-aq", "--filter", "label=" + LABEL).split()
    for c in (json.loads(run("docker", "inspect", *ids)) if ids else []):
        state = c.get("State") or {}
        out["containers"].append({
            "id": c.get("Id", ""), "name": c.get("Name", "").lstrip("/"),
            "status": state.get("Status", ""), "health": (state.get("Health") or {}).get("Status"),
            "restart_count": c.get("RestartCount", 0),
            "release": ((c.get("Config") or {}).get("Labels") or {}).get(LABEL),
        })
except Exception:
    out["docker"] = False
if rid and "/" not in rid:
    out["release_dir"] = os.path.isfile(os.path.join(RELEASES, rid, "compose.yaml"))
    try:
        with open(os.path.join(RELEASES, rid, "rigfleet.env"), "rb") as f:
            out["env_sha256"] = hashlib.sha256(f.read()).hexdigest()
    except OSError:
        pass
print(json.dumps(out))
'''.replace("@LEDGER@", LEDGER_PATH).replace("@RELEASES@", RELEASES_DIR).replace("@LABEL@", RELEASE_LABEL)


def empty_state() -> dict[str, Any]:
    return {"ledger": None, "docker": False, "containers": [], "env_sha256": None, "release_dir": False}


def parse_state(output: list[str]) -> dict[str, Any]:
    for line in reversed(output):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                break
            if isinstance(value, dict):
                return empty_state() | value
    return empty_state()


class ServingState(FactBase[dict[str, Any]]):
    """{ledger, docker, containers: [{id, name, status, health, restart_count, release}],
    env_sha256 (of RELEASE_ID's env file), release_dir (RELEASE_ID's compose.yaml exists)}."""

    def command(self, release_id: str = "") -> str:
        return rigpython.command(_SNIPPET, release_id)

    @staticmethod
    def default() -> dict[str, Any]:
        return empty_state()

    def process(self, output: list[str]) -> dict[str, Any]:
        return parse_state(output)
