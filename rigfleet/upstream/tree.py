"""What a patch tree declares, derived from its files at one commit: layout kind, patch registry
(patch id -> env flag), every GENESIS_/SNDR_ name its code reads, vLLM allowlist, entry point.

Two layouts are known (rigfleet/catalog/patch_trees.yaml holds their marker files and where each
fact lives): the Genesis v7 layout (package vllm/_genesis, `python3 -m vllm._genesis.patches.apply_all`)
and the SNDR v12 layout (package sndr, `python3 -m sndr.apply`, installed with pip). Sources are
parsed with `ast`; nothing of the tree is imported or run.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from rigfleet import catalog

FORMAT = 1
ENV_TOKEN = re.compile(r"\b(?:GENESIS|SNDR)_[A-Z0-9_]*[A-Z0-9]\b")


@dataclass
class TreeFacts:
    commit: str
    kind: str | None  # the layout found (None: neither)
    registry: dict[str, str] = field(default_factory=dict)  # patch id -> env flag
    aliases: dict[str, list[str]] = field(default_factory=dict)  # patch id -> extra flags it honours
    env_read: list[str] = field(default_factory=list)
    allowlist: list[str] = field(default_factory=list)
    entry_point: str | None = None
    format: int = FORMAT

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TreeFacts:
        return cls(**data)

    def enable_names(self) -> dict[str, str]:
        """Every env name that switches a patch -> its patch id (v12 also honours SNDR_ and
        *_DISABLE_ spellings of the same bare name)."""
        names: dict[str, str] = {}
        for pid, flag in self.registry.items():
            for each in (flag, *self.aliases.get(pid, ())):
                names[each] = pid
                if self.kind == "sndr-v12":
                    bare = re.sub(r"^(SNDR|GENESIS)_ENABLE_", "", each)
                    if bare != each:
                        for prefix in ("SNDR_ENABLE_", "GENESIS_ENABLE_", "SNDR_DISABLE_", "GENESIS_DISABLE_"):
                            names[prefix + bare] = pid
        return names


def detect_kind(paths: set[str]) -> str | None:
    for kind, spec in catalog.patch_tree_kinds().items():
        if all(marker in paths for marker in spec["markers"]):
            return kind
    return None


def _top_assign(module: ast.Module, name: str) -> ast.expr | None:
    for node in module.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return node.value
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return node.value
    return None


def _registry(module: ast.Module) -> tuple[dict[str, str], dict[str, list[str]]]:
    value = _top_assign(module, "PATCH_REGISTRY")
    flags: dict[str, str] = {}
    aliases: dict[str, list[str]] = {}
    if not isinstance(value, ast.Dict):
        return flags, aliases
    for key, entry in zip(value.keys, value.values, strict=True):
        if not (isinstance(key, ast.Constant) and isinstance(entry, ast.Dict)):
            continue
        for k, v in zip(entry.keys, entry.values, strict=True):
            if isinstance(k, ast.Constant) and k.value == "env_flag" and isinstance(v, ast.Constant) and v.value:
                flags[str(key.value)] = str(v.value)
            elif isinstance(k, ast.Constant) and k.value == "env_flag_aliases" and isinstance(v, (ast.List, ast.Tuple)):
                aliases[str(key.value)] = [str(e.value) for e in v.elts if isinstance(e, ast.Constant)]
    return flags, aliases


def _strings(module: ast.Module, name: str) -> list[str]:
    value = _top_assign(module, name)
    if not isinstance(value, (ast.Tuple, ast.List)):
        return []
    return [e.value for e in value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]


def _docstrings(module: ast.Module) -> set[int]:
    ids = set()
    for node in ast.walk(module):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def env_tokens(source: str) -> set[str]:
    """GENESIS_/SNDR_ names in the code's string constants (docstrings excluded: prose is not a read;
    code embedded in text-patch strings included: it runs inside vLLM)."""
    try:
        module = ast.parse(source)
    except SyntaxError:
        return set()
    skip = _docstrings(module)
    found: set[str] = set()
    for node in ast.walk(module):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            found |= set(ENV_TOKEN.findall(node.value))
    return found


def derive(commit: str, paths: set[str], read: Callable[[str], str], declared: str | None = None) -> TreeFacts:
    """Facts of the tree; `read(path)` returns one file's text at the commit."""
    kind = detect_kind(paths)
    facts = TreeFacts(commit=commit, kind=kind)
    if kind is None:
        return facts
    spec = catalog.patch_tree_kinds()[kind]
    facts.entry_point = spec["entry_point"]
    facts.registry, facts.aliases = _registry(ast.parse(read(spec["registry"])))
    for guards in spec["allowlist_files"]:
        module = ast.parse(read(guards))
        for name in spec["allowlist_names"]:
            facts.allowlist += _strings(module, name)
    package = spec["package"]
    ignored = tuple(spec.get("not_reads", ()))
    env: set[str] = set()
    for path in sorted(paths):
        if path.startswith(package) and path.endswith(".py") and "/tests/" not in path and not path.endswith(ignored):
            env |= env_tokens(read(path))
    facts.env_read = sorted(env)
    return facts
