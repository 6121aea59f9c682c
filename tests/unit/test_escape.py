"""Every template value is escaped for the language it lands in (findings 2 and 3 of issue 18).

The structural test walks each template's Jinja syntax tree: every `{{ ... }}` must end in one of
the escaping helpers of rigfleet.escape. The injection tests render real pin sets and rigs with
hostile values (bypassing validation with model_copy, as a second line of defence) and read the
output back with the real parser of that language (YAML, POSIX sh, JSON, apt-config).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import jinja2
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from jinja2 import nodes

from rigfleet import catalog, escape, loader, render
from rigfleet.render import Release
from rigfleet.schema import AptRepo, ImageRef, Rig

TEMPLATES = Path(render.__file__).parent / "templates"
ALL_TEMPLATES = sorted(p.relative_to(TEMPLATES).as_posix() for p in TEMPLATES.rglob("*.j2"))


def raw_outputs(source: str) -> list[str]:
    """The `{{ ... }}` expressions of a template that do not end in an escaping helper."""
    tree = jinja2.Environment().parse(source)
    bad = []
    for output in tree.find_all(nodes.Output):
        for node in output.nodes:
            if isinstance(node, nodes.TemplateData):
                continue
            if not (isinstance(node, nodes.Filter) and node.name in escape.FILTERS):
                bad.append(f"line {node.lineno}: {type(node).__name__}")
    return bad


def test_the_checker_finds_a_raw_interpolation() -> None:
    assert raw_outputs("FROM {{ ref }}\n") == ["line 1: Name"]
    assert raw_outputs("{{ ref | tojson }} {{ x | upper | sh }}") == ["line 1: Filter"]
    assert raw_outputs("{% for a in b %}{{ a }}{% endfor %}") == ["line 1: Name"]
    assert raw_outputs("{{ ref | image_ref }}") == []


@pytest.mark.parametrize("name", ALL_TEMPLATES)
def test_every_template_escapes_every_value(name: str) -> None:
    assert raw_outputs((TEMPLATES / name).read_text(encoding="utf-8")) == []


def test_every_template_is_checked() -> None:
    assert len(ALL_TEMPLATES) >= 10 and "compose.yaml.j2" in ALL_TEMPLATES


# --- the helpers, against the real parsers ---------------------------------------------------------

TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(TEXT)
def test_yaml_and_compose_values_read_back_as_one_literal(value: str) -> None:
    document = yaml.safe_load(f"a: {escape.yaml_value(value)}\nb: {escape.compose_value(value)}\n")
    assert document == {"a": value, "b": value.replace("$", "$$")}
    assert "\n" not in escape.compose_value(value)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(TEXT, TEXT)
def test_compose_keys_read_back_as_one_key(key: str, value: str) -> None:
    document = yaml.safe_load(f"{escape.compose_key(key or 'k')}: {escape.compose_value(value)}\n")
    assert list(document) == [(key or "k").replace("$", "$$")]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(TEXT)
def test_shell_word_is_one_word(value: str) -> None:
    assert shlex.split(f"x {escape.shell_word(value)} y") == ["x", value, "y"] or "\x00" in value


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(TEXT, min_size=1, max_size=4))
def test_dockerfile_exec_form_is_a_json_array_on_one_line(argv: list[str]) -> None:
    text = escape.dockerfile_exec(argv)
    assert json.loads(text) == argv and "\n" not in text


@settings(max_examples=300, deadline=None, derandomize=True)
@given(TEXT)
def test_dockerfile_quoted_word_has_no_unescaped_dollar_quote_or_newline(value: str) -> None:
    text = escape.dockerfile_quoted(value)
    assert text.startswith('"') and text.endswith('"') and "\n" not in text
    body = text[1:-1]
    index = 0
    while index < len(body):  # every `"`, `$` and `\` is preceded by a backslash
        if body[index] == "\\":
            index += 2
            continue
        assert body[index] not in '"$', text
        index += 1


@pytest.mark.parametrize("value", ['a"b', "a\nb", "a\\b", "a\x1bb"])
def test_aptconf_refuses_what_it_cannot_quote(value: str) -> None:
    with pytest.raises(escape.UnsafeValue):
        escape.aptconf_string(value)


@pytest.mark.parametrize("value", ["a b", "a\nb", "", "x;y"])
def test_apt_and_deb822_names_refuse_separators(value: str) -> None:
    with pytest.raises(escape.UnsafeValue):
        escape.aptconf_key(value)
    if value != "x;y":
        with pytest.raises(escape.UnsafeValue):
            escape.deb822_word(value)


@pytest.mark.parametrize("ref", ["vllm/vllm-openai:nightly-01d4", "localhost:5000/a/b:1.0",
                                 f"ubuntu@sha256:{'a' * 64}", "nvidia/cuda:13.0.2-base-ubuntu22.04"])
def test_image_ref_accepts_references(ref: str) -> None:
    assert escape.image_reference(ref) == ref


@pytest.mark.parametrize("ref", ["", "vllm/vllm-openai:", "a b", "a\nRUN x", "a:$(x)", "a/B", "a:-x", "-a"])
def test_image_ref_refuses_what_is_not_one(ref: str) -> None:
    with pytest.raises(escape.UnsafeValue):
        escape.image_reference(ref)


# --- finding 2: apt.conf ----------------------------------------------------------------------------

PRE_INVOKE = 'http://proxy";APT::Update::Pre-Invoke{"touch${IFS}x";};Dummy::x"'


def example_rig(example_inventory: Path) -> tuple[loader.Fleet, Rig]:
    fleet = loader.load_fleet(example_inventory)
    return fleet, fleet.rig("rig-01")


def test_apt_proxy_injection_cannot_reach_apt_conf(example_inventory: Path) -> None:
    _, rig = example_rig(example_inventory)
    hostile = rig.model_copy(update={"apt_proxy": PRE_INVOKE})
    with pytest.raises(escape.UnsafeValue):
        render.host_files(hostile)


def test_mirror_host_for_the_direct_line_comes_from_the_parsed_url(example_inventory: Path,
                                                                   tmp_path: Path) -> None:
    _, rig = example_rig(example_inventory)
    mirror = AptRepo(url="http://m.lan:3142/cuda", key_url="http://m.lan/k", key_fingerprint="A" * 40)
    good = rig.model_copy(update={"apt_proxy": "http://proxy.lan:3142", "cuda_repo": mirror})
    text = render.host_files(good)["apt/99rigfleet-lock-timeout"]
    apt_config_reads(tmp_path, text, {"Acquire::http::Proxy": "http://proxy.lan:3142",
                                      "Acquire::http::Proxy::m.lan": "DIRECT"})
    hostile = AptRepo.model_construct(url='http://m.lan";APT::Update::Pre-Invoke{"touch x";};X::y"/cuda',
                                      key_url="http://m.lan/k", key_fingerprint="A" * 40)
    with pytest.raises(escape.UnsafeValue):
        render.host_files(good.model_copy(update={"cuda_repo": hostile}))


def test_a_valid_proxy_reads_back_through_apt_config(example_inventory: Path, tmp_path: Path) -> None:
    _, rig = example_rig(example_inventory)
    text = render.host_files(rig.model_copy(update={"apt_proxy": "http://proxy.lan:3142"}))
    apt_config_reads(tmp_path, text["apt/99rigfleet-lock-timeout"], {"Acquire::http::Proxy": "http://proxy.lan:3142"})


def apt_config_reads(tmp_path: Path, text: str, expected: dict[str, str]) -> None:
    """apt's own parser: the fragment sets exactly the expected options (and no Pre-Invoke)."""
    if shutil.which("apt-config") is None:
        pytest.skip("apt-config not installed")
    fragment = tmp_path / "fragment.conf"
    fragment.write_text(text, encoding="utf-8")
    env = {**os.environ, "APT_CONFIG": str(fragment)}
    dump = subprocess.run(["apt-config", "dump"], capture_output=True, text=True, env=env, check=True).stdout
    assert "Pre-Invoke" not in dump
    for key, value in expected.items():
        assert f'{key} "{value}";' in dump


# --- finding 3: pin-set values into compose, entrypoint, Dockerfile ---------------------------------


def release_with(example_inventory: Path, **pinset: object) -> Release:
    fleet, rig = example_rig(example_inventory)
    base = fleet.pinsets[rig.pinset]
    hostile = base.model_copy(update=pinset)
    return Release(rig, hostile, catalog.variants()[rig.variant])


NEWLINE_NAME = "seed\nvolumes_extra: [\"/:/host\"]\nRUN touch /pwned\nrm -rf /"


def test_newline_in_a_pin_set_name_adds_no_key_line_or_instruction(example_inventory: Path) -> None:
    clean = release_with(example_inventory)
    release = release_with(example_inventory, name=NEWLINE_NAME)
    files = release.files(release_id="r1")
    compose = yaml.safe_load(files["compose.yaml"])
    assert set(compose) == set(yaml.safe_load(clean.files(release_id="r1")["compose.yaml"]))
    assert compose["services"]["vllm"]["labels"]["io.rigfleet.pinset"] == NEWLINE_NAME
    for name in ("Dockerfile", "entrypoint.sh"):
        assert len(files[name].splitlines()) == len(clean.files(release_id="r1")[name].splitlines()), name
    assert "\nRUN touch" not in files["Dockerfile"] and "\nrm -rf /" not in files["entrypoint.sh"]


def test_command_substitution_in_vllm_version_is_never_run(example_inventory: Path, tmp_path: Path) -> None:
    """The build step, run by sh with a stand-in python3: the version is data, not shell text."""
    marker = tmp_path / "pwned"
    version = f"0.20.2$(touch {marker})`touch {marker}`"
    files = release_with(example_inventory, vllm_version=version).files(release_id="r1")
    [run] = [line for line in files["Dockerfile"].splitlines() if line.startswith("RUN ")]
    argv = json.loads(run.removeprefix("RUN "))
    assert argv[:2] == ["/bin/sh", render.BUILD_SCRIPT] and argv[2] == version
    script = tmp_path / "rigfleet-build.sh"
    script.write_text(files["rigfleet-build.sh"], encoding="utf-8")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3").write_text("#!/bin/sh\necho 0.20.2\n", encoding="utf-8")
    (bindir / "python3").chmod(0o755)
    result = subprocess.run(["/bin/sh", str(script), *argv[2:]], capture_output=True, text=True,
                            env={"PATH": f"{bindir}:/usr/bin:/bin"})
    assert result.returncode == 1 and "pin set says 0.20.2$(touch" in result.stderr
    assert not marker.exists()


def test_from_and_pip_requirements_are_not_raw(example_inventory: Path) -> None:
    with pytest.raises(escape.UnsafeValue):
        release_with(example_inventory, base_image=ImageRef.model_construct(
            repository="vllm/vllm-openai", tag="x\nRUN touch /pwned", digest=None, archive=None)).files()
    files = release_with(example_inventory, python_deps={"x; touch /pwned": "1.0"}).files(release_id="r1")
    [run] = [line for line in files["Dockerfile"].splitlines() if line.startswith("RUN ")]
    assert json.loads(run.removeprefix("RUN "))[3:] == ["x; touch /pwned==1.0"]
    assert '-- "$@"' in files["rigfleet-build.sh"]  # requirements after --: never a pip option


def test_compose_values_are_not_interpolated(example_inventory: Path) -> None:
    fleet, rig = example_rig(example_inventory)
    hostile = rig.model_copy(update={"engine_env": {"EXTRA": "${HOME}$(id)"}})
    release = Release(hostile, fleet.pinsets[rig.pinset], catalog.variants()[rig.variant])
    compose = yaml.safe_load(release.compose("r1"))
    assert compose["services"]["vllm"]["environment"]["EXTRA"] == "$${HOME}$$(id)"  # Compose reads ${HOME}$(id)


def test_a_colon_in_model_dir_cannot_reshape_the_volume(example_inventory: Path) -> None:
    fleet, rig = example_rig(example_inventory)
    hostile = rig.model_copy(update={"model_dir": "/srv/models:/host:rw"})
    release = Release(hostile, fleet.pinsets[rig.pinset], catalog.variants()[rig.variant])
    volumes = yaml.safe_load(release.compose("r1"))["services"]["vllm"]["volumes"]
    assert volumes[0] == {"type": "bind", "source": "/srv/models:/host:rw", "target": render.CONTAINER_MODEL_ROOT,
                          "read_only": True}
    assert all(set(v) == {"type", "source", "target", "read_only"} for v in volumes)
