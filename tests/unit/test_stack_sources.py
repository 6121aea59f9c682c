"""The stack stand-ins' real vLLM sources (rigfleet_sandbox.stacks.real_sources) and the SIMULATED
engine's Marlin check against a real release's file, with a small wheel made here (no download)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from rigfleet_sandbox import engine, stacks

MARLIN = "vllm/model_executor/kernels/linear/mixed_precision/marlin.py"
CHECK = ("from vllm.entrypoints.openai import api_server as a\n"
         "class C: quantization = 'auto_round'; tensor_parallel_size = 2\n"
         "a._check_marlin(C(), {})\n")


def fake_wheel(cache: Path, version: str, files: dict[str, str]) -> None:
    (cache / "vllm-wheels").mkdir(parents=True)
    with zipfile.ZipFile(cache / "vllm-wheels" / f"vllm-{version}-cp38-abi3-manylinux_2_28_x86_64.whl", "w") as whl:
        for name, text in files.items():
            whl.writestr(name, text)


def test_real_sources_fill_in_under_the_engines_own_files(tmp_path: Path) -> None:
    fake_wheel(tmp_path, "0.23.0", {
        "vllm/__init__.py": "import torch\n", "vllm/engine/arg_utils.py": "import torch\n",
        "vllm/v1/worker/gpu_worker.py": "import torch\nclass Worker: ...\n", MARLIN: "import torch\n",
        "vllm/model_executor/layers/fused_moe/__init__.py": "import torch\n", "vllm/README.txt": "x",
        "vllm-0.23.0.dist-info/METADATA": "Name: vllm\n"})
    got = stacks.real_sources("0.23.1rc1.dev424+g3f5a1e173", tmp_path)  # a nightly: its nearest release
    assert set(got) == {"vllm/v1/worker/gpu_worker.py", MARLIN, "vllm/model_executor/layers/fused_moe/__init__.py"}


def run_check(tmp_path: Path, marlin: str) -> subprocess.CompletedProcess[str]:
    site = tmp_path / "site"
    engine.install_standin_vllm(site, "0.27.1")
    (site / MARLIN).write_text(marlin)
    return subprocess.run([sys.executable, "-c", CHECK], env={"PYTHONPATH": str(site)}, capture_output=True,
                          text=True, timeout=60)


def test_the_engine_accepts_a_real_release_that_pads_and_refuses_one_that_does_not(tmp_path: Path) -> None:
    padded = run_check(tmp_path / "a", "import torch\nfrom x import marlin_pad_qweight\n")
    assert padded.returncode == 0, padded.stderr[-500:]
    unpadded = run_check(tmp_path / "b", "import torch\nGPTQ_MARLIN_MIN_THREAD_N = 64\n")
    assert unpadded.returncode == 1 and "min_thread_n = 64" in unpadded.stderr, unpadded.stderr[-500:]
    standin = run_check(tmp_path / "c", (engine.ASSETS / "vllm" / MARLIN).read_text())
    assert standin.returncode == 1 and "min_thread_n = 64" in standin.stderr, standin.stderr[-500:]
