"""SIMULATED Docker CE repository for the sandbox rigs: Docker's package names, versions and
relations around the Debian archive's real Docker binaries.

Docker's repository is not reachable from here, so its packages are rebuilt: each stand-in takes
its name, version and control relations from docker_ce_fields.yaml (recorded from Docker's
packaging sources, with their commits) and its files from the Debian packages that hold the same
programs (docker.io, docker-cli, containerd, runc, tini, rootlesskit, docker-buildx,
docker-compose), downloaded through the machine's own apt mirror and checked against the
archive's index. Every description says SIMULATED. The real role installs them with real apt,
from the layout Docker uses:

    docker/linux/debian/gpg                                   the repository key (a sandbox key)
    docker/linux/debian/dists/<suite>/{InRelease,Release,Release.gpg}
    docker/linux/debian/dists/<suite>/stable/binary-amd64/Packages{,.gz}
    docker/linux/debian/dists/<suite>/pool/stable/amd64/*.deb

deb822 source as the role writes it: URIs .../linux/debian, Suites <codename>, Components stable.
The built suite is cached under CACHE_DIR (rebuilding repacks ~150 MB) and linked into www.
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rigfleet_sandbox import aptrepo, debindex
from rigfleet_sandbox.layout import CACHE_DIR, HOST_URL

FIELDS_FILE = Path(__file__).resolve().parent / "docker_ce_fields.yaml"
REPO_PATH = "docker/linux/debian"
COMPONENT = "stable"
KEY_NAME = "docker"
LABEL = "Docker CE (SIMULATED, rigfleet sandbox)"
RELATIONS = ("Pre-Depends", "Depends", "Recommends", "Suggests", "Enhances", "Breaks", "Provides",
             "Conflicts", "Replaces")
# Debian's packages: per stand-in, which Debian package's files go where (source path -> path in
# the stand-in). The plugins are Go binaries that need only libc >= 2.34, so bookworm takes them
# from trixie, as the distro path does for Compose v2 (bookworm has no buildx, Compose only v1).
# Paths stay Debian's (its docker.service starts /usr/sbin/dockerd).
CLI_FROM = {"bookworm": ("docker.io", "bookworm"), "trixie": ("docker-cli", "trixie")}
CARRIES: dict[str, list[tuple[str, str | None, dict[str, str]]]] = {
    # stand-in: [(Debian package, suite or None for the rig's suite, {source path: dest path})]
    "docker-ce": [
        ("docker.io", None, {
            "usr/sbin/dockerd": "usr/sbin/dockerd",
            "usr/sbin/docker-proxy": "usr/sbin/docker-proxy",
            "@units/docker.service": "@units/docker.service",
            "@units/docker.socket": "@units/docker.socket",
            "etc/default/docker": "etc/default/docker",
        }),
        # Docker CE ships docker-init itself; Debian's docker.io links it to tini's static build
        ("tini", None, {"usr/bin/tini-static": "usr/bin/docker-init"}),
    ],
    "docker-ce-cli": [("@cli", None, {"usr/bin/docker": "usr/bin/docker"})],
    "containerd.io": [
        ("containerd", None, {
            "usr/bin/containerd": "usr/bin/containerd",
            "usr/bin/containerd-shim-runc-v2": "usr/bin/containerd-shim-runc-v2",
            "usr/bin/ctr": "usr/bin/ctr",
            "@units/containerd.service": "@units/containerd.service",
            "etc/containerd/config.toml": "etc/containerd/config.toml",
        }),
        ("runc", None, {"usr/sbin/runc": "usr/sbin/runc"}),
    ],
    "docker-buildx-plugin": [
        ("docker-buildx", "trixie", {"usr/libexec/docker/cli-plugins/docker-buildx":
                                     "usr/libexec/docker/cli-plugins/docker-buildx"}),
    ],
    "docker-compose-plugin": [
        ("docker-compose", "trixie", {"usr/libexec/docker/cli-plugins/docker-compose":
                                      "usr/libexec/docker/cli-plugins/docker-compose"}),
    ],
    "docker-ce-rootless-extras": [
        ("rootlesskit", None, {
            "usr/bin/rootlesskit": "usr/bin/rootlesskit",
            "usr/bin/rootlesskit-docker-proxy?": "usr/bin/rootlesskit-docker-proxy",
            "usr/bin/rootlessctl": "usr/bin/rootlessctl",
        }),
        ("docker.io", None, {
            "usr/share/docker.io/contrib/dockerd-rootless.sh": "usr/bin/dockerd-rootless.sh",
            "usr/share/docker.io/contrib/dockerd-rootless-setuptool.sh": "usr/bin/dockerd-rootless-setuptool.sh",
        }),
    ],
}
# sources that lend only shell scripts: their library dependencies are not the stand-in's
SCRIPTS_ONLY = {("docker-ce-rootless-extras", "docker.io")}
# units each stand-in enables and starts at install, as dh_installsystemd does for Docker's
UNITS = {"docker-ce": ["docker.socket", "docker.service"], "containerd.io": ["containerd.service"]}
UNIT_DIRS = {"bookworm": "lib/systemd/system", "trixie": "usr/lib/systemd/system"}
DOCKER_GROUP_PREINST = (
    "#!/bin/sh\n# SIMULATED package (rigfleet sandbox): Docker CE creates the docker group.\nset -e\n"
    'if [ "$1" = install ] || [ "$1" = upgrade ]; then\n'
    "    getent group docker >/dev/null || groupadd --system docker\n"
    "fi\nexit 0\n"
)


def fields() -> dict[str, Any]:
    with open(FIELDS_FILE, encoding="utf-8") as fh:
        return dict(yaml.safe_load(fh))


def version(name: str, suite: str) -> str:
    """The stand-in's version string, in Docker's format (5:28.5.1-1~debian.12~bookworm)."""
    data = fields()
    pkg = data["packages"][name]
    if pkg.get("fixed_version"):
        return str(pkg["version"])
    return str(data["version_format"]).format(
        epoch=pkg["epoch"], version=pkg["version"], revision=data["revision"],
        version_id=data["version_id"][suite], suite=suite)


def _debian_source(source: str, suite: str) -> tuple[str, str]:
    return CLI_FROM[suite] if source == "@cli" else (source, suite)


def sources(name: str, suite: str) -> list[tuple[str, str, dict[str, str]]]:
    """(Debian package, its suite, path map) for one stand-in on `suite`."""
    out = []
    for source, from_suite, paths in CARRIES[name]:
        pkg, pkg_suite = _debian_source(source, from_suite or suite)
        out.append((pkg, pkg_suite, paths))
    return out


def shlibs(debian_depends: list[str]) -> list[str]:
    """What ${shlibs:Depends} stands for with Debian's binaries: their packages' library deps."""
    return [d for d in debian_depends if re.match(r"lib[a-z0-9.+-]*\d[a-z0-9.+-]*( |$)", d)]


@dataclass
class StandIn:
    name: str
    version: str
    suite: str
    relations: dict[str, list[str]] = field(default_factory=dict)
    carried: list[tuple[str, str]] = field(default_factory=list)  # (Debian package, version)

    @property
    def filename(self) -> str:
        return f"{self.name}_{self.version.split(':')[-1]}_amd64.deb"


def standin(name: str, suite: str, index: dict[str, dict[str, dict[str, str]]]) -> StandIn:
    """The stand-in's control data for `suite`; `index` maps suite -> Debian's main index."""
    real = fields()["packages"][name]
    carried, libs = [], []
    for pkg, pkg_suite, _paths in sources(name, suite):
        entry = index[pkg_suite][pkg]
        carried.append((pkg, entry["Version"]))
        if (name, pkg) in SCRIPTS_ONLY:
            continue
        for dep in shlibs(aptrepo.split_relations(entry.get("Depends", ""))):
            if dep not in libs:
                libs.append(dep)
    relations = {}
    for key in RELATIONS:
        if key in real:
            values = []
            for rel in aptrepo.split_relations(str(real[key])):
                values += libs if rel == "${shlibs:Depends}" else [rel]
            if values:
                relations[key] = values
    return StandIn(name, version(name, suite), suite, relations, carried)


def control(s: StandIn, installed_kib: int) -> str:
    real = fields()["packages"][s.name]
    lines = [f"Package: {s.name}", f"Version: {s.version}", "Architecture: amd64",
             f"Maintainer: {aptrepo.MAINTAINER}", f"Installed-Size: {max(installed_kib, 1)}"]
    lines += [f"{key}: {', '.join(values)}" for key, values in s.relations.items()]
    carried = ", ".join(f"{pkg} {ver}" for pkg, ver in s.carried)
    lines += [
        "Section: admin",
        "Priority: optional",
        "Homepage: https://github.com/docker/docker-ce-packaging (SIMULATED stand-in)",
        f"Description: {real['summary']} (SIMULATED)",
        " SIMULATED by the rigfleet sandbox: Docker CE's package name, version and relations",
        f" (docker_ce_fields.yaml) around the Debian archive's binaries from {carried}.",
        " It is not Docker's build.",
    ]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------- fetching


def fetch_debian(pkg: str, suite: str, entry: dict[str, str], cache: Path) -> Path:
    """Debian's .deb through the machine's apt mirror, checked against the index's SHA256."""
    dest = cache / suite / Path(entry["Filename"]).name
    if dest.is_file() and hashlib.sha256(dest.read_bytes()).hexdigest() == entry["SHA256"]:
        return dest
    url = f"{debindex.debian_mirror()}/{entry['Filename']}"
    with urllib.request.urlopen(url, timeout=600) as resp:  # noqa: S310 - the machine's apt mirror
        data = resp.read()
    if hashlib.sha256(data).hexdigest() != entry["SHA256"]:
        raise RuntimeError(f"{pkg} from {url}: SHA256 differs from the {suite} index")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".partial")
    tmp.write_bytes(data)
    tmp.replace(dest)
    return dest


def debian_indexes(suites: set[str]) -> dict[str, dict[str, dict[str, str]]]:
    return {suite: debindex.packages_index(suite, "main") for suite in suites}


# ----------------------------------------------------------------------------------- building


def _extract(deb: Path, into: Path) -> None:
    into.mkdir(parents=True, exist_ok=True)
    tar = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE)
    aptrepo._run(["tar", "-x", "-C", str(into)], stdin=tar.stdout)
    if tar.wait() != 0:
        raise RuntimeError(f"dpkg-deb --fsys-tarfile {deb} failed")


def _resolve(path: str, suite: str) -> str:
    return path.replace("@units", UNIT_DIRS[suite])


def _maintainer_scripts(name: str) -> dict[str, str]:
    units = UNITS.get(name, [])
    pkg = aptrepo.Package(name, "", "docker", "", units_enable=units, units_start=units)
    scripts = aptrepo._maintainer_scripts(pkg)
    if name == "docker-ce":
        scripts["preinst"] = DOCKER_GROUP_PREINST
    return scripts


def build_deb(s: StandIn, debs: dict[tuple[str, str], Path], work: Path, out_dir: Path) -> Path:
    root = work / s.name
    for pkg, pkg_suite, paths in sources(s.name, s.suite):
        unpacked = work / ".src" / pkg_suite / pkg
        if not unpacked.exists():
            _extract(debs[(pkg, pkg_suite)], unpacked)
        for src, dest in paths.items():
            optional = src.endswith("?")
            src_path = unpacked / _resolve(src.rstrip("?"), pkg_suite)
            if not src_path.exists():
                if optional:
                    continue
                raise RuntimeError(f"{pkg} ({pkg_suite}) has no {src_path.relative_to(unpacked)}")
            target = root / _resolve(dest, s.suite)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src_path.resolve(), target)
    doc = root / "usr/share/doc" / s.name / "README.simulated"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(control(s, 0).split("Description: ", 1)[1].replace("\n ", "\n"), encoding="utf-8")
    files = sorted(p for p in root.rglob("*") if p.is_file())
    kib = sum((p.stat().st_size + 1023) // 1024 for p in files)
    meta = root / "DEBIAN"
    meta.mkdir()
    (meta / "control").write_text(control(s, kib), encoding="utf-8")
    (meta / "md5sums").write_text(
        "".join(f"{hashlib.md5(p.read_bytes()).hexdigest()}  {p.relative_to(root)}\n"  # noqa: S324
                for p in files), encoding="utf-8")
    conffiles = [f"/{p.relative_to(root)}" for p in files if p.relative_to(root).parts[0] == "etc"]
    if conffiles:
        (meta / "conffiles").write_text("".join(c + "\n" for c in conffiles), encoding="utf-8")
    for script, text in _maintainer_scripts(s.name).items():
        (meta / script).write_text(text, encoding="utf-8")
        (meta / script).chmod(0o755)
    for dirpath, dirnames, _ in os.walk(root):
        for d in dirnames:
            os.chmod(os.path.join(dirpath, d), 0o755)
    os.chmod(root, 0o755)
    deb = out_dir / s.filename
    env = dict(os.environ, SOURCE_DATE_EPOCH=str(aptrepo.SOURCE_DATE_EPOCH))
    aptrepo._run(["dpkg-deb", "--root-owner-group", "-Zgzip", "-z1", "--build", str(root), str(deb)], env=env)
    shutil.rmtree(root)
    return deb


def _release(suite: str, dist: Path) -> bytes:
    lines = [
        "Origin: Docker",
        f"Label: {LABEL}",
        f"Suite: {suite}",
        f"Codename: {suite}",
        "Architectures: amd64",
        f"Components: {COMPONENT}",
        f"Date: {email.utils.formatdate(usegmt=True)}",
        "Description: SIMULATED Docker CE repository for rigfleet sandbox rigs (Debian's Docker binaries)",
    ]
    names = [f"{COMPONENT}/binary-amd64/Packages", f"{COMPONENT}/binary-amd64/Packages.gz"]
    for title, algo in (("MD5Sum", hashlib.md5), ("SHA256", hashlib.sha256)):
        lines.append(f"{title}:")
        for name in names:
            data = (dist / name).read_bytes()
            lines.append(f" {algo(data).hexdigest()} {len(data):>8} {name}")
    return ("\n".join(lines) + "\n").encode()


def _packages_index(entries: list[tuple[StandIn, Path]], base: Path) -> bytes:
    stanzas = []
    for _standin, deb in entries:
        text = aptrepo._run(["dpkg-deb", "-f", str(deb)]).stdout.decode()
        data = deb.read_bytes()
        stanzas.append(
            text.rstrip("\n") + "\n"
            + f"Filename: {deb.relative_to(base)}\nSize: {len(data)}\n"
            + f"MD5sum: {hashlib.md5(data).hexdigest()}\n"  # noqa: S324 - apt index format
            + f"SHA256: {hashlib.sha256(data).hexdigest()}\n"
        )
    return "\n".join(stanzas).encode()


def ensure_key(key_dir: Path) -> str:
    aptrepo.ensure_host_tools()
    with aptrepo._locked(key_dir / ".lock"):
        home = key_dir / KEY_NAME
        fpr = aptrepo._ensure_key(home, f"rigfleet sandbox docker repository key - {LABEL}")
        aptrepo._stop_agent(home)
        return fpr


def build_suite(suite: str, repo: Path, key_dir: Path, cache: Path,
                index: dict[str, dict[str, dict[str, str]]] | None = None) -> list[StandIn]:
    """Build dists/<suite> of the repository rooted at `repo` (…/linux/debian), signed."""
    names = list(fields()["packages"])
    needed = {pkg_suite for name in names for _, pkg_suite, _ in sources(name, suite)}
    index = index or debian_indexes(needed | {suite})
    standins = [standin(name, suite, index) for name in names]
    debs = {}
    for name in names:
        for pkg, pkg_suite, _ in sources(name, suite):
            if (pkg, pkg_suite) not in debs:
                debs[(pkg, pkg_suite)] = fetch_debian(pkg, pkg_suite, index[pkg_suite][pkg], cache)
    dist = repo / "dists" / suite
    pool = dist / "pool" / COMPONENT / "amd64"
    pool.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".docker-build-", dir=repo))
    try:
        entries = [(s, build_deb(s, debs, work, pool)) for s in standins]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    binary = dist / COMPONENT / "binary-amd64"
    binary.mkdir(parents=True, exist_ok=True)
    packages = _packages_index(entries, repo)
    (binary / "Packages").write_bytes(packages)
    (binary / "Packages.gz").write_bytes(aptrepo._gz(packages))
    (dist / "Release").write_bytes(_release(suite, dist))
    home = key_dir / KEY_NAME
    fpr = ensure_key(key_dir)
    sign = ["--pinentry-mode", "loopback", "--passphrase", "", "--local-user", fpr, "--digest-algo", "SHA512"]
    aptrepo._gpg(home, *sign, "--clearsign", "-o", str(dist / "InRelease"), str(dist / "Release"))
    aptrepo._gpg(home, *sign, "--armor", "--detach-sign", "-o", str(dist / "Release.gpg"), str(dist / "Release"))
    (repo / "gpg").write_bytes(aptrepo._gpg(home, "--armor", "--export", fpr))
    aptrepo._stop_agent(home)
    for path in repo.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    repo.chmod(0o755)
    return standins


def _digest(suite: str, fpr: str) -> str:
    h = hashlib.sha256()
    for path in (Path(__file__), FIELDS_FILE, Path(aptrepo.__file__)):
        h.update(path.read_bytes())
    h.update(f"{suite}\0{fpr}".encode())
    return h.hexdigest()


def build_docker_repo(www: Path, *, suite: str = "trixie", key_dir: Path | None = None,
                      base_url: str | None = None, cache_dir: Path = CACHE_DIR,
                      debs_cache: Path | None = None) -> dict:
    """Build (or reuse the cached) SIMULATED Docker CE repository for `suite` under www.

    Returns the group vars for the role: docker_source docker-ce and docker_repo (URL, key URL,
    key fingerprint), as an operator with a Docker mirror would set them.
    """
    key_dir = key_dir or Path(os.environ.get("RIGFLEET_SIM_APT_KEY_DIR", aptrepo.DEFAULT_KEY_DIR))
    base_url = base_url or HOST_URL
    base_url = base_url if base_url.endswith("/") else base_url + "/"
    fpr = ensure_key(key_dir)
    digest = _digest(suite, fpr)
    cached = cache_dir / "docker-ce" / suite
    stamp = cached / ".rigfleet-build.json"
    with aptrepo._locked(cache_dir / ".docker-ce.lock"):
        if not (stamp.is_file() and json.loads(stamp.read_text(encoding="utf-8")).get("digest") == digest):
            shutil.rmtree(cached, ignore_errors=True)
            stage = cache_dir / "docker-ce" / f".{suite}.partial"
            shutil.rmtree(stage, ignore_errors=True)
            stage.mkdir(parents=True)
            repo = stage / REPO_PATH
            repo.mkdir(parents=True)
            build_suite(suite, repo, key_dir, debs_cache or cache_dir / "debian-debs")
            (stage / ".rigfleet-build.json").write_text(json.dumps({"digest": digest}), encoding="utf-8")
            stage.rename(cached)
        target = Path(www) / REPO_PATH
        shutil.rmtree(target, ignore_errors=True)
        _link_tree(cached / REPO_PATH, target)
    url = f"{base_url}{REPO_PATH}"
    return {
        "group_vars": {
            "docker_source": "docker-ce",
            "docker_repo": {"url": url, "key_url": f"{url}/gpg", "key_fingerprint": fpr},
        },
        "docker_ce_versions": {name: version(name, suite) for name in fields()["packages"]},
        "simulated": True,
    }


def _link_tree(src: Path, dest: Path) -> None:
    """Hard links where the cache and www share a file system, copies where not."""
    for dirpath, _, filenames in os.walk(src):
        rel = Path(dirpath).relative_to(src)
        (dest / rel).mkdir(parents=True, exist_ok=True)
        (dest / rel).chmod(0o755)
        for name in filenames:
            try:
                os.link(Path(dirpath) / name, dest / rel / name)
            except OSError:
                shutil.copy2(Path(dirpath) / name, dest / rel / name)
