"""Waves behind the fleet's gateway: a wave never takes out more rigs than every model can spare
(gateway_min_serving), a plan that would leave a model below it is refused (exit 2, one clear line)
before any rig is contacted, and the serving swap is told where to drain each rig."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from rigfleet import rollout
from rigfleet.cli import main
from rigfleet.errors import InputError
from rigfleet.roles.serving import release_spec
from tests.plan.test_gateway import fleet_of, four, on, rig

HOSTS = {"all": {"children": {
    "gateway": {"hosts": {"rig-01": {}}},
    "lab": {"hosts": {
        "rig-01": {"ssh_hostname": "192.0.2.10", "bind_address": "192.0.2.10", "api_key": {"env": "K"}},
        "rig-02": {"ssh_hostname": "192.0.2.11", "bind_address": "192.0.2.11", "api_key": {"env": "K"}}}},
    "prod": {"hosts": {"rig-11": {"ssh_hostname": "192.0.2.21"}, "rig-12": {"ssh_hostname": "192.0.2.22"}}},
}}}


def test_waves_are_split_so_every_model_keeps_its_minimum() -> None:
    fleet = four(gateway_min_serving=2)
    names = rollout.scope(fleet, None, None)
    # 4 rigs serve the one model: a wave may take at most 2 of them out
    assert rollout.plan_waves(names, None, 3, fleet) == [["rig-01"], ["rig-02", "rig-03"], ["rig-04"]]
    fleet = four(gateway_min_serving=3)
    assert rollout.plan_waves(names, None, 3, fleet) == [["rig-01"], ["rig-02"], ["rig-03"], ["rig-04"]]
    # without a gateway the waves are what was asked for
    plain = fleet_of(*(r.model_copy(update={"groups": ()}) for r in fleet.rigs))
    assert rollout.plan_waves(names, None, 3, plain) == [["rig-01"], ["rig-02", "rig-03", "rig-04"]]


def test_a_plan_that_would_leave_a_model_with_too_few_backends_is_refused() -> None:
    fleet = fleet_of(rig("rig-01", "192.0.2.11", groups=("gateway",)))  # one rig serves the model
    with pytest.raises(InputError) as raised:
        rollout.plan_waves(["rig-01"], None, 2, fleet)
    line = raised.value.problems[0].render()
    assert "qwen3.6-27b-autoround" in line and "gateway_min_serving" in line and "rig-01" in line
    relaxed = fleet_of(rig("rig-01", "192.0.2.11", groups=("gateway",), gateway_min_serving=0))
    assert rollout.plan_waves(["rig-01"], None, 2, relaxed) == [["rig-01"]]


def write(example_inventory: Path, minimum: int) -> Path:
    hosts = yaml.safe_load(yaml.safe_dump(HOSTS))
    hosts["all"]["children"]["gateway"]["hosts"]["rig-01"] = {"gateway_min_serving": minimum}
    (example_inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    return example_inventory


def test_repin_refuses_before_contacting_any_rig(example_inventory: Path) -> None:
    inventory = write(example_inventory, 4)
    result = CliRunner().invoke(main, ["repin", "--dry-run", "--from", "seed-2026-05"],
                                env={"RIGFLEET_INVENTORY": str(inventory), "K": "k"})
    assert result.exit_code == 2, result.output
    assert "gateway_min_serving" in result.output and "Traceback" not in result.output
    inventory = write(example_inventory, 3)
    result = CliRunner().invoke(main, ["repin", "--dry-run", "--from", "seed-2026-05", "--wave", "2"],
                                env={"RIGFLEET_INVENTORY": str(inventory), "K": "k"})
    assert result.exit_code == 0, result.output
    assert "wave 1: rig-02\n" in result.output and "wave 3: rig-12" in result.output


def test_the_swap_is_told_where_to_drain() -> None:
    fleet = four()
    spec = release_spec(on(fleet, "rig-02")).drain
    assert spec is not None and spec.gateway == "rig-01" and spec.server == "rig-02"
    assert spec.backends == ("model-qwen3.6-27b-autoround",) and spec.timeout_s == 120
    assert release_spec(on(rollout.without_drain(fleet), "rig-02")).drain is None
    alone = fleet_of(rig("rig-01", "192.0.2.11"))
    assert release_spec(on(alone, "rig-01")).drain is None
