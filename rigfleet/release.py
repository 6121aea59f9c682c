"""The one answer to "what release should this rig run": its pin set, its variant and its own
settings resolved into a render.Release, from which everything rendered and built follows
(image tag, compose file, env file, serve arguments). Every command and role asks here."""

from __future__ import annotations

from rigfleet import catalog
from rigfleet.errors import InputError, Problem, one_of
from rigfleet.loader import Fleet
from rigfleet.render import Release
from rigfleet.schema import PinSet, Rig, Variant


def parts(fleet: Fleet, rig: Rig) -> tuple[PinSet | None, Variant | None]:
    """The rig's pin set and variant, None for a name the inventory or catalog does not define
    (the guard reports those; resolve refuses them)."""
    return fleet.pinsets.get(rig.pinset), catalog.variants().get(rig.variant)


def resolve(fleet: Fleet, rig: Rig | str) -> Release:
    """RIG (a model or a name) as the release it should run; an unknown rig, pin set or variant is
    an InputError naming the rig, the field and the fix."""
    if isinstance(rig, str):
        rig = fleet.rig(rig)
    pinset, variant = parts(fleet, rig)
    problems = []
    if variant is None:
        problems.append(Problem(rig.name, "variant", rig.variant, "not a known variant",
                                one_of(rig.variant, catalog.variants(), "variants")))
    if pinset is None:
        problems.append(Problem(rig.name, "pinset", rig.pinset, "no pin set of that name in pinsets.yml",
                                one_of(rig.pinset, fleet.pinsets, "pin sets")))
    if pinset is None or variant is None:
        raise InputError(problems)
    return Release(rig, pinset, variant)
