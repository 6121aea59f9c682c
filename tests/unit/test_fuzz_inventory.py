"""Property-based bad input: malformed inventories exit 2 naming the rig and the field, no traceback;
and the project's fuzzer over the mutation classes of issue 18 (end of this file)."""

from __future__ import annotations

import json
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
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


@settings(max_examples=250, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
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


@settings(max_examples=60, deadline=None, derandomize=True)
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


# --- the project's fuzzer: every mutation class of issue 18 through check, plan --json and render ---
#
# One mutation of inventory/example per example (hypothesis, derandomized: the same cases in
# every run), from the classes the audit found: group names that shadow, apt.conf injection,
# template injection through pin-set values, exposure, secret shapes, YAML depth/aliases/huge
# values/newlines. Properties: no traceback, exit 0 or 2 only, no run over HANG_S, the secret
# never in any output or rendered file, and an accepted inventory renders no injected line.

HANG_S = 10
MARK = "INJECTEDrf"  # the payloads' own line; no template, catalog or example carries it
SECRET = "sk-fuzzsecret-" + "7" * 24
PAYLOAD_TAILS = [f"\n{MARK}: 1", f"\n{MARK}", f"\r\n{MARK}", f"$({MARK})", f"`{MARK}`", f";{MARK}",
                 f"\"\n{MARK}\n\"", f"' && {MARK} '", f"${{{MARK}}}", f":/:rw\n{MARK}"]
APT_INJECTION = f'";APT::Update::Pre-Invoke{{"{MARK}";}};Dummy::x"'


@contextmanager
def bounded(seconds: int) -> Iterator[None]:
    """SIGALRM after `seconds`: a hang becomes a failure naming it, not a stuck CI job."""

    def expired(signum: int, frame: object) -> None:
        raise TimeoutError(f"hang: over {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def cli(inventory: Path, *args: str) -> tuple[int, str]:
    """One in-process `rigfleet` run: exit code and everything it printed (a crash as its repr)."""
    result = CliRunner().invoke(main, list(args), env={"RIGFLEET_INVENTORY": str(inventory)})
    crashed = result.exception is not None and not isinstance(result.exception, SystemExit)
    return result.exit_code, result.output + (f"CRASHED {result.exception!r}" if crashed else "")


def payload(draw: st.DrawFn, prefix: str) -> str:
    return prefix + draw(st.sampled_from(PAYLOAD_TAILS))


Mutation = tuple[str, Callable[[Path], None]]


def _edit_yaml(path: Path, change: Callable[[Any], None]) -> None:
    data = yaml.safe_load(path.read_text()) if path.exists() else {}
    data = data or {}
    change(data)
    path.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False))


def _host_vars(rig: str, values: dict[str, Any]) -> Callable[[Path], None]:
    return lambda inv: _edit_yaml(inv / "host_vars" / f"{rig}.yml", lambda d: d.update(values))


def _pinset(change: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    return lambda inv: _edit_yaml(inv / "pinsets.yml", lambda d: change(d["seed-2026-05"]))


@st.composite
def group_shadowing(draw: st.DrawFn) -> Mutation:
    """Finding 1: group names that reach pyinfra's namespace or collide after normalisation."""
    names = draw(st.sampled_from([["rigs"], ["all"], ["inventory"], ["_rigs"], ["a-b", "a_b"], ["rig-01"],
                                  ["lab-x", "lab_x"], ["state"], ["host"], ["data"]]))
    rig = draw(st.sampled_from(RIGS))

    def mutate(inv: Path) -> None:
        def change(data: Any) -> None:
            for name in names:
                data["all"]["children"][name] = {"hosts": {rig: None}}
        _edit_yaml(inv / "hosts.yml", change)

    return f"groups {names} with {rig}", mutate


@st.composite
def apt_injection(draw: st.DrawFn) -> Mutation:
    """Finding 2: apt.conf fragments built from apt_proxy and repository URLs."""
    rig = draw(st.sampled_from(RIGS))
    proxy = draw(st.sampled_from([f"http://proxy{APT_INJECTION}", f"http://proxy:3142/{APT_INJECTION}",
                                  payload(draw, "http://proxy:3142"), "http://proxy:3142"]))
    if draw(st.booleans()):
        return f"apt_proxy {proxy!r}", _host_vars(rig, {"apt_proxy": proxy})
    url = draw(st.sampled_from([f"http://mirror.example.org{APT_INJECTION}", payload(draw, "http://mirror.example.org/x"),
                                "http://mirror.example.org/cuda"]))
    repo = {"url": url, "key_url": "https://mirror.example.org/key.asc", "key_fingerprint": "A" * 40}
    return f"cuda_repo.url {url!r}", _host_vars(rig, {"cuda_repo": repo})


@st.composite
def pinset_injection(draw: st.DrawFn) -> Mutation:
    """Finding 3: pin-set values that reach compose.yaml, the Dockerfile and the build scripts."""
    field = draw(st.sampled_from(["vllm_version", "base_image.tag", "base_image.repository", "description",
                                  "python_deps", "cuda", "genesis.source", "name-key", "model_dir"]))
    if field == "model_dir":
        value = payload(draw, "/srv/models")
        return f"model_dir {value!r}", _host_vars(draw(st.sampled_from(RIGS)), {"model_dir": value})
    value = payload(draw, {"vllm_version": "0.20.2", "base_image.tag": "v0.20.2", "cuda": "13.0",
                           "base_image.repository": "vllm/vllm-openai", "description": "fuzz",
                           "python_deps": "numpy", "genesis.source": "https://example.org/g.git",
                           "name-key": "seed-2026-05"}[field])

    def mutate(inv: Path) -> None:
        def change(data: Any) -> None:
            body = data["seed-2026-05"]
            if field == "name-key":  # a newline in the pin set's own name, every rig moved onto it
                data[value] = data.pop("seed-2026-05")
                _edit_yaml(inv / "group_vars" / "all.yml", lambda d: d.update({"pinset": value}))
            elif field == "python_deps":
                body["python_deps"] = {value: "1.0"}
            elif "." in field:
                outer, inner = field.split(".")
                body[outer][inner] = value
            else:
                body[field] = value
        _edit_yaml(inv / "pinsets.yml", change)

    return f"pin set {field} {value!r}", mutate


@st.composite
def exposure_mutation(draw: st.DrawFn) -> Mutation:
    """Finding 4: where the API listens, with or without a key, an opt-in and an allowlist."""
    values: dict[str, Any] = {"bind_address": draw(st.sampled_from(
        ["0.0.0.0", "::", "127.0.0.1", "::1", "192.0.2.10", "10.0.0.1", "2001:db8::1", "224.0.0.1", "0.0.0.0\n"]))}
    if draw(st.booleans()):
        values["api_key"] = draw(st.sampled_from([None, {"env": "API_KEY_REF"}, {"file": "/etc/rigfleet/k"}]))
    if draw(st.booleans()):
        values["insecure_public"] = draw(st.sampled_from([True, False, "yes", 1]))
    if draw(st.booleans()):
        values["api_allow"] = draw(st.lists(st.sampled_from(
            ["10.0.0.5/32", "10.0.0.0/8", "10.0.0.5/8", "0.0.0.0/0", "2001:db8::/32", "gw.lab", "10.0.0.5",
             payload(draw, "10.0.0.5/32")]), max_size=3))
    return f"exposure {values!r}", _host_vars(draw(st.sampled_from(RIGS)), values)


@st.composite
def secret_shapes(draw: st.DrawFn) -> Mutation:
    """Finding 5: a secret given inline, in every shape, and secret-like engine_env names."""
    rig = draw(st.sampled_from(RIGS))
    shape = draw(st.sampled_from([
        ("api_key", SECRET), ("api_key", [SECRET]), ("api_key", {"value": SECRET}), ("api_key", {"env": SECRET}),
        ("api_key", {"env": "X", "file": SECRET}), ("hf_token", {"token": SECRET}), ("hf_token", SECRET),
        ("hf_token", {"file": SECRET, "mode": SECRET}), ("api_key", {"env": "X", SECRET: 1}),
        ("engine_env", {"VLLM_API_KEY": SECRET}), ("engine_env", {"HF_TOKEN": SECRET}),
        ("engine_env", {"MY_TOKEN": SECRET, "OTHER": "1"}), ("engine_env", {"A_SECRET_VALUE": SECRET}),
    ]))
    return f"secret shape {shape[0]}", _host_vars(rig, {shape[0]: shape[1]})


@st.composite
def yaml_oddities(draw: st.DrawFn) -> Mutation:
    """Finding 6: deep nesting, alias bombs, huge values, newlines in names, stray keys."""
    kind = draw(st.sampled_from(["deep", "laughs", "self", "huge", "rig-newline", "group-newline", "name-in-pinset"]))
    depth = draw(st.integers(65, 3000))
    where = draw(st.sampled_from(["hosts.yml", "group_vars/all.yml", "host_vars/rig-01.yml", "pinsets.yml"]))
    text = {
        "deep": "a: " + "[" * depth + "]" * depth + "\n",
        "laughs": "lol0: &l0 [lol]\n" + "".join(f"lol{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]\n"
                                              for i in range(1, 9)),
        "self": "loop: &x [*x]\n",
    }.get(kind)

    def mutate(inv: Path) -> None:
        if text is not None:
            (inv / where).write_text(text)
        elif kind == "huge":
            _host_vars("rig-01", {"ssh_user": "x" * draw_size})(inv)
        elif kind == "rig-newline":
            _edit_yaml(inv / "hosts.yml", lambda d: d["all"]["children"]["lab"]["hosts"].update(
                {f"rig-09\n{MARK}": {"ssh_hostname": "192.0.2.99"}}))
        elif kind == "group-newline":
            _edit_yaml(inv / "hosts.yml", lambda d: d["all"]["children"].update(
                {f"lab\n{MARK}": {"hosts": {"rig-01": None}}}))
        else:
            _pinset(lambda body: body.update({"name": f"x\n{MARK}"}))(inv)

    draw_size = draw(st.sampled_from([1000, 100_000, 1_000_000]))
    return f"yaml {kind} in {where} (depth {depth})", mutate


MUTATIONS = st.one_of(group_shadowing(), apt_injection(), pinset_injection(), exposure_mutation(),
                      secret_shapes(), yaml_oddities())


def injected_lines(files: dict[str, str]) -> list[str]:
    """Lines an injection would have added: the payload's own line, apt hooks, compose keys."""
    found = [f"{name}: {line.strip()[:80]}" for name, text in files.items() for line in text.splitlines()
             if line.strip().lstrip("-# ").startswith(MARK)]
    found += [f"{name}: apt hook" for name, text in files.items() if name.startswith("host/apt/")
              and ("Pre-Invoke" in text or "Post-Invoke" in text)]
    compose = files.get("compose.yaml")
    if compose is not None:
        data = yaml.safe_load(compose)
        if set(data) != {"name", "services"} or set(data["services"]) != {"vllm"}:
            found.append(f"compose.yaml keys {sorted(data)} / {sorted(data['services'])}")
        for volume in data["services"]["vllm"].get("volumes", []):
            if not isinstance(volume, dict) or volume.get("source") in ("/", None):
                found.append(f"compose.yaml volume {volume!r}")
    return found


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(MUTATIONS)
def test_fuzz_check_plan_render(case: Mutation) -> None:
    label, mutate = case
    with tempfile.TemporaryDirectory() as tmp:
        inventory = Path(tmp) / "inv"
        shutil.copytree(EXAMPLE, inventory)
        mutate(inventory)
        out_dir = Path(tmp) / "rendered"
        runs: dict[str, tuple[int, str]] = {}
        with bounded(HANG_S):
            runs["check"] = cli(inventory, "check")
        with bounded(HANG_S):
            runs["plan"] = cli(inventory, "plan", "--json")
        rig = json.loads(runs["plan"][1])[0]["rig"] if runs["plan"][0] == 0 else "rig-01"
        with bounded(HANG_S):
            runs["render"] = cli(inventory, "render", rig, "-o", str(out_dir))
        for name, (code, out) in runs.items():
            assert code in (0, 2), (label, name, code, out[-2000:])
            assert "Traceback" not in out and "CRASHED" not in out, (label, name, out[-2000:])
            assert SECRET not in out, (label, name, "the secret is in the output")
        accepted = runs["check"][0] == 0
        assert {code for code, _ in runs.values()} == ({0} if accepted else {2}), (label, runs)
        if accepted:
            files = {p.relative_to(out_dir).as_posix(): p.read_text() for p in out_dir.rglob("*") if p.is_file()}
            assert files, label
            assert not any(SECRET in text for text in files.values()), (label, "the secret is in a rendered file")
            assert injected_lines(files) == [], (label, injected_lines(files))


def test_the_injection_detector_sees_each_kind_of_injected_line() -> None:
    """The fuzzer's oracle, on files an injection would have produced (so it can fail)."""
    clean = {"compose.yaml": "name: rigfleet\nservices:\n  vllm:\n    image: x\n"}
    assert injected_lines(clean) == []
    assert injected_lines({"compose.yaml": clean["compose.yaml"] + f"{MARK}: 1\n"})
    assert injected_lines({"compose.yaml": clean["compose.yaml"] + "    volumes:\n      - {type: bind, source: /}\n"})
    assert injected_lines({"entrypoint.sh": f"#!/bin/sh\n{MARK}\nset -eu\n"})
    assert injected_lines({"host/apt/99rigfleet-lock-timeout": 'APT::Update::Pre-Invoke {"x";};\n'})


@pytest.mark.parametrize("mutate", [
    _host_vars("rig-01", {"apt_proxy": "http://proxy:3142"}),
    _host_vars("rig-01", {"bind_address": "0.0.0.0", "api_key": {"env": "K"}, "api_allow": ["10.0.0.5"]}),
    _host_vars("rig-12", {"engine_env": {"OTHER": "1"}, "model_dir": "/srv/models2"}),
    _pinset(lambda body: body.update({"description": f"two\\nlines {MARK}"})),
], ids=["proxy", "exposure", "engine-env", "description"])
def test_benign_mutations_are_accepted_and_render_clean(mutate: Callable[[Path], None], tmp_path: Path) -> None:
    """The control cases: the fuzzer's accepted branch is reached, with values that do land in files."""
    inventory = tmp_path / "inv"
    shutil.copytree(EXAMPLE, inventory)
    mutate(inventory)
    code, out = cli(inventory, "check")
    assert code == 0, out
    for rig in RIGS:
        code, out = cli(inventory, "render", rig, "-o", str(tmp_path / rig))
        assert code == 0, out
        out_dir = tmp_path / rig
        files = {p.relative_to(out_dir).as_posix(): p.read_text() for p in out_dir.rglob("*") if p.is_file()}
        assert injected_lines(files) == []
