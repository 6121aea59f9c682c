"""The fleet's download cache on two SIMULATED rigs: rig-01 in the `cache` group runs Debian's
apt-cacher-ng (installed by the fleet_cache role from the archive the rigs use), every rig's apt
goes through it, and the stand-in upstream's own byte counter (rigfleet_sandbox.upstreamlog: the
host's apt proxy, its www server with the SIMULATED NVIDIA and Docker repositories) shows the 2nd
rig pulling none of the package bytes the 1st already pulled. A second converge changes nothing;
a cache that does not answer stops the 2nd rig's apt with the rig, the cache and the fix, and
converging the cache host first repairs it. The weights, both rigs in one run: the cache host
downloads them, the other rig takes them from its apt-cacher-ng (LocalDirs), none from upstream.
The GPU smoke image comes from the sandbox's stand-in upstream registry (a SIMULATED image, TLS,
counted as upstream bytes): the 1st rig pulls it and pushes the fleet registry's copy, the 2nd
pulls the copy; a new image for both rigs in one run is pulled from upstream once.

Host layer only (tests/sandbox/host_layer_deploy.py): the packages are all there is to cache.
/work/coord/e2e .venv/bin/pytest -q -p no:cacheprovider -m sandbox tests/sandbox/test_fleet_cache.py
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from rigfleet_sandbox import upstream_registry, upstreamlog
from rigfleet_sandbox.layout import REGISTRY_PORT, SERVICE_ADDR
from tests import REPO_ROOT

from .conftest import Sandbox, group_pinset, module_inventory

SANDBOX_RIGS = 2
SANDBOX_FRESH = True  # rigs nothing was deployed to: every package is downloaded once
CACHE, OTHER = "rig-01", "rig-02"
DEPLOY = "tests/sandbox/host_layer_deploy.py"
WEIGHTS_DEPLOY = "tests/sandbox/weights_deploy.py"
DEPLOY_TIMEOUT_S = 1800
ACNG_PORT = 3142  # catalog/fleet_cache.yaml's port
# SIMULATED stand-ins of rigfleet's default smoke image and of another tag, in the stand-in upstream registry
SMOKE_REPOSITORY = upstream_registry.DEFAULT_REPOSITORY
SMOKE_TAGS = (upstream_registry.DEFAULT_TAG, "13.0.2-runtime-ubuntu22.04")

pytestmark = pytest.mark.sandbox
seen: dict[str, Any] = {}


@pytest.fixture(scope="module")
def inventory(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Path:
    smoke = upstream_registry.seed_image(SMOKE_REPOSITORY, SMOKE_TAGS[0])
    copy = module_inventory(sandbox, tmp_path_factory, pinsets=[group_pinset(sandbox)],
                            group={"smoke_image": smoke})
    hosts = yaml.safe_load((copy / "hosts.yml").read_text())
    hosts["all"]["children"]["cache"] = {"hosts": {CACHE: None}}
    (copy / "hosts.yml").write_text(yaml.safe_dump(hosts, sort_keys=False))
    return copy


def pyinfra(inventory: Path, *limit: str, deploy_file: str = DEPLOY) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RIGFLEET_INVENTORY": str(inventory)}
    args = [a for rig in limit for a in ("--limit", rig)]
    proc = subprocess.run([str(Path(sys.executable).parent / "pyinfra"), "-y", "--json", *args, "inventory.py",
                           deploy_file],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=DEPLOY_TIMEOUT_S)
    print(proc.stderr[-6000:])
    return proc


def deploy(inventory: Path, *limit: str, deploy_file: str = DEPLOY) -> dict[str, Any]:
    proc = pyinfra(inventory, *limit, deploy_file=deploy_file)
    assert proc.returncode == 0, "the deploy failed (its log is above)"
    results = dict(json.loads(proc.stdout)["results"])
    assert results["failed_hosts"] == [] and results["totals"]["error"] == 0
    return results


def changed(results: dict[str, Any]) -> list[str]:
    return [" / ".join(o["names"]) for o in results["operations"] if o.get("success")]


def fleet_registry_tags(repository: str) -> list[str]:
    """The tags of `repository` in the sandbox's fleet registry (plain HTTP, not upstream)."""
    url = f"http://{SERVICE_ADDR}:{REGISTRY_PORT}/v2/{repository}/tags/list"
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:  # noqa: S310 (the sandbox's own address)
            return list(json.load(answer).get("tags") or [])
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return []
        raise


def smoke_stamp(rig: str, sandbox: Sandbox) -> str:
    return sandbox.ssh(rig, "sudo cat /var/lib/rigfleet/gpu-smoke").stdout


def test_first_rig_fills_the_cache(sandbox: Sandbox, inventory: Path) -> None:
    since = upstreamlog.mark()
    deploy(inventory, CACHE)
    entries = upstreamlog.records(since=since)
    pulled = upstreamlog.pulled(entries, [sandbox.address(CACHE)])
    print("upstream bytes pulled by rig 1:", pulled)
    seen["rig1"] = pulled
    seen["rig1_packages"] = upstreamlog.files(entries, [sandbox.address(CACHE)])
    assert pulled["package"] > 0 and "apt-cacher-ng" in " ".join(seen["rig1_packages"])
    assert sandbox.ssh(CACHE, "systemctl is-active apt-cacher-ng").stdout.strip() == "active"
    conf = sandbox.ssh(CACHE, "cat /etc/apt/apt.conf.d/99rigfleet-lock-timeout").stdout
    assert f'Acquire::http::Proxy "http://{sandbox.address(CACHE)}:{ACNG_PORT}";' in conf
    assert "DIRECT" not in conf, "the fleet's own http repositories go through the cache too"
    # the GPU smoke image: from its own (stand-in upstream) registry, its copy pushed to the fleet's
    assert pulled["image"] > 0, "rig 1 did not pull the smoke image from its upstream registry"
    assert SMOKE_TAGS[0] in fleet_registry_tags(SMOKE_REPOSITORY)
    assert f"image={upstream_registry.ref(SMOKE_REPOSITORY, SMOKE_TAGS[0])} " in smoke_stamp(CACHE, sandbox)


def test_second_rig_pulls_none_of_the_package_bytes_the_first_pulled(sandbox: Sandbox, inventory: Path) -> None:
    since = upstreamlog.mark()
    deploy(inventory, OTHER)
    entries = upstreamlog.records(since=since)
    both = [sandbox.address(CACHE), sandbox.address(OTHER)]
    # what reached upstream while rig 2 converged, whoever asked (rig 2, or the cache on its behalf)
    pulled = upstreamlog.pulled(entries, both)
    again = upstreamlog.files(entries, both) & seen["rig1_packages"]
    print("upstream bytes pulled during rig 2's converge:", pulled, "of rig 1's packages again:", sorted(again))
    assert again == set(), "packages the first rig pulled were pulled from upstream again"
    own = upstreamlog.pulled(entries, [sandbox.address(OTHER)])
    assert own["package"] == own["index"] == 0, f"rig 2's apt reached upstream itself, not through the cache: {own}"
    # its smoke image is the fleet registry's copy: no image byte from upstream, and the test passed
    assert pulled["image"] == 0, f"the smoke image was pulled from upstream again: {pulled}"
    assert f"image={upstream_registry.ref(SMOKE_REPOSITORY, SMOKE_TAGS[0])} " in smoke_stamp(OTHER, sandbox)
    conf = sandbox.ssh(OTHER, "cat /etc/apt/apt.conf.d/99rigfleet-lock-timeout").stdout
    assert f'Acquire::http::Proxy "http://{sandbox.address(CACHE)}:{ACNG_PORT}";' in conf and "Pre-Invoke" in conf
    installed = sandbox.ssh(OTHER, "dpkg-query -W -f '${Package}\\n'").stdout.split()
    assert "apt-cacher-ng" not in installed and "nvidia-open" in installed


def test_second_converge_changes_nothing(inventory: Path) -> None:
    results = deploy(inventory)
    assert results["totals"]["success"] == 0, f"changed on converged rigs: {changed(results)}"


def test_new_smoke_image_for_both_rigs_in_one_run_is_pulled_from_upstream_once(
        sandbox: Sandbox, inventory: Path) -> None:
    smoke = upstream_registry.seed_image(SMOKE_REPOSITORY, SMOKE_TAGS[1])
    path = inventory / "group_vars" / "all.yml"  # the module's own inventory: the later tests keep it
    path.write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()), "smoke_image": smoke}))
    since = upstreamlog.mark()
    results = deploy(inventory)  # both rigs: the smoke test is due on each (a new image)
    entries = upstreamlog.records(since=since)
    pulled = {rig: upstreamlog.pulled(entries, [sandbox.address(rig)])["image"] for rig in (CACHE, OTHER)}
    print("smoke image bytes pulled from upstream:", pulled, "changed:", changed(results))
    assert pulled[CACHE] > 0 and pulled[OTHER] == 0, pulled
    assert SMOKE_TAGS[1] in fleet_registry_tags(SMOKE_REPOSITORY)
    for rig in (CACHE, OTHER):
        assert f"image={smoke} " in smoke_stamp(rig, sandbox)
    assert deploy(inventory)["totals"]["success"] == 0


def test_cache_down_stops_apt_with_the_fix_and_converging_the_cache_host_repairs(
        sandbox: Sandbox, inventory: Path) -> None:
    sandbox.ssh(CACHE, "sudo systemctl stop apt-cacher-ng")
    # a package of the host layer gone from rig 2: its converge must download again
    sandbox.ssh(OTHER, "sudo dpkg -r curl", timeout=300)
    proc = pyinfra(inventory, OTHER)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    # the check's own line (not only apt's quote of the command that failed)
    line = rf"^.*\] rigfleet: {OTHER} downloads its packages through the fleet cache on {CACHE} .*$"
    said = re.search(line, out, re.M)
    assert said, out[-4000:]
    assert f"Fix: converge {CACHE} first" in said.group(0)

    deploy(inventory, CACHE)  # the fix: the cache host's converge starts apt-cacher-ng again
    assert sandbox.ssh(CACHE, "systemctl is-active apt-cacher-ng").stdout.strip() == "active"
    repaired = deploy(inventory, OTHER)
    assert changed(repaired), "curl reinstalled"
    assert sandbox.ssh(OTHER, "command -v curl").returncode == 0
    assert deploy(inventory)["totals"]["success"] == 0


def test_weights_go_from_the_cache_host_to_the_other_rig(sandbox: Sandbox, inventory: Path) -> None:
    since = upstreamlog.mark()
    deploy(inventory, deploy_file=WEIGHTS_DEPLOY)  # both rigs in one run, neither has the weights yet
    # the weights files (the chat templates beside them come from the rig's own source, as before)
    records = [e for e in upstreamlog.records(since=since) if int(str(e["bytes"]))
               and "/weights/" in str(e["url"]) and "/chat-templates/" not in str(e["url"])]
    pulled = {rig: sorted(str(e["url"]) for e in records if e["client"] == sandbox.address(rig))
              for rig in (CACHE, OTHER)}
    print("weights files pulled from upstream:", pulled)
    assert pulled[CACHE], "the cache host downloads the weights from their source"
    assert pulled[OTHER] == [], "the other rig pulled weights from upstream instead of from the cache host"
    listing = "cd /srv/models && cat .rigfleet/*.SHA256SUMS && find . -path ./.rigfleet -prune -o -type f -print0 " \
              "| sort -z | xargs -0 sha256sum"
    sums = {rig: sandbox.ssh(rig, listing).stdout for rig in (CACHE, OTHER)}
    assert sums[OTHER].strip() and sums[OTHER] == sums[CACHE]
    assert deploy(inventory, deploy_file=WEIGHTS_DEPLOY)["totals"]["success"] == 0
