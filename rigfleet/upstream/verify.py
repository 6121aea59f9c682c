"""Verify a pin set against the real upstream: every flag, value and env name its variants render
must exist in the pin's vLLM release and patch tree; the tree must have the declared layout and
allow the pin's vLLM version.

One Problem per mismatch, naming the pin set, the variant, the flag and the closest real name.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from rigfleet.errors import Problem
from rigfleet.render import Release
from rigfleet.schema import MirrorMap, PinSet, Rig, Variant
from rigfleet.upstream.sources import Unavailable, tree_facts, vllm_surface
from rigfleet.upstream.surface import Surface
from rigfleet.upstream.tree import TreeFacts

PATCH_ENV = re.compile(r"^(GENESIS|SNDR)_")
SWITCH = re.compile(r"^(?:GENESIS|SNDR)_(?:ENABLE|DISABLE)_((?:P|PN|G4_|SNDR_)?[0-9A-Za-z]+?)(?:_[A-Z0-9_]+)?$")
# Flags whose value names an entry of a registry rather than a Literal
REGISTRY_VALUES = {"--tool-call-parser": "tool_parsers", "--reasoning-parser": "reasoning_parsers"}


@dataclass
class Verdict:
    pinset: str
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # e.g. "nightly X checked against release Y"
    surface_release: str | None = None
    tree_kind: str | None = None
    unavailable: str | None = None
    checked: list[str] = field(default_factory=list)  # the variants rendered and checked

    @property
    def ok(self) -> bool:
        return self.unavailable is None and not self.problems


def nearest(name: str, choices: Iterable[str]) -> str | None:
    """The closest real name: a longer name that starts with this one wins (GENESIS_ENABLE_PN54 ->
    GENESIS_ENABLE_PN54_GDN_CONTIGUOUS_DEDUP), then the closest spelling."""
    options = sorted(set(choices))
    longer = [c for c in options if c.startswith(name + "_") or c.startswith(name + "-")]
    if longer:
        return min(longer, key=len)
    matches = difflib.get_close_matches(name, options, n=1, cutoff=0.6)
    return matches[0] if matches else None


def probe_rig(pinset: PinSet, variant: str) -> Rig:
    """A plain rig for rendering a variant on a pin set when no rig of the inventory runs it."""
    return Rig.model_validate({"name": "verify", "ssh_hostname": "localhost", "pinset": pinset.name,
                               "variant": variant, "model_dir": "/srv/models"})


def _problem(pinset: str, variant: str, what: str, value: object, message: str, fix: str) -> Problem:
    return Problem(f"pinset {pinset}", f"variant {variant}: {what}", value, message, fix)


def _flags(args: list[str]) -> Iterator[tuple[str, str | None]]:
    for index, arg in enumerate(args):
        if arg.startswith("--"):
            following = args[index + 1] if index + 1 < len(args) else None
            yield arg, following if following is not None and not following.startswith("--") else None


def check_surface(pinset: str, variant: str, release: Release, surface: Surface) -> Iterator[Problem]:
    label = f"vLLM {surface.release}"
    for flag, value in _flags(release.serve_args()):
        if flag not in surface.flags:
            guess = nearest(flag, surface.flags)
            yield _problem(pinset, variant, "flag", flag, f"{label} has no such flag",
                           f"use {guess}" if guess else "remove it from the variant")
            continue
        allowed = surface.choices.get(flag) or getattr(surface, REGISTRY_VALUES.get(flag, ""), None)
        if allowed and value is not None and value not in allowed:
            guess = nearest(value, allowed)
            hint = f"did you mean {guess}? " if guess else ""
            yield _problem(pinset, variant, flag, value, f"{label} does not list this value",
                           f"{hint}{label} accepts: {', '.join(allowed)}")
        if flag == "--speculative-config" and value:
            method = json.loads(value).get("method")
            if method not in surface.speculative_methods:
                yield _problem(pinset, variant, "--speculative-config method", method,
                               f"{label} has no such speculative method",
                               f"use one of: {', '.join(surface.speculative_methods)}")
    for name in release.environment():
        if name.startswith("VLLM_") and name not in surface.env:
            guess = nearest(name, surface.env)
            yield _problem(pinset, variant, "env", name, f"{label} reads no such variable (envs.py)",
                           f"use {guess}" if guess else "remove it")


def check_tree_env(pinset: str, variant: str, release: Release, facts: TreeFacts | None) -> Iterator[Problem]:
    names = [n for n in release.environment() if PATCH_ENV.match(n)]
    if not names:
        return
    if facts is None:
        yield _problem(pinset, variant, "env", names[0], "sets a patch-tree variable but the pin set has no "
                       "patch tree", "add a patch tree to the pin set or choose a variant without one")
        return
    switches = facts.enable_names()
    for name in names:
        if re.match(r"^(GENESIS|SNDR)_(ENABLE|DISABLE)_", name):
            if name in switches:
                continue
            # the dispatcher reads switches only through the registry: the same patch id's real flag
            match = SWITCH.match(name)
            pid = match.group(1) if match else None
            guess = facts.registry.get(pid) if pid else None
            message = f"the {facts.kind} tree at {facts.commit[:12]} reads no such flag (its registry does not list it)"
            if guess and not guess.startswith(("GENESIS_ENABLE_", "SNDR_ENABLE_")):
                yield _problem(pinset, variant, "env", name, message, f"remove it: {pid} is a legacy patch the tree "
                               f"applies unconditionally (its registry flag {guess} has no effect)")
                continue
            guess = guess or nearest(name, switches)
            yield _problem(pinset, variant, "env", name, message, f"use {guess}" if guess else "remove it")
        elif name not in facts.env_read and name not in switches:
            guess = nearest(name, [*facts.env_read, *switches])
            yield _problem(pinset, variant, "env", name, f"the {facts.kind} tree at {facts.commit[:12]} never reads it",
                           f"use {guess}" if guess else "remove it")


def check_tree(name: str, pinset: PinSet, facts: TreeFacts) -> Iterator[Problem]:
    tree = pinset.genesis
    assert tree is not None
    owner = f"pinset {name}"
    if facts.kind != tree.kind:
        found = f"has the {facts.kind} layout" if facts.kind else "has no known patch-tree layout"
        yield Problem(owner, "genesis.kind", tree.kind, f"the tree at {tree.commit[:12]} {found}",
                      f"set kind: {facts.kind}" if facts.kind else "point source/commit at a Genesis or SNDR tree")
        return
    if pinset.vllm_version not in facts.allowlist:
        guess = nearest(pinset.vllm_version, facts.allowlist)
        yield Problem(owner, "vllm_version", pinset.vllm_version,
                      f"not in the {facts.kind} tree's allowlist at {tree.commit[:12]} (its pin gate refuses it)",
                      f"use an allowed vLLM{f' such as {guess}' if guess else ''}, or a tree commit that allows it")


def verify(name: str, pinset: PinSet, releases: dict[str, Release], mirrors: MirrorMap,
           online: bool = False) -> Verdict:
    """`releases`: variant name -> the rendered release to check (a rig's, or a probe rig's)."""
    verdict = Verdict(name)
    try:
        result = vllm_surface(pinset.vllm_version, mirrors, online)
        facts = (tree_facts(pinset.genesis.source, pinset.genesis.commit, mirrors, online)
                 if pinset.genesis else None)
    except Unavailable as exc:
        verdict.unavailable = str(exc)
        return verdict
    surface = result.surface
    verdict.surface_release = surface.release
    if result.stand_in:
        verdict.notes.append(f"vLLM {pinset.vllm_version} is not on PyPI: checked against release {surface.release}")
    if facts is not None:
        verdict.tree_kind = facts.kind
        verdict.problems += list(check_tree(name, pinset, facts))
        if facts.kind != pinset.genesis.kind:  # type: ignore[union-attr]
            return verdict
    verdict.checked = sorted(releases)
    for variant, release in sorted(releases.items()):
        verdict.problems += list(check_surface(name, variant, release, surface))
        verdict.problems += list(check_tree_env(name, variant, release, facts))
    return verdict


def releases_for(pinset: PinSet, variants: dict[str, Variant], rigs: Iterable[Rig]) -> dict[str, Release]:
    """What to check on a pin set: every rig's own release on it, and each declared variant."""
    out: dict[str, Release] = {}
    for rig in rigs:
        if rig.pinset == pinset.name and rig.variant in variants:
            out.setdefault(rig.variant, Release(rig, pinset, variants[rig.variant]))
    for variant in pinset.variants:
        if variant in variants and variant not in out:
            out[variant] = Release(probe_rig(pinset, variant), pinset, variants[variant])
    return out
