"""Upstream verification of a whole fleet: one Verdict per pin set, and the Problems it yields."""

from __future__ import annotations

import os

from rigfleet import catalog
from rigfleet.errors import Problem
from rigfleet.loader import Fleet
from rigfleet.upstream.verify import Verdict, releases_for, verify

# Operators may switch the check off (e.g. a lab with a hand-made nightly); it is then said so.
SKIP_ENV = "RIGFLEET_SKIP_UPSTREAM_VERIFY"


def verdicts(fleet: Fleet, online: bool = False, only: set[str] | None = None) -> dict[str, Verdict]:
    variants = catalog.variants()
    out = {}
    for name, pinset in sorted(fleet.pinsets.items()):
        if only is not None and name not in only:
            continue
        out[name] = verify(name, pinset, releases_for(pinset, variants, fleet.rigs), fleet.mirrors, online)
    return out


def problems(fleet: Fleet) -> list[Problem]:
    """For the guard: mismatches are errors; a pin set that cannot be verified from the cache or a
    local mirror is a warning that says so and how to verify it (check never downloads)."""
    if os.environ.get(SKIP_ENV) == "1":
        return [Problem("fleet", "upstream", None, "upstream verification is switched off",
                        f"unset {SKIP_ENV} to check pin sets against the real vLLM and patch trees", warning=True)]
    found: list[Problem] = []
    for name, verdict in verdicts(fleet).items():
        found += verdict.problems
        if verdict.unavailable:
            found.append(Problem(f"pinset {name}", "upstream", None, f"not verified: {verdict.unavailable}",
                                 "run `rigfleet pins --verify` where PyPI and the tree's git source are reachable "
                                 "(results are cached), or map them to a local mirror in mirrors.yml", warning=True))
    return found
