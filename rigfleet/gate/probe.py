"""The health gate and verify ladder, run ON the rig: `python3 probe.py RELEASE_DIR [--level L] [--timeout S]`.

Levels (each includes the one before): smoke (= the swap gate's `basic`: running, /health, models,
one completion, boot log), full (long-output degeneracy, streaming, tool calls, salted needles,
a short multi-turn soak with VRAM growth from nvidia-smi over it, MTP acceptance; the swap gate's
`full`), stress (needles at several
depths up to the planned context and a limit probe at max_model_len), soak (sessions x turns of
multi-turn traffic: empty replies, VRAM growth from nvidia-smi, throughput retention).

STDLIB ONLY (uploaded next to checks.py into /opt/rigfleet/gate/ and run as root there). It
reads the release's release.json (container, port, served names, what the variant needs) and the
API key from the release's 0600 env file, talks to the API over the rig's own loopback (or the
bind address), reads the container state and boot log through `docker`, and prints ONE JSON
object on stdout. Progress goes to stderr. Exit 0 when the gate passed, 1 when it failed.

Every request loop is bounded in count and time: readiness within --timeout seconds, the full
level's checks within another --timeout seconds, each request within request_timeout_s.
An operator can re-run it by hand: sudo python3 /opt/rigfleet/gate/probe.py /opt/rigfleet/current
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

try:  # on the rig: a plain script next to checks.py
    import checks  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # on the control machine (tests): the package
    from rigfleet.gate import checks

Check = checks.Check  # short name for building results
ENV_FILE = "rigfleet.env"
LOG_TAIL_LINES = 40
# Readiness polls start short and back off to POLL_S: a swap's downtime ends when the gate sees the
# engine ready, so a fixed 2 s sleep after the first refused connection was most of rigfleet's share
# of a swap; backing off keeps a long (real) boot from being probed more than once a second.
POLL_FIRST_S = 0.05
POLL_S = 1.0
LEVELS = ("smoke", "full", "stress", "soak")
ALIASES = {"basic": "smoke"}  # the swap gate's name for smoke


def log(message: str) -> None:
    print(f"[gate] {message}", file=sys.stderr, flush=True)


def read_env_file(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return values
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            values[key.strip()] = value.strip()
    return values


class Api:
    """A tiny OpenAI-API client that never goes through a proxy and never raises."""

    def __init__(self, base_url: str, api_key: str | None) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def request(self, method: str, path: str, body: Any = None, timeout: float = 10) -> tuple[int, Any]:
        """(HTTP status, JSON body or text); status 0 = no answer (refused, reset, timed out)."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base_url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with self.opener.open(req, timeout=max(1.0, timeout)) as resp:
                return resp.status, _decode(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, _decode(exc.read())
        except (OSError, ValueError) as exc:  # URLError, ConnectionError, socket.timeout
            return 0, f"{type(exc).__name__}: {exc}"

    def chat(self, model: str, messages: list[dict[str, str]], max_tokens: int, timeout: float,
             **extra: Any) -> tuple[int, Any]:
        body = {
            "model": model,
            "messages": messages,
            "temperature": 0,  # deterministic: the same release gives the same answers
            "max_tokens": max_tokens,
            "chat_template_kwargs": {"enable_thinking": False},
            **extra,
        }
        return self.request("POST", "/v1/chat/completions", body, timeout)


def _decode(raw: bytes) -> Any:
    text = raw.decode("utf-8", "replace")
    try:
        return json.loads(text)
    except ValueError:
        return text


def docker(*args: str, timeout: float = 60) -> tuple[int, str]:
    try:
        proc = subprocess.run(["docker", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 1, str(exc)
    return proc.returncode, proc.stdout.decode("utf-8", "replace")


def container_state(name: str) -> dict[str, Any] | None:
    code, out = docker("inspect", "--type", "container", name, timeout=30)
    if code != 0:
        return None
    try:
        info = json.loads(out)[0]
    except (ValueError, IndexError):
        return None
    state = info.get("State") or {}
    return {
        "id": info.get("Id", ""),
        "status": state.get("Status", ""),
        "exit_code": state.get("ExitCode", 0),
        "restart_count": info.get("RestartCount", 0),
        "health": (state.get("Health") or {}).get("Status"),
        "release": ((info.get("Config") or {}).get("Labels") or {}).get("io.rigfleet.release"),
    }


def gpu_memory_used() -> int | None:
    """MiB in use over every GPU, from nvidia-smi (None when it does not answer)."""
    try:
        proc = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    values = [line.strip() for line in proc.stdout.decode("utf-8", "replace").splitlines() if line.strip()]
    if proc.returncode != 0 or not values or not all(v.isdigit() for v in values):
        return None
    return sum(int(v) for v in values)


class Gate:
    def __init__(self, release_dir: Path, level: str, timeout: float,
                 settings: dict[str, Any] | None = None) -> None:
        self.release_dir = release_dir
        self.meta: dict[str, Any] = json.loads((release_dir / "release.json").read_text(encoding="utf-8"))
        self.level = ALIASES.get(level, level)
        self.timeout = timeout
        self.settings = dict(checks.DEFAULTS) | dict(self.meta.get("gate") or {}) | dict(settings or {})
        env = read_env_file(release_dir / ENV_FILE)
        self.secrets = [v for k, v in env.items() if v and k in ("VLLM_API_KEY", "HUGGING_FACE_HUB_TOKEN")]
        self.api = Api(self.meta["base_url"], env.get("VLLM_API_KEY"))
        self.container = self.meta["container_name"]
        self.model = self.meta["served_model_names"][0]
        self.checks: list[checks.Check] = []
        self.out: dict[str, Any] = {
            "release_id": self.meta.get("release_id"),
            "level": level,
            "started_epoch": time.time(),
            "ready_epoch": None,
            "kv_pool_tokens": None,
            "kv_predicted": self.meta.get("kv_predicted"),
            "acceptance_length": None,
            "container": None,
        }

    # -- helpers --

    def redact(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return text

    def request_timeout(self, deadline: float) -> float:
        return min(float(self.settings["request_timeout_s"]), deadline - time.time())

    def boot_log(self) -> str:
        return docker("logs", self.container, timeout=120)[1]

    # -- readiness: running, /health, /v1/models, one deterministic chat completion --

    def wait_ready(self) -> bool:
        deadline = time.time() + self.timeout
        grace = float(self.settings["unhealthy_grace_s"])
        bad_health_since: float | None = None
        warmed = False
        last = "no answer yet"
        pause = POLL_FIRST_S
        while time.time() < deadline:
            state = container_state(self.container)
            self.out["container"] = state
            if state is None:
                self.checks.append(Check("running", False, f"container {self.container} does not exist"))
                return False
            if state["status"] in ("exited", "dead") or state["restart_count"] or state["status"] == "restarting":
                self.checks.append(Check("running", False, f"container {state['status']} (exit code "
                                         f"{state['exit_code']}, restarts {state['restart_count']})"))
                return False
            status, body = self.api.request("GET", "/health", timeout=5)
            if status == 200:
                bad_health_since = None
                status, body = self.api.request("GET", "/v1/models", timeout=10)
                if status == 200:
                    models = checks.check_models(status, body, self.meta["served_model_names"])
                    if not models.ok:  # a wrong model is not going to fix itself
                        self.checks += [Check("running", True, state["status"]), Check("health", True), models]
                        return False
                    if not warmed:  # cold cudagraph/JIT: one throw-away token first
                        warm_status, _ = self.api.chat(self.model, [{"role": "user", "content": "Hi"}], 1,
                                                       self.request_timeout(deadline))
                        warmed = warm_status == 200
                        last = f"warm-up HTTP {warm_status}"
                        continue
                    status, body = self.api.chat(
                        self.model,
                        [{"role": "user", "content": "What is the capital of France? Answer in one word."}],
                        30, self.request_timeout(deadline))
                    chat = checks.check_paris(status, body)
                    if status == 200:
                        self.out["ready_epoch"] = time.time()
                        self.checks += [Check("running", True, state["status"]), Check("health", True, "HTTP 200"),
                                        models, chat]
                        return chat.ok
                    last = chat.detail
                else:
                    last = f"/v1/models HTTP {status}"
            elif status:
                # The server answers but the engine says it is not healthy.
                bad_health_since = bad_health_since or time.time()
                last = f"/health HTTP {status}"
                if time.time() - bad_health_since >= grace:
                    self.checks.append(Check("health", False, f"/health answered HTTP {status} for "
                                             f"{time.time() - bad_health_since:.0f} s"))
                    return False
            else:
                last = f"/health: {body}"
            log(f"not ready: {last}")
            time.sleep(min(pause, POLL_S, max(0.0, deadline - time.time())))
            pause *= 1.5
        self.checks.append(Check("ready", False, f"not ready within {self.timeout:.0f} s: {last}"))
        return False

    def boot_checks(self) -> None:
        text = self.boot_log()
        self.out["kv_pool_tokens"] = checks.parse_kv_pool(text)
        concurrency = checks.parse_max_concurrency(text)
        self.out["max_concurrency"] = list(concurrency) if concurrency else None
        self.checks += checks.check_genesis(text, bool(self.meta.get("needs_genesis")))
        self.checks += checks.check_kv_pool(text, self.meta.get("kv_predicted"), float(self.settings["kv_warn_ratio"]))

    # -- full: the failure signatures throughput hides --

    def full_checks(self) -> None:
        deadline = time.time() + self.timeout
        rng = random.Random(os.urandom(16))  # a fresh salt and fresh secrets every run
        mtp = int(self.meta.get("mtp_tokens") or 0) > 0
        before = checks.parse_metrics(self._metrics()) if mtp else {}

        def budget_left(name: str) -> bool:
            if time.time() >= deadline - 1:
                self.checks.append(Check(name, False, "not run: the gate's time budget was spent"))
                return False
            return True

        if budget_left("long_output"):
            log("long output")
            self.checks.append(checks.check_long_output(*self.api.chat(
                self.model, [{"role": "user", "content": checks.LONG_PROMPT}], 600, self.request_timeout(deadline))))
        if budget_left("streaming"):
            log("streaming")
            self.checks.append(checks.check_streaming(*self.api.chat(
                self.model, [{"role": "user", "content": checks.STREAM_PROMPT}], 200,
                self.request_timeout(deadline), stream=True)))
        tool = {"type": "function", "function": {"name": checks.TOOL["function"]["name"]}}
        if budget_left("tool_call"):
            log("tool calls")
            self.checks.append(checks.check_tool_call(*self.api.chat(
                self.model, [{"role": "user", "content": checks.TOOL_PROMPT}], 200,
                self.request_timeout(deadline), tools=[checks.TOOL], tool_choice=tool)))
        if budget_left("tool_call_stream"):
            self.checks.append(checks.check_tool_stream(*self.api.chat(
                self.model, [{"role": "user", "content": checks.TOOL_PROMPT}], 200,
                self.request_timeout(deadline), tools=[checks.TOOL], tool_choice=tool, stream=True)))
        if budget_left("degeneracy"):
            log("degeneracy")
            long_replies = [self.api.chat(self.model, [{"role": "user", "content": p}], 500,
                                          self.request_timeout(deadline)) for p in checks.DEGENERACY_PROMPTS[1:]]
            self.checks.append(checks.check_degeneracy(long_replies))
        max_len = int(self.meta.get("max_model_len") or 0)
        for tokens in self.settings["needle_tokens"]:
            name = f"needle_{int(tokens) // 1000}k"
            if max_len and tokens > 0.9 * max_len:
                self.checks.append(Check(name, True, f"skipped: above max_model_len {max_len}", warning=True))
                continue
            if not budget_left(name):
                continue
            log(f"needle at {tokens} tokens")
            secret, salt = checks.make_secret(rng), checks.make_salt(rng)
            prompt = checks.needle_prompt(checks.make_haystack(int(tokens), secret, salt, rng, rng.uniform(0.2, 0.8)))
            self.checks.append(self.needle(int(tokens), prompt, secret, deadline))
        replies: list[tuple[int, Any]] = []
        vram_before = gpu_memory_used()
        for session in range(int(self.settings["soak_sessions"])):
            messages: list[dict[str, str]] = []
            for turn in range(int(self.settings["soak_turns"])):
                if time.time() >= deadline - 1:
                    break
                prompt = checks.SOAK_PROMPTS[(session * 3 + turn) % len(checks.SOAK_PROMPTS)]
                messages.append({"role": "user", "content": prompt})
                status, body = self.api.chat(self.model, messages, 160, self.request_timeout(deadline))
                replies.append((status, body))
                messages.append({"role": "assistant", "content": checks.reply_text(body)})
        log(f"soak: {len(replies)} turns")
        self.checks.append(checks.check_soak(replies))
        self.checks.append(self.vram_growth(vram_before, "vram_growth"))
        if mtp:
            after = checks.parse_metrics(self._metrics())
            check = checks.check_acceptance(before, after, float(self.settings["acceptance_min"]))
            length = checks.acceptance(before, after)[0]
            self.out["acceptance_length"] = round(length, 3) if length is not None else None
            self.checks.append(check)

    def needle(self, tokens: int, prompt: str, secret: str, deadline: float,
               name: str | None = None) -> checks.Check:
        """One salted needle, with the prefix-cache guard read from /metrics around it."""
        hits = checks.parse_metrics(self._metrics()).get("vllm:prefix_cache_hits_total", 0.0)
        status, body = self.api.chat(self.model, [{"role": "user", "content": prompt}], 40,
                                     self.request_timeout(deadline))
        result = checks.check_needle(tokens, status, body, secret)
        if name:
            result.name = name
        if result.ok and not result.warning and isinstance(body, dict):
            hit = checks.parse_metrics(self._metrics()).get("vllm:prefix_cache_hits_total", 0.0) - hits
            guard = checks.check_cache_guard(result.name, int((body.get("usage") or {}).get("prompt_tokens") or 0), hit)
            if guard is not None:
                return guard
        return result

    # -- stress: needles at several depths up to the planned context, and the limit probe --

    def stress_checks(self) -> None:
        deadline = time.time() + self.timeout
        rng = random.Random(os.urandom(16))
        max_len = int(self.meta.get("max_model_len") or 0)
        sizes = [int(t) for t in self.settings.get("stress_needle_tokens") or [max(self.settings["needle_tokens"])]]
        for tokens in sizes:
            for depth in checks.NEEDLE_DEPTHS:
                name = f"needle_{tokens // 1000}k_at_{int(depth * 100)}"
                if max_len and tokens > 0.9 * max_len:
                    self.checks.append(Check(name, True, f"skipped: above max_model_len {max_len}", warning=True))
                    continue
                if time.time() >= deadline - 1:
                    self.checks.append(Check(name, False, "not run: the verify time budget was spent"))
                    continue
                log(f"needle at {tokens} tokens, depth {depth:.0%}")
                secret, salt = checks.make_secret(rng), checks.make_salt(rng)
                prompt = checks.needle_prompt(checks.make_haystack(tokens, secret, salt, rng, depth))
                self.checks.append(self.needle(tokens, prompt, secret, deadline, name))
        limit = int(self.settings.get("limit_probe_tokens") or int(0.9 * max_len) or 0)
        if limit and time.time() < deadline - 1:
            log(f"limit probe at {limit} tokens")
            secret, salt = checks.make_secret(rng), checks.make_salt(rng)
            prompt = checks.needle_prompt(checks.make_haystack(limit, secret, salt, rng, 0.5))
            status, body = self.api.chat(self.model, [{"role": "user", "content": prompt}], 16,
                                         self.request_timeout(deadline))
            health, _ = self.api.request("GET", "/health", timeout=10)
            self.checks.append(checks.check_limit(status, body, limit, health))

    # -- soak: agent-shaped multi-turn traffic, VRAM and throughput over it --

    def soak_checks(self) -> None:
        deadline = time.time() + self.timeout
        sessions, turns = int(self.settings["soak_long_sessions"]), int(self.settings["soak_long_turns"])
        vram_before = gpu_memory_used()
        timings: list[tuple[int, float]] = []
        replies: list[tuple[int, Any]] = []
        for session in range(sessions):
            messages: list[dict[str, str]] = []
            for turn in range(turns):
                if time.time() >= deadline - 1:
                    break
                prompt = checks.SOAK_PROMPTS[(session + turn) % len(checks.SOAK_PROMPTS)]
                messages.append({"role": "user", "content": prompt})
                started = time.time()
                status, body = self.api.chat(self.model, messages, 160, self.request_timeout(deadline))
                timings.append((checks.completion_tokens(body) or 0, time.time() - started))
                replies.append((status, body))
                messages.append({"role": "assistant", "content": checks.reply_text(body)})
            log(f"soak session {session + 1}/{sessions}: {len(replies)} turns so far")
        soak = checks.check_soak(replies)
        soak.name = "soak_long"
        planned = sessions * turns
        if soak.ok and len(replies) < planned:
            soak = Check("soak_long", False, f"{len(replies)} of {planned} turns in the time budget")
        self.checks.append(soak)
        self.checks.append(self.vram_growth(vram_before, "vram_growth_long"))
        window = max(1, len(timings) // 5)
        first = (sum(t for t, _ in timings[:window]), sum(s for _, s in timings[:window]))
        last = (sum(t for t, _ in timings[-window:]), sum(s for _, s in timings[-window:]))
        self.out["soak"] = {"turns": len(replies), "vram_before_mib": vram_before,
                            "empty": sum(1 for st, b in replies if checks.silent_empty(st, b))}
        self.checks.append(checks.check_retention(first, last, float(self.settings["retention_min"])))

    def vram_growth(self, before_mib: int | None, name: str) -> checks.Check:
        """nvidia-smi's memory.used now against `before_mib`, read before the turns just sent (full: the
        short soak; soak: its sessions); the limit is the release's or the inventory's setting."""
        return checks.check_vram_growth(before_mib, gpu_memory_used(), int(self.settings["vram_growth_max_mib"]),
                                        name)

    def _metrics(self) -> str:
        status, body = self.api.request("GET", "/metrics", timeout=30)
        return body if status == 200 and isinstance(body, str) else ""

    def run(self) -> dict[str, Any]:
        log(f"gate {self.level} for {self.meta.get('release_id')} (timeout {self.timeout:.0f} s)")
        if self.wait_ready():
            self.boot_checks()
            rank = LEVELS.index(self.level)
            if rank >= 1 and checks.passed(self.checks):
                self.full_checks()
            if rank >= 2 and self.level == "stress" and checks.passed(self.checks):
                self.stress_checks()
            if self.level == "soak" and checks.passed(self.checks):
                self.soak_checks()
        state = container_state(self.container)
        if state is not None:
            self.out["container"] = state
        self.out["ok"] = checks.passed(self.checks) and self.out["ready_epoch"] is not None
        self.out["checks"] = [c.to_dict() for c in self.checks]
        self.out["ended_epoch"] = time.time()
        tail = docker("logs", "--tail", str(LOG_TAIL_LINES), self.container, timeout=60)[1]
        self.out["log_tail"] = self.redact(tail).splitlines()[-LOG_TAIL_LINES:]
        for check in self.out["checks"]:
            check["detail"] = self.redact(check["detail"])
        return self.out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="rigfleet health gate (runs on the rig)")
    parser.add_argument("release_dir", type=Path)
    parser.add_argument("--level", choices=(*LEVELS, *ALIASES), default=None)
    parser.add_argument("--timeout", type=float, default=None, help="seconds for readiness (and again for full)")
    parser.add_argument("--settings", type=json.loads, default=None,
                        help="JSON object of settings over release.json's (verify: the inventory's now)")
    args = parser.parse_args(argv)
    try:
        meta = json.loads((args.release_dir / "release.json").read_text(encoding="utf-8"))
        level = args.level or meta.get("gate", {}).get("level", "basic")
        timeout = args.timeout or float(meta.get("gate", {}).get("timeout_s", 600))
        result = Gate(args.release_dir, level, timeout, args.settings).run()
    except Exception as exc:  # the caller needs JSON whatever happened
        result = {"ok": False, "checks": [Check("gate", False, f"{type(exc).__name__}: {exc}").to_dict()]}
    print(json.dumps(result))
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
