"""Minimal in-tree PEP 517 backend for the stand-in plugin (stdlib only, no build requirements).

Builds a reproducible pure-Python wheel of `genesis_v7.py` with the metadata from pyproject.toml.
"""

from __future__ import annotations

import base64
import hashlib
import io
import tarfile
import zipfile
from pathlib import Path

import tomllib

HERE = Path(__file__).resolve().parent
MODULES = ("genesis_v7.py",)
EPOCH = (1980, 1, 1, 0, 0, 0)


def _project() -> dict:
    return tomllib.loads((HERE / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _dist_name(project: dict) -> str:
    return project["name"].replace("-", "_")


def _metadata_files(project: dict) -> dict[str, bytes]:
    meta = (
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
        f"Summary: {project.get('description', '')}\nRequires-Python: {project.get('requires-python', '')}\n"
    )
    eps = ""
    for group, entries in project.get("entry-points", {}).items():
        eps += f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()) + "\n"
    if project.get("scripts"):
        eps += "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in project["scripts"].items())
    wheel = "Wheel-Version: 1.0\nGenerator: genesis-sim-backend\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    return {
        "METADATA": meta.encode(),
        "WHEEL": wheel.encode(),
        "entry_points.txt": eps.encode(),
        "top_level.txt": "".join(m.removesuffix(".py") + "\n" for m in MODULES).encode(),
    }


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}\n"


def get_requires_for_build_wheel(config_settings: dict | None = None) -> list[str]:
    return []


def get_requires_for_build_sdist(config_settings: dict | None = None) -> list[str]:
    return []


def prepare_metadata_for_build_wheel(metadata_directory: str, config_settings: dict | None = None) -> str:
    project = _project()
    info = f"{_dist_name(project)}-{project['version']}.dist-info"
    target = Path(metadata_directory) / info
    target.mkdir(parents=True, exist_ok=True)
    for name, data in _metadata_files(project).items():
        (target / name).write_bytes(data)
    return info


def build_wheel(
    wheel_directory: str, config_settings: dict | None = None, metadata_directory: str | None = None
) -> str:
    project = _project()
    dist = _dist_name(project)
    info = f"{dist}-{project['version']}.dist-info"
    files = {m: (HERE / m).read_bytes() for m in MODULES}
    files.update({f"{info}/{k}": v for k, v in _metadata_files(project).items()})
    record = "".join(_record_line(k, v) for k, v in files.items()) + f"{info}/RECORD,,\n"
    files[f"{info}/RECORD"] = record.encode()
    name = f"{dist}-{project['version']}-py3-none-any.whl"
    with zipfile.ZipFile(Path(wheel_directory) / name, "w", zipfile.ZIP_DEFLATED) as whl:
        for arcname, data in files.items():
            entry = zipfile.ZipInfo(arcname, EPOCH)
            entry.external_attr = 0o644 << 16
            whl.writestr(entry, data)
    return name


def build_sdist(sdist_directory: str, config_settings: dict | None = None) -> str:
    project = _project()
    base = f"{_dist_name(project)}-{project['version']}"
    name = f"{base}.tar.gz"
    with tarfile.open(Path(sdist_directory) / name, "w:gz") as tar:
        for rel in (*MODULES, "pyproject.toml", "_sim_backend.py", "README.md"):
            data = (HERE / rel).read_bytes()
            info = tarfile.TarInfo(f"{base}/{rel}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return name
