"""Counters behind /metrics and the periodic stats log lines (SIMULATED).

MTP speculative decoding is accounted per request: a healthy run accepts draft position i with
rate (0.95, 0.84, 0.75, 0.62, ...)[i], so the mean acceptance length (1 + accepted / drafts) is
~3.54 at n=3; garbage runs accept ~2% (or 100% with RIGFLEET_SANDBOX_GARBAGE_AL=100).
"""

from __future__ import annotations

import math
import os
import threading
from collections import deque
from dataclasses import dataclass, field

HEALTHY_RATES = (0.95, 0.84, 0.75, 0.62, 0.50, 0.40, 0.32, 0.25)
GARBAGE_RATES = (0.03, 0.02, 0.01, 0.01, 0.0, 0.0, 0.0, 0.0)


@dataclass
class SpecStep:
    drafts: int
    draft_tokens: int
    accepted_per_pos: list[float]  # expected values; the counters floor their running sums

    @property
    def accepted(self) -> float:
        return sum(self.accepted_per_pos)

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.accepted / self.drafts if self.drafts else 0.0


def spec_for(completion_tokens: int, k: int, mode: str) -> SpecStep:
    rates = [1.0] * k if mode == "full" else list((GARBAGE_RATES if mode == "garbage" else HEALTHY_RATES)[:k])
    rates += [rates[-1] if rates else 0.0] * (k - len(rates))
    al = 1.0 + sum(rates)
    steps = math.ceil(completion_tokens / al) if completion_tokens else 0
    return SpecStep(steps, steps * k, [steps * r for r in rates])


@dataclass
class Stats:
    model_name: str
    kv_cache_dtype: str
    num_gpu_blocks: int
    spec_k: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: dict[str, int] = field(default_factory=dict)
    drafts: int = 0
    draft_tokens: int = 0
    accepted_per_pos: list[float] = field(default_factory=list)
    prefix_queries: int = 0
    prefix_hits: int = 0
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    recent_prompts: deque = field(default_factory=lambda: deque(maxlen=64))

    def prefix_hit_tokens(self, prompt: str) -> int:
        best = 0
        for old in self.recent_prompts:
            best = max(best, len(os.path.commonprefix([old, prompt])))
        self.recent_prompts.append(prompt)
        return best // 4 // 16 * 16  # whole 16-token blocks only, like the real prefix cache

    def record(
        self,
        *,
        prompt: str,
        prompt_tokens: int,
        completion_tokens: int,
        finish_reason: str,
        prefix_caching: bool,
        spec: SpecStep | None,
    ) -> int:
        with self.lock:
            self.prompt_tokens += prompt_tokens
            self.generation_tokens += completion_tokens
            self.finished[finish_reason] = self.finished.get(finish_reason, 0) + 1
            hits = 0
            if prefix_caching:
                hits = min(self.prefix_hit_tokens(prompt), prompt_tokens)
                self.prefix_queries += prompt_tokens
                self.prefix_hits += hits
            if spec is not None:
                if not self.accepted_per_pos:
                    self.accepted_per_pos = [0.0] * len(spec.accepted_per_pos)
                self.drafts += spec.drafts
                self.draft_tokens += spec.draft_tokens
                for i, n in enumerate(spec.accepted_per_pos):
                    self.accepted_per_pos[i] += n
            return hits

    def render(self) -> str:
        labels = f'engine="0",model_name="{self.model_name}"'
        lines: list[str] = []

        def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
            base = name.removesuffix("_total") if kind == "counter" else name
            lines.append(f"# HELP {base} {help_text}")
            lines.append(f"# TYPE {base} {kind}")
            for extra, value in samples:
                lines.append(f"{name}{{{labels}{extra}}} {float(value)}")

        with self.lock:
            metric(
                "rigfleet:simulated_engine_info",
                "gauge",
                "SIMULATED vLLM stand-in (rigfleet sandbox).",
                [(',simulated="true"', 1)],
            )
            metric(
                "vllm:num_requests_running",
                "gauge",
                "Number of requests in model execution batches.",
                [("", self.running)],
            )
            metric(
                "vllm:num_requests_waiting",
                "gauge",
                "Number of requests waiting to be processed.",
                [("", self.waiting)],
            )
            metric(
                "vllm:kv_cache_usage_perc",
                "gauge",
                "KV-cache usage. 1 means 100 percent usage.",
                [("", self.kv_usage)],
            )
            metric(
                "vllm:prefix_cache_queries_total",
                "counter",
                "Prefix cache queries, in terms of tokens.",
                [("", self.prefix_queries)],
            )
            metric(
                "vllm:prefix_cache_hits_total",
                "counter",
                "Prefix cache hits, in terms of tokens.",
                [("", self.prefix_hits)],
            )
            metric(
                "vllm:prompt_tokens_total",
                "counter",
                "Number of prefill tokens processed.",
                [("", self.prompt_tokens)],
            )
            metric(
                "vllm:generation_tokens_total",
                "counter",
                "Number of generation tokens processed.",
                [("", self.generation_tokens)],
            )
            metric(
                "vllm:request_success_total",
                "counter",
                "Count of successfully processed requests.",
                [(f',finished_reason="{r}"', n) for r, n in sorted(self.finished.items())]
                or [(',finished_reason="stop"', 0)],
            )
            metric(
                "vllm:cache_config_info",
                "gauge",
                "Information of the LLMEngine CacheConfig",
                [
                    (
                        f',block_size="16",cache_dtype="{self.kv_cache_dtype}",num_gpu_blocks="{self.num_gpu_blocks}"',
                        1,
                    )
                ],
            )
            if self.spec_k:
                per_pos = [math.floor(n) for n in self.accepted_per_pos] or [0] * self.spec_k
                metric(
                    "vllm:spec_decode_num_drafts_total",
                    "counter",
                    "Number of spec decoding drafts.",
                    [("", self.drafts)],
                )
                metric(
                    "vllm:spec_decode_num_draft_tokens_total",
                    "counter",
                    "Number of draft tokens.",
                    [("", self.draft_tokens)],
                )
                metric(
                    "vllm:spec_decode_num_accepted_tokens_total",
                    "counter",
                    "Number of accepted tokens.",
                    [("", math.floor(sum(self.accepted_per_pos)))],
                )
                metric(
                    "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                    "counter",
                    "Accepted tokens per draft position.",
                    [(f',position="{i}"', n) for i, n in enumerate(per_pos)],
                )
        return "\n".join(lines) + "\n"
