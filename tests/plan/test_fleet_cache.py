"""Plan-level tests of the fleet_cache role: apt-cacher-ng from the distribution on the `cache` host
only, its settings file before the package, installed through the host's own way out (the cache is
not there yet), restarted only when its settings change; nothing on the other rigs, nothing once
converged. The end-to-end run (two rigs, bytes counted upstream) is tests/sandbox/test_fleet_cache.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rigfleet import catalog, fleetcache
from rigfleet.context import RigContext
from rigfleet.loader import Fleet
from rigfleet.roles.fleet_cache import fleet_cache
from rigfleet.schema import Rig
from tests.plan.fakerig import FakeRig, Plan, context_for, plan
from tests.plan.scenarios import fresh

PROXY = "http://proxy.example.invalid:3128"


def rig(name: str, address: str, **fields: Any) -> Rig:
    return Rig(**({"name": name, "ssh_hostname": address, "pinset": "test", "variant": "int8",
                   "model_dir": "/srv/models", "apt_proxy": PROXY} | fields))


def two() -> Fleet:
    base = context_for("debian-13")
    return Fleet(Path("/nonexistent"), (rig("rig-01", "192.0.2.11", groups=("cache",)), rig("rig-02", "192.0.2.12")),
                 base.fleet.pinsets)


def run(fleet: Fleet, name: str, state: FakeRig) -> Plan:
    chosen = fleet.rig(name)
    context = RigContext(fleet, chosen, fleet.pinsets["test"], catalog.variants()[chosen.variant])
    return plan(context, state, roles=[fleet_cache])


def converged(fleet: Fleet) -> FakeRig:
    found = fleetcache.of(fleet)
    assert found is not None
    acng = fleetcache.facts()
    return fresh("debian-13").with_(
        packages={**fresh("debian-13").packages, acng["package"]: ["3.7.5-1"]},
        files={acng["config"]: fleetcache.config_text(found)},
        services={acng["service"]: (True, True)},
    )


def test_the_cache_host_installs_apt_cacher_ng_through_its_own_way_out() -> None:
    result = run(two(), "rig-01", fresh("debian-13"))
    assert not result.failed
    config = result.uploads["/etc/apt-cacher-ng/zzz_rigfleet.conf"]
    assert "BindAddress: 192.0.2.11\n" in config and f"Proxy: {PROXY}\n" in config and "Port: 3142\n" in config
    [install] = [c for c in result.commands if "apt-cacher-ng" in c and " install " in c]
    assert f"Acquire::http::Proxy={PROXY}" in install
    assert any("/dev/tcp/192.0.2.11/3142" in c for c in result.commands), "waits until it listens"


def test_other_rigs_get_no_cache() -> None:
    result = run(two(), "rig-02", fresh("debian-13"))
    assert not result.failed and result.changes == []


def test_converged_cache_plans_nothing() -> None:
    fleet = two()
    result = run(fleet, "rig-01", converged(fleet))
    assert not result.failed and result.changes == []
