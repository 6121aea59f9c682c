"""`rigfleet status`: read-only state of every rig and its drift from the inventory.

One remote command per rig: a stdlib-only probe runs on the rig and prints JSON (host stack,
ledger, serving container), so a status over a large fleet stays cheap.
"""

from __future__ import annotations

import json
from typing import Any

from pyinfra.api import FactBase

from rigfleet import catalog, exposure, gateway, ledger, live, rigpython, runner
from rigfleet.facts.serving import ServingState
from rigfleet.loader import Fleet
from rigfleet.release import resolve
from rigfleet.render import Release, clamped_power_limit
from rigfleet.rigstate import LEDGER_PATH, LedgerEntry
from rigfleet.schema import Rig

# the kernel image metapackages of the supported platforms (platforms.yaml kernel.image)
KERNEL_METAS = sorted({p["kernel"]["image"] for p in catalog.platforms()["platforms"].values()})
# Runs on the rig (python3 is there on every supported distro); never fails, always prints JSON.
PROBE = r'''
import json, platform, subprocess
def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception:
        return ""
osr = {}
for line in open("/etc/os-release").read().splitlines():
    if "=" in line:
        key, value = line.split("=", 1)
        osr[key] = value.strip('"')
out = {"os": (osr.get("ID", "?") + " " + osr.get("VERSION_ID", "")).strip(), "kernel": platform.release()}
out["nvidia_smi"] = sh("nvidia-smi --query-gpu=index,driver_version,persistence_mode,power.limit "
                       "--format=csv,noheader,nounits 2>&1")
out["held"] = sh("apt-mark showhold 2>/dev/null").split()
# the distribution kernel's metapackage (@KERNEL_METAS@): installed version and apt's candidate
out["kernel_package"] = None
for meta in @KERNEL_METAS@:
    got = sh("dpkg-query -W -f '${db:Status-Abbrev} ${Version}' " + meta + " 2>/dev/null").split()
    if len(got) == 2 and got[0] in ("ii", "hi"):  # installed, or installed and held
        policy = sh("apt-cache policy " + meta + " 2>/dev/null").splitlines()
        cand = [l.split(":", 1)[1].strip() for l in policy if l.strip().startswith("Candidate:")]
        out["kernel_package"] = {"name": meta, "installed": got[1], "candidate": cand[0] if cand else ""}
        break
out["docker"] = sh("docker version --format '{{.Server.Version}}' 2>/dev/null")
out["toolkit"] = sh("nvidia-ctk --version 2>/dev/null | head -n 1")
try:
    out["ledger"] = json.load(open("@LEDGER@"))
except Exception:
    out["ledger"] = None
out["containers"] = sh("docker ps -a --filter label=io.rigfleet.release --format "
                       "'{{.Label \"io.rigfleet.release\"}} {{.State}} {{.Status}}' 2>/dev/null").splitlines()
print(json.dumps(out))
'''.replace("@LEDGER@", LEDGER_PATH).replace("@KERNEL_METAS@", repr(KERNEL_METAS))


class RigProbe(FactBase):
    """Everything `status` shows, in one command."""

    def command(self) -> str:
        return rigpython.command(PROBE)

    def process(self, output: list[str]) -> dict[str, Any]:
        return dict(json.loads("\n".join(output)))


# `status --json` wants both programs' fields: they run in one remote command (one SSH session
# per rig), each with its stdout captured and kept under its name; one that raises is None.
BOTH = r'''
import contextlib, io, json
def run(source):
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            exec(compile(source, "<rigfleet>", "exec"), {"__name__": "__main__"})
        return json.loads(buf.getvalue())
    except BaseException:
        return None
print(json.dumps({"status": run(@STATUS@), "live": run(@LIVE@)}))
'''


def both_source(status_source: str = PROBE, live_source: str = live.SNIPPET) -> str:
    return BOTH.replace("@STATUS@", repr(status_source)).replace("@LIVE@", repr(live_source))


class StatusAndLiveProbe(FactBase):
    """RigProbe's and live.LiveProbe's outputs from one command: {"status": ..., "live": ...}."""

    def command(self) -> str:
        return rigpython.command(both_source())

    def process(self, output: list[str]) -> dict[str, Any]:
        return dict(json.loads("\n".join(output)))


def _current(raw: Any) -> LedgerEntry | None:
    return ledger.load(raw, "").current


def _gpus(smi: str) -> list[dict[str, str]] | None:
    """Rows of the probe's nvidia-smi query, or None when it did not answer with GPU rows."""
    rows = []
    for line in smi.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4 or not parts[0].isdigit():
            return None
        rows.append({"index": parts[0], "driver": parts[1], "persistence": parts[2], "power": parts[3]})
    return rows or None


def drift(release: Release, probe: dict[str, Any]) -> list[str]:
    """Every difference between what the inventory declares and what the rig has."""
    rig, pinset, variant = release.rig, release.pinset, release.variant
    found: list[str] = []
    current = _current(probe.get("ledger"))
    want_release = release.release_id()
    if not current:
        found.append(f"release: none (want {variant.name} on {pinset.name})")
    else:
        if current.pinset != pinset.name:
            found.append(f"pinset: {current.pinset} (want {pinset.name})")
        if current.variant != variant.name:
            found.append(f"variant: {current.variant} (want {variant.name})")
        if current.image not in (None, release.image) or current.image_tag not in (None, release.image):
            found.append(f"image: {current.image_ref} (want {release.image})")
        if current.release_id != want_release and not found:
            found.append(f"release: {current.release_id} (want {want_release})")
    states = {line.split(" ", 1)[0]: line for line in probe.get("containers", [])}
    if current and not any(line.split(" ")[1:2] == ["running"] for line in states.values()):
        mine = states.get(str(current.get("release_id")), "").split(" ", 2)
        # an engine that died after its gate passed: say how (docker's state and status)
        found.append(f"serving: release {current.get('release_id')} {mine[1]} ({mine[2] if len(mine) > 2 else '?'}); "
                     "the next converge restarts it through the gate" if len(mine) > 1
                     else "serving: no rigfleet container running")
    gpus = _gpus(probe.get("nvidia_smi", ""))
    if gpus is None:
        text = probe.get("nvidia_smi", "") or "nvidia-smi missing"
        found.append("driver: " + ("mismatch, reboot needed" if "mismatch" in text else text.splitlines()[0][:80]))
    else:
        if len(gpus) != rig.gpu_count:
            found.append(f"gpus: {len(gpus)} seen (want {rig.gpu_count})")
        version = gpus[0]["driver"]
        if not version.startswith(f"{pinset.driver.branch}."):
            found.append(f"driver: {version} (want branch {pinset.driver.branch})")
        if pinset.driver.version and not version.startswith(pinset.driver.version.split("-")[0]):
            found.append(f"driver: {version} (want {pinset.driver.version})")
        if any(g["persistence"] != "Enabled" for g in gpus):
            found.append("persistence mode: off")
        want_power = clamped_power_limit(rig)
        if want_power is not None:
            for gpu in gpus:
                if abs(float(gpu["power"] or 0) - want_power) > 1:
                    found.append(f"power limit GPU{gpu['index']}: {gpu['power']} W (want {want_power} W)")
    held = set(probe.get("held", []))
    if not any(name.startswith(("nvidia-", "cuda-", "linux-modules-nvidia")) for name in held):
        found.append("driver packages: not held")
    kernel = probe.get("kernel_package")
    if kernel and kernel["name"] not in held:
        found.append(f"kernel: {kernel['name']} not held (an upgrade can move it without the driver's modules)")
    return found


class GatewayStat(FactBase):
    """The gateway's `show stat` through its runtime API; an empty answer: HAProxy is not up."""

    def command(self) -> str:
        return gateway.runtime_command("show stat") + " 2>/dev/null || true"

    def process(self, output: list[str]) -> dict[str, Any]:
        return {"stat": "\n".join(output)}


def gateway_rows(fleet: Fleet, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each row with its rig's state in the fleet's gateway (in, draining, out), the gateway's own
    health on every fronted rig, and the client URL (`gateway_url`) on each rig it fronts."""
    gw = gateway.of(fleet)
    if gw is None:
        return rows
    answers, outcomes = runner.read_facts(fleet, [gw.rig], GatewayStat)
    text = (answers.get(gw.rig) or {}).get("stat", "") if outcomes[gw.rig].reachable else ""
    stat = gateway.parse_stat(text)
    health = "up" if stat else ("down" if outcomes[gw.rig].reachable else "unreachable")
    out = []
    for row in rows:
        if not gw.fronts(row["rig"]):
            out.append(row | {"gateway": "not fronted"})
            continue
        state = gateway.rig_state(stat, gw, row["rig"]) if stat else "unknown"
        out.append(row | {"gateway": state, "gateway_host": gw.rig, "gateway_health": health,
                          "gateway_url": gw.url})
    return out


# What `status` says of a rig's kernel against the policy (the kernel held with the driver, moved
# only by a rigfleet converge): the first that applies, in this order.
KERNEL_STATES = {
    "no-module": "the NVIDIA module does not answer on the running kernel",
    "unheld": "the kernel metapackage is not held: an upgrade can move it away from the module",
    "waiting": "held; a newer kernel waits for a rigfleet converge to move it",
    "held": "held with the driver, nothing newer waiting",
    "unknown": "no supported kernel metapackage installed (a custom kernel)",
}


def kernel_of(probe: dict[str, Any]) -> dict[str, Any]:
    """The rig's kernel as the policy sees it: the running kernel, its metapackage (installed,
    apt's candidate, held), whether the NVIDIA module answers on it, and the KERNEL_STATES key."""
    kernel = probe.get("kernel_package")
    module = _gpus(probe.get("nvidia_smi", "")) is not None  # nvidia-smi answers only when the module fits
    held = kernel["name"] in probe.get("held", []) if kernel else None
    candidate = (kernel.get("candidate") or None) if kernel else None
    waiting = candidate if kernel and candidate not in (None, kernel["installed"], "(none)") else None
    state = ("no-module" if not module else "unknown" if not kernel else "unheld" if not held
             else "waiting" if waiting else "held")
    return {"running": probe.get("kernel"), "package": kernel["name"] if kernel else None,
            "installed": kernel["installed"] if kernel else None, "candidate": candidate, "held": held,
            "waiting": waiting, "module": module, "state": state}


def kernel_label(kernel: dict[str, Any] | None) -> str:
    """The status table's kernel cell: the KERNEL_STATES key, short (`--json` has every field:
    the version that waits, whether a rig without its module is also unheld)."""
    if not kernel:
        return "-"
    return {"no-module": "[red]NO module[/red]", "unheld": "[yellow]NOT held[/yellow]",
            "waiting": "waiting"}.get(kernel["state"], kernel["state"])


def kernel_state(probe: dict[str, Any]) -> str | None:
    """The kernel policy as found, in a sentence: held (and what waits), or not held, and whether
    the NVIDIA module answers for the running kernel."""
    kernel = probe.get("kernel_package")
    if not kernel:
        return None
    module = ("NVIDIA module answers on " if _gpus(probe.get("nvidia_smi", "")) else
              "NO working NVIDIA module on ") + f"running kernel {probe.get('kernel', '?')}"
    found = kernel_of(probe)
    if found["held"]:
        if found["waiting"]:
            return (f"{kernel['name']} held at {kernel['installed']} (not moved); {found['waiting']} waits for a "
                    f"rigfleet converge; {module}")
        return f"{kernel['name']} held at {kernel['installed']}; {module}"
    return f"{kernel['name']} {kernel['installed']} NOT held (may move); {module}"


def collect(fleet: Fleet) -> list[dict[str, Any]]:
    probes, outcomes = runner.read_facts(fleet, [rig.name for rig in fleet.rigs], RigProbe)
    return gateway_rows(fleet, rows_of(fleet, probes, {name: outcome.reachable for name, outcome in outcomes.items()}))


def collect_with_live(fleet: Fleet) -> list[dict[str, Any]]:
    """`status --json`: the status rows with the live view's fields, one remote command per rig."""
    probes, outcomes = runner.read_facts(fleet, [rig.name for rig in fleet.rigs], StatusAndLiveProbe)
    reachable = {name: outcome.reachable for name, outcome in outcomes.items()}
    status_probes = {name: p["status"] for name, p in probes.items() if p and p.get("status") is not None}
    live_rows = [live.row(rig.name, (probes.get(rig.name) or {}).get("live") if reachable[rig.name] else None,
                          clamped_power_limit(rig)) for rig in fleet.rigs]
    return gateway_rows(fleet, live.merge(rows_of(fleet, status_probes, reachable), live_rows))


def rows_of(fleet: Fleet, probes: dict[str, Any], reachable_rigs: dict[str, bool]) -> list[dict[str, Any]]:
    rows = []
    for rig in fleet.rigs:
        release = resolve(fleet, rig)
        probe = probes.get(rig.name)
        reachable = reachable_rigs[rig.name] and probe is not None
        current = _current(probe.get("ledger")) if probe else None
        running = probe is not None and any(" running " in f" {line} " for line in probe.get("containers", []))
        gpus = _gpus(probe.get("nvidia_smi", "")) if probe else None
        rows.append({
            "rig": rig.name,
            "reachable": reachable,
            "os": f"{probe['os']} / {probe['kernel']}" if probe else None,
            "driver": (gpus[0]["driver"] + (" (held)" if any(p.startswith("nvidia-") for p in probe["held"]) else ""))
            if probe and gpus else None,
            "kernel": kernel_of(probe) if probe else None,
            "kernel_policy": kernel_state(probe) if probe else None,
            "docker": probe.get("docker") if probe else None,
            "toolkit": probe.get("toolkit") if probe else None,
            "pinset": current.pinset if current else None,
            "variant": current.variant if current else None,
            "image_tag": current.image_ref if current else None,
            "release_id": current.release_id if current else None,
            "healthy": (running and "unhealthy" not in " ".join(probe.get("containers", []))) if probe else None,
            "kv_pool_tokens": current.kv_pool_tokens if current else None,
            "drift": drift(release, probe) if probe else ["unreachable"],
            "risks": risks(fleet, rig, (current.pinset if current else None) or rig.pinset,
                           (current.variant if current else None) or rig.variant),
            "api_reach": exposure.reach(rig).as_json(),
        })
    return rows


def recorded(fleet: Fleet, names: list[str]) -> dict[str, LedgerEntry | None]:
    """The release each reachable rig's ledger records as serving (None: no ledger or no current
    release); an unreachable rig is left out. Read-only: one command per rig."""
    states, outcomes = runner.read_facts(fleet, names, ServingState)
    return {name: ledger.load(states[name].get("ledger"), name).current
            for name in names if outcomes[name].reachable and name in states}


def risks(fleet: Fleet, rig: Rig, pinset: str, variant: str) -> list[str]:
    """Known upstream risks of the pin set and variant the rig runs (the running release when the
    ledger names one, else the declared): issue, symptom, mitigation. An MTP variant whose drafter
    is off is not exposed to a drafter risk listed for it."""
    found = fleet.pinsets.get(pinset)
    spec = catalog.variants().get(variant)
    if found is None:
        return []
    if rig.mtp_drafter == "off" and spec is not None and spec.mtp_tokens:
        return []
    return [f"{r.issue}: {r.symptom} -> {r.mitigation}" for r in found.risks if not r.variants or variant in r.variants]
