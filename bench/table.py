"""`python -m bench.table [bench/results/latest.json]`: the run's metrics as the README's Markdown table."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def fmt(value: float, unit: str) -> str:
    text = f"{value:.0f}" if unit == "count" else f"{value:.2f}"
    return f"{text} {unit}" if unit in ("s", "KiB", "MiB") else text


def main() -> int:
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "bench/results/latest.json")
    run = json.loads(path.read_text())
    print(f"{run['date']}, {run['machine']}, {run['repeats']} runs\n")
    print("| measure | min | median | max | target |")
    print("|---|---|---|---|---|")
    for m in run["metrics"]:
        values = sorted(m["values"])
        name = m["name"].replace("  ", "&nbsp;&nbsp;", 1) if m["name"].startswith("  ") else m["name"]
        if not values:
            print(f"| {name} | - | - | - | {m['target']} |")
            continue
        median = values[len(values) // 2] if len(values) % 2 else sum(values[len(values) // 2 - 1:][:2]) / 2
        target = f"{m['target']}: **{m['met']}**" if m.get("met") else m["target"]
        print(f"| {name} | {fmt(values[0], m['unit'])} | {fmt(median, m['unit'])} | {fmt(values[-1], m['unit'])} "
              f"| {target} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
