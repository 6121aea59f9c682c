"""The sandbox's SIMULATED NVIDIA stack: stand-in tools and the signed apt repositories.

The stand-in scripts are run directly, with their state under a temp dir
(RIGFLEET_SIM_NVIDIA_STATE_DIR, a test-only override). The last test installs the packages with
real apt inside a copy of a cached sandbox root (root only, marked `sandbox`).
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rigfleet_sandbox import aptrepo, debindex, layout

OLD, NEW = aptrepo.DRIVER_VERSIONS
IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(
    not IS_ROOT, reason="the simulated nvidia-smi, like the real one, needs root to set"
)

# Formats taken from the real nvidia-smi 580 output in shared/fixtures/nvidia-smi/h200-580.159.04.
FULL_QUERY = (
    "index,name,uuid,pci.bus_id,memory.total,memory.used,driver_version,persistence_mode,power.limit,"
    "power.min_limit,power.max_limit,power.default_limit,compute_cap,pstate,temperature.gpu"
)
REAL_HEADER = (
    "index, name, uuid, pci.bus_id, memory.total [MiB], driver_version, persistence_mode, power.limit [W], "
    "power.min_limit [W], power.max_limit [W], compute_cap"
)
UUID_RE = r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"

Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def sim(tmp_path: Path) -> dict[str, Path]:
    """Rendered stand-in tools in a temp bin dir, a temp state dir, a loaded 'module' at OLD."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, asset, version in (
        ("nvidia-smi", "bin/nvidia-smi", OLD),
        ("nvidia-smi-new", "bin/nvidia-smi", NEW),
        ("nvidia-ctk", "bin/nvidia-ctk", OLD),
        ("nvidia-container-runtime-hook", "bin/nvidia-container-hook", OLD),
        ("nvidia-cdi-hook", "bin/nvidia-container-hook", OLD),
        ("nvidia-container-cli", "bin/nvidia-container-cli", OLD),
    ):
        path = bin_dir / name
        path.write_bytes(aptrepo.render_asset(asset, version))
        path.chmod(0o755)
    state = tmp_path / "state"
    state.mkdir()
    (state / "module-version").write_text(OLD + "\n")
    return {"bin": bin_dir, "state": state, "tmp": tmp_path}


@pytest.fixture
def run(sim: dict[str, Path]) -> Run:
    def _run(tool: str, *args: str, stdin: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
        full_env = dict(
            os.environ,
            PATH=f"{sim['bin']}:{os.environ.get('PATH', '')}",
            RIGFLEET_SIM_NVIDIA_STATE_DIR=str(sim["state"]),
            RIGFLEET_SIM_NVIDIA_SMI=str(sim["bin"] / "nvidia-smi"),
            **env,
        )
        return subprocess.run(
            [sys.executable, str(sim["bin"] / tool), *args],
            capture_output=True,
            text=True,
            env=full_env,
            input=stdin,
            check=False,
        )

    return _run


# ------------------------------------------------------------------------------------- nvidia-smi


def test_no_module_loaded_fails_like_no_driver(run: Run, sim: dict[str, Path]) -> None:
    (sim["state"] / "module-version").unlink()
    res = run("nvidia-smi", "-L")
    assert res.returncode == 9
    assert "couldn't communicate with the NVIDIA driver" in res.stdout


def test_query_gpu_csv_matches_the_real_format(run: Run) -> None:
    query = "index,name,uuid,pci.bus_id,memory.total,driver_version,persistence_mode,power.limit,"
    query += "power.min_limit,power.max_limit,compute_cap"
    res = run("nvidia-smi", f"--query-gpu={query}", "--format=csv")
    assert res.returncode == 0, res.stdout
    lines = res.stdout.splitlines()
    assert lines[0] == REAL_HEADER
    assert len(lines) == 3
    row = lines[1].split(", ")
    assert row[:2] == ["0", "NVIDIA GeForce RTX 3090"]
    assert re.fullmatch(UUID_RE, row[2])
    assert row[3:] == [
        "00000000:01:00.0",
        "24576 MiB",
        OLD,
        "Disabled",
        "350.00 W",
        "100.00 W",
        "350.00 W",
        "8.6",
    ]
    assert lines[2].split(", ")[3] == "00000000:02:00.0"


def test_sm_clock_query_answers_like_the_real_one(run: Run) -> None:
    # the live view's query (rigfleet.live): clocks.sm is the real tool's alias of clocks.current.sm
    res = run("nvidia-smi", "--query-gpu=clocks.sm", "--format=csv")
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["clocks.current.sm [MHz]", "210 MHz", "210 MHz"]  # idle: P8
    bare = run("nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits")
    assert bare.stdout.split() == ["210", "210"]


def test_query_gpu_noheader_nounits(run: Run) -> None:
    res = run("nvidia-smi", f"--query-gpu={FULL_QUERY}", "--format=csv,noheader,nounits")
    assert res.returncode == 0
    rows = [line.split(", ") for line in res.stdout.splitlines()]
    assert len(rows) == 2
    for i, row in enumerate(rows):
        assert row[0] == str(i)
        assert row[4:] == [
            "24576",
            "0",
            OLD,
            "Disabled",
            "350.00",
            "100.00",
            "350.00",
            "350.00",
            "8.6",
            "P8",
            row[-1],
        ]
        assert row[-1].isdigit()  # temperature.gpu never carries a unit


def test_query_gpu_unknown_field_and_selection(run: Run) -> None:
    res = run("nvidia-smi", "--query-gpu=index,bogus", "--format=csv")
    assert res.returncode == 2
    assert res.stdout.startswith('Field "bogus" is not a valid field to query.')
    one = run("nvidia-smi", "-i", "1", "--query-gpu=index,pci.bus_id", "--format=csv,noheader")
    assert one.stdout == "1, 00000000:02:00.0\n"
    assert run("nvidia-smi", "-i", "5", "-L").returncode == 6


def test_list_gpus_uuids_distinct_and_stable(run: Run) -> None:
    first = run("nvidia-smi", "-L").stdout
    lines = first.splitlines()
    assert len(lines) == 2
    uuids = []
    for i, line in enumerate(lines):
        m = re.fullmatch(rf"GPU {i}: NVIDIA GeForce RTX 3090 \(UUID: ({UUID_RE})\)", line)
        assert m, line
        uuids.append(m.group(1))
    assert uuids[0] != uuids[1]
    assert run("nvidia-smi", "-L").stdout == first
    by_uuid = run("nvidia-smi", "-i", uuids[1], "--query-gpu=index", "--format=csv,noheader")
    assert by_uuid.stdout == "1\n"


def test_power_limit_outside_range_is_refused(run: Run) -> None:
    for watts in ("400", "99.5"):
        res = run("nvidia-smi", "-pl", watts)
        assert res.returncode == 2
        assert res.stdout == (
            f"Provided power limit {float(watts):.2f} W is not a valid power limit which should be between "
            "100.00 W and 350.00 W for GPU 00000000:01:00.0\nTerminating early due to previous errors.\n"
        )
    limits = run("nvidia-smi", "--query-gpu=power.limit", "--format=csv,noheader").stdout
    assert limits == "350.00 W\n350.00 W\n"


@needs_root
def test_power_limit_and_persistence_are_remembered(run: Run) -> None:
    res = run("nvidia-smi", "-i", "1", "-pl", "280")
    assert res.returncode == 0
    assert res.stdout.startswith("Warning: persistence mode is disabled on device 00000000:02:00.0.")
    assert (
        "Power limit for GPU 00000000:02:00.0 was set to 280.00 W from 350.00 W.\nAll done.\n" in res.stdout
    )
    pm = run("nvidia-smi", "-pm", "1")
    assert pm.stdout == (
        "Enabled persistence mode for GPU 00000000:01:00.0.\n"
        "Enabled persistence mode for GPU 00000000:02:00.0.\nAll done.\n"
    )
    again = run("nvidia-smi", "-pm", "1", "-i", "0")
    assert again.stdout == "Persistence mode is already Enabled for GPU 00000000:01:00.0.\nAll done.\n"
    q = run("nvidia-smi", "--query-gpu=persistence_mode,power.limit", "--format=csv,noheader,nounits")
    assert q.stdout == "Enabled, 350.00\nEnabled, 280.00\n"
    power = run("nvidia-smi", "-q", "-d", "POWER", "-i", "1").stdout
    assert "        Current Power Limit                            : 280.00 W\n" in power


def test_driver_library_mismatch(run: Run) -> None:
    # NEW user space (an upgraded nvidia-driver-cuda) against the OLD module still "loaded".
    for args in (["-L"], ["--query-gpu=driver_version", "--format=csv,noheader"], ["--version"], []):
        res = run("nvidia-smi-new", *args)
        assert res.returncode == 18
        new_nvml = ".".join(NEW.split(".")[:2])
        assert res.stdout == (
            f"Failed to initialize NVML: Driver/library version mismatch\nNVML library version: {new_nvml}\n"
        )


def test_version_table_topology_and_q(run: Run) -> None:
    version = run("nvidia-smi", "--version").stdout.splitlines()
    assert version[:4] == [
        f"NVIDIA-SMI version  : {OLD}",
        f"NVML version        : {'.'.join(OLD.split('.')[:2])}",
        f"DRIVER version      : {OLD}",
        "CUDA Version        : 13.0",
    ]
    table = run("nvidia-smi").stdout.splitlines()
    assert all(len(line) == 91 for line in table[1:] if line.startswith(("|", "+")))
    assert sum("NVIDIA GeForce RTX 3090" in line for line in table) == 2
    topo = run("nvidia-smi", "topo", "-m").stdout.splitlines()
    assert topo[0] == "\t\x1b[4mGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m"
    assert topo[1].split("\t")[:3] == ["GPU0", " X ", "PHB"]
    assert topo[2].split("\t")[:3] == ["GPU1", "PHB", " X "]
    assert "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)" in topo
    power = run("nvidia-smi", "-q", "-d", "POWER").stdout
    assert "Attached GPUs                                          : 2\n" in power
    assert "        Max Power Limit                                : 350.00 W\n" in power
    assert "    GPU Memory Power Readings \n" in power  # the real tool's trailing space
    apps = run("nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv")
    assert apps.stdout == "pid, used_gpu_memory [MiB]\n"


# ------------------------------------------------------------------------------------- toolkit


def test_ctk_runtime_configure_keeps_foreign_keys(run: Run, sim: dict[str, Path]) -> None:
    daemon = sim["tmp"] / "etc-docker" / "daemon.json"
    daemon.parent.mkdir()
    daemon.write_text('{"log-driver": "json-file", "runtimes": {"crun": {"path": "/usr/bin/crun"}}}\n')
    res = run("nvidia-ctk", "runtime", "configure", "--runtime=docker", f"--config={daemon}")
    assert res.returncode == 0, res.stderr
    assert "Wrote updated config to" in res.stderr
    first = daemon.read_text()
    data = json.loads(first)
    assert data["log-driver"] == "json-file"
    assert data["runtimes"] == {
        "crun": {"path": "/usr/bin/crun"},
        "nvidia": {"args": [], "path": "nvidia-container-runtime"},
    }
    assert first == json.dumps(data, indent=4, sort_keys=True)
    run("nvidia-ctk", "runtime", "configure", "--runtime=docker", f"--config={daemon}")
    assert daemon.read_text() == first  # a second run changes nothing
    dry = run("nvidia-ctk", "runtime", "configure", f"--config={daemon}", "--set-as-default", "--dry-run")
    assert json.loads(dry.stdout)["default-runtime"] == "nvidia"
    assert daemon.read_text() == first
    assert run("nvidia-ctk", "system", "create-dev-char-symlinks", "--create-all").returncode == 0


def test_ctk_cdi_generate_and_list(run: Run, sim: dict[str, Path]) -> None:
    spec_dir = sim["tmp"] / "cdi"
    res = run("nvidia-ctk", "cdi", "generate", f"--output={spec_dir}/nvidia.yaml")
    assert res.returncode == 0, res.stderr
    listed = run("nvidia-ctk", "cdi", "list", f"--spec-dir={spec_dir}")
    assert listed.stdout == "nvidia.com/gpu=0\nnvidia.com/gpu=1\nnvidia.com/gpu=all\n"
    assert "Found 3 CDI devices" in listed.stderr
    (sim["state"] / "module-version").write_text("580.1.1\n")
    broken = run("nvidia-ctk", "cdi", "generate", f"--output={spec_dir}/other.yaml")
    assert broken.returncode == 1 and "ERROR_LIB_RM_VERSION_MISMATCH" in broken.stderr


def _bundle(tmp: Path, env: list[str]) -> Path:
    bundle = tmp / "bundle"
    (bundle / "rootfs" / "usr" / "bin").mkdir(parents=True)
    (bundle / "config.json").write_text(json.dumps({"root": {"path": "rootfs"}, "process": {"env": env}}))
    return bundle


def test_runtime_hook_injects_visible_gpus(run: Run, sim: dict[str, Path]) -> None:
    host = run("nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader").stdout.split()
    bundle = _bundle(sim["tmp"], ["NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_REQUIRE_CUDA=cuda>=12.8"])
    state = json.dumps({"ociVersion": "1.2.0", "id": "x", "pid": 1, "bundle": str(bundle)})
    res = run("nvidia-container-runtime-hook", "prestart", stdin=state)
    assert res.returncode == 0, res.stderr
    inner = bundle / "rootfs"
    assert os.access(inner / "usr/bin/nvidia-smi", os.X_OK)
    seen = subprocess.run(
        [
            sys.executable,
            str(inner / "usr/bin/nvidia-smi"),
            "--query-gpu=index,uuid,pci.bus_id",
            "--format=csv,noheader",
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, RIGFLEET_SIM_NVIDIA_STATE_DIR=str(inner / "run/nvidia-sim")),
        check=False,
    )
    assert seen.stdout == f"0, {host[1]}, 00000000:02:00.0\n"  # renumbered, host UUID kept


def test_host_nvidia_smi_sees_the_memory_of_an_engine_in_a_container(run: Run, sim: dict[str, Path]) -> None:
    """As the real driver does: the engine in the container writes its compute-apps.json in its own
    root (the hook's /run/nvidia-sim there); the host's nvidia-smi finds it through /proc/PID/root
    (a fake proc tree here), with the host pid and the host's GPU index, while that process lives."""
    bundle = _bundle(sim["tmp"], ["NVIDIA_VISIBLE_DEVICES=1"])
    state = json.dumps({"ociVersion": "1.2.0", "id": "x", "pid": 1, "bundle": str(bundle)})
    assert run("nvidia-container-runtime-hook", "prestart", stdin=state).returncode == 0
    inner = bundle / "rootfs" / "run/nvidia-sim"
    # pid 7 in the container; pid 9 is a stale entry of an engine that is gone
    (inner / "compute-apps.json").write_text(json.dumps(
        [{"pid": 7, "process_name": "python3", "used_memory_mib": 21500, "gpu": 0},
         {"pid": 9, "process_name": "python3", "used_memory_mib": 999, "gpu": 0}]))
    proc = sim["tmp"] / "proc"
    for host_pid, nspid in ((4242, "4242\t7"), (4243, "4243\t8"), (1, "1")):
        (proc / str(host_pid)).mkdir(parents=True)
        (proc / str(host_pid) / "status").write_text(f"Name:\tpython3\nNSpid:\t{nspid}\n")
        (proc / str(host_pid) / "root").symlink_to(bundle / "rootfs" if host_pid != 1 else "/")
    query = ("--query-gpu=index,memory.used", "--format=csv,noheader")
    assert run("nvidia-smi", *query).stdout == "0, 0 MiB\n1, 0 MiB\n"  # no proc tree: the state dir only
    assert run("nvidia-smi", *query, RIGFLEET_SIM_PROC=str(proc)).stdout == "0, 0 MiB\n1, 21500 MiB\n"
    apps = run("nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader",
               RIGFLEET_SIM_PROC=str(proc))
    assert apps.stdout == "4242, 21500 MiB\n"
    shutil.rmtree(proc / "4242")  # the engine exited
    assert run("nvidia-smi", *query, RIGFLEET_SIM_PROC=str(proc)).stdout == "0, 0 MiB\n1, 0 MiB\n"


def test_runtime_hook_failures(run: Run, sim: dict[str, Path]) -> None:
    bundle = _bundle(sim["tmp"], ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_REQUIRE_CUDA=cuda>=13.1"])
    state = json.dumps({"bundle": str(bundle)})
    res = run("nvidia-container-runtime-hook", "prestart", stdin=state)
    assert res.returncode == 1 and "unsatisfied condition: cuda>=13.1" in res.stderr
    (sim["state"] / "module-version").write_text("580.1.1\n")
    res = run("nvidia-container-runtime-hook", "prestart", stdin=state)
    assert res.returncode == 1 and "driver/library version mismatch" in res.stderr
    # A symlink in the image must not redirect the hook's writes onto the host.
    (sim["state"] / "module-version").write_text(OLD + "\n")
    bundle2 = sim["tmp"] / "b2"
    (bundle2 / "rootfs").mkdir(parents=True)
    (bundle2 / "rootfs" / "run").symlink_to(sim["tmp"])
    (bundle2 / "config.json").write_text(
        json.dumps({"root": {"path": "rootfs"}, "process": {"env": ["NVIDIA_VISIBLE_DEVICES=0"]}})
    )
    res = run("nvidia-container-runtime-hook", "prestart", stdin=json.dumps({"bundle": str(bundle2)}))
    assert res.returncode == 1 and "refusing to write" in res.stderr
    assert not (sim["tmp"] / "nvidia-sim").exists()
    void = _bundle(sim["tmp"] / "v", ["NVIDIA_VISIBLE_DEVICES=void"])
    assert (
        run("nvidia-container-runtime-hook", "prestart", stdin=json.dumps({"bundle": str(void)})).returncode
        == 0
    )
    assert not (void / "rootfs" / "run").exists()


# ------------------------------------------------------------------------------------------ repo


@pytest.fixture(scope="module")
def built_repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    base = tmp_path_factory.mktemp("aptrepo")
    if not IS_ROOT and not all(shutil.which(t) for t in aptrepo.TOOLS):
        pytest.skip("dpkg-deb/gpg/gpgv missing and not root to install them")
    result = aptrepo.build_apt_repo(base / "www", key_dir=base / "keys")
    return base / "www", result


def test_build_returns_the_group_vars_contract(built_repo: tuple[Path, dict]) -> None:
    _www, result = built_repo
    assert set(result["group_vars"]) == {"cuda_repo", "toolkit_repo"}
    for name, repo in result["group_vars"].items():
        sub = "cuda" if name == "cuda_repo" else "toolkit"
        assert repo["url"] == f"{layout.HOST_URL}nvidia/{sub}/"
        assert repo["key_url"] == repo["url"] + "key.asc"
        assert re.fullmatch(r"[0-9A-F]{40}", repo["key_fingerprint"])
    fprs = {r["key_fingerprint"] for r in result["group_vars"].values()}
    assert len(fprs) == 2  # one key per repository, like NVIDIA's
    assert result["driver_versions"] == [f"{OLD}-1", f"{NEW}-1"]
    assert result["toolkit_version"] == "1.18.0-1"


def test_release_is_signed_and_verifies(built_repo: tuple[Path, dict], tmp_path: Path) -> None:
    www, result = built_repo
    keyrings = {}
    for sub in ("cuda", "toolkit"):
        repo = www / "nvidia" / sub
        for name in ("Packages", "Packages.gz", "Release", "InRelease", "Release.gpg", "key.asc"):
            assert (repo / name).is_file(), name
        keyring = tmp_path / f"{sub}.gpg"
        armored = (repo / "key.asc").read_bytes()
        dearmored = subprocess.run(
            ["gpg", "--dearmor"], input=armored, capture_output=True, check=True
        ).stdout
        keyring.write_bytes(dearmored)
        keyrings[sub] = keyring
        for args in ([str(repo / "InRelease")], [str(repo / "Release.gpg"), str(repo / "Release")]):
            res = subprocess.run(["gpgv", "--keyring", str(keyring), *args], capture_output=True, text=True)
            assert res.returncode == 0, res.stderr
            fpr = result["group_vars"][f"{sub}_repo"]["key_fingerprint"]
            assert fpr in res.stderr
    wrong = subprocess.run(
        ["gpgv", "--keyring", str(keyrings["cuda"]), str(www / "nvidia/toolkit/InRelease")],
        capture_output=True,
    )
    assert wrong.returncode != 0


def test_packages_index_lists_the_stand_ins(built_repo: tuple[Path, dict]) -> None:
    www, _result = built_repo
    cuda = (www / "nvidia/cuda/Packages").read_text()
    for v in (OLD, NEW):
        names = ["nvidia-driver-pinning-580", "nvidia-open", "nvidia-kernel-open-dkms", "nvidia-driver-cuda"]
        for name in [*names, "cuda-drivers", f"nvidia-driver-pinning-{v}"]:
            assert f"Package: {name}\nVersion: {v}-1\n" in cuda
    toolkit = (www / "nvidia/toolkit/Packages").read_text()
    for name in ("nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools",
                 "libnvidia-container1"):  # fmt: skip
        assert f"Package: {name}\nVersion: 1.18.0-1\n" in toolkit
    assert cuda.count("SIMULATED") >= 2 * len(re.findall(r"^Package:", cuda, re.M))
    deb = next((www / "nvidia/cuda").glob("nvidia-driver-cuda_*.deb"))
    desc = subprocess.run(["dpkg-deb", "-f", str(deb), "Description"], capture_output=True, text=True).stdout
    assert "SIMULATED" in desc


def test_rebuild_with_the_same_inputs_is_a_no_op(built_repo: tuple[Path, dict], tmp_path: Path) -> None:
    www, result = built_repo

    def files() -> dict[Path, int]:
        return {p: p.stat().st_mtime_ns for p in (www / "nvidia").rglob("*") if p.is_file()}

    before = files()
    again = aptrepo.build_apt_repo(www, key_dir=www.parent / "keys")
    assert again == result
    assert files() == before  # nothing rebuilt, rewritten or re-signed


# ------------------------------------------------------------------- real apt in a sandbox root


def _cached_roots() -> list[Path]:
    cache = Path("/var/cache/rigfleet")
    return sorted(cache.glob("rootfs-*-v*.tar.gz")) if cache.is_dir() else []


@contextlib.contextmanager
def _serve(directory: Path) -> Iterator[int]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


INSTALL_SCRIPT = """
set -eu
export DEBIAN_FRONTEND=noninteractive
# Only the simulated repos, fetched directly even if the root is set up for the sandbox's proxy.
A="apt-get -q -y -o Dir::Etc::SourceList=/dev/null -o Acquire::http::Proxy=DIRECT"
mkdir -p /etc/apt/keyrings
gpg --dearmor < /probe/cuda.asc > /etc/apt/keyrings/cuda.gpg
gpg --dearmor < /probe/toolkit.asc > /etc/apt/keyrings/toolkit.gpg
echo "deb [signed-by=/etc/apt/keyrings/cuda.gpg] http://127.0.0.1:PORT/nvidia/cuda/ /" \\
    > /etc/apt/sources.list.d/cuda.list
echo "deb [signed-by=/etc/apt/keyrings/toolkit.gpg] http://127.0.0.1:PORT/nvidia/toolkit/ /" \\
    > /etc/apt/sources.list.d/toolkit.list
# the stand-ins depend on the real Debian packages they are shaped after (contrib, non-free)
echo "deb MIRROR SUITE main contrib non-free non-free-firmware" > /etc/apt/sources.list.d/debian-real.list
$A update 2>&1 | tee /probe/update.log
if grep -E '^(W|E):' /probe/update.log; then exit 3; fi
$A install nvidia-driver-pinning-580
$A install nvidia-open=OLD-1 nvidia-kernel-open-dkms=OLD-1 nvidia-driver-cuda=OLD-1 \
    firmware-nvidia-gsp=OLD-1 nvidia-open-kernel-support=OLD-1 nvidia-alternative=OLD-1 nvidia-modprobe=OLD-1
nvidia-smi --query-gpu=driver_version --format=csv,noheader > /probe/fresh.out
$A install nvidia-open=NEW-1 nvidia-kernel-open-dkms=NEW-1 nvidia-driver-cuda=NEW-1 \
    firmware-nvidia-gsp=NEW-1 nvidia-open-kernel-support=NEW-1 nvidia-alternative=NEW-1 nvidia-modprobe=NEW-1
set +e; nvidia-smi -L > /probe/mismatch.out; echo $? > /probe/mismatch.rc; set -e
rm -rf /run/nvidia-sim; /usr/sbin/nvidia-sim-modprobe 2>/dev/null  # what the boot unit does after a reboot
nvidia-smi --query-gpu=driver_version --format=csv,noheader > /probe/rebooted.out
$A install nvidia-container-toolkit=TK nvidia-container-toolkit-base=TK libnvidia-container-tools=TK \
    libnvidia-container1=TK
nvidia-ctk runtime configure --runtime=docker
$A purge nvidia-open nvidia-kernel-open-dkms nvidia-driver-cuda nvidia-driver-pinning-580 \
    firmware-nvidia-gsp nvidia-open-kernel-support nvidia-alternative nvidia-modprobe \
    nvidia-container-toolkit nvidia-container-toolkit-base libnvidia-container-tools libnvidia-container1
dpkg-query -W -f '${Package} ${Status}\\n' | grep -E 'nvidia|cuda' | grep -v not-installed \\
    > /probe/left.out || true
ls /etc/systemd/system/*.wants/ | grep -E 'nvidia' > /probe/units.out || true
"""


@pytest.mark.sandbox
@pytest.mark.skipif(not IS_ROOT or shutil.which("chroot") is None, reason="needs root and chroot")
@pytest.mark.parametrize("tarball", _cached_roots() or [None], ids=lambda p: p.name if p else "none")
def test_packages_install_upgrade_purge_with_real_apt(
    built_repo: tuple[Path, dict], tmp_path: Path, tarball: Path | None
) -> None:
    if tarball is None:
        pytest.skip("no cached sandbox root under /var/cache/rigfleet (made by `rigfleet sandbox up`)")
    suite = tarball.name.split("-")[1]  # rootfs-<suite>-v<N>.tar.gz
    www = tmp_path / "www"
    aptrepo.build_apt_repo(www, key_dir=built_repo[0].parent / "keys", suite=suite)
    root = tmp_path / "root"
    root.mkdir()
    subprocess.run(["tar", "-xzf", str(tarball), "-C", str(root)], check=True)
    probe = root / "probe"
    probe.mkdir()
    for sub in ("cuda", "toolkit"):
        shutil.copy(www / "nvidia" / sub / "key.asc", probe / f"{sub}.asc")
    with _serve(www) as port:
        script = (
            INSTALL_SCRIPT.replace("PORT", str(port))
            .replace("OLD", OLD)
            .replace("NEW", NEW)
            .replace("TK", "1.18.0-1")
            .replace("MIRROR", debindex.debian_mirror())
            .replace("SUITE", suite)
        )
        # A private mount namespace: the /proc and /dev mounts vanish with it, even if killed.
        mounts = 'mount --bind /proc "$1/proc" && mount --bind /dev "$1/dev" && exec chroot "$1" sh -c "$2"'
        res = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", mounts, "sh", str(root), script],
            capture_output=True,
            text=True,
        )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    results = {p.name: p.read_text() for p in probe.glob("*.out")} | {
        "rc": (probe / "mismatch.rc").read_text()
    }
    daemon = json.loads((root / "etc/docker/daemon.json").read_text())
    pins = list((root / "etc/apt/preferences.d").glob("nvidia-*"))
    shutil.rmtree(root)  # a root is ~400 MB; do not leave it to pytest's retention
    assert results["fresh.out"] == f"{OLD}\n{OLD}\n"  # loaded at install, no reboot needed
    assert results["rc"].strip() == "18"
    assert "Driver/library version mismatch" in results["mismatch.out"]
    assert results["rebooted.out"] == f"{NEW}\n{NEW}\n"
    assert daemon["runtimes"]["nvidia"]["path"] == "nvidia-container-runtime"
    standins = {p.name for p in aptrepo.packages(suite)}
    left = [line for line in results["left.out"].splitlines() if line.split()[0] in standins]
    assert left == []  # purged: not even config-files state
    assert results["units.out"] == ""
    assert not pins


def test_nvlink_status_and_topology_follow_the_simulated_bridge(run: Run, sim: dict[str, Path]) -> None:
    """The stand-in answers `nvlink --status` and `topo -m` in the real formats (fixtures next to
    the H200 capture), PCIe-only until a bridge is 'fitted'."""
    from rigfleet.facts.nvidia import parse_nvlink_status, parse_topology

    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi" / "rtx3090x2-580.95.05"
    bridge = sim["tmp"] / "nvlink-bridge"
    none = run("nvidia-smi", "nvlink", "--status", RIGFLEET_SIM_NVLINK_BRIDGE=str(bridge))
    assert (none.returncode, none.stdout) == (0, "")
    assert not parse_topology(run("nvidia-smi", "topo", "-m", RIGFLEET_SIM_NVLINK_BRIDGE=str(bridge))
                              .stdout.splitlines()).nvlinked()
    bridge.write_text("")
    status = run("nvidia-smi", "nvlink", "-s", RIGFLEET_SIM_NVLINK_BRIDGE=str(bridge))
    real = (fixtures / "nvlink-status.txt").read_text().splitlines()[1:-1]
    uuid = re.compile(r"\(UUID: [^)]+\)")
    assert [uuid.sub("(UUID: X)", line) for line in status.stdout.splitlines()] == [
        uuid.sub("(UUID: X)", line) for line in real
    ]
    assert parse_nvlink_status(status.stdout.splitlines()) == {0: 4, 1: 4}
    topo = run("nvidia-smi", "topo", "-m", RIGFLEET_SIM_NVLINK_BRIDGE=str(bridge)).stdout.splitlines()
    assert topo[1].split("\t")[:3] == ["GPU0", " X ", "NV4"]
    assert parse_topology(topo).nvlinked()
    assert run("nvidia-smi", "nvlink", "--capabilities").returncode == 2
