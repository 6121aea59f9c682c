"""Log lines in vLLM's format: `(APIServer pid=1) INFO 05-12 10:31:02 [api_server.py:88] msg`.

SIMULATED stand-in: stdout, flushed per line so `docker logs` shows the boot as it happens.
"""

from __future__ import annotations

import os
import sys
import time

_PROCESS = ["APIServer"]


def set_process(name: str) -> None:
    """Prefix for the lines that follow (vLLM tags lines by process: APIServer, EngineCore_DP0...)."""
    _PROCESS[0] = name


class Logger:
    def __init__(self, name: str) -> None:
        self.name = name

    def _emit(self, level: str, msg: str, *args: object) -> None:
        if args:
            msg = msg % args
        frame = sys._getframe(2)
        where = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
        stamp = time.strftime("%m-%d %H:%M:%S")
        print(f"({_PROCESS[0]} pid={os.getpid()}) {level} {stamp} [{where}] {msg}", flush=True)

    def debug(self, msg: str, *args: object) -> None:
        if os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper() == "DEBUG":
            self._emit("DEBUG", msg, *args)

    def info(self, msg: str, *args: object) -> None:
        self._emit("INFO", msg, *args)

    def warning(self, msg: str, *args: object) -> None:
        self._emit("WARNING", msg, *args)

    def error(self, msg: str, *args: object) -> None:
        self._emit("ERROR", msg, *args)


def init_logger(name: str) -> Logger:
    return Logger(name)
