"""rigfleet as an operator gets it: a wheel built from a clean clone, installed into a throwaway venv
(dependencies from the configured index), `rigfleet init`, then check / render / plan in the
operator's directory with a 4-rig, two-group inventory and no checkout on the path."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests import REPO_ROOT

EXAMPLE = REPO_ROOT / "inventory" / "example"


def run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{argv}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    run(["git", "clone", "--quiet", "--no-hardlinks", str(REPO_ROOT), str(work / "clone")], work)
    # the build backend (pyproject's build-system) comes from the configured index, through pip's cache
    run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(work / "dist"), str(work / "clone")],
        work)
    [built] = (work / "dist").glob("rigfleet-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path) -> Path:
    target = wheel.parent.parent / "venv"
    run([sys.executable, "-m", "venv", str(target)], wheel.parent)
    run([str(target / "bin" / "python"), "-m", "pip", "install", "--quiet", str(wheel)], wheel.parent)  # pip's cache
    return target


def test_the_wheel_holds_the_production_package_only(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("rigfleet/templates/") for n in names)
    assert any(n.startswith("rigfleet/roles/") for n in names)
    assert "rigfleet/skeleton/inventory/pinsets.yml" in names and any(n.startswith("rigfleet/catalog/") for n in names)
    assert all(n.split("/")[0] == "rigfleet" or n.split("/")[0].endswith(".dist-info") for n in names), names
    assert not [n for n in names if "sandbox" in n.lower() or "/assets/" in n or n.endswith(("nvidia-smi", "vllm"))]


def test_init_then_check_render_plan_from_the_wheel(venv: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RIGFLEET_INVENTORY", "PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    rigfleet = str(venv / "bin" / "rigfleet")
    ops = tmp_path / "ops"
    run([rigfleet, "init", str(ops)], tmp_path, env)
    # a fleet like inventory/example: two groups, per-rig overrides, the shipped pin sets
    for item in ("hosts.yml", "group_vars", "host_vars", "mirrors.yml"):
        source, target = EXAMPLE / item, ops / "inventory" / item
        if target.is_dir():
            shutil.rmtree(target)
        (shutil.copytree if source.is_dir() else shutil.copyfile)(source, target)
    where = run([str(venv / "bin" / "python"), "-c", "import rigfleet, sys; print(rigfleet.__file__); print(sys.path)"],
                ops, env).stdout
    assert str(venv) in where.splitlines()[0] and str(REPO_ROOT) not in where
    run([rigfleet, "check"], ops, env)
    run([rigfleet, "render", "rig-02", "-o", str(tmp_path / "out")], ops, env)
    assert any((tmp_path / "out").rglob("compose.yaml"))
    rows = json.loads(run([rigfleet, "plan", "--json"], ops, env).stdout)
    assert sorted(row["rig"] for row in rows) == ["rig-01", "rig-02", "rig-11", "rig-12"]
    assert {row["variant"] for row in rows} >= {"turbo"}  # rig-02's own override
