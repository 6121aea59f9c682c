"""Facts the image role reads: a local Docker image and the stamps of an unfinished build.

Every fact tolerates a rig without Docker (a fresh rig at plan time, before docker_engine ran):
it reports "absent" instead of failing the host, and the operations re-read it at execute time.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from pyinfra.api import FactBase

# Step stamps of a build in progress live here, inside the build dir (removed with it).
STAMP_DIR = ".rigfleet-steps"


class DockerImageInfo(FactBase[dict[str, Any] | None]):
    """The parts of `docker image inspect REF` rigfleet needs, or None when the image is absent.

    {"id": "sha256:...", "repo_digests": [...], "repo_tags": [...], "created": "...", "labels": {...}}
    """

    def command(self, ref: str) -> str:
        fmt = shlex.quote("{{json .}}")
        return (f"if command -v docker >/dev/null 2>&1; then "
                f"docker image inspect --format {fmt} {shlex.quote(ref)} 2>/dev/null || true; fi")

    def process(self, output: list[str]) -> dict[str, Any] | None:
        text = "".join(output).strip()
        if not text:
            return None
        try:
            raw = json.loads(text)
        except ValueError:
            return None
        if isinstance(raw, list):  # older clients print a list even with --format
            raw = raw[0] if raw else None
        if not isinstance(raw, dict):
            return None
        config = raw.get("Config") or {}
        return {
            "id": raw.get("Id"),
            "repo_digests": list(raw.get("RepoDigests") or []),
            "repo_tags": list(raw.get("RepoTags") or []),
            "created": raw.get("Created"),
            "labels": dict(config.get("Labels") or {}),
        }


class BuildStamps(FactBase[dict[str, str]]):
    """Step stamps of an unfinished build: {step: value} (an empty dict when there is none).

    A step writes its stamp only after it succeeded and verified its output, so a rerun after a
    failed build skips what is already done and verified (the fetch steps are the slow ones).
    """

    def command(self, build_dir: str) -> str:
        stamps = shlex.quote(f"{build_dir}/{STAMP_DIR}")
        return (f'for f in {stamps}/*; do [ -f "$f" ] && printf "%s %s\\n" "${{f##*/}}" "$(head -n 1 "$f")"; '
                f"done 2>/dev/null; true")

    @staticmethod
    def default() -> dict[str, str]:
        return {}

    def process(self, output: list[str]) -> dict[str, str]:
        stamps: dict[str, str] = {}
        for line in output:
            step, _, value = line.strip().partition(" ")
            if step and step != "*":
                stamps[step] = value.strip()
        return stamps
