"""Property-based bad input in pinsets.yml: exit 2 naming the pin set and the field, no traceback.

Every case goes through the real `rigfleet check` on a copy of inventory/example whose pin set
is broken in one field (wrong type, out of range, unknown key, unicode, huge values, YAML
oddities). `check` never connects; the inventory's rigs are documentation addresses anyway.
"""

from __future__ import annotations

import copy
import shutil
import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rigfleet.schema import PinSet
from tests.conftest import EXAMPLE
from tests.unit import test_fuzz_inventory as fuzz

PINSET = "seed-2026-05"  # the example's only pin set, used by every rig (problems are errors)
ORIGINAL: dict[str, Any] = yaml.safe_load((EXAMPLE / "pinsets.yml").read_text())[PINSET]

huge = st.integers(min_value=10**6, max_value=10**40)
junk = st.one_of(st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(),
                                                                       max_size=2), st.booleans())
unicode_text = st.text(alphabet=st.characters(min_codepoint=0x80, max_codepoint=0x2FFF), min_size=1,
                       max_size=30)
not_hex = st.one_of(st.from_regex(r"[0-9a-f]{1,39}", fullmatch=True), st.from_regex(r"[0-9a-f]{41,80}",
                    fullmatch=True), st.from_regex(r"[g-z]{40}", fullmatch=True), unicode_text, huge)
# a sha256 is 64 hex digits: the commit's "too long" range would draw valid ones
not_sha256 = st.one_of(st.from_regex(r"[0-9a-f]{1,63}", fullmatch=True), st.from_regex(r"[0-9a-f]{65,90}",
                       fullmatch=True), st.from_regex(r"[g-z]{64}", fullmatch=True), unicode_text, huge)


def set_path(body: dict[str, Any], path: tuple[str | int, ...], value: object) -> None:
    node: Any = body
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value


# (path inside the pin set, the field the message must name, values that are wrong whatever is drawn)
CASES: list[tuple[tuple[str | int, ...], str, st.SearchStrategy[object]]] = [
    (("genesis", "commit"), "genesis.commit", not_hex),
    (("genesis", "sha256"), "genesis.sha256", not_sha256),
    (("overlays", 0, "files", 0, "sha256"), "overlays.0.files.0.sha256", not_sha256),
    (("overlays", 0, "files", 0, "target"), "overlays.0.files.0.target",
     st.one_of(st.just("/etc/passwd.py"), st.just("../../x.py"), st.from_regex(r"[a-z]{1,8}\.sh", fullmatch=True),
               junk)),
    (("overlays", 0, "files"), "overlays.0.files", st.one_of(st.just([]), st.integers(), unicode_text)),
    (("base_image", "digest"), "base_image.digest",
     st.one_of(st.from_regex(r"sha256:[0-9a-f]{1,63}", fullmatch=True), st.from_regex(r"md5:[0-9a-f]{32}",
               fullmatch=True), unicode_text, huge, junk)),
    (("base_image",), "base_image", st.one_of(unicode_text, huge, st.lists(st.integers(), max_size=2))),
    (("driver", "branch"), "driver.branch",
     st.one_of(st.integers(max_value=449), st.integers(min_value=1000), huge, unicode_text, junk)),
    (("python_deps",), "python_deps",
     st.dictionaries(st.from_regex(r"[a-z]{2,8}", fullmatch=True),
                     st.one_of(st.just(">=1.0"), st.just("*"), st.just("latest"), unicode_text), min_size=1,
                     max_size=2)),
    (("vllm_version",), "vllm_version", st.one_of(junk.filter(lambda v: not isinstance(v, bool)),
                                                  st.none())),
    (("overlays",), "overlays", st.one_of(huge, unicode_text)),
]
UNKNOWN = st.from_regex(r"[a-z][a-z_]{2,14}", fullmatch=True).filter(lambda k: k not in PinSet.model_fields)


@st.composite
def malformed(draw: st.DrawFn) -> tuple[dict[str, Any], str]:
    body = copy.deepcopy(ORIGINAL)
    body["genesis"]["sha256"] = None
    if draw(st.integers(0, 4)) == 0:
        key = draw(UNKNOWN)
        body[key] = draw(st.one_of(unicode_text, huge, junk))
        return body, key
    path, field, values = draw(st.sampled_from(CASES))
    set_path(body, path, draw(values))
    return body, field


def check(inventory: Path) -> tuple[int, str]:
    return fuzz.cli(inventory, "check")  # the one in-process runner of the fuzz tests


def with_pinsets(text: str) -> tuple[int, str]:
    with tempfile.TemporaryDirectory() as tmp:
        inventory = Path(tmp) / "inv"
        shutil.copytree(EXAMPLE, inventory)
        (inventory / "pinsets.yml").write_text(text, encoding="utf-8")
        return check(inventory)


def test_the_unbroken_example_passes() -> None:
    """The control case: the same copy without the fault is accepted (so the fuzz cases test the fault)."""
    code, out = with_pinsets(yaml.safe_dump({PINSET: ORIGINAL}, allow_unicode=True))
    assert code == 0, out


@settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(malformed())
def test_malformed_pin_set_exits_2_naming_pin_set_and_field(case: tuple[dict[str, Any], str]) -> None:
    body, field = case
    code, out = with_pinsets(yaml.safe_dump({PINSET: body}, allow_unicode=True))
    assert code == 2, out
    assert "Traceback" not in out and "Error(" not in out, out
    assert f"pinset {PINSET}: {field}" in out, out


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.sampled_from([
    f"{PINSET}: [unclosed\n", f"{PINSET}:\n  vllm_version: 1\n  vllm_version: 2\n", f"{PINSET}:\n\tcuda: x\n",
    "- a\n- b\n", f"{PINSET}: *nope\n", f"{PINSET}:\n  description: 'unterminated\n",
    f"{PINSET}: !!python/object:os.system {{}}\n", "? [a, b]\n: c\n", f"{PINSET}: 42\n",
    f"{PINSET}:\n  cuda: 0x\u00ff\n", "\u00ff\u00fe: [\n",
]))
def test_yaml_oddities_in_pinsets_exit_2_naming_the_file(text: str) -> None:
    code, out = with_pinsets(text)
    assert code == 2, out
    assert "Traceback" not in out and "Error(" not in out, out
    assert "pinsets.yml" in out or f"pin set '{PINSET}'" in out or f"pinset {PINSET}" in out, out
