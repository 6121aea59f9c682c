"""`vllm serve`: boot log, validation and the OpenAI-compatible HTTP server (SIMULATED stand-in).

Boot: parse flags (argparse errors exit 2) -> validate (vLLM's refusals, exit 1 with a traceback)
-> load `vllm.general_plugins` -> read Genesis markers -> "load weights" (shards must exist and
have sane safetensors headers; AutoRound/GPTQ INT4 at TP>=2 needs the Marlin pad overlay or
Genesis P87) -> KV pool (vllm/v1/core/kv_cache_utils.py) -> bind -> "Application startup complete.".
No model runs; without faults the server is ready in well under 2 s.

Endpoints: GET /health, /version, /v1/models, /metrics; POST /v1/chat/completions, /v1/completions.
With --api-key (or VLLM_API_KEY) every /v1 route needs `Authorization: Bearer <key>` (401
otherwise); /health, /version and /metrics stay open, as in vLLM.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from vllm import __version__
from vllm._sim import SIM_LABEL, faults, genesis_state, platform
from vllm._sim.degrade import Degrader
from vllm._sim.metrics import Stats
from vllm._sim.textgen import Reply
from vllm.config.vllm import VllmConfig
from vllm.engine.arg_utils import EngineArgs
from vllm.entrypoints.openai.chat_completion import serving
from vllm.entrypoints.openai.cli_args import make_arg_parser, non_default_args
from vllm.logger import init_logger, set_process
from vllm.v1.core.kv_cache_utils import GIB, compute_kv_pool

logger = init_logger(__name__)
MARLIN_MIN_THREAD_N = 64  # GPTQ_MARLIN_MIN_THREAD_N upstream
INT4_QUANT = {"auto_round", "auto-round", "gptq", "gptq_marlin", "awq", "awq_marlin", "inc"}
ROUTES = ("/health", "/version", "/metrics", "/v1/models", "/v1/chat/completions", "/v1/completions")


class BootError(Exception):
    """A boot failure whose traceback text is already printed."""


class Engine:
    def __init__(self, config: VllmConfig, kv_tokens: int, garbage: bool) -> None:
        self.config = config
        self.kv_tokens = kv_tokens
        self.garbage = garbage
        self.garbage_full_acceptance = faults.garbage_full_acceptance()
        self.unhealthy = "unhealthy" in faults.active()
        self.degrade = Degrader()
        self.fingerprint = serving.fingerprint(__version__)
        self.created = int(time.time())
        self.stats = Stats(
            config.served_model_names[0],
            config.kv_cache_dtype,
            kv_tokens // 16,
            spec_k=config.num_spec_tokens,
        )
        self.slots = threading.BoundedSemaphore(max(config.max_num_seqs, 1))
        self.log_lock = threading.Lock()

    def finish(self, prompt: str, prompt_tokens: int, reply: Reply) -> None:
        step = serving.spec_step(self, reply)
        hits = self.stats.record(
            prompt=prompt,
            prompt_tokens=prompt_tokens,
            completion_tokens=reply.completion_tokens,
            finish_reason=reply.finish_reason,
            prefix_caching=self.config.enable_prefix_caching,
            spec=step,
        )
        if self.config.enable_prefix_caching is False:
            hits = 0
        set_process("APIServer")
        al = step.mean_acceptance_length if step and step.drafts else 1.0
        decode_tps = 28.0 * al
        usage = 100.0 * (prompt_tokens + reply.completion_tokens) / max(self.kv_tokens, 1)
        hit_rate = 100.0 * hits / max(prompt_tokens, 1)
        with self.log_lock:
            logger.info(
                "Engine 000: Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, "
                "Running: 0 reqs, Waiting: 0 reqs, GPU KV cache usage: %.1f%%, Prefix cache hit rate: %.1f%%",
                prompt_tokens / 2.0,
                decode_tps,
                usage,
                hit_rate,
            )
            if step is not None and step.drafts:
                per_pos = [n / step.drafts for n in step.accepted_per_pos]
                logger.info(
                    "SpecDecoding metrics: Mean acceptance length: %.2f, Accepted throughput: %.2f tokens/s, "
                    "Drafted throughput: %.2f tokens/s, Accepted: %d tokens, Drafted: %d tokens, "
                    "Per-position acceptance rate: %s, Avg Draft acceptance rate: %.1f%%",
                    step.mean_acceptance_length,
                    decode_tps * (al - 1) / al,
                    decode_tps * step.draft_tokens / max(step.drafts, 1) / al,
                    step.accepted,
                    step.draft_tokens,
                    ", ".join(f"{r:.3f}" for r in per_pos),
                    100.0 * step.accepted / max(step.draft_tokens, 1),
                )


def _print_traceback(frames: list[tuple[str, int, str, str]], final: str) -> None:
    lines = ["Traceback (most recent call last):"]
    for path, line, func, code in frames:
        lines.append(f'  File "{path}", line {line}, in {func}')
        lines.append(f"    {code}")
    lines.append(final)
    print("\n".join(lines), file=sys.stderr, flush=True)


def _boot_crash(pkg: Path) -> None:
    set_process("EngineCore_DP0")
    logger.error("EngineCore failed to start.")
    _print_traceback(
        [
            (
                str(pkg / "v1/engine/core.py"),
                702,
                "run_engine_core",
                "engine_core = EngineCoreProc(*args, **kwargs)",
            ),
            (str(pkg / "v1/engine/core.py"), 91, "__init__", "self._initialize_kv_caches(vllm_config)"),
            (
                str(pkg / "v1/worker/gpu_worker.py"),
                263,
                "determine_available_memory",
                "self.model_runner.profile_run()",
            ),
            (
                str(pkg / "v1/worker/gpu_model_runner.py"),
                3311,
                "profile_run",
                "hidden_states, last_hidden_states = self._dummy_run(",
            ),
        ],
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.02 GiB. GPU 0 has a total "
        "capacity of 23.56 GiB of which 402.38 MiB is free. Including non-PyTorch memory, this process "
        "has 23.15 GiB memory in use. (SIMULATED fault: RIGFLEET_SANDBOX_FAULT=boot-crash)",
    )
    set_process("APIServer")
    print(
        "RuntimeError: Engine core initialization failed. See root cause above. "
        "Failed core proc(s): {'EngineCore_DP0': 1}",
        file=sys.stderr,
        flush=True,
    )
    raise BootError


def _check_weights(config: VllmConfig) -> None:
    model = config.model
    if not model.shards:
        raise RuntimeError(f"Cannot find any model weights with `{model.path}`")
    for shard in model.shards:
        path = model.path / shard
        if not path.is_file():
            raise FileNotFoundError(2, "No such file or directory", str(path))
        with open(path, "rb") as handle:
            head = handle.read(8)
            size = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
            if size < 2 or size > min(path.stat().st_size, 100 << 20):
                raise RuntimeError(
                    "safetensors_rust.SafetensorError: Error while deserializing header: "
                    f"HeaderTooLarge ({path})"
                )
            try:
                json.loads(handle.read(size))
            except ValueError as exc:
                raise RuntimeError(
                    "safetensors_rust.SafetensorError: Error while deserializing header: "
                    f"InvalidHeaderDeserialization ({path})"
                ) from exc


def _check_marlin(config: VllmConfig, markers: dict[str, str]) -> None:
    quant = (config.quantization or "").lower()
    if quant not in INT4_QUANT or config.tensor_parallel_size < 2:
        return
    path = genesis_state.package_dir() / "model_executor/kernels/linear/mixed_precision/marlin.py"
    source = path.read_text(encoding="utf-8")
    # the overlay's pad (_maybe_pad_n), Genesis P87, or a real release's file that carries the merged
    # fix (0.27.1 zero-pads at weight prep: marlin_pad_qweight ...)
    if "_maybe_pad_n" in source or "marlin_pad_" in source or "P87" in markers:
        logger.info("Using MarlinLinearKernel for GPTQMarlinLinearMethod (sub-tile N padded)")
        return
    # 96 gate heads split over TP=2 -> 48 < GPTQ_MARLIN_MIN_THREAD_N, the bug vllm#40361 fixes.
    per_partition = 96 // config.tensor_parallel_size
    if "SIMULATED stand-in" in source:
        from vllm.model_executor.kernels.linear.mixed_precision import marlin

        ok, message = marlin.check_marlin_supports_shape(per_partition)
    else:  # a real release's unpadded file (importing it needs torch): the same refusal
        ok = per_partition % MARLIN_MIN_THREAD_N == 0
        message = (f"Weight output_size_per_partition = {per_partition} is not divisible by min_thread_n = "
                   f"{MARLIN_MIN_THREAD_N}. Consider reducing tensor_parallel_size or running with "
                   "--quantization gptq.")
    if not ok:
        raise ValueError(message)


def _boot(argv: list[str]) -> tuple[Engine, ThreadingHTTPServer] | int:
    args = make_arg_parser().parse_args(argv)
    set_process("APIServer")
    logger.warning(
        "%s: SIMULATED stand-in for vLLM (rigfleet sandbox); no model runs and no GPU is used", SIM_LABEL
    )
    logger.info("vLLM API server version %s (simulated engine)", __version__)
    logger.info("non-default args: %s", non_default_args(args))
    for name in sorted(faults.unknown()):
        logger.warning(
            "unknown RIGFLEET_SANDBOX_FAULT value %r ignored (known: %s)", name, ", ".join(faults.KNOWN)
        )
    active = faults.active()
    if active:
        logger.warning("SIMULATED faults active: %s", ", ".join(sorted(active)))
    engine_args = EngineArgs.from_cli_args(args)  # loads the general plugins, as vLLM does
    config = engine_args.create_engine_config()
    model = config.model
    logger.info("Resolved architecture: %s", model.architectures[0])
    logger.info("Using max model len %d", config.max_model_len)
    if config.enable_chunked_prefill:
        logger.info(
            "Chunked prefill is enabled with max_num_batched_tokens=%d.", config.max_num_batched_tokens
        )
    set_process("EngineCore_DP0")
    spec = config.speculative
    logger.info(
        "Initializing a V1 LLM engine (v%s) with config: model=%r, speculative_config=%s, dtype=%s, "
        "max_seq_len=%d, tensor_parallel_size=%d, pipeline_parallel_size=%d, quantization=%s, "
        "enforce_eager=%s, kv_cache_dtype=%s, served_model_name=%s, enable_prefix_caching=%s, "
        "enable_chunked_prefill=%s",
        __version__,
        config.model_name,
        f"SpeculativeConfig(method={spec.method!r}, num_spec_tokens={spec.num_speculative_tokens})"
        if spec
        else None,
        config.dtype,
        config.max_model_len,
        config.tensor_parallel_size,
        config.pipeline_parallel_size,
        config.quantization,
        config.enforce_eager,
        config.kv_cache_dtype,
        config.served_model_names[0],
        config.enable_prefix_caching,
        config.enable_chunked_prefill,
    )
    markers = genesis_state.all_markers()
    if markers:
        logger.info(
            "Genesis text-patch markers in the vllm package: %d (%s)",
            len(markers),
            ", ".join(sorted(markers)),
        )
    else:
        logger.info("Genesis text-patch markers in the vllm package: none")
    garbage = "garbage-output" in active
    tq = config.kv_cache_dtype.startswith("turboquant_")
    if tq and spec is not None:
        from vllm.v1.attention.backends import turboquant_attn

        if turboquant_attn.multi_query_verify_kernel():
            logger.info("TurboQuant: spec-decode K+1 verify uses the multi-query kernel (Genesis P67)")
        else:
            logger.info("TurboQuant: spec-decode K+1 verify uses the upstream _prefill_attention path")
            garbage = True
        if "P65" in markers:
            logger.info("cudagraph mode for TurboQuant spec-decode downgraded to PIECEWISE (Genesis P65)")
    if "P66" in markers and spec is not None:
        q = 1 + spec.num_speculative_tokens
        sizes = config.cudagraph_capture_sizes
        kept = [s for s in sizes if s % q == 0 or s == q][:3]
        logger.info(
            "[Genesis P66] Filtered cudagraph_capture_sizes for spec-decode uniform_query_len=%d: kept %s, "
            "removed %s",
            q,
            kept,
            [s for s in sizes if s < q],
        )
    cap = os.environ.get("GENESIS_PROFILE_RUN_CAP_M")
    if "P72" in markers and cap and cap != str(config.max_num_batched_tokens):
        logger.warning(
            "[Genesis P72] GENESIS_PROFILE_RUN_CAP_M=%s differs from max_num_batched_tokens=%d: the profile "
            "run under-reserves activations (OOM risk at a full batch)",
            cap,
            config.max_num_batched_tokens,
        )
    set_process("Worker_TP0")
    logger.info("Starting to load model %s...", config.model_name)
    _check_marlin(config, markers)
    _check_weights(config)
    weights_gib = model.weights_bytes / GIB
    logger.info("Loading weights took 0.21 seconds")
    logger.info("Model loading took %.4f GiB memory and 0.4 seconds", weights_gib / config.world_size)
    if "boot-crash" in active:
        _boot_crash(genesis_state.package_dir())
    set_process("EngineCore_DP0")
    logger.info("Memory profiling takes 0.35 seconds")
    pool = compute_kv_pool(
        kv_cache_dtype=config.kv_cache_dtype,
        gpu_memory_utilization=config.gpu_memory_utilization,
        num_gpus=config.world_size,
        weights_gib=weights_gib,
        max_num_batched_tokens=config.max_num_batched_tokens,
        full_attention_layers=model.full_attention_layers,
        kv_heads=model.kv_heads,
        head_dim=model.head_dim,
        mtp_layers=1 if spec is not None and spec.method == "mtp" else 0,
        gpu_memory_gib=platform.GPU_MEMORY_GIB,
    )
    logger.info("Available KV cache memory: %.2f GiB", max(pool.per_gpu_available_gib, 0.0))
    if pool.tokens <= 0:
        raise ValueError(
            "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
            "initializing the engine."
        )
    if pool.tokens < config.max_model_len:
        needed = config.max_model_len * pool.bytes_per_token / GIB
        raise ValueError(
            "To serve at least one request with the models's max seq len "
            f"({config.max_model_len}), ({needed:.2f} GiB KV cache is needed, which is larger than the "
            "available KV cache memory "
            f"({pool.per_gpu_available_gib * config.world_size:.2f} GiB). Based on the available memory, the "
            f"estimated maximum model length is {pool.tokens}. Try increasing `gpu_memory_utilization` or "
            "decreasing `max_model_len` when initializing the engine."
        )
    logger.info("GPU KV cache size: %s tokens", f"{pool.tokens:,}")
    logger.info(
        "Maximum concurrency for %s tokens per request: %.2fx",
        f"{config.max_model_len:,}",
        pool.max_concurrency(config.max_model_len),
    )
    if not config.enforce_eager:
        logger.info(
            "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): %d sizes",
            len(config.cudagraph_capture_sizes),
        )
        logger.info("Graph capturing finished in 1 secs, took 0.45 GiB")
    if "slow-boot" in active:
        delay = faults.slow_boot_seconds()
        logger.info("SIMULATED slow boot: compiling for %.0f s before the server starts", delay)
        deadline = time.monotonic() + delay
        while time.monotonic() < deadline:
            time.sleep(min(5.0, max(deadline - time.monotonic(), 0.0)))
            if time.monotonic() < deadline:
                logger.info(
                    "Compilation in progress (SIMULATED slow boot), %.0f s left", deadline - time.monotonic()
                )
        logger.info("Compilation finished")
    logger.info("init engine (profile, create kv cache, warmup model) took 0.9 seconds")
    engine = Engine(config, pool.tokens, garbage)
    set_process("APIServer")
    logger.info("Starting vLLM API server 0 on http://%s:%d", config.host, config.port)
    logger.info("Available routes are:")
    for route in ROUTES:
        logger.info("Route: %s, Methods: %s", route, "POST" if route.endswith("completions") else "GET")
    server = ThreadingHTTPServer((config.host, config.port), _handler(engine))
    server.daemon_threads = True
    return engine, server


def _uvicorn(line: str) -> None:
    print(f"(APIServer pid={os.getpid()}) INFO:     {line}", flush=True)


def _handler(engine: Engine) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "uvicorn"
        sys_version = ""

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
            pass

        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            try:
                phrase = self.responses.get(int(code), ("",))[0]
            except (TypeError, ValueError):
                phrase = ""
            _uvicorn(
                f'{self.client_address[0]}:{self.client_address[1]} - "{self.requestline}" {code} {phrase}'
            )

        def _send(self, status: int, payload: object = None, content_type: str = "application/json") -> None:
            body = (
                b""
                if payload is None
                else (payload.encode() if isinstance(payload, str) else json.dumps(payload).encode())
            )
            self.send_response(status)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _authorized(self) -> bool:
            key = engine.config.api_key
            if not key or not self.path.startswith("/v1"):
                return True
            if self.headers.get("Authorization", "") == f"Bearer {key}":
                return True
            self._send(401, {"error": "Unauthorized"})
            return False

        def do_GET(self) -> None:  # noqa: N802 - http.server naming
            path = self.path.split("?", 1)[0]
            if not self._authorized():
                return
            if path == "/health":
                self._send(500 if engine.unhealthy else 200)
            elif path == "/version":
                self._send(200, {"version": __version__})
            elif path == "/metrics":
                self._send(200, engine.stats.render(), "text/plain; version=0.0.4; charset=utf-8")
            elif path == "/v1/models":
                cfg = engine.config
                data = [
                    {
                        "id": name,
                        "object": "model",
                        "created": engine.created,
                        "owned_by": "vllm",
                        "root": cfg.model_name,
                        "parent": None,
                        "max_model_len": cfg.max_model_len,
                        "permission": [],
                    }
                    for name in cfg.served_model_names
                ]
                self._send(200, {"object": "list", "data": data})
            else:
                self._send(404, {"detail": "Not Found"})

        def do_POST(self) -> None:  # noqa: N802 - http.server naming
            path = self.path.split("?", 1)[0]
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            if not self._authorized():
                return
            if path not in ("/v1/chat/completions", "/v1/completions"):
                self._send(404, {"detail": "Not Found"})
                return
            try:
                body = json.loads(raw or b"{}")
                if not isinstance(body, dict):
                    raise ValueError("request body must be a JSON object")
            except ValueError as exc:
                self._send(
                    400,
                    {
                        "error": {
                            "message": f"Invalid JSON body: {exc}",
                            "type": "BadRequestError",
                            "param": None,
                            "code": 400,
                        }
                    },
                )
                return
            with engine.stats.lock:
                engine.stats.waiting += 1
            with engine.slots:
                with engine.stats.lock:
                    engine.stats.waiting -= 1
                    engine.stats.running += 1
                try:
                    handler = (
                        serving.handle_chat
                        if path.endswith("chat/completions")
                        else serving.handle_completion
                    )
                    status, payload = handler(engine, body)
                finally:
                    with engine.stats.lock:
                        engine.stats.running -= 1
            if isinstance(payload, serving.Stream):
                self._stream(payload)
            else:
                self._send(status, payload)

        def _stream(self, stream: serving.Stream) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/event-stream; charset=utf-8")
            self.send_header("cache-control", "no-cache")
            self.send_header("connection", "close")
            self.end_headers()
            for chunk in stream.chunks:
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            if stream.broken:
                blank = [{"index": 0, "delta": {"content": ""}, "finish_reason": None}]
                empty = {**stream.chunks[-1], "choices": blank}
                self.wfile.write(f"data: {json.dumps(empty)}\n\n".encode() * 2)
                self.wfile.write(f"data: {json.dumps(empty)[:40]}\n\n".encode())
            else:
                self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

    return Handler


def run_server(argv: list[str]) -> int:
    def stop(signum: int, _frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one shutdown is enough
        raise KeyboardInterrupt

    # PID 1 in a container has no default SIGTERM action: install one so `docker stop` is quick.
    signal.signal(signal.SIGTERM, stop)
    server: ThreadingHTTPServer | None = None
    try:
        booted = _boot(argv)
        if isinstance(booted, int):
            return booted
        _engine, server = booted
        _uvicorn(f"Started server process [{os.getpid()}]")
        _uvicorn("Waiting for application startup.")
        _uvicorn("Application startup complete.")
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        if server is not None:
            set_process("APIServer")
            logger.info("Shutting down FastAPI HTTP server.")
        return 0
    except BootError:
        return 1
    except (ValueError, NotImplementedError, RuntimeError, OSError):
        traceback.print_exc()
        return 1
    finally:
        if server is not None:
            server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(run_server(sys.argv[1:]))
