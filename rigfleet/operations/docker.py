"""Docker operations: daemon.json merged (never overwritten), nvidia runtime, GPU smoke test."""

from __future__ import annotations

import json
import shlex
from typing import Any

from pyinfra import host
from pyinfra.api import StringCommand
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import FileContents

from rigfleet.facts import cache
from rigfleet.facts.docker import DAEMON_JSON, DockerDaemonConfig, DockerImagePresent
from rigfleet.facts.nvidia import CdiDevices, NvidiaSmi
from rigfleet.operations.files import write_file
from rigfleet.rigstate import SMOKE_STAMP

NVIDIA_RUNTIME_PATH = "nvidia-container-runtime"
CDI_SPEC = "/etc/cdi/nvidia.yaml"
# What a rig's own root filesystem contributes to a locally built smoke image
LOCAL_IMAGE_PATHS = ("bin", "lib", "lib64", "sbin", "usr", "etc/ld.so.conf", "etc/ld.so.conf.d")
# Trees of /usr that no program run in the smoke container needs (headers, kernel modules and
# sources, firmware, the compiler's internals, helper programs, data and docs): on a converged rig
# they are over a third of /usr, which the import would otherwise tar and store on every rig.
LOCAL_IMAGE_EXCLUDED = ("usr/share", "usr/src", "usr/include", "usr/lib/modules", "usr/lib/firmware",
                        "usr/lib/gcc", "usr/lib/debug", "usr/libexec")


def deep_merge(current: dict[str, Any], desired: dict[str, Any]) -> dict[str, Any]:
    """Desired keys win; nested objects merge key by key; keys only in `current` are kept."""
    merged = dict(current)
    for key, value in desired.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def render_daemon_json(config: dict[str, Any]) -> str:
    # the layout nvidia-ctk writes too, so the two tools never reformat each other's file
    return json.dumps(config, indent=4, sort_keys=True) + "\n"


def fail(message: str) -> StringCommand:
    """A command that fails this rig only, with `message` on stderr (OperationError stops all rigs)."""
    return StringCommand(f"echo {shlex.quote(message)} >&2; exit 1")


@cache.operation(reads=lambda path, **_: [cache.reading(DockerDaemonConfig, path=path)])
def daemon_json(settings: dict[str, Any], path: str = DAEMON_JSON):
    """
    Merge `settings` into Docker's daemon.json; keys rigfleet does not own are kept as they are.

    The merged file is validated by `dockerd --validate` where dockerd has it (Docker >= 23)
    before it replaces the old one, which is kept as daemon.json.rigfleet-prev.

    + settings: the keys rigfleet owns (nested objects merge key by key)
    + path: daemon.json location
    """
    current = cache.fact(DockerDaemonConfig, path=path)
    if current.error:
        yield fail(f"rigfleet: {path} is {current.error}; fix or remove it by hand, rigfleet will not guess")
        return
    merged = deep_merge(current.config, settings)
    if current.exists and merged == current.config:
        host.noop(f"{path} already has rigfleet's settings")
        return
    staged = f"{path}.rigfleet-new"
    yield from write_file(staged, render_daemon_json(merged))
    q_staged, q_path = shlex.quote(staged), shlex.quote(path)
    yield StringCommand(
        "if dockerd --help 2>&1 | grep -q -- --validate; then dockerd --validate --config-file "
        f"{q_staged}; fi "
        f"&& if [ -f {q_path} ]; then cp -p {q_path} {q_path}.rigfleet-prev; fi && mv -f {q_staged} {q_path}"
    )


@cache.operation(reads=lambda path, **_: [cache.reading(DockerDaemonConfig, path=path)])
def nvidia_runtime(cdi: bool = False, path: str = DAEMON_JSON):
    """
    Register the nvidia runtime with Docker through `nvidia-ctk runtime configure`, only when
    daemon.json lacks it (or lacks `features.cdi` when CDI is wanted). Restarting Docker is the
    caller's business.

    + cdi: also enable CDI device requests in Docker
    + path: daemon.json location
    """
    current = cache.fact(DockerDaemonConfig, path=path)
    if current.error:
        yield fail(f"rigfleet: {path} is {current.error}; fix or remove it by hand, rigfleet will not guess")
        return
    runtimes = current.config.get("runtimes")
    entry = runtimes.get("nvidia") if isinstance(runtimes, dict) else None
    has_runtime = isinstance(entry, dict) and str(entry.get("path", "")).endswith(NVIDIA_RUNTIME_PATH)
    features = current.config.get("features")
    has_cdi = isinstance(features, dict) and features.get("cdi") is True
    if has_runtime and (has_cdi or not cdi):
        host.noop("the nvidia runtime is registered in daemon.json")
        return
    yield "nvidia-ctk runtime configure --runtime=docker" + (" --cdi.enabled" if cdi else "")


def smoke_key(image: str) -> str:
    """What a passed smoke test vouches for: the image and the driver/toolkit/engine versions."""
    smi = cache.fact(NvidiaSmi)
    packages = cache.fact(DebPackages)

    def version(*names: str) -> str:
        for name in names:
            if packages.get(name):
                return ",".join(packages[name])
        return "-"

    return (
        f"image={image} driver={smi.driver_version or '-'} "
        f"toolkit={version('nvidia-container-toolkit')} docker={version('docker-ce', 'docker.io')}"
    )


def smoke_passed(image: str, stamp: str) -> bool:
    """The smoke test passed with this image and the rig's current driver, toolkit and Docker."""
    recorded = cache.fact(FileContents, path=stamp)
    return bool(recorded) and recorded[0].strip() == smoke_key(image)


def fleet_copy(image: str, registry: str) -> str | None:
    """The name of `image`'s copy in the fleet registry: its path and tag under `registry`, its own
    registry host left out (the reference grammar's rule: a first component with '.' or ':', or
    `localhost`, is a host). None for an image pinned by digest (a pushed copy gets a manifest of
    its own, which the digest would not match, so the copy could not be checked) and for one that
    is in the fleet registry already."""
    if "@" in image or image.startswith(f"{registry}/"):
        return None
    first, _, rest = image.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        image = rest
    return f"{registry}/{image}"


SMOKE_READS = [cache.reading(NvidiaSmi), cache.reading(DebPackages)]


@cache.operation(reads=lambda image, stamp, **_: [*SMOKE_READS, cache.reading(FileContents, path=stamp),
                                                  cache.reading(DockerImagePresent, image=image)])
def smoke_image_pulled(image: str, registry: str, stamp: str = SMOKE_STAMP):
    """
    Get the GPU smoke image through the fleet registry: its copy there when a rig put it there,
    else from its own registry, and then pushed there, so the fleet downloads it once. A failed
    push only warns (the other rigs then pull it from its own registry, as without a fleet one).

    + image: the smoke image (`smoke_image`)
    + registry: the fleet registry, HOST[:PORT]
    + stamp: the smoke test's record: no pull while it vouches for this image
    """
    copy = fleet_copy(image, registry)
    if copy is None:
        host.noop(f"{image} is not copied through the fleet registry")
        return
    if smoke_passed(image, stamp):
        host.noop(f"GPU smoke test passed before for {image}")
        return
    if cache.fact(DockerImagePresent, image=image):
        host.noop(f"image {image} is on the rig")
        return
    q_image, q_copy = shlex.quote(image), shlex.quote(copy)

    def say(text: str, err: bool = False) -> str:
        return f"echo {shlex.quote(f'rigfleet: smoke image {image}: {text}')}" + (" >&2" if err else "")

    last_line = '"$(printf \'%s\' "$out" | tail -n 1)"'
    yield StringCommand("\n".join([
        f"if out=$(docker pull {q_copy} 2>&1); then",
        f"  docker tag {q_copy} {q_image} && {say(f'from the fleet registry ({copy})')}",
        "else",
        f"  {say('no copy from the fleet registry, pulling it from its own: ')}{last_line}",
        f"  docker pull {q_image} || {{ {say(f'docker pull failed on {host.name} (above)', err=True)}; exit 1; }}",
        f"  if out=$(docker tag {q_image} {q_copy} 2>&1 && docker push {q_copy} 2>&1); then",
        f"    {say(f'pushed to the fleet registry ({copy})')}",
        f"  else {say('push to the fleet registry failed, the other rigs pull it themselves: ')}{last_line} >&2; fi",
        "fi",
    ]))


@cache.operation(reads=lambda stamp, **_: [*SMOKE_READS, cache.reading(FileContents, path=stamp)])
def gpu_smoke(image: str, expected_gpus: int, stamp: str = SMOKE_STAMP):
    """
    Run `docker run --rm --gpus all IMAGE nvidia-smi -L` and require `expected_gpus` GPUs.

    It runs again only when the image, driver, toolkit or Docker version changed since the last
    pass (recorded in `stamp`), so a converged rig reports no change.

    + image: any image; the toolkit injects nvidia-smi (a CUDA base image also checks the driver
      against the image's CUDA requirement)
    + expected_gpus: how many GPUs the container must see
    + stamp: where the last passing combination is recorded
    """
    key = smoke_key(image)
    if smoke_passed(image, stamp):
        host.noop(f"GPU smoke test passed before for {key}")
        return
    q_image, q_stamp = shlex.quote(image), shlex.quote(stamp)
    refusal = shlex.quote(
        f"rigfleet: the GPU smoke container on {host.name} did not see {expected_gpus} GPUs"
    )
    yield StringCommand(
        f"set -e; out=$(docker run --rm --gpus all {q_image} nvidia-smi -L); printf '%s\\n' \"$out\"; "
        f"n=$(printf '%s\\n' \"$out\" | grep -c '^GPU [0-9]' || true); "
        f'if [ "$n" -ne {int(expected_gpus)} ]; then echo {refusal} >&2; exit 1; fi; '
        f"mkdir -p {shlex.quote(stamp.rsplit('/', 1)[0] or '/')}; printf '%s\\n' {shlex.quote(key)} > "
        f"{q_stamp}"
    )


@cache.operation(reads=lambda tag, **_: [cache.reading(DockerImagePresent, image=tag)])
def local_image(tag: str):
    """
    Import a minimal image from the rig's own root filesystem (`smoke_image: local`), for rigs
    that cannot pull from a registry. It holds the rig's binaries and libraries, no /etc secrets.

    + tag: the image name to create
    """
    if cache.fact(DockerImagePresent, image=tag):
        host.noop(f"image {tag} exists")
        return
    paths = " ".join(LOCAL_IMAGE_PATHS)
    yield StringCommand(
        f'set --; for p in {paths}; do if [ -e "/$p" ] || [ -L "/$p" ]; then set -- "$@" "$p"; fi; done; '
        "tar -C / --one-file-system "
        + "".join(f"--exclude={tree} " for tree in LOCAL_IMAGE_EXCLUDED)
        + '-cf - "$@" | '
        f"docker import --message 'rigfleet: local smoke image from the rig root' - {shlex.quote(tag)}"
    )


@cache.operation(reads=lambda **_: [cache.reading(CdiDevices)])
def cdi_spec(path: str = CDI_SPEC):
    """
    Generate a CDI spec for the GPUs unless one already resolves `nvidia.com/gpu=all` (toolkit
    1.18+ keeps /var/run/cdi/nvidia.yaml current itself; two specs with the same devices conflict).

    + path: where to write the spec
    """
    if "nvidia.com/gpu=all" in cache.fact(CdiDevices):
        host.noop("a CDI spec provides nvidia.com/gpu=all")
        return
    yield StringCommand("nvidia-ctk cdi generate", f"--output={shlex.quote(path)}")
