"""Shell snippets the image and weights operations share.

Each step is one `sh` script: a comment naming the step (shows in `pyinfra -vv`), strict mode, a
log on the rig, and `fail` that prints one clear line on stderr (pyinfra shows it and fails only
that rig: a failing command, never an exception, so other rigs carry on).
"""

from __future__ import annotations

import shlex

from pyinfra.api import StringCommand

q = shlex.quote


def script(step: str, log: str, *lines: str) -> StringCommand:
    """One step as a POSIX sh script with `note`, `say`, `fail` (and `fetch` when it downloads)."""
    preamble = [
        "# rigfleet: " + step.replace("\n", " "),
        "set -eu",
        f"LOG={q(log)}",
        'mkdir -p "$(dirname "$LOG")"',
        'note() { printf "%s %s\\n" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*" >> "$LOG"; }',
        'say() { printf "rigfleet: %s\\n" "$*"; note "$*"; }',
        'fail() { printf "rigfleet: %s\\n" "$*" >&2; note "FAILED: $*"; exit 1; }',
    ]
    if any(line.lstrip().startswith("fetch ") for line in lines):
        preamble.append(FETCH_FN)
    return StringCommand("\n".join([*preamble, *lines]))


# fetch URL DEST WHAT: download into DEST.part, resuming a partial one (HTTP Range); when the
# server cannot resume (curl 33, or an error with a partial present), start over once. The
# progress bar goes to the log (`tail -f` it to watch a long download).
FETCH_FN = r"""fetch() {
  _url=$1; _part=$2.part; _what=$3; _rc=0; _had=0
  if [ -s "$_part" ]; then _had=1; say "$_what: resuming from $(stat -c %s "$_part") bytes"; fi
  curl -fL --retry 3 --retry-delay 2 --connect-timeout 20 -C - --progress-bar -o "$_part" "$_url" 2>>"$LOG" || _rc=$?
  if [ "$_rc" -ne 0 ] && [ "$_had" -eq 1 ]; then
    say "$_what: cannot resume (curl exit $_rc); starting over"
    rm -f "$_part"; _rc=0
    curl -fL --retry 3 --retry-delay 2 --connect-timeout 20 --progress-bar -o "$_part" "$_url" 2>>"$LOG" || _rc=$?
  fi
  if [ "$_rc" -eq 23 ]; then  # curl could not write: the disk (or the build dir's file system) is full
    fail "$_what: no space left to write $_part ($(df -h --output=avail,target "$(dirname "$_part")" | tail -n 1 \
| tr -s ' ' | sed 's/^ //; s/ / free on /')); nothing was stopped: a running release keeps serving"
  fi
  [ "$_rc" -eq 0 ] || fail "$_what: download of $_url failed (curl exit $_rc; see $LOG)"
}"""


def dq(text: str, *expand: str) -> str:
    """`text` for inside a double-quoted shell string: nothing in it expands (pin set values and a
    mirror's file names are data, not shell) except the variables named in `expand` ($actual)."""
    out = text.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`").replace("$", "\\$")
    for name in expand:
        out = out.replace(f"\\${name}", f"${name}").replace(f"\\${{{name}", f"${{{name}")
    return out


def sha256_of(path_expr: str) -> str:
    """Shell expression printing the sha256 of a file (path_expr is already shell-quoted)."""
    return f'$(sha256sum {path_expr} | cut -d " " -f 1)'
