"""SIMULATED Xid events: the kernel side of a GPU fault, for the monitoring tests.

The real NVIDIA driver logs each Xid to the kernel log as "NVRM: Xid (PCI:0000:01:00): 79, ..."
(docs.nvidia.com/deploy/xid-errors/index.html). A simulated rig is a container with no kernel log
of its own, so the simulated driver's line goes into the rig's journal under the identifier
"kernel", where journald files the real kernel's messages and where rigfleet's collector and live
view read them (catalog/monitoring.yaml, xid.journal_argv).
"""

from __future__ import annotations

import shlex

# the stand-in nvidia-smi's PCI addresses (assets/nvidia/bin/nvidia-smi BUS_IDS)
BUS_IDS = ("00000000:01:00.0", "00000000:02:00.0")

# Xids seen on 3090 serving rigs (vllm#50021: 13 and 31 under MTP load; 79 a card off the bus)
MESSAGES = {
    13: "pid=4242, name=python3, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address",
    31: "pid=4242, name=python3, Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 "
        "faulted @ 0x7f00_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    79: "pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
}


def line(code: int, gpu: int = 0) -> str:
    """The driver's line for Xid `code` on GPU `gpu` (its PCI address without the function)."""
    bus = BUS_IDS[gpu][4:].rsplit(".", 1)[0]  # 00000000:01:00.0 -> 0000:01:00
    return f"NVRM: Xid (PCI:{bus}): {code}, {MESSAGES[code]}"


def inject_command(code: int = 79, gpu: int = 0) -> str:
    """The shell command that logs a simulated Xid on a rig (run there, any user)."""
    return f"logger -t kernel -p warning {shlex.quote(line(code, gpu))}"
