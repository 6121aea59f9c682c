"""Redaction of text that leaves the operator's hands (`rigfleet report`'s triage bundle).

Three kinds, applied in this order:
1. the fleet's own secrets, as literal values resolved on the control machine (always);
2. generic secret shapes: Hub tokens, bearer tokens, `key=`/`token:` assignments, `--api-key X`,
   private key blocks (always: a value this machine could not resolve still has a shape);
3. identity: the rig's host names and addresses and home paths (unless `keep_identity`).

Literal values are replaced longest first, so a value that contains another is not left half
visible. Host names match as whole names only (a rig called `rig` leaves `rigfleet` alone).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

SECRET = "<redacted:{}>"
HOST = "<rig-host>"
ADDRESS = "<rig-ip-{}>"
HOME = "/home/<user>"

# name=value / "name": "value" where the name says secret; the value is what goes
_NAMED = re.compile(
    r"""(?ix)
    (?<![A-Za-z0-9])((?:[A-Za-z0-9_.-]*?(?<!cache_))(?:api[_-]?key|apikey|key|token|secret|passw(?:or)?d|auth)
    ["']?\s*[=:]\s*["']?)
    (?!<redacted)([^\s"',;&}\]]+)""")
PATTERNS: tuple[tuple[str, re.Pattern[str], str], ...] = (
    ("private key", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.S),
     SECRET.format("private key")),
    ("hub token", re.compile(r"\bhf_[A-Za-z0-9]{8,}"), SECRET.format("hf token")),
    ("api key", re.compile(r"\bsk-[A-Za-z0-9_-]{12,}"), SECRET.format("key")),
    ("bearer", re.compile(r"(?i)(\bbearer\s+)(?!<redacted)[A-Za-z0-9._~+/=-]+"), r"\1" + SECRET.format("token")),
    ("flag", re.compile(r"(?i)(--[a-z0-9-]*(?:key|token|secret|password)[= ]\s*)(?!<redacted)[^\s\"',]+"),
     r"\1" + SECRET.format("value")),
    ("assignment", _NAMED, r"\1" + SECRET.format("value")),
)
_HOME = re.compile(r"/(?:home|Users)/(?!<user>)[^/\s:\"',;]+")


@dataclass
class Redactor:
    secrets: dict[str, str] = field(default_factory=dict)  # literal value -> label (api_key)
    hostnames: list[str] = field(default_factory=list)
    addresses: list[str] = field(default_factory=list)
    homes: list[str] = field(default_factory=list)  # literal home directories (the control machine's)
    keep_identity: bool = False
    counts: Counter[str] = field(default_factory=Counter)  # what was replaced, by kind (no values)

    def __call__(self, text: str) -> str:
        literals = sorted(((v, k) for v, k in self.secrets.items() if v), key=lambda pair: -len(pair[0]))
        for value, label in literals:
            text = self._count(label, text.count(value), text.replace(value, SECRET.format(label)))
        for kind, pattern, replacement in PATTERNS:
            text, n = pattern.subn(replacement, text)
            self.counts[kind] += n
        if self.keep_identity:
            return text
        names = [(n, HOST) for n in self.hostnames if n] + [
            (a, ADDRESS.format(i + 1)) for i, a in enumerate(self.addresses) if a]
        for value, placeholder in sorted(names, key=lambda pair: -len(pair[0])):
            whole = re.compile(rf"(?<![A-Za-z0-9_-]){re.escape(value)}(?![A-Za-z0-9_-]|\.\d)")
            text, n = whole.subn(placeholder, text)
            self.counts["host name" if placeholder == HOST else "address"] += n
        for home in sorted((h.rstrip("/") for h in self.homes if h.rstrip("/") not in ("", "/root")), key=len,
                           reverse=True):
            text = self._count("home path", text.count(home), text.replace(home, "~"))
        text, n = _HOME.subn(HOME, text)
        self.counts["home path"] += n
        return text

    def _count(self, kind: str, n: int, text: str) -> str:
        self.counts[kind] += n
        return text
