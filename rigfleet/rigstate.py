"""What rigfleet keeps on a rig: every on-rig path, and the typed records written there.

The one place that spells an on-rig path (operations, facts, the status probe and the gate
import them from here). The records are pydantic models of the JSON files the serving swap
writes: a release's `release.json` (ReleaseRecord) and the ledger (rigfleet.ledger: Ledger,
LedgerEntry, Attempt). Rigs in the field keep records written by older rigfleet versions: every
field has a default and unknown keys are kept (extra="allow"), so an old record reads and is
written back without losing anything. The on-disk JSON is unchanged by these models.

The gate's probe (rigfleet/gate/probe.py) runs on the rig with the standard library only: it
reads release.json as plain JSON, the same keys as ReleaseRecord.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

# --- paths on the rig ------------------------------------------------------------------------
ROOT = "/opt/rigfleet"  # releases, the serving link, the gate
RELEASES_DIR = f"{ROOT}/releases"  # one dir per release id: compose.yaml, env file, release.json
CURRENT_LINK = f"{ROOT}/current"  # -> the release that passed the gate last
SERVING_COMPOSE = f"{CURRENT_LINK}/compose.yaml"
GATE_DIR = f"{ROOT}/gate"  # probe.py + checks.py, uploaded by the serving swap
RELEASE_RECORD = "release.json"  # in each release dir

STATE_DIR = "/var/lib/rigfleet"
LEDGER_PATH = f"{STATE_DIR}/ledger.json"
BUILD_ROOT = f"{STATE_DIR}/build"  # one build context per image tag
BUILDS_LEDGER = f"{STATE_DIR}/image-builds.jsonl"  # one line per image built on the rig
SMOKE_STAMP = f"{STATE_DIR}/gpu-smoke"  # the container toolkit's GPU smoke test passed

LOG_DIR = "/var/log/rigfleet"
CHAT_TEMPLATES_DIR = "/etc/rigfleet/chat-templates"
COLLECTOR_CONFIG = "/etc/rigfleet/collector.json"  # the GPU collector's settings (rigfleet.monitoring)


def release_dir(release_id: str) -> str:
    return f"{RELEASES_DIR}/{release_id}"


def release_record_path(release_id: str) -> str:
    return f"{release_dir(release_id)}/{RELEASE_RECORD}"


# --- records ---------------------------------------------------------------------------------
class _Record(BaseModel):
    # old records stay readable and keep their keys when written back
    model_config = ConfigDict(extra="allow")

    def get(self, key: str, default: Any = None) -> Any:
        """Dict-style read (the gate result and old callers speak JSON keys)."""
        value = getattr(self, key, None)
        if value is None and self.model_extra:
            value = self.model_extra.get(key)
        return default if value is None else value

    def to_json(self) -> dict[str, Any]:
        # the keys that were read or set, no more: an old record is written back as it was
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


class ReleaseRecord(_Record):
    """`release.json` of a release dir: what the gate and the ledger need (no secret)."""

    release_id: str
    rig: str | None = None
    pinset: str | None = None
    variant: str | None = None
    image: str | None = None
    container_name: str | None = None
    base_url: str | None = None
    port: int | None = None
    served_model_names: list[str] = Field(default_factory=list)
    needs_genesis: bool | None = None
    mtp_tokens: int | None = None
    max_model_len: int | None = None
    kv_predicted: int | None = None
    cache_key: str | None = None
    gate: dict[str, Any] = Field(default_factory=dict)  # level, timeout_s; the probe may read more


class LedgerEntry(_Record):
    """The ledger's `current` / `previous`: a release that passed the gate."""

    release_id: str
    pinset: str | None = None
    variant: str | None = None
    image: str | None = None
    kv_pool_tokens: int | None = None
    kv_predicted: int | None = None
    gate_level: str | None = None
    container_id: str | None = None
    since: str | None = None
    downtime_s: float | None = None

    @property
    def image_tag(self) -> str | None:
        """Older rigfleet versions wrote the image under this key."""
        value = (self.model_extra or {}).get("image_tag")
        return None if value is None else str(value)

    @property
    def image_ref(self) -> str | None:
        return self.image or self.image_tag


class Attempt(_Record):
    """One deploy or rollback attempt and how it ended."""

    kind: str | None = None  # deploy | rollback | recover (the current release restarted after its engine died)
    release_id: str | None = None
    pinset: str | None = None
    variant: str | None = None
    image: str | None = None
    from_release: str | None = None
    started: str | None = None
    ended: str | None = None
    result: str | None = None  # passed | failed | refused (nothing was stopped)
    gate: dict[str, Any] | None = None
    kv_pool_tokens: int | None = None
    kv_predicted: int | None = None
    acceptance_length: float | None = None
    downtime_s: float | None = None
    restored: str | None = None  # the release serving again after a failure
    restore_ok: bool | None = None
    error: str | None = None
    log_tail: list[str] | None = None  # failed attempts only
    reason: str | None = None  # a recovery's: what the rig showed (its engine not running, unhealthy)


class Ledger(_Record):
    """`ledger.json`: what serves now, what served before (the rollback target), every attempt."""

    schema_: int = Field(1, alias="schema")
    rig: str
    current: LedgerEntry | None = None
    previous: LedgerEntry | None = None
    attempts: list[Attempt] = Field(default_factory=list)

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    def to_json(self) -> dict[str, Any]:
        data = self.model_dump(mode="json", by_alias=True, exclude_unset=True,
                               exclude={"current", "previous", "attempts"})
        data.setdefault("schema", self.schema_)
        data.setdefault("rig", self.rig)
        data["current"] = self.current.to_json() if self.current else None
        data["previous"] = self.previous.to_json() if self.previous else None
        data["attempts"] = [a.to_json() for a in self.attempts]
        # the key order of the file as older versions wrote it
        order = ["schema", "rig", "current", "previous", "attempts"]
        return {k: data[k] for k in order} | {k: v for k, v in data.items() if k not in order}
