"""The sandbox's SIMULATED NVIDIA stand-ins against the real Debian archive: every recorded field
of upstream_fields.yaml must equal the real Packages index (fetched through the machine's apt
mirror, cached), and every stand-in must carry exactly those relations at its own version."""

from __future__ import annotations

import pytest

from rigfleet_sandbox import aptrepo, debindex

FIELDS = aptrepo.upstream_fields()["debian"]
CASES = [(name, suite) for name in sorted(FIELDS) for suite in aptrepo.SUITES]


@pytest.mark.parametrize(("name", "suite"), CASES)
def test_recorded_fields_match_the_real_index(name: str, suite: str) -> None:
    recorded = dict(FIELDS[name][suite])
    component = recorded.pop("component")
    real = debindex.packages_index(suite, component).get(FIELDS[name]["package"])
    assert real is not None, f"{FIELDS[name]['package']} is gone from {suite}/{component}"
    keys = ("Version", *aptrepo.RELATIONS)
    assert {k: recorded[k] for k in keys if k in recorded} == {k: real[k] for k in keys if k in real}, (
        f"{name}: upstream_fields.yaml drifted from Debian {suite}; update it from the index"
    )


@pytest.mark.parametrize("suite", aptrepo.SUITES)
def test_stand_ins_carry_the_real_relations(suite: str) -> None:
    built = {(p.name, p.version): p for p in aptrepo.packages(suite)}
    for upstream in aptrepo.DRIVER_VERSIONS:
        for name in FIELDS:
            package = built[(name, f"{upstream}-{aptrepo.REVISION}")]
            expected = aptrepo.standin_fields(name, suite, upstream)
            extra = aptrepo.SANDBOX_EXTRA.get(name, set())
            for attr in aptrepo.RELATIONS.values():
                if attr not in extra:
                    assert getattr(package, attr) == expected.get(attr, []), (name, attr)
    # the version substitution leaves no trace of Debian's own driver version
    text = repr([vars(p) for p in aptrepo.packages(suite) if p.name in FIELDS])
    real_version = str(FIELDS["nvidia-kernel-dkms"][suite]["Version"]).split("-")[0]
    assert real_version not in text


def test_contrib_is_what_the_driver_stack_needs() -> None:
    """The relation the Debian role's contrib fix is about: the module needs contrib packages."""
    index = debindex.packages_index("trixie", "contrib")
    for needed in ("glx-alternative-nvidia", "nvidia-installer-cleanup", "nvidia-kernel-common"):
        assert needed in index, needed
    relations = " ".join(aptrepo.standin_fields("nvidia-alternative", "trixie", "580.95.05")["depends"])
    assert "glx-alternative-nvidia" in relations
