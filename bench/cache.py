"""The bench's `cache` section: what each rig of a fresh fleet pulls from upstream.

Two fresh SIMULATED rigs, rig-01 in the `cache` group (apt-cacher-ng, rigfleet.fleetcache), the
fleet registry as the sandbox configures it, pin sets whose image build downloads wheels
(with_wheels) and the GPU smoke image from the stand-in upstream registry
(with_upstream_smoke_image). rig-01 converges alone, then rig-02; the stand-in upstream's byte
counter (rigfleet_sandbox.upstreamlog) gives the bytes each converge pulled, by kind: packages
(.deb), apt indexes, Python index (wheels and index pages), images (base image archives, the smoke
image), other (weights, overlays, Genesis, keys). Bytes the cache host fetched on rig-02's behalf
count for rig-02's converge.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from rigfleet.loader import Fleet

# the apt operations (download from the cache, unpack, install), named as the roles name them
PACKAGE_OPS = re.compile(
    r"^(Tools |NVIDIA driver|Driver version lock|Kernel headers|NVIDIA Container Toolkit$|Docker CE$"
    r"|Docker from the distribution|apt-cacher-ng from|Node exporter from|HAProxy|Prometheus from)"
)
KINDS = ("package", "index", "python", "image", "other")
MIB = 1024 * 1024
SECOND_RIG_SLOWEST: dict[str, float] = {}  # of the last run: where the 2nd rig's converge spends its time
SECOND_RIG_OPERATIONS: dict[str, float] = {}  # of the last run: every operation of it, slowest first


def with_cache_group(fleet: Fleet, rig: str) -> Fleet:
    rigs = tuple(r.model_copy(update={"groups": (*r.groups, "cache")}) if r.name == rig else r for r in fleet.rigs)
    return Fleet(fleet.inventory_dir, rigs, fleet.pinsets, fleet.sources, fleet.pyinfra_data)


def with_wheels(fleet: Fleet) -> Fleet:
    """Pin sets whose image build downloads Python wheels: the real PyPI wheels of the shipped
    trees' build requirements, from the sandbox's PEP 503 index (the stand-in upstream counts
    them as `python`). The sandbox's own pin sets bake none (its SIMULATED engine imports none),
    so without this neither rig pulls a wheel and the wheels ratio has nothing to measure."""
    from rigfleet_sandbox import stacks
    from rigfleet_sandbox.layout import CACHE_DIR, WWW_DIR

    deps = stacks.build_requirements()
    index = stacks.build_index(WWW_DIR, deps, CACHE_DIR)
    pinsets = {name: pinset.model_copy(update={"python_deps": {**pinset.python_deps, **deps}, "pip_index_url": index})
               for name, pinset in fleet.pinsets.items()}
    return Fleet(fleet.inventory_dir, fleet.rigs, pinsets, fleet.sources, fleet.pyinfra_data)


def with_upstream_smoke_image(fleet: Fleet) -> Fleet:
    """Every rig's GPU smoke image from the sandbox's stand-in upstream registry (a SIMULATED image,
    counted as `image`), not the sandbox's `local` one: it then goes through the fleet registry."""
    from rigfleet_sandbox import upstream_registry

    smoke = upstream_registry.seed_image()
    rigs = tuple(r.model_copy(update={"smoke_image": smoke}) for r in fleet.rigs)
    return Fleet(fleet.inventory_dir, rigs, fleet.pinsets, fleet.sources, fleet.pyinfra_data)


def run(sandbox_up: Callable[[int], Fleet], converge_timed: Callable[..., tuple[float, Any]],
        timer_factory: Callable[[], Any], metric: Callable[..., Any], say: Callable[[str], None],
        repeats: int) -> dict[str, dict[str, int]]:
    from rigfleet_sandbox import upstreamlog

    last: dict[str, dict[str, int]] = {}
    for attempt in range(repeats):
        say(f"fleet cache: two fresh rigs, rig-01 the cache, converged one after the other ({attempt + 1}/{repeats})")
        fleet = with_upstream_smoke_image(with_wheels(with_cache_group(sandbox_up(2), "rig-01")))
        addresses = [rig.ssh_hostname for rig in fleet.rigs]
        pulled: dict[str, dict[str, int]] = {}
        for rig in ("rig-01", "rig-02"):
            since, timer = upstreamlog.mark(), timer_factory()
            wall, _ = converge_timed(fleet, [rig], timer)
            pulled[rig] = upstreamlog.pulled(upstreamlog.records(since=since), addresses)
            if rig == "rig-02":
                packages = sum(s for name, s in timer.seconds.items() if PACKAGE_OPS.match(name.split(" | ")[-1]))
                metric("fresh converge of a 2nd rig (cache warm): wall", "s").values.append(wall)
                metric("  its package installs (download from the cache, unpack)", "s").values.append(packages)
                metric("  excluding package unpack and install", "s", "<= 30 s").values.append(wall - packages)
                ranked = sorted(timer.seconds.items(), key=lambda item: -item[1])
                SECOND_RIG_OPERATIONS.clear()
                SECOND_RIG_OPERATIONS.update(ranked)
                SECOND_RIG_SLOWEST.clear()
                SECOND_RIG_SLOWEST.update(ranked[:15])
                SECOND_RIG_SLOWEST[f"({len(ranked[15:])} other operations)"] = sum(s for _, s in ranked[15:])
                # connecting, the state reads before the run, planning: what no operation's time holds
                SECOND_RIG_SLOWEST["(outside operations)"] = wall - sum(timer.seconds.values())
        for kind in KINDS:
            first, second = pulled["rig-01"][kind], pulled["rig-02"][kind]
            metric(f"upstream {kind} bytes: rig 1", "MiB").values.append(first / MIB)
            metric(f"  {kind}: rig 2", "MiB").values.append(second / MIB)
            if kind in ("package", "python", "image") and first:  # no ratio of nothing pulled
                metric(f"  {kind}: rig 2 / rig 1", "ratio", "0").values.append(second / first)
        say(f"fleet cache: bytes pulled from upstream: {pulled}")
        last = pulled
    return last
