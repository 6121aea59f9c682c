"""Kernel policy as `rigfleet status` reports it (held, what waits, whether the NVIDIA module
answers), and the sandbox's kernel-update rehearsal publisher: a SIMULATED newer kernel
metapackage published into the built stand-in repository, signed, and taken out again."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from rigfleet import catalog, status
from rigfleet.loader import load_fleet
from rigfleet.render import Release
from rigfleet_sandbox import aptrepo

SMI_OK = "0, 580.105.08, Enabled, 280.00\n1, 580.105.08, Enabled, 280.00"
KERNEL = {"name": "linux-image-amd64", "installed": "6.12.57-1", "candidate": "6.12.57-1+sim1"}


def probe(**over: object) -> dict:
    base = {"kernel": "6.12.57+deb13-amd64", "nvidia_smi": SMI_OK, "held": ["linux-image-amd64", "nvidia-open"],
            "kernel_package": dict(KERNEL)}
    return {**base, **over}


def test_probe_asks_for_every_platforms_kernel_metapackage() -> None:
    assert status.KERNEL_METAS == ["linux-image-amd64", "linux-image-generic"]
    assert "'linux-image-amd64'" in status.PROBE and "apt-cache policy" in status.PROBE
    # a held metapackage reads "hi" in dpkg's status (seen in the sandbox rehearsal: "ii" only missed it)
    assert '("ii", "hi")' in status.PROBE


def test_held_kernel_with_a_newer_one_waiting_says_it_did_not_move() -> None:
    text = status.kernel_state(probe())
    assert text is not None
    assert "held at 6.12.57-1 (not moved)" in text and "6.12.57-1+sim1 waits for a rigfleet converge" in text
    assert "NVIDIA module answers on running kernel 6.12.57+deb13-amd64" in text


def test_held_kernel_with_nothing_newer() -> None:
    text = status.kernel_state(probe(kernel_package={**KERNEL, "candidate": KERNEL["installed"]}))
    assert text == "linux-image-amd64 held at 6.12.57-1; NVIDIA module answers on running kernel 6.12.57+deb13-amd64"


def test_unheld_kernel_is_said_and_is_drift_and_a_missing_module_is_said(example_inventory: Path) -> None:
    found = probe(held=["nvidia-open"], nvidia_smi="NVIDIA-SMI has failed because it couldn't communicate")
    text = status.kernel_state(found)
    assert text is not None and "NOT held (may move)" in text and "NO working NVIDIA module" in text
    fleet = load_fleet(example_inventory)
    rig = fleet.rig("rig-02")
    rel = Release(rig, fleet.pinsets[rig.pinset], catalog.variants()[rig.variant])
    assert not any(d.startswith("kernel:") for d in status.drift(rel, probe()))
    assert any(d.startswith("kernel: linux-image-amd64 not held") for d in status.drift(rel, found))


def test_no_kernel_package_no_statement() -> None:
    assert status.kernel_state(probe(kernel_package=None)) is None


NO_MODULE = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver"


@pytest.mark.parametrize(
    ("over", "state", "held", "waiting", "label"),
    [
        ({"kernel_package": {**KERNEL, "candidate": KERNEL["installed"]}}, "held", True, None, "held"),
        ({}, "waiting", True, "6.12.57-1+sim1", "waiting"),
        ({"held": ["nvidia-open"]}, "unheld", False, "6.12.57-1+sim1", "[yellow]NOT held[/yellow]"),
        ({"nvidia_smi": NO_MODULE}, "no-module", True, "6.12.57-1+sim1", "[red]NO module[/red]"),
        ({"nvidia_smi": NO_MODULE, "held": []}, "no-module", False, "6.12.57-1+sim1", "[red]NO module[/red]"),
        ({"kernel_package": None}, "unknown", None, None, "unknown"),
    ],
    ids=["held", "waiting", "unheld", "no-module", "no-module-unheld", "custom-kernel"],
)
def test_kernel_state_for_status(over: dict, state: str, held: bool | None, waiting: str | None, label: str) -> None:
    found = status.kernel_of(probe(**over))
    assert found["state"] in status.KERNEL_STATES
    assert (found["state"], found["held"], found["waiting"]) == (state, held, waiting)
    assert found["running"] == "6.12.57+deb13-amd64" and found["module"] == (state != "no-module")
    assert status.kernel_label(found) == label


def test_apt_without_a_candidate_is_not_a_waiting_kernel() -> None:
    for candidate in ("", "(none)"):
        found = status.kernel_of(probe(kernel_package={**KERNEL, "candidate": candidate}))
        assert (found["state"], found["waiting"]) == ("held", None)


def test_status_rows_carry_the_kernel(example_inventory: Path) -> None:
    fleet = load_fleet(example_inventory)
    found = probe(os="debian 13", ledger=None, containers=[], docker="", toolkit="")
    rows = status.rows_of(fleet, {"rig-02": found}, {rig.name: rig.name == "rig-02" for rig in fleet.rigs})
    by_rig = {row["rig"]: row for row in rows}
    assert by_rig["rig-02"]["kernel"] == status.kernel_of(found)
    assert by_rig["rig-02"]["kernel"]["state"] == "waiting"
    assert by_rig["rig-01"]["kernel"] is None  # unreachable: nothing said


@pytest.fixture(scope="module")
def www(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("kernel-repo")
    aptrepo.build_apt_repo(base / "www", key_dir=base / "keys")
    return base / "www", base / "keys"


def test_newer_kernel_meta_published_signed_and_taken_out(www: tuple[Path, Path], tmp_path: Path) -> None:
    root, keys = www
    repo = root / "nvidia" / "cuda"
    before = (repo / "Packages").read_text()
    pkg = aptrepo.kernel_meta_package("6.12.57-1+sim1")
    aptrepo.republish(root, [pkg], key_dir=keys)
    index = (repo / "Packages").read_text()
    assert "Package: linux-image-amd64\nVersion: 6.12.57-1+sim1\n" in index
    assert index.count("Package: ") == before.count("Package: ") + 1
    info = subprocess.run(["dpkg-deb", "-I", str(repo / pkg.filename)], capture_output=True, text=True, check=True)
    assert "SIMULATED" in info.stdout
    keyring = tmp_path / "cuda.gpg"
    subprocess.run(["gpg", "--batch", "--yes", "--dearmor", "-o", str(keyring), str(repo / "key.asc")], check=True)
    for args in ([str(repo / "InRelease")], [str(repo / "Release.gpg"), str(repo / "Release")]):
        assert subprocess.run(["gpgv", "--keyring", str(keyring), *args], capture_output=True).returncode == 0
    assert "Packages" in (repo / "Release").read_text()
    aptrepo.republish(root, [], key_dir=keys, drop=(pkg.filename,))
    assert "linux-image-amd64" not in (repo / "Packages").read_text()
    assert subprocess.run(["gpgv", "--keyring", str(keyring), str(repo / "InRelease")],
                          capture_output=True).returncode == 0
