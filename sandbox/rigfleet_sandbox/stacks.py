"""SIMULATED stand-ins for re-pinning one rig across the shipped stacks (seed, stock v0.27.1, SNDR
v12), derived from the real pin sets in rigfleet's skeleton inventory:

* a stand-in base image per real `base_image` tag the sandbox does not have yet, carrying the
  pin set's exact `vllm_version` and, as ``vllm/_sim/real_surface.json``, the CLI surface rigfleet
  derives from the real vLLM release wheel of that version (rigfleet.upstream: its flags and value
  choices), so the SIMULATED engine accepts exactly the flags the real release does;
* the real vLLM release's Python sources (every ``vllm/**.py`` of the release wheel nearest to the
  pin, `pip download`ed once into the cache), under the stand-in's own engine files, so a patch
  tree's apply step edits and imports real vLLM code (what needs torch fails, as it would on a
  machine without it); only the files the SIMULATED engine runs stay the stand-in's, except
  REAL_WINS (text that no stand-in module imports: the real one is what a patch must meet);
* the Debian packages of the programs the shipped trees run at apply time (rigfleet's catalog:
  `runtime_programs` of a tree kind, GNU patch for SNDR v12), unpacked from Debian's own .deb of
  the root's suite: the real vllm/vllm-openai image ships them (git's Recommends), so the stand-ins
  of its tags do too;
* a PEP 503 package index on the host's web server (``www/simple/``) holding the real PyPI wheels
  of the patch trees' build requirements (the SNDR v12 tree's setuptools/wheel, pinned in
  rigfleet/catalog/patch_trees.yaml), downloaded here through this machine's pip configuration:
  the image build's `pip download` inside the rig reaches no other index;
* the pin sets themselves: the real ones with only what a sandbox cannot have replaced (the base
  image's digest and archive: the stand-in's; the overlays: the sandbox's stand-in files; the
  index: the host's). The patch tree keeps its real source and commit: the inventory's mirror map
  points that source at the real repository's git bundle, so the real tree lands in the image.
"""

from __future__ import annotations

import hashlib
import html
import io
import json
import logging
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import yaml

from rigfleet import catalog
from rigfleet.schema import MirrorMap
from rigfleet.upstream import sources
from rigfleet_sandbox import debindex, dockerrepo, engine
from rigfleet_sandbox.layout import HOST_URL

log = logging.getLogger(__name__)

SHIPPED = Path(catalog.__file__).resolve().parent / "skeleton" / "inventory" / "pinsets.yml"
STACKS = ("seed-2026-05", "stock-v0-27-1", "sndr-v12")
SURFACE_FILE = "vllm/_sim/real_surface.json"
# Replaced in a sandbox pin set; every other field is the shipped pin set's (tests/unit checks it).
SANDBOX_FIELDS = ("description", "base_image", "overlays", "python_deps", "pip_index_url")


def shipped() -> dict[str, dict[str, Any]]:
    return {name: value for name, value in yaml.safe_load(SHIPPED.read_text()).items() if name in STACKS}


def images(pinsets: dict[str, dict[str, Any]] | None = None) -> list[engine.ImageSpec]:
    """One stand-in per stack, reusing a sandbox image of the same tag and vLLM version."""
    have = {(spec.tag, spec.vllm_version): spec for spec in engine.IMAGES}
    out = []
    for name, real in (pinsets or shipped()).items():
        tag, version = real["base_image"]["tag"], real["vllm_version"]
        out.append(have.get((tag, version)) or engine.ImageSpec(
            f"stack-{name}", tag, version,
            f"SIMULATED stand-in of {real['base_image']['repository']}:{tag} (vLLM {version}) for pin set "
            f"{name}; flags from the real vLLM release wheel's CLI surface; Debian's "
            f"{', '.join(runtime_packages()) or 'nothing more'} as the real image ships it"))
    return out


def surface_file(version: str, mirrors: MirrorMap | None = None) -> bytes | None:
    """The real release's CLI surface (rigfleet.upstream's derivation, cached; downloaded through
    pip when missing), or None where no wheel can be had (the stand-in then keeps its own parser)."""
    try:
        found = sources.vllm_surface(version, mirrors or MirrorMap(), online=True)
    except sources.Unavailable as exc:
        log.warning("stacks (SIMULATED): no real CLI surface for vLLM %s: %s", version, exc)
        return None
    data = found.surface.to_json()
    return json.dumps({"stand_in_release": found.stand_in, **data}, sort_keys=True).encode()


# Stand-in files that are only ever read as text (Genesis anchors, the engine's Marlin check), never
# imported by the SIMULATED engine: in a stack image the real release's copy replaces them.
REAL_WINS = frozenset({
    "vllm/model_executor/kernels/linear/mixed_precision/marlin.py",
    "vllm/model_executor/kernels/linear/mixed_precision/MPLinearKernel.py",
    "vllm/model_executor/layers/mamba/gdn_linear_attn.py",
    "vllm/v1/worker/gpu_worker.py",
    "vllm/v1/worker/gpu_model_runner.py",
})


def release_wheel(version: str, cache_dir: Path) -> Path | None:
    """The real wheel of the release nearest to `version` (rigfleet.upstream's choice), kept in
    the cache; None where none can be had."""
    wheels = Path(cache_dir) / "vllm-wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    for release in sources.release_candidates(version):
        found = sorted(wheels.glob(f"vllm-{release}-*.whl"))
        if found:
            return found[0]
        result = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                                 "-d", str(wheels), f"vllm=={release}"], capture_output=True, text=True,
                                check=False, timeout=1200)
        found = sorted(wheels.glob(f"vllm-{release}-*.whl"))
        if found:
            return found[0]
        log.info("stacks (SIMULATED): no wheel of vllm %s: %s", release, result.stderr.strip()[-200:])
    return None


def real_sources(version: str, cache_dir: Path) -> dict[str, bytes]:
    """vllm/**.py of the real release wheel nearest to `version`, minus the files the SIMULATED
    engine runs (REAL_WINS excepted); {} where no wheel can be had (a warning)."""
    wheel = release_wheel(version, cache_dir)
    if wheel is None:
        log.warning("stacks (SIMULATED): no real vLLM wheel near %s: the stand-in carries no real sources", version)
        return {}
    standin = set(engine.standin_vllm_files(version))
    with zipfile.ZipFile(wheel) as archive:
        return {name: archive.read(name) for name in archive.namelist()
                if name.startswith("vllm/") and name.endswith(".py") and (name not in standin or name in REAL_WINS)}


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def build_index(www: Path, requirements: dict[str, str], cache_dir: Path, base_url: str = HOST_URL) -> str:
    """www/simple/ (PEP 503) with the real wheels of `requirements`; returns the index URL."""
    wheels = cache_dir / "index-wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    pins = [f"{name}=={version}" for name, version in sorted(requirements.items())]
    missing = [p for p in pins if not list(wheels.glob(f"{normalized(p.split('==')[0]).replace('-', '_')}-"
                                                       f"{p.split('==')[1]}-*.whl"))]
    if missing:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "-d", str(wheels), *missing], check=True, capture_output=True, text=True, timeout=600)
    root = Path(www) / "simple"
    projects = []
    for name, version in sorted(requirements.items()):
        project = normalized(name)
        files = sorted(wheels.glob(f"{project.replace('-', '_')}-{version}-*.whl"))
        if not files:
            raise RuntimeError(f"stacks (SIMULATED): no wheel of {name}=={version} after pip download")
        (root / project).mkdir(parents=True, exist_ok=True)
        links = []
        for wheel in files:
            data = wheel.read_bytes()
            engine._write_if_changed(root / project / wheel.name, data)
            digest = hashlib.sha256(data).hexdigest()
            links.append(f'<a href="{html.escape(wheel.name)}#sha256={digest}">{html.escape(wheel.name)}</a><br>')
        engine._write_if_changed(root / project / "index.html",
                                 ("<!DOCTYPE html><html><body>\n" + "\n".join(links) + "\n</body></html>\n").encode())
        projects.append(f'<a href="{project}/">{project}</a><br>')
    engine._write_if_changed(root / "index.html",
                             ("<!DOCTYPE html><html><body>\n" + "\n".join(projects) + "\n</body></html>\n").encode())
    return engine._url(base_url, "simple") + "/"


def build_requirements() -> dict[str, str]:
    """What the shipped trees' kinds pin for their own install (setuptools/wheel for SNDR v12)."""
    kinds = yaml.safe_load((SHIPPED.parents[2] / "catalog" / "patch_trees.yaml").read_text())["kinds"]
    out: dict[str, str] = {}
    for real in shipped().values():
        tree = real.get("genesis") or {}
        if tree:
            out.update(kinds[tree.get("kind", "genesis-v7")].get("build_requires") or {})
    return out


def runtime_packages() -> list[str]:
    """The Debian packages of the programs the shipped trees' kinds run at apply time."""
    kinds = yaml.safe_load((SHIPPED.parents[2] / "catalog" / "patch_trees.yaml").read_text())["kinds"]
    out: set[str] = set()
    for real in shipped().values():
        tree = real.get("genesis") or {}
        if tree:
            out.update((kinds[tree.get("kind", "genesis-v7")].get("runtime_programs") or {}).values())
    return sorted(out)


def debian_files(packages: list[str], suite: str, cache_dir: Path) -> dict[str, tuple[bytes, int]]:
    """(content, mode) by root-relative path of the programs in `packages` (usr/bin) and their
    copyright files, from Debian's .deb of `suite` (checked against its index; cached)."""
    if not packages:
        return {}
    index = debindex.packages_index(suite, "main")
    out: dict[str, tuple[bytes, int]] = {}
    for name in packages:
        deb = dockerrepo.fetch_debian(name, suite, index[name], cache_dir / "debian-debs")
        fsys = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], check=True, capture_output=True).stdout
        with tarfile.open(fileobj=io.BytesIO(fsys)) as tar:
            for member in tar.getmembers():
                path = member.name.removeprefix("./")
                if member.isreg() and (path.startswith("usr/bin/") or path.endswith("/copyright")):
                    handle = tar.extractfile(member)
                    assert handle is not None
                    out[path] = (handle.read(), member.mode & 0o7777)
    return out


def root_suite(root_tarball: Path) -> str:
    """The Debian suite of a rootfs tarball by its cache name (rootfs-<suite>-v<N>.tar.gz)."""
    found = re.match(r"rootfs-([a-z]+)-v\d+", Path(root_tarball).name)
    if not found:
        raise ValueError(f"{root_tarball}: not a sandbox rootfs tarball name; pass its suite")
    return found.group(1)


def build(www: Path, root_tarball: Path, cache_dir: Path, base_url: str = HOST_URL,
          suite: str | None = None) -> dict[str, dict[str, Any]]:
    """Fill `www` with the stand-ins; returns the sandbox pin sets, by the shipped names."""
    www, root_tarball, cache_dir = Path(www), Path(root_tarball), Path(cache_dir)
    real = shipped()
    overlays = engine.build_overlays(www, base_url)
    index = build_index(www, build_requirements(), cache_dir, base_url)
    wheels = engine.fetch_pip_wheels(cache_dir)
    programs = debian_files(runtime_packages(), suite or root_suite(root_tarball), cache_dir)
    out: dict[str, dict[str, Any]] = {}
    for (name, pinset), spec in zip(real.items(), images(real), strict=True):
        extra: dict[str, bytes] = {}
        if spec.pinset.startswith("stack-"):  # a stand-in of its own (the seed reuses the sandbox's)
            extra = real_sources(spec.vllm_version, cache_dir)
            surface = surface_file(spec.vllm_version)
            if surface:
                extra[SURFACE_FILE] = surface
        built = engine.build_image_archive(
            www / "images" / engine.archive_name(spec), root_tarball, spec, cache_dir=cache_dir, wheels=wheels,
            vllm_extra=extra or None, system_extra=programs if spec.pinset.startswith("stack-") else None)
        archive = engine._url(base_url, "images", engine.archive_name(spec))
        out[name] = derive(name, pinset, built["digest"], archive, overlays, index)
    return out


def derive(name: str, pinset: dict[str, Any], digest: str, archive: str, overlays: list[dict[str, Any]],
           index: str) -> dict[str, Any]:
    """The sandbox copy of a shipped pin set: only SANDBOX_FIELDS differ."""
    derived = {**pinset,
               "description": f"SIMULATED sandbox copy of {name}: {pinset['description']}",
               "base_image": {**pinset["base_image"], "digest": digest, "archive": archive},
               "python_deps": {},  # the SIMULATED engine imports none of them; the build's own come from `index`
               "pip_index_url": index}
    if pinset.get("overlays"):
        derived["overlays"] = overlays  # the sandbox's stand-in files (the real ones are not reachable)
    return derived
