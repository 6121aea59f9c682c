"""Gate decisions on canned engine output: boot logs, replies, /metrics (rigfleet.gate.checks)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from rigfleet import gate
from rigfleet.gate import checks

GOOD_BOOT = """\
INFO 05-12 10:00:01 [__init__.py:239] Genesis platform: {'gpu': 'NVIDIA GeForce RTX 3090', 'sm': 86}
INFO [Genesis registry] 42 dispatcher entries — schema-clean, dependency graph consistent.
INFO [Genesis Dispatcher] APPLY P67_TQ_MULTI_QUERY_KERNEL — multi-query verify kernel
INFO Genesis Results: 38 applied, 4 skipped, 0 failed
INFO [Genesis] structured boot summary:
INFO [Genesis compile-watchdog] apply_all elapsed: 12.3s
(EngineCore_DP0 pid=71) INFO 05-12 10:01:40 [kv_cache_utils.py:1087] GPU KV cache size: 1,221,472 tokens
(EngineCore_DP0 pid=71) INFO 05-12 10:01:40 [kv_cache_utils.py:1091] Maximum concurrency for 262,144 tokens \
per request: 4.66x
INFO 05-12 10:02:10 [api_server.py:1814] Application startup complete.
"""


def chat(content: str | None, tokens: int | None = None) -> dict[str, Any]:
    words = len((content or "").split())
    return {"choices": [{"message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": 20, "completion_tokens": words if tokens is None else tokens}}


PROSE = ("Bridges began as logs laid across streams. Stone arches followed, carried by Roman engineers "
         "who learned that compression suits masonry. Medieval towns added houses and chapels on their spans. "
         "Iron changed everything in the eighteenth century, and steel cables later let suspension bridges "
         "cross wide estuaries. Engineers now model wind, traffic and fatigue before a single pier is poured, "
         "and every era left a lesson about loads, materials and maintenance for the next one.")


# --- boot log -----------------------------------------------------------------------------------

def test_kv_pool_is_parsed_with_thousands_separators() -> None:
    assert checks.parse_kv_pool(GOOD_BOOT) == 1_221_472
    assert checks.parse_max_concurrency(GOOD_BOOT) == (262_144, 4.66)
    assert checks.parse_kv_pool("GPU KV cache size: 605000 tokens") == 605_000
    assert checks.parse_kv_pool("nothing here") is None


def test_kv_pool_missing_fails_and_low_pool_only_warns() -> None:
    [missing] = checks.check_kv_pool("booted\n", predicted=1_200_000)
    assert not missing.ok and not missing.warning
    ok, low = checks.check_kv_pool("GPU KV cache size: 900,000 tokens", predicted=1_200_000)
    assert ok.ok and low.warning and "75%" in low.detail
    assert checks.passed([ok, low])
    assert len(checks.check_kv_pool("GPU KV cache size: 1,000,000 tokens", predicted=1_200_000)) == 1


def test_genesis_zero_failed_passes() -> None:
    [check] = checks.check_genesis(GOOD_BOOT, needs_genesis=True)
    assert check.ok and "38 applied" in check.detail


def test_genesis_not_needed_is_not_checked() -> None:
    assert checks.check_genesis("no genesis at all", needs_genesis=False) == []


def test_genesis_failed_patch_fails() -> None:
    log = GOOD_BOOT.replace("0 failed", "1 failed") + "ERROR [Genesis] FAILED: P67 — write error\n"
    [check] = checks.check_genesis(log, needs_genesis=True)
    assert not check.ok and "1 patch(es) failed" in check.detail


def test_genesis_failed_line_alone_fails() -> None:
    [check] = checks.check_genesis(GOOD_BOOT + "ERROR [Genesis] FAILED: P4 anchor\n", needs_genesis=True)
    assert not check.ok


def test_genesis_drift_skip_fails() -> None:
    log = GOOD_BOOT + "WARNING [Genesis] DRIFT skipped: P60 — anchor not found / required_anchor_missing\n"
    [check] = checks.check_genesis(log, needs_genesis=True)
    assert not check.ok and "DRIFT" in check.detail


def test_genesis_missing_results_fails() -> None:
    [check] = checks.check_genesis("INFO Application startup complete.", needs_genesis=True)
    assert not check.ok and "Genesis Results" in check.detail


def test_genesis_any_worker_failing_counts() -> None:
    log = GOOD_BOOT + "(Worker_TP1) Genesis Results: 37 applied, 4 skipped, 1 failed, 2 ⚠️ partial-apply warning(s)\n"
    [check] = checks.check_genesis(log, needs_genesis=True)
    assert not check.ok


# --- replies ------------------------------------------------------------------------------------

def test_paris() -> None:
    assert checks.check_paris(200, chat("The capital of France is Paris.")).ok
    assert not checks.check_paris(200, chat("Lyon")).ok
    assert not checks.check_paris(500, "engine dead").ok


def test_models_lists_the_served_name() -> None:
    body = {"object": "list", "data": [{"id": "qwen3.6-27b-autoround", "object": "model"}]}
    assert checks.check_models(200, body, ["qwen3.6-27b-autoround"]).ok
    assert not checks.check_models(200, body, ["other"]).ok
    assert not checks.check_models(401, {"error": "unauthorized"}, ["qwen3.6-27b-autoround"]).ok


@pytest.mark.parametrize("text", ["!" * 40, "Bridges began as" + "!" * 200, "Sure! " + "! " * 30])
def test_bang_flood_is_detected(text: str) -> None:
    assert checks.bang_flood(text)
    assert not checks.check_long_output(200, chat(text, 300)).ok


@pytest.mark.parametrize("text", [
    "The " * 50,  # first-word repetition
    "Bridges began as logs. " + " ".join(["Bridges"] * 30),
    "A line that repeats.\nA line that repeats.\nA line that repeats.\n",
    " ".join(["stone bridge river"] * 40),  # lexical variety 3/120
])
def test_repetition_is_detected(text: str) -> None:
    assert checks.repetition(text)
    assert not checks.check_long_output(200, chat(text, 300)).ok


def test_good_long_output_passes() -> None:
    assert checks.degenerate(PROSE) is None
    assert checks.degenerate("Wow! That is great! Thanks!") is None
    assert checks.check_long_output(200, chat(PROSE)).ok


def test_silent_empty_replies() -> None:
    assert checks.silent_empty(200, chat("", 0))
    assert checks.silent_empty(200, chat(None, 0))
    assert checks.silent_empty(200, chat("text", 0))  # 0 completion tokens is empty whatever the body says
    assert not checks.silent_empty(200, chat("Paris"))
    assert not checks.silent_empty(500, chat("", 0))  # an error, counted separately


def test_soak_needs_zero_empty_replies() -> None:
    good = [(200, chat("Danube, Rhine and Seine are long rivers."))] * 12
    assert checks.check_soak(good).ok
    bad = good[:8] + [(200, chat("", 0))] * 4
    check = checks.check_soak(bad)
    assert not check.ok and "4/12 silent-empty" in check.detail
    assert not checks.check_soak(good + [(503, "overloaded")]).ok
    assert not checks.check_soak(good + [(200, chat("!" * 50))]).ok
    assert not checks.check_soak([]).ok


# --- needles ------------------------------------------------------------------------------------

def test_haystack_is_salted_and_sized() -> None:
    rng = random.Random(7)
    secret, salt = checks.make_secret(rng), checks.make_salt(rng)
    text = checks.make_haystack(10_000, secret, salt, rng, depth=0.3)
    assert salt in text and f"The secret passphrase is: {secret}." in text
    assert 38_000 <= len(text) <= 42_000
    assert len(secret.split()) == 3 and secret.split()[2].isdigit()
    other = checks.make_haystack(10_000, secret, checks.make_salt(rng), rng)
    assert other[:200] != text[:200]  # a new salt: no prefix-cache hit between runs


def test_needle_found_and_missed() -> None:
    assert checks.check_needle(30_000, 200, chat("golden chinchilla 38"), "golden chinchilla 38").ok
    assert checks.check_needle(30_000, 200, chat("The passphrase is: Golden Chinchilla 38."),
                               "golden chinchilla 38").ok
    missed = checks.check_needle(30_000, 200, chat("I could not find it."), "golden chinchilla 38")
    assert not missed.ok and missed.name == "needle_30k" and "missed" in missed.detail
    assert not checks.check_needle(10_000, 200, chat("golden golden golden golden"), "golden chinchilla 38").ok
    assert not checks.check_needle(10_000, 200, chat("!!!!!!!!!!!!!!!!!!"), "golden chinchilla 38").ok


def test_needle_above_max_len_is_a_graceful_skip() -> None:
    check = checks.check_needle(60_000, 400, {"error": "maximum context length"}, "x y 1")
    assert check.ok and check.warning


# --- /metrics -----------------------------------------------------------------------------------

def metrics(drafts: float, draft_tokens: float, accepted: float) -> str:
    return f"""# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {drafts}
vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {draft_tokens}
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {accepted}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="0"}} 1.0
vllm:num_requests_running{{engine="0",model_name="m"}} 0.0
"""


def test_metrics_are_parsed_and_summed_over_labels() -> None:
    text = metrics(10, 30, 25) + 'vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 5.0\n'
    parsed = checks.parse_metrics(text)
    assert parsed[checks.DRAFTS] == 15
    assert parsed[checks.ACCEPTED] == 25


def test_acceptance_length_over_the_gate_traffic() -> None:
    before = checks.parse_metrics(metrics(100, 300, 200))
    after = checks.parse_metrics(metrics(300, 900, 708))  # 200 drafts, 508 accepted: AL 3.54
    length, rate, drafts = checks.acceptance(before, after)
    assert drafts == 200 and length == pytest.approx(3.54) and rate == pytest.approx(508 / 600)
    assert checks.check_acceptance(before, after, 2.0).ok


def test_low_acceptance_length_fails() -> None:
    check = checks.check_acceptance({}, checks.parse_metrics(metrics(200, 600, 12)), 2.0)
    assert not check.ok and "1.06" in check.detail


def test_perfect_acceptance_is_suspicious() -> None:
    check = checks.check_acceptance({}, checks.parse_metrics(metrics(200, 600, 600)), 2.0)
    assert not check.ok and "100%" in check.detail


def test_no_drafts_fails() -> None:
    assert not checks.check_acceptance({}, checks.parse_metrics("vllm:num_requests_running 0\n"), 2.0).ok


# --- result handling on the control machine -----------------------------------------------------

def test_parse_output_takes_the_last_json_line() -> None:
    result = gate.parse_output('noise\n{"ok": true, "checks": [{"name": "health", "ok": true}]}\n')
    assert result["ok"] and gate.summary(result) == "passed (health)"


def test_parse_output_without_json_is_a_failure() -> None:
    result = gate.parse_output("Traceback (most recent call last):\n  boom\n")
    assert not result["ok"] and "boom" in gate.summary(result)


def test_warnings_do_not_fail() -> None:
    result = {"ok": True, "checks": [{"name": "kv_pool_low", "ok": False, "warning": True, "detail": "60%"}]}
    assert gate.failures(result) == [] and gate.warnings(result) == ["kv_pool_low: 60%"]


def test_rig_files_are_stdlib_only() -> None:
    files = gate.rig_files()
    assert set(files) == {"checks.py", "probe.py"}
    for text in files.values():
        imports = [line for line in text.splitlines() if line.startswith(("import ", "from "))]
        assert not [line for line in imports if "rigfleet" in line or "pyinfra" in line], imports


def test_vram_growth_within_the_limit_passes_and_over_it_fails() -> None:
    flat = checks.check_vram_growth(43_000, 43_064, 200)
    assert flat.ok and not flat.warning and "+64 MiB" in flat.detail
    assert checks.check_vram_growth(43_000, 43_200, 200).ok  # the limit itself is allowed
    grown = checks.check_vram_growth(43_000, 44_536, 200, "vram_growth_long")
    assert (grown.name, grown.ok, grown.warning) == ("vram_growth_long", False, False)
    assert "+1536 MiB" in grown.detail and "200 MiB" in grown.detail
    assert checks.check_vram_growth(44_000, 43_000, 200).ok  # memory handed back is no leak


@pytest.mark.parametrize(("before", "after"), [(None, 43_000), (43_000, None), (None, None), (0, 0), (0, 43_000),
                                               (43_000, 0)])
def test_vram_reading_missing_or_zero_is_not_a_pass(before: int | None, after: int | None) -> None:
    """The check runs on an engine that serves a model: 0 MiB in use means nvidia-smi does not see
    it (a blind reading), which must fail, not pass as "no growth" or fade into a warning."""
    check = checks.check_vram_growth(before, after, 200)
    assert not check.ok and not check.warning
    assert check.detail.startswith("could not measure")
    assert not checks.passed([check])
