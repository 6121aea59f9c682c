"""The production package's import graph (read with ast, nothing imported): one layer per module,
imports only downwards or within a layer, no circle, no sandbox.

docs/ARCHITECTURE.md describes these layers; a new module must be placed in one here.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "rigfleet"

# Lowest first. A module may import from its own layer or one below it, never from above.
LAYERS: list[tuple[str, set[str]]] = [
    ("foundation", {"errors", "escape", "tables", "paths", "grammar", "rigstate", "rigpython", "ledger", "liveness",
                    "riglock", "redact",
                    "gate", "gate.checks", "gate.probe"}),
    ("schema", {"schema"}),
    ("catalog/loader", {"catalog", "loader", "planner", "exposure"}),
    ("release/render", {"render", "release", "gateway", "fleetcache", "pindiff", "upstream", "upstream.fleet",
                        "upstream.sources", "upstream.surface", "upstream.tree", "upstream.verify", "monitoring"}),
    ("validated fleet", {"guard", "context", "hostkeys"}),
    ("facts", {"facts", "facts.apt", "facts.cache", "facts.docker", "facts.files", "facts.firewall", "facts.image",
               "facts.nvidia", "facts.serving", "facts.system", "facts.weights"}),
    ("operations", {"operations", "operations.apt", "operations.docker", "operations.files",
                    "operations.hub_fetch", "operations.image", "operations.ordering",
                    "operations.server", "operations.serving", "operations.shell", "operations.systemd",
                    "operations.weights"}),
    ("roles", {"roles", "roles.api_firewall", "roles.apt_base", "roles.container_toolkit", "roles.docker_engine",
               "roles.gpu_tuning", "roles.model_weights", "roles.nvidia_driver", "roles.preflight",
               "roles.serving", "roles.vllm_image", "roles.gateway", "roles.node_exporter", "roles.monitor",
               "roles.fleet_cache"}),
    ("runner/rollout", {"runner", "rollout", "status", "deploy", "inventory", "verify", "live", "watch",
                        "report"}),
    ("cli_*", {"cli_common", "cli_fleet", "cli_hostkeys", "cli_pins", "cli_verify", "cli_watch", "cli_report",
               "rollback", "operator_repo"}),
    ("cli", {"cli", "skeleton.deploy", "skeleton.inventory", "skeleton.config"}),
]
LAYER_OF = {module: index for index, (_, modules) in enumerate(LAYERS) for module in modules}


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts:
            found[".".join(parts)] = path
    return found


def imports(path: Path, known: set[str]) -> set[str]:
    """The rigfleet modules a file imports (at any depth: a function's lazy import counts too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from rigfleet.x import y`: y may be a module of package x
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in names:
            if name == "rigfleet" or not name.startswith("rigfleet."):
                continue
            module = name.removeprefix("rigfleet.")
            if module in known:
                found.add(module)
    return found


def graph() -> dict[str, set[str]]:
    found = modules()
    return {module: imports(path, set(found)) - {module} for module, path in found.items()}


def test_every_module_has_a_layer() -> None:
    unplaced = sorted(set(modules()) - set(LAYER_OF))
    assert not unplaced, f"place these modules in a layer of LAYERS (and docs/ARCHITECTURE.md): {unplaced}"
    gone = sorted(set(LAYER_OF) - set(modules()))
    assert not gone, f"LAYERS names modules that do not exist: {gone}"


def test_no_import_from_a_lower_layer_up() -> None:
    upward = [f"{module} ({LAYERS[LAYER_OF[module]][0]}) imports {dep} ({LAYERS[LAYER_OF[dep]][0]})"
              for module, deps in graph().items() for dep in sorted(deps)
              if module in LAYER_OF and dep in LAYER_OF and LAYER_OF[dep] > LAYER_OF[module]]
    assert not upward, "\n".join(upward)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for dep in sorted(edges.get(node, ())):
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_circle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle() -> None:
    assert not cycles(graph())


def test_the_graph_sees_lazy_and_from_imports() -> None:
    # the parser must see these, or the tests above pass vacuously
    edges = graph()
    assert "roles" in edges["runner"] and "liveness" in edges["runner"]
    assert "roles.serving" in edges["rollback"]  # imported inside the command function


def test_production_never_imports_the_sandbox() -> None:
    offenders = []
    for module, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{module}: {name}" for name in names if name.split(".")[0] == "rigfleet_sandbox"]
    assert not offenders


def sandbox_mentions() -> list[str]:
    hits = []
    for path in sorted(PACKAGE.rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts or path.suffix == ".pyc":
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if "sandbox" in line.lower():
                hits.append(f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()[:100]}")
    return hits


def test_no_sandbox_word_in_the_production_package() -> None:
    # rigfleet/ with its templates, catalog and skeleton: the sandbox is a layer on top
    hits = sandbox_mentions()
    assert not hits, "\n".join(hits)


def test_the_architecture_doc_names_every_module_of_the_table() -> None:
    doc = (PACKAGE.parent / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    missing = sorted({m.split(".")[0] for m in LAYER_OF} - {m for m in LAYER_OF if f"`{m}`" in doc}
                     - {m.split(".")[0] for m in LAYER_OF if f"`{m.split('.')[0]}/`" in doc})
    assert not missing, f"docs/ARCHITECTURE.md's layer table lacks {missing}"


def test_inline_rig_python_goes_one_way() -> None:
    # rig-side snippets run through rigfleet.rigpython.command; nobody else builds that pipe
    offenders = [module for module, path in modules().items()
                 if module != "rigpython" and "| python3 -" in path.read_text(encoding="utf-8")]
    assert not offenders


def test_one_role_loop() -> None:
    # rigfleet.roles.run_roles is the loop over roles; every caller goes through it
    loops = [module for module, path in modules().items()
             if module != "roles" and ("for role in" in (text := path.read_text(encoding="utf-8"))
                                       or "host.loop(" in text)]
    assert not loops, f"these loop over roles themselves; call rigfleet.roles.run_roles: {loops}"
    edges = graph()
    callers = {module for module, path in modules().items() if "run_roles(" in path.read_text(encoding="utf-8")}
    assert {"deploy", "runner"} <= callers and all("roles" in edges[m] for m in callers - {"roles"})
