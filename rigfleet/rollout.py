"""Fleet re-pin in waves: canary first, then waves of N, halting at the first failure.

A re-pin is a reviewed change to the inventory (a new `pinset`, or a new `variant`); `repin`
rolls out what the inventory declares. Each rig converges through the same roles as
`pyinfra inventory.py deploy.py`, so a rig whose health gate fails rolls itself back to its
previous release, and a rig already on the declared release changes nothing: re-running after a
halt continues where it stopped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from rigfleet import gateway
from rigfleet.errors import FLEET, InputError, Problem
from rigfleet.loader import Fleet
from rigfleet.runner import BUILT, RigOutcome

Converge = Callable[[Fleet, list[str]], dict[str, RigOutcome]]


@dataclass
class WaveResult:
    index: int
    rigs: list[str]
    outcomes: dict[str, RigOutcome]
    seconds: float

    @property
    def failed(self) -> list[str]:
        return [name for name, outcome in self.outcomes.items() if not outcome.ok]


@dataclass
class Rollout:
    plan: list[list[str]]
    waves: list[WaveResult] = field(default_factory=list)
    halted: bool = False

    @property
    def touched(self) -> list[str]:
        return [rig for wave in self.waves for rig in wave.rigs]

    @property
    def untouched(self) -> list[str]:
        done = set(self.touched)
        return [rig for wave in self.plan for rig in wave if rig not in done]

    @property
    def failed(self) -> list[str]:
        return [rig for wave in self.waves for rig in wave.failed]

    @property
    def unreachable(self) -> list[str]:
        return [rig for wave in self.waves for rig, outcome in wave.outcomes.items() if not outcome.reachable]

    @property
    def ok(self) -> bool:
        return not self.failed and not self.untouched

    def image_lines(self) -> list[str]:
        """How many images this rollout built, and where each converged rig got its image."""
        sources = {rig: outcome.image for wave in self.waves for rig, outcome in wave.outcomes.items()
                   if outcome.image is not None}
        if not sources:
            return []
        built = [rig for rig, source in sources.items() if source == BUILT]
        lines = [f"images built: {len(built)}" + (f" (on {', '.join(built)})" if built else "")]
        lines += [f"  {rig}: image {source}" for rig, source in sources.items()]
        return lines


def scope(fleet: Fleet, group: str | None, limit: Iterable[str] | None) -> list[str]:
    """Rigs in scope, in inventory order; names are checked before anything is contacted."""
    names = [rig.name for rig in fleet.rigs]
    if group is not None:
        groups = sorted({g for rig in fleet.rigs for g in rig.groups})
        if group not in groups:
            raise InputError([Problem("fleet", "--group", group, "no such group",
                                      f"groups: {', '.join(groups)}")])
        names = [rig.name for rig in fleet.rigs if group in rig.groups]
    if limit:
        wanted = list(limit)
        for name in wanted:
            fleet.rig(name)  # raises with the closest name
        names = [name for name in names if name in wanted]
    if not names:
        raise InputError([Problem("fleet", "--limit", list(limit or []), "no rig in scope", "widen the scope")])
    return names


def plan_waves(rigs: list[str], canary: str | None, wave_size: int, fleet: Fleet | None = None) -> list[list[str]]:
    """Canary first, then waves of `wave_size`; behind a gateway (`fleet` given) a wave is split where
    it would leave a model fewer serving backends than gateway_min_serving."""
    waves = _waves(rigs, canary, wave_size)
    return spare_waves(fleet, waves) if fleet is not None else waves


def spare_waves(fleet: Fleet, plan: list[list[str]]) -> list[list[str]]:
    """A wave never takes out more rigs than the fleet can spare: every model keeps at least
    gateway_min_serving backends in the gateway. A model that cannot (too few rigs serve it) is
    refused here, before any rig is touched."""
    gw = gateway.of(fleet)
    if gw is None:
        return plan
    minimum = fleet.rig(gw.rig).gateway_min_serving
    in_scope = {rig for wave in plan for rig in wave}
    servers = {route.model: {s.rig for s in route.servers} for route in gw.routes}
    problems = [
        Problem(FLEET, "gateway_min_serving", minimum,
                f"model {model} is served by {len(rigs)} rig(s) ({', '.join(sorted(rigs))}): re-pinning "
                f"{'it' if len(rigs) == 1 else 'one of them'} would leave fewer than {minimum} serving it",
                "add a rig that serves it, leave its rigs out of the scope (--limit/--group), or set "
                "gateway_min_serving: 0 on the gateway host to accept the outage")
        for model, rigs in sorted(servers.items()) if rigs & in_scope and len(rigs) - 1 < minimum]
    if problems:
        raise InputError(problems)

    def spares(wave: list[str]) -> bool:
        return all(len(rigs - set(wave)) >= minimum for rigs in servers.values())

    out: list[list[str]] = []
    for wave in plan:
        current: list[str] = []
        for rig in wave:
            if current and not spares([*current, rig]):
                out.append(current)
                current = []
            current.append(rig)
        out.append(current)
    return out


def _waves(rigs: list[str], canary: str | None, wave_size: int) -> list[list[str]]:
    if wave_size < 1:
        raise InputError([Problem("fleet", "--wave", wave_size, "a wave needs at least one rig",
                                  "use --wave 1 or more")])
    canary = canary or rigs[0]
    if canary not in rigs:
        raise InputError([Problem(canary, "--canary", canary, "the canary is not in the rollout's scope",
                                  f"choose one of: {', '.join(rigs)}")])
    rest = [rig for rig in rigs if rig != canary]
    return [[canary]] + [rest[i:i + wave_size] for i in range(0, len(rest), wave_size)]


def without_drain(fleet: Fleet) -> Fleet:
    """`--no-drain`: swaps stop engines while the gateway still routes to them (for comparison)."""
    return replace(fleet, rigs=tuple(rig.model_copy(update={"drain": False}) for rig in fleet.rigs))


def canary_fleet(fleet: Fleet, canary: str) -> Fleet:
    """Re-pins gate the canary at level `full` (the failure signatures throughput hides)."""
    rigs = tuple(rig.model_copy(update={"gate": "full"}) if rig.name == canary else rig for rig in fleet.rigs)
    return replace(fleet, rigs=rigs)  # everything else kept: the mirror map too


def run(fleet: Fleet, plan: list[list[str]], converge: Converge, max_failures: int = 1,
        on_wave: Callable[[WaveResult], None] | None = None,
        on_start: Callable[[int, list[str]], None] | None = None) -> Rollout:
    rollout = Rollout(plan)
    canary_gate = canary_fleet(fleet, plan[0][0])
    failures = 0
    for index, rigs in enumerate(plan):
        if on_start:
            on_start(index, rigs)
        started = time.monotonic()
        outcomes = converge(canary_gate if index == 0 else fleet, rigs)
        wave = WaveResult(index, rigs, outcomes, time.monotonic() - started)
        rollout.waves.append(wave)
        if on_wave:
            on_wave(wave)
        failures += len(wave.failed)
        if failures >= max_failures:
            rollout.halted = True
            break
    return rollout
