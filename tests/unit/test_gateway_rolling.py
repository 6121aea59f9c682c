"""A rolling swap of 4 stand-in engines behind the real HAProxy (the distribution's) running
rigfleet's generated gateway config, under a bounded load (160 requests, 4 at once, every other one
streaming; bench/gateway.py): with the drain the serving swap does (rigfleet.operations.serving.
Drain) every request succeeds, every stream ends with [DONE], and HAProxy's own request log shows
no request sent to an engine while it was out. The comparison without drain is a benchmark
(`python -m bench.gateway`), not an assertion here."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench import gateway as harness

pytestmark = pytest.mark.skipif(shutil.which("haproxy") is None,
                                reason="haproxy is not installed (make test installs it)")


def test_a_drained_rolling_swap_loses_no_request() -> None:
    result = harness.measure(drain=True, total=160)
    assert result["requests"] == 160 and result["failed"] == 0, str(result)
    assert result["logged"] == 160  # the gateway logged every request: the next check has data
    assert result["sent_while_out"] == 0
    assert len(result["drain_s"]) == 4  # each engine was drained before its stop


def test_the_log_check_finds_a_request_sent_while_out(tmp_path: Path) -> None:
    log = tmp_path / "log"
    line = ('<134>Dec  3 17:50:01 haproxy[1]: 127.0.0.1:5000 [03/Dec/2026:17:50:01.250] rigfleet-api '
            'model-x/rig-02 0/0/0/1/1 200 10 - - ---- 1/1/0/0/0 0/0 "POST /v1/chat/completions HTTP/1.1"')
    log.write_text(line + "\n")
    stamp = harness._accept_time(line)
    assert stamp is not None
    assert harness.sent_while_out(log, {"rig-02": [(stamp - 1, stamp + 1)]}) == [line]
    assert harness.sent_while_out(log, {"rig-02": [(stamp + 1, stamp + 2)]}) == []
    assert harness.sent_while_out(log, {"rig-01": [(stamp - 1, stamp + 1)]}) == []
