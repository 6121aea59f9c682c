"""Render the files a rig receives: compose file, image Dockerfile and entrypoint, host units.

Templates resolve from the package's templates/ directory (never the CWD) with StrictUndefined,
so a missing value is an error at render time, not an empty string on a rig.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass
from ipaddress import ip_address
from typing import Any
from urllib.parse import urlsplit

import jinja2

from rigfleet import catalog, planner
from rigfleet.escape import FILTERS
from rigfleet.rigstate import CHAT_TEMPLATES_DIR
from rigfleet.schema import PinSet, Rig, Variant

CONTAINER_MODEL_ROOT = "/root/.cache/huggingface"
CONTAINER_PORT = 8000
ENV_FILE = "rigfleet.env"
BUILD_SCRIPT = "/tmp/rigfleet/rigfleet-build.sh"  # where the Dockerfile COPYs rigfleet-build.sh
IMAGE_REPOSITORY = "rigfleet/vllm"
# Secrets travel only in the 0600 env file, under the names vLLM and the hub client read.
SECRET_ENV = {"hf_token": "HUGGING_FACE_HUB_TOKEN", "api_key": "VLLM_API_KEY"}


@functools.cache  # one per process: jinja caches each compiled template in it (a converge renders ~30)
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("rigfleet", "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,  # noqa: S701 - YAML, shell and unit files, never HTML
    )
    # Only the escaping helpers: jinja's own filters (tojson, string, join) stay available inside
    # expressions, but tests/unit/test_escape.py requires each output to end in one of these.
    env.filters.update(FILTERS)
    return env


def render(template: str, **context: Any) -> str:
    return environment().get_template(template).render(**context)


# --- the patched image ---------------------------------------------------------------------------


def wheel_deps(pinset: PinSet) -> dict[str, str]:
    """What the build downloads as wheels: the pin set's python_deps and its tree kind's build
    requirements (installed only to build the tree, never as the image's own packages)."""
    kind = catalog.patch_tree_kinds()[pinset.genesis.kind] if pinset.genesis else {}
    return dict(kind.get("build_requires", {})) | dict(pinset.python_deps)


def image_context(pinset: PinSet) -> dict[str, Any]:
    base = pinset.base_image
    pinned = f"{base.ref}@{base.digest}" if base.digest else base.ref
    return {
        "pinset": pinset,
        # the patch-tree kind's build/boot data (catalog/patch_trees.yaml); None without a tree
        "tree": catalog.patch_tree_kinds()[pinset.genesis.kind] if pinset.genesis else None,
        "base_ref": pinned,
        # built FROM the local tag, whatever route the base took: `docker load` keeps no repo
        # digest, and a base pulled from the fleet registry is known locally only as
        # <registry>/<repository>@<digest>, so `FROM <repository>:<tag>@<digest>` would resolve
        # upstream (a vanished tag fails the build). The build step checks the local tag against
        # the pin's digest right before `docker build --pull=false`; a missing or moved tag fails it.
        "from_ref": base.ref,
        "python_deps": sorted(pinset.python_deps.items()),
        "wheels": sorted(wheel_deps(pinset).items()),
        "build_argv": ["/bin/sh", BUILD_SCRIPT, pinset.vllm_version,
                       *(f"{name}=={version}" for name, version in sorted(pinset.python_deps.items()))],
        "overlay_summary": ",".join(
            f"{o.name}:{f.target}@{f.sha256 or 'unverified'}" for o in pinset.overlays for f in o.files
        ),
    }


def image_files(pinset: PinSet) -> dict[str, str]:
    ctx = image_context(pinset)
    return {
        "Dockerfile": render("image/Dockerfile.j2", **ctx),
        "entrypoint.sh": render("image/entrypoint.sh.j2", **ctx),
        "rigfleet-build.sh": render("image/rigfleet-build.sh.j2", **ctx),
    }


def _tree_inputs(pinset: PinSet) -> dict[str, Any] | None:
    if pinset.genesis is None:
        return None
    tree = pinset.genesis.model_dump()
    if tree["kind"] == "genesis-v7":
        del tree["kind"]  # the default layout: images built before kinds existed keep their tag
    return tree


def image_tag(pinset: PinSet) -> str:
    """A content hash of every input of the image build: same inputs, same tag, on every rig."""
    inputs = {
        "files": image_files(pinset),
        "base_image": pinset.base_image.model_dump(),
        "vllm_version": pinset.vllm_version,
        "genesis": _tree_inputs(pinset),
        "overlays": [o.model_dump() for o in pinset.overlays],
        "python_deps": pinset.python_deps,
        "pip_index_url": pinset.pip_index_url,
    }
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]
    version = re.sub(r"[^A-Za-z0-9_.-]", "_", pinset.vllm_version)[:80]
    return f"{IMAGE_REPOSITORY}:{version}-{digest}"


# --- the serving release -------------------------------------------------------------------------


def nvlink_env(env: dict[str, str]) -> dict[str, str]:
    """NVLink rigs: NCCL over NVLink, and no expandable segments (club-3090's detect_nvlink.sh
    does the same; its composes warn that expandable segments can crash boot over NVLink)."""
    out = {k: val for k, val in env.items() if k != "NCCL_P2P_DISABLE"}
    out["NCCL_P2P_LEVEL"] = "NVL"
    alloc = [part for part in env.get("PYTORCH_CUDA_ALLOC_CONF", "").split(",") if part]
    alloc = [part for part in alloc if not part.startswith("expandable_segments")]
    if alloc:
        out["PYTORCH_CUDA_ALLOC_CONF"] = ",".join(alloc)
    else:
        out.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    return out


@dataclass(frozen=True)
class Release:
    rig: Rig
    pinset: PinSet
    variant: Variant

    @property
    def port(self) -> int:
        return self.rig.port or self.variant.port

    @property
    def drafter_on(self) -> bool:
        """MTP variants run their drafter unless the operator turned drafters off (mtp_drafter: off,
        e.g. fleet-wide in group_vars/all.yml as the vllm#50021 mitigation)."""
        return bool(self.variant.mtp_tokens) and self.rig.mtp_drafter == "on"

    @property
    def image(self) -> str:
        return image_tag(self.pinset)

    def serve_args(self) -> list[str]:
        v, rig = self.variant, self.rig
        model = catalog.models()[v.model]["weights"][v.weights]["subdir"]
        args = [
            "--model", f"{CONTAINER_MODEL_ROOT}/{model}",
            "--served-model-name", *v.served_model_names,
            "--quantization", v.quantization,
            "--dtype", v.dtype,
            "--tensor-parallel-size", str(planner.tensor_parallel(rig, v)),
            "--pipeline-parallel-size", str(planner.pipeline_parallel(rig, v)),
            "--max-model-len", str(v.max_model_len),
            "--max-num-seqs", str(v.max_num_seqs),
            "--max-num-batched-tokens", str(v.max_num_batched_tokens),
            "--gpu-memory-utilization", str(v.gpu_memory_utilization),
            "--kv-cache-dtype", v.kv_cache_dtype,
        ]
        if v.long_prefill_token_threshold:
            args += ["--long-prefill-token-threshold", str(v.long_prefill_token_threshold)]
        if self.drafter_on:
            spec = {"method": "mtp", "num_speculative_tokens": v.mtp_tokens}
            args += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
        if v.trust_remote_code:
            args.append("--trust-remote-code")
        if v.chat_template:
            args += ["--chat-template", chat_template_path(v)]
        args += ["--reasoning-parser", v.reasoning_parser]
        args += ["--default-chat-template-kwargs", json.dumps(v.default_chat_template_kwargs, separators=(",", ":"))]
        if v.enable_auto_tool_choice:
            args += ["--enable-auto-tool-choice", "--tool-call-parser", v.tool_call_parser]
        if v.enable_prefix_caching:
            args.append("--enable-prefix-caching")
        if v.enable_chunked_prefill:
            args.append("--enable-chunked-prefill")
        args += ["--override-generation-config", json.dumps(v.sampling, separators=(",", ":"))]
        if v.custom_all_reduce == "disabled" or not rig.nvlink:
            args.append("--disable-custom-all-reduce")
        args += ["--host", "0.0.0.0", "--port", str(CONTAINER_PORT)]
        return args

    def environment(self) -> dict[str, str]:
        """Non-secret container environment; secrets go to the env file only."""
        v = self.variant
        env = dict(v.env)
        env["NVIDIA_VISIBLE_DEVICES"] = "all"
        if v.genesis is not None:
            env |= v.genesis.env(v.max_num_batched_tokens)
        if self.rig.nvlink:
            env = nvlink_env(env)
        env |= self.rig.engine_env
        env["RIGFLEET_NEEDS_GENESIS"] = "1" if v.needs_genesis else "0"
        return dict(sorted(env.items()))

    def flagset_hash(self) -> str:
        genesis = {k: val for k, val in self.environment().items() if k.startswith("GENESIS_")}
        return hashlib.sha256(json.dumps(genesis, sort_keys=True).encode()).hexdigest()[:16]

    def release_id(self) -> str:
        """Content id of the release: same inputs, same id (a no-op deploy changes nothing)."""
        files = self.files(secrets=None)
        digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:12]
        return f"{self.variant.name}-{digest}"

    def cache_key(self) -> str:
        """Compile and Triton caches are only valid for one image (vLLM, patch tree, overlays):
        keyed by the image's content tag, so a re-pin never reuses a stale compiled graph."""
        return self.image.split(":", 1)[1]

    def cache_mounts(self) -> dict[str, str]:
        """Container env var of each engine cache -> its host dir, under the image's cache key."""
        cache_dir = f"{self.rig.cache_dir}/compile/{self.cache_key()}"
        return {"VLLM_CACHE_ROOT": f"{cache_dir}/vllm", "TRITON_CACHE_DIR": f"{cache_dir}/triton"}

    def compose(self, release_id: str) -> str:
        v, rig = self.variant, self.rig
        return render(
            "compose.yaml.j2",
            variant=v,
            rig=rig,
            pinset=self.pinset,
            image=self.image,
            release_id=release_id,
            port=self.port,
            container_port=CONTAINER_PORT,
            args=self.serve_args(),
            env=self.environment(),
            env_file=ENV_FILE,
            model_root=CONTAINER_MODEL_ROOT,
            port_mapping=self.port_mapping(),
            volumes=self.volumes(),
            healthcheck=["CMD", "python3", "-c", "import urllib.request; urllib.request.urlopen("
                         f"'http://127.0.0.1:{CONTAINER_PORT}/health', timeout=5)"],
            flagset_hash=self.flagset_hash(),
        )

    def port_mapping(self) -> str:
        """Compose's short port syntax HOST_IP:PORT:CONTAINER_PORT (an IPv6 address in brackets)."""
        address = self.rig.bind_address
        host_ip = f"[{address}]" if ":" in address else address
        return f"{host_ip}:{self.port}:{CONTAINER_PORT}"

    def volumes(self) -> list[tuple[str, str, bool]]:
        """Bind mounts as (source, target, read_only), written in Compose's long syntax: a `:` in a
        path can never re-shape the mount."""
        v, rig = self.variant, self.rig
        env = self.environment()
        # the whole vLLM cache root and Triton's cache dir, where the container's env points them
        mounts = [(rig.model_dir, CONTAINER_MODEL_ROOT, True)]
        mounts += [(host, env[name], False) for name, host in self.cache_mounts().items()]
        if v.chat_template:
            mounts.append((f"{rig.model_dir}/chat-templates/{v.chat_template}.jinja", chat_template_path(v), True))
        return mounts

    def env_file(self, secrets: dict[str, str] | None) -> str:
        """The 0600 env file: secret values at deploy time, only their references otherwise."""
        lines = ["# rigfleet: secrets for the serving container (mode 0600). Do not commit."]
        for field_name, env_name in SECRET_ENV.items():
            ref = getattr(self.rig, field_name)
            if ref is None:
                continue
            if secrets is not None and field_name in secrets:
                lines.append(f"{env_name}={secrets[field_name]}")
            else:
                origin = f"env {ref.env}" if ref.env else f"file {ref.file}"
                lines.append(f"# {env_name} is filled from {origin} at deploy time")
        return "\n".join(lines) + "\n"

    def files(self, secrets: dict[str, str] | None = None, release_id: str = "RELEASE_ID") -> dict[str, str]:
        return {
            "compose.yaml": self.compose(release_id),
            ENV_FILE: self.env_file(secrets),
            **image_files(self.pinset),
        }


def chat_template_path(variant: Variant) -> str:
    return f"{CHAT_TEMPLATES_DIR}/{variant.chat_template}.jinja"


def host_files(rig: Rig, apt_proxy: str | None = None, direct_mirrors: bool = True,
               apt_check: str | None = None) -> dict[str, str]:
    """Host-layer files the roles install (power cap unit, udev rule, apt settings). `apt_proxy`
    replaces the rig's own (the fleet cache, rigfleet.fleetcache), `direct_mirrors` False sends the
    fleet's plain-HTTP mirrors through it too, `apt_check` runs before every apt update."""
    gpu = catalog.gpus()[rig.gpu_model]
    return {
        "systemd/rigfleet-gpu-tuning.service": render("systemd/rigfleet-gpu-tuning.service.j2", rig=rig, gpu=gpu,
                                                      power_limit_w=clamped_power_limit(rig)),
        "udev/71-nvidia-dev-char.rules": render("udev/71-nvidia-dev-char.rules.j2"),
        "apt/99rigfleet-lock-timeout": render("apt/99rigfleet-lock-timeout.j2", rig=rig,
                                              proxy=apt_proxy or rig.apt_proxy, check=apt_check,
                                              direct_hosts=direct_mirror_hosts(rig) if direct_mirrors else []),
        "apt/51rigfleet-unattended-blacklist": render("apt/51rigfleet-unattended-blacklist.j2"),
    }


ALLOWLIST_SCRIPT = "/usr/local/lib/rigfleet/api-allowlist"
ALLOWLIST_UNIT = "rigfleet-api-allowlist.service"


def allowlist_files(rig: Rig, port: int) -> dict[str, str]:
    """The DOCKER-USER allowlist of a rig whose API is published beyond loopback with api_allow:
    the script (apply/remove/check) and the unit that runs it whenever Docker (re)starts."""
    address = ip_address(rig.bind_address)
    # a wildcard bind matches on the port alone; the DNAT state keeps the containers' own
    # outgoing connections (masqueraded, never DNATed) out of the rule
    destination = None if address.is_unspecified else str(address)
    return {
        "script": render("firewall/rigfleet-api-allowlist.sh.j2", rig=rig, port=port,
                         sources=list(rig.api_allow), destination=destination),
        "unit": render(f"systemd/{ALLOWLIST_UNIT}.j2", rig=rig, script=ALLOWLIST_SCRIPT),
    }


def direct_mirror_hosts(rig: Rig) -> list[str]:
    """Hosts of the rig's plain-HTTP repository mirrors: apt reaches them directly, not by proxy."""
    hosts: list[str] = []
    for repo in (rig.cuda_repo, rig.toolkit_repo, rig.docker_repo):
        if repo is None:
            continue
        parts = urlsplit(repo.url)
        if parts.scheme == "http" and parts.hostname and parts.hostname not in hosts:
            hosts.append(parts.hostname)
    return hosts


def clamped_power_limit(rig: Rig) -> int | None:
    if rig.power_limit_w is None:
        return None
    gpu = catalog.gpus()[rig.gpu_model]
    return max(gpu["power_min_w"], min(gpu["power_max_w"], rig.power_limit_w))
