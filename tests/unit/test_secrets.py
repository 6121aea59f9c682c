"""Secrets are never echoed (issue 18, finding 5): an error about a secret field prints no value in
any shape; secret-like names in engine_env are refused with the reference form as the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pyinfra_cli.util import parse_cli_arg

from rigfleet import loader
from rigfleet.cli import main
from rigfleet.errors import InputError
from tests.conftest import write_yaml

S = "sk-LeAkMeIfYouCan" + "q7" * 10  # not an env var name: {env: S} is malformed too

SHAPES: list[tuple[str, Any]] = [
    ("api_key", [S]),
    ("api_key", {"value": S}),
    ("api_key", {"env": S}),
    ("api_key", {"env": "X", "file": S}),
    ("hf_token", {"token": S}),
    ("hf_token", S),
    ("hf_token", {"file": [S]}),
    ("api_key", 12345678901234567890),
    ("api_key", {"env": "X", S: 1}),  # the secret as a key: it would be in the field's path (found by the fuzzer)
    ("hf_token", {S: "x"}),
]


@pytest.mark.parametrize(("field", "value"), SHAPES, ids=[f"{f}-{i}" for i, (f, _) in enumerate(SHAPES)])
def test_a_malformed_secret_is_refused_without_its_value(example_inventory: Path, field: str, value: Any) -> None:
    write_yaml(example_inventory / "host_vars" / "rig-01.yml", {field: value})
    result = CliRunner().invoke(main, ["check"], env={"RIGFLEET_INVENTORY": str(example_inventory)})
    assert result.exit_code == 2
    assert f"rig-01: {field}" in result.output and "by reference" in result.output
    secret = str(value if not isinstance(value, (list, dict)) else S)
    assert secret not in result.output and secret[:12] not in result.output


def test_a_secret_in_a_data_override_is_not_echoed(example_inventory: Path) -> None:
    with pytest.raises(InputError) as caught:
        loader.load_fleet(example_inventory, {"api_key": parse_cli_arg(f'{{"value":"{S}"}}')})
    text = "\n".join(p.render() for p in caught.value.problems)
    assert "api_key" in text and S not in text and S not in repr(caught.value.problems)


@pytest.mark.parametrize("name", ["VLLM_API_KEY", "OPENAI_API_KEY", "HF_TOKEN", "HF_HUB_TOKEN",
                                  "HUGGING_FACE_HUB_TOKEN", "GITHUB_TOKEN", "DB_PASSWORD", "MY_SECRET"])
def test_secret_like_engine_env_names_are_refused_with_the_reference_form(example_inventory: Path,
                                                                          name: str) -> None:
    write_yaml(example_inventory / "host_vars" / "rig-01.yml", {"engine_env": {name: S, "OMP_NUM_THREADS": "2"}})
    result = CliRunner().invoke(main, ["check"], env={"RIGFLEET_INVENTORY": str(example_inventory)})
    assert result.exit_code == 2 and "rig-01: engine_env" in result.output and name in result.output
    assert "api_key: {env: NAME}" in result.output
    assert S not in result.output


def test_ordinary_engine_env_names_still_load(example_inventory: Path) -> None:
    write_yaml(example_inventory / "host_vars" / "rig-01.yml",
               {"engine_env": {"OMP_NUM_THREADS": "2", "GENESIS_PREALLOC_TOKEN_BUDGET": "4096"}})
    assert loader.load_fleet(example_inventory).rig("rig-01").engine_env["OMP_NUM_THREADS"] == "2"
