"""Seconds per task, summed over hosts' wall (the bench's where-the-time-goes for the peer).

ansible-core has no profile_tasks (that is ansible.posix); this writes the same facts to the file
named by PEER_TASK_SECONDS as JSON: {task name: seconds from its start to the next task's}.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "task_seconds"
    CALLBACK_NEEDS_ENABLED = False

    def __init__(self) -> None:
        super().__init__()
        self.seconds: dict[str, float] = {}
        self.current: tuple[str, float] | None = None

    def _close(self) -> None:
        if self.current:
            name, started = self.current
            self.seconds[name] = self.seconds.get(name, 0.0) + time.monotonic() - started

    def v2_playbook_on_task_start(self, task: Any, is_conditional: bool) -> None:
        self._close()
        self.current = (task.get_name(), time.monotonic())

    def v2_playbook_on_handler_task_start(self, task: Any) -> None:
        self.v2_playbook_on_task_start(task, False)

    def v2_playbook_on_stats(self, stats: Any) -> None:
        self._close()
        self.current = None
        target = os.environ.get("PEER_TASK_SECONDS")
        if target:
            with open(target, "w", encoding="utf-8") as out:
                json.dump(self.seconds, out, indent=1)
