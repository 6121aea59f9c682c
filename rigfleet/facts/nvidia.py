"""Facts about the NVIDIA driver as nvidia-smi and the kernel report it."""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from typing import Literal

from pyinfra.api import FactBase
from typing_extensions import override

# The fields of the real capture in tests/fixtures/nvidia-smi/h200-580.159.04/query-gpu-csv.txt,
# in that order, so the parser is tested on exactly what this fact runs.
QUERY_FIELDS = (
    "index",
    "name",
    "uuid",
    "pci.bus_id",
    "memory.total",
    "memory.used",
    "driver_version",
    "persistence_mode",
    "power.limit",
    "power.min_limit",
    "power.max_limit",
    "power.default_limit",
    "compute_cap",
    "pstate",
    "temperature.gpu",
)
QUERY_COMMAND = f"nvidia-smi --query-gpu={','.join(QUERY_FIELDS)} --format=csv,noheader,nounits"

MISMATCH = "Driver/library version mismatch"
NO_DRIVER = "couldn't communicate with the NVIDIA driver"
NO_DEVICES = "No devices were found"

SmiStatus = Literal["ok", "absent", "mismatch", "no_driver", "no_devices", "error"]
_RC = re.compile(r"^rc=(\d+|absent)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str
    pci_bus_id: str
    memory_total_mib: int | None
    driver_version: str | None
    persistence_mode: bool | None
    power_limit_w: float | None
    power_min_w: float | None
    power_max_w: float | None
    power_default_w: float | None
    compute_cap: str | None = None


@dataclass(frozen=True)
class NvidiaSmiState:
    """What `nvidia-smi` says; a broken driver is a state here, never an exception."""

    status: SmiStatus
    gpus: tuple[Gpu, ...] = ()
    exit_code: int | None = None
    message: str = ""
    # on a mismatch nvidia-smi names the user-space (NVML) version it carries
    nvml_version: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def driver_version(self) -> str | None:
        versions = {gpu.driver_version for gpu in self.gpus if gpu.driver_version}
        return versions.pop() if len(versions) == 1 else None


def _value(raw: str) -> str | None:
    raw = raw.strip()
    return None if raw in ("", "N/A", "[N/A]", "[Not Supported]", "Not Supported") else raw


def _number(raw: str | None) -> float | None:
    """'700.00', '700.00 W', '143771 MiB' -> float; N/A -> None."""
    if raw is None:
        return None
    match = re.match(r"^(-?[0-9]+(?:\.[0-9]+)?)", raw)
    return float(match.group(1)) if match else None


def parse_query_gpu(lines: list[str], fields: tuple[str, ...] = QUERY_FIELDS) -> tuple[Gpu, ...]:
    """Rows of `--query-gpu=FIELDS --format=csv[,noheader][,nounits]`, header and units optional."""
    rows = [row for row in csv.reader(lines, skipinitialspace=True) if row]
    if rows and rows[0] and rows[0][0].strip() == fields[0]:
        rows = rows[1:]  # a header line (without `noheader`)
    gpus = []
    for row in rows:
        if len(row) != len(fields):
            raise ValueError(f"expected {len(fields)} CSV fields, got {len(row)}: {row!r}")
        values = {name: _value(raw) for name, raw in zip(fields, row, strict=True)}
        memory = _number(values.get("memory.total"))
        persistence = values.get("persistence_mode")
        gpus.append(
            Gpu(
                index=int(values["index"] or 0),
                name=values.get("name") or "",
                uuid=values.get("uuid") or "",
                pci_bus_id=values.get("pci.bus_id") or "",
                memory_total_mib=int(memory) if memory is not None else None,
                driver_version=values.get("driver_version"),
                persistence_mode=None if persistence is None else persistence == "Enabled",
                power_limit_w=_number(values.get("power.limit")),
                power_min_w=_number(values.get("power.min_limit")),
                power_max_w=_number(values.get("power.max_limit")),
                power_default_w=_number(values.get("power.default_limit")),
                compute_cap=values.get("compute_cap"),
            )
        )
    return tuple(gpus)


def parse_smi_output(lines: list[str]) -> NvidiaSmiState:
    """The output of NvidiaSmi's command: nvidia-smi's stdout+stderr, then `rc=N` or `rc=absent`."""
    lines = [line for line in lines if line.strip()]
    rc_line = lines[-1].strip() if lines else ""
    match = _RC.match(rc_line)
    if not match:
        return NvidiaSmiState("error", message=f"no exit status in the output: {rc_line!r}")
    body = lines[:-1]
    if match.group(1) == "absent":
        return NvidiaSmiState("absent", message="nvidia-smi is not installed")
    code = int(match.group(1))
    text = "\n".join(body)
    if code == 0:
        try:
            return NvidiaSmiState("ok", parse_query_gpu(body), exit_code=0)
        except ValueError as exc:
            return NvidiaSmiState("error", exit_code=0, message=str(exc))
    first = body[0].strip() if body else ""
    if MISMATCH in text:
        nvml = re.search(r"NVML library version:\s*(\S+)", text)
        return NvidiaSmiState(
            "mismatch", exit_code=code, message=first, nvml_version=nvml.group(1) if nvml else None
        )
    if NO_DRIVER in text:
        return NvidiaSmiState("no_driver", exit_code=code, message=first)
    if NO_DEVICES in text:
        return NvidiaSmiState("no_devices", exit_code=code, message=first)
    return NvidiaSmiState("error", exit_code=code, message=first)


class NvidiaSmi(FactBase[NvidiaSmiState]):
    """GPUs as nvidia-smi reports them, or why it cannot (absent, mismatch, no driver)."""

    @override
    def command(self) -> str:
        return (
            "if command -v nvidia-smi >/dev/null 2>&1; then "
            f"{QUERY_COMMAND} 2>&1; echo rc=$?; "
            "else echo rc=absent; fi"
        )

    @override
    @staticmethod
    def default() -> NvidiaSmiState:
        return NvidiaSmiState("error", message="no output")

    @override
    def process(self, output: list[str]) -> NvidiaSmiState:
        return parse_smi_output(output)


@dataclass(frozen=True)
class KernelModule:
    """/proc/driver/nvidia/version: the version of the loaded module and its flavour."""

    version: str
    open: bool


def parse_proc_version(lines: list[str]) -> KernelModule | None:
    for line in lines:
        match = re.match(r"^NVRM version:\s+NVIDIA UNIX (.*?)\s+(\d+\.\d+(?:\.\d+)?)\s", line)
        if match:
            return KernelModule(version=match.group(2), open="Open Kernel Module" in match.group(1))
    return None


class NvidiaKernelModule(FactBase["KernelModule | None"]):
    """The loaded NVIDIA kernel module (None when none is loaded)."""

    @override
    def command(self) -> str:
        return "cat /proc/driver/nvidia/version 2>/dev/null || true"

    @override
    def process(self, output: list[str]) -> KernelModule | None:
        return parse_proc_version(output)


@dataclass(frozen=True)
class GpuListEntry:
    index: int
    name: str
    uuid: str


def parse_gpu_list(lines: list[str]) -> tuple[GpuListEntry, ...]:
    """`nvidia-smi -L`: 'GPU 0: NVIDIA H200 (UUID: GPU-...)' per line; other lines are ignored."""
    gpus = []
    for line in lines:
        match = re.match(r"^GPU (\d+): (.+?) \(UUID: ([^)]+)\)", line.strip())
        if match:
            gpus.append(GpuListEntry(int(match.group(1)), match.group(2), match.group(3)))
    return tuple(gpus)


@dataclass(frozen=True)
class Topology:
    """`nvidia-smi topo -m`: the link type between each pair of GPUs (PHB, NODE, SYS, PIX, NV4, ...)."""

    gpus: tuple[str, ...] = ()
    links: dict[str, dict[str, str]] = field(default_factory=dict)

    def nvlinked(self) -> bool:
        pairs = [kind for row in self.links.values() for kind in row.values()]
        return bool(pairs) and all(kind.startswith("NV") for kind in pairs)


def parse_topology(lines: list[str]) -> Topology:
    rows = [_ANSI.sub("", line).rstrip() for line in lines]
    split = [row.split("\t") if "\t" in row else row.split(" ") for row in rows]
    # the header row starts with an empty cell and names the GPU columns
    header = next((cells for cells in split if cells and not cells[0].strip() and "GPU0" in cells), None)
    if header is None:
        return Topology()
    gpu_columns = [cell.strip() for cell in header[1:] if re.fullmatch(r"GPU\d+", cell.strip())]
    links: dict[str, dict[str, str]] = {}
    for cells in split:
        name = cells[0].strip() if cells else ""
        if not re.fullmatch(r"GPU\d+", name):
            continue
        values = [cell.strip() for cell in cells[1 : 1 + len(gpu_columns)]]
        links[name] = {peer: kind for peer, kind in zip(gpu_columns, values, strict=False) if peer != name}
    return Topology(tuple(gpu_columns), links)


class NvidiaTopology(FactBase[Topology]):
    """How the GPUs are connected (PCIe host bridge, NVLink)."""

    @override
    def command(self) -> str:
        return "if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi topo -m 2>/dev/null || true; fi"

    @override
    @staticmethod
    def default() -> Topology:
        return Topology()

    @override
    def process(self, output: list[str]) -> Topology:
        return parse_topology(output)


class CdiDevices(FactBase[list[str]]):
    """CDI device names the toolkit resolves (`nvidia-ctk cdi list`), e.g. nvidia.com/gpu=all."""

    @override
    def command(self) -> str:
        return "if command -v nvidia-ctk >/dev/null 2>&1; then nvidia-ctk cdi list 2>/dev/null || true; fi"

    @override
    @staticmethod
    def default() -> list[str]:
        return []

    @override
    def process(self, output: list[str]) -> list[str]:
        return [line.strip() for line in output if re.fullmatch(r"[\w.-]+/[\w.-]+=[\w.:-]+", line.strip())]


def parse_nvlink_status(lines: list[str]) -> dict[int, int]:
    """`nvidia-smi nvlink --status`: active links per GPU index.

    One 'GPU n: NAME (UUID: ...)' line per GPU with NVLink, then ' Link k: 14.062 GB/s' per
    link ('Link k: <inactive>' when down). GPUs without NVLink print nothing at all.
    """
    active: dict[int, int] = {}
    gpu: int | None = None
    for line in lines:
        text = _ANSI.sub("", line).strip()
        header = re.match(r"^GPU (\d+): ", text)
        if header:
            gpu = int(header.group(1))
            active.setdefault(gpu, 0)
            continue
        link = re.match(r"^Link \d+: (.+)$", text)
        if link and gpu is not None and "inactive" not in link.group(1).lower():
            active[gpu] += 1
    return active


class NvlinkStatus(FactBase[dict[int, int]]):
    """Active NVLink links per GPU index (empty: no NVLink, or no driver)."""

    @override
    def command(self) -> str:
        return (
            "if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi nvlink --status 2>/dev/null || true; fi"
        )

    @override
    @staticmethod
    def default() -> dict[int, int]:
        return {}

    @override
    def process(self, output: list[str]) -> dict[int, int]:
        return parse_nvlink_status(output)


def has_nvlink(topology: Topology, status: dict[int, int], gpus: int) -> bool:
    """NVLink between all GPUs: NV# in `topo -m`, or active links on every GPU in `nvlink -s`."""
    linked = gpus > 1 and len(status) >= gpus and all(count > 0 for count in status.values())
    return topology.nvlinked() or linked
