"""nvidia-smi parsers on the real H200 capture and on dual-3090 outputs written from the formats."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rigfleet.facts.nvidia import (
    QUERY_COMMAND,
    Gpu,
    NvidiaSmi,
    has_nvlink,
    parse_gpu_list,
    parse_nvlink_status,
    parse_proc_version,
    parse_query_gpu,
    parse_topology,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi"
H200 = FIXTURES / "h200-580.159.04"
RTX3090 = FIXTURES / "rtx3090x2-580.95.05"


def captures(path: Path) -> dict[str, tuple[list[str], int]]:
    """A capture file: `$ command`, its output, `# exit N`, possibly several in a row."""
    found: dict[str, tuple[list[str], int]] = {}
    command, lines = None, []
    for line in path.read_text().splitlines():
        if line.startswith("$ "):
            command, lines = line[2:], []
        elif (match := re.match(r"^# exit (\d+)$", line)) and command is not None:
            found[command] = (lines, int(match.group(1)))
            command = None
        elif command is not None:
            lines.append(line)
    return found


def one(path: Path) -> tuple[str, list[str], int]:
    [(command, (lines, code))] = captures(path).items()
    return command, lines, code


def smi_fact_output(path: Path) -> list[str]:
    """What NvidiaSmi's command prints for this capture: nvidia-smi's output, then rc=N."""
    command, lines, code = one(path)
    assert command == QUERY_COMMAND, "the capture is of exactly the fact's nvidia-smi command"
    return [*lines, f"rc={code}"]


def test_fact_command_never_fails_the_host() -> None:
    command = NvidiaSmi().command()
    assert command == (
        f"if command -v nvidia-smi >/dev/null 2>&1; then {QUERY_COMMAND} 2>&1; echo rc=$?; "
        "else echo rc=absent; fi"
    )


def test_h200_real_capture() -> None:
    state = NvidiaSmi().process(smi_fact_output(H200 / "query-gpu-csv.txt"))
    assert state.ok and state.exit_code == 0
    assert state.gpus == (
        Gpu(
            index=0,
            name="NVIDIA H200",
            uuid="GPU-00000000-1111-2222-3333-444444444444",
            pci_bus_id="00000000:00:06.0",
            memory_total_mib=143771,
            driver_version="580.159.04",
            persistence_mode=True,
            power_limit_w=700.0,
            power_min_w=200.0,
            power_max_w=700.0,
            power_default_w=700.0,
            compute_cap="9.0",
        ),
    )
    assert state.driver_version == "580.159.04"


def test_h200_real_capture_with_header_and_units() -> None:
    command, lines, _ = one(H200 / "query-gpu-csv-header.txt")
    fields = tuple(re.search(r"--query-gpu=(\S+)", command).group(1).split(","))  # type: ignore[union-attr]
    [gpu] = parse_query_gpu(lines, fields)
    assert (gpu.memory_total_mib, gpu.power_limit_w, gpu.power_min_w, gpu.power_max_w) == (
        143771,
        700.0,
        200.0,
        700.0,
    )
    assert gpu.power_default_w is None  # not queried in that capture
    assert gpu.persistence_mode is True and gpu.compute_cap == "9.0"


def test_3090_pair() -> None:
    state = NvidiaSmi().process(smi_fact_output(RTX3090 / "query-gpu-csv.txt"))
    assert state.ok
    assert [(g.index, g.name, g.memory_total_mib, g.pci_bus_id) for g in state.gpus] == [
        (0, "NVIDIA GeForce RTX 3090", 24576, "00000000:01:00.0"),
        (1, "NVIDIA GeForce RTX 3090", 24576, "00000000:02:00.0"),
    ]
    assert {(g.power_limit_w, g.power_min_w, g.power_max_w, g.power_default_w) for g in state.gpus} == {
        (290.0, 100.0, 350.0, 350.0)
    }
    assert all(g.persistence_mode for g in state.gpus) and state.driver_version == "580.95.05"


def test_3090_after_a_reboot_has_defaults() -> None:
    state = NvidiaSmi().process(smi_fact_output(RTX3090 / "query-gpu-csv-fresh-boot.txt"))
    assert [(g.persistence_mode, g.power_limit_w) for g in state.gpus] == [(False, 350.0), (False, 350.0)]


def test_mismatch_is_a_state_not_an_error() -> None:
    state = NvidiaSmi().process(smi_fact_output(RTX3090 / "mismatch.txt"))
    assert state.status == "mismatch" and not state.ok
    assert state.exit_code == 18 and state.nvml_version == "580.105" and state.gpus == ()
    assert state.message == "Failed to initialize NVML: Driver/library version mismatch"


def test_no_driver_loaded() -> None:
    state = NvidiaSmi().process(smi_fact_output(RTX3090 / "no-driver.txt"))
    assert (state.status, state.exit_code) == ("no_driver", 9)


def test_absent_and_garbage() -> None:
    assert NvidiaSmi().process(["rc=absent"]).status == "absent"
    assert NvidiaSmi().process(["something odd"]).status == "error"
    garbled = NvidiaSmi().process(["0, NVIDIA GeForce RTX 3090", "rc=0"])
    assert garbled.status == "error" and "CSV fields" in garbled.message
    assert NvidiaSmi().process(["No devices were found", "rc=6"]).status == "no_devices"


@pytest.mark.parametrize(
    ("fixture", "expected"),
    [
        (H200 / "nvidia-smi-L.txt", [(0, "NVIDIA H200", "GPU-00000000-1111-2222-3333-444444444444")]),
        (
            RTX3090 / "nvidia-smi-L.txt",
            [
                (0, "NVIDIA GeForce RTX 3090", "GPU-30900000-1111-2222-3333-444444444444"),
                (1, "NVIDIA GeForce RTX 3090", "GPU-30900001-1111-2222-3333-444444444444"),
            ],
        ),
    ],
)
def test_gpu_list(fixture: Path, expected: list[tuple[int, str, str]]) -> None:
    _, lines, _ = one(fixture)
    assert [(g.index, g.name, g.uuid) for g in parse_gpu_list(lines)] == expected


def test_proc_version_open_real_and_proprietary() -> None:
    lines, _ = captures(H200 / "misc.txt")["cat /proc/driver/nvidia/version"]
    module = parse_proc_version(lines)
    assert module is not None and (module.version, module.open) == ("580.159.04", True)
    _, lines, _ = one(RTX3090 / "proc-version-proprietary.txt")
    module = parse_proc_version(lines)
    assert module is not None and (module.version, module.open) == ("580.95.05", False)
    assert parse_proc_version([]) is None


def test_topology_real_single_gpu_and_3090_pairs() -> None:
    _, lines, _ = one(H200 / "topo.txt")
    single = parse_topology(lines)
    assert single.gpus == ("GPU0",) and single.links == {"GPU0": {}} and not single.nvlinked()
    _, lines, _ = one(RTX3090 / "topo.txt")
    pcie = parse_topology(lines)
    assert pcie.links == {"GPU0": {"GPU1": "PHB"}, "GPU1": {"GPU0": "PHB"}} and not pcie.nvlinked()
    _, lines, _ = one(RTX3090 / "topo-nvlink.txt")
    assert parse_topology(lines).nvlinked()


def test_nvlink_status_real_empty_and_3090_bridge() -> None:
    lines, code = captures(H200 / "misc.txt")["nvidia-smi nvlink -s"]
    assert (parse_nvlink_status(lines), code) == ({}, 0)
    _, lines, _ = one(RTX3090 / "nvlink-status.txt")
    assert parse_nvlink_status(lines) == {0: 4, 1: 4}
    down = ["GPU 0: NVIDIA GeForce RTX 3090 (UUID: GPU-a)", "\t Link 0: <inactive>",
            "GPU 1: NVIDIA GeForce RTX 3090 (UUID: GPU-b)", "\t Link 0: <inactive>"]
    assert parse_nvlink_status(down) == {0: 0, 1: 0}


def test_has_nvlink_from_either_source() -> None:
    _, pcie_lines, _ = one(RTX3090 / "topo.txt")
    _, nv_lines, _ = one(RTX3090 / "topo-nvlink.txt")
    pcie, nvlinked = parse_topology(pcie_lines), parse_topology(nv_lines)
    assert has_nvlink(nvlinked, {}, 2)
    assert has_nvlink(pcie, {0: 4, 1: 4}, 2)
    assert not has_nvlink(pcie, {}, 2)
    assert not has_nvlink(pcie, {0: 4, 1: 0}, 2)
    assert not has_nvlink(pcie, {0: 4}, 2)
