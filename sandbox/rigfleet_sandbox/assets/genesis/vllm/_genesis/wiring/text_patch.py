"""Anchor -> replacement text patches on installed vllm files (SIMULATED stand-in).

Like v7's TextPatcher: a marker string makes the patch idempotent; upstream markers mean the fix
is already upstream (skip); a missing anchor is DRIFT (skip, the patch is not protecting you);
a write error (read-only file or mount) is FAILED. The file is re-read after writing to verify.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Outcome:
    status: str  # applied | idempotent | would-apply | upstream | drift | failed
    detail: str = ""


class TextPatcher:
    def __init__(
        self,
        target: Path,
        *,
        marker: str,
        anchor: str,
        replacement: str,
        upstream_markers: tuple[str, ...] = (),
    ) -> None:
        self.target = target
        self.marker = marker
        self.anchor = anchor
        self.replacement = replacement
        self.upstream_markers = upstream_markers

    def apply(self, *, dry_run: bool = False) -> Outcome:
        try:
            text = self.target.read_text(encoding="utf-8")
        except FileNotFoundError:
            return Outcome("drift", f"file_missing: {self.target}")
        except OSError as exc:
            return Outcome("failed", str(exc))
        if self.marker in text:
            return Outcome("idempotent", "marker present")
        for upstream in self.upstream_markers:
            if upstream in text:
                return Outcome("upstream", f"upstream already carries this fix ({upstream!r} found)")
        if self.anchor not in text:
            return Outcome(
                "drift", "required_anchor_missing (anchor not found; upstream or an overlay changed the file)"
            )
        if dry_run:
            return Outcome("would-apply")
        try:
            with open(self.target, "w", encoding="utf-8") as handle:
                handle.write(text.replace(self.anchor, self.replacement, 1))
        except OSError as exc:
            return Outcome("failed", str(exc))
        if self.marker not in self.target.read_text(encoding="utf-8"):
            return Outcome("failed", "marker missing after write")
        return Outcome("applied")
