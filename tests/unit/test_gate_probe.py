"""The on-rig gate loop (rigfleet/gate/probe.py) against a stub OpenAI server and a faked `docker`.

The stub behaves like the engines the gate must tell apart: healthy, garbage output (the seed's
broken TQ3+MTP: right on short prompts, floods/repetition/empties/missed needles elsewhere, low
acceptance), /health failing, a crashed container, a wrong model name.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from rigfleet.gate import probe

BOOT_LOG = ("Genesis Results: 40 applied, 2 skipped, 0 failed\n"
            "GPU KV cache size: 1,221,472 tokens\n"
            "Maximum concurrency for 262,144 tokens per request: 4.66x\n"
            "Application startup complete.\n")
PROSE = ("Bridges began as logs across streams, then stone arches carried roads over rivers. Iron and steel "
         "followed, and cables let engineers span wide estuaries. Each era taught new lessons about loads, "
         "materials, wind and maintenance, and modern designers model fatigue long before construction.")


class Engine:
    def __init__(self, mode: str = "good", served: str = "qwen3.6-27b-autoround") -> None:
        self.mode = mode
        self.served = served
        self.drafts = 0
        self.accepted = 0
        self.requests: list[dict[str, Any]] = []
        self.auth: list[str | None] = []

    def answer(self, body: dict[str, Any]) -> tuple[str, int]:
        messages = body["messages"]
        question = messages[-1]["content"]
        garbage = self.mode == "garbage"
        if "capital of France" in question:
            return "The capital of France is Paris.", 7
        if garbage and (len(messages) >= 3 and len(self.requests) % 3 == 0):
            return "", 0
        needle = re.search(r"passphrase is: ([^.]+)\.", question)
        if needle:
            return ("!" * 40, 40) if garbage else (needle.group(1), 3)
        if "essay" in question:
            return (" ".join(["Bridges"] * 300), 300) if garbage else (PROSE, 60)
        return "Danube, Rhine and Seine are rivers of Europe.", 9

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        self.requests.append(body)
        if body.get("tools"):
            call = {"index": 0, "id": "call-1", "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}
            return {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [call]}}],
                    "usage": {"prompt_tokens": 20, "completion_tokens": 12}}
        text, tokens = self.answer(body)
        tokens = min(tokens, body.get("max_tokens", tokens))
        drafts = -(-tokens // 4)
        self.drafts += drafts
        self.accepted += round(drafts * (0.06 if self.mode == "garbage" else 2.54))
        return {"choices": [{"message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": len(str(body)) // 4, "completion_tokens": tokens}}

    def metrics(self) -> str:
        return (f'vllm:spec_decode_num_drafts_total{{engine="0"}} {self.drafts}\n'
                f'vllm:spec_decode_num_draft_tokens_total{{engine="0"}} {self.drafts * 3}\n'
                f'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {self.accepted}\n')


@pytest.fixture
def engine() -> Iterator[tuple[Engine, str]]:
    state = Engine()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def send(self, status: int, body: Any) -> None:
            raw = (body if isinstance(body, str) else json.dumps(body)).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self) -> None:  # noqa: N802 - http.server API
            state.auth.append(self.headers.get("Authorization"))
            if self.path == "/health":
                self.send(500 if state.mode == "unhealthy" else 200, "")
            elif self.path == "/v1/models":
                self.send(200, {"data": [{"id": state.served}]})
            elif self.path == "/metrics":
                self.send(200, state.metrics())
            else:
                self.send(404, {"error": "not found"})

        def do_POST(self) -> None:  # noqa: N802 - http.server API
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            reply = state.chat(body)
            if body.get("stream"):  # the same reply as one SSE event per field
                message = reply["choices"][0]["message"]
                delta = {"tool_calls": message["tool_calls"]} if message.get("tool_calls") else {
                    "content": message["content"]}
                events = [{"choices": [{"delta": delta, "finish_reason": None}]},
                          {"choices": [{"delta": {}, "finish_reason": "stop"}]}]
                self.send(200, "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n")
                return
            self.send(200, reply)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def release_dir(tmp_path: Path, base_url: str, **gate: Any) -> Path:
    meta = {
        "release_id": "tq3-mtp-genesis-abc", "container_name": "vllm-test", "base_url": base_url,
        "served_model_names": ["qwen3.6-27b-autoround"], "needs_genesis": True, "mtp_tokens": 3,
        "max_model_len": 262144, "kv_predicted": 1_250_000,
        "gate": {"needle_tokens": [1000, 3000], "soak_sessions": 2, "soak_turns": 3, "unhealthy_grace_s": 1} | gate,
    }
    (tmp_path / "release.json").write_text(json.dumps(meta))
    (tmp_path / "rigfleet.env").write_text("# secrets\nVLLM_API_KEY=sk-test-123\n")
    return tmp_path


@pytest.fixture
def fake_docker(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    container = {"id": "c0ffee", "status": "running", "exit_code": 0, "restart_count": 0, "health": "starting",
                 "release": "tq3-mtp-genesis-abc"}
    logs = {"text": BOOT_LOG}
    monkeypatch.setattr(probe, "container_state", lambda name: dict(container) if container else None)

    def docker(*args: str, timeout: float = 60) -> tuple[int, str]:
        assert args[0] == "logs"
        return 0, logs["text"] + "sk-test-123 leaked into a log line\n"

    monkeypatch.setattr(probe, "docker", docker)
    monkeypatch.setattr(probe, "POLL_S", 0.05)
    vram = {"mib": 43_000, "step": 0}  # nvidia-smi's memory.used; `step` MiB more at each reading

    def memory_used() -> int | None:
        vram["mib"] += vram["step"]
        return vram["mib"]

    monkeypatch.setattr(probe, "gpu_memory_used", memory_used)
    return {"container": container, "logs": logs, "vram": vram}


def run_gate(directory: Path, level: str, timeout: float = 10) -> dict[str, Any]:
    return probe.Gate(directory, level, timeout).run()


def failed_names(result: dict[str, Any]) -> set[str]:
    return {c["name"] for c in result["checks"] if not c["ok"] and not c["warning"]}


def test_healthy_engine_passes_full(engine: tuple[Engine, str], fake_docker: dict[str, Any], tmp_path: Path) -> None:
    state, url = engine
    result = run_gate(release_dir(tmp_path, url), "full")
    assert result["ok"], result["checks"]
    assert result["kv_pool_tokens"] == 1_221_472 and result["ready_epoch"] is not None
    assert result["acceptance_length"] == pytest.approx(3.5, abs=0.2)
    names = {c["name"] for c in result["checks"]}
    assert {"running", "health", "models", "chat", "genesis", "kv_pool", "long_output", "needle_1k", "needle_3k",
            "soak", "mtp_acceptance"} <= names
    assert all(a == "Bearer sk-test-123" for a in state.auth if a)  # the key from the 0600 env file
    assert all(r["temperature"] == 0 for r in state.requests)
    assert "sk-test-123" not in json.dumps(result)  # redacted from the log tail


def test_full_fails_on_vram_growth_and_on_a_blind_nvidia_smi(engine: tuple[Engine, str], fake_docker: dict[str, Any],
                                                            tmp_path: Path) -> None:
    _, url = engine
    fake_docker["vram"]["step"] = 300
    grown = run_gate(release_dir(tmp_path, url), "full")
    assert failed_names(grown) == {"vram_growth"}, grown["checks"]
    fake_docker["vram"]["step"] = 0
    assert run_gate(release_dir(tmp_path, url, vram_growth_max_mib=1000), "full")["ok"]  # release.json's limit
    fake_docker["vram"]["step"] = 300
    assert run_gate(release_dir(tmp_path, url, vram_growth_max_mib=1000), "full")["ok"]
    loose = probe.Gate(release_dir(tmp_path, url), "full", 10, {"vram_growth_max_mib": 400}).run()
    assert loose["ok"], loose["checks"]  # the settings verify passes win over release.json
    fake_docker["vram"].update(mib=0, step=0)
    blind = run_gate(release_dir(tmp_path, url), "full")
    assert failed_names(blind) == {"vram_growth"}
    assert next(c["detail"] for c in blind["checks"] if c["name"] == "vram_growth").startswith("could not measure")


def test_basic_level_skips_the_full_checks(engine: tuple[Engine, str], fake_docker: dict[str, Any],
                                           tmp_path: Path) -> None:
    _, url = engine
    result = run_gate(release_dir(tmp_path, url), "basic")
    assert result["ok"] and not any(c["name"].startswith(("needle", "soak")) for c in result["checks"])


def test_garbage_output_passes_basic_but_fails_full(engine: tuple[Engine, str], fake_docker: dict[str, Any],
                                                    tmp_path: Path) -> None:
    state, url = engine
    state.mode = "garbage"
    directory = release_dir(tmp_path, url)
    assert run_gate(directory, "basic")["ok"]  # what made the seed's broken path look fine
    result = run_gate(directory, "full")
    assert not result["ok"]
    assert {"long_output", "needle_1k", "needle_3k", "soak", "mtp_acceptance"} <= failed_names(result)


def test_unhealthy_fails_after_the_grace(engine: tuple[Engine, str], fake_docker: dict[str, Any],
                                         tmp_path: Path) -> None:
    state, url = engine
    state.mode = "unhealthy"
    result = run_gate(release_dir(tmp_path, url), "basic", timeout=30)
    assert not result["ok"] and failed_names(result) == {"health"}  # not "ready": the grace, not the timeout
    [health] = [c for c in result["checks"] if c["name"] == "health"]
    assert health["detail"].startswith("/health answered HTTP 5"), health


def test_exited_container_fails_fast_with_its_log(fake_docker: dict[str, Any], tmp_path: Path) -> None:
    fake_docker["container"].update(status="exited", exit_code=1)
    fake_docker["logs"]["text"] = "RuntimeError: CUDA error: out of memory\n"
    result = run_gate(release_dir(tmp_path, "http://127.0.0.1:9"), "basic", timeout=30)
    assert not result["ok"] and failed_names(result) == {"running"}
    assert any("out of memory" in line for line in result["log_tail"])


def test_crash_loop_fails_fast(fake_docker: dict[str, Any], tmp_path: Path) -> None:
    fake_docker["container"].update(status="running", restart_count=2)
    result = run_gate(release_dir(tmp_path, "http://127.0.0.1:9"), "basic", timeout=30)
    assert not result["ok"] and "restarts 2" in result["checks"][0]["detail"]


def test_not_ready_in_time(fake_docker: dict[str, Any], tmp_path: Path) -> None:
    result = run_gate(release_dir(tmp_path, "http://127.0.0.1:9"), "basic", timeout=0.5)
    assert not result["ok"] and failed_names(result) == {"ready"}


def test_wrong_served_model_fails(engine: tuple[Engine, str], fake_docker: dict[str, Any], tmp_path: Path) -> None:
    state, url = engine
    state.served = "something-else"
    result = run_gate(release_dir(tmp_path, url), "basic")
    assert failed_names(result) == {"models"}


def test_genesis_failure_in_the_boot_log(engine: tuple[Engine, str], fake_docker: dict[str, Any],
                                         tmp_path: Path) -> None:
    _, url = engine
    fake_docker["logs"]["text"] = BOOT_LOG.replace("0 failed", "2 failed")
    result = run_gate(release_dir(tmp_path, url), "full")
    assert failed_names(result) == {"genesis"}
    assert not any(c["name"] == "soak" for c in result["checks"])  # full checks only after basic passed


def test_main_prints_one_json_line(engine: tuple[Engine, str], fake_docker: dict[str, Any], tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    _, url = engine
    code = probe.main([str(release_dir(tmp_path, url)), "--level", "basic", "--timeout", "10"])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0 and len(out) == 1 and json.loads(out[0])["ok"]


def test_main_without_release_json_still_prints_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert probe.main([str(tmp_path)]) == 1
    assert json.loads(capsys.readouterr().out)["ok"] is False


def test_readiness_polls_back_off_and_every_check_still_runs(engine: tuple[Engine, str], fake_docker: dict[str, Any],
                                                            tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first probes follow each other closely (a swap's downtime ends when the gate sees the
    engine), later ones back off to POLL_S; a ready engine still gets /health, /v1/models and chat."""
    state, url = engine
    healthy, state.mode = state.mode, "unhealthy"
    pauses: list[float] = []

    def sleep(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) == 12:
            state.mode = healthy

    monkeypatch.setattr(probe.time, "sleep", sleep)
    result = run_gate(release_dir(tmp_path, url, unhealthy_grace_s=600), "basic", timeout=600)
    assert result["ok"], result["checks"]
    assert [c["name"] for c in result["checks"]][:4] == ["running", "health", "models", "chat"]
    assert pauses[0] == probe.POLL_FIRST_S and pauses == sorted(pauses)
    assert max(pauses) == probe.POLL_S
