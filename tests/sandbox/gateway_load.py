"""A bounded client load through the fleet's gateway, and what the gateway's own log says of it.

`Load` sends chat completions to one sandbox address: every other request streams, a few at once,
each worker pausing between its requests; it stops by itself after `limit` requests or soon after
`stop()` (the test calls it when the re-pin it runs under has exited). Every reply is checked the way
a client would: HTTP 200, a non-empty answer, a stream of JSON events ending with `data: [DONE]`.

`GatewayLog` reads HAProxy's log from the gateway host's journal: the request lines (httplog: accept
date, backend/server, status) and the runtime state changes a swap makes (drain, maintenance, ready),
so a test can tell which rig each request went to and when each rig was out.
"""

from __future__ import annotations

import datetime as dt
import http.client
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rigfleet_sandbox.layout import NET

PAUSE_S = 0.25  # between one worker's requests: a steady trickle, not a flood of the 2-core machine
TIMEOUT_S = 120


@dataclass(frozen=True)
class Result:
    index: int
    stream: bool
    started: float  # time.time()
    ok: bool
    why: str


@dataclass
class Load:
    address: str
    port: int
    model: str
    limit: int = 3000
    concurrency: int = 3
    results: list[Result] = field(default_factory=list)

    def __post_init__(self) -> None:
        # test traffic goes to the sandbox's own network only
        if not self.address.startswith(f"{NET}."):
            raise ValueError(f"{self.address} is not a sandbox address ({NET}.x.y)")
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._next = 0
        self._workers: list[threading.Thread] = []

    def start(self) -> Load:
        self._workers = [threading.Thread(target=self._worker, daemon=True) for _ in range(self.concurrency)]
        for worker in self._workers:
            worker.start()
        return self

    def stop(self) -> list[Result]:
        """Stop issuing requests, wait (bounded) for the ones in flight, return every result."""
        self._stop.set()
        for worker in self._workers:
            worker.join(timeout=TIMEOUT_S + 10)
        return sorted(self.results, key=lambda r: r.index)

    def _worker(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                index = self._next
                if index >= self.limit:
                    return
                self._next += 1
            result = self.one(index)
            with self._lock:
                self.results.append(result)
            self._stop.wait(PAUSE_S)

    def one(self, index: int) -> Result:
        stream = index % 2 == 0
        started = time.time()
        body = json.dumps({"model": self.model, "stream": stream, "temperature": 0, "max_tokens": 24,
                           "messages": [{"role": "user", "content": f"Name a colour (request {index})."}]})
        try:
            conn = http.client.HTTPConnection(self.address, self.port, timeout=TIMEOUT_S)
            conn.request("POST", "/v1/chat/completions", body=body,
                         headers={"Content-Type": "application/json", "Connection": "close"})
            response = conn.getresponse()
            text = response.read().decode(errors="replace")
            conn.close()
        except (OSError, http.client.HTTPException) as exc:
            return Result(index, stream, started, False, f"{type(exc).__name__}: {exc}")
        if response.status != 200:
            return Result(index, stream, started, False, f"HTTP {response.status}")
        why = check_stream(text) if stream else check_reply(text)
        return Result(index, stream, started, why is None, why or ("stream" if stream else "reply"))


def check_reply(text: str) -> str | None:
    """None for a complete non-streaming answer, else what is wrong with it."""
    try:
        content = json.loads(text)["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        return "broken reply"
    return None if isinstance(content, str) and content.strip() else "empty reply"


def check_stream(text: str) -> str | None:
    """None for a complete SSE stream (JSON events with some content, then `data: [DONE]`)."""
    events = [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]
    if not events or events[-1] != "[DONE]":
        return "stream cut (no [DONE])"
    content = ""
    for event in events[:-1]:
        try:
            choice = json.loads(event)["choices"][0]
        except (ValueError, KeyError, IndexError, TypeError):
            return "broken stream event"
        content += str((choice.get("delta") or {}).get("content") or "")
    return None if content.strip() else "empty stream"


def failures(results: list[Result]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for result in results:
        if not result.ok:
            counts[result.why] = counts.get(result.why, 0) + 1
    return counts


# --- HAProxy's log -------------------------------------------------------------------------------

# httplog: CLIENT:PORT [ACCEPT DATE] FRONTEND BACKEND/SERVER TIMERS STATUS ...
REQUEST = re.compile(r"\[(\d{2}/\w{3}/\d{4}:\d{2}:\d{2}:\d{2}\.\d{3})\] \S+ (\S+)/(\S+) \S+ (-?\d+) ")
# the runtime API's state changes (HAProxy logs them as "Server BACKEND/SERVER ...")
STATE = re.compile(r"Server (\S+)/(\S+) (enters drain state|is going DOWN for maintenance|.*leaving forced "
                   r"maintenance|.*leaving forced drain)")


@dataclass(frozen=True)
class Logged:
    accepted: float  # epoch seconds
    backend: str
    server: str
    status: int


@dataclass
class GatewayLog:
    requests: list[Logged]
    events: list[tuple[float, str, str, str]]  # (journal time, backend, server, what)

    @classmethod
    def parse(cls, journal_json: str, utc_offset: str) -> GatewayLog:
        """`journalctl -o json` lines; `utc_offset` the gateway host's `date +%z` (httplog dates are
        in its local time)."""
        zone = dt.datetime.strptime(utc_offset.strip(), "%z").tzinfo
        requests, events = [], []
        for line in journal_json.splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            message = entry.get("MESSAGE")
            if not isinstance(message, str):
                continue
            when = int(entry.get("__REALTIME_TIMESTAMP", 0)) / 1e6
            if (request := REQUEST.search(message)) and "/v1/" in message:
                accepted = dt.datetime.strptime(request[1], "%d/%b/%Y:%H:%M:%S.%f").replace(tzinfo=zone)
                requests.append(Logged(accepted.timestamp(), request[2], request[3], int(request[4])))
            elif state := STATE.search(message):
                what = "drain" if "drain state" in state[3] else "maint" if "DOWN for" in state[3] else "ready"
                events.append((when, state[1], state[2], what))
        return cls(requests, _once(sorted(events)))

    def out_windows(self, server: str, end: float) -> list[tuple[float, float]]:
        """When `server` was out (from its drain to its ready; a rig still out at `end` until then)."""
        windows, start = [], None
        for when, _, name, what in self.events:
            if name != server:
                continue
            if what in ("drain", "maint") and start is None:
                start = when
            elif what == "ready" and start is not None:
                windows.append((start, when))
                start = None
        if start is not None:
            windows.append((start, end))
        return windows

    def sent_while_out(self, servers: list[str], end: float, margin_s: float) -> list[Logged]:
        """Requests accepted for a server inside one of its out windows. The window's end is the
        journal's receipt of the ready event, a little after HAProxy routes again: `margin_s` of it
        is not counted."""
        found = []
        for server in servers:
            windows = self.out_windows(server, end)
            found += [r for r in self.requests if r.server == server
                      and any(start <= r.accepted <= stop - margin_s for start, stop in windows)]
        return found

    def served_by(self, predicate: Callable[[Logged], bool]) -> dict[str, int]:
        counts: dict[str, int] = {}
        for request in self.requests:
            if predicate(request):
                counts[request.server] = counts.get(request.server, 0) + 1
        return counts


def _once(events: list[tuple[float, str, str, str]]) -> list[tuple[float, str, str, str]]:
    """HAProxy reports a state change twice to the journal (its syslog line and its stderr under
    systemd): a change that repeats the last one of the same server is left out."""
    out: list[tuple[float, str, str, str]] = []
    last: dict[tuple[str, str], str] = {}
    for when, backend, server, what in events:
        if last.get((backend, server)) != what:
            out.append((when, backend, server, what))
        last[(backend, server)] = what
    return out
