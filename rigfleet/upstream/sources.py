"""Fetch and cache what verification derives from: vLLM release wheels and patch trees.

Everything is cached as small JSON derivations under the cache directory (one per vLLM release,
one per tree commit), so a warm check reads two files. A cold derivation reads a local mirror
first (the inventory's mirror map) and touches the network only when `online` is set: wheels
through pip's own client and configuration (`pip download`), trees through git.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from rigfleet.schema import MirrorMap
from rigfleet.upstream import surface as surface_mod
from rigfleet.upstream import tree as tree_mod

CACHE_ENV = "RIGFLEET_UPSTREAM_CACHE"


class Unavailable(Exception):
    """The derivation is not cached and cannot be made now (no mirror, no network, no such release)."""


def cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "rigfleet", "upstream")
    return Path(root)


def _read_cache(path: Path, fmt: int) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == fmt else None


def _write_cache(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, sort_keys=True), encoding="utf-8")
    tmp.replace(path)


# --- vLLM release wheels ---------------------------------------------------------------------------


def release_candidates(vllm_version: str) -> list[str]:
    """Releases whose wheel stands in for a version: itself if it is a release; for a nightly
    (X.Y.ZrcN.devM+g...) the release it leads to, then the releases before it in that minor line
    (nightlies are not on PyPI; the nearest published release is used and said so)."""
    match = re.match(r"^(\d+)\.(\d+)\.(\d+)", vllm_version)
    if not match:
        return [vllm_version]
    major, minor, patch = (int(g) for g in match.groups())
    base = f"{major}.{minor}.{patch}"
    if vllm_version == base:
        return [base]
    return [f"{major}.{minor}.{p}" for p in range(patch, -1, -1)]


def _members_from_wheel(path: Path) -> dict[str, str]:
    with zipfile.ZipFile(path) as wheel:
        return {name: wheel.read(name).decode("utf-8") for name in wheel.namelist() if surface_mod.wanted(name)}


def _wheel_in_dir(directory: Path, release: str) -> Path | None:
    for candidate in sorted(directory.glob(f"vllm-{release}-*.whl")):
        return candidate
    return None


def _pip_download(release: str, into: Path, index: str | None) -> Path | None:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--disable-pip-version-check",
               "--only-binary", ":all:", "-d", str(into), f"vllm=={release}"]
    if index:
        command[4:4] = ["--index-url", index]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        if "No matching distribution" in result.stderr or "Could not find a version" in result.stderr:
            return None
        raise Unavailable(f"pip download vllm=={release} failed: {result.stderr.strip().splitlines()[-1:]}")
    return _wheel_in_dir(into, release)


@dataclass(frozen=True)
class SurfaceResult:
    surface: surface_mod.Surface
    stand_in: bool  # the pin's own version is not published: a nearby release's wheel was read


def vllm_surface(vllm_version: str, mirrors: MirrorMap, online: bool) -> SurfaceResult:
    candidates = release_candidates(vllm_version)
    for release in candidates:
        cached = _read_cache(cache_dir() / f"vllm-{release}.json", surface_mod.FORMAT)
        if cached is not None:
            return SurfaceResult(surface_mod.Surface.from_json(cached), release != vllm_version)
    wheels = mirrors.wheels
    local = Path(wheels.removeprefix("file://")) if wheels and not re.match(r"^https?://", wheels) else None
    if local is None and not online:
        raise Unavailable(f"no cached derivation of vLLM {candidates[0]} and no wheel mirror (mirror map "
                          "`wheels:`); run `rigfleet pins --verify` with PyPI reachable")
    for release in candidates:
        if local is not None:
            wheel = _wheel_in_dir(local, release)
            if wheel is None:
                continue
            members = _members_from_wheel(wheel)
        else:
            with tempfile.TemporaryDirectory(prefix="rigfleet-wheel-") as tmp:
                wheel = _pip_download(release, Path(tmp), wheels)
                if wheel is None:
                    continue
                members = _members_from_wheel(wheel)  # only the parser's sources leave the temp dir
        derived = surface_mod.derive(release, members)
        _write_cache(cache_dir() / f"vllm-{release}.json", derived.to_json())
        return SurfaceResult(derived, release != vllm_version)
    where = f"in {local}" if local is not None else "on the package index"
    raise Unavailable(f"no vLLM release wheel for {vllm_version} {where} (tried {', '.join(candidates)})")


# --- patch trees -------------------------------------------------------------------------------------


def resolve(source: str, mirrors: MirrorMap) -> str:
    """A source after the mirror map: the longest matching prefix is replaced."""
    for prefix in sorted(mirrors.prefixes, key=len, reverse=True):
        if source.startswith(prefix):
            return mirrors.prefixes[prefix] + source[len(prefix):]
    return source


def is_local(source: str) -> bool:
    return source.startswith("/") or source.startswith("file://")


def _git(*args: str, cwd: Path | None = None, stdin: bytes | None = None) -> bytes:
    result = subprocess.run(["git", *args], cwd=cwd, input=stdin, capture_output=True, check=False,
                            env={**os.environ, "GIT_TERMINAL_PROMPT": "0"})
    if result.returncode != 0:
        raise Unavailable(f"git {args[0]} failed: {result.stderr.decode(errors='replace').strip()[-300:]}")
    return result.stdout


def tree_repo(source: str, commit: str, mirrors: MirrorMap, online: bool) -> Path:
    """A bare clone holding `commit`, cloned once per source into the cache."""
    real = resolve(source, mirrors)
    if not is_local(real) and not online:
        raise Unavailable(f"no cached derivation of tree {commit[:12]} and {real} is not a local mirror; "
                          "map it in the inventory's mirrors.yml or run `rigfleet pins --verify` online")
    repo = cache_dir() / "git" / (hashlib.sha256(real.encode()).hexdigest()[:16] + ".git")
    if not repo.is_dir():
        repo.parent.mkdir(parents=True, exist_ok=True)
        _git("clone", "--bare", "--quiet", real.removeprefix("file://"), str(repo))
    try:
        _git("cat-file", "-e", f"{commit}^{{commit}}", cwd=repo)
    except Unavailable:
        _git("fetch", "--quiet", real.removeprefix("file://"), "+refs/*:refs/*", cwd=repo)
        _git("cat-file", "-e", f"{commit}^{{commit}}", cwd=repo)
    return repo


def _read_all(repo: Path, commit: str, paths: list[str]) -> dict[str, str]:
    """Many files in one `git cat-file --batch` call."""
    request = "".join(f"{commit}:{p}\n" for p in paths).encode()
    out = _git("cat-file", "--batch", cwd=repo, stdin=request)
    files: dict[str, str] = {}
    pos = 0
    for path in paths:
        end = out.index(b"\n", pos)
        header = out[pos:end].split()
        pos = end + 1
        if len(header) < 3 or header[1] == b"missing":
            continue
        size = int(header[2])
        files[path] = out[pos:pos + size].decode("utf-8", errors="replace")
        pos += size + 1
    return files


def tree_facts(source: str, commit: str, mirrors: MirrorMap, online: bool) -> tree_mod.TreeFacts:
    cache = cache_dir() / f"tree-{commit}.json"
    cached = _read_cache(cache, tree_mod.FORMAT)
    if cached is not None:
        return tree_mod.TreeFacts.from_json(cached)
    repo = tree_repo(source, commit, mirrors, online)
    paths = _git("ls-tree", "-r", "--name-only", commit, cwd=repo).decode().splitlines()
    texts = _read_all(repo, commit, [p for p in paths if p.endswith((".py", ".toml"))])
    facts = tree_mod.derive(commit, set(paths), lambda p: texts.get(p, ""))
    _write_cache(cache, facts.to_json())
    return facts
