"""Drift between the inventory and what a rig's probe reports."""

from __future__ import annotations

from pathlib import Path

from rigfleet import catalog
from rigfleet.loader import load_fleet
from rigfleet.render import Release
from rigfleet.status import RigProbe, drift


def release(example_inventory: Path) -> Release:
    fleet = load_fleet(example_inventory)
    rig = fleet.rig("rig-02")
    return Release(rig, fleet.pinsets[rig.pinset], catalog.variants()[rig.variant])


def converged_probe(rel: Release) -> dict:
    return {
        "nvidia_smi": "0, 580.95.05, Enabled, 280.00\n1, 580.95.05, Enabled, 280.00",
        "held": ["nvidia-open", "nvidia-driver-cuda"],
        "ledger": {"current": {"pinset": rel.pinset.name, "variant": rel.variant.name, "image": rel.image,
                               "release_id": rel.release_id()}},
        "containers": [f"{rel.release_id()} running Up 5 minutes (healthy)"],
    }


def test_converged_rig_has_no_drift(example_inventory: Path) -> None:
    rel = release(example_inventory)
    assert drift(rel, converged_probe(rel)) == []


def test_every_difference_is_reported(example_inventory: Path) -> None:
    rel = release(example_inventory)
    probe = converged_probe(rel)
    probe["ledger"]["current"]["pinset"] = "old-pin"
    probe["nvidia_smi"] = "0, 570.10, Disabled, 350.00\n1, 570.10, Enabled, 280.00"
    probe["held"] = []
    found = "\n".join(drift(rel, probe))
    for needle in ("pinset: old-pin", "want branch 580", "persistence mode: off", "GPU0: 350.00 W (want 280 W)",
                   "not held"):
        assert needle in found


def test_driver_mismatch_and_fresh_rig(example_inventory: Path) -> None:
    rel = release(example_inventory)
    probe = {"nvidia_smi": "Failed to initialize NVML: Driver/library version mismatch", "held": [],
             "ledger": None, "containers": []}
    found = drift(rel, probe)
    assert "driver: mismatch, reboot needed" in found and any(f.startswith("release: none") for f in found)


def test_probe_parses_json() -> None:
    assert RigProbe().process(['{"os": "debian 13",', '"kernel": "6.1"}']) == {"os": "debian 13", "kernel": "6.1"}
    assert "base64 -d | python3 -" in RigProbe().command()


def test_an_engine_that_died_after_its_gate_is_shown_with_its_state(example_inventory: Path) -> None:
    rel = release(example_inventory)
    probe = converged_probe(rel)
    probe["containers"] = [f"{rel.release_id()} exited Exited (137) 8 seconds ago"]
    assert drift(rel, probe) == [f"serving: release {rel.release_id()} exited (Exited (137) 8 seconds ago); "
                                 "the next converge restarts it through the gate"]
    probe["containers"] = []
    assert drift(rel, probe) == ["serving: no rigfleet container running"]
