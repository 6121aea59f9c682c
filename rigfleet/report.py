"""`rigfleet report RIG`: a redacted triage bundle (tar.gz) to attach to an upstream bug report.

One read-only remote command (one SSH session): a stdlib-only program on the rig gathers every
section as text, each capped at SECTION_LIMIT characters and every command under a timeout, and
prints one JSON object. The control machine then redacts it (rigfleet.redact: the fleet's own
secrets resolved here, secret shapes, the rig's names and addresses, home paths) and writes the
bundle with a MANIFEST.md that says what each file is.
"""

from __future__ import annotations

import io
import ipaddress
import json
import os
import tarfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from pyinfra.api import FactBase

from rigfleet import rigpython, runner
from rigfleet.errors import InputError, Problem
from rigfleet.loader import Fleet
from rigfleet.operations.serving import SecretError, SecretSource
from rigfleet.redact import HOST, Redactor
from rigfleet.release import resolve
from rigfleet.rigstate import CURRENT_LINK, LEDGER_PATH
from rigfleet.schema import Rig

SECTION_LIMIT = 262_144  # characters per section: a bundle stays small enough to attach
DEFAULT_LOG_LINES = 400
MAX_LOG_LINES = 5000
SECRET_FIELDS = ("api_key", "hf_token")

# file in the bundle -> what it is (the MANIFEST's index; the order of the bundle)
SECTIONS: dict[str, str] = {
    "host.txt": "host: OS release, uname, uptime, CPU, memory, disk",
    "kernel.txt": "kernel: release, command line, NVIDIA modules, NVRM/Xid lines of the kernel log since boot",
    "driver.txt": "NVIDIA driver: loaded version, nvidia-smi summary, installed and held driver/CUDA packages",
    "docker.txt": "Docker: docker version and docker info",
    "toolkit.txt": "NVIDIA Container Toolkit: nvidia-ctk version, its runtime config, Docker's daemon.json",
    "containers.txt": "container state: every rigfleet container (docker ps -a) and the serving container's "
                      "docker inspect",
    "release.json": f"the release record of the serving release (release.json of {CURRENT_LINK})",
    "compose.yaml": "the serving release's compose file (the env file with the secrets is never read)",
    "ledger.json": "the rig's ledger: current and previous release, every deploy/rollback attempt, verifications",
    "last-gate-verify.json": "the last gate result (newest attempt) and the last verify result, in full",
    "engine.log": "the serving engine's log, last lines (docker logs --tail)",
    "nvidia-smi-q.txt": "nvidia-smi -q: every GPU's full query",
    "declared.json": "what the inventory declares for the rig (control machine): pin set, variant, image, release",
}

PROGRAM = r'''
import json, os, platform, socket, subprocess
LIMIT, LOG_LINES, LEDGER, CURRENT = @LIMIT@, @LOG_LINES@, "@LEDGER@", "@CURRENT@"
def sh(*argv, timeout=30):
    try:
        p = subprocess.run(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
        text = p.stdout.decode("utf-8", "replace")
        return text if p.returncode == 0 else text + "(exit status %d)\n" % p.returncode
    except FileNotFoundError:
        return "(%s is not installed)\n" % argv[0]
    except Exception as exc:
        return "(%s failed: %s)\n" % (argv[0], exc.__class__.__name__)
def read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(LIMIT + 1)
    except Exception as exc:
        return "(%s: %s)\n" % (path, exc.__class__.__name__)
def block(title, text):
    return "$ " + title + "\n" + text.rstrip("\n") + "\n\n"
def cap(text, tail=False):
    if len(text) <= LIMIT:
        return text
    note = "\n(cut to %d of %d characters)\n" % (LIMIT, len(text))
    return note + text[-LIMIT:] if tail else text[:LIMIT] + note
out = {}
out["host.txt"] = (block("cat /etc/os-release", read("/etc/os-release")) + block("uname -a", sh("uname", "-a"))
                   + block("uptime", sh("uptime")) + block("nproc", sh("nproc"))
                   + block("grep 'model name' /proc/cpuinfo", "\n".join(sorted(set(
                       l for l in read("/proc/cpuinfo").splitlines() if l.startswith("model name")))))
                   + block("free -m", sh("free", "-m")) + block("df -h /", sh("df", "-h", "/")))
klog = sh("journalctl", "-k", "-b", "--no-pager", "-q")
if klog.startswith("(") or "(exit status" in klog:
    klog = sh("dmesg")
nvrm = [l for l in klog.splitlines() if "NVRM" in l or "nvidia" in l.lower()]
out["kernel.txt"] = (block("uname -r", sh("uname", "-r")) + block("cat /proc/cmdline", read("/proc/cmdline"))
                     + block("lsmod | grep nvidia", "\n".join(l for l in sh("lsmod").splitlines() if "nvidia" in l))
                     + block("cat /proc/driver/nvidia/version", read("/proc/driver/nvidia/version"))
                     + block("kernel log since boot, NVRM/nvidia lines (last 300)", "\n".join(nvrm[-300:])))
pkgs = sh("dpkg-query", "-W", "-f", "${Package} ${Version} ${db:Status-Abbrev}\n")
NV = ("nvidia", "cuda", "libnvidia", "linux-modules-nvidia")
out["driver.txt"] = (block("nvidia-smi", sh("nvidia-smi"))
                     + block("dpkg-query -W (nvidia, cuda, libnvidia packages)", "\n".join(
                         l for l in pkgs.splitlines() if l.startswith(NV)))
                     + block("apt-mark showhold", sh("apt-mark", "showhold")))
out["docker.txt"] = block("docker version", sh("docker", "version")) + block("docker info", sh("docker", "info"))
out["toolkit.txt"] = (block("nvidia-ctk --version", sh("nvidia-ctk", "--version"))
                      + block("cat /etc/nvidia-container-runtime/config.toml",
                              read("/etc/nvidia-container-runtime/config.toml"))
                      + block("cat /etc/docker/daemon.json", read("/etc/docker/daemon.json")))
meta = {}
try:
    meta = json.load(open(CURRENT + "/release.json"))
except Exception:
    pass
name = meta.get("container_name") or ""
out["containers.txt"] = block("docker ps -a --filter label=io.rigfleet.release", sh(
    "docker", "ps", "-a", "--no-trunc", "--filter", "label=io.rigfleet.release", "--format",
    "{{.Names}}  {{.Image}}  {{.State}}  {{.Status}}  {{.Label \"io.rigfleet.release\"}}"))
out["containers.txt"] += block("docker inspect " + (name or "(no serving container named)"),
                               sh("docker", "inspect", "--type", "container", name) if name else "")
out["release.json"] = read(CURRENT + "/release.json")
out["compose.yaml"] = read(CURRENT + "/compose.yaml")
out["ledger.json"] = read(LEDGER)
out["engine.log"] = (sh("docker", "logs", "--tail", str(LOG_LINES), name, timeout=60) if name
                     else "(no serving release: no engine log)\n")
out["nvidia-smi-q.txt"] = sh("nvidia-smi", "-q", timeout=60)
out = {k: cap(v, tail=k == "engine.log") for k, v in out.items()}
addresses = []
for line in sh("ip", "-o", "addr", "show").splitlines():
    parts = line.split()
    if len(parts) > 3 and parts[2] in ("inet", "inet6"):
        addresses.append(parts[3].split("/")[0])
homes = []
try:
    homes = ["/home/" + n for n in os.listdir("/home")]
except Exception:
    pass
print(json.dumps({"sections": out, "identity": {"hostnames": [socket.gethostname(), socket.getfqdn(),
                  platform.node()], "addresses": addresses, "homes": homes}}))
'''


def program(log_lines: int) -> str:
    return (PROGRAM.replace("@LIMIT@", str(SECTION_LIMIT)).replace("@LOG_LINES@", str(log_lines))
            .replace("@LEDGER@", LEDGER_PATH).replace("@CURRENT@", CURRENT_LINK))


class ReportProbe(FactBase):
    """Every rig-side section of the report, in one read-only command."""

    def command(self, log_lines: int = DEFAULT_LOG_LINES) -> str:
        return rigpython.command(program(log_lines))

    def process(self, output: list[str]) -> dict[str, Any]:
        return dict(json.loads("\n".join(output)))


class Unreachable(Exception):
    """The rig did not answer (not bad input: the same command may work later)."""


def check_log_lines(text: str) -> int:
    if not text.strip().isdigit() or not 1 <= int(text) <= MAX_LOG_LINES:
        raise InputError([Problem("fleet", "--log-lines", text, "not a number of engine log lines",
                                  f"use 1 to {MAX_LOG_LINES}")])
    return int(text)


def check_output(path: Path) -> Path:
    if path.exists():
        raise InputError([Problem("fleet", "--output", str(path), "already exists (a report is never overwritten)",
                                  "remove it or give another path")])
    if not path.parent.is_dir():
        raise InputError([Problem("fleet", "--output", str(path), "its directory does not exist",
                                  "create the directory or give a path in an existing one")])
    return path


def rig_of(fleet: Fleet, name: str) -> Rig:
    for rig in fleet.rigs:
        if rig.name == name:
            return rig
    raise InputError([Problem(name, "rig", name, "no such rig in the inventory",
                              "use one of: " + ", ".join(r.name for r in fleet.rigs))])


def secret_sources(fleet: Fleet, rig: Rig) -> list[SecretSource]:
    sources = []
    for field_name in SECRET_FIELDS:
        ref = getattr(rig, field_name)
        if ref is not None:
            path = fleet.path(ref.file)
            sources.append(SecretSource(field_name, env=ref.env, path=str(path) if path else None))
    return sources


def fleet_secrets(fleet: Fleet, rig: Rig) -> dict[str, str]:
    """Every secret the fleet references, value -> label: the rig's own must resolve (the report
    cannot redact a value it does not know); another rig's is taken when it resolves here."""
    found: dict[str, str] = {}
    for other in sorted(fleet.rigs, key=lambda r: r.name != rig.name):  # the rig's own first: its labels
        for source in secret_sources(fleet, other):
            try:
                value = source.read()
            except SecretError as exc:
                if other.name != rig.name:
                    continue
                ref = getattr(rig, source.field)
                raise InputError([Problem(rig.name, source.field, ref.model_dump(exclude_none=True), str(exc),
                                          "make the secret readable here as the deploy does (the report redacts "
                                          "its literal value wherever it occurs)")]) from None
            found.setdefault(value, source.field if other.name == rig.name else "fleet secret")
    return found


def is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


GENERIC_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}
LOOPBACK = {"127.0.0.1", "::1"}


@dataclass
class Bundle:
    path: Path
    files: list[str]
    counts: dict[str, int]


def last_results(raw_ledger: str) -> str:
    """The newest gate attempt and the newest verification, whole (their checks included)."""
    try:
        book = json.loads(raw_ledger)
    except ValueError:
        return json.dumps({"error": "the ledger is missing or not JSON (see ledger.json)"}, indent=2) + "\n"
    attempts = book.get("attempts") if isinstance(book, dict) else None
    verifications = book.get("verifications") if isinstance(book, dict) else None
    return json.dumps({"last_gate": attempts[-1] if isinstance(attempts, list) and attempts else None,
                       "last_verify": verifications[-1] if isinstance(verifications, list) and verifications
                       else None}, indent=2) + "\n"


def declared(fleet: Fleet, rig: Rig) -> str:
    release = resolve(fleet, rig)
    return json.dumps({"rig": rig.name, "pinset": rig.pinset, "variant": rig.variant, "image": release.image,
                       "release_id": release.release_id(), "gpu_count": rig.gpu_count, "rigfleet": _version()},
                      indent=2) + "\n"


def _version() -> str:
    try:
        return version("rigfleet")
    except PackageNotFoundError:
        return "unknown"


def manifest(rig: str, files: list[str], redactor: Redactor, when: datetime) -> str:
    identity = ("kept (--no-redact)" if redactor.keep_identity
                else "replaced: the rig's host names by <rig-host>, its addresses by <rig-ip-N>, home paths")
    lines = [f"# rigfleet triage report: {rig if redactor.keep_identity else HOST}", "",
             f"Written {when.strftime('%Y-%m-%d %H:%M:%S UTC')} by rigfleet {_version()}, read-only, "
             "in one SSH session.", "",
             "Redaction: the fleet's secrets (api_key, hf_token, resolved on the control machine) and secret "
             "shapes (hf_ tokens, Bearer tokens, key=/token: values, --api-key flags, private keys) are always "
             f"replaced by <redacted:...>; host names and addresses: {identity}.", "",
             "Replaced: " + (", ".join(f"{kind} x{n}" for kind, n in sorted(redactor.counts.items()) if n)
                             or "nothing"), "", "| file | what it is |", "|---|---|"]
    lines += [f"| {name} | {SECTIONS[name]} |" for name in files]
    return "\n".join(lines) + "\n"


def write(fleet: Fleet, name: str, output: Path | None, keep_identity: bool, log_lines: int) -> Bundle:
    """Read the rig, redact, write the bundle; bad input raises InputError before any contact."""
    rig = rig_of(fleet, name)
    when = datetime.now(timezone.utc)
    label = rig.name if keep_identity else "rig"  # the rig's name is often its host name
    path = check_output(output or Path(f"rigfleet-report-{label}-{when.strftime('%Y%m%dT%H%M%SZ')}.tar.gz"))
    redactor = Redactor(secrets=fleet_secrets(fleet, rig), keep_identity=keep_identity,
                        homes=[str(Path.home())])
    probes, outcomes = runner.read_facts(fleet, [rig.name], ReportProbe, log_lines=log_lines)
    probe = probes.get(rig.name)
    if not outcomes[rig.name].reachable or not probe:
        raise Unreachable(outcomes[rig.name].summary)
    identity = probe.get("identity") or {}
    names = [*identity.get("hostnames", []), rig.ssh_hostname, rig.name]
    redactor.hostnames = [h for h in dict.fromkeys(names) if h and h not in GENERIC_NAMES and not is_address(h)]
    redactor.addresses = [a for a in dict.fromkeys([*identity.get("addresses", []), rig.ssh_hostname])
                          if is_address(a) and a not in LOOPBACK]
    redactor.homes += identity.get("homes", [])
    sections: dict[str, str] = dict(probe.get("sections") or {})
    sections["last-gate-verify.json"] = last_results(sections.get("ledger.json", ""))
    sections["declared.json"] = declared(fleet, rig)
    files = [f for f in SECTIONS if f in sections]
    texts = {f: redactor(sections[f]) for f in files}
    texts = {"MANIFEST.md": manifest(rig.name, files, redactor, when), **texts}
    _tar(path, f"rigfleet-report-{label}", texts, when)
    return Bundle(path, list(texts), dict(redactor.counts))


def _tar(path: Path, top: str, texts: dict[str, str], when: datetime) -> None:
    partial = path.with_name(f".{path.name}.partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # names kept with --no-redact
    with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for name, text in texts.items():
            data = text.encode("utf-8")
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size, info.mtime, info.mode = len(data), int(when.timestamp() or time.time()), 0o644
            tar.addfile(info, io.BytesIO(data))
    partial.rename(path)
