"""The sandbox's stand-in upstream container registry (its Docker Hub / nvcr.io), with SIMULATED images.

A second docker-registry (rigfleet_sandbox.registry, `--upstream-log`) on
SERVICE_ADDR:UPSTREAM_REGISTRY_PORT, storage under the state dir, serving TLS with a sandbox CA
that `sandbox up` makes (ensure_tls). Each rig's Docker trusts that CA for this registry only,
through /etc/docker/certs.d/<addr>:<port>/ca.crt in its root (trust; Docker's per-registry CA
location), so it is pulled as a normal secure registry: no insecure-registries entry, a key of
daemon.json that rigfleet owns. Every response it sends is counted in the upstream log
(rigfleet_sandbox.upstreamlog) as kind "image".

seed_image() pushes a SIMULATED stand-in of an image (by default the GPU smoke image) over the
Registry HTTP API v2 and returns its ref, "<addr>:<port>/<repository>:<tag>". Its one layer is a
Debian root's programs and libraries, the paths rigfleet's local smoke image takes, so that the
simulated nvidia-smi (a python3 script) the simulated container hook copies in runs there.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import shutil
import ssl
import tarfile
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, cast
from urllib.parse import urlsplit

from rigfleet.operations.docker import LOCAL_IMAGE_EXCLUDED, LOCAL_IMAGE_PATHS
from rigfleet.schema import Rig
from rigfleet_sandbox import rootfs, upstreamlog
from rigfleet_sandbox.layout import CACHE_DIR, DISTROS, SERVICE_ADDR, UPSTREAM_REGISTRY_DIR, UPSTREAM_REGISTRY_PORT
from rigfleet_sandbox.shell import Log, SandboxError, run

HOST = f"{SERVICE_ADDR}:{UPSTREAM_REGISTRY_PORT}"
TLS_DIR = UPSTREAM_REGISTRY_DIR / "tls"
CA_CERT = TLS_DIR / "ca.crt"
CA_KEY = TLS_DIR / "ca.key"
SERVER_CERT = TLS_DIR / "server.crt"
SERVER_KEY = TLS_DIR / "server.key"
DOCKER_CA = Path("etc/docker/certs.d") / HOST / "ca.crt"  # in a rig's root

MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_TYPE = "application/vnd.docker.container.image.v1+json"
LAYER_TYPE = "application/vnd.docker.image.rootfs.diff.tar.gzip"
SIMULATED_LABEL = "org.rigfleet.sandbox.simulated"
# Bump when build_layer's output changes, so that cached layers are rebuilt, not reused.
LAYER_VERSION = 1
LAYER_CACHE_DIR = CACHE_DIR / "upstream-image"
_CHUNK = 1 << 20
_EC_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


# -- the registry: TLS, trust, process --------------------------------------------------------


def ensure_tls(log: Log) -> None:
    """The sandbox CA and the registry's server certificate for SERVICE_ADDR (an IP SAN): made
    once per `up` (the state dir goes with `down`), with the openssl CLI."""
    if SERVER_CERT.is_file() and SERVER_KEY.is_file():
        return
    TLS_DIR.mkdir(parents=True, exist_ok=True)
    run(["openssl", "req", "-x509", *_EC_KEY, "-days", "3650", "-keyout", str(CA_KEY), "-out", str(CA_CERT),
         "-subj", f"/CN=rigfleet sandbox CA {SERVICE_ADDR} (SIMULATED upstream registry)",
         "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"])
    # `req -CA` signs with the CA at once (OpenSSL 3): no CSR file, no serial file
    run(["openssl", "req", "-x509", *_EC_KEY, "-days", "825", "-keyout", str(SERVER_KEY), "-out", str(SERVER_CERT),
         "-CA", str(CA_CERT), "-CAkey", str(CA_KEY), "-subj", f"/CN={SERVICE_ADDR}",
         "-addext", f"subjectAltName=IP:{SERVICE_ADDR}", "-addext", "basicConstraints=critical,CA:FALSE",
         "-addext", "extendedKeyUsage=serverAuth"])
    log(f"made the sandbox CA {CA_CERT} and the upstream registry's certificate for {SERVICE_ADDR}")


def trust(root: Path) -> None:
    """Make a rig's Docker trust the stand-in upstream registry (and nothing else of the CA's)."""
    dest = root / DOCKER_CA
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(CA_CERT, dest)


def registry_args(storage: Path = UPSTREAM_REGISTRY_DIR / "data") -> list[str]:
    """`python -m rigfleet_sandbox.registry` arguments that run the stand-in upstream registry."""
    return ["--addr", SERVICE_ADDR, "--port", str(UPSTREAM_REGISTRY_PORT), "--storage", str(storage),
            "--tls-cert", str(SERVER_CERT), "--tls-key", str(SERVER_KEY), "--upstream-log", str(upstreamlog.LOG)]


# -- the SIMULATED image -------------------------------------------------------------------------


@dataclass(frozen=True)
class Layer:
    path: Path  # the gzipped tar
    digest: str  # sha256 of the gzipped tar: the blob's name
    size: int  # of the gzipped tar
    diff_id: str  # sha256 of the tar itself: what the image config lists


class _Hashing:
    """A write-only file that hashes and counts what it passes on to `sink`."""

    def __init__(self, sink: Callable[[bytes], object]) -> None:
        self.sink, self.sha, self.size = sink, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        self.sink(data)
        return len(data)

    @property
    def digest(self) -> str:
        return f"sha256:{self.sha.hexdigest()}"


def _under(name: str, trees: tuple[str, ...]) -> bool:
    return any(name == tree or name.startswith(tree + "/") for tree in trees)


def in_image(name: str) -> bool:
    """Whether a root's path (no leading / or ./) goes into the image, as in rigfleet's local one."""
    return _under(name, LOCAL_IMAGE_PATHS) and not _under(name, LOCAL_IMAGE_EXCLUDED)


def build_layer(source: Path, dest: Path, level: int = 3) -> Layer:
    """Write the layer (gzip `level`) of `source`'s members in_image to `dest`; the source is a
    root's tarball (rootfs.ensure_tarball), read as a stream, so nothing is unpacked."""
    kept: set[str] = set()
    with open(dest, "wb") as raw:
        blob = _Hashing(raw.write)
        # zlib with gzip framing and no name or mtime in the header: the same bytes every time
        gz = zlib.compressobj(level, zlib.DEFLATED, 31)
        diff = _Hashing(lambda data: blob.write(gz.compress(data)))
        # a stream ("w|") only writes to its file (typeshed's protocol asks for read, seek, tell too)
        stream = cast("IO[bytes]", diff)
        with tarfile.open(source, "r|gz") as src, tarfile.open(fileobj=stream, mode="w|",
                                                               format=tarfile.PAX_FORMAT) as out:
            for member in src:
                member.name = member.name.removeprefix("./").rstrip("/")
                if member.islnk():
                    member.linkname = member.linkname.removeprefix("./")
                    if member.linkname not in kept:
                        continue  # a hard link to a file left out
                if not in_image(member.name):
                    continue
                out.addfile(member, src.extractfile(member) if member.isreg() else None)
                kept.add(member.name)
        blob.write(gz.flush())
    return Layer(dest, blob.digest, blob.size, diff.digest)


def cached_layer(log: Log) -> Layer:
    """The layer built from a cached rig root (any distro's; built when none is), kept in CACHE_DIR."""
    distro = next((d for d in DISTROS if rootfs.tarball_path(d).exists()), DISTROS[0])
    source = rootfs.ensure_tarball(distro, log)
    # the source's mtime: a rebuilt root tarball makes a new layer
    key = f"{source.name.removesuffix('.tar.gz')}-{source.stat().st_mtime_ns}-v{LAYER_VERSION}"
    meta = LAYER_CACHE_DIR / f"{key}.json"
    with rootfs.locked(LAYER_CACHE_DIR / ".build.lock"):
        if meta.is_file():
            data = json.loads(meta.read_text())
            layer = Layer(**{**data, "path": Path(data["path"])})
            if layer.path.is_file() and layer.path.stat().st_size == layer.size:
                return layer
        for old in LAYER_CACHE_DIR.glob("rootfs-*"):
            old.unlink()  # one layer kept (each is tens of MB), and its description
        log(f"building the SIMULATED upstream image layer from {source.name} (cached in {LAYER_CACHE_DIR})")
        layer = build_layer(source, LAYER_CACHE_DIR / f"{key}.tar.gz")
        meta.write_text(json.dumps({**asdict(layer), "path": str(layer.path)}))
        return layer


def image_config(layer: Layer, image: str) -> bytes:
    """The image config of the SIMULATED stand-in of `image` (repository:tag upstream)."""
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "2025-01-01T00:00:00Z",  # fixed: the same config, so the same digest, every push
        "config": {
            # as nvidia/cuda sets them: the container hook gives it all GPUs, nvidia-smi included
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    "NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"],
            "Cmd": ["/bin/bash"],
            "Labels": {SIMULATED_LABEL: f"SIMULATED stand-in of {image}: a Debian root's programs and "
                                        "libraries, no CUDA (rigfleet sandbox)"},
        },
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id]},
        "history": [{"created": "2025-01-01T00:00:00Z",
                     "created_by": "rigfleet_sandbox.upstream_registry (SIMULATED)"}],
    }
    return json.dumps(config, indent=2, sort_keys=True).encode()


def sha256(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def image_manifest(config: bytes, layer: Layer) -> bytes:
    """The image manifest (Docker schema 2) of `config` and its one `layer`."""
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": {"mediaType": CONFIG_TYPE, "size": len(config), "digest": sha256(config)},
        "layers": [{"mediaType": LAYER_TYPE, "size": layer.size, "digest": layer.digest}],
    }
    return json.dumps(manifest, indent=3).encode()


# -- pushing -----------------------------------------------------------------------------------


class _Registry:
    """The Registry HTTP API v2 of the stand-in upstream, over one TLS connection (the sandbox CA)."""

    def __init__(self, cafile: Path = CA_CERT, host: str = SERVICE_ADDR, port: int = UPSTREAM_REGISTRY_PORT) -> None:
        context = ssl.create_default_context(cafile=str(cafile))
        self.conn = http.client.HTTPSConnection(host, port, context=context, timeout=120, blocksize=_CHUNK)

    def call(self, method: str, url: str, body: bytes | IO[bytes] | None = None,
             headers: dict[str, str] | None = None, expect: tuple[int, ...] = (200,)) -> http.client.HTTPResponse:
        try:
            self.conn.request(method, url, body, headers or {})
            resp = self.conn.getresponse()
            text = resp.read()  # all of it: the connection is used again
        except OSError as exc:
            raise SandboxError(f"upstream registry {HOST}: {method} {url}: {exc} (is the sandbox up?)") from exc
        if resp.status not in expect:
            raise SandboxError(f"upstream registry {HOST}: {method} {url} answered {resp.status}: "
                               f"{text[:500].decode(errors='replace')}")
        return resp

    def push_blob(self, name: str, digest: str, size: int, body: bytes | IO[bytes]) -> None:
        """A monolithic upload (POST, then PUT with the digest); none when the blob is there."""
        if self.call("HEAD", f"/v2/{name}/blobs/{digest}", expect=(200, 404)).status == 200:
            return
        started = self.call("POST", f"/v2/{name}/blobs/uploads/", expect=(202,))
        location = urlsplit(started.getheader("Location", ""))  # absolute, with the upload's state
        url = f"{location.path}?{location.query}{'&' if location.query else ''}digest={digest}"
        self.call("PUT", url, body, {"Content-Type": "application/octet-stream", "Content-Length": str(size)},
                  expect=(201,))

    def close(self) -> None:
        self.conn.close()


def ref(repository: str, tag: str) -> str:
    return f"{HOST}/{repository}:{tag}"


def push(repository: str, tag: str, layer: Layer, config: bytes) -> str:
    """Push the layer, the config and their manifest as repository:tag; return the image's ref."""
    registry = _Registry()
    try:
        with open(layer.path, "rb") as body:
            registry.push_blob(repository, layer.digest, layer.size, body)
        registry.push_blob(repository, sha256(config), len(config), config)
        manifest = image_manifest(config, layer)
        registry.call("PUT", f"/v2/{repository}/manifests/{tag}", manifest,
                      {"Content-Type": MANIFEST_TYPE, "Content-Length": str(len(manifest))}, expect=(201,))
    finally:
        registry.close()
    return ref(repository, tag)


# rigfleet's default smoke image (`smoke_image`): what the stand-in is of, unless told otherwise
DEFAULT_REPOSITORY, DEFAULT_TAG = str(Rig.model_fields["smoke_image"].default).rsplit(":", 1)


def seed_image(repository: str = DEFAULT_REPOSITORY, tag: str = DEFAULT_TAG, log: Log = print) -> str:
    """Put a SIMULATED stand-in of repository:tag on the stand-in upstream registry (a running
    sandbox's); return its ref, "<SERVICE_ADDR>:<port>/<repository>:<tag>". Pushing again is
    harmless (the blobs are there: only the manifest is put again)."""
    layer = cached_layer(log)
    return push(repository, tag, layer, image_config(layer, f"{repository}:{tag}"))

