"""Host faults on one fresh SIMULATED rig, injected at a fixed moment of a real deploy.

1. The rig REBOOTS in the middle of the driver install: a hard reboot (`systemctl reboot --force
   --force` inside it, the reset button) from a one-shot dpkg pre-invoke hook, the moment apt calls
   dpkg to configure while nvidia-open and the driver packages it pulled are unpacked but not
   configured (the nvidia_driver role's `apt-get install nvidia-open=...`); the sandbox supervisor
   boots it again. The re-run
   finishes the interrupted dpkg run and converges: no half-installed package, driver holds
   complete, both GPUs seen; a further run changes nothing.
2. POWER IS CUT during the image build of a re-pin (`manager.power_off` the moment `docker build`
   of the new pin set's image runs on the rig; powered on by the test). After power-on the previous
   release serves again (Docker restarts it), no image carries the new tag, no build was recorded,
   the ledger still names the previous release with no new attempt; the next deploy builds the image
   (one line in the build ledger), swaps, passes its gate and the ledger records the swap.
3. The pinned base-image TAG HAS VANISHED UPSTREAM: the rig reaches no upstream registry at all
   (the sandbox has none: every pull from upstream fails, as for a tag deleted there), and the fleet
   registry holds the pinned base by digest only (the test pushes the base it loaded from the
   archive to the fleet registry and takes the pin's digest from the registry's answer). A pin set
   with that digest and no archive deploys with the registry's copy, pulled BY DIGEST, and serves;
   a pin set whose digest neither has is refused with the message that names the fix, nothing
   stopped, no swap attempted. No pull ever names the bare tag.

For the power cut the host watches the rig's processes through /proc (the rig's PID namespace):
`docker build` runs for seconds, a poll catches it. Run under the slot wrapper:
    /work/coord/e2e pytest tests/sandbox/test_host_faults.py
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.error
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from rigfleet import render
from rigfleet.loader import load_fleet
from rigfleet.release import resolve
from rigfleet.rigstate import BUILDS_LEDGER
from rigfleet_sandbox import manager
from rigfleet_sandbox.layout import RigSpec
from rigfleet_sandbox.supervisor import read_boots, read_state
from tests import REPO_ROOT

from .conftest import Sandbox, chat_completion, group_pinset, module_inventory

RIG = "rig-01"
SANDBOX_RIGS = 1
SANDBOX_FRESH = True  # the reboot hits the first converge, where apt installs the driver
HOST_LAYER = "tests/sandbox/host_layer_deploy.py"
DEPLOY_TIMEOUT_S = 1800
SEEN_TIMEOUT_S = 900
HALT_TIMEOUT_S = 180  # fault -> pyinfra exits; longer is a hang (a silent rig is noticed in ~60 s)
BACK_TIMEOUT_S = 180
SERVE_AGAIN_TIMEOUT_S = 300
DRIVER_HELD = {"nvidia-driver-pinning-580", "nvidia-open", "nvidia-kernel-open-dkms", "nvidia-driver-cuda"}
LEDGER = "/var/lib/rigfleet/ledger.json"
REBOOT_HOOK = "/run/rigfleet-test-reboot-hook.sh"  # tmpfs: gone with the reboot
REBOOT_HOOK_CONF = "/etc/dpkg/dpkg.cfg.d/zz-rigfleet-test-reboot"
REBOOT_MARKER = "/var/lib/rigfleet-test-reboot.marker"
REBOOT_HOOK_SOURCE = f"""#!/bin/sh
[ "${{DPKG_HOOK_ACTION:-}}" = configure ] || exit 0
case "$(dpkg-query -W -f '${{db:Status-Abbrev}}' nvidia-open 2>/dev/null)" in iU*) ;; *) exit 0;; esac
rm -f {REBOOT_HOOK_CONF}
dpkg-query -W -f '${{db:Status-Abbrev}} ${{Package}}\\n' 'nvidia*' > {REBOOT_MARKER}.part
mv {REBOOT_MARKER}.part {REBOOT_MARKER}
systemctl reboot --force --force
sleep 60
"""
OTHER_PINSET = "sandbox-b"
API_KEY = "sk-rigfleet-hostfaults-" + os.urandom(8).hex()
KEY_ENV = "RIGFLEET_HOSTFAULTS_API_KEY"

pytestmark = pytest.mark.sandbox
seen: dict[str, Any] = {}


def pinset_a(sandbox: Sandbox) -> str:
    return group_pinset(sandbox)


@pytest.fixture(scope="module")
def inventory(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Path:
    assert pinset_a(sandbox) != OTHER_PINSET
    return module_inventory(sandbox, tmp_path_factory, pinsets=sorted({pinset_a(sandbox), OTHER_PINSET}))


def host_vars(sandbox: Sandbox, inventory: Path, **values: Any) -> None:
    base = {"gate_timeout_s": 120, "variant": "tq3-nomtp", "bind_address": sandbox.address(RIG),
            "api_key": {"env": KEY_ENV}}
    (inventory / "host_vars" / f"{RIG}.yml").write_text(yaml.safe_dump({**base, **values}))


def bin_path(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def env(inventory: Path) -> dict[str, str]:
    return {**os.environ, "RIGFLEET_INVENTORY": str(inventory), KEY_ENV: API_KEY, "COLUMNS": "200"}


def argv(deploy_file: str) -> list[str]:
    return [bin_path("pyinfra"), "-y", "--json", "inventory.py", deploy_file]


def deploy(inventory: Path, deploy_file: str = "deploy.py") -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv(deploy_file), cwd=REPO_ROOT, env=env(inventory), capture_output=True, text=True,
                          timeout=DEPLOY_TIMEOUT_S)
    print(f"$ pyinfra {deploy_file} -> exit {proc.returncode}\n{proc.stderr[-5000:]}")
    return proc


def changes(proc: subprocess.CompletedProcess[str]) -> int:
    return int(json.loads(proc.stdout)["results"]["totals"]["success"])


def rig(sandbox: Sandbox, command: str, check: bool = True) -> str:
    return sandbox.ssh(RIG, f"sudo sh -c {shlex.quote(command)}", check=check, timeout=300).stdout


def rig_init() -> int:
    init = next(s.init_pid for s in manager.status() if s.name == RIG)
    assert init, f"{RIG} is not running"
    return init


def boot_id(sandbox: Sandbox) -> str | None:
    proc = sandbox.ssh(RIG, "cat /proc/sys/kernel/random/boot_id", check=False, timeout=20)
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def rig_processes(init: int) -> list[list[bytes]]:
    """The argv of every process in the PID namespace of the rig whose init is `init`."""
    try:
        ns = os.readlink(f"/proc/{init}/ns/pid")
    except OSError:
        return []
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(entry / "ns" / "pid") == ns:
                found.append((entry / "cmdline").read_bytes().split(b"\0"))
        except OSError:
            continue
    return found


def install_reboot_hook(sandbox: Sandbox) -> None:
    """A dpkg hook on the rig that hard-reboots it once, the moment dpkg is invoked to configure while
    nvidia-open is unpacked but not configured (the driver packages half-installed); it removes
    itself first and leaves a marker with dpkg's view of the packages. Polling from the host is too
    slow for this: the stand-in packages unpack in milliseconds."""
    rig(sandbox, f"cat > {REBOOT_HOOK} <<'EOF'\n{REBOOT_HOOK_SOURCE}EOF\n"
                 f"chmod 0755 {REBOOT_HOOK}; rm -f {REBOOT_MARKER}; "
                 f"echo 'pre-invoke={REBOOT_HOOK}' > {REBOOT_HOOK_CONF}")


def rebooted_by_the_hook(_: int) -> str | None:
    marker = RigSpec.from_name(RIG).root / REBOOT_MARKER.lstrip("/")
    try:
        return "dpkg about to configure, packages then:\n" + marker.read_text()
    except OSError:
        return None


def docker_building(tag: str) -> Callable[[int], str | None]:
    def building(init: int) -> str | None:
        for args in rig_processes(init):
            if len(args) > 2 and os.path.basename(args[0]) == b"docker" and args[1] == b"build" \
                    and tag.encode() in args:
                return b" ".join(args).decode(errors="replace").strip()
        return None
    return building


def deploy_with_fault(inventory: Path, deploy_file: str, moment: Callable[[int], str | None],
                      inject: Callable[[int], None], tmp_path: Path) -> tuple[str, int, str]:
    """Start the deploy, `inject(rig init)` the moment `moment(rig init)` says; returns (what was
    running then, the deploy's exit status, its output). Fails if the moment never comes or the
    deploy is still running HALT_TIMEOUT_S after the fault."""
    init = rig_init()
    out_path = tmp_path / "deploy.out"
    with open(out_path, "wb") as out:
        proc = subprocess.Popen(argv(deploy_file), cwd=REPO_ROOT, env=env(inventory), stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        running = None
        deadline = time.monotonic() + SEEN_TIMEOUT_S
        while running is None and proc.poll() is None and time.monotonic() < deadline:
            running = moment(init)
            if running is None:
                time.sleep(0.02)
        assert running, f"the moment never came (deploy exit {proc.poll()}): {out_path.read_text()[-3000:]}"
        print(f"fault injected while the rig ran: {running}")
        inject(init)
        try:
            code = proc.wait(timeout=HALT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the deploy still runs {HALT_TIMEOUT_S} s after the fault (a hang)")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = out_path.read_text()
    print(f"deploy -> exit {code}\n{output[-4000:]}")
    return running, code, output


def test_reboot_in_the_middle_of_the_driver_install_then_a_rerun_converges(sandbox: Sandbox, inventory: Path,
                                                                          tmp_path: Path) -> None:
    host_vars(sandbox, inventory)
    booted = boot_id(sandbox)
    reboots = sum(1 for r in read_boots(RigSpec.from_name(RIG)) if r.get("exit") == 133)
    install_reboot_hook(sandbox)
    try:
        running, code, output = deploy_with_fault(inventory, HOST_LAYER, rebooted_by_the_hook, lambda _: None,
                                                  tmp_path)
    finally:
        sandbox.ssh(RIG, f"sudo rm -f {REBOOT_HOOK_CONF}", check=False, timeout=60)
    assert re.search(r"^iU\s+nvidia-open$", running, re.M), running  # unpacked, not configured
    assert code != 0 and "Traceback" not in output, output[-3000:]
    deadline = time.monotonic() + BACK_TIMEOUT_S
    while (now := boot_id(sandbox)) in (None, booted) and time.monotonic() < deadline:
        time.sleep(1)
    assert now not in (None, booted), f"{RIG} did not come back from its reboot"
    assert sum(1 for r in read_boots(RigSpec.from_name(RIG)) if r.get("exit") == 133) == reboots + 1
    left = rig(sandbox, "dpkg --audit; ls -A /var/lib/dpkg/updates; "
                        "dpkg-query -W -f '${db:Status-Abbrev} ${Package}\\n' 'nvidia*' 2>/dev/null; true", check=False)
    print(f"what the reboot left (dpkg --audit, pending updates, nvidia* states):\n{left}")
    audit = rig(sandbox, "dpkg --audit; ls -A /var/lib/dpkg/updates", check=False).strip()
    installed = rig(sandbox, "dpkg-query -W -f '${db:Status-Abbrev}' nvidia-open 2>/dev/null; true", check=False)
    assert audit or not installed.startswith("ii"), "the reboot came after the driver install (nothing interrupted)"

    rerun = deploy(inventory, HOST_LAYER)
    assert rerun.returncode == 0, "the re-run after the reboot failed (its log is above)"
    assert rig(sandbox, "dpkg --audit; ls -A /var/lib/dpkg/updates").strip() == ""
    states = rig(sandbox, "dpkg-query -W -f '${db:Status-Abbrev} ${Package}\\n' 'nvidia*' 2>/dev/null; true")
    # installed (held ones read "hi") or not installed: none half-installed
    assert all(line.startswith(("ii", "hi", "un")) for line in states.splitlines()), states
    assert set(rig(sandbox, "apt-mark showhold").split()) >= DRIVER_HELD
    leftovers = rig(sandbox, "find /etc /usr/lib/systemd -name '*.dpkg-new' -o -name '*.dpkg-tmp' 2>/dev/null; true")
    assert leftovers.strip() == ""
    assert rig(sandbox, "nvidia-smi -L").count("GPU ") == 2
    again = deploy(inventory, HOST_LAYER)
    assert again.returncode == 0 and changes(again) == 0, "a further run changes nothing"


def serving(sandbox: Sandbox) -> tuple[str, str]:
    """(release id, container id) of the one running rigfleet container."""
    out = rig(sandbox, "docker ps --filter label=io.rigfleet.release --format "
                       "'{{.Label \"io.rigfleet.release\"}} {{.ID}}'").split()
    assert len(out) == 2, out
    return out[0], out[1]


def ledger(sandbox: Sandbox) -> dict[str, Any]:
    return dict(json.loads(rig(sandbox, f"cat {LEDGER}")))


def port(inventory: Path) -> int:
    fleet = load_fleet(inventory)
    return resolve(fleet, fleet.rig(RIG)).port


def answers_within(sandbox: Sandbox, inventory: Path, seconds: float) -> str:
    deadline = time.monotonic() + seconds
    while True:
        try:
            return chat_completion(sandbox.address(RIG), port(inventory), API_KEY, max_tokens=20)
        except (OSError, urllib.error.URLError):
            if time.monotonic() > deadline:
                raise
            time.sleep(3)


def builds_of(sandbox: Sandbox, tag: str) -> int:
    lines = rig(sandbox, f"cat {BUILDS_LEDGER} 2>/dev/null; true").splitlines()
    return sum(1 for line in lines if line.strip() and json.loads(line)["tag"] == tag)


@pytest.fixture(scope="module")
def serving_a(sandbox: Sandbox, inventory: Path) -> str:
    """The rig serving pin set A after one full deploy; its release id."""
    host_vars(sandbox, inventory, pinset=pinset_a(sandbox))
    rig(sandbox, "mkdir -p /srv/models/chat-templates && { [ -s /srv/models/chat-templates/froggeric.jinja ] || "
                 "echo '{{ messages }}' > /srv/models/chat-templates/froggeric.jinja; }")
    proc = deploy(inventory)
    assert proc.returncode == 0, "the full deploy failed (its log is above)"
    release, _ = serving(sandbox)
    assert ledger(sandbox)["current"]["release_id"] == release
    return release


def test_power_cut_during_the_image_build_then_the_previous_release_serves_and_the_next_deploy_swaps(
        sandbox: Sandbox, inventory: Path, serving_a: str, tmp_path: Path) -> None:
    before = ledger(sandbox)
    release, container = serving(sandbox)
    assert release == serving_a
    tag = render.image_tag(load_fleet(inventory).pinsets[OTHER_PINSET])
    assert rig(sandbox, f"docker image inspect {shlex.quote(tag)} >/dev/null 2>&1 && echo yes || echo no").strip() \
        == "no", "the new pin set's image must still be built"
    host_vars(sandbox, inventory, pinset=OTHER_PINSET)

    def cut(_: int) -> None:
        time.sleep(1)  # a second into the build: the context sent, a step running
        manager.power_off(RIG, log=print)

    try:
        running, code, output = deploy_with_fault(inventory, "deploy.py", docker_building(tag), cut, tmp_path)
        assert read_state(RigSpec.from_name(RIG)).get("state") == "stopped", f"{RIG} did not stay off"
    finally:
        if read_state(RigSpec.from_name(RIG)).get("state") == "stopped":
            manager.power_on(RIG, log=print)
    assert code != 0 and "Traceback" not in output, output[-3000:]
    print(f"the power cut hit: {running}")

    # powered on: the previous release serves again (Docker restarts it), nothing half-built is tagged
    assert "Paris" in answers_within(sandbox, inventory, SERVE_AGAIN_TIMEOUT_S)
    assert serving(sandbox)[0] == release
    assert rig(sandbox, f"docker image inspect {shlex.quote(tag)} >/dev/null 2>&1 && echo yes || echo no").strip() \
        == "no", "a cut build left an image under the new tag"
    assert builds_of(sandbox, tag) == 0
    after_cut = ledger(sandbox)
    assert after_cut["current"] == before["current"] and after_cut["attempts"] == before["attempts"], after_cut

    # the next deploy builds the image, swaps and the ledger records the swap
    proc = deploy(inventory)
    assert proc.returncode == 0, "the deploy after power-on failed (its log is above)"
    assert builds_of(sandbox, tag) == 1
    new_release, _ = serving(sandbox)
    book = ledger(sandbox)
    assert new_release != release and book["current"]["release_id"] == new_release, book["current"]
    assert book["current"]["pinset"] == OTHER_PINSET
    assert book["attempts"][-1]["result"] == "passed" and len(book["attempts"]) == len(before["attempts"]) + 1
    assert "Paris" in answers_within(sandbox, inventory, 60)
    assert container not in rig(sandbox, "docker ps -q")


def base_pinset(inventory: Path, name: str, digest: str) -> dict[str, Any]:
    """OTHER_PINSET with the base image by `digest` and no archive, written into the inventory as `name`."""
    path = inventory / "pinsets.yml"
    pinsets = yaml.safe_load(path.read_text())
    pin = json.loads(json.dumps(pinsets[OTHER_PINSET]))
    pin["base_image"] = {"repository": pin["base_image"]["repository"], "tag": pin["base_image"]["tag"],
                         "digest": digest}
    pinsets[name] = pin
    path.write_text(yaml.safe_dump(pinsets))
    return pin


def test_a_base_tag_gone_upstream_comes_from_the_fleet_registry_by_digest_or_is_refused(
        sandbox: Sandbox, inventory: Path, serving_a: str) -> None:
    fleet = load_fleet(inventory)
    registry = fleet.rig(RIG).registry
    assert registry, "the sandbox inventory names a fleet registry"
    base = fleet.pinsets[OTHER_PINSET].base_image
    ref, mirror = f"{base.repository}:{base.tag}", f"{registry}/{base.repository}:{base.tag}"
    # the fleet registry gets the pinned base (as an operator mirrors it); its digest is the registry's
    # on the rig since the power-cut test's re-pin; run alone, loaded here from the pin set's archive
    rig(sandbox, f"docker image inspect {shlex.quote(ref)} >/dev/null 2>&1 || "
                 f"curl -fsS {shlex.quote(str(base.archive))} | docker load -q")
    rig(sandbox, f"docker tag {shlex.quote(ref)} {shlex.quote(mirror)} && docker push -q {shlex.quote(mirror)}")
    digests = rig(sandbox, "docker image inspect --format '{{range .RepoDigests}}{{.}} {{end}}' "
                           + shlex.quote(mirror)).split()
    [digest] = {d.split("@", 1)[1] for d in digests if d.startswith(f"{registry}/{base.repository}@")}
    # ... and the rig forgets it, so the deploy must fetch it (the built images keep their layers)
    image_id = rig(sandbox, f"docker image inspect --format '{{{{.Id}}}}' {shlex.quote(ref)}").strip()
    rig(sandbox, f"docker rmi -f {image_id} >/dev/null")
    assert rig(sandbox, f"docker image inspect {shlex.quote(ref)} >/dev/null 2>&1 && echo yes || echo no").strip() \
        == "no"
    before = ledger(sandbox)

    # neither the registry nor upstream has the digest: refused clearly, nothing stopped
    base_pinset(inventory, "sandbox-gone", "sha256:" + os.urandom(32).hex())
    host_vars(sandbox, inventory, pinset="sandbox-gone")
    refused = deploy(inventory)
    out = refused.stdout + refused.stderr
    assert refused.returncode != 0 and "Traceback" not in out
    assert "is in neither the fleet registry" in out and f"never replaced by what the tag {base.tag} means now" \
        in out, out[-3000:]
    assert RIG in out
    assert ledger(sandbox)["attempts"] == before["attempts"] and serving(sandbox)[0] == before["current"]["release_id"]
    assert "Paris" in answers_within(sandbox, inventory, 60)

    # the registry holds the digest: the deploy uses its copy by digest and swaps
    base_pinset(inventory, "sandbox-mirrored", digest)
    host_vars(sandbox, inventory, pinset="sandbox-mirrored")
    proc = deploy(inventory)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, "the deploy from the registry's copy failed (its log is above)"
    book = ledger(sandbox)
    assert book["current"]["pinset"] == "sandbox-mirrored" and book["attempts"][-1]["result"] == "passed"
    tag = render.image_tag(load_fleet(inventory).pinsets["sandbox-mirrored"])
    logs = rig(sandbox, "cat /var/log/rigfleet/image-build-*.log 2>/dev/null; true")  # `say` lines land there
    print(f"build logs:\n{logs[-3000:]}")
    assert f"base image: {registry}/{base.repository}@{digest} from the fleet registry" in logs + out
    pulls = [line for line in (logs + out).splitlines() if "docker pull" in line]
    assert pulls and all("@sha256:" in line for line in pulls), pulls  # never the bare tag
    repo_digests = rig(sandbox, "docker image inspect --format '{{range .RepoDigests}}{{.}} {{end}}' "
                                + shlex.quote(ref))
    assert f"@{digest}" in repo_digests, repo_digests
    assert rig(sandbox, f"docker image inspect {shlex.quote(tag)} >/dev/null && echo yes").strip() == "yes"
    assert "Paris" in answers_within(sandbox, inventory, 60)
