"""Load an Ansible-style inventory directory into a validated Fleet.

Layout: hosts.yml, group_vars/<group>.yml (or group_vars/<group>/*.yml), host_vars/<rig>.yml,
pinsets.yml. Precedence exactly as ansible-core's (tests/unit/test_precedence_ansible.py compares
with `ansible-inventory`), lowest first: inline group vars in hosts.yml (all, then parent before
child, then by name), group_vars files (all.yml, then the same group order), the host's inline vars
in hosts.yml, host_vars/<rig>.yml, and last pyinfra's --data.

pyinfra-ansible-inventory-connector was evaluated and not used: it drags in ansible-core (GPL,
~40 MB), needs `@ansible/path` instead of `inventory.py`, knows nothing of pin sets, and its
errors are Ansible's rather than naming the rig, the field and the fix.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from rigfleet import grammar
from rigfleet.errors import FLEET, InputError, Problem, closest
from rigfleet.schema import MirrorMap, PinSet, Rig

# pyinfra global arguments (e.g. _sudo) pass through to pyinfra untouched.
PYINFRA_PREFIX = "_"
# fields whose value is a secret reference: an error about them never prints the value
SECRET_FIELDS = ("hf_token", "api_key")


# Bounds on every inventory file: nesting (the composer recurses: 3000 levels was a RecursionError)
# and the size aliases expand to (a billion-laughs bomb is tiny on disk and endless to print).
MAX_DEPTH = 64
MAX_EXPANDED_NODES = 200_000


class _UniqueKeyLoader(yaml.SafeLoader):
    """A duplicate key in YAML is almost always a copy-paste mistake: refuse it."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels",
                                                  self.peek_event().start_mark)
            return super().compose_node(parent, index)  # type: ignore[no-untyped-call]
        finally:
            self._depth -= 1

    def compose_document(self) -> Any:
        node = super().compose_document()  # type: ignore[no-untyped-call]
        if node is not None and _expanded_size(node) > MAX_EXPANDED_NODES:
            raise yaml.composer.ComposerError(None, None, f"aliases expand to more than {MAX_EXPANDED_NODES} "
                                              "values (or refer to themselves)", node.start_mark)
        return node


def _expanded_size(root: yaml.Node) -> int:
    """Values the document holds once every alias is expanded; a node graph, walked iteratively and
    memoised by identity (linear in the file). A self-referencing alias counts as unbounded."""
    sizes: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    active: set[int] = set()
    while stack:
        node, done = stack.pop()
        key = id(node)
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        if done:
            active.discard(key)
            sizes[key] = min(1 + sum(sizes[id(c)] for c in children), MAX_EXPANDED_NODES + 1)
            continue
        if key in sizes:
            continue
        if key in active:
            return MAX_EXPANDED_NODES + 1
        active.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in children if id(child) not in sizes)
    return sizes[id(root)]


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
        if not isinstance(key, (str, int, float, bool)) and key is not None:
            raise yaml.constructor.ConstructorError(
                None, None, "a key must be a plain name, not a list or mapping", key_node.start_mark
            )
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


@dataclass(frozen=True)
class Fleet:
    inventory_dir: Path
    rigs: tuple[Rig, ...]
    pinsets: dict[str, PinSet]
    # where each rig's values came from: rig -> field -> file
    sources: dict[str, dict[str, str]] = field(default_factory=dict)
    # per-rig pyinfra data that is not part of the rig model (keys starting with "_")
    pyinfra_data: dict[str, dict[str, Any]] = field(default_factory=dict)
    # mirrors.yml: where pin-set sources are found on an air-gapped fleet
    mirrors: MirrorMap = MirrorMap()

    def rig(self, name: str) -> Rig:
        for rig in self.rigs:
            if rig.name == name:
                return rig
        guess = closest(name, [r.name for r in self.rigs])
        hint = f"did you mean '{guess}'? " if guess else ""
        raise InputError([Problem(name, "rig", name, "no such rig in the inventory",
                                  f"{hint}rigs: {', '.join(r.name for r in self.rigs)}")])

    def path(self, relative: str | None) -> Path | None:
        """Resolve an inventory-relative path (ssh key, known_hosts)."""
        if relative is None:
            return None
        path = Path(relative).expanduser()
        return path if path.is_absolute() else self.inventory_dir / path


def read_yaml(path: Path, rig: str = FLEET) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputError([Problem(rig, path.name, "<bytes>", "the file is not UTF-8 text",
                                  "save it as UTF-8", str(path))]) from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputError([Problem(rig, path.name, "<yaml>", f"not valid YAML ({problem})",
                                  "fix the YAML syntax at that line", where)]) from None


def _mapping(data: Any, path: Path, rig: str = FLEET, what: str = "this file") -> dict[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise InputError([Problem(rig, path.name, _kind(data), f"{what} must be a mapping of names to values",
                                  "write `key: value` lines at the top level", str(path))])
    return data


def _kind(value: Any) -> str:
    return f"<{type(value).__name__}>"


@dataclass
class _Tree:
    """Groups and hosts from hosts.yml, in file order: inline vars, the parent -> child edges, and the
    groups each host is listed under directly."""

    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    children: dict[str, list[str]] = field(default_factory=dict)
    host_vars: dict[str, dict[str, Any]] = field(default_factory=dict)
    direct: dict[str, list[str]] = field(default_factory=dict)
    depth: dict[str, int] = field(default_factory=dict)
    host_groups: dict[str, list[str]] = field(default_factory=dict)

    def ancestors(self, group: str) -> set[str]:
        parents = {p for p, kids in self.children.items() if group in kids}
        seen: set[str] = set()
        while parents:
            seen |= parents
            parents = {p for p, kids in self.children.items() if set(kids) & parents} - seen
        return seen

    def finish(self) -> None:
        """Depth is the longest path from `all` (as Ansible computes it: a group nested deeper anywhere
        is deeper everywhere), and a host is in every ancestor of a group it is listed in, wherever
        that group gained the parent."""
        self.depth = {"all": 0}
        frontier = ["all"]
        while frontier:  # a DAG (cycles are refused while walking): relax edges until nothing grows
            nxt = []
            for parent in frontier:
                for child in self.children.get(parent, []):
                    if self.depth.get(child, -1) < self.depth[parent] + 1:
                        self.depth[child] = self.depth[parent] + 1
                        nxt.append(child)
            frontier = nxt
        for host, groups in self.direct.items():
            members = set(groups).union(*(self.ancestors(g) for g in groups)) | {"all"}
            self.host_groups[host] = sorted(members, key=lambda g: (self.depth[g], g))


def _walk(name: str, body: Any, tree: _Tree, path: Path) -> None:
    """One group's body, its keys in file order (Ansible's YAML inventory reads them so: a host listed
    twice keeps the inline vars read last)."""
    body = _mapping(body, path, what=f"group '{name}'")
    unknown = set(body) - {"hosts", "children", "vars"}
    if unknown:
        key = sorted(unknown)[0]
        raise InputError([Problem(FLEET, f"{name}.{key}", key, "unknown key in a group of hosts.yml",
                                  "a group holds only hosts:, children: and vars:", str(path))])
    tree.groups.setdefault(name, {})
    for key in body:
        if key == "vars":
            tree.groups[name].update(_mapping(body["vars"], path, what=f"{name}.vars"))
        elif key == "hosts":
            for host, inline in _mapping(body["hosts"], path, what=f"{name}.hosts").items():
                tree.host_vars.setdefault(host, {}).update(_mapping(inline, path, host, f"host '{host}'"))
                if name not in tree.direct.setdefault(host, []):
                    tree.direct[host].append(name)
        else:
            for child, child_body in _mapping(body["children"], path, what=f"{name}.children").items():
                if child in RESERVED_GROUPS:
                    raise InputError([Problem(FLEET, "hosts.yml group", child,
                                              "a reserved name in pyinfra's inventory", "rename the group",
                                              str(path))])
                _walk(child, child_body, tree, path)
                if child == name or child in tree.ancestors(name):
                    raise InputError([Problem(FLEET, f"{name}.children", child, "groups nest in a cycle",
                                              "remove the cycle", str(path))])
                if child not in tree.children.setdefault(name, []):
                    tree.children[name].append(child)


def _vars_file(directory: Path, name: str) -> list[Path]:
    """group_vars/NAME.yml, NAME.yaml, NAME, or every file in a NAME/ directory (as Ansible reads
    it: sorted, into subdirectories, .yml, .yaml, .json or no extension; hidden and ~ files skipped)."""
    found = [directory / f"{name}{ext}" for ext in ("", ".yml", ".yaml") if (directory / f"{name}{ext}").exists()]
    if len(found) > 1:  # Ansible reads the first and ignores the rest: which one counts is not for a guess
        raise InputError([Problem(name if directory.name == "host_vars" else FLEET, directory.name,
                                  ", ".join(p.name for p in found), "more than one vars file for the same name",
                                  "merge them into one .yml file", str(directory))])
    if found and found[0].is_dir():
        return _vars_dir(found[0])
    return found


def _vars_dir(directory: Path) -> list[Path]:
    found: list[Path] = []
    for entry in sorted(directory.iterdir(), key=lambda p: p.name):
        if entry.name.startswith(".") or entry.name.endswith("~"):
            continue
        if entry.is_dir() and not entry.suffix:
            found += _vars_dir(entry)
        elif entry.is_file() and entry.suffix in ("", ".yml", ".yaml", ".json"):
            found.append(entry)
    return found


def _layer(merged: dict[str, Any], sources: dict[str, str], values: dict[str, Any], origin: str) -> None:
    for key, value in values.items():
        merged[key] = value
        sources[key] = origin


def load_fleet(inventory_dir: Path, overrides: dict[str, Any] | None = None) -> Fleet:
    """Read, merge and validate; raise InputError listing every problem found.

    `overrides` (pyinfra's `--data key=value`) beat every file, for every rig, as in pyinfra.
    """
    inventory_dir = Path(inventory_dir)
    hosts_file = inventory_dir / "hosts.yml"
    if not hosts_file.is_file():
        raise InputError([Problem(FLEET, "inventory", str(inventory_dir), "no hosts.yml there",
                                  "name a directory that has one: RIGFLEET_INVENTORY=DIR or "
                                  "`rigfleet -i DIR` (`rigfleet init DIR` writes a skeleton)")])
    top = _mapping(read_yaml(hosts_file), hosts_file)
    if set(top) != {"all"}:
        raise InputError([Problem(FLEET, "hosts.yml", sorted(top), "the top level must be the single key `all`",
                                  "nest groups under all: children:", str(hosts_file))])
    tree = _Tree()
    _walk("all", top["all"], tree, hosts_file)
    tree.finish()
    _refuse_clashing_names(tree, hosts_file)
    if not tree.host_groups:
        raise InputError([Problem(FLEET, "hosts", None, "the inventory has no rigs",
                                  "add rigs under all: children: <group>: hosts:", str(hosts_file))])

    # group -> key -> (value, file it came from)
    group_files: dict[str, dict[str, tuple[Any, str]]] = {}
    for group in tree.groups:
        values: dict[str, tuple[Any, str]] = {}
        for path in _vars_file(inventory_dir / "group_vars", group):
            values.update({k: (v, str(path)) for k, v in _mapping(read_yaml(path), path).items()})
        group_files[group] = values
    _refuse_stray_vars(inventory_dir, set(tree.groups), set(tree.host_groups))

    pinsets, problems = _load_pinsets(inventory_dir)
    rigs: list[Rig] = []
    all_sources: dict[str, dict[str, str]] = {}
    all_pyinfra: dict[str, dict[str, Any]] = {}
    for host in sorted(tree.host_groups):
        groups = tree.host_groups[host]  # all first, then by depth, then by name
        merged: dict[str, Any] = {}
        sources: dict[str, str] = {}
        # Ansible's order (ansible-core's VariableManager, default precedence): every group's inline
        # vars from hosts.yml, then every group_vars file (all.yml first), then the host's inline
        # vars, then its host_vars file. An inline group var loses even to group_vars/all.yml.
        for group in groups:
            _layer(merged, sources, tree.groups.get(group, {}), f"{hosts_file} (group {group})")
        for group in groups:
            for key, (value, origin) in group_files.get(group, {}).items():
                _layer(merged, sources, {key: value}, origin)
        _layer(merged, sources, tree.host_vars.get(host, {}), f"{hosts_file} (host {host})")
        for path in _vars_file(inventory_dir / "host_vars", host):
            _layer(merged, sources, _mapping(read_yaml(path, host), path, host), str(path))
        _layer(merged, sources, overrides or {}, "--data")
        pyinfra = {k: merged.pop(k) for k in list(merged) if k.startswith(PYINFRA_PREFIX)}
        rig, rig_problems = _validate_rig(host, groups, merged, sources)
        problems += rig_problems
        if rig is not None:
            rigs.append(rig)
        all_sources[host] = sources
        all_pyinfra[host] = pyinfra
    mirrors, mirror_problems = _load_mirrors(inventory_dir)
    problems += mirror_problems
    problems += _duplicate_endpoints(rigs)
    if problems:
        raise InputError(problems)
    return Fleet(inventory_dir, tuple(rigs), pinsets, all_sources, all_pyinfra, mirrors)


def _duplicate_endpoints(rigs: list[Rig]) -> list[Problem]:
    """Two rigs on one host and SSH port are one machine deployed twice (or a copy-paste slip)."""
    seen: dict[tuple[str, int], str] = {}
    problems = []
    for rig in rigs:
        endpoint = (rig.ssh_hostname.lower(), rig.ssh_port)
        if endpoint in seen:
            problems.append(Problem(rig.name, "ssh_hostname", f"{rig.ssh_hostname}:{rig.ssh_port}",
                                    f"the same host and SSH port as rig '{seen[endpoint]}'",
                                    "give each rig its own address (or port), or remove the duplicate"))
        seen.setdefault(endpoint, rig.name)
    return problems


def _load_mirrors(inventory_dir: Path) -> tuple[MirrorMap, list[Problem]]:
    """mirrors.yml (optional): `prefixes: {SOURCE_PREFIX: MIRROR}` and `wheels: DIR_OR_INDEX`.
    A relative mirror path is taken from the inventory directory."""
    path = inventory_dir / "mirrors.yml"
    if not path.is_file():
        return MirrorMap(), []
    body = _mapping(read_yaml(path), path, "mirrors", "the mirror map")
    try:
        mirrors = MirrorMap(**body)
    except ValidationError as exc:
        sources = dict.fromkeys(body, str(path))
        return MirrorMap(), [_problem("mirrors", e, body, sources, MirrorMap) for e in exc.errors()]

    def local(target: str) -> str:
        if "://" in target or target.startswith("/"):
            return target
        return str((inventory_dir / target).resolve())

    return MirrorMap(prefixes={k: local(v) for k, v in mirrors.prefixes.items()},
                     wheels=local(mirrors.wheels) if mirrors.wheels else None), []


# pyinfra names: `all` carries every rig with its connection data; the CLI adds a group named
# after the inventory file. A group of either name would replace or blur them.
RESERVED_GROUPS = ("all", "inventory")


def pyinfra_name(name: str) -> str:
    """The name a group gets in pyinfra's inventory (a Python identifier: '-' becomes '_')."""
    return name.replace("-", "_").replace(".", "_")


def _refuse_clashing_names(tree: _Tree, path: Path) -> None:
    """Group names become pyinfra group names: refuse reserved ones and two names (or a group and
    a rig) that would become the same pyinfra name, which would merge them silently."""
    problems = []
    seen: dict[str, str] = {}
    for kind, names in (("rig", sorted(tree.host_groups)), ("group", sorted(set(tree.groups) - {"all"}))):
        for name in names:
            if kind == "group" and name in RESERVED_GROUPS:
                problems.append(Problem(FLEET, "hosts.yml group", name, "a reserved name in pyinfra's inventory",
                                        "rename the group", str(path)))
                continue
            key = pyinfra_name(name)
            if key in seen and seen[key] != name:
                problems.append(Problem(FLEET, f"hosts.yml {kind}", name,
                                        f"becomes the same pyinfra name as '{seen[key]}'",
                                        "rename one of the two (names differing only in '-', '_' or '.' clash)",
                                        str(path)))
            seen.setdefault(key, name)
    if problems:
        raise InputError(problems)


def _refuse_stray_vars(inventory_dir: Path, groups: set[str], hosts: set[str]) -> None:
    """A host_vars/rig-3.yml for a rig named rig-03 would be silently ignored: say so."""
    problems = []
    for folder, names, what in (("group_vars", groups, "group"), ("host_vars", hosts, "rig")):
        directory = inventory_dir / folder
        if not directory.is_dir():
            continue
        for entry in sorted(directory.iterdir()):
            name = entry.name.removesuffix(".yml").removesuffix(".yaml")
            if entry.name.startswith(".") or name in names:
                continue
            guesses = difflib.get_close_matches(name, sorted(names), n=3, cutoff=0.5)
            hint = (f"rename it to {' or '.join(g + '.yml' for g in guesses)}" if guesses
                    else f"add the {what} to hosts.yml or delete the file")
            problems.append(Problem(name if what == "rig" else FLEET, folder, entry.name,
                                    f"no {what} of that name in hosts.yml", hint, str(entry)))
    if problems:
        raise InputError(problems)


def _validate_rig(host: str, groups: list[str], values: dict[str, Any],
                  sources: dict[str, str]) -> tuple[Rig | None, list[Problem]]:
    try:
        return Rig(name=host, groups=tuple(g for g in groups if g != "all"), **values), []
    except ValidationError as exc:
        return None, [_problem(host, error, values, sources, Rig) for error in exc.errors()]
    except TypeError as exc:  # a non-string key reached **values
        return None, [Problem(host, "<key>", None, str(exc), "use plain string keys")]


def _load_pinsets(inventory_dir: Path) -> tuple[dict[str, PinSet], list[Problem]]:
    path = inventory_dir / "pinsets.yml"
    if not path.is_file():
        return {}, []
    pinsets: dict[str, PinSet] = {}
    problems: list[Problem] = []
    for name, body in _mapping(read_yaml(path), path).items():
        body = _mapping(body, path, f"pinset {name}", f"pin set '{name}'")
        if "name" in body:
            problems.append(Problem(f"pinset {name}", "name", body["name"], "a pin set is named by its key",
                                    "remove name: (rename the key instead)", str(path)))
            continue
        try:
            pinsets[name] = PinSet(name=name, **body)
        except ValidationError as exc:
            sources = dict.fromkeys(body, str(path))
            problems += [_problem(f"pinset {name}", e, body, sources, PinSet) for e in exc.errors()]
    return pinsets, problems


def _problem(owner: str, error: Any, values: dict[str, Any], sources: dict[str, str],
             model: type[BaseModel]) -> Problem:
    """Turn one pydantic error into a Problem naming the field, the value and the fix."""
    loc = [str(part) for part in error["loc"]]
    field_name = ".".join(loc) if loc else "<model>"
    top = loc[0] if loc else ""
    value = error.get("input")
    kind = error["type"]
    source = sources.get(top)
    if top in SECRET_FIELDS:
        # whatever the shape (a string, a list, {value: S}, {env: X, file: S}, {env: X, S: 1}), print
        # no value and no path below the field (a secret given as a key would be in the path)
        return Problem(owner, top, "<hidden>", "secrets are given by reference, never inline",
                       f"write {top}: {{env: VAR_NAME}} or {top}: {{file: /path/to/file}}", source)
    if kind == "extra_forbidden":
        known = [name for name in model.model_fields if name not in ("name", "groups")]
        guess = closest(top, known) if len(loc) == 1 else None
        hint = f"did you mean '{guess}'?" if guess else "remove it or check the spelling"
        return Problem(owner, field_name, value, "unknown key", hint, source)
    if kind == "missing":
        return Problem(owner, field_name, None, "required but not set",
                       f"set {field_name} in group_vars/all.yml or host_vars/{owner}.yml", source)
    if top == "engine_env" and isinstance(value, dict):
        value = sorted(value)  # the names only: a value there may be a secret given inline
    message = error["msg"].removeprefix("Value error, ")
    if kind == "literal_error":
        return Problem(owner, field_name, value, message, "use one of the listed values", source)
    given = grammar.FIX.match(message)
    if given:
        return Problem(owner, field_name, value, given["message"], given["fix"], source)
    return Problem(owner, field_name, value, message, _fix_for(kind, error), source)


def _fix_for(kind: str, error: Any) -> str:
    ctx = error.get("ctx") or {}
    if kind in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
        bounds = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in ctx.items())
        return f"use a number with {bounds}"
    if kind.startswith("int_") or kind.startswith("float_"):
        return "write a plain number (no quotes, no units)"
    if kind.startswith("bool"):
        return "write true or false"
    if kind.startswith("string") or kind == "str_type":
        return "write a quoted string"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return "write a mapping (key: value lines)"
    if kind in ("tuple_type", "list_type"):
        return "write a list"
    return "correct the value"
