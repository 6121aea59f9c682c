"""On-rig state: typed records that read what older rigfleet versions wrote, and write the same JSON;
one module (rigfleet.rigstate) spells every on-rig path."""

from __future__ import annotations

import ast
import copy
import json
from pathlib import Path

from rigfleet import ledger, rigstate, status
from rigfleet.rigstate import ReleaseRecord

PACKAGE = Path(__file__).resolve().parents[2] / "rigfleet"

# a ledger as an older rigfleet wrote it: `image_tag` instead of `image`, a key this version does
# not know, an attempt without the newer fields, one with a log tail
OLD_LEDGER = {
    "schema": 1,
    "rig": "rig-01",
    "current": {"release_id": "r2", "pinset": "stock", "variant": "tq3", "image_tag": "rigfleet/vllm:abc",
                "kv_pool_tokens": 1000, "since": "2026-01-01T00:00:00Z", "note": "kept"},
    "previous": {"release_id": "r1", "pinset": "stock", "variant": "tq3"},
    "attempts": [
        {"kind": "deploy", "release_id": "r1", "result": "passed"},
        {"kind": "deploy", "release_id": "r2", "result": "failed", "log_tail": ["boom"], "extra": 1},
    ],
    "written_by": "rigfleet 0.1",
}


def test_an_old_ledger_reads_typed_and_writes_back_unchanged() -> None:
    book = ledger.load(copy.deepcopy(OLD_LEDGER), "rig-01")
    assert ledger.current_id(book) == "r2" and ledger.previous_id(book) == "r1"
    assert book.current is not None and book.current.image_ref == "rigfleet/vllm:abc"
    last = ledger.last_attempt(book)
    assert last is not None and last.result == "failed" and last.log_tail == ["boom"]
    assert json.loads(ledger.dumps(book)) == OLD_LEDGER


def test_unusable_ledgers_give_an_empty_one() -> None:
    for raw in (None, "x", {"unreadable": "bad json"}, {"current": "r1", "attempts": "no"}):
        book = ledger.load(raw, "rig-01")
        assert book.current is None and book.attempts == [] and book.rig == "rig-01"
    # an entry without a release id is no entry; a field of an odd type does not lose the record
    book = ledger.load({"current": {"pinset": "x"}, "previous": {"release_id": "r1", "kv_pool_tokens": "many"}}, "r")
    assert book.current is None and ledger.previous_id(book) == "r1"


META = ReleaseRecord(release_id="r3", rig="rig-01", pinset="stock", variant="tq3", image="img:3", kv_predicted=5)


def test_a_passed_attempt_moves_current_to_previous_in_the_file_format_of_before() -> None:
    book = ledger.load(copy.deepcopy(OLD_LEDGER), "rig-01")
    attempt = ledger.attempt("deploy", META, ledger.now(), from_release="r2")
    gate = {"ok": True, "level": "basic", "kv_pool_tokens": 7, "container": {"id": "c1"},
            "checks": [{"name": "health", "ok": True, "detail": "200", "warning": False, "log": "dropped"}]}
    done = ledger.finish(attempt, "passed", gate=gate, downtime_s=1.23456)
    book = ledger.record(book, done, became_current=ledger.entry(META, gate, 1.2))
    data = json.loads(ledger.dumps(book))
    assert list(data) == ["schema", "rig", "current", "previous", "attempts", "written_by"]
    assert data["previous"]["release_id"] == "r2" and data["previous"]["image_tag"] == "rigfleet/vllm:abc"
    assert list(data["current"]) == list(ledger.ENTRY_KEYS) == [
        "release_id", "pinset", "variant", "image", "kv_pool_tokens", "kv_predicted", "gate_level",
        "container_id", "since", "downtime_s"]
    assert data["current"]["container_id"] == "c1" and data["current"]["kv_pool_tokens"] == 7
    written = data["attempts"][-1]
    assert list(written) == ["kind", "release_id", "pinset", "variant", "image", "from_release", "started",
                             "ended", "result", "gate", "kv_pool_tokens", "kv_predicted", "acceptance_length",
                             "downtime_s", "restored", "restore_ok", "error"], "no log_tail on a passed attempt"
    assert written["downtime_s"] == 1.235 and written["gate"]["checks"][0] == {
        "name": "health", "ok": True, "detail": "200", "warning": False}
    assert len(data["attempts"]) == 3


def test_a_release_record_reads_an_old_one_and_keeps_unknown_keys() -> None:
    old = {"release_id": "r1", "image": "img:1", "port": 8000, "gate": {"level": "basic"}, "legacy": True}
    record = ReleaseRecord.model_validate_json(json.dumps(old))
    assert record.port == 8000 and record.served_model_names == [] and record.container_name is None
    assert record.to_json()["legacy"] is True


def test_status_reads_the_image_of_an_old_ledger_entry() -> None:
    current = status._current(OLD_LEDGER)
    assert current is not None and current.image_ref == "rigfleet/vllm:abc" and current.pinset == "stock"
    assert status._current(None) is None


def test_the_gate_probe_reads_the_record_rigstate_names() -> None:
    # the probe runs on the rig with the standard library only: it spells the name itself
    probe = (PACKAGE / "gate" / "probe.py").read_text(encoding="utf-8")
    assert f'"{rigstate.RELEASE_RECORD}"' in probe
    assert rigstate.release_record_path("r1") == f"{rigstate.RELEASES_DIR}/r1/{rigstate.RELEASE_RECORD}"


ON_RIG = ("/opt/rigfleet", "/var/lib/rigfleet", "/var/log/rigfleet", "/etc/rigfleet")


def test_only_rigstate_spells_an_on_rig_path() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "rigstate.py" or path.parent.name == "gate":  # the gate runs on the rig (above)
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                    and any(prefix in node.value for prefix in ON_RIG)):
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert not offenders, offenders
