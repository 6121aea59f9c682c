"""What changes for one rig between two releases (typically the same rig on two pin sets): image,
vLLM version, patch tree, serve flags and container environment. Pure: renders, contacts nothing
(the release records `repin` diffs from are read by its caller)."""

from __future__ import annotations

from collections.abc import Mapping

from rigfleet import catalog, release
from rigfleet.errors import InputError, Problem, one_of
from rigfleet.loader import Fleet
from rigfleet.render import Release
from rigfleet.rigstate import LedgerEntry


def _tree(release: Release) -> str:
    tree = release.pinset.genesis
    return f"{tree.kind} {tree.version or ''} {tree.commit[:12]}".replace("  ", " ") if tree else "none"


def _flags(args: list[str]) -> dict[str, str]:
    """--flag -> its value(s) joined ('' for a switch)."""
    out: dict[str, list[str]] = {}
    current = None
    for arg in args:
        if arg.startswith("--"):
            current = arg
            out[current] = []
        elif current is not None:
            out[current].append(arg)
    return {flag: " ".join(values) for flag, values in out.items()}


def _mapping(kind: str, before: dict[str, str], after: dict[str, str]) -> list[str]:
    lines = []
    for name in sorted(before.keys() | after.keys()):
        old, new = before.get(name), after.get(name)
        if old == new:
            continue
        if old is None:
            lines.append(f"{kind} + {name} {new}".rstrip())
        elif new is None:
            lines.append(f"{kind} - {name} {old}".rstrip())
        else:
            lines.append(f"{kind} ~ {name} {old} -> {new}")
    return lines


def diff(before: Release, after: Release) -> list[str]:
    """One line per change, in a fixed order (pin set, image, vLLM, tree, variant, flags, env);
    empty when both render the same."""
    lines = []
    for what, old, new in (("pinset", before.pinset.name, after.pinset.name),
                           ("image", before.image, after.image),
                           ("vllm", before.pinset.vllm_version, after.pinset.vllm_version),
                           ("patch tree", _tree(before), _tree(after)),
                           ("variant", before.variant.name, after.variant.name)):
        if old != new:
            lines.append(f"{what}: {old} -> {new}")
    lines += _mapping("flag", _flags(before.serve_args()), _flags(after.serve_args()))
    lines += _mapping("env", before.environment(), after.environment())
    return lines


def changes_from(fleet: Fleet, rigs: list[str], spec: str) -> dict[str, list[str]]:
    """Per rig: what changes from SPEC (`PINSET` or `PINSET:VARIANT`, the release it runs now) to
    what the inventory declares. An unknown name is an InputError naming the option and the fix."""
    name, _, variant = spec.partition(":")
    if name not in fleet.pinsets:
        raise InputError([Problem("--from", "pinset", name, "no pin set of that name in pinsets.yml",
                                  one_of(name, fleet.pinsets, "pin sets"))])
    if variant and variant not in catalog.variants():
        raise InputError([Problem("--from", "variant", variant, "not a known variant",
                                  one_of(variant, catalog.variants(), "variants"))])
    out = {}
    for rig_name in rigs:
        rig = fleet.rig(rig_name)
        before = rig.model_copy(update={"pinset": name, "variant": variant or rig.variant})
        out[rig_name] = diff(release.resolve(fleet, before), release.resolve(fleet, rig))
    return out


# What `changes_from_records` says for a rig it cannot diff (no record, unreachable, unknown pin set).
UNREACHABLE = "unreachable: its running pin set is unknown, nothing to diff"
NO_RECORD = "no release recorded on the rig (a first deploy): everything is new"


def changes_from_records(fleet: Fleet, rigs: list[str],
                         records: Mapping[str, LedgerEntry | None]) -> dict[str, tuple[str, list[str] | None]]:
    """Per rig: (where 'before' came from, what changes, or None when there is nothing to diff),
    from the release its ledger records as serving (`records[rig]`, None for a rig without one; a
    rig missing from `records` was not reachable) to what the inventory declares. `repin` without
    `--from` shows this."""
    out: dict[str, tuple[str, list[str] | None]] = {}
    for rig_name in rigs:
        if rig_name not in records:
            out[rig_name] = (UNREACHABLE, None)
            continue
        current = records[rig_name]
        if current is None or not current.pinset:
            out[rig_name] = (NO_RECORD, None)
            continue
        rig = fleet.rig(rig_name)
        variant = current.variant or rig.variant
        label = f"from {current.pinset}:{variant} (its release record)"
        if current.pinset not in fleet.pinsets or variant not in catalog.variants():
            out[rig_name] = (f"{label}: not in this inventory's pin sets or the variants, "
                             "nothing to diff (pass --from PINSET[:VARIANT])", None)
            continue
        before = rig.model_copy(update={"pinset": current.pinset, "variant": variant})
        out[rig_name] = (label, diff(release.resolve(fleet, before), release.resolve(fleet, rig)))
    return out
