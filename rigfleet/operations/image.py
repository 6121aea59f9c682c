"""Operations that build the patched vLLM image on a rig, one verified step at a time.

Every operation first asks whether the content-tagged image already exists and is a no-op when
it does (facts are re-read at execute time, so a tag that appears mid-run, e.g. pulled from the
fleet registry, skips the remaining steps). Inputs are verified as they land in the build dir:
overlays by sha256, Genesis by full commit SHA (git) or sha256 (tarball), the base image by its
digest after `docker load`. A failed check is a failing command with one clear line: that rig
fails, the others carry on, and nothing was stopped (serving runs after this role).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Generator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pyinfra import host
from pyinfra.api import FileUploadCommand, StringCommand, operation
from pyinfra.facts.files import Sha256File

from rigfleet import catalog
from rigfleet.facts.image import STAMP_DIR, BuildStamps, DockerImageInfo
from rigfleet.operations.files import write_file
from rigfleet.operations.shell import dq, q, script, sha256_of
from rigfleet.rigstate import BUILD_ROOT, BUILDS_LEDGER, LOG_DIR
from rigfleet.schema import GenesisPin, ImageRef, OverlayFile

# what an operation generator yields (pyinfra types @operation() functions as Generators)
Commands = Generator[Any, None, None]

# One JSON line per image built on this rig: the fleet layer counts builds from it.
TARBALL = re.compile(r"\.(tar|tar\.gz|tgz|tar\.xz|txz|tar\.bz2|tar\.zst)$")


def _safe(tag: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", tag)


def build_dir(tag: str) -> str:
    return f"{BUILD_ROOT}/{_safe(tag)}"


def build_log(tag: str) -> str:
    return f"{LOG_DIR}/image-build-{_safe(tag)}.log"


def is_local(source: str) -> bool:
    """A path or file:// URL names a file on the control machine (uploaded to the rig)."""
    return source.startswith("/") or source.startswith("file://")


def local_path(source: str) -> Path:
    return Path(source.removeprefix("file://"))


def is_tarball(source: str) -> bool:
    return bool(TARBALL.search(source.split("?", 1)[0]))


def _image_exists(tag: str) -> bool:
    return host.get_fact(DockerImageInfo, ref=tag) is not None


def base_matches(info: dict[str, Any] | None, digest: str | None) -> bool:
    """A local image is the pinned base when its ID or one of its repo digests is the pin's digest."""
    if info is None:
        return False
    if digest is None:
        return True
    return info.get("id") == digest or any(d.endswith(f"@{digest}") for d in info.get("repo_digests", []))


def _stamp(build: str, step: str, value: str) -> str:
    return f"mkdir -p {q(f'{build}/{STAMP_DIR}')} && printf '%s\\n' {q(value)} > {q(f'{build}/{STAMP_DIR}/{step}')}"


@operation()
def pulled_from_registry(tag: str, registry: str) -> Commands:
    """Take the image from the fleet registry when another rig built it already (a pin is built
    once per fleet); a miss is not an error, the build steps that follow make it here."""
    if _image_exists(tag):
        host.noop(f"image {tag} exists")
        return
    remote = f"{registry}/{tag}"
    yield script(
        f"image {tag}: try the fleet registry", build_log(tag),
        f"if out=$(docker pull {q(remote)} 2>&1); then",
        '  printf \'%s\\n\' "$out" >>"$LOG"',
        f"  docker tag {q(remote)} {q(tag)}",
        f"  say {q(f'image {tag}: pulled from the fleet registry {registry}')}",
        "else",
        '  printf \'%s\\n\' "$out" >>"$LOG"',
        # a miss is normal (the first rig of a pin builds); anything else is an outage: warn, build here
        '  case "$out" in *"manifest unknown"*|*"not found"*)',
        f"    say {q(f'image {tag}: not in the fleet registry {registry}; building it here')};;",
        f"  *) echo {q(f'rigfleet: warning: fleet registry {registry} unavailable; building {tag} here: ')}"
        '"$(printf \'%s\' "$out" | tail -n 1)" >&2;;',
        "  esac",
        "fi",
    )


@operation()
def overlay_fetched(tag: str, overlay: str, file: OverlayFile) -> Commands:
    """Fetch one overlay file into the build dir and check its sha256 before anything else."""
    if _image_exists(tag):
        host.noop(f"image {tag} exists")
        return
    dest = f"{build_dir(tag)}/overlays/{file.target}"
    if file.sha256 and host.get_fact(Sha256File, path=dest) == file.sha256:
        host.noop(f"overlay {overlay}: {file.target} already fetched and verified")
        return
    what = f"overlay {overlay} file {file.target}"
    lines = [f'DEST={q(dest)}', 'mkdir -p "$(dirname "$DEST")"']
    if is_local(file.source):
        src = local_path(file.source)
        if not src.is_file():
            yield script(f"image {tag}: {what}", build_log(tag),
                         f"fail {q(f'{what}: {src} not found on the control machine')}")
            return
        yield StringCommand(f"mkdir -p {q(str(Path(dest).parent))}")
        yield FileUploadCommand(str(src), f"{dest}.part")
    else:
        lines += ['rm -f "$DEST.part"', f"fetch {q(file.source)} \"$DEST\" {q(what)}"]
    lines.append(f'actual={sha256_of(chr(34) + "$DEST.part" + chr(34))}')
    if file.sha256:
        mismatch = (f"{what}: sha256 mismatch: expected {file.sha256}, got $actual (from {file.source}); "
                    "refusing to build; nothing was stopped")
        lines += [
            f'if [ "$actual" != {q(file.sha256)} ]; then rm -f "$DEST.part"; fail "{dq(mismatch, "actual")}"; fi',
            f'note "{dq(what)}: sha256 $actual verified"',
        ]
    else:
        # the guard already warned: the pin set carries no hash for this file
        lines.append(f'say "{dq(what)}: UNVERIFIED (no sha256 in the pin set), got sha256 $actual"')
    lines.append('mv -f "$DEST.part" "$DEST"')
    yield script(f"image {tag}: {what}", build_log(tag), *lines)


@operation()
def genesis_fetched(tag: str, genesis: GenesisPin) -> Commands:
    """Genesis at the pinned full SHA into build/genesis (no .git): a git clone checked out
    detached and verified with rev-parse, or a tarball verified by sha256 (and by the commit id
    `git archive` embeds, when present)."""
    if _image_exists(tag):
        host.noop(f"image {tag} exists")
        return
    build = build_dir(tag)
    if host.get_fact(BuildStamps, build_dir=build).get("genesis") == genesis.commit:
        host.noop(f"Genesis {genesis.commit[:12]} already in the build dir")
        return
    sha, src = genesis.commit, genesis.source
    kind = catalog.patch_tree_kinds()[genesis.kind]
    package = kind["package"].rstrip("/")  # the kind's package dir: its presence proves the layout
    top = package.split("/")[0]
    common = [f"G={q(build + '/genesis')}", 'rm -rf "$G" "$G.tmp"']
    tail = [
        f'[ -d "$G.tmp/{package}" ] || fail '
        + q(f"Genesis from {src} at {sha} has no {package} (not a {kind['title']} tree)"),
        'mv "$G.tmp" "$G"',
        _stamp(build, "genesis", sha),
        f"say {q(f'Genesis {sha} from {src} verified')}",
    ]
    if not is_tarball(src):
        if is_local(src) and local_path(src).is_file():
            # a git bundle on the control machine (an air-gapped mirror): the rig clones it locally
            bundle = f"{build}/genesis.bundle"
            yield StringCommand(f"mkdir -p {q(build)}")
            yield FileUploadCommand(str(local_path(src)), bundle)
        else:
            bundle = src
        yield script(
            f"image {tag}: Genesis {sha[:12]} (git)", build_log(tag), *common,
            f"note {q(f'genesis: clone {src}')}",
            f'git clone --quiet --no-checkout -- {q(bundle)} "$G.tmp" >>"$LOG" 2>&1 '
            f'|| fail {q(f"Genesis: cannot clone {src}")}',
            f'git -C "$G.tmp" -c advice.detachedHead=false checkout --quiet --detach {sha} >>"$LOG" 2>&1 '
            f'|| fail {q(f"Genesis: commit {sha} is not in {src}")}',
            'head=$(git -C "$G.tmp" rev-parse HEAD)',
            f'[ "$head" = {sha} ] || fail "Genesis: HEAD is $head after checkout, the pin set says {sha}"',
            'rm -rf "$G.tmp/.git"',
            *tail,
        )
        return
    ext = TARBALL.search(src.split("?", 1)[0])
    tarball = f"{build}/genesis{ext.group(0) if ext else '.tar'}"
    if genesis.sha256 is None:
        yield script(f"image {tag}: Genesis tarball", build_log(tag),
                     f"fail {q(f'Genesis tarball {src} has no sha256 in the pin set; add genesis.sha256')}")
        return
    if is_local(src):
        path = local_path(src)
        if not path.is_file():
            yield script(f"image {tag}: Genesis tarball", build_log(tag),
                         f"fail {q(f'Genesis tarball {path} not found on the control machine')}")
            return
        yield StringCommand(f"mkdir -p {q(build)}")
        yield FileUploadCommand(str(path), f"{tarball}.part")
        fetch = []
    else:
        fetch = [f'rm -f {q(tarball + ".part")}', f"fetch {q(src)} {q(tarball)} 'Genesis tarball'"]
    yield script(
        f"image {tag}: Genesis {sha[:12]} (tarball)", build_log(tag), *common, *fetch,
        f"T={q(tarball + '.part')}",
        f'actual={sha256_of(chr(34) + "$T" + chr(34))}',
        f'[ "$actual" = {genesis.sha256} ] || {{ rm -f "$T"; fail "Genesis tarball {dq(src)}: sha256 mismatch: '
        f'expected {genesis.sha256}, got $actual; refusing to build"; }}',
        # git archive writes the commit id into the tar header: when it is there it must match
        'case "$T" in *gz*) cat_=zcat;; *xz*) cat_=xzcat;; *bz2*) cat_=bzcat;; *zst*) cat_=zstdcat;; '
        '*) cat_=cat;; esac',
        'embedded=$($cat_ "$T" 2>/dev/null | git get-tar-commit-id 2>/dev/null || true)',
        f'[ -z "$embedded" ] || [ "$embedded" = {sha} ] || fail "Genesis tarball {dq(src)} was made from commit '
        f'$embedded, the pin set says {sha}"',
        'mkdir -p "$G.tmp" && tar -xf "$T" -C "$G.tmp"',
        # a single top-level directory (GitHub's repo-<sha>/) is the tree itself
        'set -- "$G.tmp"/*',
        f'if [ "$#" -eq 1 ] && [ -d "$1" ] && [ ! -d "$G.tmp/{top}" ]; then mv "$1" "$G.inner" && rmdir "$G.tmp" '
        '&& mv "$G.inner" "$G.tmp"; fi',
        'rm -f "$T"',
        *tail,
    )


@operation()
def base_image_present(tag: str, base: ImageRef, registry: str | None = None) -> Commands:
    """The pinned base image, checked against its digest: loaded from an archive (the image ID or
    a repo digest must equal base.digest after `docker load`) or pulled by digest: from the fleet
    registry's copy (REGISTRY/REPOSITORY@DIGEST) first when there is one, else from upstream. A
    tag that vanished upstream (or moved) changes nothing: the pull is by digest, never by the tag."""
    if _image_exists(tag):
        host.noop(f"image {tag} exists")
        return
    if base_matches(host.get_fact(DockerImageInfo, ref=base.ref), base.digest) and base.digest:
        host.noop(f"base image {base.ref} present at {base.digest}")
        return
    log = build_log(tag)
    digest = base.digest or ""
    verify = [
        f"id=$(docker image inspect --format '{{{{.Id}}}}' {q(base.ref)} 2>/dev/null || true)",
        f"digests=$(docker image inspect --format '{{{{range .RepoDigests}}}}{{{{.}}}} {{{{end}}}}' {q(base.ref)} "
        "2>/dev/null || true)",
        f'[ -n "$id" ] || fail {q(f"base image: {base.ref} is not on the rig after loading/pulling it")}',
    ]
    if digest:
        verify += [
            f'case " $id $digests " in *" {digest} "*|*"@{digest} "*) ;; *)',
            f"  docker image rm {q(base.ref)} >/dev/null 2>&1 || true",
            f'  fail "base image: {dq(base.ref)} is $id (repo digests: ${{digests:-none}}), the pin set says {digest}; '
            'refusing to build on it";;',
            "esac",
            f'say "base image: {dq(base.ref)} verified ($id)"',
        ]
    else:
        verify.append(f'say "base image: {dq(base.ref)} is $id (UNVERIFIED: no digest in the pin set)"')
    if base.archive:
        archive = f"{build_dir(tag)}/base-image.tar"
        if is_local(base.archive):
            path = local_path(base.archive)
            if not path.is_file():
                yield script(f"image {tag}: base image", log,
                             f"fail {q(f'base image archive {path} not found on the control machine')}")
                return
            yield StringCommand(f"mkdir -p {q(build_dir(tag))}")
            yield FileUploadCommand(str(path), f"{archive}.part")
            fetch = []
        else:
            fetch = [f"fetch {q(base.archive)} {q(archive)} 'base image archive'"]
        yield script(
            f"image {tag}: base image {base.ref} (archive)", log,
            f'mkdir -p {q(build_dir(tag))}', *fetch,
            f"say {q(f'base image: docker load {base.archive}')}",
            f'docker load -i {q(archive + ".part")} >>"$LOG" 2>&1 || {{ rm -f {q(archive + ".part")}; '
            f'fail {q(f"base image: docker load of {base.archive} failed (see {log})")}; }}',
            f"rm -f {q(archive + '.part')}",
            *verify,
        )
        return
    ref = f"{base.ref}@{digest}" if digest else base.ref
    if digest and registry:
        mirrored = f"{registry}/{base.repository}@{digest}"
        nowhere = (f"base image: {base.repository}@{digest} is in neither the fleet registry {registry} nor "
                   f"upstream ({ref}; see {log}); the pin is never replaced by what the tag {base.tag} means now: "
                   f"push that digest to {registry}/{base.repository} or give the pin set an archive")
        pull = [
            f"if docker pull {q(mirrored)} >>\"$LOG\" 2>&1; then",
            f"  say {q(f'base image: {mirrored} from the fleet registry')}; docker tag {q(mirrored)} {q(base.ref)}",
            f"else say {q(f'base image: not available from the fleet registry {registry}; docker pull {ref}')}",
            f'  docker pull {q(ref)} >>"$LOG" 2>&1 || fail {q(nowhere)}',
            f"  docker tag {q(ref)} {q(base.ref)}",
            "fi",
        ]
    else:
        pull = [
            f"say {q(f'base image: docker pull {ref}')}",
            f'docker pull {q(ref)} >>"$LOG" 2>&1 || fail {q(f"base image: docker pull {ref} failed (see {log})")}',
            *([f"docker tag {q(ref)} {q(base.ref)}"] if digest else []),
        ]
    yield script(f"image {tag}: base image {ref} (pull)", log, *pull, *verify)


def deps_hash(deps: dict[str, str], index_url: str | None) -> str:
    return hashlib.sha256(json.dumps([sorted(deps.items()), index_url]).encode()).hexdigest()[:16]


@operation()
def wheels_fetched(tag: str, from_ref: str, deps: dict[str, str], index_url: str | None = None
                   ) -> Commands:
    """Download the pinned Python deps as wheels into build/wheels with the base image's own pip
    (its Python and platform tags are the ones that must match), so the image installs them with
    --no-index and a container boot needs no network."""
    if not deps:
        host.noop("no python deps to bake")
        return
    if _image_exists(tag):
        host.noop(f"image {tag} exists")
        return
    build = build_dir(tag)
    wanted = deps_hash(deps, index_url)
    if host.get_fact(BuildStamps, build_dir=build).get("wheels") == wanted:
        host.noop("wheels already downloaded")
        return
    pins = " ".join(q(f"{name}=={version}") for name, version in sorted(deps.items()))
    index = f" --index-url {q(index_url)}" if index_url else ""
    if index_url and index_url.startswith("http://") and urlsplit(index_url).hostname:
        # pip ignores a plain-HTTP index unless its host is trusted ("from versions: none"); the
        # pin set's author chose http:// for an internal mirror, so it is trusted for this download
        index += f" --trusted-host {q(str(urlsplit(index_url).hostname))}"
    yield script(
        f"image {tag}: python deps as wheels", build_log(tag),
        f'W={q(build + "/wheels")}', 'rm -rf "$W" && mkdir -p "$W"',
        f"say {q('python deps: pip download ' + ' '.join(f'{n}=={v}' for n, v in sorted(deps.items())))}",
        f'docker run --rm --entrypoint python3 -v "$W:/wheels" {q(from_ref)} -m pip download --no-cache-dir '
        f'--only-binary=:all: --dest /wheels{index} {pins} >>"$LOG" 2>&1 '
        f'|| fail "python deps: pip download failed (see $LOG)"',
        _stamp(build, "wheels", wanted),
    )


@operation()
def context_files(tag: str, rendered: dict[str, str]) -> Commands:
    """The rendered Dockerfile and entrypoint, and the directories the Dockerfile COPYs."""
    if _image_exists(tag):
        host.noop(f"image {tag} exists")
        return
    build = build_dir(tag)
    yield StringCommand(f"mkdir -p {q(build + '/overlays')} {q(build + '/genesis')}")
    for name, text in sorted(rendered.items()):
        mode = "0755" if name.endswith(".sh") else "0644"
        yield from write_file(f"{build}/{name}", text, mode)


@operation()
def image_built(tag: str, labels: dict[str, str], registry: str | None = None, base: ImageRef | None = None
                ) -> Commands:
    """`docker build -t TAG` of the verified build dir; one ledger line per build; the build dir
    is removed after a successful build (a failed one keeps it, with its verified steps, for the
    rerun). Pushes to the fleet registry when there is one (a failed push only warns). The
    Dockerfile builds FROM the base's local tag: with `base`, that tag is checked against the pin's
    digest first, so a tag that went missing or moved fails here and is never pulled."""
    if _image_exists(tag):
        host.noop(f"image {tag} exists")
        return
    build, log = build_dir(tag), build_log(tag)
    base_check = []
    if base is not None and base.digest:
        base_check = [
            f"id=$(docker image inspect --format '{{{{.Id}}}}' {q(base.ref)} 2>/dev/null || true)",
            f"digests=$(docker image inspect --format '{{{{range .RepoDigests}}}}{{{{.}}}} {{{{end}}}}' "
            f"{q(base.ref)} 2>/dev/null || true)",
            f'case " $id $digests " in *" {base.digest} "*|*"@{base.digest} "*) ;; *)',
            f'  fail "image {dq(tag)}: the base {dq(base.ref)} on the rig is ${{id:-missing}}, the pin set says '
            f'{base.digest}; not building on it (the next converge fetches it again)";;',
            "esac",
        ]
    label_args = " ".join(f"--label {q(f'{k}={v}')}" for k, v in sorted(labels.items()))
    push = []
    if registry:
        remote = f"{registry}/{tag}"
        push = [
            f"if docker tag {q(tag)} {q(remote)} && docker push {q(remote)} >>\"$LOG\" 2>&1; then",
            f"  say {q(f'image {tag}: pushed to the fleet registry {registry}')}",
            f"else echo {q(f'rigfleet: warning: push of {remote} failed (see {log}); other rigs will build it')}"
            " >&2; fi",
        ]
    yield script(
        f"image {tag}: docker build", log,
        *base_check,
        'started=$(date -u +%Y-%m-%dT%H:%M:%SZ); t0=$(date +%s)',
        f"say {q(f'image {tag}: docker build (log: {log})')}",
        f'docker build --pull=false -t {q(tag)} --label "io.rigfleet.built-at=$started" '
        f'--label "io.rigfleet.built-on=$(hostname)" {label_args} {q(build)} >>"$LOG" 2>&1 || {{ '
        f'tail -n 30 "$LOG" >&2; if grep -qi "no space left on device" "$LOG"; then '
        f'fail {q(f"image {tag}: docker build failed: no space left on device (full log {log}); ")}'
        f'"nothing was stopped: a running release keeps serving"; fi; '
        f'fail {q(f"image {tag}: docker build failed (last lines above; full log {log})")}; }}',
        "id=$(docker image inspect --format '{{.Id}}' " + q(tag) + ")",
        f"mkdir -p {q(str(Path(BUILDS_LEDGER).parent))}",
        "printf '{\"tag\":\"%s\",\"id\":\"%s\",\"started\":\"%s\",\"finished\":\"%s\",\"seconds\":%s}\\n' "
        f'{q(tag)} "$id" "$started" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(( $(date +%s) - t0 ))" >> {q(BUILDS_LEDGER)}',
        f"rm -rf {q(build)}",
        f'say "image {dq(tag)}: built ($id)"',
        *push,
    )
