"""The release ledger kept on each rig at /var/lib/rigfleet/ledger.json.

It records what serves now (`current`), what served before (`previous`, the rollback target)
and every attempt to change that (deploys and rollbacks, passed, failed or refused), with the
gate result, the measured KV pool and the downtime. Plain JSON, no secrets; written atomically
by the serving operation (temp file + rename). `rigfleet status` reads `current`.
"""

from __future__ import annotations

import copy
import json
from datetime import datetime, timezone
from typing import Any

LEDGER_PATH = "/var/lib/rigfleet/ledger.json"
SCHEMA = 1
MAX_ATTEMPTS = 200  # keep the file small; the oldest attempts go first
MAX_VERIFICATIONS = 100  # `rigfleet verify` results, kept apart from the attempts (they change nothing)
LOG_TAIL_KEEP = 20

# The keys of a release entry (`current` / `previous`), shared with `rigfleet status`.
ENTRY_KEYS = ("release_id", "pinset", "variant", "image", "kv_pool_tokens", "kv_predicted", "gate_level",
              "container_id", "since", "downtime_s")


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def empty(rig: str) -> dict[str, Any]:
    return {"schema": SCHEMA, "rig": rig, "current": None, "previous": None, "attempts": []}


def load(raw: Any, rig: str) -> dict[str, Any]:
    """A ledger from what the rig had: None (fresh rig) or anything unusable gives an empty one."""
    if not isinstance(raw, dict) or "unreadable" in raw:
        return empty(rig)
    ledger = empty(rig) | copy.deepcopy(raw)
    if not isinstance(ledger.get("attempts"), list):
        ledger["attempts"] = []
    for key in ("current", "previous"):
        if not isinstance(ledger.get(key), dict) or not ledger[key].get("release_id"):
            ledger[key] = None
    return ledger


def current_id(ledger: dict[str, Any]) -> str | None:
    return (ledger.get("current") or {}).get("release_id")


def previous_id(ledger: dict[str, Any]) -> str | None:
    return (ledger.get("previous") or {}).get("release_id")


def entry(meta: dict[str, Any], gate: dict[str, Any] | None, downtime_s: float | None) -> dict[str, Any]:
    """A `current`/`previous` entry from a release's release.json and its gate result."""
    gate = gate or {}
    container = gate.get("container") or {}
    return {
        "release_id": meta.get("release_id"),
        "pinset": meta.get("pinset"),
        "variant": meta.get("variant"),
        "image": meta.get("image"),
        "kv_pool_tokens": gate.get("kv_pool_tokens"),
        "kv_predicted": meta.get("kv_predicted"),
        "gate_level": gate.get("level"),
        "container_id": container.get("id"),
        "since": now(),
        "downtime_s": downtime_s,
    }


def attempt(kind: str, meta: dict[str, Any], started: str, *, from_release: str | None) -> dict[str, Any]:
    """A new attempt record; `finish` fills in the outcome."""
    return {
        "kind": kind,  # deploy | rollback
        "release_id": meta.get("release_id"),
        "pinset": meta.get("pinset"),
        "variant": meta.get("variant"),
        "image": meta.get("image"),
        "from_release": from_release,
        "started": started,
        "ended": None,
        "result": None,  # passed | failed | refused (nothing was stopped)
        "gate": None,
        "kv_pool_tokens": None,
        "kv_predicted": meta.get("kv_predicted"),
        "acceptance_length": None,
        "downtime_s": None,
        "restored": None,  # the release serving again after a failure
        "restore_ok": None,
        "error": None,
    }


def gate_record(result: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the ledger keeps of a gate result: level, verdict and each check, not the log."""
    if result is None:
        return None
    return {
        "level": result.get("level"),
        "ok": bool(result.get("ok")),
        "checks": [{k: c.get(k) for k in ("name", "ok", "detail", "warning")} for c in result.get("checks", [])],
    }


def finish(record: dict[str, Any], result: str, *, gate: dict[str, Any] | None = None,
           downtime_s: float | None = None, error: str | None = None, log_tail: list[str] | None = None,
           restored: str | None = None, restore_ok: bool | None = None) -> dict[str, Any]:
    record = dict(record)
    record.update({
        "ended": now(),
        "result": result,
        "gate": gate_record(gate),
        "kv_pool_tokens": (gate or {}).get("kv_pool_tokens"),
        "acceptance_length": (gate or {}).get("acceptance_length"),
        "downtime_s": None if downtime_s is None else round(downtime_s, 3),
        "error": error,
        "restored": restored,
        "restore_ok": restore_ok,
    })
    if log_tail:
        record["log_tail"] = log_tail[-LOG_TAIL_KEEP:]
    return record


def record(ledger: dict[str, Any], attempt_record: dict[str, Any], *,
           became_current: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ledger with one more attempt; a passed attempt moves `current` to `previous`."""
    ledger = copy.deepcopy(ledger)
    ledger["attempts"] = [*ledger.get("attempts", []), attempt_record][-MAX_ATTEMPTS:]
    if became_current is not None:
        old = ledger.get("current")
        if old and old.get("release_id") != became_current.get("release_id"):
            ledger["previous"] = old
        ledger["current"] = became_current
    return ledger


def dumps(ledger: dict[str, Any]) -> str:
    return json.dumps(ledger, indent=2, sort_keys=False) + "\n"


def last_attempt(ledger: dict[str, Any]) -> dict[str, Any] | None:
    attempts = ledger.get("attempts") or []
    return attempts[-1] if attempts else None


def verification(result: dict[str, Any], started: str, *, release_id: str | None) -> dict[str, Any]:
    """A `rigfleet verify` record: the level, the verdict and each check, for the release that served."""
    return {
        "kind": "verify",
        "release_id": release_id,
        "level": result.get("level"),
        "started": started,
        "ended": now(),
        "result": "passed" if result.get("ok") else "failed",
        "gate": gate_record(result),
        "kv_pool_tokens": result.get("kv_pool_tokens"),
        "acceptance_length": result.get("acceptance_length"),
    }


def record_verification(raw: dict[str, Any], verification_record: dict[str, Any]) -> dict[str, Any]:
    """The ledger file's JSON with one more verification; every other key is kept as it was."""
    found = raw.get("verifications")
    kept = [v for v in found if isinstance(v, dict)] if isinstance(found, list) else []
    return {**raw, "verifications": [*kept, verification_record][-MAX_VERIFICATIONS:]}
