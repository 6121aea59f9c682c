"""The sandbox's SIMULATED Docker CE repository, built from the real Debian Docker packages
(fetched through the machine's apt mirror, cached) and checked with the real tools: dpkg-deb -I
for every package's control, gpgv for the signed index, the carried dockerd run for its version,
and real apt resolving the role's install against this repository plus the Debian archive."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
from pathlib import Path

import pytest

from rigfleet_sandbox import aptrepo, debindex, dockerrepo

# the module (rigfleet.roles re-exports the deploy under the same name)
docker_engine = importlib.import_module("rigfleet.roles.docker_engine")

SUITES = ("bookworm", "trixie")
DEBS_CACHE = debindex.CACHE.parent / "debian-debs"
NAMES = list(dockerrepo.fields()["packages"])


def test_the_fields_file_names_exactly_the_packages_the_role_installs() -> None:
    assert sorted(NAMES) == sorted(docker_engine.DOCKER_CE)


@pytest.mark.parametrize("suite", SUITES)
def test_versions_in_dockers_format(suite: str) -> None:
    number = dockerrepo.fields()["version_id"][suite]
    for name in docker_engine.DOCKER_CE_VERSIONED:
        assert re.fullmatch(rf"5:\d+\.\d+\.\d+-1~debian\.{number}~{suite}", dockerrepo.version(name, suite))
    # the role pins the versioned packages with an epoch-5 glob: the stand-ins must match it
    assert dockerrepo.version("docker-ce", suite).startswith("5:28.5.1-")


def test_docker_ce_conflicts_with_the_distros_docker_and_the_role_removes_it() -> None:
    conflicts = dockerrepo.fields()["packages"]["docker-ce"]["Conflicts"]
    assert "docker.io" in aptrepo.split_relations(conflicts)
    assert "docker.io" in docker_engine.CONFLICTS


def test_shlibs_keeps_library_dependencies_only() -> None:
    assert dockerrepo.shlibs(["libc6 (>= 2.34)", "adduser", "libdevmapper1.02.1 (>= 2:1.02.97)", "tini",
                              "libsystemd0", "iptables"]) == [
        "libc6 (>= 2.34)", "libdevmapper1.02.1 (>= 2:1.02.97)", "libsystemd0"]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    keys = tmp_path_factory.mktemp("keys")
    for suite in SUITES:
        www = tmp_path_factory.mktemp(f"www-{suite}")
        dockerrepo.build_docker_repo(www, suite=suite, key_dir=keys, cache_dir=tmp_path_factory.mktemp("cache"),
                                     debs_cache=DEBS_CACHE, base_url="http://repo.invalid/")
        out[suite] = www / dockerrepo.REPO_PATH
    return out


def _field(deb: Path, name: str) -> str:
    return subprocess.run(["dpkg-deb", "-f", str(deb), name], capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.parametrize("suite", SUITES)
def test_every_package_carries_dockers_relations_and_says_simulated(built: dict[str, Path], suite: str) -> None:
    pool = built[suite] / "dists" / suite / "pool" / "stable" / "amd64"
    real = dockerrepo.fields()["packages"]
    for name in NAMES:
        [deb] = pool.glob(f"{name}_*_amd64.deb")
        info = subprocess.run(["dpkg-deb", "-I", str(deb)], capture_output=True, text=True, check=True).stdout
        assert "SIMULATED" in info
        assert _field(deb, "Version") == dockerrepo.version(name, suite)
        for key in ("Conflicts", "Replaces", "Breaks", "Provides", "Recommends", "Pre-Depends", "Enhances"):
            if key in real[name]:
                assert _field(deb, key) == ", ".join(aptrepo.split_relations(real[name][key])), (name, key)
        depends = _field(deb, "Depends")
        for rel in aptrepo.split_relations(real[name].get("Depends", "")):
            if rel != "${shlibs:Depends}":
                assert rel in depends, (name, rel)
        assert "${" not in depends


@pytest.mark.parametrize("suite", SUITES)
def test_the_engine_is_debians_real_dockerd(built: dict[str, Path], suite: str, tmp_path: Path) -> None:
    [deb] = (built[suite] / "dists" / suite / "pool" / "stable" / "amd64").glob("docker-ce_*.deb")
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp_path)], check=True)
    expected = debindex.packages_index(suite, "main")["docker.io"]["Version"].split("+")[0]
    out = subprocess.run([str(tmp_path / "usr/sbin/dockerd"), "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith(f"Docker version {expected}")
    assert (tmp_path / "usr/bin/docker-init").is_file()


@pytest.mark.parametrize("suite", SUITES)
def test_index_signed_by_the_repository_key(built: dict[str, Path], suite: str, tmp_path: Path) -> None:
    keyring = tmp_path / "key.gpg"
    subprocess.run(["gpg", "--batch", "--yes", "--dearmor", "-o", str(keyring), str(built[suite] / "gpg")], check=True)
    signed = built[suite] / "dists" / suite / "InRelease"
    assert subprocess.run(["gpgv", "--keyring", str(keyring), str(signed)], capture_output=True).returncode == 0
    tampered = tmp_path / "InRelease"
    tampered.write_bytes(signed.read_bytes().replace(b"Suite: ", b"Suite: x"))
    assert subprocess.run(["gpgv", "--keyring", str(keyring), str(tampered)], capture_output=True).returncode != 0


def _apt(suite: str, repo: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Real apt over this repository (file://, its key) and the Debian archive (the machine's
    mirror), an empty dpkg status and none of the machine's apt settings."""
    for d in ("state/lists/partial", "cache/archives/partial", "parts", "prefs"):
        (tmp / d).mkdir(parents=True, exist_ok=True)
    (tmp / "status").touch()
    key = tmp / "docker.asc"
    key.write_bytes((repo / "gpg").read_bytes())
    (tmp / "sources.list").write_text(
        f"deb [signed-by={key}] file://{repo} {suite} stable\n"
        f"deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] {debindex.debian_mirror()} {suite} main\n")
    (tmp / "apt.conf").write_text("\n".join([
        f'Dir::State "{tmp}/state";', f'Dir::State::status "{tmp}/status";', f'Dir::Cache "{tmp}/cache";',
        f'Dir::Etc::SourceList "{tmp}/sources.list";', f'Dir::Etc::SourceParts "{tmp}/parts";',
        f'Dir::Etc::Parts "{tmp}/parts";', f'Dir::Etc::PreferencesParts "{tmp}/prefs";',
        'APT::Architecture "amd64";', 'Acquire::Languages "none";', 'Debug::NoLocking "true";',
        'APT::Sandbox::User "root";', ""]))
    env = dict(os.environ, APT_CONFIG=str(tmp / "apt.conf"))
    return subprocess.run(["apt-get", *args], capture_output=True, text=True, env=env, check=False)


@pytest.mark.parametrize("suite", SUITES)
def test_real_apt_resolves_the_roles_install_and_refuses_docker_io_beside_it(
    built: dict[str, Path], suite: str, tmp_path: Path
) -> None:
    update = _apt(suite, built[suite], tmp_path, "update")
    assert update.returncode == 0 and "W:" not in update.stdout + update.stderr, update.stdout + update.stderr
    install = _apt(suite, built[suite], tmp_path, "-s", "install", *docker_engine.DOCKER_CE)
    assert install.returncode == 0, install.stdout + install.stderr
    for name in NAMES:
        assert f"Inst {name} ({dockerrepo.version(name, suite)} " in install.stdout
    assert "Inst docker.io " not in install.stdout and "Inst containerd " not in install.stdout
    both = _apt(suite, built[suite], tmp_path, "-s", "install", "docker-ce", "docker.io")
    assert both.returncode != 0 and "conflicts" in (both.stdout + both.stderr).lower()
