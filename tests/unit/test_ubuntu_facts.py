"""Ubuntu facts (catalog/ubuntu_facts.yaml) against what the plan goldens use and the catalog says:
every Ubuntu package and repository fact in tests/plan/golden/host-layer/fresh-ubuntu-* is listed
with a public page, and the file agrees with platforms.yaml and repos.yaml."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from rigfleet import catalog
from tests import REPO_ROOT

FACTS_FILE = REPO_ROOT / "rigfleet" / "catalog" / "ubuntu_facts.yaml"
FACTS = yaml.safe_load(FACTS_FILE.read_text(encoding="utf-8"))
GOLDENS = sorted((REPO_ROOT / "tests" / "plan" / "golden" / "host-layer").glob("fresh-ubuntu-*.txt"))
PAGE = re.compile(r"^https://(packages\.ubuntu\.com|launchpad\.net|help\.ubuntu\.com|docs\.docker\.com|docs\.nvidia\.com)/")


def golden_facts(text: str) -> dict[str, set[str]]:
    """Package names (installed or held), source URIs/suites/components, key URLs, fingerprints."""
    packages: set[str] = set()
    for line in text.splitlines():
        if line.startswith("run: ") and "apt-get" in line and " install " in line:
            packages.update(w.split("=")[0] for w in line.split("--allow-downgrades", 1)[1].split())
        elif line.startswith("run: apt-mark hold "):
            packages.update(line.removeprefix("run: apt-mark hold ").split())
    field = {k: set(re.findall(rf"^\s*\| {k}: (.+)$", text, re.M)) for k in ("URIs", "Suites", "Components")}
    return {
        "packages": packages,
        "uris": field["URIs"],
        "suites": field["Suites"],
        "components": {c for line in field["Components"] for c in line.split()},
        "key_urls": set(re.findall(r'curl -fsSL --retry 3 -o "\$d/key" (\S+);', text)),
        "fingerprints": set(re.findall(r"gpg --batch --export ([0-9A-F]{40})", text)),
    }


def release_of(golden: Path) -> str:
    match = re.match(r"fresh-(ubuntu-\d\d\.\d\d)-", golden.name)
    assert match, golden.name
    return match.group(1)


def listed_packages(release: str) -> set[str]:
    entry = FACTS["releases"][release]
    names = {n.replace("{abi}", entry["kernel_abi_example"]) for n in entry["archive"]}
    for repo in FACTS["vendor_repositories"].values():
        names.update(repo["packages"])
    return names


def test_there_are_ubuntu_goldens_for_both_releases_and_both_docker_paths() -> None:
    assert {g.name for g in GOLDENS} >= {
        f"fresh-ubuntu-{v}-{d}.txt" for v in ("22.04", "24.04") for d in ("distro", "docker-ce")
    }


@pytest.mark.parametrize("golden", GOLDENS, ids=lambda g: g.stem)
def test_every_ubuntu_package_and_repository_fact_in_the_golden_is_listed(golden: Path) -> None:
    release = release_of(golden)
    used = golden_facts(golden.read_text(encoding="utf-8"))
    assert used["packages"], "the golden installs packages: the parser must find them"
    assert used["packages"] <= listed_packages(release), (
        f"not in ubuntu_facts.yaml: {sorted(used['packages'] - listed_packages(release))}")
    repos = FACTS["vendor_repositories"].values()
    assert used["uris"] <= {r["url"] for r in repos}
    assert used["suites"] <= {r["suites"][release] for r in repos}
    assert used["components"] <= {c for r in repos for c in r["components"]}
    assert used["key_urls"] <= {r["key_url"] for r in repos}
    assert used["fingerprints"] <= {r["key_fingerprint"] for r in repos}


def test_every_fact_names_a_public_page() -> None:
    for release, entry in FACTS["releases"].items():
        for name, page in entry["archive"].items():
            assert PAGE.match(page), (release, name, page)
            if "packages.ubuntu.com/" in page and "search?" not in page:
                suite, package = page.rstrip("/").split("/")[-2:]
                assert suite.split("-")[0] == entry["codename"] and package == name, (release, name, page)
        assert PAGE.match(entry["components"]["source"])
    for name, repo in FACTS["vendor_repositories"].items():
        assert PAGE.match(repo["source"]), name


@pytest.mark.parametrize("release", ["ubuntu-22.04", "ubuntu-24.04"])
def test_the_file_agrees_with_platforms_yaml(release: str) -> None:
    platform = catalog.platforms()["platforms"][release]
    entry = FACTS["releases"][release]
    assert entry["codename"] == platform["codename"]
    assert entry["components"]["value"] == platform["components"]
    kernel = platform["kernel"]
    assert {kernel["image"], kernel["headers"], kernel["meta"]} <= set(entry["archive"])
    assert set(platform["docker_distro"]["packages"]) <= set(entry["archive"])
    assert FACTS["vendor_repositories"]["docker"]["suites"][release] == platform["codename"]


def test_the_file_agrees_with_repos_yaml() -> None:
    repos = catalog.repos()
    docker = FACTS["vendor_repositories"]["docker"]
    ubuntu = repos["docker"]["ubuntu"]
    assert (docker["url"], docker["key_url"]) == (ubuntu["url"], ubuntu["key_url"])
    assert docker["key_fingerprint"] == repos["docker"]["key_fingerprint"]
    toolkit = FACTS["vendor_repositories"]["toolkit"]
    assert {k: toolkit[k] for k in ("url", "key_url", "key_fingerprint")} == dict(repos["toolkit"])


def test_the_checker_sees_a_package_missing_from_the_file() -> None:
    text = GOLDENS[0].read_text(encoding="utf-8") + (
        "run: DEBIAN_FRONTEND=noninteractive apt-get -y install --allow-change-held-packages "
        "--allow-downgrades nvidia-driver-999\n")
    assert "nvidia-driver-999" in golden_facts(text)["packages"] - listed_packages(release_of(GOLDENS[0]))
