"""The `vllm serve` surface of one vLLM release, derived from the wheel's Python sources.

vLLM builds its parser from config dataclasses: `EngineArgs.add_cli_args` calls
`group.add_argument("--flag", **xxx_kwargs["field"])` with `xxx_kwargs = get_kwargs(SomeConfig)`;
`get_kwargs` turns a `Literal[...]` annotation into `choices` and a `bool` into a
BooleanOptionalAction (so `--no-flag` exists too). The OpenAI frontend adds one `--field-name` per
field of its `FrontendArgs` dataclasses. Parser names come from the lazy registration tables in
vllm/tool_parsers and vllm/reasoning; `VLLM_*` names from envs.py's `environment_variables`.
The wheel is only parsed with `ast`: no torch, no import of vllm.
"""

from __future__ import annotations

import ast
from dataclasses import asdict, dataclass, field
from typing import Any

# Wheel members the derivation reads (glob-style prefixes); everything else stays in the zip.
MEMBER_PREFIXES = (
    "vllm/engine/arg_utils.py",
    "vllm/config/",
    "vllm/entrypoints/openai/cli_args.py",
    "vllm/envs.py",
    "vllm/tool_parsers/__init__.py",
    "vllm/reasoning/__init__.py",
)
FORMAT = 1  # bump when the derivation changes, so stale caches are re-derived


@dataclass
class Surface:
    release: str
    flags: list[str] = field(default_factory=list)
    choices: dict[str, list[str]] = field(default_factory=dict)  # flag -> accepted values
    speculative_methods: list[str] = field(default_factory=list)
    tool_parsers: list[str] = field(default_factory=list)
    reasoning_parsers: list[str] = field(default_factory=list)
    env: list[str] = field(default_factory=list)
    format: int = FORMAT

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Surface:
        return cls(**data)


def wanted(member: str) -> bool:
    return member.endswith(".py") and any(
        member == p or (p.endswith("/") and member.startswith(p) and "/" not in member[len(p):])
        for p in MEMBER_PREFIXES
    )


class _Module:
    """One parsed source file: its top-level Literal aliases and its classes."""

    def __init__(self, source: str) -> None:
        self.tree = ast.parse(source)
        self.aliases: dict[str, ast.expr] = {}
        self.classes: dict[str, ast.ClassDef] = {}
        for node in self.tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                self.aliases[node.targets[0].id] = node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                self.aliases[node.target.id] = node.value
            elif isinstance(node, ast.ClassDef):
                self.classes[node.name] = node


class _Index:
    """Every alias and class across the parsed files (names are unique enough in vllm/config)."""

    def __init__(self, modules: list[_Module]) -> None:
        self.aliases: dict[str, ast.expr] = {}
        self.classes: dict[str, ast.ClassDef] = {}
        for module in modules:
            self.aliases.update(module.aliases)
            self.classes.update(module.classes)

    def literal_values(self, node: ast.expr | None, depth: int = 0) -> tuple[list[str], bool]:
        """(values of every Literal in the annotation, whether free text is also accepted)."""
        if node is None or depth > 12:
            return [], False
        if isinstance(node, ast.Subscript):
            head = node.value
            name = head.id if isinstance(head, ast.Name) else head.attr if isinstance(head, ast.Attribute) else ""
            items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            if name == "Literal":
                values: list[str] = []
                for item in items:
                    if isinstance(item, ast.Constant) and isinstance(item.value, str):
                        values.append(item.value)
                    else:
                        values += self.literal_values(item, depth + 1)[0]
                return values, False
            if name in ("Optional", "Union", "Annotated"):
                found: list[str] = []
                free = False
                for item in items[:1] if name == "Annotated" else items:
                    more, more_free = self.literal_values(item, depth + 1)
                    found, free = found + more, free or more_free
                return found, free
            return [], False
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            left, left_free = self.literal_values(node.left, depth + 1)
            right, right_free = self.literal_values(node.right, depth + 1)
            return left + right, left_free or right_free
        if isinstance(node, ast.Name):
            if node.id == "str":
                return [], True
            if node.id in self.aliases:
                return self.literal_values(self.aliases[node.id], depth + 1)
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return self.literal_values(ast.parse(node.value, mode="eval").body, depth + 1)
        return [], False

    def fields(self, class_name: str, depth: int = 0) -> dict[str, ast.expr]:
        """Annotated fields of a dataclass, its bases' first (a subclass may override)."""
        cls = self.classes.get(class_name)
        if cls is None or depth > 8:
            return {}
        result: dict[str, ast.expr] = {}
        for base in cls.bases:
            if isinstance(base, ast.Name):
                result |= self.fields(base.id, depth + 1)
        for node in cls.body:
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and not node.target.id.startswith("_")):
                result[node.target.id] = node.annotation
        return result


def _is_bool(annotation: ast.expr) -> bool:
    text = ast.unparse(annotation).replace(" ", "")
    return text in ("bool", "bool|None", "Optional[bool]", "None|bool")


def _strings(node: ast.expr) -> list[str]:
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def _engine_flags(arg_utils: ast.Module, index: _Index, surface: Surface) -> None:
    kwargs_of: dict[str, str] = {}  # `cache_kwargs` -> `CacheConfig`
    for node in ast.walk(arg_utils):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name)
                and node.value.func.id == "get_kwargs" and node.value.args
                and isinstance(node.value.args[0], ast.Name)):
            kwargs_of[node.targets[0].id] = node.value.args[0].id
    for node in ast.walk(arg_utils):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                 and a.value.startswith("--")]
        if not names:
            continue
        choices: list[str] = []
        boolean = False
        for keyword in node.keywords:
            if keyword.arg == "choices":
                choices = _strings(keyword.value)
            elif keyword.arg == "action" and "BooleanOptionalAction" in ast.unparse(keyword.value):
                boolean = True
            elif keyword.arg is None:
                # `**cache_kwargs["field"]`, possibly inside `**{**cache_kwargs["field"], ...}`
                splats = [keyword.value] if isinstance(keyword.value, ast.Subscript) else [
                    v for k, v in zip(keyword.value.keys, keyword.value.values, strict=True)
                    if k is None and isinstance(v, ast.Subscript)] if isinstance(keyword.value, ast.Dict) else []
                for splat in splats:
                    owner, key = splat.value, splat.slice
                    if not (isinstance(owner, ast.Name) and isinstance(key, ast.Constant) and owner.id in kwargs_of):
                        continue
                    annotation = index.fields(kwargs_of[owner.id]).get(str(key.value))
                    if annotation is not None:
                        values, free = index.literal_values(annotation)
                        if values and not free:
                            choices = values
                        boolean = boolean or _is_bool(annotation)
        _add(surface, names, choices, boolean)


def _add(surface: Surface, names: list[str], choices: list[str], boolean: bool) -> None:
    for name in names:
        surface.flags.append(name)
        if boolean:
            surface.flags.append("--no-" + name[2:])
        if choices:
            surface.choices[name] = sorted(set(choices))


def _frontend_flags(cli_args: ast.Module, index: _Index, surface: Surface) -> None:
    for name in ("FrontendArgs",):
        for field_name, annotation in index.fields(name).items():
            values, free = index.literal_values(annotation)
            _add(surface, ["--" + field_name.replace("_", "-")], values if not free else [], _is_bool(annotation))
    for node in ast.walk(cli_args):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                     and a.value.startswith("--")]
            choices = next((_strings(k.value) for k in node.keywords if k.arg == "choices"), [])
            _add(surface, names, choices, False)


def _table_keys(module: ast.Module, suffix: str) -> list[str]:
    """Keys of the module's `_..._TO_REGISTER = {"name": (file, class)}` lazy registration table."""
    keys: list[str] = []
    for node in module.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else (
            node.target if isinstance(node, ast.AnnAssign) else None)
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if isinstance(target, ast.Name) and target.id.endswith(suffix) and isinstance(value, ast.Dict):
            keys += [k.value for k in value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
    return keys


def _env_names(envs: ast.Module) -> list[str]:
    names: list[str] = []
    for node in ast.walk(envs):
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else (
            node.target if isinstance(node, ast.AnnAssign) else None)
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if isinstance(target, ast.Name) and target.id == "environment_variables" and isinstance(value, ast.Dict):
            names += [k.value for k in value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
    return names


def derive(release: str, members: dict[str, str]) -> Surface:
    """The surface from the wheel's member texts (path inside the wheel -> source)."""
    config_modules = [_Module(text) for path, text in sorted(members.items()) if path.startswith("vllm/config/")]
    cli_args = _Module(members["vllm/entrypoints/openai/cli_args.py"])
    arg_utils = _Module(members["vllm/engine/arg_utils.py"])
    index = _Index([*config_modules, arg_utils, cli_args])
    surface = Surface(release=release)
    _engine_flags(arg_utils.tree, index, surface)
    _frontend_flags(cli_args.tree, index, surface)
    methods, _ = index.literal_values(index.aliases.get("SpeculativeMethod"))
    surface.speculative_methods = sorted(set(methods))
    surface.tool_parsers = sorted(set(_table_keys(ast.parse(members["vllm/tool_parsers/__init__.py"]), "_TO_REGISTER")))
    surface.reasoning_parsers = sorted(set(_table_keys(ast.parse(members["vllm/reasoning/__init__.py"]),
                                                       "_TO_REGISTER")))
    surface.env = sorted(set(_env_names(ast.parse(members["vllm/envs.py"]))))
    surface.flags = sorted(set(surface.flags))
    return surface
