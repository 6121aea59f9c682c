"""`rigfleet pins`: pin sets with provenance, patch tree, risks, rigs, and upstream verification."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from rigfleet.cli_common import USER_ERROR, err, user_errors
from rigfleet.loader import Fleet, load_fleet
from rigfleet.paths import inventory_dir
from rigfleet.render import image_tag
from rigfleet.upstream import fleet as upstream_fleet
from rigfleet.upstream.sources import cache_dir
from rigfleet.upstream.verify import Verdict


def _state(verdict: Verdict) -> str:
    if verdict.unavailable:
        return "not verified"
    if verdict.problems:
        return f"FAILED ({len(verdict.problems)})"
    return "verified"


def pin_rows(fleet: Fleet, verdicts: dict[str, Verdict]) -> list[dict[str, Any]]:
    rows = []
    for name, pinset in sorted(fleet.pinsets.items()):
        verdict = verdicts[name]
        tree = pinset.genesis
        rows.append({
            "pinset": name,
            "description": pinset.description,
            "vllm_version": pinset.vllm_version,
            "base_image": pinset.base_image.ref,
            "image": image_tag(pinset),
            "patch_tree": None if tree is None else {
                "kind": tree.kind, "source": tree.source, "commit": tree.commit, "version": tree.version},
            "verification": _state(verdict),
            "checked_against": verdict.surface_release,
            "notes": verdict.notes + ([verdict.unavailable] if verdict.unavailable else []),
            "problems": [p.render() for p in verdict.problems],
            "risks": [r.model_dump() for r in pinset.risks],
            "variants": list(pinset.variants),
            "rigs": [rig.name for rig in fleet.rigs if rig.pinset == name],
        })
    return rows


@click.command()
@click.option("--verify", "online", is_flag=True,
              help="derive what is not cached: download the vLLM wheel (pip) and clone the patch tree (git)")
@click.option("--json", "as_json", is_flag=True, help="print JSON instead of text")
@click.argument("names", nargs=-1)
@user_errors
def pins(online: bool, as_json: bool, names: tuple[str, ...]) -> None:
    """Pin sets: provenance, patch tree, known risks, rigs, and whether every flag, value and env name
    their variants render exists in the real vLLM release and patch tree. Exit 2 when one fails
    (or, with --verify, cannot be verified)."""
    fleet = load_fleet(inventory_dir())
    verdicts = upstream_fleet.verdicts(fleet, online=online, only=set(names) or None)
    rows = [row for row in pin_rows(fleet, verdicts) if not names or row["pinset"] in names]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    else:
        for row in rows:
            tree = row["patch_tree"]
            click.echo(f"{row['pinset']}: {row['verification']} - vLLM {row['vllm_version']}"
                       + (f" (checked against release {row['checked_against']})" if row["checked_against"] else ""))
            click.echo(f"  image    {row['base_image']} -> {row['image']}")
            click.echo("  tree     " + (f"{tree['kind']} {tree['version'] or ''} {tree['commit']} from {tree['source']}"
                                        if tree else "none (stock vLLM)"))
            click.echo(f"  rigs     {', '.join(row['rigs']) or '-'}; variants checked: "
                       f"{', '.join(sorted(verdicts[row['pinset']].checked)) or '-'}")
            for risk in row["risks"]:
                click.echo(f"  risk     {risk['issue']}: {risk['symptom']} -> {risk['mitigation']}")
            for note in row["notes"]:
                click.echo(f"  note     {note}")
        click.echo(f"(derivations cached in {cache_dir()})")
    for verdict in verdicts.values():
        for problem in verdict.problems:
            err.print(problem.render(), markup=False)
    failed = any(v.problems for v in verdicts.values())
    if failed or (online and any(v.unavailable for v in verdicts.values())):
        sys.exit(USER_ERROR)
