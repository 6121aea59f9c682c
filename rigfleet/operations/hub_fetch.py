#!/usr/bin/env python3
"""Runs ON THE RIG (uploaded by rigfleet.operations.weights.source_weights): fetch one Hugging Face
model repo into a flat dir, resumable and verified, with the Python standard library only.

- The token is read from stdin (`--token-stdin`): never in argv, the environment or a file.
- Every file goes to NAME.part (resumed with HTTP Range) and gets its final name only after it
  matched the hub: sha256 for LFS files, the git blob SHA-1 for small ones.
- A file already at its final name is checked, never replaced: a mismatch is an error.
- Writes the sha256 manifest (`<sha256>  <name>`) the rig's verification stamp is built from.
- Progress goes to stderr (the caller appends it to the weights log).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path, PurePosixPath
from typing import Any

CHUNK = 1 << 20


def log(message: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {message}", file=sys.stderr, flush=True)


def request(url: str, token: str, headers: dict[str, str] | None = None) -> Any:
    req = urllib.request.Request(url, headers={"User-Agent": "rigfleet-hub-fetch", **(headers or {})})
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    return urllib.request.urlopen(req, timeout=60)  # noqa: S310 - https endpoint from our own config


def list_files(endpoint: str, repo: str, revision: str, token: str) -> list[dict[str, Any]]:
    """The repo tree at `revision`, following the API's Link: rel="next" pages."""
    quoted_rev = urllib.parse.quote(revision, safe="")
    url: str | None = f"{endpoint}/api/models/{repo}/tree/{quoted_rev}?recursive=true"
    entries: list[dict[str, Any]] = []
    while url:
        with request(url, token) as resp:
            entries += json.load(resp)
            url = None
            for part in (resp.headers.get("Link") or "").split(","):
                if 'rel="next"' in part:
                    url = part.split(";")[0].strip().strip("<>")
    return [e for e in entries if e.get("type") == "file"]


def safe(name: str) -> bool:
    path = PurePosixPath(name)
    return bool(name) and not path.is_absolute() and ".." not in path.parts


def digest(path: Path, entry: dict[str, Any]) -> tuple[str, str, str]:
    """(algorithm, expected, actual) for a file on disk, plus its sha256 in `sha256_of`."""
    sha256 = hashlib.sha256()
    sha1 = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())  # noqa: S324 - git's object id
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            sha256.update(chunk)
            sha1.update(chunk)
    sha256_of[str(path)] = sha256.hexdigest()
    lfs = entry.get("lfs")
    if lfs:
        return "sha256", lfs["oid"], sha256.hexdigest()
    return "git-sha1", entry["oid"], sha1.hexdigest()


sha256_of: dict[str, str] = {}


def download(url: str, part: Path, size: int, token: str, name: str) -> None:
    have = part.stat().st_size if part.exists() else 0
    if have > size:
        part.unlink()
        have = 0
    if have:
        log(f"{name}: resuming from {have} bytes")
    headers = {"Range": f"bytes={have}-"} if have else {}
    with request(url, token, headers) as resp:
        if have and resp.status != 206:  # no range support: start over
            log(f"{name}: the server cannot resume; starting over")
            have = 0
        mode = "ab" if have else "wb"
        done, last = have, 0.0
        with part.open(mode) as out:
            while chunk := resp.read(CHUNK):
                out.write(chunk)
                done += len(chunk)
                if time.monotonic() - last > 5:
                    last = time.monotonic()
                    pct = 100.0 * done / size if size else 100.0
                    log(f"{name}: {done}/{size} bytes ({pct:.1f}%)")
    log(f"{name}: {done} bytes downloaded")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repo", required=True)
    parser.add_argument("--revision", default="main")
    parser.add_argument("--dest", required=True, type=Path)
    parser.add_argument("--manifest", required=True, type=Path)
    parser.add_argument("--endpoint", default="https://huggingface.co")
    parser.add_argument("--token-stdin", action="store_true")
    args = parser.parse_args()
    token = sys.stdin.readline().strip() if args.token_stdin else ""
    endpoint = args.endpoint.rstrip("/")
    try:
        entries = list_files(endpoint, args.repo, args.revision, token)
    except urllib.error.HTTPError as exc:
        hint = " (gated or private: check hf_token)" if exc.code in (401, 403) else ""
        print(f"rigfleet: cannot list {args.repo}@{args.revision}: HTTP {exc.code}{hint}", file=sys.stderr)
        return 1
    args.dest.mkdir(parents=True, exist_ok=True)
    manifest: list[str] = []
    for index, entry in enumerate(sorted(entries, key=lambda e: e["path"]), start=1):
        name = entry["path"]
        if not safe(name):
            print(f"rigfleet: refusing repo path {name!r}", file=sys.stderr)
            return 1
        final = args.dest / name
        size = int((entry.get("lfs") or {}).get("size") or entry.get("size") or 0)
        if final.exists():
            algo, want, got = digest(final, entry)
            if want != got:
                print(f"rigfleet: {final} exists but its {algo} is {got}, the hub says {want}; not overwriting it",
                      file=sys.stderr)
                return 1
            log(f"[{index}/{len(entries)}] {name}: present and verified")
        else:
            final.parent.mkdir(parents=True, exist_ok=True)
            part = final.with_name(final.name + ".part")
            log(f"[{index}/{len(entries)}] {name} ({size} bytes)")
            url = f"{endpoint}/{args.repo}/resolve/{urllib.parse.quote(args.revision, safe='')}/" \
                  f"{urllib.parse.quote(name)}"
            download(url, part, size, token, name)
            algo, want, got = digest(part, entry)
            if want != got:
                part.unlink()
                print(f"rigfleet: {name}: {algo} mismatch: expected {want}, got {got}; download discarded",
                      file=sys.stderr)
                return 1
            os.replace(part, final)
            sha256_of[str(final)] = sha256_of.pop(str(part))
        manifest.append(f"{sha256_of[str(final)]}  {name}\n")
    args.manifest.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.manifest.with_name(args.manifest.name + ".tmp")
    tmp.write_text("".join(manifest), encoding="utf-8")
    os.replace(tmp, args.manifest)
    log(f"{args.repo}@{args.revision}: {len(manifest)} files verified")
    return 0


if __name__ == "__main__":
    sys.exit(main())
