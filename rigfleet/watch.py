"""The frame of `rigfleet status --watch`: two tables (rigs, then GPUs) from rigfleet.live rows.

Every cell stays on one line (no_wrap, ellipsis when a console is too narrow) and the columns
are short enough that a fleet's frame fits 80 columns without truncating the usual values.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

HEALTH_STYLE = {"healthy": "green", "no release": "yellow"}
HEALTH_SHORT = {"unreachable": "offline", "no release": "none"}  # the JSON keeps the long words


def _table(title: str | None, columns: list[tuple[str, str]]) -> Table:
    # one space between columns (the box's own), none at the edges: 80 columns go a long way
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 0), show_edge=False)
    for header, justify in columns:
        table.add_column(header, justify=justify, no_wrap=True, overflow="ellipsis")  # type: ignore[arg-type]
    return table


def _num(value: Any, fmt: str = "{:g}", unit: str = "") -> str:
    return "-" if value is None else fmt.format(value) + unit


def _verdict(entry: dict[str, Any] | None) -> Text:
    if not entry or not entry.get("result"):
        return Text("-")
    ok = entry["result"] == "passed"
    label = ("ok" if ok else "FAIL") + (f" {entry['level']}" if entry.get("level") else "")
    return Text(label, style="green" if ok else "red")


def rig_table(rows: list[dict[str, Any]], title: str | None = None) -> Table:
    table = _table(title, [("rig", "left"), ("variant", "left"), ("health", "left"), ("reqs", "right"),
                           ("KV", "right"), ("tok/s", "right"), ("acc", "right"), ("gate", "left"),
                           ("verify", "left")])
    for r in rows:
        reqs = "-" if r["requests_running"] is None else f"{r['requests_running']}/{r['requests_waiting'] or 0}"
        kv = r["kv_cache_pct"]
        health = Text(HEALTH_SHORT.get(r["health"], r["health"]), style=HEALTH_STYLE.get(r["health"], "red"))
        table.add_row(
            r["rig"], r["variant"] or "-", health, reqs,
            Text(_num(kv, "{:.0f}", "%"), style="red" if kv is not None and kv > 95 else ""),
            _num(r["tokens_per_s"], "{:.0f}"), _num(r["acceptance_length"], "{:.2f}"),
            _verdict(r["last_gate"]), _verdict(r["last_verify"]))
    return table


def gpu_table(rows: list[dict[str, Any]]) -> Table:
    table = _table(None, [("rig", "left"), ("GPU", "right"), ("temp", "right"), ("power / cap", "right"),
                          ("memory", "right"), ("SM clock", "right"), ("Xid", "right")])
    for r in rows:
        for n, gpu in enumerate(r["gpus"]):
            declared = r["power_cap_declared_w"]
            cap = gpu["power_cap_w"]
            off = declared is not None and cap is not None and abs(cap - declared) > 1
            power = f"{_num(gpu['power_w'], '{:.0f}')}/{_num(cap, '{:.0f}')} W" + (f" (want {declared})" if off else "")
            temp = gpu["temp_c"]
            used, total = gpu["memory_used_mib"], gpu["memory_total_mib"]
            memory = "-" if used is None or total is None else f"{used / 1024:.1f}/{total / 1024:.1f} GiB"
            xid = r["xid_errors"]  # the rig's kernel log since boot: on its first GPU's row
            table.add_row(r["rig"], str(gpu["index"]),
                          Text(_num(temp, "{:.0f}", " C"), style="red" if temp is not None and temp > 85 else ""),
                          Text(power, style="red" if off else ""), memory, _num(gpu["clock_sm_mhz"], "{:.0f}", " MHz"),
                          Text(_num(xid, "{}") if n == 0 else "", style="red" if xid else ""))
    return table


def frame(rows: list[dict[str, Any]], when: datetime | None = None) -> RenderableType:
    stamp = (when or datetime.now(timezone.utc)).strftime("%H:%M:%S UTC")
    parts: list[RenderableType] = [rig_table(rows, f"rigfleet status --watch  {stamp}")]
    if any(r["gpus"] for r in rows):
        parts.append(gpu_table(rows))
    return Group(*parts)


def watch(collect: Callable[[], list[dict[str, Any]]], interval_s: float, count: int | None,
          console: Console, sleep: Callable[[float], None] | None = None) -> list[dict[str, Any]]:
    """Refresh every interval_s seconds; stop after `count` frames (None: until interrupted)."""
    sleep = sleep or time.sleep
    rows = collect()
    shown = 1
    with Live(frame(rows), console=console, auto_refresh=False, transient=False) as live:
        while count is None or shown < count:
            sleep(interval_s)
            rows = collect()
            live.update(frame(rows), refresh=True)
            shown += 1
    return rows
