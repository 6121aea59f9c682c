"""The SIMULATED engine stand-ins: vllm serve, Genesis apply_all, the plugin, the built artifacts.

Fast and rootless: the stand-in vllm is installed into a temp dir and run with PYTHONPATH, on
127.0.0.1 and a free port; the image archive is built from a small fake root tarball.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import socket
import struct
import subprocess
import sys
import tarfile
import threading
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

import pytest

from rigfleet_sandbox import engine, layout

PIN_A = "0.20.2rc1.dev9+g01d4d1ad3"
PIN_UNLISTED = "0.20.2rc2.dev672+g1acd67a79"
MTP3 = '{"method":"mtp","num_speculative_tokens":3}'
COMMON = [
    "--served-model-name",
    "qwen3.6-27b-autoround",
    "qwen3.6-27b",
    "--quantization",
    "auto_round",
    "--dtype",
    "float16",
    "--tensor-parallel-size",
    "2",
    "--pipeline-parallel-size",
    "1",
    "--max-model-len",
    "262144",
    "--trust-remote-code",
    "--reasoning-parser",
    "qwen3",
    "--default-chat-template-kwargs",
    '{"enable_thinking": false}',
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "qwen3_coder",
    "--enable-prefix-caching",
    "--enable-chunked-prefill",
    "--override-generation-config",
    '{"temperature":0.6,"top_p":0.95,"top_k":20}',
    "--disable-custom-all-reduce",
    "--max-num-seqs",
    "2",
]
INT8 = [
    *COMMON,
    "--kv-cache-dtype",
    "int8_per_token_head",
    "--gpu-memory-utilization",
    "0.92",
    "--max-num-batched-tokens",
    "8192",
    "--speculative-config",
    MTP3,
]
TQ3_MTP = [
    *COMMON,
    "--kv-cache-dtype",
    "turboquant_3bit_nc",
    "--gpu-memory-utilization",
    "0.85",
    "--max-num-batched-tokens",
    "4128",
    "--speculative-config",
    MTP3,
]
TQ3_NOMTP = [
    *COMMON,
    "--kv-cache-dtype",
    "turboquant_3bit_nc",
    "--gpu-memory-utilization",
    "0.92",
    "--max-num-batched-tokens",
    "8192",
]

# club-3090's tq3-mtp-genesis flag set (research/club3090.md 2.4)
GENESIS_ON = (
    "P4",
    "P58_ASYNC_PLACEHOLDER_FIX",
    "P60_GDN_NGRAM_FIX",
    "P60B_TRITON_KERNEL",
    "P61_QWEN3_MULTI_TOOL",
    "P61B_STREAMING_OVERLAP",
    "P62_STRUCT_OUT_SPEC_TIMING",
    "P64_QWEN3CODER_MTP_STREAMING",
    "P66_CUDAGRAPH_SIZE_FILTER",
    "P67_TQ_MULTI_QUERY_KERNEL",
    "P68_AUTO_FORCE_TOOL",
    "P69_LONG_CTX_TOOL_REMINDER",
    "P72_PROFILE_RUN_CAP",
    "P74_CHUNK_CLAMP",
    "P83",
    "P91",
    "P94",
    "P98",
    "PN34_WORKSPACE_LOCK_RELAX",
    "P99",
    "P100",
    "P101",
    "P103",
    "PN8_MTP_DRAFT_ONLINE_QUANT",
    "PN9_INDEPENDENT_DRAFTER_ATTN",
    "PN11_GDN_AB_CONTIGUOUS",
    "PN12_FFN_INTERMEDIATE_POOL",
    "PN13_CUDA_GRAPH_LAMBDA_ARITY",
    "PN14_TQ_DECODE_OOB_CLAMP",
    "PN17_FA2_LSE_CLAMP",
    "PN19_SCOPED_MAX_SPLIT",
    "PN22_LOCAL_ARGMAX_TP",
    "PN26_SPARSE_V",
    "PN59_STREAMING_GDN",
    "P38B_COMPILE_SAFE",
    "P15B_FA_VARLEN_CLAMP",
    "PN25_SILU_INDUCTOR_SAFE",
    "PN30_DS_LAYOUT_SPEC_DECODE",
)
GENESIS_OFF = ("P87", "P78_TOLIST_CAPTURE_GUARD", "P81_FP8_BLOCK_SCALED_M_LE_8", "P40", "PN54_GDN_CONTIGUOUS_DEDUP",
               "P82")
GENESIS_ENV = {
    **{f"GENESIS_ENABLE_{f}": "1" for f in GENESIS_ON},
    **{f"GENESIS_ENABLE_{f}": "0" for f in GENESIS_OFF},
    "GENESIS_PROFILE_RUN_CAP_M": "4128",
    "GENESIS_PREALLOC_TOKEN_BUDGET": "4128",
}
_SCRUB = (
    "RIGFLEET_SANDBOX_",
    "GENESIS_",
    "VLLM_",
    "NVIDIA_VISIBLE_DEVICES",
    "CUDA_VISIBLE_DEVICES",
    "PYTHONPATH",
)


def _env(site: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUB)}
    env.update({"PYTHONPATH": str(site), "PYTHONDONTWRITEBYTECODE": "1"})
    env.update(extra or {})
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("www")
    engine.build_weights(root)
    return root / "weights" / engine.WEIGHTS_NAME


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A fresh stand-in vllm (with Genesis and the Marlin overlay, as the image role installs them)."""
    engine.install_standin_vllm(tmp_path / "site", PIN_A, genesis=True, overlays=True)
    return tmp_path / "site"


def apply_all(site: Path, env: dict[str, str] | None = None, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vllm._genesis.patches.apply_all", *args],
        env=_env(site, env),
        capture_output=True,
        text=True,
        timeout=60,
    )


class Served:
    """`vllm serve` in a subprocess; its merged stdout/stderr is collected line by line."""

    def __init__(self, site: Path, model: Path, args: list[str], env: dict[str, str] | None = None) -> None:
        self.port = _free_port()
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.started = time.monotonic()
        self.ready_after: float | None = None
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "vllm",
                "serve",
                str(model),
                *args,
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=_env(site, env),
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if "Application startup complete." in line:
                self.ready_after = time.monotonic() - self.started
                self.ready.set()

    @property
    def log(self) -> str:
        return "\n".join(self.lines)

    # Generous bounds: on a loaded 2-core CI machine a boot took 15 s+; they only stop a hang.
    def wait_ready(self, timeout: float = 90) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready.wait(0.05):
                return True
            if self.proc.poll() is not None:
                time.sleep(0.1)  # let the reader drain
                return self.ready.is_set()
        return False

    def wait_exit(self, timeout: float = 90) -> int:
        code = self.proc.wait(timeout)
        time.sleep(0.1)
        return code

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def request(
        self, path: str, body: Any = None, key: str | None = None, timeout: float = 30
    ) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url(path), data=data, method="POST" if data else "GET")
        req.add_header("Content-Type", "application/json")
        if key:
            req.add_header("Authorization", f"Bearer {key}")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode()

    def chat(
        self, messages: list[dict[str, str]] | str, max_tokens: int = 64, **extra: Any
    ) -> tuple[int, Any]:
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        key = extra.pop("key", None)  # no "model": the engine answers as its first served name
        return self.request(
            "/v1/chat/completions", {"messages": messages, "max_tokens": max_tokens, **extra}, key=key
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.fixture
def serve(site: Path, model_dir: Path):
    started: list[Served] = []

    def start(args: list[str], env: dict[str, str] | None = None, *, at: Path | None = None) -> Served:
        served = Served(at or site, model_dir, args, env)
        started.append(served)
        return served

    yield start
    for served in started:
        served.stop()


def _text(body: Any) -> str:
    return body["choices"][0]["message"]["content"] or ""


def _kv(log: str) -> int:
    return int(re.findall(r"GPU KV cache size: ([\d,]+) tokens", log)[-1].replace(",", ""))


# --- vllm serve ---------------------------------------------------------------------------------


def test_int8_boots_and_serves(serve) -> None:
    eng = serve(INT8)
    assert eng.wait_ready(), eng.log
    # How fast is the bench's business: on a loaded 2-core machine this took 2.35 s once.
    assert eng.ready_after is not None
    assert "vllm (simulated engine)" in eng.log and "(simulated engine)" in eng.log
    assert re.search(r"GPU KV cache size: 605,856 tokens", eng.log)
    assert "Maximum concurrency for 262,144 tokens per request: 2.31x" in eng.log
    assert eng.request("/health")[0] == 200
    status, models = eng.request("/v1/models")
    assert status == 200 and [m["id"] for m in models["data"]] == ["qwen3.6-27b-autoround", "qwen3.6-27b"]
    status, body = eng.chat("What is the capital of France? Answer in one word.", 30)
    assert status == 200 and _text(body).strip() == "Paris"
    status, body = eng.chat("What is the capital of France?", 30)
    assert "Paris" in _text(body) and body["usage"]["completion_tokens"] > 0
    status, body = eng.chat("Write an essay of about 400 words on bridges.", max_tokens=20)
    assert body["usage"]["completion_tokens"] == 20 and body["choices"][0]["finish_reason"] == "length"
    assert eng.chat("hi", 5, model="nope")[0] == 404
    assert eng.request("/version")[1]["version"] == PIN_A


def test_kv_pool_of_the_three_seed_variants(serve, site: Path, tmp_path: Path) -> None:
    """tq3-mtp-genesis needs Genesis (P4 for TQ+MTP on the hybrid model); int8 and tq3-nomtp do not."""
    plain = tmp_path / "plain"
    engine.install_standin_vllm(plain, PIN_A, overlays=True)
    assert apply_all(site, GENESIS_ENV).returncode == 0
    pools = {}
    for name, args, at in (
        ("int8", INT8, plain),
        ("tq3-mtp-genesis", TQ3_MTP, site),
        ("tq3-nomtp", TQ3_NOMTP, plain),
    ):
        eng = serve(args, at=at)
        assert eng.wait_ready(), eng.log
        pools[name] = _kv(eng.log)
        eng.stop()
    assert pools == {"int8": 605_856, "tq3-mtp-genesis": 1_220_896, "tq3-nomtp": 1_731_264}
    refused = serve(TQ3_MTP, at=plain)
    assert refused.wait_exit() == 1 and "not supported for hybrid models" in refused.log


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--kv-cache-dtype", "tq3"], 2, "argument --kv-cache-dtype: invalid choice: 'tq3'"),
        (
            ["--kv-cache-dtype", "turboquant_3bit_nc", "-tp", "2", "--speculative-config", MTP3],
            1,
            "NotImplementedError: TurboQuant KV cache is not supported for hybrid models",
        ),
        (
            ["--tensor-parallel-size", "4"],
            1,
            "World size (4) is larger than the number of available GPUs (2)",
        ),
        (["-tp", "2", "-pp", "2"], 1, "World size (4) is larger than the number of available GPUs (2)"),
        (
            ["--kv-cache-dtype", "fp8_e4m3", "-tp", "2"],
            1,
            "fp8_e4m3 KV cache is not supported on compute capability 8.6",
        ),
        (["-tp", "2", "--no-such-flag"], 2, "unrecognized arguments: --no-such-flag"),
        (["-tp", "2", "--speculative-config", "{oops"], 2, "invalid loads value"),
        (["-tp", "2", "--max-model-len", "300000"], 1, "VLLM_ALLOW_LONG_MAX_MODEL_LEN"),
        (["-tp", "1", "--gpu-memory-utilization", "0.92"], 1, "estimated maximum model length is"),
    ],
)
def test_refusals(serve, args: list[str], code: int, message: str) -> None:
    eng = serve(["--quantization", "auto_round", *args])
    assert eng.wait_exit() == code
    assert message in eng.log


def test_gpu_count_comes_from_the_visible_devices(serve) -> None:
    one = serve(["-tp", "2"], {"NVIDIA_VISIBLE_DEVICES": "GPU-aaaa"})
    assert (
        one.wait_exit() == 1 and "World size (2) is larger than the number of available GPUs (1)" in one.log
    )
    narrowed = serve(["-tp", "2"], {"NVIDIA_VISIBLE_DEVICES": "all", "CUDA_VISIBLE_DEVICES": "0"})
    assert narrowed.wait_exit() == 1
    listed = serve(["-tp", "2"], {"NVIDIA_VISIBLE_DEVICES": "0,1"})
    assert listed.wait_ready(), listed.log


def test_model_dir_without_config_and_broken_shards(
    serve, tmp_path: Path, model_dir: Path, site: Path
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    eng = Served(site, empty, ["-tp", "2"])
    try:
        assert eng.wait_exit() == 1 and "Invalid repository ID or local directory specified" in eng.log
    finally:
        eng.stop()
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in model_dir.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    (broken / engine.SHARDS[1][0]).write_bytes(b"\xff" * 64)
    eng = Served(site, broken, ["-tp", "2", "--quantization", "auto_round"])
    try:
        assert eng.wait_exit() == 1 and "HeaderTooLarge" in eng.log
    finally:
        eng.stop()


def test_autoround_at_tp2_needs_the_marlin_overlay(serve, tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    engine.install_standin_vllm(bare, PIN_A)
    eng = serve(["-tp", "2", "--quantization", "auto_round"], at=bare)
    assert eng.wait_exit() == 1
    assert "output_size_per_partition = 48 is not divisible by min_thread_n = 64" in eng.log
    assert serve(
        [
            "-tp",
            "1",
            "--quantization",
            "auto_round",
            "--gpu-memory-utilization",
            "0.95",
            "--max-model-len",
            "32768",
        ],
        at=bare,
    ).wait_ready()


def test_api_key(serve) -> None:
    eng = serve(["-tp", "2", "--api-key", "s3cret"])
    assert eng.wait_ready(), eng.log
    assert "s3cret" not in eng.log
    assert eng.request("/v1/models")[0] == 401
    assert eng.request("/v1/models", key="wrong")[0] == 401
    assert eng.request("/v1/models", key="s3cret")[0] == 200
    assert eng.chat('Say "ok"', 5)[0] == 401
    assert eng.chat('Say "ok"', 5, key="s3cret")[0] == 200
    assert eng.request("/health")[0] == 200 and eng.request("/metrics")[0] == 200
    env_key = serve(["-tp", "2"], {"VLLM_API_KEY": "fromenv"})
    assert env_key.wait_ready()
    assert env_key.request("/v1/models")[0] == 401 and env_key.request("/v1/models", key="fromenv")[0] == 200


def test_tools_streaming_and_context_limit(serve) -> None:
    eng = serve(INT8)
    assert eng.wait_ready(), eng.log
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
            },
        }
    ]
    status, body = eng.chat("What is the weather in Paris right now?", 100, tools=tools, tool_choice="auto")
    call = body["choices"][0]["message"]["tool_calls"][0]
    assert status == 200 and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    req = urllib.request.Request(
        eng.url("/v1/chat/completions"),
        method="POST",
        data=json.dumps(
            {"messages": [{"role": "user", "content": 'Say "hello there"'}], "stream": True}
        ).encode(),
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        events = [line for line in resp.read().decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    text = "".join(
        json.loads(e[6:])["choices"][0]["delta"].get("content") or ""
        for e in events[:-1]
        if json.loads(e[6:])["choices"]
    )
    assert text == "hello there"
    status, body = eng.chat("word " * 1_100_000, 10)
    assert status == 400 and "maximum context length is 262144 tokens" in body["error"]["message"]


def test_healthy_tq3_mtp_passes_the_full_gate_signals(serve, site: Path) -> None:
    checks = pytest.importorskip("rigfleet.gate.checks")
    assert apply_all(site, GENESIS_ENV).returncode == 0
    eng = serve(TQ3_MTP, GENESIS_ENV)
    assert eng.wait_ready(), eng.log
    assert "multi-query kernel (Genesis P67)" in eng.log
    before = checks.parse_metrics(eng.request("/metrics")[1])
    assert checks.check_paris(*eng.chat("What is the capital of France? Answer in one word.", 30)).ok
    long = checks.check_long_output(*eng.chat(checks.LONG_PROMPT, 600))
    assert long.ok, long.detail
    import random

    rng = random.Random(7)
    for tokens in (10_000, 30_000, 60_000):
        secret = checks.make_secret(rng)
        prompt = checks.needle_prompt(checks.make_haystack(tokens, secret, checks.make_salt(rng), rng, 0.4))
        result = checks.check_needle(tokens, *eng.chat(prompt, 40), secret)
        assert result.ok, result.detail
    replies = []
    for session in range(4):
        messages: list[dict[str, str]] = []
        for turn in range(3):
            messages.append({"role": "user", "content": checks.SOAK_PROMPTS[(session * 3 + turn) % 8]})
            status, body = eng.chat(list(messages), 160)
            replies.append((status, body))
            messages.append({"role": "assistant", "content": checks.reply_text(body)})
    soak = checks.check_soak(replies)
    assert soak.ok, soak.detail
    after = checks.parse_metrics(eng.request("/metrics")[1])
    length, rate, drafts = checks.acceptance(before, after)
    assert length is not None and 3.3 < length < 3.7 and drafts > 50 and rate < 0.95
    assert checks.check_acceptance(before, after, 2.0).ok
    assert "SpecDecoding metrics: Mean acceptance length: 3." in eng.log
    assert after["vllm:prefix_cache_queries_total"] > 0


def _garbage_signals(eng: Served) -> dict[str, Any]:
    checks = pytest.importorskip("rigfleet.gate.checks")
    import random

    rng = random.Random(3)
    out: dict[str, Any] = {}
    before = checks.parse_metrics(eng.request("/metrics")[1])
    out["paris"] = checks.check_paris(*eng.chat("What is the capital of France? Answer in one word.", 30)).ok
    out["long"] = checks.check_long_output(*eng.chat(checks.LONG_PROMPT, 600)).ok
    secret = checks.make_secret(rng)
    prompt = checks.needle_prompt(checks.make_haystack(10_000, secret, checks.make_salt(rng), rng, 0.5))
    out["needle"] = checks.check_needle(10_000, *eng.chat(prompt, 40), secret).ok
    replies = []
    for session in range(4):
        messages: list[dict[str, str]] = []
        for turn in range(3):
            messages.append({"role": "user", "content": checks.SOAK_PROMPTS[(session * 3 + turn) % 8]})
            status, body = eng.chat(list(messages), 160)
            replies.append((status, body))
            messages.append({"role": "assistant", "content": checks.reply_text(body)})
    out["empties"] = sum(1 for status, body in replies if checks.silent_empty(status, body))
    out["soak"] = checks.check_soak(replies).ok
    after = checks.parse_metrics(eng.request("/metrics")[1])
    out["acceptance"] = checks.acceptance(before, after)
    out["acceptance_ok"] = checks.check_acceptance(before, after, 2.0).ok
    return out


def test_fault_garbage_output(serve) -> None:
    eng = serve(INT8, {"RIGFLEET_SANDBOX_FAULT": "garbage-output"})
    assert eng.wait_ready(), eng.log
    assert eng.request("/health")[0] == 200
    got = _garbage_signals(eng)
    # a basic gate passes (as the seed's broken path did); every full-gate signal fails
    assert got["paris"] is True
    assert got["long"] is False and got["needle"] is False and got["soak"] is False
    assert got["empties"] >= 1
    assert got["acceptance"][0] < 1.2 and got["acceptance_ok"] is False


def test_fault_garbage_output_with_full_acceptance(serve) -> None:
    eng = serve(INT8, {"RIGFLEET_SANDBOX_FAULT": "garbage-output", "RIGFLEET_SANDBOX_GARBAGE_AL": "100"})
    assert eng.wait_ready(), eng.log
    got = _garbage_signals(eng)
    length, rate, drafts = got["acceptance"]
    assert length == pytest.approx(4.0) and rate == pytest.approx(1.0) and drafts >= 50
    assert got["acceptance_ok"] is False


def test_tq3_mtp_without_p67_behaves_like_garbage(serve, site: Path) -> None:
    env = {k: v for k, v in GENESIS_ENV.items() if "P67" not in k}
    assert apply_all(site, env).returncode == 0
    eng = serve(TQ3_MTP, env)
    assert eng.wait_ready(), eng.log
    assert "uses the upstream _prefill_attention path" in eng.log
    got = _garbage_signals(eng)
    assert got["paris"] is True and got["long"] is False and got["needle"] is False


def test_fault_boot_crash(serve) -> None:
    eng = serve(INT8, {"RIGFLEET_SANDBOX_FAULT": "boot-crash"})
    assert eng.wait_exit() == 1
    assert "Traceback (most recent call last):" in eng.log and "torch.OutOfMemoryError" in eng.log
    assert "SIMULATED fault" in eng.log and "Engine core initialization failed" in eng.log
    assert "Application startup complete." not in eng.log


def test_fault_unhealthy(serve) -> None:
    eng = serve(INT8, {"RIGFLEET_SANDBOX_FAULT": "unhealthy"})
    assert eng.wait_ready(), eng.log
    assert eng.request("/health")[0] == 500
    assert eng.request("/v1/models")[0] == 200


def test_fault_slow_boot(serve) -> None:
    eng = serve(INT8, {"RIGFLEET_SANDBOX_FAULT": "slow-boot", "RIGFLEET_SANDBOX_SLOW_BOOT_S": "1.5"})
    time.sleep(0.8)
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(eng.url("/health"), timeout=2)
    assert eng.wait_ready(10), eng.log
    assert eng.ready_after is not None and eng.ready_after >= 1.5
    assert eng.request("/health")[0] == 200


def test_unknown_fault_is_ignored_with_a_warning(serve) -> None:
    eng = serve(INT8, {"RIGFLEET_SANDBOX_FAULT": "gremlins"})
    assert eng.wait_ready(), eng.log
    assert "unknown RIGFLEET_SANDBOX_FAULT value 'gremlins' ignored" in eng.log


def test_sigterm_stops_quickly(serve) -> None:
    eng = serve(INT8)
    assert eng.wait_ready()
    eng.proc.terminate()
    assert eng.wait_exit(5) == 0 and "Shutting down" in eng.log


# --- Genesis apply_all --------------------------------------------------------------------------


def _file(site: Path, rel: str) -> str:
    return (site / "vllm" / rel).read_text()


def test_apply_all_flags_markers_and_log_lines(site: Path) -> None:
    done = apply_all(site, GENESIS_ENV)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    order = [
        "Genesis platform: {",
        "[Genesis pin-gate]",
        "[Genesis registry]",
        "[Genesis GPU profile]",
        "[Genesis Dispatcher] APPLY P4",
        "[Genesis] applied: P4",
        "Genesis Results:",
        "[Genesis] structured boot summary:",
        "[Genesis compile-watchdog] apply_all elapsed:",
    ]
    positions = [out.index(marker) for marker in order]
    assert positions == sorted(positions)
    applied, skipped, failed = map(
        int, re.search(r"Genesis Results: (\d+) applied, (\d+) skipped, (\d+) failed", out).groups()
    )
    assert failed == 0 and applied > 40 and "DRIFT" not in out and "SIMULATED" in out
    assert "_TQ_HYBRID_SUPPORTED = True  # [Genesis P4" in _file(site, "engine/arg_utils.py")
    assert "_MULTI_QUERY_VERIFY_KERNEL = True  # [Genesis P67" in _file(
        site, "v1/attention/backends/turboquant_attn.py"
    )
    assert "[Genesis P87" not in _file(site, engine.OVERLAY_FILES[0][1])  # explicitly off
    assert "[Genesis] skipped: P98 (TQ workspace revert) — upstream already carries this fix" in out
    assert "[Genesis] skipped: PN9" in out and "self-retired" in out
    assert "[Genesis] skipped: P40 (TQ k8v4 GQA kernel (pays only with L2 >= 24 MB)) — disabled by" in out


def test_apply_all_default_on_opt_in_and_kill_switch(site: Path) -> None:
    out = apply_all(
        site, {"GENESIS_ENABLE_P22": "0", "GENESIS_ENABLE_P67_TQ_MULTI_QUERY_KERNEL": "yes"}
    ).stdout
    assert "[Genesis] applied: P4 " in out  # legacy default-on, no flag needed
    assert "[Genesis] skipped: P22 (TQ shared dequant prealloc) — disabled by GENESIS_ENABLE_P22=0" in out
    assert "[Genesis] applied: P67 " in out
    assert (
        "skipped: P66 (cudagraph capture sizes divisible by 1+K) — opt-in only — set "
        "GENESIS_ENABLE_P66_CUDAGRAPH_SIZE_FILTER=1 to engage" in out
    )
    assert "[Genesis P22" not in _file(site, "v1/worker/gpu_model_runner.py")


def test_apply_all_warns_about_unknown_flags(site: Path) -> None:
    out = apply_all(site, {"GENESIS_ENABLE_P67": "1", "GENESIS_ENABLE_P999": "1"}).stdout
    assert (
        "GENESIS_ENABLE_P67 matches no dispatcher entry and is ignored (did you mean "
        "GENESIS_ENABLE_P67_TQ_MULTI_QUERY_KERNEL?)" in out
    )
    assert "GENESIS_ENABLE_P999 matches no dispatcher entry" in out


def test_apply_all_is_idempotent_by_marker(site: Path) -> None:
    first = apply_all(site, GENESIS_ENV)
    snapshot = {p: p.read_bytes() for p in (site / "vllm").rglob("*.py")}
    second = apply_all(site, GENESIS_ENV)
    assert first.returncode == second.returncode == 0
    assert {p: p.read_bytes() for p in (site / "vllm").rglob("*.py")} == snapshot
    results = [re.search(r"Genesis Results: .*", r.stdout).group(0) for r in (first, second)]
    assert results[0] == results[1]
    assert second.stdout.count("(IDEMPOTENT: marker present)") == int(results[1].split()[2])
    assert _file(site, "engine/arg_utils.py").count("[Genesis P4 ") == 1


@pytest.mark.parametrize("version", [PIN_A, "0.20.1rc1.dev16+g7a1eb8ac2"])
def test_strict_pin_gate_passes_allowlisted(tmp_path: Path, version: str) -> None:
    site = tmp_path / "s"
    engine.install_standin_vllm(site, version, genesis=True)
    done = apply_all(site, {"GENESIS_VLLM_PIN_POLICY": "strict"})
    assert (
        done.returncode == 0
        and f"vllm {version} is in KNOWN_GOOD_VLLM_PINS (policy=strict): OK" in done.stdout
    )


def test_strict_pin_gate_refuses_unlisted(tmp_path: Path) -> None:
    site = tmp_path / "s"
    engine.install_standin_vllm(site, PIN_UNLISTED, genesis=True, overlays=True)
    before = {p: p.read_bytes() for p in (site / "vllm").rglob("*.py")}
    done = apply_all(site, {"GENESIS_VLLM_PIN_POLICY": "strict", **GENESIS_ENV})
    assert done.returncode == 2
    assert (
        f"[Genesis pin-gate] STRICT FAIL: vllm {PIN_UNLISTED} is not in KNOWN_GOOD_VLLM_PINS" in done.stdout
    )
    assert "Genesis Results" not in done.stdout
    assert {p: p.read_bytes() for p in (site / "vllm").rglob("*.py")} == before
    warn = apply_all(site, GENESIS_ENV)  # default policy: warn and continue
    assert warn.returncode == 0 and "[Genesis pin-gate] WARNING" in warn.stdout and "0 failed" in warn.stdout


def test_p65_with_p67_fails(site: Path) -> None:
    done = apply_all(site, {**GENESIS_ENV, "GENESIS_ENABLE_P65_TURBOQUANT_SPEC_CG_DOWNGRADE": "1"})
    assert done.returncode == 1
    assert (
        "[Genesis] FAILED: P65 (TurboQuant spec-decode PIECEWISE cudagraph downgrade) — conflicts_with P67"
        in done.stdout
    )
    assert re.search(r"Genesis Results: \d+ applied, \d+ skipped, 2 failed", done.stdout)


def test_p87_over_the_marlin_overlay_is_a_drift_skip(site: Path, tmp_path: Path) -> None:
    done = apply_all(site, {"GENESIS_ENABLE_P87": "1"})
    assert done.returncode == 0
    assert re.search(r"\[Genesis\] DRIFT skipped: P87 .* required_anchor_missing", done.stdout)
    plain = tmp_path / "plain"
    engine.install_standin_vllm(plain, PIN_A, genesis=True)
    done = apply_all(plain, {"GENESIS_ENABLE_P87": "1"})
    assert done.returncode == 0 and "[Genesis] applied: P87" in done.stdout and "DRIFT" not in done.stdout


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes read-only files anyway")
def test_p87_on_a_read_only_target_fails(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    engine.install_standin_vllm(plain, PIN_A, genesis=True)
    (plain / "vllm" / engine.OVERLAY_FILES[0][1]).chmod(0o444)
    done = apply_all(plain, {"GENESIS_ENABLE_P87": "1"})
    assert done.returncode == 1 and re.search(r"\[Genesis\] FAILED: P87 .*Permission denied", done.stdout)


def test_target_that_cannot_be_written_fails(tmp_path: Path) -> None:
    """A directory in place of the file stands in for a read-only bind mount (works as root too)."""
    plain = tmp_path / "plain"
    engine.install_standin_vllm(plain, PIN_A, genesis=True)
    target = plain / "vllm" / "config" / "vllm.py"
    text = target.read_text()
    target.unlink()
    target.mkdir()
    done = apply_all(plain, {"GENESIS_ENABLE_P66_CUDAGRAPH_SIZE_FILTER": "1"})
    assert done.returncode == 1 and "[Genesis] FAILED: P66" in done.stdout
    target.rmdir()
    target.write_text(text)


def test_dry_run_and_no_gpu(site: Path) -> None:
    before = {p: p.read_bytes() for p in (site / "vllm").rglob("*.py")}
    dry = apply_all(site, GENESIS_ENV, "--dry-run")
    assert (
        dry.returncode == 0 and "Genesis Results (dry-run)" in dry.stdout and "would apply: P4" in dry.stdout
    )
    nogpu = apply_all(site, {**GENESIS_ENV, "NVIDIA_VISIBLE_DEVICES": "void"})
    assert (
        "[Genesis] skipped: P4 (TurboQuant KV on hybrid models) — platform: not NVIDIA CUDA" in nogpu.stdout
    )
    assert "[Genesis] applied: P64" in nogpu.stdout  # API-side patches do not need the GPU
    assert "[Genesis P4" not in _file(site, "engine/arg_utils.py")
    assert {p: p.read_bytes() for p in (site / "vllm").rglob("*.py") if "serving" not in p.name} == {
        p: b for p, b in before.items() if "serving" not in p.name
    }


def test_catalog_genesis_flag_set_applies_cleanly(site: Path) -> None:
    yaml = pytest.importorskip("yaml")
    catalog = Path(engine.__file__).resolve().parents[1] / "catalog" / "variants.yaml"
    if not catalog.is_file():
        pytest.skip("no catalog")
    flags = yaml.safe_load(catalog.read_text())["variants"]["tq3-mtp-genesis"]["genesis"]
    env = {
        **{f"GENESIS_ENABLE_{f}": "1" for f in flags["enable"]},
        **{f"GENESIS_ENABLE_{f}": "0" for f in flags["disable"]},
    }
    done = apply_all(site, {**env, "GENESIS_VLLM_PIN_POLICY": flags.get("pin_policy", "strict")})
    assert done.returncode == 0 and "matches no dispatcher entry" not in done.stdout
    assert " 0 failed" in done.stdout and "DRIFT" not in done.stdout


def _install_plugin(site: Path) -> None:
    """What `pip install --no-deps tools/genesis_vllm_plugin` leaves behind, via its own backend."""
    src = engine.ASSETS / "genesis" / "tools" / "genesis_vllm_plugin"
    sys.path.insert(0, str(src))
    try:
        import _sim_backend

        name = _sim_backend.build_wheel(str(site))
    finally:
        sys.path.remove(str(src))
        sys.modules.pop("_sim_backend", None)
    with zipfile.ZipFile(site / name) as whl:
        whl.extractall(site)


def test_plugin_alone_is_too_late_for_p4(serve, site: Path) -> None:
    """The v7.70 'F2' finding: plugin-time text patches land after arg_utils was imported."""
    _install_plugin(site)
    first = serve(TQ3_MTP, GENESIS_ENV)
    assert first.wait_exit() == 1
    assert "- genesis_v7 -> genesis_v7:register" in first.log and "[Genesis plugin]" in first.log
    assert "TurboQuant KV cache is not supported for hybrid models" in first.log
    # ... but the plugin did write the markers: the next boot of the same files (docker start) works
    second = serve(TQ3_MTP, GENESIS_ENV)
    assert second.wait_ready(), second.log


def test_plugin_wheel_builds_and_pip_installs_offline(tmp_path: Path) -> None:
    src = engine.ASSETS / "genesis" / "tools" / "genesis_vllm_plugin"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--no-build-isolation",
            "--target",
            str(tmp_path / "t"),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    eps = next((tmp_path / "t").glob("genesis_vllm_plugin-7.0.0.dev0.dist-info")) / "entry_points.txt"
    text = eps.read_text()
    assert "[vllm.general_plugins]\ngenesis_v7 = genesis_v7:register" in text
    assert "genesis = vllm._genesis.compat.cli:main" in text


# --- artifacts ----------------------------------------------------------------------------------


def test_genesis_repo_is_reproducible_and_servable(tmp_path: Path) -> None:
    sha_a = engine.build_genesis_repo(tmp_path / "a" / "genesis.git")
    sha_b = engine.build_genesis_repo(tmp_path / "b" / "genesis.git")
    assert sha_a == sha_b and re.fullmatch(r"[0-9a-f]{40}", sha_a)
    bare = tmp_path / "a" / "genesis.git"
    assert (bare / "info" / "refs").is_file() and (bare / "objects" / "info" / "packs").is_file()
    mtime = (bare / "info" / "refs").stat().st_mtime_ns
    assert engine.build_genesis_repo(bare) == sha_a and (bare / "info" / "refs").stat().st_mtime_ns == mtime
    work = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(bare), str(work)], check=True)
    assert not (work / "vllm" / "_genesis").exists()  # the default branch is the rewritten v12 history
    subprocess.run(["git", "-C", str(work), "checkout", "-q", sha_a], check=True)
    assert (work / "vllm" / "_genesis" / "patches" / "apply_all.py").is_file()
    guards = (work / "vllm" / "_genesis" / "guards.py").read_text()
    assert all(pin in guards for pin in engine.GENESIS_KNOWN_GOOD)


def test_weights_manifest_and_shards(tmp_path: Path) -> None:
    sums = engine.build_weights(tmp_path)
    root = tmp_path / "weights" / engine.WEIGHTS_NAME
    manifest = dict(reversed(line.split("  ")) for line in (root / "SHA256SUMS").read_text().splitlines())
    assert manifest == sums and set(manifest) == {p.name for p in root.iterdir()} - {"SHA256SUMS"}
    for name, digest in manifest.items():
        assert hashlib.sha256((root / name).read_bytes()).hexdigest() == digest
    for shard, size in engine.SHARDS:
        raw = (root / shard).read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8 : 8 + n])
        assert len(raw) == 8 + n + size and 100_000 < size < 1_000_000 and "__metadata__" in header
    config = json.loads((root / "config.json").read_text())
    assert config["layer_types"].count("full_attention") == 16 and config["num_key_value_heads"] == 4


def _fake_root(path: Path) -> Path:
    """A tiny stand-in for the debootstrap root: what the layer filter must keep or strip."""
    with tarfile.open(path, "w:gz") as tar:

        def add(
            name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, mode: int = 0o644, link: str = ""
        ) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.linkname, info.mtime = kind, mode, link, 1_700_000_000
            info.size = len(data) if kind == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)

        for d in (
            ".",
            "./etc",
            "./etc/ssh",
            "./usr",
            "./usr/bin",
            "./usr/lib",
            "./usr/lib/python3.11",
            "./usr/share",
            "./usr/share/doc",
            "./usr/share/doc/bash",
            "./usr/share/man",
            "./dev",
            "./tmp",
            "./var",
            "./var/lib",
            "./var/lib/apt",
            "./var/lib/apt/lists",
        ):
            add(d, kind=tarfile.DIRTYPE, mode=0o755)
        add("./etc/passwd", b"root:x:0:0:root:/root:/bin/bash\n")
        add("./etc/machine-id", b"0123456789abcdef\n")
        add("./etc/ssh/ssh_host_ed25519_key", b"PRIVATE", mode=0o600)
        add("./usr/bin/python3.11", b"\x7fELF fake", mode=0o755)
        add("./usr/bin/python3", kind=tarfile.SYMTYPE, link="python3.11")
        add("./usr/lib/python3.11/EXTERNALLY-MANAGED", b"[externally-managed]\n")
        add("./usr/lib/python3.11/os.py", b"# fake\n")
        add("./usr/share/doc/bash/copyright", b"GPL\n")
        add("./usr/share/doc/bash/changelog.gz", b"log")
        add("./usr/share/doc/bash/README", kind=tarfile.LNKTYPE, link="./usr/share/doc/bash/changelog.gz")
        add("./usr/bin/python3.11-hardlink", kind=tarfile.LNKTYPE, link="./usr/bin/python3.11")
        add("./usr/share/man/bash.1.gz", b"man")
        add("./var/lib/apt/lists/deb.example.org_dists", b"x" * 100)
        add("./dev/null", kind=tarfile.CHRTYPE, mode=0o666)
    return path


def _fake_wheel(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as whl:
        whl.writestr("pip/__init__.py", "__version__ = '0.0-fake'\n")
        whl.writestr("pip-0.0.dist-info/METADATA", "Name: pip\nVersion: 0.0\n")
        whl.writestr(
            "pip-0.0.dist-info/entry_points.txt",
            "[console_scripts]\npip = pip._internal.cli.main:main\npip3 = pip._internal.cli.main:main\n"
            "pip3.13 = pip._internal.cli.main:main\n",
        )
    return path


def _layer_names(archive: tarfile.TarFile, layer: str) -> dict[str, tarfile.TarInfo]:
    inner = archive.extractfile(layer)
    assert inner is not None
    with tarfile.open(fileobj=io.BytesIO(inner.read())) as tar:
        return {m.name: m for m in tar.getmembers()}


def test_image_archive_is_consistent(tmp_path: Path) -> None:
    root = _fake_root(tmp_path / "root.tar.gz")
    wheel = _fake_wheel(tmp_path / "pip-0.0-py3-none-any.whl")
    spec = engine.IMAGES[0]
    out = tmp_path / "www" / "images" / engine.archive_name(spec)
    built = engine.build_image_archive(out, root, spec, cache_dir=tmp_path / "cache", wheels=[wheel])
    with tarfile.open(out) as archive:
        manifest = json.loads(archive.extractfile("manifest.json").read())  # type: ignore[union-attr]
        assert len(manifest) == 1 and manifest[0]["RepoTags"] == [f"vllm/vllm-openai:{spec.tag}"]
        config_raw = archive.extractfile(manifest[0]["Config"]).read()  # type: ignore[union-attr]
        image_id = hashlib.sha256(config_raw).hexdigest()
        assert manifest[0]["Config"] == f"{image_id}.json" and built["digest"] == f"sha256:{image_id}"
        config = json.loads(config_raw)
        diff_ids = config["rootfs"]["diff_ids"]
        assert config["rootfs"]["type"] == "layers" and len(diff_ids) == len(manifest[0]["Layers"]) == 2
        for layer, diff_id in zip(manifest[0]["Layers"], diff_ids, strict=True):
            data = archive.extractfile(layer).read()  # type: ignore[union-attr]
            assert "sha256:" + hashlib.sha256(data).hexdigest() == diff_id
        repositories = json.loads(archive.extractfile("repositories").read())  # type: ignore[union-attr]
        assert repositories == {"vllm/vllm-openai": {spec.tag: manifest[0]["Layers"][-1].split("/")[0]}}
        assert (
            config["config"]["Entrypoint"] == ["vllm", "serve"]
            and config["config"]["Labels"]["io.rigfleet.simulated"] == "true"
        )
        base = _layer_names(archive, manifest[0]["Layers"][0])
        vllm_layer = _layer_names(archive, manifest[0]["Layers"][1])
    assert "etc/passwd" in base and "usr/share/doc/bash/copyright" in base and "usr/bin/python3" in base
    for gone in (
        "usr/share/doc/bash/changelog.gz",
        "usr/share/doc/bash/README",
        "usr/share/man/bash.1.gz",
        "etc/ssh/ssh_host_ed25519_key",
        "usr/lib/python3.11/EXTERNALLY-MANAGED",
        "dev/null",
        "var/lib/apt/lists/deb.example.org_dists",
    ):
        assert gone not in base, gone
    assert {"dev", "tmp", "var/lib/apt/lists"} <= set(base)
    assert base["etc/machine-id"].size == 0
    assert (
        base["usr/bin/python3.11-hardlink"].islnk()
        and base["usr/bin/python3.11-hardlink"].linkname == "usr/bin/python3.11"
    )
    assert "usr/local/lib/python3.11/dist-packages/pip/__init__.py" in base
    assert {"usr/local/bin/pip", "usr/local/bin/pip3", "usr/local/bin/pip3.11"} <= set(base)
    site = "usr/local/lib/python3.11/dist-packages"
    assert (
        f"{site}/vllm/version.py" in vllm_layer
        and f"{site}/vllm-{spec.vllm_version}.dist-info/METADATA" in vllm_layer
    )
    assert vllm_layer["usr/local/bin/vllm"].mode == 0o755 and "vllm-workspace" in vllm_layer
    # idempotent: same inputs, same archive, not rewritten
    mtime = out.stat().st_mtime_ns
    again = engine.build_image_archive(out, root, spec, cache_dir=tmp_path / "cache", wheels=[wheel])
    assert again["digest"] == built["digest"] and out.stat().st_mtime_ns == mtime
    # the vllm layer is reproducible bit for bit
    other = tmp_path / "other.tar"
    assert (
        engine.build_image_archive(other, root, spec, cache_dir=tmp_path / "cache2", wheels=[wheel])[
            "diff_ids"
        ]
        == built["diff_ids"]
    )


def test_build_engine_artifacts_returns_valid_pinsets(tmp_path: Path) -> None:
    root = _fake_root(tmp_path / "root.tar.gz")
    wheel = _fake_wheel(tmp_path / "pip-0.0-py3-none-any.whl")
    www = tmp_path / "www"
    result = engine.build_engine_artifacts(www, root, cache_dir=tmp_path / "cache", wheels=[wheel])
    assert result["group_vars"] == {"weights_source": {"url": layout.HOST_URL + "weights/"}}
    pinsets = result["pinsets"]
    assert set(pinsets) == {"sandbox-a", "sandbox-b", "sandbox-c"}
    a = pinsets["sandbox-a"]
    assert (
        a["vllm_version"] == PIN_A
        and a["base_image"]["tag"] == "nightly-01d4d1ad375dc5854779c593eee093bcebb0cada"
    )
    assert a["description"].startswith("SIMULATED") and a["python_deps"] == {}
    assert a["genesis"]["source"] == layout.HOST_URL + "genesis.git"
    for name, pinset in pinsets.items():
        archive = www / "images" / pinset["base_image"]["archive"].rsplit("/", 1)[1]
        assert archive.is_file(), name
        with tarfile.open(archive) as tar:
            config_name = json.loads(tar.extractfile("manifest.json").read())[0]["Config"]  # type: ignore[union-attr]
        assert pinset["base_image"]["digest"] == "sha256:" + config_name.removesuffix(".json")
        for overlay_file in pinset["overlays"][0]["files"]:
            local = www / overlay_file["source"].removeprefix(engine.HOST_URL)
            assert hashlib.sha256(local.read_bytes()).hexdigest() == overlay_file["sha256"]
    schema = pytest.importorskip("rigfleet.schema")
    for name, body in pinsets.items():
        schema.PinSet(name=name, **body)
    again = engine.build_engine_artifacts(www, root, cache_dir=tmp_path / "cache", wheels=[wheel])
    assert again == result


def test_assets_are_labelled_simulated() -> None:
    for path in engine._asset_files(engine.ASSETS):
        if path.suffix == ".py" and path.name != "__init__.py":
            head = path.read_text()[:600]
            assert "SIMULATED" in head or "stand-in" in head, path


def test_every_genesis_anchor_exists_in_the_standin_vllm(tmp_path: Path) -> None:
    site = tmp_path / "s"
    engine.install_standin_vllm(site, PIN_A, genesis=True)
    code = (
        "import json; from vllm._genesis.dispatcher import REGISTRY; "
        "print(json.dumps([[s.id, s.target, s.anchor_text] for s in REGISTRY]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=_env(site), capture_output=True, text=True, check=True
    )
    for patch_id, target, anchor in json.loads(done.stdout):
        assert anchor in _file(site, target), (patch_id, target)


def test_kv_formula_agrees_with_the_capacity_planner(tmp_path: Path) -> None:
    """The gate warns when the boot-log pool is under 80% of the planner's: the stand-in must agree."""
    planner = pytest.importorskip("rigfleet.planner")
    catalog = pytest.importorskip("rigfleet.catalog")
    schema = pytest.importorskip("rigfleet.schema")
    rig = schema.Rig(name="r", ssh_hostname="192.0.2.1", pinset="p", variant="v", model_dir="/srv/models")
    site = tmp_path / "s"
    engine.install_standin_vllm(site, PIN_A)
    wanted = {}
    for name, variant in catalog.variants().items():
        wanted[name] = (
            variant.kv_cache_dtype,
            variant.gpu_memory_utilization,
            variant.max_num_batched_tokens,
            1 if variant.mtp_tokens else 0,
            planner.predict(rig, variant).kv_pool_tokens,
        )
    code = (
        "import json, sys; from vllm.v1.core.kv_cache_utils import compute_kv_pool\n"
        "w = json.loads(sys.argv[1]); out = {}\n"
        "for name, (kv, util, batched, mtp, _) in w.items():\n"
        "    out[name] = compute_kv_pool(kv_cache_dtype=kv, gpu_memory_utilization=util, num_gpus=2,\n"
        "        weights_gib=17502027366 / 2**30, max_num_batched_tokens=batched, full_attention_layers=16,\n"
        "        kv_heads=4, head_dim=256, mtp_layers=mtp).tokens\n"
        "print(json.dumps(out))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(wanted)],
        env=_env(site),
        capture_output=True,
        text=True,
        check=True,
    )
    for name, tokens in json.loads(done.stdout).items():
        assert abs(tokens - wanted[name][4]) <= 16, (name, tokens, wanted[name][4])
