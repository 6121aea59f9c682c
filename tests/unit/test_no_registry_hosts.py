"""The repository spells out none of the package registries' hosts this machine uses: code reads
them from apt's sources and pip's configuration, tests use placeholders. The names are read here
the same way, so this file names none either."""

from __future__ import annotations

import subprocess

from rigfleet_sandbox.debindex import apt_hosts
from rigfleet_sandbox.pyindex import pip_default_hosts, python_index_hosts
from tests import REPO_ROOT


def registry_hosts() -> set[str]:
    return set(apt_hosts()) | {host for host, _ in python_index_hosts() | pip_default_hosts()}


def test_the_machine_names_registries_to_look_for() -> None:
    assert {host for host, _ in pip_default_hosts()}  # or the test below would pass vacuously


def test_no_tracked_file_names_a_registry_host() -> None:
    hosts = registry_hosts()
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True).stdout
    hits = []
    for name in filter(None, files.decode().split("\0")):
        path = REPO_ROOT / name
        if not path.is_file() or path.is_symlink():
            continue
        text = path.read_bytes().decode("utf-8", errors="replace").lower()
        hits += [f"{name}: a registry host" for host in hosts if host in text]
    assert not hits, "\n".join(hits)  # the host itself is not printed
