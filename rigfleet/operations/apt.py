"""apt operations: keyrings checked by fingerprint, installs that honour pins, holds."""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from fnmatch import fnmatchcase
from typing import Any

from pyinfra import host
from pyinfra.api import StringCommand
from pyinfra.facts.apt import noninteractive_apt
from pyinfra.facts.deb import DebPackages
from pyinfra.operations import apt

from rigfleet import render
from rigfleet.facts import cache
from rigfleet.facts.apt import AptRepositoryFiles, AptSourceEntries, DpkgInterrupted, HeldPackages, SourceEntry
from rigfleet.facts.files import ManagedFile
from rigfleet.facts.system import KernelHeaders
from rigfleet.operations.files import matches, write_file
from rigfleet.schema import AptRepo

# rigfleet moves held packages itself (a re-pin) and may go back to an older pinned version
INSTALL = "install --allow-change-held-packages --allow-downgrades"


def key_source(src: str) -> str:
    """A key location for curl: URLs as they are, an absolute path as a file:// URL on the rig."""
    return f"file://{src}" if src.startswith("/") else src


def keyring_script(src: str, dest: str, fingerprint: str) -> str:
    """Fetch a key, keep only the key with `fingerprint` (binary keyring for Signed-By), or fail."""
    q_src, q_dest, q_fpr = shlex.quote(key_source(src)), shlex.quote(dest), shlex.quote(fingerprint)
    refusal = shlex.quote(
        f"rigfleet: the key at {src} does not have fingerprint {fingerprint}; not trusting it"
    )
    return (
        'set -e; d=$(mktemp -d); trap \'gpgconf --homedir "$d" --kill all >/dev/null 2>&1; rm -rf "$d"\' '
        'EXIT; '
        f'curl -fsSL --retry 3 -o "$d/key" {q_src}; '
        f'GNUPGHOME="$d" gpg --batch --quiet --import "$d/key"; '
        f'GNUPGHOME="$d" gpg --batch --export {q_fpr} > "$d/keyring"; '
        f'if [ ! -s "$d/keyring" ]; then echo {refusal} >&2; exit 1; fi; '
        f'install -D -m 0644 "$d/keyring" {q_dest}'
    )


@cache.operation(reads=lambda keyring, source, legacy, **_: [
    cache.reading(AptRepositoryFiles, keyring=keyring, source=source, legacy=legacy or [])])
def repository(key_url: str, fingerprint: str, keyring: str, source: str, content: str,
               legacy: list[str] | None = None):
    """
    A third-party apt repository: its signing key checked by fingerprint, its deb822 source, and
    no legacy list for the same URL left behind (apt refuses two entries with different Signed-By).

    + key_url: URL (or absolute path on the rig) of the key, armored or binary
    + fingerprint: 40 hex digits; any other key there is dropped, a key without it is refused
    + keyring: binary keyring file the source names in `Signed-By:`
    + source: the deb822 .sources file
    + content: that file's content
    + legacy: other source lists for the same repository (the vendor's one-line .list)
    """
    fingerprint = fingerprint.replace(" ", "").upper()
    present = cache.fact(AptRepositoryFiles, keyring=keyring, source=source, legacy=legacy or [])
    key_ok, source_ok = present.fingerprints == [fingerprint], matches(present.source, content, "0644")
    if key_ok and source_ok and not present.legacy:
        host.noop(f"{source}: key {fingerprint}, source up to date")
        return
    if not key_ok:
        yield StringCommand(keyring_script(key_url, keyring, fingerprint))
    if present.legacy:
        yield StringCommand("rm -f", *(shlex.quote(path) for path in present.legacy))
    if not source_ok:
        yield from write_file(source, content)


def vendor_repository(*, name: str, description: str, repo: AptRepo, keyring: str, stem: str, suite: str = "/",
                      components: Iterable[str] = (), architectures: Iterable[str] = ()) -> Any:
    """The repo-setup step of the host layer's vendor repositories (CUDA, Docker CE, the toolkit):
    key checked by fingerprint into `keyring`, the deb822 source `STEM.sources` rendered from
    apt/rigfleet-repo.sources.j2, and the vendor's documented one-line `STEM.list` (same URL,
    another Signed-By) removed."""
    return repository(
        name=name,
        key_url=repo.key_url,
        fingerprint=repo.key_fingerprint,
        keyring=keyring,
        source=f"{stem}.sources",
        content=render.render(
            "apt/rigfleet-repo.sources.j2",
            description=description,
            url=repo.url,
            suite=suite,
            components=list(components),
            architectures=list(architectures),
            keyring=keyring,
        ),
        legacy=[f"{stem}.list"],
    )


def repair_script(lock_timeout_s: int) -> str:
    """`dpkg --configure -a` then `apt-get -f install`, waiting for the dpkg lock like apt does
    (dpkg itself fails at once on a held lock) up to `lock_timeout_s`."""
    return (
        f"end=$(( $(date +%s) + {int(lock_timeout_s)} )); "
        'while ! out=$(dpkg --force-confdef --force-confold --configure -a 2>&1); do '
        'if printf "%s" "$out" | grep -qi "lock" && [ "$(date +%s)" -lt "$end" ]; then sleep 2; continue; fi; '
        'printf "%s\\n" "$out" >&2; echo "rigfleet: dpkg --configure -a failed (a cut-off dpkg run left this)" >&2; '
        "exit 1; done; "
        + noninteractive_apt("install -f")
    )


@cache.operation(reads=lambda **_: [cache.reading(DpkgInterrupted)])
def dpkg_repaired(lock_timeout_s: int):
    """
    Finish what a dpkg run cut off mid-install left (a dropped SSH link, a power cut), so the
    installs after this do not stop at "dpkg was interrupted".

    + lock_timeout_s: how long to wait for the dpkg lock (the rig's apt_lock_timeout_s)
    """
    left = cache.fact(DpkgInterrupted)
    if not left:
        host.noop("dpkg: no interrupted run to finish")
        return
    yield StringCommand(repair_script(lock_timeout_s))


def _satisfied(spec: str, installed: dict[str, list[str]]) -> bool:
    """'name' is satisfied by any installed version, 'name=VERSION-GLOB' by a matching one."""
    name, _, version = spec.partition("=")
    versions = installed.get(name) or []
    if not version:
        return bool(versions)
    return any(fnmatchcase(v, version) for v in versions)


@cache.operation(reads=lambda **_: [cache.reading(DebPackages)])
def install(packages: list[str], update: bool = True, recommends: bool = True, proxy: str | None = None):
    """
    Install packages, with apt version globs as pins (`docker-ce=5:28.3.3-*`).

    Unlike apt.packages, `apt-get update` runs only when something is to be installed, so a
    converged rig reports no change. Held packages may be moved: only rigfleet calls this.

    + packages: names or name=version-glob
    + update: refresh the package lists first (when installing)
    + recommends: also install what the packages recommend (apt's default)
    + proxy: this run's http proxy ("DIRECT": none), over the apt configuration's (the fleet
      cache installs itself before the rig's apt is pointed at it)
    """
    installed = cache.fact(DebPackages)
    missing = [spec for spec in packages if not _satisfied(spec, installed)]
    if not missing:
        host.noop(f"installed: {', '.join(packages)}")
        return
    option = f" -o {shlex.quote('Acquire::http::Proxy=' + proxy)}" if proxy else ""
    if update:
        yield f"apt-get{option} update"
    flags = INSTALL if recommends else f"{INSTALL} --no-install-recommends"
    flags += option
    yield StringCommand(noninteractive_apt(flags), *(shlex.quote(spec) for spec in packages))


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatchcase(name, pattern) for pattern in patterns)


@cache.operation(reads=lambda **_: [cache.reading(DebPackages), cache.reading(HeldPackages)])
def hold(packages: list[str], patterns: list[str] | None = None, exclude: list[str] | None = None):
    """
    `apt-mark hold` packages so that no upgrade moves them behind rigfleet's back.

    + packages: names held whether or not installed yet
    + patterns: globs over installed packages (dependencies the metapackages pulled in)
    + exclude: globs never held through `patterns`
    """
    installed = cache.fact(DebPackages)
    held_now: list[str] = cache.fact(HeldPackages)
    held = set(held_now)
    wanted = set(packages)
    wanted |= {
        name for name in installed if _matches(name, patterns or ()) and not _matches(name, exclude or ())
    }
    to_hold = sorted(wanted - held)
    if not to_hold:
        host.noop(f"held: {', '.join(sorted(wanted))}")
        return
    yield StringCommand("apt-mark hold", *(shlex.quote(name) for name in to_hold))


@cache.operation(reads=lambda meta, **_: [cache.reading(KernelHeaders, meta=meta), cache.reading(DebPackages)])
def kernel_headers(meta: str):
    """
    Kernel headers for DKMS: the headers metapackage `meta` (so DKMS also builds for the next
    kernel) and, when the archive still has them, the headers of the running kernel.

    + meta: linux-headers-amd64 (Debian) or linux-headers-generic[-hwe-XX.04] (Ubuntu)
    """
    headers = cache.fact(KernelHeaders, meta=meta)
    installed = cache.fact(DebPackages)
    # headers the archive does not have (an old or a custom kernel) cannot be installed: not a change
    if installed.get(meta) and (headers.installed or headers.candidate is None):
        host.noop(
            f"{meta} is installed; headers for {headers.kernel}: {'yes' if headers.installed else 'n/a'}"
        )
        return
    yield "apt-get update"
    # decided after the update: an old running kernel's headers may have left the archive
    yield StringCommand(
        'k="linux-headers-$(uname -r)"; if apt-cache show "$k" >/dev/null 2>&1; then set -- "$k"; '
        f'else set --; fi; {noninteractive_apt(INSTALL)} {shlex.quote(meta)} "$@"'
    )


def missing_components(
    entries: list[SourceEntry], codename: str, required: list[str]
) -> list[tuple[str, str, str | None, list[str]]]:
    """(uri, suite, signed-by, components missing) for each archive suite the rig uses with `main`.

    Only suites of this release (bookworm, bookworm-updates, bookworm-security) are looked at;
    a component is there when any entry for the same URI and suite lists it.
    """
    have: dict[tuple[str, str], set[str]] = {}
    signed: dict[tuple[str, str], str | None] = {}
    for entry in entries:
        if entry.suite != codename and not entry.suite.startswith(f"{codename}-"):
            continue
        key = (entry.uri, entry.suite)
        have.setdefault(key, set()).update(entry.components)
        signed.setdefault(key, entry.signed_by)
    return [
        (uri, suite, signed[(uri, suite)], [c for c in required if c not in components])
        for (uri, suite), components in sorted(have.items())
        if "main" in components and any(c not in components for c in required)
    ]


def components_source(missing: list[tuple[str, str, str | None, list[str]]]) -> str:
    """deb822 stanzas adding only the missing components, with the entry's own Signed-By (apt
    refuses one URI and suite configured with two different keyrings)."""
    stanzas = [
        "# rigfleet: archive components the NVIDIA driver stack needs (contrib: glx-alternative-nvidia,\n"
        "# nvidia-modprobe, nvidia-support). Managed by rigfleet; the distribution's own entries stay."
    ]
    for uri, suite, signed_by, components in missing:
        lines = ["Types: deb", f"URIs: {uri}", f"Suites: {suite}", f"Components: {' '.join(components)}"]
        if signed_by:
            lines.append(f"Signed-By: {signed_by}")
        stanzas.append("\n".join(lines))
    return "\n\n".join(stanzas) + "\n"


@cache.operation(reads=lambda dest, **_: [cache.reading(AptSourceEntries, exclude=dest),
                                          cache.reading(ManagedFile, path=dest)])
def archive_components(dest: str, codename: str, components: list[str]):
    """
    Enable the archive `components` for every suite of this release the rig already uses, in a
    file of its own (`dest`); the distribution's source files are not edited.

    + dest: the .sources file rigfleet owns
    + codename: the release (bookworm, trixie)
    + components: what the host layer needs (main contrib non-free non-free-firmware)
    """
    missing = missing_components(cache.fact(AptSourceEntries, exclude=dest), codename, components)
    current = cache.fact(ManagedFile, path=dest)
    if not missing:
        if current is None:
            host.noop(f"the archive already has {', '.join(components)}")
            return
        yield StringCommand("rm -f", shlex.quote(dest))
        return
    content = components_source(missing)
    if matches(current, content, "0644"):
        host.noop(f"{dest} is up to date")
        return
    yield from write_file(dest, content)


@cache.operation(reads=lambda **_: [cache.reading(DebPackages)])
def absent(packages: list[str]):
    """
    Remove these packages where installed: pyinfra's apt.packages(present=False), whose own
    package read runs only when one of them is there.

    + packages: names
    """
    installed = cache.fact(DebPackages)
    if not any(name in installed for name in packages):
        host.noop(f"not installed: {', '.join(packages)}")
        return
    yield from apt.packages._inner(packages=packages, present=False)
