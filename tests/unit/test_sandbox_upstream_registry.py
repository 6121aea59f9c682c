"""The sandbox's stand-in upstream container registry, the parts that need no root and no sandbox:
its access log read into the upstream byte counter, the registry config, the SIMULATED image's
layer, config and manifest, and the TLS material a rig's Docker trusts."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from rigfleet_sandbox import registry, upstream_registry, upstreamlog
from rigfleet_sandbox.layout import SERVICE_ADDR, UPSTREAM_REGISTRY_PORT

# as docker-registry 2.8.2 (Debian) writes its access log: Apache combined format, on stdout
BLOB_GET = ('10.233.2.2 - - [06/Dec/2026:23:49:28 +0000] "GET /v2/nvidia/cuda/blobs/sha256:ab12 HTTP/1.1" '
            '200 73400320 "" "docker/28.0.1 go/go1.23.6 os/linux arch/amd64"')
MANIFEST_HEAD = ('10.233.2.2 - - [06/Dec/2026:23:49:28 +0000] "HEAD /v2/nvidia/cuda/manifests/13.0.2 HTTP/1.1" '
                 '200 529 "" "docker/28.0.1"')
# and its application log, JSON on stderr: not an access-log line
APP_LOG = ('{"http.request.method":"GET","http.request.remoteaddr":"10.233.2.2:59936","http.request.uri":"/v2/",'
           '"http.response.status":200,"http.response.written":2,"level":"info","msg":"response completed"}')


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def test_an_access_log_line_is_one_upstream_record() -> None:
    assert registry.access_record(BLOB_GET) == ("10.233.2.2", "GET", "/v2/nvidia/cuda/blobs/sha256:ab12", 200,
                                                73400320)
    # the registry logs the manifest it wrote for a HEAD, but Go's server sends no body for one
    assert registry.access_record(MANIFEST_HEAD) == ("10.233.2.2", "HEAD", "/v2/nvidia/cuda/manifests/13.0.2",
                                                     200, 0)
    no_body = '10.233.2.2 - - [06/Dec/2026:23:49:28 +0000] "GET /v2/ HTTP/2.0" 304 - "" "curl/7.88.1"'
    assert registry.access_record(no_body) == ("10.233.2.2", "GET", "/v2/", 304, 0)
    assert registry.access_record(APP_LOG) is None
    assert registry.access_record("") is None


def test_the_wrapper_relays_the_access_log_and_counts_every_response(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "upstream.jsonl"
    registry._count(io.BytesIO(f"{BLOB_GET}\n{MANIFEST_HEAD}\n".encode()), upstreamlog.Writer(log))
    assert capsys.readouterr().out == f"{BLOB_GET}\n{MANIFEST_HEAD}\n"  # the original log is kept
    records = upstreamlog.records(log)
    assert [(r["server"], r["client"], r["method"], r["status"], r["bytes"]) for r in records] == [
        (upstreamlog.REGISTRY_SERVER, "10.233.2.2", "GET", 200, 73400320),
        (upstreamlog.REGISTRY_SERVER, "10.233.2.2", "HEAD", 200, 0),
    ]
    # all of a pull is kind "image"; only the rigs asked for are summed
    assert {upstreamlog.kind(r) for r in records} == {"image"}
    assert upstreamlog.pulled(records, ["10.233.2.2"]) == {"package": 0, "index": 0, "python": 0,
                                                            "image": 73400320, "other": 0}
    assert upstreamlog.pulled(records, ["10.233.3.2"])["image"] == 0


def test_only_the_upstream_registry_serves_tls_and_logs_its_access(tmp_path: Path) -> None:
    fleet = registry.config(SERVICE_ADDR, 5000, tmp_path / "fleet")
    assert isinstance(fleet["http"], dict) and "tls" not in fleet["http"]
    upstream = registry.config(SERVICE_ADDR, UPSTREAM_REGISTRY_PORT, tmp_path / "up", (tmp_path / "c", tmp_path / "k"))
    assert upstream["http"] == {"addr": f"{SERVICE_ADDR}:{UPSTREAM_REGISTRY_PORT}",
                                "headers": {"X-Content-Type-Options": ["nosniff"]},
                                "tls": {"certificate": str(tmp_path / "c"), "key": str(tmp_path / "k")}}
    log = upstream["log"]
    assert isinstance(log, dict) and log["formatter"] == "json" and log["accesslog"] == {"disabled": False}
    args = upstream_registry.registry_args()
    assert args[args.index("--upstream-log") + 1] == str(upstreamlog.LOG)
    assert args[args.index("--port") + 1] == str(UPSTREAM_REGISTRY_PORT)
    with pytest.raises(SystemExit):  # counted, but served over plain HTTP: refused
        registry.main(["--addr", SERVICE_ADDR, "--storage", str(tmp_path), "--upstream-log", str(tmp_path / "u")])


def test_the_image_takes_rigfleets_local_smoke_image_paths() -> None:
    for name in ("bin", "lib64", "usr/bin/python3", "usr/lib/python3.13/os.py", "etc/ld.so.conf.d/x86_64.conf"):
        assert upstream_registry.in_image(name), name
    for name in ("etc", "etc/passwd", "usr/share/doc/x", "usr/lib/modules/6.12/x.ko", "usr/libexec/x", "var/lib"):
        assert not upstream_registry.in_image(name), name


def _source(tmp_path: Path) -> Path:
    """A root's tarball as rootfs.ensure_tarball makes one: ./-prefixed names, GNU hard links."""
    root = tmp_path / "root"
    for name, data in (("usr/bin/python3", b"#!python"), ("usr/share/doc/README", b"doc"),
                       ("etc/passwd", b"root:x:0:0"), ("etc/ld.so.conf.d/libc.conf", b"/usr/local/lib\n"),
                       ("usr/lib/modules/k.ko", b"module")):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    (root / "bin").symlink_to("usr/bin")
    (root / "usr/bin/python3.13").hardlink_to(root / "usr/bin/python3")
    (root / "usr/bin/modprobe-link").hardlink_to(root / "usr/lib/modules/k.ko")  # its file is left out
    source = tmp_path / "root.tar.gz"
    subprocess.run(["tar", "--numeric-owner", "-C", str(root), "-czf", str(source), "."], check=True)
    return source


def test_the_layer_is_what_its_digests_say(tmp_path: Path) -> None:
    source = _source(tmp_path)
    layer = upstream_registry.build_layer(source, tmp_path / "layer.tar.gz")
    blob = layer.path.read_bytes()
    assert (layer.digest, layer.size) == (sha256(blob), len(blob))
    assert layer.diff_id == sha256(gzip.decompress(blob))  # what Docker checks after unpacking
    with tarfile.open(layer.path) as tar:
        members = tar.getmembers()
        names = [m.name for m in members]
        # the hard link to a left-out file goes too, unless tar stored the file under the link's name
        assert set(names) - {"usr/bin/modprobe-link"} == {
            "bin", "usr", "usr/bin", "usr/bin/python3", "usr/bin/python3.13", "usr/lib",
            "etc/ld.so.conf.d", "etc/ld.so.conf.d/libc.conf"}
        for member in members:
            if member.islnk():  # every hard link's target comes before it, under its layer name
                assert member.linkname in names[:names.index(member.name)], member.name
        by_name = {m.name: m for m in members}
        assert by_name["bin"].issym() and by_name["bin"].linkname == "usr/bin"
        assert tar.extractfile("usr/bin/python3").read() == b"#!python"  # type: ignore[union-attr]
    # the same source makes the same bytes: a cached or rebuilt layer has the same digests
    again = upstream_registry.build_layer(source, tmp_path / "again.tar.gz")
    assert (again.digest, again.diff_id) == (layer.digest, layer.diff_id)


def test_the_manifest_names_the_config_and_the_layer(tmp_path: Path) -> None:
    layer = upstream_registry.build_layer(_source(tmp_path), tmp_path / "layer.tar.gz")
    config = upstream_registry.image_config(layer, "nvidia/cuda:13.0.2-base-ubuntu22.04")
    body = json.loads(config)
    assert body["rootfs"] == {"type": "layers", "diff_ids": [layer.diff_id]}
    assert (body["os"], body["architecture"]) == ("linux", "amd64")
    assert "SIMULATED" in body["config"]["Labels"][upstream_registry.SIMULATED_LABEL]
    assert "NVIDIA_VISIBLE_DEVICES=all" in body["config"]["Env"]  # as nvidia/cuda: the hook injects nvidia-smi
    assert upstream_registry.image_config(layer, "nvidia/cuda:13.0.2-base-ubuntu22.04") == config  # same digest
    manifest = json.loads(upstream_registry.image_manifest(config, layer))
    assert manifest == {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "size": len(config),
                   "digest": sha256(config)},
        "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", "size": layer.size,
                    "digest": layer.digest}],
    }
    assert upstream_registry.ref("nvidia/cuda", "13.0.2-base-ubuntu22.04") == (
        f"{SERVICE_ADDR}:{UPSTREAM_REGISTRY_PORT}/nvidia/cuda:13.0.2-base-ubuntu22.04")


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")
def test_the_certificate_is_for_the_service_address_and_rigs_trust_its_ca(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tls = tmp_path / "tls"
    for name, path in (("TLS_DIR", tls), ("CA_CERT", tls / "ca.crt"), ("CA_KEY", tls / "ca.key"),
                       ("SERVER_CERT", tls / "server.crt"), ("SERVER_KEY", tls / "server.key")):
        monkeypatch.setattr(upstream_registry, name, path)
    said: list[str] = []
    upstream_registry.ensure_tls(said.append)
    upstream_registry.ensure_tls(said.append)  # once: the second call keeps what is there
    assert len(said) == 1
    verify = subprocess.run(["openssl", "verify", "-CAfile", str(tls / "ca.crt"), str(tls / "server.crt")],
                            capture_output=True, text=True)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    text = subprocess.run(["openssl", "x509", "-noout", "-ext", "subjectAltName", "-in", str(tls / "server.crt")],
                          capture_output=True, text=True, check=True).stdout
    assert f"IP Address:{SERVICE_ADDR}" in text
    rig_root = tmp_path / "rig"
    upstream_registry.trust(rig_root)
    trusted = rig_root / f"etc/docker/certs.d/{SERVICE_ADDR}:{UPSTREAM_REGISTRY_PORT}/ca.crt"
    assert trusted.read_bytes() == (tls / "ca.crt").read_bytes()
