"""Health-gate decisions: pure functions over what the engine said (boot log, replies, /metrics).

STDLIB ONLY and Python 3.10-compatible: this file is uploaded to the rig next to probe.py and
runs there (the API may bind to an address only the rig itself can reach). The same functions
are unit-tested on the control machine with canned responses.

The signatures come from the seed report and club-3090's verify scripts (research/club3090.md
section 7): a broken TQ3+MTP path boots, answers short prompts and shows a fine throughput,
while long outputs collapse into `!` floods or first-word repetition, long-context needles are
missed, ~1/3 of multi-turn replies are silently empty (HTTP 200, 0 completion tokens) and the
MTP acceptance length drops (or sits at a suspicious 100%).
"""

from __future__ import annotations

import json
import random
import re
import string
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

# Defaults; release.json may override any of them under "gate".
DEFAULTS: dict[str, Any] = {
    "kv_warn_ratio": 0.8,  # warn when the measured KV pool is under 80% of the planner's prediction
    "acceptance_min": 2.0,  # club-3090 verify-full: MTP mean acceptance length >= 2.0
    "needle_tokens": [10_000, 30_000, 60_000],
    "soak_sessions": 4,
    "soak_turns": 3,
    "unhealthy_grace_s": 30,  # /health answering an error this long (while the API is up) fails the gate
    "request_timeout_s": 180,  # one request, cold JIT included
    "stress_needle_tokens": [10_000, 60_000, 120_000],
    "limit_probe_tokens": None,  # default: 90 % of max_model_len
    "soak_long_sessions": 20,  # club-3090 soak: 20 sessions x 5 turns
    "soak_long_turns": 5,
    "vram_growth_max_mib": 200,
    "retention_min": 0.98,
}

BANG_RUN = 8  # "!!!!!!!!" never appears in a sane answer
BANG_SHARE = 0.3
SAME_TOKEN_RUN = 4  # "the the the the"
SAME_LINE_RUN = 3
LEXICAL_VARIETY_MIN = 0.30  # club-3090 verify-full: lexical variety >= 0.30 on long outputs
LEXICAL_MIN_WORDS = 60
SUSPICIOUS_RATE_MIN_DRAFTS = 50


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""
    warning: bool = False  # a warning never fails the gate

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def failed(checks: Iterable[Check]) -> list[Check]:
    return [c for c in checks if not c.ok and not c.warning]


def passed(checks: Iterable[Check]) -> bool:
    return not failed(checks)


# --- boot log -----------------------------------------------------------------------------------

_INT = r"(\d[\d,_]*)"
KV_POOL = re.compile(r"GPU KV cache size:\s*" + _INT + r"\s*tokens")
MAX_CONCURRENCY = re.compile(r"Maximum concurrency for\s*" + _INT + r"\s*tokens per request:\s*([\d.]+)\s*x")
GENESIS_RESULTS = re.compile(r"Genesis Results:\s*(\d+)\s+applied,\s*(\d+)\s+skipped,\s*(\d+)\s+failed")
GENESIS_DRIFT = re.compile(r"\[Genesis\]\s*DRIFT skipped")
GENESIS_FAILED = re.compile(r"\[Genesis\]\s*FAILED")


def _int(text: str) -> int:
    return int(text.replace(",", "").replace("_", ""))


def parse_kv_pool(log: str) -> int | None:
    """Tokens of the last `GPU KV cache size: N tokens` line (vLLM prints thousands separators)."""
    found = KV_POOL.findall(log)
    return _int(found[-1]) if found else None


def parse_max_concurrency(log: str) -> tuple[int, float] | None:
    found = MAX_CONCURRENCY.findall(log)
    return (_int(found[-1][0]), float(found[-1][1])) if found else None


@dataclass
class GenesisReport:
    results: list[tuple[int, int, int]] = field(default_factory=list)  # (applied, skipped, failed) per worker
    drift: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def failed_count(self) -> int:
        return sum(r[2] for r in self.results)


def parse_genesis(log: str) -> GenesisReport:
    report = GenesisReport()
    for line in log.splitlines():
        match = GENESIS_RESULTS.search(line)
        if match:
            report.results.append((int(match.group(1)), int(match.group(2)), int(match.group(3))))
        if GENESIS_DRIFT.search(line):
            report.drift.append(line.strip()[-200:])
        if GENESIS_FAILED.search(line):
            report.failures.append(line.strip()[-200:])
    return report


def check_genesis(log: str, needs_genesis: bool) -> list[Check]:
    """Genesis must report 0 failed and no drift skips (a drift skip means a patch is not protecting you)."""
    if not needs_genesis:
        return []
    report = parse_genesis(log)
    if not report.results:
        return [Check("genesis", False, "no 'Genesis Results: A applied, S skipped, F failed' line in the boot log")]
    applied, skipped, _ = report.results[-1]
    if report.failures or report.failed_count:
        first = report.failures[0] if report.failures else ""
        return [Check("genesis", False, f"{report.failed_count} patch(es) failed {first}".strip())]
    if report.drift:
        return [Check("genesis", False, f"{len(report.drift)} DRIFT skip(s): {report.drift[0]}")]
    return [Check("genesis", True, f"{applied} applied, {skipped} skipped, 0 failed, no drift")]


def check_kv_pool(log: str, predicted: int | None, warn_ratio: float = DEFAULTS["kv_warn_ratio"]) -> list[Check]:
    pool = parse_kv_pool(log)
    if pool is None:
        return [Check("kv_pool", False, "no 'GPU KV cache size: N tokens' line in the boot log")]
    checks = [Check("kv_pool", True, f"{pool} tokens" + (f" (predicted {predicted})" if predicted else ""))]
    if predicted and pool < warn_ratio * predicted:
        checks.append(Check("kv_pool_low", False, f"KV pool {pool} tokens is {pool / predicted:.0%} of the "
                            f"predicted {predicted} (under {warn_ratio:.0%})", warning=True))
    return checks


# --- replies ------------------------------------------------------------------------------------

_WORD = re.compile(r"[A-Za-z0-9']+")


def bang_flood(text: str) -> str | None:
    """The seed's `!`-flood: a run of `!` or a text made mostly of them."""
    longest = max((len(run) for run in re.findall(r"!+", text)), default=0)
    if longest >= BANG_RUN:
        return f"a run of {longest} '!'"
    visible = [c for c in text if not c.isspace()]
    if len(visible) >= 20 and visible.count("!") / len(visible) >= BANG_SHARE:
        return f"{visible.count('!') / len(visible):.0%} of the text is '!'"
    return None


def repetition(text: str) -> str | None:
    """First-word repetition, a line repeated back to back, or a long text with almost no variety."""
    words = [w.lower() for w in _WORD.findall(text)]
    run, longest, word = 1, 1, ""
    for prev, cur in zip(words, words[1:], strict=False):
        run = run + 1 if cur == prev else 1
        if run > longest:
            longest, word = run, cur
    if longest >= SAME_TOKEN_RUN:
        return f"'{word}' repeated {longest} times in a row"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    run = 1
    for prev, cur in zip(lines, lines[1:], strict=False):
        run = run + 1 if cur == prev and len(cur) > 3 else 1
        if run >= SAME_LINE_RUN:
            return f"line {cur[:60]!r} repeated {run} times in a row"
    if len(words) >= LEXICAL_MIN_WORDS:
        variety = len(set(words)) / len(words)
        if variety < LEXICAL_VARIETY_MIN:
            return f"lexical variety {variety:.2f} < {LEXICAL_VARIETY_MIN}"
    return None


def degenerate(text: str) -> str | None:
    return bang_flood(text) or repetition(text)


def reply_text(body: Any) -> str:
    """The assistant content of a chat completion (empty when missing)."""
    try:
        content = body["choices"][0]["message"].get("content")
    except (KeyError, IndexError, TypeError, AttributeError):
        return ""
    return content if isinstance(content, str) else ""


def completion_tokens(body: Any) -> int | None:
    try:
        value = body["usage"]["completion_tokens"]
    except (KeyError, TypeError):
        return None
    return value if isinstance(value, int) else None


def silent_empty(status: int, body: Any) -> bool:
    """HTTP 200 with nothing in it: 0 completion tokens or no content at all (the soak's failure)."""
    if status != 200:
        return False
    return completion_tokens(body) == 0 or not reply_text(body).strip()


def check_paris(status: int, body: Any) -> Check:
    text = reply_text(body)
    if status != 200:
        return Check("chat", False, f"HTTP {status}: {str(body)[:200]}")
    if "paris" not in text.lower():
        return Check("chat", False, f"'capital of France' answered {text[:120]!r} (no 'Paris')")
    return Check("chat", True, f"answered {text.strip()[:60]!r}")


def served_names(body: Any) -> list[str]:
    try:
        return [str(m["id"]) for m in body["data"]]
    except (KeyError, TypeError):
        return []


def check_models(status: int, body: Any, expected: Iterable[str]) -> Check:
    names = served_names(body)
    if status != 200:
        return Check("models", False, f"/v1/models HTTP {status}")
    missing = [n for n in expected if n not in names]
    if missing:
        return Check("models", False, f"/v1/models lists {names}, missing {missing}")
    return Check("models", True, ", ".join(names))


# --- needles ------------------------------------------------------------------------------------

COLORS = ["golden", "crimson", "azure", "violet", "amber", "silver", "scarlet", "emerald", "ivory", "cobalt",
          "copper", "indigo", "saffron", "teal", "maroon", "olive"]
ANIMALS = ["chinchilla", "pelican", "otter", "lynx", "heron", "marmot", "gecko", "walrus", "ibex", "tapir",
           "badger", "falcon", "narwhal", "ocelot", "puffin", "wombat"]
_FILLER = ("river stone bridge market window garden harbor lantern orchard valley meadow village "
                 "winter summer morning evening quiet distant narrow ancient gentle steady careful "
                 "traveler merchant farmer builder painter sailor teacher baker walked carried watched "
                 "repaired counted painted gathered followed measured noticed")
_FILLER_WORDS = _FILLER.split()
CHARS_PER_TOKEN = 4  # plain English on a BPE tokenizer; the reply's usage says what it really was


def make_secret(rng: random.Random) -> str:
    return f"{rng.choice(COLORS)} {rng.choice(ANIMALS)} {rng.randint(10, 99)}"


def make_salt(rng: random.Random) -> str:
    return "SESSION-" + "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(32))


def make_haystack(tokens: int, secret: str, salt: str, rng: random.Random, depth: float = 0.5) -> str:
    """About `tokens` tokens of filler with the secret planted at `depth`; the salt defeats prefix caching."""
    target = tokens * CHARS_PER_TOKEN
    sentences: list[str] = []
    size = 0
    while size < target:
        words = [rng.choice(_FILLER_WORDS) for _ in range(rng.randint(8, 14))]
        sentence = " ".join(words).capitalize() + "."
        sentences.append(sentence)
        size += len(sentence) + 1
    needle = f"The secret passphrase is: {secret}."
    sentences.insert(int(len(sentences) * depth), needle)
    return f"[{salt}]\n" + " ".join(sentences)


def needle_prompt(haystack: str) -> str:
    return (haystack + "\n\nSomewhere in the text above is a sentence giving the secret passphrase. "
            "What is the secret passphrase? Answer with the passphrase only.")


def needle_found(reply: str, secret: str) -> bool:
    def norm(s: str) -> str:
        return " ".join(_WORD.findall(s.lower()))

    return norm(secret) in norm(reply)


def check_needle(tokens: int, status: int, body: Any, secret: str) -> Check:
    name = f"needle_{tokens // 1000}k"
    if status == 400:  # above max_model_len: a graceful skip, as in club-3090's verify-stress
        return Check(name, True, "skipped: prompt longer than the model accepts (HTTP 400)", warning=True)
    if status != 200:
        return Check(name, False, f"HTTP {status}: {str(body)[:160]}")
    text = reply_text(body)
    prompt_tokens = (body.get("usage") or {}).get("prompt_tokens") if isinstance(body, dict) else None
    where = f" ({prompt_tokens} prompt tokens)" if prompt_tokens else ""
    if not needle_found(text, secret):
        return Check(name, False, f"missed {secret!r}{where}: answered {text[:100]!r}")
    bad = degenerate(text)
    if bad:
        return Check(name, False, f"found the needle but {bad}")
    return Check(name, True, f"recalled {secret!r}{where}")


# --- soak and long output -----------------------------------------------------------------------

SOAK_PROMPTS = [
    "Name three rivers in Europe and one sentence about each.",
    "Explain in two sentences why the sky is blue.",
    "Give a short recipe for a cup of tea.",
    "What is the difference between a list and a tuple in Python? Be brief.",
    "Summarise what we talked about so far in one sentence.",
    "Write a haiku about a lighthouse.",
    "List four prime numbers greater than 50.",
    "Suggest a name for a grey cat and say why.",
]
LONG_PROMPT = ("Write an essay of about 400 words on the history of bridges, from log crossings to "
               "suspension bridges. Use several paragraphs.")


def check_soak(replies: list[tuple[int, Any]]) -> Check:
    """Zero silent-empty replies, zero request errors, no degenerate text over N multi-turn replies."""
    empties = sum(1 for status, body in replies if silent_empty(status, body))
    errors = [status for status, _ in replies if status != 200]
    bad = [d for d in (degenerate(reply_text(body)) for status, body in replies if status == 200) if d]
    if not replies:
        return Check("soak", False, "no soak turn completed in time")
    if empties or errors or bad:
        parts = []
        if empties:
            parts.append(f"{empties}/{len(replies)} silent-empty replies (HTTP 200, 0 completion tokens)")
        if errors:
            parts.append(f"{len(errors)} request error(s) {sorted(set(errors))}")
        if bad:
            parts.append(f"{len(bad)} degenerate repl(ies): {bad[0]}")
        return Check("soak", False, "; ".join(parts))
    return Check("soak", True, f"{len(replies)} turns, 0 empty")


def check_long_output(status: int, body: Any) -> Check:
    if status != 200:
        return Check("long_output", False, f"HTTP {status}")
    text = reply_text(body)
    if silent_empty(status, body):
        return Check("long_output", False, "silent-empty reply (HTTP 200, 0 completion tokens)")
    bad = degenerate(text)
    if bad:
        return Check("long_output", False, f"{bad}: {text[:80]!r}")
    return Check("long_output", True, f"{len(_WORD.findall(text))} words, no flood or repetition")


# --- /metrics -----------------------------------------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eE]+|NaN|[+-]Inf)(\s+\d+)?$")
DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text format, summed over label sets (TP ranks, engines)."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match:
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        totals[match.group(1)] = totals.get(match.group(1), 0.0) + value
    return totals


def _metric(metrics: dict[str, float], name: str) -> float:
    # prometheus_client may expose counters with or without the _total suffix
    return metrics.get(name, metrics.get(name.removesuffix("_total"), 0.0))


def acceptance(before: dict[str, float], after: dict[str, float]) -> tuple[float | None, float | None, int]:
    """(mean acceptance length, acceptance rate, drafts) over the traffic between two scrapes."""
    drafts = _metric(after, DRAFTS) - _metric(before, DRAFTS)
    accepted = _metric(after, ACCEPTED) - _metric(before, ACCEPTED)
    draft_tokens = _metric(after, DRAFT_TOKENS) - _metric(before, DRAFT_TOKENS)
    if drafts <= 0:
        return None, None, 0
    rate = accepted / draft_tokens if draft_tokens > 0 else None
    return 1.0 + accepted / drafts, rate, int(drafts)


def check_acceptance(before: dict[str, float], after: dict[str, float], minimum: float) -> Check:
    length, rate, drafts = acceptance(before, after)
    if length is None:
        return Check("mtp_acceptance", False, "no speculative drafts counted on /metrics (MTP not running?)")
    detail = f"mean acceptance length {length:.2f} over {drafts} drafts"
    if rate is not None:
        detail += f", rate {rate:.0%}"
    if length < minimum:
        return Check("mtp_acceptance", False, f"{detail} (< {minimum})")
    # A perfect 100% over many drafts is the seed's broken-verify signature, not a great model.
    if rate is not None and rate >= 0.999 and drafts >= SUSPICIOUS_RATE_MIN_DRAFTS:
        return Check("mtp_acceptance", False, f"{detail}: a 100% acceptance is the broken spec-verify signature")
    return Check("mtp_acceptance", True, detail)


# --- streaming and tool calls (verify full) ----------------------------------------------------

STREAM_PROMPT = "Write two sentences about a lighthouse keeper."
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
        },
    },
}
TOOL_PROMPT = "What is the weather in Paris right now? Use the tool."
_JSON_TYPES: dict[str, tuple[type, ...]] = {"string": (str,), "integer": (int,), "number": (int, float),
                                            "boolean": (bool,), "array": (list,), "object": (dict,)}


def parse_sse(raw: str) -> tuple[list[dict[str, Any]], list[str], bool]:
    """(events, problems, saw [DONE]) of a text/event-stream body."""
    events: list[dict[str, Any]] = []
    problems: list[str] = []
    done = False
    for line in raw.splitlines():
        if not line.strip() or line.startswith(":"):
            continue
        if not line.startswith("data:"):
            problems.append(f"not an SSE data line: {line[:60]!r}")
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            done = True
            continue
        if done:
            problems.append("an event after data: [DONE]")
        try:
            value = json.loads(data)
        except ValueError:
            problems.append(f"an event that is not JSON: {data[:60]!r}")
            continue
        if isinstance(value, dict):
            events.append(value)
        else:
            problems.append(f"an event that is not a JSON object: {data[:60]!r}")
    return events, problems, done


def _deltas(events: list[dict[str, Any]]) -> list[tuple[dict[str, Any], Any]]:
    out = []
    for event in events:
        for choice in event.get("choices") or []:
            if isinstance(choice, dict):
                out.append((choice.get("delta") or {}, choice.get("finish_reason")))
    return out


def check_streaming(status: int, raw: Any) -> Check:
    """Well-formed SSE, ending in [DONE], with content, and no empty deltas after the last content."""
    if status != 200:
        return Check("streaming", False, f"HTTP {status}: {str(raw)[:160]}")
    events, problems, done = parse_sse(raw if isinstance(raw, str) else json.dumps(raw))
    if problems:
        return Check("streaming", False, f"{problems[0]} ({len(problems)} problem(s))")
    if not done:
        return Check("streaming", False, f"the stream ended without data: [DONE] after {len(events)} events")
    deltas = _deltas(events)
    text = "".join(str(d.get("content") or "") for d, _ in deltas)
    if not text.strip():
        return Check("streaming", False, f"{len(events)} events and no content")
    last_content = max(i for i, (d, _) in enumerate(deltas) if d.get("content"))
    trailing = [d for d, finish in deltas[last_content + 1:] if not finish and "content" in d and not d["content"]]
    if trailing:
        return Check("streaming", False, f"{len(trailing)} empty content delta(s) after the last content")
    bad = degenerate(text)
    if bad:
        return Check("streaming", False, f"streamed text: {bad}")
    return Check("streaming", True, f"{len(events)} events, {len(_WORD.findall(text))} words, [DONE]")


def schema_problem(args: Any, schema: dict[str, Any]) -> str | None:
    """The first way `args` breaks a flat JSON schema (required keys, types, enums), or None."""
    if not isinstance(args, dict):
        return f"arguments are {type(args).__name__}, not an object"
    props = schema.get("properties") or {}
    for key in schema.get("required") or []:
        if key not in args:
            return f"required argument {key!r} missing"
    for key, value in args.items():
        spec = props.get(key)
        if spec is None:
            continue
        kinds = _JSON_TYPES.get(str(spec.get("type")), (object,))
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            return f"argument {key!r} is {type(value).__name__}, the schema says {spec.get('type')}"
        if spec.get("enum") and value not in spec["enum"]:
            return f"argument {key!r}={value!r} is not one of {spec['enum']}"
    return None


def _tool_verdict(name: str, calls: list[tuple[str, str]], tool: dict[str, Any]) -> Check:
    want = tool["function"]["name"]
    if not calls:
        return Check(name, False, "no tool call in the reply")
    called, raw_args = calls[0]
    if called != want:
        return Check(name, False, f"called {called!r}, expected {want!r}")
    try:
        args = json.loads(raw_args)
    except ValueError:
        return Check(name, False, f"arguments are not JSON: {raw_args[:80]!r}")
    problem = schema_problem(args, tool["function"].get("parameters") or {})
    if problem:
        return Check(name, False, problem)
    return Check(name, True, f"{called}({raw_args[:60]})")


def check_tool_call(status: int, body: Any, tool: dict[str, Any] = TOOL) -> Check:
    if status != 200:
        return Check("tool_call", False, f"HTTP {status}: {str(body)[:160]}")
    try:
        raw = body["choices"][0]["message"].get("tool_calls") or []
        calls = [(str(c["function"]["name"]), str(c["function"].get("arguments") or "")) for c in raw]
    except (KeyError, IndexError, TypeError, AttributeError):
        calls = []
    return _tool_verdict("tool_call", calls, tool)


def check_tool_stream(status: int, raw: Any, tool: dict[str, Any] = TOOL) -> Check:
    """A streamed tool call: name and argument fragments joined per index, then the same verdict."""
    if status != 200:
        return Check("tool_call_stream", False, f"HTTP {status}: {str(raw)[:160]}")
    events, problems, done = parse_sse(raw if isinstance(raw, str) else "")
    if problems or not done:
        return Check("tool_call_stream", False, problems[0] if problems else "the stream ended without [DONE]")
    names: dict[int, str] = {}
    args: dict[int, str] = {}
    for delta, _ in _deltas(events):
        for call in delta.get("tool_calls") or []:
            index = int(call.get("index", 0))
            function = call.get("function") or {}
            names[index] = names.get(index, "") + str(function.get("name") or "")
            args[index] = args.get(index, "") + str(function.get("arguments") or "")
    calls = [(names[i], args.get(i, "")) for i in sorted(names)]
    return _tool_verdict("tool_call_stream", calls, tool)


# --- degeneracy, stress and soak (verify full/stress/soak) -------------------------------------

DEGENERACY_PROMPTS = [
    LONG_PROMPT,
    "Write a story of about 300 words about a lighthouse keeper and a storm.",
    "Explain in detail how a refrigerator works, in about 250 words.",
]
NEEDLE_DEPTHS = (0.1, 0.5, 0.9)
CACHE_GUARD_SHARE = 0.5  # a salted needle prompt must not be answered mostly from the prefix cache
VRAM_GROWTH_MAX_MIB = 200  # club-3090 soak: VRAM growth <= 200 MiB
RETENTION_MIN = 0.98  # club-3090 soak: throughput retention >= 98 %
RETENTION_MIN_WINDOW_S = 2.0  # shorter windows are all latency noise: reported, not judged


def check_degeneracy(replies: list[tuple[int, Any]]) -> Check:
    """Long outputs: no `!` flood, no repetition, enough lexical variety, none silently empty."""
    for index, (status, body) in enumerate(replies):
        if status != 200:
            return Check("degeneracy", False, f"prompt {index + 1}: HTTP {status}")
        if silent_empty(status, body):
            return Check("degeneracy", False, f"prompt {index + 1}: silent-empty reply")
        bad = degenerate(reply_text(body))
        if bad:
            return Check("degeneracy", False, f"prompt {index + 1}: {bad}")
    if not replies:
        return Check("degeneracy", False, "no long output completed in time")
    return Check("degeneracy", True, f"{len(replies)} long outputs, no flood, repetition or low variety")


def check_cache_guard(name: str, prompt_tokens: int, hit_tokens: float) -> Check | None:
    """A failed check when the prefix cache answered a salted prompt (the needle proved nothing)."""
    if prompt_tokens and hit_tokens > CACHE_GUARD_SHARE * prompt_tokens:
        return Check(name, False, f"{int(hit_tokens)} of {prompt_tokens} prompt tokens came from the prefix "
                     "cache: the salt did not reach the engine, the recall proves nothing")
    return None


def check_limit(status: int, body: Any, tokens: int, health_after: int) -> Check:
    """One prompt near the planned max context: answered, and the engine still healthy after it."""
    if status == 0:
        return Check("limit_probe", False, f"no answer at {tokens} prompt tokens: {str(body)[:120]}")
    if status != 200:
        return Check("limit_probe", False, f"HTTP {status} at {tokens} prompt tokens: {str(body)[:160]}")
    if health_after != 200:
        return Check("limit_probe", False, f"/health HTTP {health_after} after a {tokens}-token prompt")
    if silent_empty(status, body):
        return Check("limit_probe", False, f"silent-empty reply at {tokens} prompt tokens")
    used = (body.get("usage") or {}).get("prompt_tokens") if isinstance(body, dict) else None
    return Check("limit_probe", True, f"answered at {used or tokens} prompt tokens, healthy after")


def check_vram_growth(before_mib: int | None, after_mib: int | None, maximum: int = VRAM_GROWTH_MAX_MIB,
                      name: str = "vram_growth") -> Check:
    """GPU memory in use (nvidia-smi, every GPU summed) before and after turns of traffic. It runs
    only on an engine that serves a model, whose weights and KV pool hold GPU memory: a reading that
    is missing or 0 MiB means nvidia-smi cannot see the engine, and proves nothing (a failure)."""
    if before_mib is None or after_mib is None:
        return Check(name, False, "could not measure: nvidia-smi did not report memory.used")
    if before_mib <= 0 or after_mib <= 0:
        return Check(name, False, f"could not measure: nvidia-smi reads {before_mib} -> {after_mib} MiB in use "
                     "while the engine serves a model (it does not see the engine's memory)")
    grown = after_mib - before_mib
    detail = f"{before_mib} -> {after_mib} MiB ({grown:+d} MiB)"
    if grown > maximum:
        return Check(name, False, f"{detail}, more than {maximum} MiB")
    return Check(name, True, f"{detail}, at most {maximum} MiB")


def check_retention(first: tuple[int, float], last: tuple[int, float], minimum: float = RETENTION_MIN) -> Check:
    """Tokens/s of the soak's last window against its first ((tokens, seconds) each)."""
    (t1, s1), (t2, s2) = first, last
    if s1 <= 0 or s2 <= 0 or t1 <= 0:
        return Check("throughput_retention", False, "no tokens in a soak window")
    first_rate, last_rate = t1 / s1, t2 / s2
    retention = last_rate / first_rate
    detail = f"{first_rate:.1f} -> {last_rate:.1f} tokens/s ({retention:.0%})"
    if min(s1, s2) < RETENTION_MIN_WINDOW_S:
        return Check("throughput_retention", True, detail + ": windows too short to judge", warning=True)
    if retention < minimum:
        return Check("throughput_retention", False, f"{detail}, under {minimum:.0%}")
    return Check("throughput_retention", True, detail)
