"""What `rigfleet status --watch` (and `status --json`) shows of each rig while it serves.

One read-only command per rig: a stdlib-only snippet on the rig reads the ledger (release, last
gate, last verify), the serving container, the engine's own /metrics twice one second apart
(requests running/waiting, KV cache usage, tokens/s, MTP acceptance length), nvidia-smi (per GPU
temperature, power draw and limit, memory, SM clock) and the kernel log since boot (Xid errors).
The metric names and counting are the gate's (rigfleet.gate.checks), so the view and the verify
ladder read the engine the same way.
"""

from __future__ import annotations

import json
from typing import Any

from pyinfra.api import FactBase

from rigfleet import catalog, rigpython, runner
from rigfleet.gate import checks
from rigfleet.loader import Fleet
from rigfleet.render import clamped_power_limit
from rigfleet.rigstate import CURRENT_LINK, LEDGER_PATH

CURRENT = CURRENT_LINK
# vLLM's metric names and the Xid marker: catalog/monitoring.yaml (with their sources)
_VLLM, _XID = catalog.monitoring()["vllm"], catalog.monitoring()["xid"]
RUNNING = _VLLM["num_requests_running"]
WAITING = _VLLM["num_requests_waiting"]
KV_USAGE = tuple(_VLLM["kv_cache_usage"])
GENERATED = _VLLM["generation_tokens"]
WANTED = (RUNNING, WAITING, *KV_USAGE, GENERATED, checks.DRAFTS, checks.DRAFT_TOKENS, checks.ACCEPTED)
XID_MARK = _XID["marker"]
SMI_FIELDS = "index,temperature.gpu,power.draw,power.limit,memory.used,memory.total"

SNIPPET = r'''
import json, subprocess, time, urllib.error, urllib.request
LEDGER, CURRENT, WANTED, XID, FIELDS = "@LEDGER@", "@CURRENT@", @WANTED@, "@XID@", "@FIELDS@"
def sh(argv, timeout=20):
    try:
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=timeout)
        return p.returncode, p.stdout.decode("utf-8", "replace")
    except Exception:
        return 1, ""
out = {"ledger": None, "container": None, "health": None, "metrics": [], "metrics_s": None, "gpus": "",
       "clocks": "", "xid": None}
try:
    out["ledger"] = json.load(open(LEDGER))
except Exception:
    pass
meta, key = {}, ""
try:
    meta = json.load(open(CURRENT + "/release.json"))
    for line in open(CURRENT + "/rigfleet.env"):
        if line.startswith("VLLM_API_KEY="):
            key = line.split("=", 1)[1].strip()
except Exception:
    pass
if meta.get("container_name"):
    code, text = sh(["docker", "inspect", "--type", "container", meta["container_name"]])
    try:
        state = json.loads(text)[0].get("State") or {}
        out["container"] = {"status": state.get("Status"), "health": (state.get("Health") or {}).get("Status")}
    except Exception:
        pass
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
def get(path):
    req = urllib.request.Request(meta["base_url"].rstrip("/") + path)
    if key:
        req.add_header("Authorization", "Bearer " + key)
    with opener.open(req, timeout=5) as resp:
        return resp.status, resp.read().decode("utf-8", "replace")
if meta.get("base_url"):
    try:
        out["health"] = get("/health")[0]
    except urllib.error.HTTPError as exc:
        out["health"] = exc.code
    except Exception:
        out["health"] = 0
    try:
        stamps = []
        for n in range(2):
            stamps.append(time.time())
            text = get("/metrics")[1]
            out["metrics"].append([line for line in text.splitlines() if line.startswith(WANTED)])
            if n == 0:
                time.sleep(1.0)
        out["metrics_s"] = stamps[1] - stamps[0]
    except Exception:
        pass
out["gpus"] = sh(["nvidia-smi", "--query-gpu=" + FIELDS, "--format=csv,noheader,nounits"])[1]
out["clocks"] = sh(["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits"])[1]
code, text = sh(@JOURNAL@)
if code != 0:
    code, text = sh(["dmesg"])
out["xid"] = sum(1 for line in text.splitlines() if XID in line) if code == 0 else None
print(json.dumps(out))
'''.replace("@LEDGER@", LEDGER_PATH).replace("@CURRENT@", CURRENT).replace("@WANTED@", repr(WANTED)) \
   .replace("@XID@", XID_MARK).replace("@FIELDS@", SMI_FIELDS) \
   .replace("@JOURNAL@", repr(list(_XID["journal_argv"])))


class LiveProbe(FactBase):
    """Everything the live view shows of one rig, in one command (read-only)."""

    def command(self) -> str:
        return rigpython.command(SNIPPET)

    def process(self, output: list[str]) -> dict[str, Any]:
        return dict(json.loads("\n".join(output)))


def _number(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None


def gpus(smi: str, clocks: str) -> list[dict[str, Any]]:
    rows = []
    clock_lines = [line.strip() for line in clocks.splitlines() if line.strip()]
    for n, line in enumerate(line for line in smi.splitlines() if line.strip()):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 6 or not parts[0].isdigit():
            return []  # nvidia-smi said something else (driver mismatch, no GPU)
        temp, draw, cap, used, total = (_number(p) for p in parts[1:])
        rows.append({"index": int(parts[0]), "temp_c": temp, "power_w": draw, "power_cap_w": cap,
                     "memory_used_mib": used, "memory_total_mib": total,
                     "clock_sm_mhz": _number(clock_lines[n]) if n < len(clock_lines) else None})
    return rows


def _last(entries: Any) -> dict[str, Any] | None:
    """The newest gate or verify entry of a ledger list: result, level, when."""
    if not isinstance(entries, list) or not entries or not isinstance(entries[-1], dict):
        return None
    last = entries[-1]
    return {"result": last.get("result"), "level": (last.get("gate") or {}).get("level") or last.get("level"),
            "release_id": last.get("release_id"), "when": last.get("ended") or last.get("started")}


def health(probe: dict[str, Any], current: dict[str, Any]) -> str:
    container = probe.get("container") or {}
    if not current:
        return "no release"
    if container.get("status") != "running":
        return "down" if container else "no engine"
    if container.get("health") == "unhealthy" or probe.get("health") not in (200, None):
        return "unhealthy"
    return "healthy" if probe.get("health") == 200 else "no answer"


def row(name: str, probe: dict[str, Any] | None, declared_cap_w: int | None) -> dict[str, Any]:
    """The live fields of one rig (None where the rig did not say)."""
    out: dict[str, Any] = {"rig": name, "reachable": probe is not None, "release_id": None, "variant": None,
                           "health": "unreachable", "requests_running": None, "requests_waiting": None,
                           "kv_cache_pct": None, "tokens_per_s": None, "acceptance_length": None, "gpus": [],
                           "power_cap_declared_w": declared_cap_w, "xid_errors": probe.get("xid") if probe else None,
                           "last_gate": None, "last_verify": None}
    if probe is None:
        return out
    raw = probe.get("ledger")
    book: dict[str, Any] = raw if isinstance(raw, dict) else {}
    current: dict[str, Any] = book["current"] if isinstance(book.get("current"), dict) else {}
    out.update(release_id=current.get("release_id"), variant=current.get("variant"), health=health(probe, current),
               last_gate=_last(book.get("attempts")), last_verify=_last(book.get("verifications")),
               gpus=gpus(probe.get("gpus") or "", probe.get("clocks") or ""))
    samples = [checks.parse_metrics("\n".join(lines)) for lines in probe.get("metrics") or []]
    if samples:
        now = samples[-1]
        out["requests_running"] = int(now[RUNNING]) if RUNNING in now else None
        out["requests_waiting"] = int(now[WAITING]) if WAITING in now else None
        usage = next((now[k] for k in KV_USAGE if k in now), None)
        out["kv_cache_pct"] = round(100 * usage, 1) if usage is not None else None
        length = checks.acceptance({}, now)[0]  # since the engine started
        out["acceptance_length"] = round(length, 2) if length is not None else None
    if len(samples) == 2 and probe.get("metrics_s") and GENERATED in samples[1]:
        delta = samples[1][GENERATED] - samples[0].get(GENERATED, 0.0)
        out["tokens_per_s"] = round(max(0.0, delta) / float(probe["metrics_s"]), 1)
    return out


def collect(fleet: Fleet, names: list[str] | None = None) -> list[dict[str, Any]]:
    """The live fields of every rig (or of `names`), in inventory order; unreachable rigs included."""
    rigs = [rig for rig in fleet.rigs if names is None or rig.name in names]
    probes, outcomes = runner.read_facts(fleet, [rig.name for rig in rigs], LiveProbe)
    return [row(rig.name, probes.get(rig.name) if outcomes[rig.name].reachable else None, clamped_power_limit(rig))
            for rig in rigs]


LIVE_FIELDS = ("health", "requests_running", "requests_waiting", "kv_cache_pct", "tokens_per_s", "acceptance_length",
               "gpus", "power_cap_declared_w", "xid_errors", "last_gate", "last_verify")


def merge(status_rows: list[dict[str, Any]], live_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`status --json` rows with the live view's fields added (the status fields win on a shared name)."""
    by_rig = {r["rig"]: r for r in live_rows}
    return [row | {k: by_rig[row["rig"]][k] for k in LIVE_FIELDS if row["rig"] in by_rig and k not in row}
            for row in status_rows]
