"""Property-based bad input: malformed inventories exit 2 naming the rig and the field, no traceback."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rigfleet.cli import main
from rigfleet.schema import Rig
from tests.conftest import EXAMPLE

RIGS = ["rig-01", "rig-02", "rig-11", "rig-12"]
FIELDS = set(Rig.model_fields)
junk_text = st.text(min_size=1, max_size=40).filter(lambda s: s.strip() and "\x00" not in s)
junk_any = st.one_of(st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(),
                                                                          max_size=2))
huge = st.integers(min_value=10**6, max_value=10**30)


def bad_value_for(field: str) -> st.SearchStrategy[object]:
    """Values that are wrong for that field whatever hypothesis picks."""
    ranges = {"ssh_port": (1, 65535), "port": (1024, 65535), "gpu_count": (1, 8),
              "gate_timeout_s": (10, 7200), "apt_lock_timeout_s": (0, 7200), "power_limit_w": (100, 350)}
    if field in ranges:
        low, high = ranges[field]
        return st.one_of(st.integers(max_value=low - 1), st.integers(min_value=high + 1), huge,
                         junk_any, st.from_regex(r"[a-z]{1,6}", fullmatch=True))
    if field in ("docker_source", "gate", "driver_module", "driver_install"):
        return st.one_of(st.from_regex(r"[A-Za-z]{2,10}-?x", fullmatch=True), junk_any)
    if field in ("model_dir", "cache_dir"):
        return st.one_of(st.from_regex(r"[a-z]{1,8}(/[a-z]{1,8})?", fullmatch=True),
                         st.just("/srv/../etc"), junk_any)
    if field in ("variant", "pinset"):
        return st.one_of(st.from_regex(r"zz[a-z0-9-]{0,10}", fullmatch=True), junk_any)
    if field in ("hf_token", "api_key"):
        return st.one_of(st.from_regex(r"hf_[A-Za-z0-9]{8,20}", fullmatch=True),
                         st.just({"env": "A", "file": "/x"}), st.just({"env": "1BAD"}), st.just({}))
    if field == "bind_address":
        return st.one_of(st.from_regex(r"[a-z]{1,10}", fullmatch=True), st.just("300.1.1.1"), junk_any)
    if field == "ssh_hostname":
        return st.one_of(st.from_regex(r"[a-z]{1,5} [a-z]{1,5}", fullmatch=True), st.just("-bad-"),
                         st.just("rig\u00e9.example"), junk_any)
    if field == "nvlink":
        return st.one_of(junk_any, st.just("maybe"))
    return st.nothing()


FUZZED = sorted(f for f in FIELDS if bad_value_for(f) is not st.nothing() and f not in ("name", "groups"))
unknown_key = st.from_regex(r"[a-z][a-z_]{2,14}", fullmatch=True).filter(lambda k: k not in FIELDS)


@st.composite
def malformed(draw: st.DrawFn) -> tuple[str, str, object]:
    rig = draw(st.sampled_from(RIGS))
    if draw(st.booleans()):
        field = draw(st.sampled_from(FUZZED))
        return rig, field, draw(bad_value_for(field))
    return rig, draw(unknown_key), draw(st.one_of(junk_text, st.integers(), junk_any))


def check_output(inventory: Path) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["check"], env={"RIGFLEET_INVENTORY": str(inventory)})
    return result.exit_code, result.output + (repr(result.exception) if result.exception and
                                             not isinstance(result.exception, SystemExit) else "")


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(malformed())
def test_malformed_rig_vars_exit_2_naming_rig_and_field(case: tuple[str, str, object]) -> None:
    rig, field, value = case
    with tempfile.TemporaryDirectory() as tmp:
        inventory = Path(tmp) / "inv"
        shutil.copytree(EXAMPLE, inventory)
        host_vars = inventory / "host_vars" / f"{rig}.yml"
        current = yaml.safe_load(host_vars.read_text()) if host_vars.exists() else {}
        host_vars.write_text(yaml.safe_dump({**(current or {}), field: value}, allow_unicode=True))
        code, out = check_output(inventory)
    assert code == 2, out
    assert "Traceback" not in out and "Error(" not in out
    assert f"{rig}: {field}" in out, out


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(RIGS), st.sampled_from([
    "variant: [unclosed\n", "port: 8015\nport: 8016\n", "\tport: 1\n", "- a\n- b\n", "port: *nope\n",
    "key: 'unterminated\n", "!!python/object:os.system {}\n", "? [a, b]\n: c\n", "port: 0x\u00ff\n",
]))
def test_yaml_oddities_exit_2_naming_the_rig_and_file(rig: str, text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        inventory = Path(tmp) / "inv"
        shutil.copytree(EXAMPLE, inventory)
        (inventory / "host_vars" / f"{rig}.yml").write_text(text)
        code, out = check_output(inventory)
    assert code == 2, out
    assert "Traceback" not in out and f"{rig}: " in out and f"{rig}.yml" in out
