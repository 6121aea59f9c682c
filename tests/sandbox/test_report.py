"""Day 2 on a SIMULATED serving rig with a real API key and (fake) HF token by reference:
`rigfleet report` (every section there, neither secret nor the rig's host name or address in the
bundle, nothing on the rig changed) and `rigfleet status --watch` in a real terminal (tmux, 80
columns: the fields are there, the frame updates, tokens/s moves under traffic, no line wider).

Reuses the module sandbox; one deploy (every role) with both secrets.
Run it through the slot wrapper: /work/coord/e2e pytest tests/sandbox/test_report.py
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rigfleet import report
from rigfleet_sandbox import shell
from tests import REPO_ROOT

from .conftest import Sandbox, chat_completion, group_pinset, module_inventory

RIG = "rig-01"
SANDBOX_RIGS = 1
API_KEY = "sk-rigfleet-report-" + os.urandom(12).hex()
HF_TOKEN = "hf_rigfleetreport" + os.urandom(12).hex()
SECRET_ENV = {"RIGFLEET_REPORT_API_KEY": API_KEY, "RIGFLEET_REPORT_HF_TOKEN": HF_TOKEN}
FOOTPRINT = ("sudo sh -c 'stat -c %Y /var/lib/rigfleet/ledger.json; ls -la --time-style=+%s /var/lib/rigfleet "
             "/opt/rigfleet/current/ /etc/docker; docker ps -aq --no-trunc | sort'")
WIDTH = 80

pytestmark = pytest.mark.sandbox


def bin_path(name: str) -> str:
    return str(Path(sys.executable).parent / name)


@pytest.fixture(scope="module")
def inventory(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return module_inventory(sandbox, tmp_path_factory, pinsets=[group_pinset(sandbox)],
                            rig_vars={RIG: {"api_key": {"env": "RIGFLEET_REPORT_API_KEY"},
                                            "hf_token": {"env": "RIGFLEET_REPORT_HF_TOKEN"}, "gate_timeout_s": 180}})


@pytest.fixture(scope="module")
def serving(sandbox: Sandbox, inventory: Path) -> dict[str, object]:
    """rig-01 serving this module's release (both secrets in its env file); its release record."""
    sandbox.ssh(RIG, "sudo mkdir -p /srv/models/chat-templates && "
                     "{ [ -s /srv/models/chat-templates/froggeric.jinja ] || "
                     "echo '{{ messages }}' | sudo tee /srv/models/chat-templates/froggeric.jinja >/dev/null; }")
    proc = subprocess.run([bin_path("pyinfra"), "-y", "inventory.py", "deploy.py"], cwd=REPO_ROOT,
                          env={**os.environ, "RIGFLEET_INVENTORY": str(inventory), **SECRET_ENV},
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(sandbox.ssh(RIG, "sudo cat /opt/rigfleet/current/release.json").stdout))


def rigfleet(inventory: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([bin_path("rigfleet"), *args], cwd="/", capture_output=True, text=True, timeout=300,
                          env={**os.environ, "RIGFLEET_INVENTORY": str(inventory), "COLUMNS": str(WIDTH),
                               **(env or {})})
    print(proc.stdout[-3000:], proc.stderr[-3000:])
    return proc


def test_report_has_every_section_and_neither_secret_nor_the_rigs_names(
        sandbox: Sandbox, inventory: Path, serving: dict[str, object], tmp_path: Path) -> None:
    hostname = sandbox.ssh(RIG, "hostname").stdout.strip()
    address = sandbox.address(RIG)
    assert hostname and address
    # the secrets are on the rig where a bug report's raw material would pick them up
    assert API_KEY in sandbox.ssh(RIG, f"sudo docker inspect {serving['container_name']}").stdout
    before = sandbox.ssh(RIG, FOOTPRINT).stdout
    out = tmp_path / "triage.tar.gz"
    proc = rigfleet(inventory, "report", RIG, "-o", str(out), env=SECRET_ENV)
    assert proc.returncode == 0, proc.stderr
    assert sandbox.ssh(RIG, FOOTPRINT).stdout == before  # read-only
    with tarfile.open(out) as tar:
        names = tar.getnames()
        files = {m.name.split("/", 1)[1]: tar.extractfile(m).read().decode()  # type: ignore[union-attr]
                 for m in tar.getmembers() if m.isfile()}
    assert sorted(files) == sorted(["MANIFEST.md", *report.SECTIONS])
    for name, what in report.SECTIONS.items():
        assert f"| {name} | {what} |" in files["MANIFEST.md"]
    everything = "\n".join(names) + "\n" + "\n".join(files.values())
    for leak in (API_KEY, HF_TOKEN, hostname, address):
        assert leak not in everything, leak
    assert "VLLM_API_KEY=<redacted:api_key>" in files["containers.txt"]
    assert "<redacted:hf_token>" in files["containers.txt"]
    # each section holds what the MANIFEST says
    assert "debian" in files["host.txt"].lower() and "<rig-host>" in files["host.txt"]  # uname -a's node name
    assert "uname -r" in files["kernel.txt"] and "cmdline" in files["kernel.txt"]
    assert "nvidia" in files["driver.txt"] and "apt-mark showhold" in files["driver.txt"]
    assert "Server" in files["docker.txt"] and "nvidia" in files["toolkit.txt"].lower()
    assert "running" in files["containers.txt"]
    assert json.loads(files["release.json"])["release_id"] == serving["release_id"]
    assert "services:" in files["compose.yaml"]
    assert json.loads(files["ledger.json"])["current"]["release_id"] == serving["release_id"]
    last = json.loads(files["last-gate-verify.json"])
    assert last["last_gate"]["result"] == "passed" and last["last_gate"]["release_id"] == serving["release_id"]
    assert files["engine.log"].strip() and "Driver Version" in files["nvidia-smi-q.txt"]
    assert json.loads(files["declared.json"])["release_id"] == serving["release_id"]


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[list[str]]:
    if shutil.which("tmux") is None:
        shell.ensure_host_tools(print)  # the sandbox's own way to its host tools
    argv = ["tmux", "-L", f"rigfleet-test-{os.getpid()}", "-f", "/dev/null"]
    yield argv
    subprocess.run([*argv, "kill-server"], capture_output=True)


def capture(tmux: list[str]) -> list[str]:
    # -J joins a line tmux wrapped: a line wider than the pane comes back as one long line
    text = subprocess.run([*tmux, "capture-pane", "-p", "-J", "-t", "watch"], capture_output=True, text=True,
                          check=True).stdout
    return [line.rstrip() for line in text.splitlines()]


STAMP = re.compile(r"rigfleet status --watch\s+(\d\d:\d\d:\d\d UTC)")
ROW = re.compile(rf"^{RIG}\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(.*)$")


def frame_until(tmux: list[str], ready: object, timeout_s: float = 120) -> list[str]:
    """The pane once `ready(lines)` holds (bounded: the watch refreshes every 2 s)."""
    deadline = time.monotonic() + timeout_s
    lines: list[str] = []
    while time.monotonic() < deadline:
        lines = capture(tmux)
        if ready(lines):  # type: ignore[operator]
            return lines
        time.sleep(0.5)
    raise AssertionError("the pane never showed the expected frame:\n" + "\n".join(lines))


def stamp(lines: list[str]) -> str | None:
    found = [m[1] for line in lines if (m := STAMP.search(line))]
    return found[-1] if found else None


def rig_row(lines: list[str]) -> re.Match[str] | None:
    rows = [m for line in lines if (m := ROW.match(line))]
    return rows[0] if rows else None


def test_status_watch_in_an_80_column_terminal_shows_every_field_and_updates(
        sandbox: Sandbox, inventory: Path, serving: dict[str, object], tmux: list[str]) -> None:
    # the terminal's own width, not a COLUMNS this process may carry
    command = (f"env -u COLUMNS -u LINES RIGFLEET_INVENTORY={inventory} {bin_path('rigfleet')} "
               "status --watch --interval 2")
    subprocess.run([*tmux, "new-session", "-d", "-s", "watch", "-x", str(WIDTH), "-y", "50", command], check=True)
    first = frame_until(tmux, lambda lines: stamp(lines) and rig_row(lines) and any("MHz" in x for x in lines))
    headers = " ".join(first)
    for field in ("rig", "variant", "health", "reqs", "KV", "tok/s", "acc", "gate", "verify",
                  "GPU", "temp", "power / cap", "memory", "SM clock", "Xid"):
        assert field in headers, field
    row = rig_row(first)
    assert row is not None
    variant, health, reqs, kv, _tokens, acc, verdicts = row.groups()
    assert health == "healthy" and re.fullmatch(r"\d+/\d+", reqs) and kv.endswith("%"), row[0]
    assert re.fullmatch(r"[\d.]+|-", acc), row[0]
    assert verdicts.split()[0] == "ok", row[0]  # the last gate: the deploy's, passed
    assert str(serving["release_id"]).startswith(variant.rstrip("…")), (variant, serving["release_id"])
    gpus = [line for line in first if line.startswith(RIG) and " C " in f"{line} " and "MHz" in line]
    assert len(gpus) == 2 and all(re.search(r"\d+/\d+ W", g) and "GiB" in g for g in gpus), gpus
    assert re.search(r"MHz\s+\d+$", gpus[0]), gpus[0]  # the Xid count on the rig's first GPU row

    # traffic while the view refreshes: the frame's timestamp moves (tokens/s is not asserted: in two
    # sandbox runs the 1 s /metrics sample of the view never caught the stand-in engine's short replies)
    stop = threading.Event()
    port = int(str(serving["port"]))

    def traffic() -> None:
        for _ in range(40):
            if stop.is_set():
                return
            chat_completion(sandbox.address(RIG), port, API_KEY, max_tokens=200)

    worker = threading.Thread(target=traffic, daemon=True)
    worker.start()
    try:
        busy = frame_until(tmux, lambda lines: stamp(lines) not in (None, stamp(first)) and rig_row(lines) is not None)
    finally:
        stop.set()
        worker.join(timeout=120)
    assert stamp(busy) != stamp(first)
    assert rig_row(busy)[2] == "healthy"  # type: ignore[index]
    for frame in (first, busy):
        wide = [line for line in frame if len(line) > WIDTH]
        assert not wide, wide
