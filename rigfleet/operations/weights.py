"""Operations that put a weights set on a rig once, intact, and keep it.

Layout is flat (`hf download --local-dir` style): MODEL_DIR/<subdir>/<files>. Next to it, in
MODEL_DIR/.rigfleet/, the manifest the files were verified against (<subdir>.SHA256SUMS) and the
verification stamp (<subdir>.verified: `<sha256> <size> <mtime> <name>` per file).

Rules:
- A file is verified when its sha256 matches the manifest. Downloads go to NAME.part (resumed
  with HTTP Range when interrupted) and are renamed only once verified.
- A verified file is never deleted or overwritten. A file already at the final name that does
  not match the manifest fails the rig with a clear message; the operator decides.
- A no-op run reads only the stamp and sizes/mtimes (no rehash of ~17 GB): a file is rehashed
  when its size or mtime differs from its stamp line, or it has none.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from pyinfra import host
from pyinfra.api import StringCommand, operation
from pyinfra.facts.files import File

from rigfleet.facts.weights import WeightsManifest, WeightsState, safe_name
from rigfleet.operations.shell import dq, q, script, sha256_of
from rigfleet.rigstate import LOG_DIR

Commands = Generator[Any, None, None]

STATE_DIR = ".rigfleet"
MANIFEST = "SHA256SUMS"
HUB = "https://huggingface.co"
HUB_HELPER = Path(__file__).resolve().parent / "hub_fetch.py"
HUB_HELPER_ON_RIG = "/usr/local/lib/rigfleet/hub_fetch.py"


def stamp_path(model_dir: str, subdir: str) -> str:
    return f"{model_dir}/{STATE_DIR}/{subdir}.verified"


def manifest_copy_path(model_dir: str, subdir: str) -> str:
    return f"{model_dir}/{STATE_DIR}/{subdir}.{MANIFEST}"


def weights_log(subdir: str) -> str:
    return f"{LOG_DIR}/weights-{subdir}.log"


def mirror_dir_url(url: str, subdir: str) -> str:
    """The mirror mirrors MODEL_DIR: weights_source.url is its root (<url>/<subdir>/ holds the
    files) or, when it already ends in /<subdir>, the weights dir itself."""
    base = url.rstrip("/")
    return f"{base}/" if base.rsplit("/", 1)[-1] == subdir else f"{base}/{subdir}/"


def mirror_root_url(url: str, subdir: str) -> str:
    return mirror_dir_url(url, subdir).rstrip("/").rsplit("/", 1)[0] + "/"


def is_verified(state: dict[str, Any]) -> bool:
    """Every stamped file is still there with the size and mtime it had when it was hashed."""
    stamp, on_disk = state["stamp"], state["files"]
    return bool(stamp) and all(
        name in on_disk and (entry.size, entry.mtime) == tuple(on_disk[name]) for name, entry in stamp.items()
    )


def _stamp_script(subdir: str, dest: str, model_dir: str) -> StringCommand:
    """Stamp every file of the manifest copy with its size and mtime (all were verified by the
    commands before this one; it runs only when they all succeeded)."""
    return script(
        f"weights {subdir}: write the verification stamp", weights_log(subdir),
        f"D={q(dest)}; M={q(manifest_copy_path(model_dir, subdir))}; S={q(stamp_path(model_dir, subdir))}",
        ': > "$S.tmp"',
        'while read -r sha name; do name=${name#\\*}; set -- $(stat -c "%s %Y" "$D/$name"); '
        'printf "%s %s %s %s\\n" "$sha" "$1" "$2" "$name" >> "$S.tmp"; done < "$M"',
        'mv -f "$S.tmp" "$S"',
        f'say "weights {subdir}: $(wc -l < "$S") files verified"',
    )


def _rehash(subdir: str, dest: str, name: str, sha: str, why: str) -> StringCommand:
    what = f"weights {subdir}/{name}"
    return script(
        f"{what}: rehash ({why})", weights_log(subdir),
        f"F={q(f'{dest}/{name}')}",
        f"actual={sha256_of(chr(34) + '$F' + chr(34))}",
        f'[ "$actual" = {sha} ] || fail "{dq(what)} exists but its sha256 is $actual, the manifest says {sha}; '
        'not overwriting it (move it away to fetch it again)"',
        f'note "{dq(what)}: sha256 verified"',
    )


def _fetch_listed(state: dict[str, Any], dest: str, base: str, manifest_url: str, model_dir: str,
                  subdir: str) -> Commands:
    """The files manifest_url lists, fetched from base into dest (resuming partial downloads, each
    verified before it gets its final name), then the manifest copy and the stamp."""
    log = weights_log(subdir)
    manifest = host.get_fact(WeightsManifest, url=manifest_url)
    if manifest is None or not manifest["files"]:
        yield script(f"weights {subdir}: manifest", log,
                     f"fail {q(f'weights {subdir}: cannot read the manifest {manifest_url} from the rig')}")
        return
    if manifest["bad"]:
        bad = manifest["bad"][0][:200]
        yield script(f"weights {subdir}: manifest", log,
                     f"fail {q(f'weights {subdir}: {manifest_url} has a line that is not <sha256>  <name>: {bad}')}")
        return
    wanted: dict[str, str] = manifest["files"]
    stamp, on_disk = state["stamp"], state["files"]
    total = len(wanted)
    for index, (name, sha) in enumerate(sorted(wanted.items()), start=1):
        entry, present = stamp.get(name), on_disk.get(name)
        if present is not None and entry is not None and entry.sha256 == sha \
                and (entry.size, entry.mtime) == tuple(present):
            continue  # verified earlier and untouched since
        if present is not None:
            why = "changed since it was verified" if entry else "not verified yet"
            yield _rehash(subdir, dest, name, sha, why)
            continue
        partial = on_disk.get(f"{name}.part")
        what = f"weights {subdir}/{name}"
        step = (f"{what}: resume from {partial.size} bytes ({index}/{total})" if partial
                else f"{what}: fetch ({index}/{total})")
        yield script(
            step, log,
            f"F={q(f'{dest}/{name}')}", 'mkdir -p "$(dirname "$F")"',
            f'say "[{index}/{total}] {dq(name)}"',
            f'fetch {q(base + quote(name))} "$F" {q(what)}',
            f"actual={sha256_of(chr(34) + '$F.part' + chr(34))}",
            f'if [ "$actual" != {sha} ]; then rm -f "$F.part"; fail "{dq(what)}: sha256 mismatch: expected {sha}, '
            f'got $actual (from {dq(base + name)}); the download was discarded, rerun to fetch it again"; fi',
            f'[ ! -e "$F" ] || fail {q(f"{what} appeared while downloading; not overwriting it")}',
            'mv -f "$F.part" "$F"',
            f'note "{dq(what)}: sha256 verified"',
        )
    lines = "".join(f"{sha}  {name}\n" for name, sha in sorted(wanted.items()))
    yield script(
        f"weights {subdir}: keep the manifest the files were verified against", log,
        f"M={q(manifest_copy_path(model_dir, subdir))}", 'mkdir -p "$(dirname "$M")"',
        f'printf "%s" {q(lines)} > "$M.tmp" && mv -f "$M.tmp" "$M"',
    )
    yield _stamp_script(subdir, dest, model_dir)


def _from_hub(dest: str, repo: str, revision: str, model_dir: str, subdir: str, token_error: str | None
              ) -> Commands:
    log = weights_log(subdir)
    if token_error:
        yield script(f"weights {subdir}: hub token", log, f"fail {q(token_error)}")
        return
    yield script(
        f"weights {subdir}: fetch {repo}@{revision} from the hub", log,
        f'say "{dq(f"weights {subdir}: {repo}@{revision} from the hub (progress: tail -f $LOG)", "LOG")}"',
        f"python3 {HUB_HELPER_ON_RIG} --repo {q(repo)} --revision {q(revision)} --dest {q(dest)} "
        f"--manifest {q(manifest_copy_path(model_dir, subdir))} --endpoint {q(HUB)} --token-stdin 2>>\"$LOG\" "
        f'|| {{ tail -n 5 "$LOG" >&2; fail "weights {subdir}: hub download failed (see $LOG)"; }}',
    )
    yield _stamp_script(subdir, dest, model_dir)


@dataclass(frozen=True)
class Source:
    """Where a rig's weights come from without the fleet cache: a mirror of MODEL_DIR (url), or
    else the Hugging Face hub (repo at revision; token_error: why the rig's token cannot be read).

    The hub is read by the stdlib helper (resume, progress, sha256 of LFS files against the hub's,
    git blob SHA-1 for the small ones), which must be on the rig (HUB_HELPER_ON_RIG, uploaded by
    the role); the token comes on stdin (the caller passes `_stdin`), never in argv, a file or a log."""

    mirror: str | None = None
    repo: str = ""
    revision: str = "main"
    token_error: str | None = None

    @property
    def label(self) -> str:
        return f"from {self.mirror}" if self.mirror else f"from the hub ({self.repo})"

    def commands(self, dest: str, model_dir: str, subdir: str, state: dict[str, Any]) -> Commands:
        if self.mirror:
            base = mirror_dir_url(self.mirror, subdir)
            yield from _fetch_listed(state, dest, base, base + MANIFEST, model_dir, subdir)
        else:
            yield from _from_hub(dest, self.repo, self.revision, model_dir, subdir, self.token_error)


def _unverified(dest: str, model_dir: str, subdir: str) -> dict[str, Any] | None:
    """The weights' state on the rig, or None (said as a no-op) when every file is verified."""
    state = host.get_fact(WeightsState, dest=dest, stamp=stamp_path(model_dir, subdir))
    if is_verified(state):
        host.noop(f"weights {subdir}: {len(state['stamp'])} files verified")
        return None
    return state


@operation()
def source_weights(dest: str, model_dir: str, subdir: str, source: Source) -> Commands:
    """Fetch the weights from their source into dest: a mirror's files as its SHA256SUMS lists
    them (resuming partial downloads, each verified before it gets its final name), or the hub's;
    then write the stamp."""
    state = _unverified(dest, model_dir, subdir)
    if state is not None:
        yield from source.commands(dest, model_dir, subdir, state)


@operation()
def cached_weights(dest: str, model_dir: str, subdir: str, cache_url: str | None, cache_rig: str,
                   source: Source) -> Commands:
    """The weights the fleet cache host holds, fetched from it (cache_url: its MODEL_DIR over HTTP);
    each file verified against the cache host's manifest, which it writes only once every file is
    verified there. Without that manifest (the cache host holds other weights, or its download
    failed) the rig fetches from its own source. cache_url None: this rig is the cache host."""
    if cache_url is None:
        host.noop(f"weights {subdir}: this rig serves them to the fleet ({cache_rig})")
        return
    state = _unverified(dest, model_dir, subdir)
    if state is None:
        return
    manifest_url = f"{cache_url}{STATE_DIR}/{quote(subdir)}.{MANIFEST}"
    if host.get_fact(WeightsManifest, url=manifest_url) is None:
        why = f"weights {subdir}: the fleet cache on {cache_rig} does not hold them verified; fetching from the source"
        yield script(f"weights {subdir}: not on the fleet cache", weights_log(subdir), f"say {q(why)}")
        yield from source.commands(dest, model_dir, subdir, state)
        return
    yield from _fetch_listed(state, dest, f"{cache_url}{quote(subdir)}/", manifest_url, model_dir, subdir)


@operation()
def chat_template_placed(model_dir: str, template: str, weights_dir: str, mirror_root: str | None
                         ) -> Commands:
    """Put the variant's chat template at MODEL_DIR/chat-templates/TEMPLATE.jinja (the compose mounts it).

    Rule: the mirror's chat-templates/TEMPLATE.jinja (checked against chat-templates/SHA256SUMS next
    to it when that exists), else the weights' own chat_template.jinja, else fail naming both.
    An existing template is kept as it is (operators may pin their own)."""
    dest = f"{model_dir}/chat-templates/{template}.jinja"
    if host.get_fact(File, path=dest):
        host.noop(f"chat template {template} present (an existing template is kept)")
        return
    own = f"{weights_dir}/chat_template.jinja"
    what = f"chat template {template}"
    lines = [f"T={q(dest)}", 'mkdir -p "$(dirname "$T")"', 'rm -f "$T.part" "$T.sums"']
    if mirror_root:
        src = f"{mirror_root}chat-templates/{template}.jinja"
        sums = f"{mirror_root}chat-templates/{MANIFEST}"
        lines += [
            f'if curl -fsSL --connect-timeout 20 -o "$T.part" {q(src)} 2>>"$LOG"; then',
            f'  actual={sha256_of(chr(34) + "$T.part" + chr(34))}',
            f'  if curl -fsSL --connect-timeout 20 -o "$T.sums" {q(sums)} 2>/dev/null; then',
            f"    want=$(awk -v n={q(template + '.jinja')} '$2==n || $2==\"*\"n {{print $1}}' \"$T.sums\")",
            '    rm -f "$T.sums"',
            f'    [ -n "$want" ] || {{ rm -f "$T.part"; fail {q(f"{what}: {sums} does not list {template}.jinja")}; }}',
            f'    [ "$want" = "$actual" ] || {{ rm -f "$T.part"; fail "{dq(what)}: sha256 mismatch: expected $want, '
            f'got $actual (from {dq(src)})"; }}',
            f"    origin={q(f'{src} (sha256 verified)')}",
            f"  else origin={q(f'{src} (UNVERIFIED: no {sums})')}; fi",
            f"elif [ -f {q(own)} ]; then",
            f'  rm -f "$T.part"; cp {q(own)} "$T.part"',
            f"  origin={q(f'the model own {own} ({template}.jinja is not on the mirror)')}",
            "else",
            f'  rm -f "$T.part"; fail {q(f"{what}: neither {src} nor {own} exists; place it at {dest}")}',
            "fi",
        ]
    else:
        lines += [
            f"[ -f {q(own)} ] || fail {q(f'{what}: no mirror and {own} does not exist; place it at {dest}')}",
            f"cp {q(own)} \"$T.part\"; origin={q(f'the model own {own}')}",
        ]
    lines += ['chmod 0644 "$T.part"', 'mv -f "$T.part" "$T"', f'say "{dq(what)}: from $origin"']
    yield script(f"{what} -> {dest}", f"{LOG_DIR}/weights-chat-templates.log", *lines)


__all__ = ["Source", "cached_weights", "chat_template_placed", "is_verified", "safe_name", "source_weights"]
