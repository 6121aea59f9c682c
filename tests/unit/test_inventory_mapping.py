"""inventory.py as pyinfra's CLI loads it (issue 18, finding 1): no inventory group name can shadow
another name, and every rig reaches pyinfra with its address, strict host-key checking, its
known_hosts file and its sudo setting. A group named `rigs` used to replace the list that carried
the connection data; `a-b` and `a_b` used to merge."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyinfra.api import State
from pyinfra.context import ctx_state
from pyinfra_cli.inventory import make_inventory_from_files

from rigfleet import context, loader, paths
from rigfleet.cli import main
from rigfleet.errors import InputError
from tests import REPO_ROOT
from tests.conftest import write_yaml

INVENTORY_PY = str(REPO_ROOT / "inventory.py")
# names bound in inventory.py or pyinfra's own, and those of the old inventory.py
HOSTILE = ["rigs", "fleet", "pyinfra_host_data", "install_hints", "context", "hostkeys", "globals", "print",
           "rigfleet", "lab", "prod", "group", "data", "host", "state", "config"]


@pytest.fixture
def load(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    def _load(inventory: Path) -> Any:
        monkeypatch.setenv("RIGFLEET_INVENTORY", str(inventory))
        paths.select(None)  # the entry file fixes the inventory per process; each test is a new one
        context._fleet.cache_clear()
        with ctx_state.use(State()):  # what pyinfra's CLI has in place when it execs inventory.py
            return make_inventory_from_files(INVENTORY_PY)
    yield _load
    paths.select(None)
    context._fleet.cache_clear()


def set_groups(inventory: Path, groups: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    """Re-group the example's four rigs; returns rig -> its inline connection vars."""
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text())
    rigs: dict[str, dict[str, Any]] = {}
    for group in hosts["all"]["children"].values():
        rigs.update(group["hosts"])
    children = {name: {"hosts": {rig: rigs[rig] for rig in members}} for name, members in groups.items()}
    write_yaml(inventory / "hosts.yml", {"all": {"children": children}})
    for stale in ("lab", "prod"):
        if stale not in groups:
            for ext in (".yml", ".yaml"):
                (inventory / "group_vars" / f"{stale}{ext}").unlink(missing_ok=True)
    return rigs


def assert_every_rig_intact(pyinfra_inventory: Any, inventory: Path) -> None:
    fleet = loader.load_fleet(inventory)
    hosts = {host.name: host for host in pyinfra_inventory}
    assert sorted(hosts) == sorted(rig.name for rig in fleet.rigs)
    for rig in fleet.rigs:
        data = hosts[rig.name].data
        assert data.ssh_hostname == rig.ssh_hostname and data.ssh_port == rig.ssh_port
        assert data.ssh_strict_host_key_checking == "yes"
        assert Path(data.ssh_known_hosts_file) == inventory / "known_hosts"
        assert data._sudo is (rig.ssh_user is not None and rig.ssh_user != "root")


def test_the_example_reaches_pyinfra_intact(example_inventory: Path, load: Any) -> None:
    inventory = load(example_inventory)
    assert_every_rig_intact(inventory, example_inventory)
    assert sorted(h.name for h in inventory.get_group("lab")) == ["rig-01", "rig-02"]


@pytest.mark.parametrize("name", HOSTILE)
def test_no_group_name_shadows_the_connection_data(example_inventory: Path, load: Any, name: str) -> None:
    set_groups(example_inventory, {name: ["rig-01", "rig-02"], "other": ["rig-11", "rig-12"]})
    inventory = load(example_inventory)
    assert_every_rig_intact(inventory, example_inventory)
    assert sorted(h.name for h in inventory.get_group(name)) == ["rig-01", "rig-02"]


@pytest.mark.parametrize(("groups", "needle"), [
    ({"all": ["rig-01"], "x": ["rig-02", "rig-11", "rig-12"]}, "reserved"),
    ({"inventory": ["rig-01"], "x": ["rig-02", "rig-11", "rig-12"]}, "reserved"),
    ({"a-b": ["rig-01", "rig-02"], "a_b": ["rig-11", "rig-12"]}, "same pyinfra name as 'a-b'"),
    ({"rig_01": ["rig-01", "rig-02"], "x": ["rig-11", "rig-12"]}, "same pyinfra name"),
])
def test_reserved_and_clashing_names_exit_2(example_inventory: Path, groups: dict[str, list[str]],
                                            needle: str) -> None:
    set_groups(example_inventory, groups)
    result = CliRunner().invoke(main, ["check"], env={"RIGFLEET_INVENTORY": str(example_inventory)})
    assert result.exit_code == 2 and needle in result.output and "Fix: rename" in result.output
    assert "Traceback" not in result.output


GROUP_NAMES = st.one_of(st.sampled_from([*HOSTILE, "all", "a-b", "a_b", "rig_01", "inventory"]),
                        st.from_regex(r"[a-z][a-z0-9_-]{0,8}", fullmatch=True))


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(st.tuples(GROUP_NAMES, st.sets(st.sampled_from(["rig-01", "rig-02", "rig-11", "rig-12"]),
                                                min_size=1)), min_size=1, max_size=4))
def test_any_accepted_inventory_reaches_pyinfra_intact(tmp_path_factory: pytest.TempPathFactory, load: Any,
                                                       drawn: list[tuple[str, set[str]]]) -> None:
    import shutil

    from tests.conftest import EXAMPLE

    inventory = tmp_path_factory.mktemp("inv") / "inventory"
    shutil.copytree(EXAMPLE, inventory)
    groups: dict[str, list[str]] = {}
    for name, members in drawn:
        groups.setdefault(name, sorted(members))
    covered = {rig for members in groups.values() for rig in members}
    groups.setdefault("rest", sorted({"rig-01", "rig-02", "rig-11", "rig-12"} - covered) or ["rig-01"])
    set_groups(inventory, groups)
    try:
        loader.load_fleet(inventory)
    except InputError as exc:  # refused: reserved or clashing, and said so
        assert all("pyinfra" in p.message or "reserved" in p.message for p in exc.problems), exc
        return
    assert_every_rig_intact(load(inventory), inventory)
