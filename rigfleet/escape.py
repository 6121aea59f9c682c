"""One escaping helper per output language; every template value passes through one of them.

Validation (rigfleet.schema) refuses bad values early with a clear message; these helpers are
the second line: whatever reaches a template comes out as exactly one literal token of the file
it lands in (never a new line, key, instruction or command), or the render refuses it.
tests/unit/test_escape.py checks every template interpolates only through FILTERS.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

import yaml


class UnsafeValue(ValueError):
    """A value that has no safe spelling in the target language (the render refuses it)."""


def _scalar_text(value: Any) -> str:
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    raise UnsafeValue(f"expected a string or number, got {type(value).__name__}")


def yaml_value(value: Any) -> str:
    """A YAML flow value from the YAML emitter: strings double-quoted on one line (newlines and
    control characters escaped), numbers and booleans plain, lists as flow sequences."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    if isinstance(value, str):
        return _yaml_string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(yaml_value(item) for item in value) + "]"
    raise UnsafeValue(f"no YAML spelling for a {type(value).__name__}")


# PyYAML's pure-Python emitter and loader cost ~0.1 ms a value; a compose file has ~140 of them,
# most the same on every rig, and the monitor's Prometheus config renders every rig's compose for
# its release id: remembered, a 16-rig fleet's no-op stops paying ~10 ms per rig there.
@lru_cache(maxsize=8192)
def _yaml_string(value: str) -> str:
    return yaml.safe_dump(value, default_style='"', width=float("inf"), allow_unicode=False).rstrip("\n")


@lru_cache(maxsize=8192)
def _reads_back_as_itself(text: str) -> bool:
    return bool(yaml.safe_load(text) == text)


def compose_value(value: Any) -> str:
    """A YAML value for a compose file: `$` doubled, so Compose interpolates nothing."""
    if isinstance(value, str):
        return yaml_value(value.replace("$", "$$"))
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(compose_value(item) for item in value) + "]"
    return yaml_value(value)


def compose_key(value: Any) -> str:
    """A mapping key for a compose file: plain when YAML reads it back as the same string."""
    text = _scalar_text(value)
    if re.match(r"^[A-Za-z_][A-Za-z0-9_.-]*$", text) and _reads_back_as_itself(text):
        return text
    return compose_value(text)


def shell_word(value: Any) -> str:
    """One POSIX shell word."""
    return shlex.quote(_scalar_text(value))


def dockerfile_exec(argv: Sequence[Any]) -> str:
    """Exec form of RUN/ENTRYPOINT/CMD: a JSON array, no shell, no variable substitution."""
    if isinstance(argv, (str, bytes)) or not argv:
        raise UnsafeValue("an exec form needs a non-empty list of arguments")
    return json.dumps([_scalar_text(arg) for arg in argv], ensure_ascii=True)


def dockerfile_quoted(value: Any) -> str:
    """A double-quoted Dockerfile word (LABEL values): `"`, `\\` and `$` backslash-escaped,
    newlines and control characters spelled as JSON escapes (one physical line)."""
    text = json.dumps(_scalar_text(value), ensure_ascii=True)
    return text.replace("$", "\\$")


# The distribution reference grammar (github.com/distribution/reference, reference.go):
# [domain[:port]/]path-component(/path-component)*[:tag][@algorithm:hex].
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?"
_NAME = rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
IMAGE_NAME = re.compile(rf"^{_NAME}$")
IMAGE_TAG = re.compile(rf"^{_TAG}$")
IMAGE_REFERENCE = re.compile(rf"^{_NAME}(?::{_TAG})?(?:@{_DIGEST})?$")


def image_reference(value: Any) -> str:
    """An image reference for FROM or `image:`; the grammar admits no quote, space or `$`."""
    text = _scalar_text(value)
    if len(text) > 255 or not IMAGE_REFERENCE.match(text):
        raise UnsafeValue(f"{text[:80]!r} is not an image reference")
    return text


_APT_UNSAFE = re.compile(r'["\\\x00-\x1f\x7f]')
_APT_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def aptconf_string(value: Any) -> str:
    """A quoted apt.conf value. apt.conf(5) has no escape inside quotes: a value holding `"`, a
    backslash or a control character cannot be written safely and is refused."""
    text = _scalar_text(value)
    if _APT_UNSAFE.search(text):
        raise UnsafeValue(f"{text[:80]!r} cannot be quoted for apt.conf")
    return f'"{text}"'


def aptconf_key(value: Any) -> str:
    """One element of an apt.conf option name (e.g. the host in Acquire::http::Proxy::HOST)."""
    text = _scalar_text(value)
    if not _APT_KEY.match(text):
        raise UnsafeValue(f"{text[:80]!r} cannot be part of an apt.conf option name")
    return text


_DEB822_WORD = re.compile(r"^[\x21-\x7e]+$")


def deb822_word(value: Any) -> str:
    """One word of a deb822 field (a URI, a suite, a path): printable, no space, no newline."""
    text = _scalar_text(value)
    if not _DEB822_WORD.match(text):
        raise UnsafeValue(f"{text[:80]!r} is not one deb822 word")
    return text


def deb822_words(values: Sequence[Any]) -> str:
    return " ".join(deb822_word(v) for v in values)


def number(value: Any) -> str:
    """An integer for unit files and the like."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise UnsafeValue(f"expected an integer, got {value!r:.80}")
    return str(value)


IPTABLES_WORD = re.compile(r"^[A-Za-z0-9][A-Za-z0-9./:_-]{0,63}$")


def iptables_word(value: Any) -> str:
    """One word of an iptables-restore rule line (an address, a CIDR, a port): no spaces, quotes
    or option dashes, so a value can never add an option, a rule or a table."""
    text = _scalar_text(value)
    if not IPTABLES_WORD.match(text):
        raise UnsafeValue(f"not a plain iptables word: {text!r:.80}")
    return text


HAPROXY_WORD = re.compile(r"^[A-Za-z0-9/][A-Za-z0-9./:_@\[\]-]{0,255}$")


def haproxy_word(value: Any) -> str:
    """One word of an HAProxy configuration line (a proxy or server name, an address, a model
    name): no spaces, quotes, '#' or backslashes, so a value can never add an argument or a line."""
    text = _scalar_text(value)
    if not HAPROXY_WORD.match(text):
        raise UnsafeValue(f"not a plain HAProxy word: {text!r:.80}")
    return text


def comment(value: Any) -> str:
    """Text inside a `#`/`//` comment line: one printable ASCII line (escapes for the rest)."""
    return json.dumps(str(value), ensure_ascii=True)[1:-1]


FILTERS: dict[str, Callable[..., str]] = {
    "yaml": yaml_value,
    "compose": compose_value,
    "compose_key": compose_key,
    "sh": shell_word,
    "dockerfile_exec": dockerfile_exec,
    "dockerfile_quoted": dockerfile_quoted,
    "image_ref": image_reference,
    "aptconf": aptconf_string,
    "aptconf_key": aptconf_key,
    "deb822": deb822_word,
    "deb822_words": deb822_words,
    "number": number,
    "iptables": iptables_word,
    "comment": comment,
    "haproxy": haproxy_word,
}
