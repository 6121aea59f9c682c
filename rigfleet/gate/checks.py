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
