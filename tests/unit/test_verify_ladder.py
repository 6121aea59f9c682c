"""The verify ladder (rigfleet/gate/probe.py levels) against the SIMULATED engine, run locally.

The stand-in vllm serves on 127.0.0.1; `docker` is faked (container state, boot log from the
engine's own output) and the stand-in nvidia-smi reads the state dir the engine writes its GPU
memory to, as on a sandbox rig. Each fault switch (engine env RIGFLEET_SANDBOX_FAULT) must fail
the check that names it, and a healthy engine must pass every level.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rigfleet.gate import probe
from rigfleet_sandbox import aptrepo, engine
from tests.unit.test_sim_engine import INT8, PIN_A, Served

# A short max_model_len keeps the stress needles and the limit probe small.
ARGS = [*(a if a != "262144" else "24576" for a in INT8)]
GATE = {"needle_tokens": [2000, 6000], "stress_needle_tokens": [4000, 12000], "soak_sessions": 2,
        "soak_turns": 3, "soak_long_sessions": 8, "soak_long_turns": 5, "unhealthy_grace_s": 1}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ladder")
    engine.install_standin_vllm(root / "site", PIN_A, overlays=True)
    engine.build_weights(root)
    bin_dir = root / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_bytes(aptrepo.render_asset("bin/nvidia-smi", aptrepo.DRIVER_VERSIONS[0]))
    smi.chmod(0o755)
    return root


@pytest.fixture
def rig(site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """start(fault, **env) -> the release dir of a local engine with that fault switched on."""
    state = tmp_path / "nvidia-state"
    state.mkdir()
    (state / "module-version").write_text(aptrepo.DRIVER_VERSIONS[0] + "\n")
    monkeypatch.setenv("RIGFLEET_SIM_NVIDIA_STATE_DIR", str(state))
    monkeypatch.setenv("PATH", f"{site / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setattr(probe, "POLL_S", 0.05)
    started: list[Served] = []

    def start(fault: str = "", **env: str) -> Path:
        served = Served(site / "site", site / "weights" / engine.WEIGHTS_NAME, ARGS,
                        {"RIGFLEET_SANDBOX_FAULT": fault, "RIGFLEET_SIM_NVIDIA_STATE_DIR": str(state), **env})
        started.append(served)
        assert served.wait_ready(), served.log
        container = {"id": "c0ffee", "status": "running", "exit_code": 0, "restart_count": 0,
                     "health": None, "release": "int8-mtp-abc"}
        monkeypatch.setattr(probe, "container_state", lambda name: dict(container))
        monkeypatch.setattr(probe, "docker", lambda *args, timeout=60: (0, served.log))
        meta = {"release_id": "int8-mtp-abc", "container_name": "vllm-test", "base_url": served.url(""),
                "served_model_names": ["qwen3.6-27b-autoround"], "needs_genesis": False, "mtp_tokens": 3,
                "max_model_len": 24576, "kv_predicted": None, "gate": GATE}
        directory = tmp_path / f"release-{len(started)}"
        directory.mkdir()
        (directory / "release.json").write_text(json.dumps(meta))
        (directory / "rigfleet.env").write_text("VLLM_API_KEY=\n")
        return directory

    yield start
    for served in started:
        served.stop()


def verify(directory: Path, level: str) -> dict[str, Any]:
    return probe.Gate(directory, level, 120).run()


def failed(result: dict[str, Any]) -> set[str]:
    return {c["name"] for c in result["checks"] if not c["ok"] and not c["warning"]}


def names(result: dict[str, Any]) -> set[str]:
    return {c["name"] for c in result["checks"]}


def test_healthy_engine_passes_every_level(rig: Any) -> None:
    directory = rig()
    full = verify(directory, "full")
    assert full["ok"], failed(full)
    assert {"streaming", "tool_call", "tool_call_stream", "degeneracy", "long_output", "needle_2k",
            "needle_6k", "soak", "vram_growth", "mtp_acceptance"} <= names(full)
    stress = verify(directory, "stress")
    assert stress["ok"], [c for c in stress["checks"] if not c["ok"]]
    assert {"needle_4k_at_10", "needle_12k_at_90", "limit_probe"} <= names(stress)
    soak = verify(directory, "soak")
    assert soak["ok"], [c for c in soak["checks"] if not c["ok"]]
    assert {"soak_long", "vram_growth_long", "throughput_retention"} <= names(soak)
    assert soak["soak"]["turns"] == 40 and soak["soak"]["vram_before_mib"] > 0
    smoke = verify(directory, "smoke")
    assert smoke["ok"] and "streaming" not in names(smoke)


@pytest.mark.parametrize(("fault", "level", "check"), [
    ("bang-flood", "full", "degeneracy"),
    ("repetition", "full", "degeneracy"),
    ("empty-replies", "full", "soak"),
    ("broken-sse", "full", "streaming"),
    ("bad-tool-json", "full", "tool_call"),
    ("low-acceptance", "full", "mtp_acceptance"),
    ("needle-miss", "full", "needle_2k"),
    ("vram-growth", "full", "vram_growth"),
])
def test_each_fault_fails_the_check_that_names_it(rig: Any, fault: str, level: str, check: str) -> None:
    result = verify(rig(fault), level)
    assert not result["ok"]
    assert check in failed(result), result["checks"]
    detail = next(c["detail"] for c in result["checks"] if c["name"] == check)
    assert detail


def test_a_slow_vram_leak_passes_full_and_fails_the_soak(rig: Any) -> None:
    """10 MiB per GPU a request: the full level's 6 short-soak turns grow 120 MiB (within 200), the
    soak's 40 turns 800 MiB."""
    directory = rig("vram-growth", RIGFLEET_SANDBOX_VRAM_STEP_MIB="10")
    full = verify(directory, "full")
    assert full["ok"], failed(full)
    assert "(+120 MiB)" in next(c["detail"] for c in full["checks"] if c["name"] == "vram_growth")
    soak = verify(directory, "soak")
    assert failed(soak) == {"vram_growth_long"}, soak["checks"]
    assert "(+800 MiB), more than 200 MiB" in next(c["detail"] for c in soak["checks"]
                                                   if c["name"] == "vram_growth_long")


def test_broken_tool_json_fails_the_streamed_call_too(rig: Any) -> None:
    result = verify(rig("bad-tool-json"), "full")
    assert {"tool_call", "tool_call_stream"} <= failed(result)
    assert "not JSON" in next(c["detail"] for c in result["checks"] if c["name"] == "tool_call_stream")


def test_late_failure_passes_the_swap_gate_and_fails_the_soak(rig: Any) -> None:
    directory = rig("late-failure", RIGFLEET_SANDBOX_LATE_AFTER="40")
    gate = verify(directory, "full")  # what the swap gate runs on the canary
    assert gate["ok"], failed(gate)
    soak = verify(directory, "soak")
    assert "soak_long" in failed(soak)
    assert "silent-empty" in next(c["detail"] for c in soak["checks"] if c["name"] == "soak_long")


def test_cache_guard_fails_a_needle_the_prefix_cache_answered(rig: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = rig()
    monkeypatch.setattr(probe.checks, "make_salt", lambda rng: "SESSION-fixed")  # the salt is lost
    monkeypatch.setattr(probe.checks, "make_secret", lambda rng: "golden otter 42")
    gate = probe.Gate(directory, "full", 120)
    first = gate.needle(6000, probe.checks.needle_prompt(probe.checks.make_haystack(
        6000, "golden otter 42", "SESSION-fixed", __import__("random").Random(1))), "golden otter 42", 1e12)
    again = gate.needle(6000, probe.checks.needle_prompt(probe.checks.make_haystack(
        6000, "golden otter 42", "SESSION-fixed", __import__("random").Random(1))), "golden otter 42", 1e12)
    assert first.ok
    assert not again.ok and "prefix cache" in again.detail
