"""SIMULATED NVIDIA apt repositories for the sandbox rigs.

Builds stand-in Debian packages under the names the driver and toolkit roles install from
NVIDIA's CUDA and container-toolkit repositories, and publishes them as two signed flat apt
repositories (``deb [signed-by=KEYRING] URL /``, like NVIDIA's), so the real roles install them
with real apt inside simulated rigs. Nothing here touches a GPU: the packages ship Python and
shell stand-ins (see ``assets/nvidia/README.md``) and every one of them says SIMULATED.

Layout written under ``www`` (served by the host on http://10.231.0.1:8080/):

    nvidia/cuda/      driver packages, two 580 versions (so upgrades can be rehearsed)
    nvidia/toolkit/   container toolkit packages, all four at one version
    nvidia/*/         Packages, Packages.gz, Release, InRelease, Release.gpg, key.asc

Two repositories, not one: a role adds the CUDA and the toolkit source with different keyrings,
and apt refuses one URL configured with two Signed-By values. Each has its own sandbox key, as
the real ones do, so a role that mixes up the keyrings fails here as it would on hardware.
"""

from __future__ import annotations

import contextlib
import email.utils
import fcntl
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rigfleet_sandbox import layout
from rigfleet_sandbox.shell import apt_install

DRIVER_BRANCH = "580"
DRIVER_VERSIONS = ("580.95.05", "580.105.08")  # upstream versions; packages get a "-1" revision
TOOLKIT_VERSION = "1.18.0"
CUDA_VERSION = "13.0"  # what a 580 driver reports
REVISION = "1"
HOST_URL = layout.HOST_URL
DEFAULT_KEY_DIR = layout.CACHE_DIR / "sim-apt-key"
ASSETS = Path(__file__).resolve().parent / "assets" / "nvidia"
MAINTAINER = "rigfleet sandbox (SIMULATED packages) <sandbox@rigfleet.invalid>"
# Fixed file times make rebuilt .debs byte-identical, so rigs never see a changed package
# under an unchanged version.
SOURCE_DATE_EPOCH = 1764633600  # 2025-12-02

REPOS = {
    "cuda": ("cuda_repo", "NVIDIA CUDA (SIMULATED, rigfleet sandbox)"),
    "toolkit": ("toolkit_repo", "NVIDIA Container Toolkit (SIMULATED, rigfleet sandbox)"),
}
TOOLS = {"dpkg-deb": "dpkg", "gpg": "gnupg", "gpgv": "gpgv", "gpgconf": "gpgconf"}


@dataclass
class Package:
    name: str
    version: str
    repo: str  # key of REPOS
    summary: str
    arch: str = "amd64"
    depends: list[str] = field(default_factory=list)
    pre_depends: list[str] = field(default_factory=list)
    recommends: list[str] = field(default_factory=list)
    breaks: list[str] = field(default_factory=list)
    provides: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    replaces: list[str] = field(default_factory=list)
    files: dict[str, tuple[bytes, int]] = field(default_factory=dict)  # path -> (data, mode)
    links: dict[str, str] = field(default_factory=dict)  # path -> target
    units_enable: list[str] = field(default_factory=list)  # enabled at install, as debhelper does
    units_start: list[str] = field(default_factory=list)  # started at install when systemd runs
    units_other: list[str] = field(default_factory=list)  # shipped, left disabled
    postinst_extra: str = ""

    @property
    def filename(self) -> str:
        return f"{self.name}_{self.version}_{self.arch}.deb"


# ----------------------------------------------------------------------------------------- assets


def render_asset(relpath: str, driver_version: str = DRIVER_VERSIONS[0]) -> bytes:
    """An asset with its build-time placeholders filled in (the tests run these directly)."""
    text = (ASSETS / relpath).read_text(encoding="utf-8")
    for key, value in {
        "@DRIVER_VERSION@": driver_version,
        "@TOOLKIT_VERSION@": TOOLKIT_VERSION,
        "@CUDA_VERSION@": CUDA_VERSION,
    }.items():
        text = text.replace(key, value)
    return text.encode()


def _doc(pkg: str, what: str) -> tuple[str, tuple[bytes, int]]:
    text = (
        f"{pkg}: SIMULATED stand-in package built by the rigfleet sandbox.\n\n{what}\n\n"
        "It contains no NVIDIA software and drives no GPU. It exists so that rigfleet's real deploy\n"
        "roles can install, hold, upgrade and purge packages under NVIDIA's names inside simulated\n"
        "rigs. See sandbox/rigfleet_sandbox/assets/nvidia/README.md in the rigfleet source.\n"
    )
    return f"/usr/share/doc/{pkg}/README.simulated", (text.encode(), 0o644)


def _pin_file(pattern: str) -> bytes:
    # every versioned driver package, the Debian-shaped ones too: apt does not pick an older
    # version of a dependency by itself, so a version lock must cover all of them
    names = " ".join(
        ["nvidia-open", "nvidia-kernel-open-dkms", "nvidia-kernel-dkms", "nvidia-driver-cuda", "cuda-drivers",
         f"cuda-drivers-{DRIVER_BRANCH}", *DEBIAN_SHAPED]
    )
    return (
        "# SIMULATED (rigfleet sandbox): stand-in for NVIDIA's driver version-lock package.\n"
        f"Package: {names}\n"
        f"Pin: version {pattern}\n"
        "Pin-Priority: 1000\n"
    ).encode()


UPSTREAM_FIELDS = Path(__file__).resolve().parent / "upstream_fields.yaml"
SUITES = ("bookworm", "trixie")
RELATIONS = {
    "Depends": "depends",
    "Pre-Depends": "pre_depends",
    "Recommends": "recommends",
    "Conflicts": "conflicts",
    "Breaks": "breaks",
    "Provides": "provides",
    "Replaces": "replaces",
}
# Debian's driver stack below the metapackages: stand-ins with the real packages' relations
DEBIAN_SHAPED = {
    "firmware-nvidia-gsp": "GSP firmware for the open kernel module",
    "nvidia-alternative": "update-alternatives glue for the driver files",
    "nvidia-kernel-support": "kernel module support files (proprietary flavour)",
    "nvidia-open-kernel-support": "kernel module support files (open flavour)",
    "nvidia-modprobe": "setuid helper that loads the module and creates /dev/nvidia*",
}


# relations the stand-ins add to the real ones, and why: both module flavours ship the same
# simulated module record, so dpkg must swap them rather than refuse the file
SANDBOX_EXTRA = {
    "nvidia-kernel-open-dkms": {"conflicts", "replaces"},
    "nvidia-kernel-dkms": {"conflicts", "replaces"},
}


def upstream_fields() -> dict[str, Any]:
    with open(UPSTREAM_FIELDS, encoding="utf-8") as fh:
        return dict(yaml.safe_load(fh))


def split_relations(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def standin_fields(name: str, suite: str, upstream: str) -> dict[str, list[str]]:
    """The real Debian package's relations for `suite`, at the stand-in's driver version."""
    real = upstream_fields()["debian"][name][suite]
    real_deb = str(real["Version"])
    real_upstream = real_deb.split("-")[0]
    real_branch, branch = real_upstream.split(".")[0], upstream.split(".")[0]
    out: dict[str, list[str]] = {}
    for key, attr in RELATIONS.items():
        if key not in real:
            continue
        text = str(real[key]).replace(real_deb, f"{upstream}-{REVISION}").replace(real_upstream, upstream)
        text = re.sub(rf"\(>= {real_branch}\)", f"(>= {branch})", text)
        out[attr] = split_relations(text)
    return out


def packages(suite: str = "trixie") -> list[Package]:
    """Every stand-in package, both driver versions and the toolkit, shaped for one Debian suite."""
    if suite not in SUITES:
        raise ValueError(f"no stand-ins for suite {suite!r}; choose one of {', '.join(SUITES)}")
    pkgs: list[Package] = []
    for upstream in DRIVER_VERSIONS:
        v = f"{upstream}-{REVISION}"
        for name, what in DEBIAN_SHAPED.items():
            pkgs.append(
                Package(
                    name,
                    v,
                    "cuda",
                    f"NVIDIA driver: {what} (SIMULATED)",
                    files=dict([_doc(name, f"Empty stand-in for {what}; relations as Debian's package.")]),
                    **standin_fields(name, suite, upstream),  # type: ignore[arg-type]
                )
            )
        branch_pin = f"nvidia-driver-pinning-{DRIVER_BRANCH}"
        exact_pin = f"nvidia-driver-pinning-{upstream}"
        for name, pattern, what in (
            (branch_pin, f"{DRIVER_BRANCH}.*", f"branch {DRIVER_BRANCH}"),
            (exact_pin, f"{upstream}-*", f"exactly {upstream}"),
        ):
            pkgs.append(
                Package(
                    name,
                    v,
                    "cuda",
                    f"NVIDIA driver version lock: {what} (SIMULATED)",
                    arch="all",
                    provides=["nvidia-driver-pinning"],
                    conflicts=["nvidia-driver-pinning"],
                    files=dict(
                        [
                            (f"/etc/apt/preferences.d/{name}", (_pin_file(pattern), 0o644)),
                            _doc(name, f"Ships an apt preferences file pinning the driver to {what}."),
                        ]
                    ),
                )
            )
        for flavor, name, other in (
            ("open", "nvidia-kernel-open-dkms", "nvidia-kernel-dkms"),
            ("proprietary", "nvidia-kernel-dkms", "nvidia-kernel-open-dkms"),
        ):
            conf = f"VERSION={upstream}\nFLAVOR={flavor}\nBUILT=Tue Dec  2 00:00:00 UTC 2025\n".encode()
            real = standin_fields(name, suite, upstream)
            pkgs.append(
                Package(
                    name,
                    v,
                    "cuda",
                    f"NVIDIA kernel module, {flavor} flavour (SIMULATED)",
                    depends=real["depends"],
                    pre_depends=real["pre_depends"],
                    recommends=real.get("recommends", []),
                    provides=real["provides"],
                    # sandbox-only: both flavours ship the simulated module record (SANDBOX_EXTRA)
                    conflicts=[other],
                    replaces=[other],
                    files=dict(
                        [
                            ("/usr/lib/nvidia-sim/kernel-module.conf", (conf, 0o644)),
                            (
                                "/usr/sbin/nvidia-sim-modprobe",
                                (render_asset("bin/nvidia-sim-modprobe"), 0o755),
                            ),
                            (
                                "/usr/lib/systemd/system/nvidia-sim-module.service",
                                (render_asset("systemd/nvidia-sim-module.service"), 0o644),
                            ),
                            _doc(
                                name,
                                "The 'module' is a version record: nvidia-sim-module.service writes\n"
                                "it to /run/nvidia-sim/module-version at boot, and the postinst does\n"
                                "so when nothing is loaded yet. An upgrade leaves the old record, so\n"
                                "nvidia-smi reports a driver/library version mismatch until reboot.",
                            ),
                        ]
                    ),
                    units_enable=["nvidia-sim-module.service"],
                    # Load on a fresh install (no reboot needed); a no-op when a module is loaded.
                    postinst_extra=(
                        'if [ "$1" = configure ]; then /usr/sbin/nvidia-sim-modprobe || true; fi\n'
                    ),
                )
            )
        pkgs.append(
            Package(
                "nvidia-driver-cuda",
                v,
                "cuda",
                "NVIDIA driver CUDA integration components: nvidia-smi, nvidia-persistenced (SIMULATED)",
                depends=["python3", f"nvidia-kernel-open-dkms (= {v}) | nvidia-kernel-dkms (= {v})"],
                files=dict(
                    [
                        ("/usr/bin/nvidia-smi", (render_asset("bin/nvidia-smi", upstream), 0o755)),
                        (
                            "/usr/bin/nvidia-persistenced",
                            (render_asset("bin/nvidia-persistenced", upstream), 0o755),
                        ),
                        (
                            "/usr/lib/systemd/system/nvidia-persistenced.service",
                            (render_asset("systemd/nvidia-persistenced.service"), 0o644),
                        ),
                        _doc(
                            "nvidia-driver-cuda",
                            "nvidia-smi reports two NVIDIA GeForce RTX 3090 (24576 MiB) and keeps -pm/-pl\n"
                            "settings under /run/nvidia-sim. nvidia-persistenced.service is not enabled.",
                        ),
                    ]
                ),
                units_other=["nvidia-persistenced.service"],
            )
        )
        for name, module in (
            ("nvidia-open", "nvidia-kernel-open-dkms"),
            ("cuda-drivers", "nvidia-kernel-dkms"),
            (f"cuda-drivers-{DRIVER_BRANCH}", "nvidia-kernel-dkms"),
        ):
            pkgs.append(
                Package(
                    name,
                    v,
                    "cuda",
                    f"NVIDIA driver metapackage ({module}) (SIMULATED)",
                    depends=[f"{module} (= {v})", f"nvidia-driver-cuda (= {v})"],
                    files=dict([_doc(name, f"Metapackage: depends on {module} and nvidia-driver-cuda.")]),
                )
            )

    t = f"{TOOLKIT_VERSION}-{REVISION}"
    pkgs += [
        Package(
            "libnvidia-container1",
            t,
            "toolkit",
            "NVIDIA container runtime library (SIMULATED)",
            files=dict([_doc("libnvidia-container1", "No library: the simulated CLI needs none.")]),
        ),
        Package(
            "libnvidia-container-tools",
            t,
            "toolkit",
            "NVIDIA container runtime library, command-line tools (SIMULATED)",
            depends=["python3", f"libnvidia-container1 (>= {t})"],
            files=dict(
                [
                    ("/usr/bin/nvidia-container-cli", (render_asset("bin/nvidia-container-cli"), 0o755)),
                    _doc("libnvidia-container-tools", "nvidia-container-cli answers -V, info and list."),
                ]
            ),
        ),
        Package(
            "nvidia-container-toolkit-base",
            t,
            "toolkit",
            "NVIDIA Container Toolkit base: nvidia-ctk, nvidia-container-runtime (SIMULATED)",
            depends=["python3"],
            files=dict(
                [
                    ("/usr/bin/nvidia-ctk", (render_asset("bin/nvidia-ctk"), 0o755)),
                    (
                        "/usr/bin/nvidia-container-runtime",
                        (render_asset("bin/nvidia-container-runtime"), 0o755),
                    ),
                    ("/usr/bin/nvidia-cdi-hook", (render_asset("bin/nvidia-container-hook"), 0o755)),
                    ("/etc/nvidia-container-runtime/config.toml", (render_asset("etc/config.toml"), 0o644)),
                    (
                        "/usr/lib/systemd/system/nvidia-cdi-refresh.service",
                        (render_asset("systemd/nvidia-cdi-refresh.service"), 0o644),
                    ),
                    (
                        "/usr/lib/systemd/system/nvidia-cdi-refresh.path",
                        (render_asset("systemd/nvidia-cdi-refresh.path"), 0o644),
                    ),
                    _doc(
                        "nvidia-container-toolkit-base",
                        "nvidia-ctk edits daemon.json like the real one;\n"
                        "nvidia-container-runtime wraps runc.",
                    ),
                ]
            ),
            units_enable=["nvidia-cdi-refresh.path", "nvidia-cdi-refresh.service"],
            units_start=["nvidia-cdi-refresh.path", "nvidia-cdi-refresh.service"],
        ),
        Package(
            "nvidia-container-toolkit",
            t,
            "toolkit",
            "NVIDIA Container Toolkit: OCI prestart hook for Docker --gpus (SIMULATED)",
            depends=[
                f"nvidia-container-toolkit-base (= {t})",
                f"libnvidia-container-tools (>= {t})",
                "libnvidia-container-tools (<< 2.0.0)",
            ],
            files=dict(
                [
                    (
                        "/usr/bin/nvidia-container-runtime-hook",
                        (render_asset("bin/nvidia-container-hook"), 0o755),
                    ),
                    _doc(
                        "nvidia-container-toolkit",
                        "nvidia-container-runtime-hook copies the simulated nvidia-smi and a GPU state\n"
                        "snapshot into containers that ask for GPUs. Docker registers its nvidia device\n"
                        "driver (--gpus, compose 'driver: nvidia') only if this hook is in PATH when\n"
                        "dockerd starts: restart Docker after installing.",
                    ),
                ]
            ),
            links={"/usr/bin/nvidia-container-toolkit": "nvidia-container-runtime-hook"},
        ),
    ]
    return pkgs


# ---------------------------------------------------------------------------------- maintainer


def _maintainer_scripts(p: Package) -> dict[str, str]:
    head = "#!/bin/sh\n# SIMULATED package (rigfleet sandbox): maintainer script.\nset -e\n"
    all_units = p.units_enable + p.units_other
    scripts: dict[str, str] = {}
    post = ""
    if p.units_enable:
        # What dh_installsystemd writes: enable on first install, keep the admin's choice after.
        units = " ".join(p.units_enable)
        post += (
            'if [ "$1" = configure ] && command -v deb-systemd-helper >/dev/null; then\n'
            f"    for unit in {units}; do\n"
            '        deb-systemd-helper unmask "$unit" >/dev/null || true\n'
            '        if deb-systemd-helper --quiet was-enabled "$unit"; then\n'
            '            deb-systemd-helper enable "$unit" >/dev/null || true\n'
            "        else\n"
            '            deb-systemd-helper update-state "$unit" >/dev/null || true\n'
            "        fi\n"
            "    done\n"
            "fi\n"
        )
    if all_units:
        post += 'if [ "$1" = configure ] && [ -d /run/systemd/system ]; then\n'
        post += "    systemctl --system daemon-reload >/dev/null || true\n"
        if p.units_start:
            post += f"    deb-systemd-invoke start {' '.join(p.units_start)} >/dev/null || true\n"
        post += "fi\n"
    post += p.postinst_extra
    if post:
        scripts["postinst"] = head + post + "exit 0\n"
    if all_units:
        units = " ".join(all_units)
        scripts["prerm"] = (
            head
            + 'if [ "$1" = remove ] && [ -d /run/systemd/system ]; then\n'
            + f"    deb-systemd-invoke stop {units} >/dev/null || true\n"
            + "fi\nexit 0\n"
        )
        scripts["postrm"] = (
            head
            + 'if [ "$1" = remove ] && [ -d /run/systemd/system ]; then\n'
            + "    systemctl --system daemon-reload >/dev/null || true\n"
            + "fi\n"
            + 'if [ "$1" = purge ] && command -v deb-systemd-helper >/dev/null; then\n'
            + f"    for unit in {units}; do\n"
            + '        deb-systemd-helper purge "$unit" >/dev/null || true\n'
            + '        deb-systemd-helper unmask "$unit" >/dev/null || true\n'
            + "    done\n"
            + "fi\nexit 0\n"
        )
    return scripts


def _control(p: Package) -> str:
    size_kib = sum((len(data) + 1023) // 1024 for data, _ in p.files.values()) + len(p.links)
    lines = [
        f"Package: {p.name}",
        f"Version: {p.version}",
        f"Architecture: {p.arch}",
        f"Maintainer: {MAINTAINER}",
        f"Installed-Size: {max(size_kib, 1)}",
    ]
    for key, values in (
        ("Pre-Depends", p.pre_depends),
        ("Depends", p.depends),
        ("Recommends", p.recommends),
        ("Breaks", p.breaks),
        ("Provides", p.provides),
        ("Conflicts", p.conflicts),
        ("Replaces", p.replaces),
    ):
        if values:
            lines.append(f"{key}: {', '.join(values)}")
    lines += [
        "Section: non-free/libs" if p.repo == "cuda" else "Section: utils",
        "Priority: optional",
        "Homepage: https://github.com/rigfleet (SIMULATED stand-in)",
        f"Description: {p.summary}",
        " SIMULATED by the rigfleet sandbox: a stand-in under the real package's name, for",
        " rehearsing deploys on simulated rigs. It contains no NVIDIA software.",
    ]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------- build


def _run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[bytes]:
    res = subprocess.run(cmd, capture_output=True, check=False, **kw)  # type: ignore[call-overload]
    if res.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd)} failed ({res.returncode}): {res.stderr.decode(errors='replace')}"
        )
    return res


def ensure_host_tools() -> None:
    """Install what building and signing need on a fresh Debian host (CI starts bare)."""
    missing = sorted({pkg for tool, pkg in TOOLS.items() if shutil.which(tool) is None})
    if not missing:
        return
    apt_install(missing, recommends=False)


def _build_deb(p: Package, work: Path, out_dir: Path) -> Path:
    root = work / p.name / p.version
    (root / "DEBIAN").mkdir(parents=True)
    sums = []
    for path, (data, mode) in sorted(p.files.items()):
        dest = root / path.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
        dest.chmod(mode)
        sums.append(f"{hashlib.md5(data).hexdigest()}  {path.lstrip('/')}\n")  # noqa: S324 - dpkg's format
    for path, target in p.links.items():
        dest = root / path.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.symlink_to(target)
    meta = {"control": (_control(p), 0o644), "md5sums": ("".join(sums), 0o644)}
    conffiles = sorted(path for path in p.files if path.startswith("/etc/"))
    if conffiles:
        meta["conffiles"] = ("".join(c + "\n" for c in conffiles), 0o644)
    for name, text in _maintainer_scripts(p).items():
        meta[name] = (text, 0o755)
    for name, (text, mode) in meta.items():
        (root / "DEBIAN" / name).write_text(text, encoding="utf-8")
        (root / "DEBIAN" / name).chmod(mode)
    for dirpath, dirnames, filenames in os.walk(root):
        for entry in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
            os.utime(entry, (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH), follow_symlinks=False)
        for d in dirnames:
            os.chmod(os.path.join(dirpath, d), 0o755)
    os.chmod(root, 0o755)
    deb = out_dir / p.filename
    env = dict(os.environ, SOURCE_DATE_EPOCH=str(SOURCE_DATE_EPOCH))
    _run(["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(root), str(deb)], env=env)
    return deb


def _packages_index(entries: list[tuple[Package, Path]]) -> bytes:
    stanzas = []
    for p, deb in entries:
        data = deb.read_bytes()
        stanzas.append(
            _control(p)
            + f"Filename: ./{deb.name}\nSize: {len(data)}\n"
            + f"MD5sum: {hashlib.md5(data).hexdigest()}\n"  # noqa: S324 - apt index format
            + f"SHA1: {hashlib.sha1(data).hexdigest()}\n"  # noqa: S324 - apt index format
            + f"SHA256: {hashlib.sha256(data).hexdigest()}\n"
        )
    return "\n".join(stanzas).encode()


def _release(repo_dir: Path, label: str) -> bytes:
    files = ["Packages", "Packages.gz"]
    lines = [
        "Origin: NVIDIA",
        f"Label: {label}",
        "Architectures: amd64 all",
        f"Date: {email.utils.formatdate(usegmt=True)}",
        "Description: SIMULATED NVIDIA repository for rigfleet sandbox rigs (no real NVIDIA software)",
    ]
    for title, algo in (("MD5Sum", hashlib.md5), ("SHA1", hashlib.sha1), ("SHA256", hashlib.sha256)):
        lines.append(f"{title}:")
        for name in files:
            data = (repo_dir / name).read_bytes()
            lines.append(f" {algo(data).hexdigest()} {len(data):>8} {name}")
    return ("\n".join(lines) + "\n").encode()


def _gz(data: bytes) -> bytes:
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, filename="") as fh:
        fh.write(data)
    return buf.getvalue()


# ------------------------------------------------------------------------------------------- keys


def _gpg(home: Path, *args: str, stdin: bytes | None = None) -> bytes:
    env = dict(os.environ, GNUPGHOME=str(home), LC_ALL="C")
    return _run(["gpg", "--batch", "--no-tty", "--quiet", *args], env=env, input=stdin).stdout


def _fingerprint(home: Path) -> str | None:
    if not home.is_dir():
        return None
    out = _gpg(home, "--with-colons", "--list-secret-keys").decode()
    fprs = [line.split(":")[9] for line in out.splitlines() if line.startswith("fpr:")]
    return fprs[0] if fprs else None


def _ensure_key(home: Path, uid: str) -> str:
    fpr = _fingerprint(home)
    if fpr:
        return fpr
    home.mkdir(parents=True, exist_ok=True)
    home.chmod(0o700)
    # ed25519: fast to make, and accepted by gpgv (bookworm) and sqv (trixie's apt) alike.
    _gpg(
        home,
        "--pinentry-mode",
        "loopback",
        "--passphrase",
        "",
        "--quick-gen-key",
        uid,
        "ed25519",
        "sign",
        "never",
    )
    fpr = _fingerprint(home)
    if not fpr:
        raise RuntimeError(f"no key in {home} after generating one")
    return fpr


def _stop_agent(home: Path) -> None:
    # gpg leaves an agent per home running; the sandbox must not leave processes behind.
    env = dict(os.environ, GNUPGHOME=str(home))
    subprocess.run(["gpgconf", "--kill", "gpg-agent"], env=env, capture_output=True, check=False)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_keys(key_dir: Path = DEFAULT_KEY_DIR) -> dict[str, str]:
    """Fingerprint of each repository's sandbox signing key, generating them once."""
    ensure_host_tools()
    with _locked(key_dir / ".lock"):
        key_dir.chmod(0o700)
        fprs = {}
        for repo, (_var, label) in REPOS.items():
            home = key_dir / repo
            fprs[repo] = _ensure_key(home, f"rigfleet sandbox {repo} repository key - {label}")
            _stop_agent(home)
        return fprs


# ------------------------------------------------------------------------------------------- main


def _inputs_digest(fprs: dict[str, str], base_url: str, suite: str) -> str:
    h = hashlib.sha256()
    h.update(Path(__file__).read_bytes())
    h.update(UPSTREAM_FIELDS.read_bytes() + suite.encode())
    for path in sorted(ASSETS.rglob("*")):
        if path.is_file():
            h.update(str(path.relative_to(ASSETS)).encode() + b"\0" + path.read_bytes())
    h.update(json.dumps([fprs, base_url]).encode())
    return h.hexdigest()


def _result(fprs: dict[str, str], base_url: str) -> dict:
    group_vars = {}
    for repo, (var, _label) in REPOS.items():
        url = f"{base_url}nvidia/{repo}/"
        group_vars[var] = {"url": url, "key_url": f"{url}key.asc", "key_fingerprint": fprs[repo]}
    return {
        "group_vars": group_vars,
        "driver_branch": DRIVER_BRANCH,
        "driver_versions": [f"{v}-{REVISION}" for v in DRIVER_VERSIONS],
        "toolkit_version": f"{TOOLKIT_VERSION}-{REVISION}",
        "cuda_version": CUDA_VERSION,
        "simulated": True,
    }


def build_apt_repo(
    www: Path, *, key_dir: Path | None = None, base_url: str = HOST_URL, suite: str = "trixie"
) -> dict:
    """Build (or reuse) the SIMULATED NVIDIA repositories under ``www/nvidia/``.

    Idempotent: when the packages' inputs, keys and URL are unchanged the existing repositories
    are returned as they are. Returns the group vars the roles need (repo URL, key URL and key
    fingerprint for the CUDA and the toolkit repository) and the versions on offer.
    """
    key_dir = key_dir or Path(os.environ.get("RIGFLEET_SIM_APT_KEY_DIR", DEFAULT_KEY_DIR))
    base_url = base_url if base_url.endswith("/") else base_url + "/"
    www = Path(www)
    fprs = ensure_keys(key_dir)
    digest = _inputs_digest(fprs, base_url, suite)
    target = www / "nvidia"
    stamp = target / ".rigfleet-build.json"
    result = _result(fprs, base_url)

    with _locked(www / ".nvidia.lock"):
        expected = [target / r / f for r in REPOS for f in ("InRelease", "Release.gpg", "key.asc")]
        if (
            stamp.exists()
            and all(p.exists() for p in expected)
            and json.loads(stamp.read_text(encoding="utf-8")).get("digest") == digest
        ):
            return result
        stage = Path(tempfile.mkdtemp(prefix=".nvidia-build-", dir=www))
        try:
            _build_into(stage, key_dir, fprs, suite)
            (stage / ".rigfleet-build.json").write_text(
                json.dumps({"digest": digest, "result": result}, indent=1), encoding="utf-8"
            )
            (stage / "README.txt").write_text(
                "SIMULATED NVIDIA apt repositories for rigfleet sandbox rigs (no real NVIDIA software).\n"
                "cuda/ and toolkit/ are flat repositories: deb [signed-by=KEYRING] URL /\n",
                encoding="utf-8",
            )
            stage.chmod(0o755)
            old = None
            if target.exists():
                old = Path(tempfile.mkdtemp(prefix=".nvidia-old-", dir=www))
                target.rename(old / "nvidia")
            stage.rename(target)
            if old:
                shutil.rmtree(old, ignore_errors=True)
        finally:
            if stage.exists():
                shutil.rmtree(stage, ignore_errors=True)
    return result


def _build_into(stage: Path, key_dir: Path, fprs: dict[str, str], suite: str) -> None:
    work = stage / ".work"
    by_repo: dict[str, list[tuple[Package, Path]]] = {r: [] for r in REPOS}
    for repo in REPOS:
        (stage / repo).mkdir()
    for p in packages(suite):
        by_repo[p.repo].append((p, _build_deb(p, work, stage / p.repo)))
    shutil.rmtree(work)
    for repo, (_var, label) in REPOS.items():
        repo_dir = stage / repo
        index = _packages_index(by_repo[repo])
        (repo_dir / "Packages").write_bytes(index)
        (repo_dir / "Packages.gz").write_bytes(_gz(index))
        (repo_dir / "Release").write_bytes(_release(repo_dir, label))
        home = key_dir / repo
        fpr = fprs[repo]
        sign = [
            "--pinentry-mode",
            "loopback",
            "--passphrase",
            "",
            "--local-user",
            fpr,
            "--digest-algo",
            "SHA512",
        ]
        _gpg(home, *sign, "--clearsign", "-o", str(repo_dir / "InRelease"), str(repo_dir / "Release"))
        _gpg(
            home,
            *sign,
            "--armor",
            "--detach-sign",
            "-o",
            str(repo_dir / "Release.gpg"),
            str(repo_dir / "Release"),
        )
        (repo_dir / "key.asc").write_bytes(_gpg(home, "--armor", "--export", fpr))
        _stop_agent(home)
        for path in repo_dir.iterdir():
            path.chmod(0o644)
        repo_dir.chmod(0o755)


# ------------------------------------------------------------------------------ kernel rehearsal

KERNEL_META = "linux-image-amd64"


def kernel_meta_package(version: str) -> Package:
    """A newer Debian kernel metapackage (SIMULATED: no kernel in it), for the kernel-update
    rehearsal: what a point release or security update offers a rig while its driver is held."""
    return Package(
        KERNEL_META,
        version,
        "cuda",
        "Linux for 64-bit PCs (meta-package), newer kernel (SIMULATED)",
        files=dict([_doc(KERNEL_META, "A newer kernel metapackage offered to a rig whose driver is held;\n"
                                      "it carries no kernel (the sandbox's rigs boot the host's).")]),
    )


def republish(www: Path, extra: list[Package], *, repo: str = "cuda", key_dir: Path | None = None,
              drop: tuple[str, ...] = ()) -> None:
    """Publish `extra` packages into a built repository (its index and signatures redone from the
    .debs it then holds), or take out the files named in `drop` again."""
    key_dir = key_dir or Path(os.environ.get("RIGFLEET_SIM_APT_KEY_DIR", DEFAULT_KEY_DIR))
    repo_dir = Path(www) / "nvidia" / repo
    with _locked(Path(www) / ".nvidia.lock"):
        for name in drop:
            (repo_dir / name).unlink(missing_ok=True)
        work = Path(tempfile.mkdtemp(prefix=".republish-", dir=www))
        try:
            for p in extra:
                _build_deb(p, work, repo_dir).chmod(0o644)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        stanzas = []
        for deb in sorted(repo_dir.glob("*.deb")):
            data = deb.read_bytes()
            fields = _run(["dpkg-deb", "-f", str(deb)]).stdout.decode().rstrip("\n")
            stanzas.append(
                fields + f"\nFilename: ./{deb.name}\nSize: {len(data)}\n"
                + f"MD5sum: {hashlib.md5(data).hexdigest()}\n"  # noqa: S324 - apt index format
                + f"SHA1: {hashlib.sha1(data).hexdigest()}\n"  # noqa: S324 - apt index format
                + f"SHA256: {hashlib.sha256(data).hexdigest()}\n"
            )
        index = "\n".join(stanzas).encode()
        (repo_dir / "Packages").write_bytes(index)
        (repo_dir / "Packages.gz").write_bytes(_gz(index))
        (repo_dir / "Release").write_bytes(_release(repo_dir, REPOS[repo][1]))
        home = key_dir / repo
        fpr = ensure_keys(key_dir)[repo]
        sign = ["--pinentry-mode", "loopback", "--passphrase", "", "--local-user", fpr, "--digest-algo", "SHA512"]
        for name in ("InRelease", "Release.gpg"):
            (repo_dir / name).unlink(missing_ok=True)
        _gpg(home, *sign, "--clearsign", "-o", str(repo_dir / "InRelease"), str(repo_dir / "Release"))
        _gpg(home, *sign, "--armor", "--detach-sign", "-o", str(repo_dir / "Release.gpg"), str(repo_dir / "Release"))
        _stop_agent(home)
        for path in repo_dir.iterdir():
            path.chmod(0o644)
