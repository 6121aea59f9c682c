"""Tables that fit the terminal, 80 columns included: no cell wraps over more than two lines.

Each column is one of three kinds: `key` values (names, numbers) are never cut or wrapped, `fold`
values are short by construction and may wrap onto a second line, `cut` values stay on one line
and end in `…` when too long (`--json` always carries the full value). Image references are shown
by their short form.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from rich import box
from rich.table import Table

Kind = Literal["key", "fold", "cut"]
CONTENT_HASH = re.compile(r"[0-9a-f]{12,}")


def fitted(title: str, columns: Sequence[tuple[str, Kind]]) -> Table:
    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1),
                  collapse_padding=True)
    for header, kind in columns:
        if kind == "key":
            table.add_column(header, no_wrap=True)
        elif kind == "fold":
            table.add_column(header, overflow="fold", min_width=8)
        else:
            table.add_column(header, no_wrap=True, overflow="ellipsis", min_width=6, max_width=24)
    return table


def short_image(ref: str) -> str:
    """`repo:VERSION-HASH` -> `VERSION-HASH8` (a long version cut): the tag's content hash is the
    image's identity, the repository is rigfleet's own."""
    tag = ref.rsplit("/", 1)[-1].split(":", 1)[-1]
    version, sep, digest = tag.rpartition("-")
    if not sep or not CONTENT_HASH.fullmatch(digest):
        return tag if len(tag) <= 24 else tag[:23] + "…"
    if len(version) > 12:
        version = version[:11] + "…"
    return f"{version}-{digest[:8]}"


def short_digest(digest: str) -> str:
    """`sha256:<64 hex>` -> `sha256:<12 hex>`."""
    algorithm, sep, value = digest.partition(":")
    return f"{algorithm}:{value[:12]}" if sep and CONTENT_HASH.fullmatch(value) else digest
