"""The release ledger kept on each rig (rigfleet.rigstate.LEDGER_PATH), as typed records.

It records what serves now (`current`), what served before (`previous`, the rollback target)
and every attempt to change that (deploys and rollbacks, passed, failed or refused), with the
gate result, the measured KV pool and the downtime. Plain JSON, no secrets; written atomically
by the serving operation (temp file + rename). `rigfleet status` reads `current`.
The records are the models of rigfleet.rigstate; an old rig's ledger reads as it is.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from pydantic import ValidationError

from rigfleet.rigstate import LEDGER_PATH, Attempt, Ledger, LedgerEntry, ReleaseRecord

__all__ = ["ENTRY_KEYS", "LEDGER_PATH", "Attempt", "Ledger", "LedgerEntry", "ReleaseRecord", "attempt",
           "current_id", "dumps", "empty", "entry", "finish", "gate_record", "last_attempt", "load", "now",
           "previous_id", "record", "record_verification", "verification"]

SCHEMA = 1
MAX_ATTEMPTS = 200  # keep the file small; the oldest attempts go first
MAX_VERIFICATIONS = 100  # `rigfleet verify` results, kept apart from the attempts (they change nothing)
LOG_TAIL_KEEP = 20

# The keys of a release entry (`current` / `previous`), shared with `rigfleet status`.
ENTRY_KEYS = tuple(LedgerEntry.model_fields)


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def empty(rig: str) -> Ledger:
    return Ledger(schema=SCHEMA, rig=rig)


def _entry(raw: Any) -> LedgerEntry | None:
    if not isinstance(raw, dict) or not raw.get("release_id"):
        return None
    try:
        return LedgerEntry.model_validate(raw)
    except ValidationError:  # a field of an unexpected type: keep what is there, unchecked
        return LedgerEntry.model_construct(**raw)


def _attempt(raw: Any) -> Attempt | None:
    if not isinstance(raw, dict):
        return None
    try:
        return Attempt.model_validate(raw)
    except ValidationError:
        return Attempt.model_construct(**raw)


def load(raw: Any, rig: str) -> Ledger:
    """A ledger from what the rig had: None (fresh rig) or anything unusable gives an empty one."""
    if not isinstance(raw, dict) or "unreadable" in raw:
        return empty(rig)
    attempts = raw.get("attempts")
    rest = {k: v for k, v in raw.items() if k not in ("schema", "rig", "current", "previous", "attempts")}
    return Ledger.model_construct(
        schema_=raw.get("schema", SCHEMA), rig=raw.get("rig", rig),
        current=_entry(raw.get("current")), previous=_entry(raw.get("previous")),
        attempts=[a for a in map(_attempt, attempts if isinstance(attempts, list) else []) if a is not None],
        **rest)


def current_id(ledger: Ledger) -> str | None:
    return ledger.current.release_id if ledger.current else None


def previous_id(ledger: Ledger) -> str | None:
    return ledger.previous.release_id if ledger.previous else None


def entry(meta: ReleaseRecord, gate: dict[str, Any] | None, downtime_s: float | None) -> LedgerEntry:
    """A `current`/`previous` entry from a release's release.json and its gate result."""
    gate = gate or {}
    container = gate.get("container") or {}
    return LedgerEntry(
        release_id=meta.release_id, pinset=meta.pinset, variant=meta.variant, image=meta.image,
        kv_pool_tokens=gate.get("kv_pool_tokens"), kv_predicted=meta.kv_predicted, gate_level=gate.get("level"),
        container_id=container.get("id"), since=now(), downtime_s=downtime_s,
    )


def attempt(kind: str, meta: ReleaseRecord, started: str, *, from_release: str | None) -> Attempt:
    """A new attempt record; `finish` fills in the outcome."""
    return Attempt(kind=kind, release_id=meta.release_id, pinset=meta.pinset, variant=meta.variant,
                   image=meta.image, from_release=from_release, started=started, ended=None, result=None,
                   gate=None, kv_pool_tokens=None, kv_predicted=meta.kv_predicted, acceptance_length=None,
                   downtime_s=None, restored=None, restore_ok=None, error=None)


def gate_record(result: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the ledger keeps of a gate result: level, verdict and each check, not the log."""
    if result is None:
        return None
    return {
        "level": result.get("level"),
        "ok": bool(result.get("ok")),
        "checks": [{k: c.get(k) for k in ("name", "ok", "detail", "warning")} for c in result.get("checks", [])],
    }


def finish(record: Attempt, result: str, *, gate: dict[str, Any] | None = None,
           downtime_s: float | None = None, error: str | None = None, log_tail: list[str] | None = None,
           restored: str | None = None, restore_ok: bool | None = None) -> Attempt:
    update: dict[str, Any] = {
        "ended": now(),
        "result": result,
        "gate": gate_record(gate),
        "kv_pool_tokens": (gate or {}).get("kv_pool_tokens"),
        "acceptance_length": (gate or {}).get("acceptance_length"),
        "downtime_s": None if downtime_s is None else round(downtime_s, 3),
        "error": error,
        "restored": restored,
        "restore_ok": restore_ok,
    }
    if log_tail:
        update["log_tail"] = [str(line) for line in log_tail[-LOG_TAIL_KEEP:]]
    return record.model_copy(update=update)


def record(ledger: Ledger, attempt_record: Attempt, *, became_current: LedgerEntry | None = None) -> Ledger:
    """The ledger with one more attempt; a passed attempt moves `current` to `previous`."""
    update: dict[str, Any] = {"attempts": [*ledger.attempts, attempt_record][-MAX_ATTEMPTS:]}
    if became_current is not None:
        old = ledger.current
        if old and old.release_id != became_current.release_id:
            update["previous"] = old
        update["current"] = became_current
    return ledger.model_copy(update=update)


def dumps(ledger: Ledger) -> str:
    return json.dumps(ledger.to_json(), indent=2, sort_keys=False) + "\n"


def last_attempt(ledger: Ledger) -> Attempt | None:
    return ledger.attempts[-1] if ledger.attempts else None


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
