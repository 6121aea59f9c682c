"""Precedence against ansible-core itself: seeded random inventories, merged by `ansible-inventory`
and by rigfleet's loader, must give every rig the same values and the same groups."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import annotated_types
import pytest

from rigfleet.loader import load_fleet
from rigfleet.schema import Rig
from tests.conftest import write_yaml

SEEDS = range(24)


def _ansible_inventory() -> str | None:
    beside = Path(sys.executable).parent / "ansible-inventory"  # the venv's, from the dev extras
    return str(beside) if beside.is_file() else shutil.which("ansible-inventory")


ANSIBLE_INVENTORY = _ansible_inventory()
pytestmark = pytest.mark.skipif(ANSIBLE_INVENTORY is None,
                                reason="ansible-inventory not installed (pip install -e '.[dev]')")


def _simple_fields() -> dict[str, list[Any]]:
    """Rig fields whose valid values the schema itself bounds: booleans, literals and bounded
    integers (a handful of values each, spread over the bounds)."""
    fields: dict[str, list[Any]] = {}
    for name, info in Rig.model_fields.items():
        annotation = info.annotation
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        low = next((m.ge for m in info.metadata if isinstance(m, annotated_types.Ge)), None)
        high = next((m.le for m in info.metadata if isinstance(m, annotated_types.Le)), None)
        if annotation is bool:
            fields[name] = [True, False]
        elif typing.get_origin(annotation) is typing.Literal:
            fields[name] = list(typing.get_args(annotation))
        elif int in (annotation, *args) and low is not None and high is not None:
            fields[name] = sorted({int(low), int(high), *(int(low + (high - low) * k / 7) for k in range(1, 7))})
        elif int in args and low is None and high is None:  # power_limit_w: watts, bounded by the card
            fields[name] = list(range(150, 451, 50))
    return fields


FIELDS = _simple_fields()
REQUIRED = {"pinset": "seed", "variant": "int8", "model_dir": "/srv/models"}


class _Generator:
    """One random inventory: groups nested as a DAG under all (a group may have several parents and
    be listed, with more vars or hosts, in more than one place), hosts in one or more groups, and
    each chosen field set in any of the places Ansible reads vars from."""

    def __init__(self, seed: int) -> None:
        self.r = random.Random(seed)
        ints = [f for f, v in FIELDS.items() if len(v) > 2]
        others = [f for f, v in FIELDS.items() if len(v) <= 2]
        # few fields, many places: most fields are set in several places, so precedence decides
        self.fields = self.r.sample(ints, 4) + self.r.sample(others, 2)
        self.groups = [f"g{i}" for i in range(self.r.randint(2, 6))]
        self.parents: dict[str, list[str]] = {}
        for i, group in enumerate(self.groups):
            pool = ["all", *self.groups[:i]]
            self.parents[group] = self.r.sample(pool, self.r.choice([1, 1, 2]) if len(pool) > 1 else 1)
        self.hosts = [f"rig-{i:02d}" for i in range(1, self.r.randint(2, 5) + 1)]
        self.host_groups = {h: self.r.sample(["all", *self.groups], self.r.choice([1, 1, 2])) for h in self.hosts}

    def vars(self, p: float = 0.4) -> dict[str, Any]:
        return {f: self.r.choice(FIELDS[f]) for f in self.fields if self.r.random() < p}

    def host_entry(self, host: str) -> dict[str, Any]:
        return {"ssh_hostname": f"192.0.2.{self.hosts.index(host) + 1}", **self.vars(0.3)}

    def body(self, group: str, home: bool) -> dict[str, Any] | None:
        """A group's body where it is listed: its home listing has all of it, another listing may
        add vars or hosts, or be empty."""
        parts: dict[str, Any] = {}
        if home or self.r.random() < 0.3:
            parts["vars"] = self.vars()
        hosts = [h for h in self.hosts if group in self.host_groups[h]]
        if hosts and (home or self.r.random() < 0.3):
            parts["hosts"] = {h: self.host_entry(h) for h in hosts if home or self.r.random() < 0.5}
        if home:
            kids = [g for g in self.groups if group in self.parents[g]]
            if kids:
                parts["children"] = {k: self.body(k, home=self.parents[k][0] == group) for k in kids}
        keys = list(parts)
        self.r.shuffle(keys)  # Ansible reads a group's keys in file order
        return {k: parts[k] for k in keys} if parts or self.r.random() < 0.5 else None

    def write(self, inventory: Path) -> None:
        write_yaml(inventory / "hosts.yml", {"all": self.body("all", home=True)})
        write_yaml(inventory / "group_vars" / "all.yml", {**REQUIRED, **self.vars()})
        for group in self.groups:
            self._vars_files(inventory / "group_vars", group)
        for host in self.hosts:
            self._vars_files(inventory / "host_vars", host)

    def _vars_files(self, folder: Path, name: str) -> None:
        roll = self.r.random()
        if roll < 0.5:
            write_yaml(folder / f"{name}.yml", self.vars())
        elif roll < 0.7:  # a directory: its files in sorted order, the later winning
            for part in ("a.yml", "b.yaml"):
                write_yaml(folder / name / part, self.vars())


def _ansible(inventory: Path) -> dict[str, Any]:
    """`ansible-inventory --list` once for the whole inventory, run from outside it (so only the
    inventory's own group_vars/host_vars are read) and with no user configuration."""
    home = inventory.parent / "ansible-home"
    home.mkdir(exist_ok=True)
    (home / "ansible.cfg").write_text("")  # Ansible's defaults, whatever the machine's configuration
    env = {**os.environ, "ANSIBLE_HOME": str(home), "ANSIBLE_LOCAL_TEMP": str(home / "tmp"),
           "ANSIBLE_CONFIG": str(home / "ansible.cfg"), "ANSIBLE_INVENTORY_ENABLED": "yaml",
           "ANSIBLE_INVENTORY_UNPARSED_FAILED": "true", "ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED": "true"}
    assert ANSIBLE_INVENTORY is not None
    done = subprocess.run([ANSIBLE_INVENTORY, "-i", str(inventory / "hosts.yml"), "--list"],
                          cwd=inventory.parent, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _ansible_groups(listing: dict[str, Any]) -> dict[str, set[str]]:
    groups: dict[str, set[str]] = {}
    children = {g: body.get("children", []) for g, body in listing.items() if g != "_meta"}

    def hosts_of(group: str) -> set[str]:
        found = set(listing.get(group, {}).get("hosts", []))
        for child in children.get(group, []):
            found |= hosts_of(child)
        return found

    for group in children:
        if group not in ("all", "ungrouped"):
            for host in hosts_of(group):
                groups.setdefault(host, set()).add(group)
    return groups


def _compare(inventory: Path, fields: list[str]) -> list[str]:
    """Every rig's value of every field, rigfleet against Ansible: the differences, one line each."""
    listing = _ansible(inventory)
    hostvars = listing["_meta"]["hostvars"]
    fleet = load_fleet(inventory)
    assert sorted(hostvars) == sorted(r.name for r in fleet.rigs)
    groups = _ansible_groups(listing)
    wrong = []
    for rig in fleet.rigs:
        for name in fields:
            expected = hostvars[rig.name].get(name, Rig.model_fields[name].default)
            if getattr(rig, name) != expected:
                wrong.append(f"{rig.name}.{name}: rigfleet {getattr(rig, name)!r} "
                             f"({fleet.sources[rig.name].get(name, 'default')}), ansible {expected!r}")
        theirs = groups.get(rig.name, set())
        if set(rig.groups) != theirs:
            wrong.append(f"{rig.name} groups: rigfleet {sorted(rig.groups)}, ansible {sorted(theirs)}")
    return wrong


@pytest.mark.parametrize("seed", SEEDS)
def test_random_inventory_merges_as_ansible_does(tmp_path: Path, seed: int) -> None:
    generator = _Generator(seed)
    generator.write(tmp_path / "inventory")
    assert _compare(tmp_path / "inventory", generator.fields) == []


def test_the_generated_inventories_exercise_precedence() -> None:
    """The generator is worth running: across the seeds, fields are set in several places at once,
    groups nest and have more than one parent (else agreement would prove little)."""
    nested = multi_parent = 0
    for seed in SEEDS:
        generator = _Generator(seed)
        nested += any(p != "all" for ps in generator.parents.values() for p in ps)
        multi_parent += any(len(ps) > 1 for ps in generator.parents.values())
    assert nested >= len(SEEDS) // 2 and multi_parent >= len(SEEDS) // 4


def test_issue_36_inline_group_var_loses_to_group_vars_all(tmp_path: Path) -> None:
    """The issue's case: 260 inline in the lab group, 250 in group_vars/all.yml: Ansible gives 250."""
    inventory = tmp_path / "inventory"
    write_yaml(inventory / "hosts.yml", {"all": {"children": {"lab": {
        "vars": {"power_limit_w": 260}, "hosts": {"rig-01": {"ssh_hostname": "192.0.2.10"}}}}}})
    write_yaml(inventory / "group_vars" / "all.yml", {**REQUIRED, "power_limit_w": 250})
    assert _compare(inventory, ["power_limit_w"]) == []
    fleet = load_fleet(inventory)
    assert fleet.rig("rig-01").power_limit_w == 250
    assert fleet.sources["rig-01"]["power_limit_w"].endswith("group_vars/all.yml")
