"""Every table fits 80 columns (a non-TTY included): no cell wraps over more than two lines, image
tags and digests are shown short, nothing runs past the width."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from rich.console import Console
from rich.table import Table

from rigfleet import status, tables
from rigfleet.cli import main
from rigfleet.cli_fleet import status_tables

LONG_TAG = "rigfleet/vllm:0.20.2rc1.dev9_g01d4d1ad3-cbd7da9fb3a5acf0"


def body(lines: list[str]) -> list[str]:
    """The lines under the header rule of a SIMPLE_HEAD table."""
    rule = next(i for i, line in enumerate(lines) if set(line.strip()) == {"─"})
    return [line for line in lines[rule + 1:] if line.strip()]


def rendered(table: Table, width: int = 80) -> list[str]:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    console.print(table)
    return console.file.getvalue().splitlines()  # type: ignore[attr-defined]


def test_plan_at_80_columns_keeps_every_row_within_two_lines(example_inventory: Path) -> None:
    result = CliRunner().invoke(main, ["plan"], env={"RIGFLEET_INVENTORY": str(example_inventory), "COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stdout.splitlines() if not line.startswith("warning:")]
    rows = body(lines)
    assert len([line for line in rows if line.startswith("rig-")]) == 4
    assert len(rows) <= 2 * 4, "\n".join(rows)
    assert all(len(line) <= 80 for line in lines)
    assert re.search(r" \d+\.\d+\S*-[0-9a-f]{8}$", rows[0])  # the image tag's short form
    assert "rigfleet/vllm:" not in result.stdout  # the short form, not the full reference


# one probe per kernel state the table shows: held, an update waiting, not held, no module (and not held)
KERNEL_PROBES = [
    {"kernel": "6.12.48+deb13-amd64", "nvidia_smi": smi, "held": held,
     "kernel_package": {"name": "linux-image-amd64", "installed": "6.12.48-1", "candidate": candidate}}
    for smi, held, candidate in [
        ("0, 580.105.08, Enabled, 280.00", ["linux-image-amd64"], "6.12.48-1"),
        ("0, 580.105.08, Enabled, 280.00", ["linux-image-amd64"], "6.12.57-1+sim1"),
        ("0, 580.105.08, Enabled, 280.00", [], "6.12.57-1+sim1"),
        ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver", [], "6.12.48-1"),
    ]
]


def status_row(rig: str, probe: dict[str, Any] = KERNEL_PROBES[1]) -> dict[str, Any]:
    return {"rig": rig, "reachable": True, "os": "debian 13 / 6.12.48+deb13-amd64", "driver": "580.105.08-1",
            "kernel": status.kernel_of(probe),
            "docker": "26.1.5+dfsg1-9+b9", "toolkit": "1.18.0-1", "pinset": "sndr-v12-dev301",
            "variant": "tq3-mtp-genesis", "healthy": True, "kv_pool_tokens": 1220000,
            "api_reach": {"label": "allowlist 10.0.0.5/32, 10.0.0.6/32, 192.168.100.0/24 (key)"},
            "drift": ["driver 580.95.05-1 != pinned 580.105.08-1"]}


def test_status_at_80_columns_is_three_tables_with_rows_within_two_lines() -> None:
    rows = [status_row(f"rig-0{n}", probe) for n, probe in enumerate(KERNEL_PROBES, start=1)]
    made = status_tables("rigfleet status: /srv/fleet/inventory", rows, 80)
    assert len(made) == 3
    for table in made:
        lines = rendered(table)
        assert all(len(line) <= 80 for line in lines)
        assert len(body(lines)) <= 2 * len(rows), "\n".join(lines)
        text = "\n".join(lines)
        # rich drops a column it cannot fit: every header and every rig's whole name must be there
        assert all(column.header in text for column in table.columns), text
        assert all(row["rig"] in text for row in rows), text
    assert len(status_tables("t", rows, 200)) == 1
    host = "\n".join(body(rendered(made[0])))
    states = re.findall(r"md64 (held|waiting|NOT held|NO module) ", host)  # the running kernel, then its state
    assert states == ["held", "waiting", "NOT held", "NO module"], host


def test_short_forms() -> None:
    assert tables.short_image(LONG_TAG) == "0.20.2rc1.d…-cbd7da9f"
    assert tables.short_image("rigfleet/vllm:0.27.1-0123456789abcdef") == "0.27.1-01234567"
    assert tables.short_digest("sha256:" + "ab" * 32) == "sha256:abababababab"
