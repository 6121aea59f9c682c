"""Build the SIMULATED engine artifacts the sandbox host serves to its rigs.

Everything built here is a stand-in, labelled as such in its files and logs:

* ``www/genesis.git/``: a bare, dumb-HTTP-servable git repository holding the stand-in Genesis
  v7.72.2 tree (assets/genesis) on branch ``dev``, committed with fixed dates so the SHA is the
  same on every machine; ``main`` holds an unrelated "v12" commit, as upstream's rewritten history
  does, so a checkout that forgets the pinned SHA gets the wrong tree.
* ``www/overlays/marlin-pad-sub-tile-n/``: stand-ins for the vllm#40361 overlay files.
* ``www/weights/qwen3.6-27b-autoround-int4/``: a tiny fake weights set (real config numbers, two
  small deterministic safetensors shards, ``SHA256SUMS``); ``metadata.total_size`` of the index
  carries the real model's 16.3 GiB so the stand-in engine's KV formula sees realistic weights.
* ``www/images/vllm-openai-<tag>.tar``: base-image archives in ``docker save`` format, built
  without Docker from the sandbox's debootstrap root tarball: layer 1 is the stripped Debian root
  plus pip/setuptools (PyPI wheels unpacked into /usr/local, Debian's EXTERNALLY-MANAGED marker
  removed, as in the real image), layer 2 the stand-in ``vllm`` package (assets/vllm) with its
  ``/usr/local/bin/vllm`` script.

`build_engine_artifacts` is idempotent: every product is compared with (or keyed by) its inputs
and skipped when unchanged; the root layer is cached per (root tarball sha256, wheels, builder
version) under ``cache_dir``.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import fcntl
import hashlib
import io
import json
import logging
import os
import platform
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from rigfleet_sandbox import layout

log = logging.getLogger(__name__)

ASSETS = Path(__file__).resolve().parent / "assets"
HOST_URL = layout.HOST_URL
BUILDER_VERSION = "1"  # bump when a layer or archive layout changes: invalidates caches
SOURCE_DATE_EPOCH = 1777939200  # 2026-05-05T00:00:00Z, the Genesis v7.72.2 release day
CREATED = "2026-05-05T00:00:00Z"

GENESIS_VERSION = "v7.72.2-sim"
GENESIS_KNOWN_GOOD = ("0.20.1rc1.dev16+g7a1eb8ac2", "0.20.2rc1.dev9+g01d4d1ad3")
_GIT_IDENT = {
    "GIT_AUTHOR_NAME": "Genesis stand-in (rigfleet sandbox, SIMULATED)",
    "GIT_AUTHOR_EMAIL": "genesis-sim@rigfleet.invalid",
    "GIT_COMMITTER_NAME": "Genesis stand-in (rigfleet sandbox, SIMULATED)",
    "GIT_COMMITTER_EMAIL": "genesis-sim@rigfleet.invalid",
}

IMAGE_REPOSITORY = "vllm/vllm-openai"
# PyPI wheels unpacked into the image's /usr/local so the image role can `pip install` offline.
PIP_REQUIREMENTS = ("pip==26.3", "setuptools==84.2.1")

OVERLAY_NAME = "marlin-pad-sub-tile-n"
OVERLAY_PR = 40361
OVERLAY_FILES = (
    ("marlin.py", "model_executor/kernels/linear/mixed_precision/marlin.py"),
    ("MPLinearKernel.py", "model_executor/kernels/linear/mixed_precision/MPLinearKernel.py"),
)

WEIGHTS_NAME = "qwen3.6-27b-autoround-int4"
WEIGHTS_TOTAL_SIZE = 17_502_027_366  # 16.3 GiB, what the real checkpoint weighs
SHARDS = (("model-00001-of-00002.safetensors", 384 * 1024), ("model-00002-of-00002.safetensors", 256 * 1024))


@dataclass(frozen=True)
class ImageSpec:
    pinset: str
    tag: str
    vllm_version: str
    description: str


IMAGES = (
    ImageSpec(
        "sandbox-a",
        "nightly-01d4d1ad375dc5854779c593eee093bcebb0cada",
        "0.20.2rc1.dev9+g01d4d1ad3",
        "SIMULATED sandbox pin set A: stand-in of the seed-era nightly-01d4d1ad3 (vLLM 0.20.2rc1.dev9) with "
        "the stand-in Genesis v7.72.2 and the Marlin pad overlay; allowlisted by Genesis.",
    ),
    ImageSpec(
        "sandbox-b",
        "nightly-sandbox-b",
        "0.20.1rc1.dev16+g7a1eb8ac2",
        "SIMULATED sandbox pin set B for re-pin rehearsals: a different image (vLLM 0.20.1rc1.dev16, the "
        "other pin Genesis v7.72.2 allowlists), same Genesis commit and overlay; a re-pin A<->B should pass "
        "the gate.",
    ),
    ImageSpec(
        "sandbox-c",
        "nightly-sandbox-c",
        "0.20.2rc2.dev672+g1acd67a79",
        "SIMULATED sandbox pin set C, deliberately bad: vLLM 0.20.2rc2.dev672 is NOT in the Genesis "
        "KNOWN_GOOD_VLLM_PINS, so the guard refuses it (and, without genesis.known_good_vllm, the image's "
        "strict pin gate stops every boot).",
    ),
)


# --- small helpers ------------------------------------------------------------------------------


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_if_changed(path: Path, data: bytes) -> bool:
    if path.is_file() and path.read_bytes() == data:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return True


def _asset_files(root: Path) -> Iterator[Path]:
    """Files under an assets dir, sorted, without caches that tests or editors may leave."""
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).parts
        if any(p == "__pycache__" or p.startswith(".") for p in rel) or path.suffix in (".pyc", ".pyo"):
            continue
        if path.is_file():
            yield path


def _tree_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in _asset_files(root):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _url(base_url: str, *parts: str) -> str:
    return base_url.rstrip("/") + "/" + "/".join(parts)


# --- the stand-in vllm package ------------------------------------------------------------------


def version_tuple(version: str) -> tuple[int | str, ...]:
    """setuptools-scm style: '0.20.2rc1.dev9+g01d4d1ad3' -> (0, 20, 2, 'rc1', 'dev9', 'g01d4d1ad3')."""
    public, _, local = version.partition("+")
    out: list[int | str] = []
    for part in re.split(r"[.]", public):
        match = re.fullmatch(r"(\d+)([a-z]+\d*)?", part)
        if match:
            out.append(int(match.group(1)))
            if match.group(2):
                out.append(match.group(2))
        else:
            out.append(part)
    if local:
        out.append(local)
    return tuple(out)


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def vllm_script(python: str = "/usr/bin/python3") -> str:
    return (
        f"#!{python}\n"
        "# vllm console script (SIMULATED stand-in engine, rigfleet sandbox)\n"
        "import sys\n\n"
        "from vllm.entrypoints.cli.main import main\n\n"
        "if __name__ == '__main__':\n"
        "    sys.exit(main())\n"
    )


def standin_vllm_files(version: str, *, genesis: bool = False, overlays: bool = False) -> dict[str, bytes]:
    """Relative path (under site-packages) -> content of the stand-in vllm distribution.

    `genesis` adds the Genesis package at vllm/_genesis (as the image role installs it), `overlays`
    puts the Marlin overlay files over their targets. Includes a vllm-<version>.dist-info so
    importlib.metadata and pip see the distribution.
    """
    files: dict[str, bytes] = {}
    src = ASSETS / "vllm" / "vllm"
    for path in _asset_files(src):
        files["vllm/" + path.relative_to(src).as_posix()] = path.read_bytes()
    files["vllm/version.py"] = (
        '"""vLLM version of this SIMULATED stand-in (written by rigfleet_sandbox.engine)."""\n\n'
        f"__version__ = {version!r}\n"
        f"__version_tuple__: tuple[int | str, ...] = {version_tuple(version)!r}\n"
    ).encode()
    if genesis:
        gsrc = ASSETS / "genesis" / "vllm" / "_genesis"
        for path in _asset_files(gsrc):
            files["vllm/_genesis/" + path.relative_to(gsrc).as_posix()] = path.read_bytes()
    if overlays:
        for name, target in OVERLAY_FILES:
            files["vllm/" + target] = (ASSETS / "overlays" / OVERLAY_NAME / name).read_bytes()
    info = f"vllm-{version}.dist-info"
    meta = {
        f"{info}/METADATA": (
            f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
            "Summary: SIMULATED stand-in for vLLM (rigfleet sandbox); no model runs, no GPU is used\n"
            "Requires-Python: >=3.10\n"
        ).encode(),
        f"{info}/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: rigfleet-sandbox\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
        f"{info}/INSTALLER": b"rigfleet-sandbox\n",
        f"{info}/top_level.txt": b"vllm\n",
        f"{info}/entry_points.txt": b"[console_scripts]\nvllm = vllm.entrypoints.cli.main:main\n",
    }
    files.update(meta)
    record = [_record_line(name, data) for name, data in sorted(files.items())] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    return files


def install_standin_vllm(
    site_dir: Path,
    version: str,
    *,
    genesis: bool = False,
    overlays: bool = False,
    bin_dir: Path | None = None,
    python: str | None = None,
) -> Path:
    """Install the stand-in vllm into `site_dir` (a PYTHONPATH entry); returns the package dir.

    With `bin_dir`, also writes a `vllm` console script there for `python` (default: this one).
    """
    site_dir = Path(site_dir)
    for rel, data in standin_vllm_files(version, genesis=genesis, overlays=overlays).items():
        target = site_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    if bin_dir is not None:
        script = Path(bin_dir) / "vllm"
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(vllm_script(python or sys.executable))
        script.chmod(0o755)
    return site_dir / "vllm"


# --- Genesis git repository ---------------------------------------------------------------------


def _git(args: list[str], cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True)
    return done.stdout.strip()


def _git_env(home: Path, date: str) -> dict[str, str]:
    # No user or system config may leak in (signing, hooks, templates): the SHA must not depend on it.
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LC_ALL": "C",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_AUTHOR_DATE": date,
        "GIT_COMMITTER_DATE": date,
        **_GIT_IDENT,
    }


def _commit_tree(work: Path, files: dict[str, bytes], branch: str, message: str, date: str) -> str:
    env = _git_env(work, date)
    repo = work / branch
    repo.mkdir(parents=True)
    _git(["init", "-q", "--template=", f"--initial-branch={branch}"], repo, env)
    for rel, data in files.items():
        path = repo / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(0o644)
    _git(["-c", "core.autocrlf=false", "-c", "core.fileMode=true", "add", "-A"], repo, env)
    _git(["-c", "commit.gpgsign=false", "commit", "-q", "--no-verify", "-m", message], repo, env)
    return _git(["rev-parse", "HEAD"], repo, env)


def genesis_files() -> dict[str, bytes]:
    src = ASSETS / "genesis"
    return {path.relative_to(src).as_posix(): path.read_bytes() for path in _asset_files(src)}


def build_genesis_repo(dest: Path) -> str:
    """Write the bare repo `dest` (dumb-HTTP servable); returns the 40-hex SHA of the v7.72.2-sim commit."""
    if shutil.which("git") is None:
        raise RuntimeError("git is needed to build the SIMULATED Genesis repository (apt-get install git)")
    dest = Path(dest)
    with tempfile.TemporaryDirectory(prefix="genesis-sim-") as tmp:
        work = Path(tmp)
        dev = _commit_tree(
            work,
            genesis_files(),
            "dev",
            f"release({GENESIS_VERSION}): SIMULATED stand-in of Genesis v7.72.2 for the rigfleet sandbox\n\n"
            "Contains no Genesis code. KNOWN_GOOD_VLLM_PINS: " + ", ".join(GENESIS_KNOWN_GOOD) + "\n",
            "2026-05-05T12:00:00+00:00",
        )
        main_files = {
            "README.md": b"# sndr core engine v12 (SIMULATED stand-in)\n\nThe history was rewritten; the v7 "
            b"tree (vllm/_genesis) is only reachable from the dev branch. Pin Genesis by full SHA.\n",
            "sndr/__init__.py": b'"""v12 stand-in (SIMULATED): not the v7 layout."""\n',
        }
        main = _commit_tree(
            work, main_files, "main", "v12 public release (tidied) (SIMULATED)", "2026-06-27T12:00:00+00:00"
        )
        env = _git_env(work, "2026-06-27T12:00:00+00:00")
        if dest.is_dir():
            try:
                current = (
                    _git(["--git-dir", str(dest), "rev-parse", "refs/heads/dev"], work, env),
                    _git(["--git-dir", str(dest), "rev-parse", "refs/heads/main"], work, env),
                )
            except subprocess.CalledProcessError:
                current = ("", "")
            if current == (dev, main) and (dest / "info" / "refs").is_file():
                log.info("engine artifacts (SIMULATED): genesis.git up to date at %s", dev)
                return dev
        stage = work / "bare.git"
        _git(["init", "-q", "--bare", "--template=", "--initial-branch=main", str(stage)], work, env)
        for branch in ("dev", "main"):
            _git(
                ["--git-dir", str(stage), "fetch", "-q", str(work / branch), f"{branch}:{branch}"], work, env
            )
        (stage / "description").write_text("Genesis v7.72.2 (SIMULATED stand-in, rigfleet sandbox)\n")
        _git(["--git-dir", str(stage), "repack", "-a", "-d", "-q"], work, env)
        _git(["--git-dir", str(stage), "update-server-info"], work, env)
        if dest.exists():
            shutil.rmtree(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(stage, dest)
    log.info("engine artifacts (SIMULATED): genesis.git built, dev=%s", dev)
    return dev


# --- overlays and weights -----------------------------------------------------------------------


def build_overlays(www: Path, base_url: str = HOST_URL) -> list[dict[str, Any]]:
    files = []
    for name, target in OVERLAY_FILES:
        data = (ASSETS / "overlays" / OVERLAY_NAME / name).read_bytes()
        _write_if_changed(Path(www) / "overlays" / OVERLAY_NAME / name, data)
        files.append(
            {
                "source": _url(base_url, "overlays", OVERLAY_NAME, name),
                "sha256": hashlib.sha256(data).hexdigest(),
                "target": target,
            }
        )
    return [{"name": OVERLAY_NAME, "pr": OVERLAY_PR, "files": files}]


def _deterministic_bytes(seed: str, size: int) -> bytes:
    out = bytearray()
    counter = 0
    while len(out) < size:
        out += hashlib.sha256(f"{seed}:{counter}".encode()).digest()
        counter += 1
    return bytes(out[:size])


def _safetensors(tensor: str, data: bytes) -> bytes:
    header = {
        "__metadata__": {"format": "pt", "rigfleet": "SIMULATED stand-in weights, not a model"},
        tensor: {"dtype": "U8", "shape": [len(data)], "data_offsets": [0, len(data)]},
    }
    raw = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # safetensors pads the header to 8 bytes
    return struct.pack("<Q", len(raw)) + raw + data


def weights_files() -> dict[str, bytes]:
    """The fake weights set: the JSON files from assets/weights plus generated shards, index, SHA256SUMS."""
    src = ASSETS / "weights" / WEIGHTS_NAME
    files: dict[str, bytes] = {path.name: path.read_bytes() for path in _asset_files(src)}
    weight_map = {}
    for i, (name, size) in enumerate(SHARDS):
        tensor = f"model.layers.{i}.simulated.weight"
        files[name] = _safetensors(tensor, _deterministic_bytes(f"{WEIGHTS_NAME}/{name}", size))
        weight_map[tensor] = name
    index = {
        "metadata": {
            "total_size": WEIGHTS_TOTAL_SIZE,
            "_rigfleet": "SIMULATED: total_size is the real checkpoint's, the shards are tiny",
        },
        "weight_map": weight_map,
    }
    files["model.safetensors.index.json"] = (json.dumps(index, indent=2) + "\n").encode()
    sums = "".join(f"{hashlib.sha256(data).hexdigest()}  {name}\n" for name, data in sorted(files.items()))
    files["SHA256SUMS"] = sums.encode()
    return files


# A SIMULATED chat template for the catalog's `froggeric` name, served beside the weights as a
# fleet mirror would (the mirror layout rigfleet's model_weights role reads: chat-templates/).
CHAT_TEMPLATE = b"""{#- SIMULATED chat template served by the rigfleet sandbox (stand-in for froggeric's) -#}
{%- for message in messages %}<|im_start|>{{ message['role'] }}
{{ message['content'] }}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def build_weights(www: Path) -> dict[str, str]:
    """Write the fake weights set and the chat template; returns file -> sha256 of the weights."""
    files = weights_files()
    target = Path(www) / "weights" / WEIGHTS_NAME
    for name, data in files.items():
        _write_if_changed(target / name, data)
    templates = Path(www) / "weights" / "chat-templates"
    _write_if_changed(templates / "froggeric.jinja", CHAT_TEMPLATE)
    digest = hashlib.sha256(CHAT_TEMPLATE).hexdigest()
    _write_if_changed(templates / "SHA256SUMS", f"{digest}  froggeric.jinja\n".encode())
    return {name: hashlib.sha256(data).hexdigest() for name, data in files.items() if name != "SHA256SUMS"}


# --- image archives -----------------------------------------------------------------------------

_DROP_PREFIXES = (
    "usr/share/man/",
    "usr/share/info/",
    "usr/share/locale/",
    "usr/share/lintian/",
    "usr/share/linda/",
    "var/cache/apt/",
    "var/lib/apt/lists/",
    "var/log/",
    "var/cache/debconf/",
    "tmp/",
    "var/tmp/",
    "run/",
    "proc/",
    "sys/",
    "dev/",
    "root/.cache/",
)
_KEEP_DIRS = {"tmp", "var/tmp", "run", "proc", "sys", "dev", "var/log", "var/lib/apt/lists", "var/cache/apt"}


def _keep_member(name: str, member: tarfile.TarInfo) -> bool:
    """Filter for the root layer: no docs/man/locales/apt lists, device nodes or host keys."""
    if not name or member.ischr() or member.isblk() or member.isfifo():
        return False
    if name in _KEEP_DIRS:
        return member.isdir()
    if name.startswith("usr/share/doc/"):
        return member.isdir() or name.endswith("/copyright")
    if name.startswith(_DROP_PREFIXES):
        return False
    if name == "etc/machine-id" or name.startswith("etc/ssh/ssh_host_"):
        return False  # per-machine identity must not be baked into a shared image
    if re.fullmatch(r"usr/lib/python3\.\d+/EXTERNALLY-MANAGED", name):
        return False  # the real vllm image lets pip install system-wide; so does this one
    return not name.endswith(".dpkg-old")


@contextlib.contextmanager
def _open_root_tar(path: Path) -> Iterator[tarfile.TarFile]:
    """The root tarball as a one-pass stream (fast on .tar.gz; zstd through the zstd tool)."""
    with open(path, "rb") as handle:
        magic = handle.read(4)
    if magic != b"\x28\xb5\x2f\xfd":
        with tarfile.open(path, mode="r|*") as tar:
            yield tar
        return
    if shutil.which("zstd") is None:  # tarfile reads zstd only from Python 3.14 on
        raise RuntimeError(f"{path} is zstd-compressed and zstd is not installed")
    with subprocess.Popen(["zstd", "-dc", str(path)], stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            yield tar


def root_python_version(members: Iterable[tarfile.TarInfo]) -> str:
    versions = sorted(
        {m.group(1) for m in (re.fullmatch(r"(?:\./)?usr/bin/python(3\.\d+)", t.name) for t in members) if m},
        key=lambda v: int(v.split(".")[1]),
    )
    if not versions:
        raise RuntimeError("the root tarball has no usr/bin/python3.N: debootstrap it with --include=python3")
    return versions[-1]


def _tarinfo(
    name: str, *, size: int = 0, mode: int = 0o644, kind: bytes = tarfile.REGTYPE
) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.type = size, mode, kind
    info.mtime, info.uid, info.gid, info.uname, info.gname = SOURCE_DATE_EPOCH, 0, 0, "root", "root"
    return info


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    tar.addfile(_tarinfo(name, size=len(data), mode=mode), io.BytesIO(data))


def _add_dirs(tar: tarfile.TarFile, names: Iterable[str], seen: set[str]) -> None:
    """Directory entries for every parent of `names` not in the layer yet (sorted, for determinism)."""
    wanted: set[str] = set()
    for name in names:
        wanted.update(str(p) for p in PurePosixPath(name).parents if str(p) != ".")
    for name in sorted(wanted - seen):
        tar.addfile(_tarinfo(name, mode=0o755, kind=tarfile.DIRTYPE))
        seen.add(name)


def _pip_script(module: str, func: str) -> bytes:
    return (
        "#!/usr/bin/python3\n# -*- coding: utf-8 -*-\nimport re\nimport sys\n"
        f"from {module} import {func}\n"
        "if __name__ == '__main__':\n"
        "    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n"
        f"    sys.exit({func}())\n"
    ).encode()


def _add_wheels(tar: tarfile.TarFile, wheels: Iterable[Path], pyver: str, seen: set[str]) -> None:
    site = f"usr/local/lib/python{pyver}/dist-packages"
    for wheel in sorted(wheels, key=lambda p: p.name):
        with zipfile.ZipFile(wheel) as whl:
            names = sorted(n for n in whl.namelist() if not n.endswith("/"))
            _add_dirs(tar, [f"{site}/{n}" for n in names], seen)
            scripts: dict[str, str] = {}
            for name in names:
                data = whl.read(name)
                if name.endswith(".dist-info/INSTALLER"):
                    continue
                _add_bytes(tar, f"{site}/{name}", data)
                if name.endswith(".dist-info/entry_points.txt"):
                    section = ""
                    for line in data.decode().splitlines():
                        line = line.strip()
                        if line.startswith("["):
                            section = line.strip("[]")
                        elif section == "console_scripts" and "=" in line:
                            script, target = (s.strip() for s in line.split("=", 1))
                            scripts[script] = target
            info_dirs = sorted({n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")})
            for info in info_dirs:
                _add_bytes(tar, f"{site}/{info}/INSTALLER", b"rigfleet-sandbox\n")
            for script, target in sorted(scripts.items()):
                # pip's wheel names pip3.X after the build Python: name it after the image's instead.
                script = re.sub(r"^pip3\.\d+$", f"pip{pyver}", script)
                module, func = target.split(":", 1)
                _add_dirs(tar, [f"usr/local/bin/{script}"], seen)
                _add_bytes(tar, f"usr/local/bin/{script}", _pip_script(module, func.split()[0]), 0o755)


def _write_root_layer(root_tarball: Path, wheels: list[Path], out: Path) -> str:
    """Stripped root + pip wheels as one layer tar; returns the Python version (e.g. '3.13')."""
    kept: set[str] = set()
    pythons: list[tarfile.TarInfo] = []
    with _open_root_tar(root_tarball) as src, tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as dst:
        for orig in src:
            name = orig.name.removeprefix("./").rstrip("/")
            if not _keep_member(name, orig):
                continue
            member = copy.copy(orig)
            member.name = name
            # a path from the source's pax header would win over the new name
            member.pax_headers = {k: v for k, v in orig.pax_headers.items() if k not in ("path", "linkpath")}
            if orig.islnk():
                member.linkname = orig.linkname.removeprefix("./")
                if member.linkname not in kept:
                    continue  # its target was stripped
            if orig.isreg():
                dst.addfile(member, src.extractfile(orig))
            else:
                dst.addfile(member)
            kept.add(name)
            if re.fullmatch(r"usr/bin/python3\.\d+", name):
                pythons.append(member)
        pyver = root_python_version(pythons)
        if "etc" in kept:
            _add_bytes(dst, "etc/machine-id", b"")  # empty, as Docker images ship it
        _add_wheels(dst, wheels, pyver, kept)
    return pyver


def _write_vllm_layer(pyver: str, version: str, out: Path, extra: dict[str, bytes] | None = None,
                      system: dict[str, tuple[bytes, int]] | None = None) -> None:
    site = f"usr/local/lib/python{pyver}/dist-packages"
    files = {f"{site}/{rel}": (data, 0o644)
             for rel, data in {**standin_vllm_files(version), **(extra or {})}.items()}
    files.update(system or {})
    seen: set[str] = set()
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        _add_dirs(tar, [*files, "usr/local/bin/vllm", "vllm-workspace/.keep"], seen)
        for name in sorted(files):
            _add_bytes(tar, name, *files[name])
        _add_bytes(tar, "usr/local/bin/vllm", vllm_script().encode(), 0o755)


def _image_config(spec: ImageSpec, diff_ids: list[str], root_sha: str, pyver: str) -> bytes:
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    labels = {
        "org.opencontainers.image.title": "vllm-openai (SIMULATED stand-in)",
        "org.opencontainers.image.description": (
            "SIMULATED stand-in for vllm/vllm-openai built by the rigfleet sandbox from a Debian root; "
            "no model runs, no GPU is used"
        ),
        "org.opencontainers.image.version": spec.vllm_version,
        "io.rigfleet.simulated": "true",
        "io.rigfleet.sim.pinset": spec.pinset,
        "io.rigfleet.sim.root-tarball-sha256": root_sha,
    }
    config = {
        "architecture": arch,
        "os": "linux",
        "created": CREATED,
        "author": "rigfleet sandbox (SIMULATED)",
        "config": {
            "Env": [
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "LANG=C.UTF-8",
                "VLLM_USAGE_SOURCE=production-docker-image",
                "RIGFLEET_SIMULATED=1",
            ],
            "Entrypoint": ["vllm", "serve"],
            "WorkingDir": "/vllm-workspace",
            "ExposedPorts": {"8000/tcp": {}},
            "Labels": labels,
        },
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [
            {
                "created": CREATED,
                "created_by": f"rigfleet sandbox: Debian root (python{pyver}) + pip, stripped",
                "comment": "SIMULATED base layer",
            },
            {
                "created": CREATED,
                "created_by": f"rigfleet sandbox: stand-in vllm {spec.vllm_version}",
                "comment": "SIMULATED vllm layer",
            },
        ],
    }
    return json.dumps(config, sort_keys=True, separators=(",", ":")).encode()


def _add_file(tar: tarfile.TarFile, name: str, path: Path) -> None:
    with open(path, "rb") as handle:
        tar.addfile(_tarinfo(name, size=path.stat().st_size), handle)


def write_docker_archive(out: Path, repo_tag: str, config: bytes, layers: list[tuple[Path, str]]) -> str:
    """`docker save` (docker-archive) layout; returns the image id (sha256 of the config)."""
    image_id = hashlib.sha256(config).hexdigest()
    dirs = [diff.removeprefix("sha256:") for _, diff in layers]
    repository, tag = repo_tag.rsplit(":", 1)
    manifest = [
        {"Config": f"{image_id}.json", "RepoTags": [repo_tag], "Layers": [f"{d}/layer.tar" for d in dirs]}
    ]
    tmp = out.with_name(f".{out.name}.tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for d, (path, _) in zip(dirs, layers, strict=True):
            tar.addfile(_tarinfo(d, mode=0o755, kind=tarfile.DIRTYPE))
            _add_bytes(tar, f"{d}/VERSION", b"1.0")
            _add_file(tar, f"{d}/layer.tar", path)
        _add_bytes(tar, f"{image_id}.json", config)
        _add_bytes(tar, "manifest.json", json.dumps(manifest, separators=(",", ":")).encode())
        _add_bytes(
            tar, "repositories", json.dumps({repository: {tag: dirs[-1]}}, separators=(",", ":")).encode()
        )
    os.replace(tmp, out)
    return image_id


def fetch_pip_wheels(cache_dir: Path) -> list[Path]:
    """pip + setuptools wheels for the image, through this machine's pip configuration (cached).

    Without an index the images are built without pip (a warning): everything else in the sandbox
    still works, and the image role's `pip install` of the Genesis plugin fails with a clear
    "No module named pip" instead of the whole `sandbox up` failing here.
    """
    wheel_dir = Path(cache_dir) / "wheels"
    wanted = [r.split("==")[0] for r in PIP_REQUIREMENTS]

    def cached() -> list[Path]:
        found = [next(iter(sorted(wheel_dir.glob(f"{name}-*.whl"))), None) for name in wanted]
        return [p for p in found if p is not None] if all(found) else []

    if cached():
        return cached()
    wheel_dir.mkdir(parents=True, exist_ok=True)
    base = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--no-deps",
        "--only-binary=:all:",
        "-d",
        str(wheel_dir),
    ]
    for requirements in (list(PIP_REQUIREMENTS), wanted):  # pinned first, then whatever the index has
        done = subprocess.run([*base, *requirements], capture_output=True, text=True)
        if done.returncode == 0 and cached():
            return cached()
    log.warning(
        "engine artifacts (SIMULATED): cannot download pip/setuptools wheels (%s); building the images "
        "WITHOUT pip",
        (done.stderr or done.stdout).strip()[-300:],
    )
    return []


def _layer_digest(path: Path) -> str:
    return "sha256:" + _sha256_file(path)


def build_root_layer(
    root_tarball: Path, cache_dir: Path, wheels: list[Path], root_sha: str | None = None
) -> tuple[Path, str, str]:
    """(layer tar, diff_id, python version) of the stripped root, cached by its inputs."""
    root_sha = root_sha or _sha256_file(root_tarball)
    key_src = [BUILDER_VERSION, root_sha, *sorted(f"{w.name}:{_sha256_file(w)}" for w in wheels)]
    key = hashlib.sha256("\n".join(key_src).encode()).hexdigest()[:20]
    stem = re.sub(r"[^A-Za-z0-9.-]", "_", root_tarball.name.split(".tar")[0])
    layer = Path(cache_dir) / f"root-layer-{stem}-{key}.tar"
    meta = layer.with_suffix(".json")
    if layer.is_file() and meta.is_file():
        info = json.loads(meta.read_text())
        return layer, info["diff_id"], info["python"]
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    for stale in Path(cache_dir).glob(f"root-layer-{stem}-*"):  # older builds of this root only
        stale.unlink()
    tmp = layer.with_name(f".{layer.name}.tmp")
    pyver = _write_root_layer(root_tarball, wheels, tmp)
    os.replace(tmp, layer)
    diff_id = _layer_digest(layer)
    meta.write_text(json.dumps({"diff_id": diff_id, "python": pyver, "root_sha256": root_sha}))
    return layer, diff_id, pyver


def build_image_archive(
    out: Path,
    root_tarball: Path,
    spec: ImageSpec,
    *,
    cache_dir: Path,
    wheels: list[Path],
    root_sha: str | None = None,
    vllm_extra: dict[str, bytes] | None = None,
    system_extra: dict[str, tuple[bytes, int]] | None = None,
) -> dict[str, Any]:
    """Build (or keep) one image archive; returns {'digest', 'diff_ids', 'python', 'archive'}.

    `vllm_extra`: more files for the vllm layer, by path under site-packages (rigfleet_sandbox.stacks
    adds the real release's CLI surface); `system_extra`: (content, mode) by path under the image's
    root (stacks adds Debian programs the real image ships)."""
    out = Path(out)
    root_layer, root_diff, pyver = build_root_layer(root_tarball, cache_dir, wheels, root_sha)
    with tempfile.TemporaryDirectory(prefix="vllm-layer-", dir=cache_dir) as tmp:
        vllm_layer = Path(tmp) / "layer.tar"
        _write_vllm_layer(pyver, spec.vllm_version, vllm_layer, vllm_extra, system_extra)
        vllm_diff = _layer_digest(vllm_layer)
        diff_ids = [root_diff, vllm_diff]
        config = _image_config(spec, diff_ids, root_sha or _sha256_file(root_tarball), pyver)
        image_id = hashlib.sha256(config).hexdigest()
        state = out.with_name(out.name + ".build.json")
        expected = {
            "digest": f"sha256:{image_id}",
            "diff_ids": diff_ids,
            "python": pyver,
            "builder": BUILDER_VERSION,
            "simulated": True,
        }
        if out.is_file() and state.is_file() and json.loads(state.read_text()) == expected:
            log.info("engine artifacts (SIMULATED): %s up to date", out.name)
            return {**expected, "archive": out}
        out.parent.mkdir(parents=True, exist_ok=True)
        write_docker_archive(
            out, f"{IMAGE_REPOSITORY}:{spec.tag}", config, [(root_layer, root_diff), (vllm_layer, vllm_diff)]
        )
    state.write_text(json.dumps(expected, indent=2) + "\n")
    log.info("engine artifacts (SIMULATED): built %s (image id sha256:%s)", out.name, image_id[:12])
    return {**expected, "archive": out}


def archive_name(spec: ImageSpec) -> str:
    return f"vllm-openai-{spec.tag}.tar"


# --- the hook the sandbox calls -----------------------------------------------------------------


def build_engine_artifacts(
    www: Path,
    distro_root_tarball: Path,
    *,
    cache_dir: Path | None = None,
    wheels: list[Path] | None = None,
    base_url: str = HOST_URL,
    images: Iterable[ImageSpec] = IMAGES,
) -> dict[str, Any]:
    """Fill `www` with the SIMULATED engine artifacts; returns pin sets and group vars for the inventory.

    `cache_dir` (default: next to the root tarball) keeps the root layer and the pip wheels;
    `wheels` overrides the wheels put into the image (tests pass a tiny fake one).
    """
    www = Path(www)
    distro_root_tarball = Path(distro_root_tarball)
    cache_dir = Path(cache_dir) if cache_dir else distro_root_tarball.parent / "engine-cache"
    cache_dir.mkdir(parents=True, exist_ok=True)
    www.mkdir(parents=True, exist_ok=True)
    # One builder at a time per www and per cache: sandbox instances side by side share the cache.
    with open(www / ".engine.lock", "w") as lock, open(cache_dir / ".engine.lock", "w") as cache_lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        fcntl.flock(cache_lock, fcntl.LOCK_EX)
        return _build_locked(www, distro_root_tarball, cache_dir, wheels, base_url, images)


def _build_locked(
    www: Path,
    distro_root_tarball: Path,
    cache_dir: Path,
    wheels: list[Path] | None,
    base_url: str,
    images: Iterable[ImageSpec],
) -> dict[str, Any]:
    commit = build_genesis_repo(www / "genesis.git")
    overlays = build_overlays(www, base_url)
    build_weights(www)
    wheel_paths = list(wheels) if wheels is not None else fetch_pip_wheels(cache_dir)
    root_sha = _sha256_file(distro_root_tarball)
    pinsets: dict[str, Any] = {}
    for spec in images:
        built = build_image_archive(
            www / "images" / archive_name(spec),
            distro_root_tarball,
            spec,
            cache_dir=cache_dir,
            wheels=wheel_paths,
            root_sha=root_sha,
        )
        pinsets[spec.pinset] = {
            "description": spec.description,
            "base_image": {
                "repository": IMAGE_REPOSITORY,
                "tag": spec.tag,
                "digest": built["digest"],
                "archive": _url(base_url, "images", archive_name(spec)),
            },
            "vllm_version": spec.vllm_version,
            "cuda": "13.0",
            "genesis": {
                "source": _url(base_url, "genesis.git"),
                "commit": commit,
                "version": GENESIS_VERSION,
                "known_good_vllm": list(GENESIS_KNOWN_GOOD),
            },
            "overlays": copy.deepcopy(overlays),
            # The stand-in Genesis imports nothing outside the stdlib and the sandbox has no wheel
            # index: keep it empty so image builds need no network.
            "python_deps": {},
            "driver": {"branch": 580},
        }
    return {
        "pinsets": pinsets,
        "group_vars": {"weights_source": {"url": _url(base_url, "weights") + "/"}},
    }


def _main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Build the SIMULATED engine artifacts into WWW.")
    parser.add_argument("www", type=Path)
    parser.add_argument("root_tarball", type=Path)
    parser.add_argument("--cache-dir", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    result = build_engine_artifacts(args.www, args.root_tarball, cache_dir=args.cache_dir)
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


# Kept importable without side effects; `python -m rigfleet_sandbox.engine WWW ROOT.tar` builds.
if __name__ == "__main__":
    sys.exit(_main())

__all__ = [
    "IMAGES",
    "ImageSpec",
    "build_engine_artifacts",
    "build_genesis_repo",
    "build_image_archive",
    "build_overlays",
    "build_weights",
    "install_standin_vllm",
    "standin_vllm_files",
    "write_docker_archive",
]
