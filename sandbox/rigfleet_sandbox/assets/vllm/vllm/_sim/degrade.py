"""The single-failure faults of the verify ladder, applied to a healthy reply (SIMULATED).

See vllm._sim.faults for the names. Each keeps the reply's shape (HTTP 200, usage counted) and
breaks exactly one thing, so every verify check has a failure of its own to catch.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import replace

from vllm._sim import faults, textgen

VRAM_BASE_MIB = 21_500  # what a loaded 27B INT4 + KV pool shows per card


class Degrader:
    def __init__(self) -> None:
        self.active = faults.active()
        self.flood_after = faults.number("RIGFLEET_SANDBOX_FLOOD_AFTER", 40)
        self.late_after = faults.number("RIGFLEET_SANDBOX_LATE_AFTER", 60)
        self.vram_step = faults.number("RIGFLEET_SANDBOX_VRAM_STEP_MIB", 64)
        self.lock = threading.Lock()
        self.requests = 0
        self.report_vram()

    def count(self) -> int:
        with self.lock:
            self.requests += 1
            return self.requests

    def late(self) -> bool:
        """late-failure: the garbage path once enough traffic went through."""
        return "late-failure" in self.active and self.requests > self.late_after

    def reply(self, reply: textgen.Reply, question: str, n: int) -> textgen.Reply:
        toks = textgen.pieces(reply.content or "")
        if {"bang-flood", "repetition"} & self.active and len(toks) > self.flood_after:
            head = toks[: self.flood_after]
            rest = len(toks) - self.flood_after
            first = (head[0].strip() if head else "The") or "The"
            tail = "!" * rest if "bang-flood" in self.active else " " + " ".join([first] * rest)
            reply = replace(reply, content="".join(head) + tail)
        if "needle-miss" in self.active and textgen.NEEDLE_QUESTION.search(question):
            text = "I could not find a secret in the provided text."
            reply = replace(reply, content=text, completion_tokens=len(textgen.pieces(text)))
        if "bad-tool-json" in self.active and reply.tool_calls:
            calls = []
            for call in reply.tool_calls:
                args = call["function"]["arguments"]
                calls.append({**call, "function": {**call["function"], "arguments": args[: max(1, len(args) // 2)]}})
            reply = replace(reply, tool_calls=calls)
        if "empty-replies" in self.active and n % 3 == 0:
            reply = replace(reply, content="", tool_calls=[], completion_tokens=0, kind="empty")
        self.report_vram()
        return reply

    def spec_mode(self, mode: str) -> str:
        return "garbage" if "low-acceptance" in self.active else mode

    def broken_stream(self) -> bool:
        return "broken-sse" in self.active

    def report_vram(self) -> None:
        """What nvidia-smi shows for this process: flat, or growing each request (vram-growth)."""
        state = os.environ.get("RIGFLEET_SIM_NVIDIA_STATE_DIR", "/run/nvidia-sim")
        grown = self.requests * self.vram_step if "vram-growth" in self.active else 0
        apps = [{"pid": os.getpid(), "process_name": "python3", "used_memory_mib": VRAM_BASE_MIB + grown, "gpu": i}
                for i in range(2)]
        if not os.path.isdir(state):  # no stand-in NVIDIA stack here
            return
        try:
            tmp = os.path.join(state, f".compute-apps.{os.getpid()}")
            with open(tmp, "w", encoding="utf-8") as handle:
                json.dump(apps, handle)
            os.replace(tmp, os.path.join(state, "compute-apps.json"))
        except OSError:  # a read-only state dir: nvidia-smi shows no process, as before
            pass
