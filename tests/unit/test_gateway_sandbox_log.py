"""The sandbox gateway test's reading of HAProxy's log and of client replies
(tests/sandbox/gateway_load.py), on lines the distribution's HAProxy writes."""

from __future__ import annotations

import json

from tests.sandbox.gateway_load import GatewayLog, check_reply, check_stream

B = "model-qwen3.6-27b-autoround"


def entry(at: float, message: str) -> str:
    return json.dumps({"MESSAGE": message, "__REALTIME_TIMESTAMP": str(int(at * 1e6))})


def request(date: str, server: str, status: int = 200) -> str:
    return (f"10.231.0.1:40000 [{date}] rigfleet-api {B}/{server} 0/0/0/12/12 {status} 900 - - ---- "
            '3/3/2/1/0 0/0 "POST /v1/chat/completions HTTP/1.1"')


# 04/Dec/2026:03:00:00.000 UTC
T0 = 1796353200.0


def journal() -> str:
    return "\n".join([
        entry(T0 + 0.5, request("04/Dec/2026:03:00:00.100", "rig-02")),
        entry(T0 + 1.0, f"Server {B}/rig-02 enters drain state. 3 active and 0 backup servers online."),
        entry(T0 + 1.001, f"Server {B}/rig-02 enters drain state. 3 active and 0 backup servers online."),
        entry(T0 + 1.2, f"Server {B}/rig-02 is going DOWN for maintenance. 3 active and 0 backup servers left."),
        entry(T0 + 2.1, request("04/Dec/2026:03:00:02.000", "rig-03")),
        entry(T0 + 3.1, request("04/Dec/2026:03:00:03.000", "rig-02")),  # sent while out
        entry(T0 + 5.0, f"Server {B}/rig-02 is UP/READY (leaving forced maintenance)."),
        entry(T0 + 5.001, f"Server {B}/rig-02 is UP/READY (leaving forced maintenance)."),
        entry(T0 + 6.0, request("04/Dec/2026:03:00:06.000", "rig-02")),
        entry(T0 + 6.5, f"Server {B}/rig-04 enters drain state. 3 active and 0 backup servers online."),
        "not json",
    ])


def test_requests_and_state_changes_are_read_with_the_hosts_offset() -> None:
    """Each state change once (HAProxy under systemd reports it to the journal twice)."""
    log = GatewayLog.parse(journal(), "+0000\n")
    assert [(r.server, round(r.accepted - T0, 3)) for r in log.requests] == [
        ("rig-02", 0.1), ("rig-03", 2.0), ("rig-02", 3.0), ("rig-02", 6.0)]
    assert [(e[2], e[3]) for e in log.events] == [("rig-02", "drain"), ("rig-02", "maint"), ("rig-02", "ready"),
                                                  ("rig-04", "drain")]
    shifted = GatewayLog.parse(journal(), "+0100")  # the same local dates an hour east: an hour earlier
    assert shifted.requests[0].accepted == log.requests[0].accepted - 3600


def test_out_windows_and_requests_sent_while_out() -> None:
    log = GatewayLog.parse(journal(), "+0000")
    assert log.out_windows("rig-02", T0 + 10) == [(T0 + 1.0, T0 + 5.0)]
    assert log.out_windows("rig-04", T0 + 10) == [(T0 + 6.5, T0 + 10)]  # still out at the end
    assert log.out_windows("rig-03", T0 + 10) == []
    sent = log.sent_while_out(["rig-02", "rig-03", "rig-04"], T0 + 10, margin_s=0.25)
    assert [(r.server, round(r.accepted - T0, 3)) for r in sent] == [("rig-02", 3.0)]
    assert log.served_by(lambda r: r.accepted > T0 + 1) == {"rig-03": 1, "rig-02": 2}


def test_client_checks_of_replies_and_streams() -> None:
    assert check_reply(json.dumps({"choices": [{"message": {"content": "Blue."}}]})) is None
    assert check_reply(json.dumps({"choices": [{"message": {"content": ""}}]})) == "empty reply"
    assert check_reply("") == "broken reply"
    chunk = "data: " + json.dumps({"choices": [{"delta": {"content": "Blue"}}]}) + "\n\n"
    assert check_stream(chunk * 2 + "data: [DONE]\n\n") is None
    assert check_stream(chunk * 2) == "stream cut (no [DONE])"
    empty = "data: " + json.dumps({"choices": [{"delta": {"content": ""}}]}) + "\n\n"
    assert check_stream(empty + "data: [DONE]\n\n") == "empty stream"
    assert check_stream('data: {"choi\n\ndata: [DONE]\n\n') == "broken stream event"
