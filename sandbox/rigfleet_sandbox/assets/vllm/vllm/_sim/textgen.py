"""Deterministic answers of the SIMULATED model (nothing is inferred; same prompt, same answer).

Healthy answers, by precedence (the question is the last user message; needles are searched in
the whole conversation):
1. needle recall. A needle is a sentence such as "The secret <noun> is <value>.",
   "The magic number is <value>.", "The needle is: <value>", "The passphrase is <value>" or
   "SECRET: <value>" (noun: word, phrase, code, number, key, password, passphrase, value, token,
   color, animal, city, name). A question mentioning secret / needle / magic / passphrase /
   password / hidden / remember is answered with every value found.
2. "capital of <country>" from a small table (France -> Paris, ...).
3. arithmetic: "What is 12 * (3 + 4)?" -> 84.
4. echo: `Reply with "X"`, `Say "X"`, `Repeat after me: X`, `Reply with only the word X` -> X.
5. long text ("essay", "story", "write ... N words", "in detail", "count to N"): deterministic prose
   (lexical variety around 0.5, no repeated lines) until max_tokens or the requested length.
6. tool calls when the request carries `tools` (see `tool_call`).
7. greeting / fallback: one or two deterministic sentences.

Token counts are approximations: prompt = ceil(chars / 4) + 4 per message; completion = words and
punctuation marks ("!" floods count one token per mark).

Garbage mode (fault `garbage-output`, or TurboQuant KV + MTP without Genesis P67) reproduces the
seed report's failure signature; see `garbage`.
"""

from __future__ import annotations

import ast
import hashlib
import json
import operator
import random
import re
from dataclasses import dataclass, field

_PIECE = re.compile(r"\s*\w+|\s*[^\w\s]")


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


_SEP = r"(?:\s*(?:is|was)\s*[:=]?|\s*[:=])\s*[\"'“]?"
_VALUE = r"([^\"'”\n.!?;]+)"
NEEDLE_PATTERNS = (
    re.compile(
        r"\b(?:secret|magic|hidden|special)\s+(?:word|phrase|code|number|key|password|passphrase|value|token|"
        r"color|colour|animal|city|name)" + _SEP + _VALUE,
        re.IGNORECASE,
    ),
    re.compile(r"\bthe\s+(?:needle|passphrase|password|secret)" + _SEP + _VALUE, re.IGNORECASE),
    re.compile(r"\bSECRET\s*[:=]\s*[\"'“]?" + _VALUE),
)
ONE_WORD = re.compile(r"\b(?:in|with)\s+(?:one|a single)\s+word\b", re.IGNORECASE)
SHORT = re.compile(
    r"\b(?:brief|briefly|short|concise|one sentence|in (?:one|two|three|\d) sentences?)\b", re.IGNORECASE
)
NEEDLE_QUESTION = re.compile(r"\b(secret|needle|magic|passphrase|password|hidden|remember)\b", re.IGNORECASE)

CAPITALS = {
    "france": "Paris",
    "germany": "Berlin",
    "italy": "Rome",
    "spain": "Madrid",
    "japan": "Tokyo",
    "china": "Beijing",
    "canada": "Ottawa",
    "australia": "Canberra",
    "brazil": "Brasília",
    "india": "New Delhi",
    "the united kingdom": "London",
    "united kingdom": "London",
    "uk": "London",
    "england": "London",
    "the united states": "Washington, D.C.",
    "united states": "Washington, D.C.",
    "usa": "Washington, D.C.",
    "portugal": "Lisbon",
    "poland": "Warsaw",
    "egypt": "Cairo",
}

NOUNS = _words(
    "river harbor lantern garden engine ledger signal orchard compass meadow archive bridge canvas "
    "cellar chapter circuit cluster column corridor crystal current dialect doorway drawer estuary "
    "fabric falcon feather festival fountain furnace galaxy gateway glacier granite harvest horizon "
    "island journal kernel kettle ladder lagoon library lighthouse machine manuscript marble market "
    "meridian mirror monument mountain needleleaf notebook ocean opera orbit palace parcel pasture "
    "pavilion pebble pendulum pigment pillar planet plateau pocket portrait prairie prism quarry "
    "railway rainfall recipe reef relay reservoir ribbon ridge rooftop sail satellite scaffold "
    "schedule scroll sculpture season shelter shoreline sketch skyline spindle spiral staircase "
    "station statue stencil summit sundial tapestry telescope terrace thicket timber tower trail "
    "tributary tunnel turbine valley vessel village vineyard voyage warehouse waterfall weather "
    "whistle window workshop yard zephyr cabinet candle carriage cathedral chimney cloister comet "
    "courtyard cradle delta dune ember fjord foundry gallery glade grove hammock hearth hinge "
    "inkwell junction keystone kiln lattice locket loom mantle mosaic nectar oasis outpost paddock "
    "panorama parchment pier porch rampart rudder saddle sapling sextant spire spring steeple "
    "tangent thimble threshold tide tinder trellis trestle tundra vault veranda wagon wharf willow"
)
ADJECTIVES = _words(
    "amber ancient brisk bronze careful cheerful coastal copper crimson curious distant dusty "
    "eager early elegant emerald faint fertile fragile gentle gilded golden graceful hollow humble "
    "icy idle ivory jagged keen lavish lively lofty lucid luminous mellow misty modest narrow "
    "nimble noble oblique opaque orderly patient pearly placid polished quiet radiant rapid rustic "
    "sable scarlet serene shallow silent silver slender smoky solemn sparse spotted steady sturdy "
    "subtle sunlit swift tawny tender thorny tidy timid tranquil twilight umber vast velvet vivid "
    "wandering weathered whispering wild winding wintry wiry wooden woven youthful zealous azure "
    "balmy brittle cobalt dappled dormant earthen feral frosty glassy hazy jovial knotted leafy "
    "mossy nocturnal ochre pastel resolute russet saffron sheltered shimmering verdant wistful"
)
VERBS = _words(
    "anchors balances borrows carries catches charts circles clears collects crosses dampens "
    "decorates delivers describes divides echoes embraces encloses faces favors follows frames "
    "gathers greets guards guides harbors hides holds illuminates inspires joins keeps lifts "
    "lines links maps marks measures mends mirrors names nourishes opens outlines paints patrols "
    "places protects quiets reaches reflects remembers repairs reveals rewards shades shapes "
    "shelters signals softens sorts spans steadies stirs supports surrounds sustains teaches tends "
    "traces tracks turns unites updates values visits warms watches weaves welcomes widens "
    "accompanies admires arranges awakens bends blesses brightens carves cherishes colors crowns "
    "cultivates drifts elevates engraves enriches fastens flanks gilds hallows heralds kindles"
)
ADVERBS = _words(
    "quietly slowly gently steadily brightly calmly boldly softly patiently warmly carefully "
    "eagerly gracefully plainly rarely seldom often briskly faintly deeply lightly firmly"
)
OPENERS = (
    "In practice,",
    "Over time,",
    "By contrast,",
    "For example,",
    "In the end,",
    "At first,",
    "Later,",
    "Meanwhile,",
    "Still,",
    "As a result,",
    "Along the way,",
    "Each morning,",
    "Under pressure,",
)
STOPWORDS = set(
    _words(
        "about above after again against also because been before being below between both could does doing "
        "during each from further have having here into itself just more most other over same should some "
        "such than that their theirs them then there these they this those through under until very what "
        "when where which while with would your write essay words story please explain detail about tell"
    )
)


def pieces(text: str) -> list[str]:
    """Completion tokens of `text`, each with its leading whitespace, so "".join() restores it."""
    return _PIECE.findall(text)


def count_prompt_tokens(messages: list[dict]) -> int:
    return sum((len(message_text(m)) + 3) // 4 + 4 for m in messages) + 2


def message_text(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def find_needles(text: str) -> list[str]:
    values: list[str] = []
    for pattern in NEEDLE_PATTERNS:
        for match in pattern.finditer(text):
            value = match.group(1).strip().strip(",")
            if value and value not in values and not value.lower().startswith(("what", "the secret")):
                values.append(value)
    return values


_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.Mod: operator.mod,
    ast.FloorDiv: operator.floordiv,
}


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        if isinstance(node.op, ast.Pow) and abs(_eval(node.right)) > 64:
            raise ValueError("exponent too large")
        return _OPS[type(node.op)](_eval(node.left), _eval(node.right))
    raise ValueError("unsupported expression")


def arithmetic(question: str) -> str | None:
    match = re.search(r"(-?\d[\d\s.+\-*/%()x×^]*\d\)?|\(\s*-?\d[\d\s.+\-*/%()x×^]*\))", question)
    if not match or not re.search(r"[+\-*/%×x^]", match.group(1).strip()[1:]):
        return None
    expr = match.group(1).replace("×", "*").replace("x", "*").replace("^", "**")
    try:
        value = _eval(ast.parse(expr, mode="eval"))
    except (ValueError, SyntaxError, ZeroDivisionError, TypeError):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{match.group(1).strip()} = {value}."


def echo(question: str) -> str | None:
    patterns = (
        r"(?:reply|respond|answer|say|output|print)\s+(?:with\s+)?(?:only\s+|exactly\s+|just\s+)?"
        r"(?:the\s+(?:single\s+)?(?:word|phrase|text|string)\s+)?[:\s]*[\"“']([^\"”']+)[\"”']",
        r"repeat after me\s*:\s*(.+)",
        r"(?:reply|respond|answer|say)\s+(?:with\s+)?(?:only\s+|exactly\s+|just\s+)?"
        r"(?:the\s+(?:single\s+)?word\s+)([A-Za-z0-9_\-]+)\s*[.!]?\s*$",
    )
    for pattern in patterns:
        match = re.search(pattern, question, re.IGNORECASE | re.DOTALL)
        if match:
            return match.group(1).strip()
    return None


def capital(question: str) -> str | None:
    match = re.search(r"capital\s+(?:city\s+)?of\s+([A-Za-z .]+?)\s*(?:\?|$|\.|,|!)", question, re.IGNORECASE)
    if not match:
        return None
    country = match.group(1).strip().lower()
    city = CAPITALS.get(country)
    if city is None:
        return None
    name = match.group(1).strip()
    return f"The capital of {name[0].upper() + name[1:]} is {city}."


def _topic_words(question: str) -> list[str]:
    words = [w.lower() for w in re.findall(r"[A-Za-z]{5,}", question) if w.lower() not in STOPWORDS]
    return list(dict.fromkeys(words))[:6] or ["system"]


def long_request(question: str) -> int | None:
    """Requested length in words for long-form prompts, 0 for 'as long as allowed', None otherwise."""
    q = question.lower()
    if SHORT.search(q):
        return None
    count = re.search(r"(\d{2,5})[\s-]*(?:words?|tokens?)", q)
    if count:
        return int(count.group(1))
    to = re.search(r"count (?:from 1 )?to (\d{1,4})", q)
    if to:
        return -int(to.group(1))
    if re.search(r"\b(essay|story|article|report|in detail|long|elaborate|chapter|narrative|explain)\b", q):
        return 0
    return None


def prose(seed_text: str, n_tokens: int) -> str:
    """Deterministic varied prose of about n_tokens tokens, seeded by the prompt."""
    rng = random.Random(hashlib.sha256(seed_text.encode()).hexdigest())
    topics = _topic_words(seed_text)
    out: list[str] = []
    used = 0
    sentence_no = 0
    while used < n_tokens:
        n1, n2, n3, n4 = rng.sample(NOUNS, 4)
        a1, a2, a3 = rng.sample(ADJECTIVES, 3)
        v1, v2 = rng.sample(VERBS, 2)
        adv = rng.choice(ADVERBS)
        topic = topics[sentence_no % len(topics)]
        number = rng.randint(12, 9876)
        template = sentence_no % 5
        if template == 0:
            sentence = f"{rng.choice(OPENERS)} the {a1} {n1} {v1} {number} {a2} {n2}s near the {n3}."
        elif template == 1:
            sentence = f"Each {n1} {v1} a {a1} {n2}, and the {topic} {v2} the {a2} {n3} {adv}."
        elif template == 2:
            sentence = f"When the {n1} {v1} the {n2}, {number} {a1} {n3}s follow the {a3} {n4} {adv}."
        elif template == 3:
            sentence = f"Note {number}: {topic} {v1} its {a1} {n1} while a {a2} {n2} {v2} the {n3}."
        else:
            sentence = f"{a1.capitalize()} {n1}s and {a2} {n2}s {v1} every {n3} beside the {a3} {n4}."
        sentence_no += 1
        if sentence_no % 5 == 0:
            sentence += "\n\n"
        out.append(sentence if not out or out[-1].endswith("\n\n") else " " + sentence)
        used += len(pieces(sentence))
    return "".join(out).strip()


def counting(n: int) -> str:
    return ", ".join(str(i) for i in range(1, n + 1)) + "."


def fallback(question: str) -> str:
    q = question.strip().lower()
    if re.fullmatch(r"(hi|hello|hey|good (morning|evening|afternoon))[!. ]*", q):
        return "Hello! How can I help you today?"
    topics = _topic_words(question)
    return (
        f"Here is a short answer about {' '.join(topics[:3])}: it depends on the details, but the usual "
        "approach is to start small, measure, and adjust."
    )


@dataclass
class Reply:
    content: str | None
    finish_reason: str = "stop"
    reasoning: str | None = None
    tool_calls: list[dict] = field(default_factory=list)
    completion_tokens: int = 0
    kind: str = "healthy"  # healthy | empty | flood | repetition | truncated-flood


def _limit(text: str, max_tokens: int) -> tuple[str, int, bool]:
    toks = pieces(text)
    if len(toks) > max_tokens:
        return "".join(toks[:max_tokens]), max_tokens, True
    return text, len(toks), False


def _tool_args(schema: dict, question: str) -> dict:
    props = (schema or {}).get("properties") or {}
    required = (schema or {}).get("required") or list(props)
    place = re.search(r"\b(?:in|for|at)\s+([A-Z][\w\-]+(?:\s+[A-Z][\w\-]+)?)", question)
    args: dict = {}
    for name in required:
        spec = props.get(name, {})
        kind = spec.get("type", "string")
        if spec.get("enum"):
            args[name] = spec["enum"][0]
        elif kind in ("number", "integer"):
            args[name] = 1
        elif kind == "boolean":
            args[name] = True
        elif kind == "array":
            args[name] = []
        elif kind == "object":
            args[name] = {}
        else:
            args[name] = place.group(1) if place else (_topic_words(question)[0])
    return args


def tool_call(tools: list[dict], tool_choice: object, question: str) -> dict | None:
    """Pick a tool for `required` / a named function, or for `auto` when the prompt names it."""
    functions = [t.get("function", {}) for t in tools if isinstance(t, dict)]
    if not functions or tool_choice == "none":
        return None
    chosen = None
    if isinstance(tool_choice, dict):
        wanted = (tool_choice.get("function") or {}).get("name")
        chosen = next((f for f in functions if f.get("name") == wanted), None)
    elif tool_choice == "required":
        chosen = functions[0]
    else:
        q = question.lower()
        for f in functions:
            words = [w for w in re.split(r"[_\W]+", f.get("name", "").lower()) if len(w) >= 4]
            if any(w in q for w in words):
                chosen = f
                break
    if chosen is None:
        return None
    digest = hashlib.sha256((question + chosen.get("name", "")).encode()).hexdigest()[:24]
    return {
        "id": f"chatcmpl-tool-{digest}",
        "type": "function",
        "function": {
            "name": chosen.get("name", ""),
            "arguments": json.dumps(_tool_args(chosen.get("parameters"), question)),
        },
    }


def healthy(
    messages: list[dict],
    *,
    max_tokens: int,
    tools: list[dict] | None = None,
    tool_choice: object = "auto",
    thinking: bool = False,
    reasoning_parser: str | None = None,
) -> Reply:
    users = [m for m in messages if m.get("role") == "user"]
    question = message_text(users[-1]) if users else ""
    everything = "\n".join(message_text(m) for m in messages)
    if messages and messages[-1].get("role") == "tool":
        text = f"Based on the tool result: {message_text(messages[-1])[:200]}"
    else:
        if tools:
            call = tool_call(tools, tool_choice, question)
            if call is not None:
                return Reply(
                    None,
                    "tool_calls",
                    tool_calls=[call],
                    completion_tokens=12 + len(call["function"]["arguments"]) // 4,
                )
        text = ""
        needles = find_needles(everything) if NEEDLE_QUESTION.search(question) else []
        if NEEDLE_QUESTION.search(question) and needles:
            text = "The secret is " + "; ".join(needles) + "."
        elif NEEDLE_QUESTION.search(question) and re.search(
            r"\b(what|which|tell|recall|find)\b", question, re.I
        ):
            text = "I could not find a secret in the provided text."
        text = text or capital(question) or arithmetic(question) or echo(question) or ""
        if text and ONE_WORD.search(question):
            # "Answer in one word": the last word of the sentence (e.g. "Paris").
            text = re.findall(r"[\w.,'’-]+", text.rstrip(". "))[-1].rstrip(".,")
        if not text:
            wanted = long_request(question)
            if wanted is not None and wanted < 0:
                text = counting(-wanted)
            elif wanted is not None:
                # ~1.15 tokens per word once punctuation is counted
                text = prose(question, int(wanted * 1.15) if wanted > 0 else max_tokens)
            else:
                text = fallback(question)
    reasoning = None
    if thinking:
        reasoning = f"The user asks: {question[:80].strip()!r}. I will answer directly and briefly."
        if not reasoning_parser:
            text = f"<think>\n{reasoning}\n</think>\n\n{text}"
            reasoning = None
    budget = max_tokens - (len(pieces(reasoning)) if reasoning else 0)
    content, used, cut = _limit(text, max(budget, 0))
    total = used + (len(pieces(reasoning)) if reasoning else 0)
    return Reply(content, "length" if cut else "stop", reasoning=reasoning, completion_tokens=total)


def garbage(messages: list[dict], *, max_tokens: int, prompt_tokens: int, healthy_reply: Reply) -> Reply:
    """The seed's TQ3+MTP failure signature, deterministic per request.

    * short single-turn prompts (<= 64 prompt tokens, < 3 messages) with short outputs are right,
      so a basic one-completion gate passes;
    * one in three of the other requests is a silent empty reply (HTTP 200, 0 completion tokens);
    * prompts over 4,000 tokens (needle haystacks) collapse at once: `!` flood or first-word
      repetition, so needles are missed;
    * long outputs (max_tokens > 256 or a long-form request) start sane, then after 24 tokens turn
      into a `!` flood or repeat their first word.
    """
    users = [m for m in messages if m.get("role") == "user"]
    question = message_text(users[-1]) if users else ""
    key = f"{question}|{len(messages)}|{prompt_tokens}"
    h = int(hashlib.sha256(key.encode()).hexdigest(), 16)
    healthy_text = healthy_reply.content or ""
    first = (pieces(healthy_text) or pieces(question) or ["The"])[0].strip() or "The"
    if (len(messages) >= 3 or prompt_tokens > 64) and h % 3 == 0:
        return Reply("", "stop", completion_tokens=0, kind="empty")
    budget = max(1, max_tokens)
    if prompt_tokens > 4000:
        if h % 2:
            return Reply((" ".join([first] * budget)), "length", completion_tokens=budget, kind="repetition")
        return Reply("!" * budget, "length", completion_tokens=budget, kind="flood")
    long_form = max_tokens > 256 or long_request(question) is not None
    if long_form and healthy_reply.completion_tokens > 24:
        head = "".join(pieces(healthy_text)[:24])
        rest = budget - 24
        tail = ("!" * rest) if h % 2 else (" " + " ".join([first] * rest))
        return Reply(
            head + tail, "length", completion_tokens=budget, kind="truncated-flood" if h % 2 else "repetition"
        )
    return healthy_reply
