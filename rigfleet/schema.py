"""The validated model: rigs, pin sets and variants.

Inventory YAML is turned into these models once (rigfleet.loader); roles, templates and the
guard read only these models. Defaults for every rig live here and nowhere else.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from rigfleet import grammar

SHA40 = re.compile(r"^[0-9a-f]{40}$")
SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
FINGERPRINT = re.compile(r"^[0-9A-F]{40}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# engine_env names that carry secrets: they belong in the 0600 env file, by reference
SECRET_ENV_NAME = re.compile(r"^(HF_.*|HUGGING_FACE_HUB_TOKEN|.*_API_KEY|.*_TOKEN|.*SECRET.*|.*PASSWORD.*)$", re.I)
HOSTNAME = grammar.HOSTNAME
RIG_NAME = grammar.RIG_NAME

class _NoBoolInts(BaseModel):
    """YAML `true` is not a number: pydantic would read it as 1 (ssh_port: true -> port 1)."""

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_int(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        annotation = str(field.annotation) if field is not None else ""
        if isinstance(value, bool) and ("int" in annotation or "float" in annotation) and "bool" not in annotation:
            raise grammar.bad("a boolean where a number belongs", "write a plain number")
        return value


class Strict(_NoBoolInts):
    """Unknown keys are mistakes (a typo would otherwise be ignored silently)."""

    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)


def _url(value: str) -> str:
    """An http(s):// or file:// URL or an absolute path, re-serialised from its parsed parts."""
    return grammar.url(value, ("https", "http", "file"), absolute_path=True)




def _sha256(value: str | None) -> str | None:
    if value is not None and not SHA256_HEX.match(value):
        raise ValueError("must be 64 lower-case hex digits")
    return value


class SecretRef(Strict):
    """A secret given by reference only: read from the control machine at deploy time."""

    env: str | None = Field(None, description="name of an environment variable holding the secret")
    file: str | None = Field(None, description="path of a file holding the secret")

    @model_validator(mode="after")
    def _exactly_one(self) -> SecretRef:
        if (self.env is None) == (self.file is None):
            raise ValueError("give exactly one of env: NAME or file: PATH")
        if self.env is not None and not ENV_NAME.match(self.env):
            raise grammar.bad("not an environment variable name", "write env: NAME (letters, digits, _)")
        return self


class AptRepo(Strict):
    """A package repository mirror: where it is and which key must have signed it."""

    url: str
    key_url: str
    key_fingerprint: str

    _check_urls = field_validator("url", "key_url")(_url)

    @field_validator("key_fingerprint", mode="before")
    @classmethod
    def _fingerprint(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.replace(" ", "").upper()
            if not FINGERPRINT.match(value):
                raise ValueError("must be the key's 40-hex-digit fingerprint")
        return value


class WeightsSource(Strict):
    """Where weights come from: the hub (default) or a fleet mirror over HTTP."""

    url: str | None = None
    _check_url = field_validator("url")(lambda v: v if v is None else grammar.url(v, ("https", "http", "file")))


class Monitoring(Strict):
    """Prometheus monitoring (rigfleet.monitoring): the node exporter and GPU collector on every rig,
    Prometheus on the rigs of the `monitor` group. Durations in seconds; the defaults are a fleet's."""

    enabled: bool = True
    exporter_address: str | None = None  # the node exporter's listen address; None: the rig's bind_address
    prometheus_address: str = "127.0.0.1"  # where Prometheus listens on a monitor host
    scrape_interval_s: int = Field(default=15, ge=1, le=3600)
    collector_interval_s: int = Field(default=15, ge=1, le=3600)
    rig_down_for_s: int = Field(default=120, ge=0, le=86400)
    engine_unhealthy_for_s: int = Field(default=120, ge=0, le=86400)
    kv_cache_full_ratio: float = Field(default=0.95, gt=0, le=1)
    kv_cache_full_for_s: int = Field(default=300, ge=0, le=86400)
    gpu_hot_c: int = Field(default=85, ge=40, le=110)
    gpu_hot_for_s: int = Field(default=120, ge=0, le=86400)
    power_cap_for_s: int = Field(default=600, ge=0, le=86400)
    xid_window_s: int = Field(default=3600, ge=10, le=604800)  # an Xid alerts for this long after it was logged
    drift_for_s: int = Field(default=1800, ge=0, le=86400)  # a rollout in progress is not drift

    @field_validator("exporter_address", "prometheus_address")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        return value if value is None else grammar.bind_address(value)


class Rig(Strict):
    """One serving rig, after all < group < host precedence has been applied."""

    name: str
    groups: tuple[str, ...] = ()
    # how to reach it
    ssh_hostname: str
    ssh_port: int = Field(22, ge=1, le=65535)
    ssh_user: str | None = None
    ssh_key: str | None = None
    ssh_known_hosts_file: str | None = None
    # what it serves
    pinset: str
    variant: str
    port: int | None = Field(None, ge=1024, le=65535)
    # loopback unless the inventory says otherwise (rigfleet.exposure: beyond loopback needs an API
    # key or insecure_public: true; api_allow limits the sources by a DOCKER-USER allowlist)
    bind_address: str = "127.0.0.1"
    insecure_public: bool = False
    api_allow: tuple[str, ...] = ()
    model_dir: str
    cache_dir: str = "/var/cache/rigfleet"
    api_key: SecretRef | None = None
    hf_token: SecretRef | None = None
    weights_source: WeightsSource = WeightsSource()
    engine_env: dict[str, str] = {}
    # "off" serves every MTP variant without its drafter (no --speculative-config): the documented
    # mitigation for vllm#50021, switched fleet-wide in one re-pin from group_vars/all.yml
    mtp_drafter: Literal["on", "off"] = "on"
    # the hardware it has
    gpu_model: str = "rtx-3090"
    gpu_count: int = Field(2, ge=1, le=8)
    nvlink: bool = False
    power_limit_w: int | None = None
    tensor_parallel_size: int | None = Field(None, ge=1, le=8)
    pipeline_parallel_size: int | None = Field(None, ge=1, le=8)
    # host layer choices
    docker_source: Literal["docker-ce", "distro"] = "docker-ce"
    docker_data_root: str | None = None
    driver_module: Literal["open", "proprietary"] = "open"
    driver_install: Literal["prebuilt", "dkms"] = "prebuilt"
    secure_boot_key_enrolled: bool = False
    cdi: bool = False
    # GPU smoke test: `docker run --rm --gpus all IMAGE nvidia-smi -L`. A CUDA base image also
    # checks the driver against the image's CUDA requirement; "local" imports a minimal image
    # from the rig's own root filesystem, for rigs that cannot pull from a registry.
    smoke_image: str = "nvidia/cuda:13.0.2-base-ubuntu22.04"
    apt_proxy: str | None = None
    apt_lock_timeout_s: int = Field(600, ge=0, le=7200)
    min_free_disk_gib: int = Field(80, ge=0, le=100000)
    cuda_repo: AptRepo | None = None
    toolkit_repo: AptRepo | None = None
    docker_repo: AptRepo | None = None
    registry: str | None = None  # fleet registry HOST[:PORT]: a pin's image is built once, then pulled
    registry_insecure: bool = False  # plain-HTTP registry (a lab network); Docker must be told explicitly
    # rollout
    gate: Literal["basic", "full"] = "basic"
    gate_timeout_s: int = Field(600, ge=10, le=7200)
    # the gate's and verify's VRAM check: most MiB nvidia-smi's memory.used (all GPUs) may grow over
    # the turns of a soak; 200 is club-3090's soak limit (research/club3090.md section 7)
    vram_growth_max_mib: int = Field(200, ge=1, le=65536)
    # the fleet's gateway (rigfleet.gateway): set on the rigs of the `gateway` group, or fleet-wide
    gateway_port: int = Field(4000, ge=1024, le=65535)  # where clients reach the one endpoint
    gateway_bind_address: str = "127.0.0.1"
    gateway_only: bool = False  # this rig's own API admits only the gateway (api_firewall)
    drain: bool = True  # out of the gateway before a swap stops the engine (`repin --no-drain`: off)
    drain_timeout_s: int = Field(120, ge=0, le=7200)  # in-flight requests finish before a swap
    gateway_min_serving: int = Field(1, ge=0, le=100)  # backends per model a wave leaves serving
    # the fleet's download cache (rigfleet.fleetcache), on the rig of the `cache` group: where it
    # listens (default: that rig's ssh_hostname, the address the other rigs reach it at) and its port
    cache_bind_address: str | None = None
    cache_port: int | None = Field(None, ge=1, le=65535)
    # weights through the cache: on the cache host, serve MODEL_DIR to the other rigs; on another
    # rig, fetch the weights the cache host holds from it (false: from the rig's own source)
    cache_weights: bool = True
    monitoring: Monitoring = Monitoring()

    @field_validator("name")
    @classmethod
    def _rig_name(cls, value: str) -> str:
        return grammar.rig_name(value)

    @field_validator("groups")
    @classmethod
    def _groups(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(grammar.name(group, "group") for group in value)

    @field_validator("pinset")
    @classmethod
    def _pinset(cls, value: str) -> str:
        return grammar.name(value, "pin set")

    @field_validator("ssh_hostname")
    @classmethod
    def _host(cls, value: str) -> str:
        return grammar.host(value)

    @field_validator("ssh_user")
    @classmethod
    def _user(cls, value: str | None) -> str | None:
        if value is not None and not grammar.POSIX_USER.match(value):
            raise grammar.bad("not a user name", "use lower-case letters, digits, '_' and '-' (at most 32)")
        return value

    @field_validator("bind_address", "gateway_bind_address")
    @classmethod
    def _bind(cls, value: str) -> str:
        return grammar.bind_address(value)

    @field_validator("cache_bind_address")
    @classmethod
    def _cache_bind(cls, value: str | None) -> str | None:
        return value if value is None else grammar.bind_address(value)

    @field_validator("api_allow")
    @classmethod
    def _allow(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(grammar.ipv4_network(entry) for entry in value))

    @field_validator("model_dir", "cache_dir", "docker_data_root")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        return value if value is None else grammar.path(value)

    @field_validator("apt_proxy")
    @classmethod
    def _proxy(cls, value: str | None) -> str | None:
        return value if value is None else grammar.http_endpoint(value)

    @field_validator("smoke_image")
    @classmethod
    def _smoke(cls, value: str) -> str:
        return value if value == "local" else grammar.image_reference(value)

    @field_validator("engine_env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not ENV_NAME.match(key):
                raise grammar.bad(f"{key!r:.60} is not an environment variable name",
                                  "use letters, digits and '_', not starting with a digit")
            if SECRET_ENV_NAME.match(key):
                raise grammar.bad(f"{key} looks like a secret and would land in compose.yaml in clear",
                                  "remove it from engine_env; give the API key as api_key: {env: NAME} or "
                                  "{file: /path} and the hub token as hf_token: {env: NAME} (the 0600 env file)")
        return value

    @field_validator("registry")
    @classmethod
    def _registry(cls, value: str | None) -> str | None:
        return value if value is None else grammar.host_port(value)


class ImageRef(Strict):
    repository: str
    tag: str
    digest: str | None = None
    # an image archive (`docker save` format) to load instead of pulling: for air-gapped fleets
    archive: str | None = None

    @field_validator("repository")
    @classmethod
    def _repository(cls, value: str) -> str:
        return grammar.image_repository(value)

    @field_validator("tag", mode="before")
    @classmethod
    def _tag(cls, value: Any) -> Any:
        return grammar.image_tag(value) if isinstance(value, str) else value

    @field_validator("digest")
    @classmethod
    def _digest(cls, value: str | None) -> str | None:
        if value is not None and not DIGEST.match(value):
            raise ValueError("must be sha256:<64 hex digits>")
        return value

    @field_validator("archive")
    @classmethod
    def _archive(cls, value: str | None) -> str | None:
        return value if value is None else _url(value)

    @property
    def ref(self) -> str:
        return f"{self.repository}:{self.tag}"


PatchTreeKind = Literal["genesis-v7", "sndr-v12"]


class GenesisPin(Strict):
    """The pin set's patch tree (historically always Genesis): where it comes from and its layout."""

    source: str
    commit: str
    kind: PatchTreeKind = "genesis-v7"
    version: str | None = None
    sha256: str | None = None  # for tarball sources
    known_good_vllm: tuple[str, ...] | None = None

    @field_validator("source")
    @classmethod
    def _source(cls, value: str) -> str:
        return grammar.source(value)

    @field_validator("version")
    @classmethod
    def _version(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$", value):
            raise grammar.bad("not a version label", "write it as the release names it, e.g. v7.72.2")
        return value

    @field_validator("known_good_vllm")
    @classmethod
    def _known_good(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        return value if value is None else tuple(grammar.pep440(v, "vLLM version") for v in value)

    @field_validator("commit")
    @classmethod
    def _commit(cls, value: str) -> str:
        if not SHA40.match(value):
            raise ValueError("must be the full 40-hex-digit commit SHA (a short SHA or tag can move)")
        return value

    _check_sha = field_validator("sha256")(lambda v: _sha256(v))


class OverlayFile(Strict):
    source: str
    target: str
    sha256: str | None = None

    @field_validator("source")
    @classmethod
    def _source(cls, value: str) -> str:
        return grammar.source(value)

    @field_validator("target")
    @classmethod
    def _target(cls, value: str) -> str:
        path = PurePosixPath(value)
        if path.is_absolute() or ".." in path.parts or not value.endswith(".py") \
                or not re.match(r"^[A-Za-z0-9_./-]+$", value):
            raise grammar.bad("not a .py path relative to the vllm package",
                              "write e.g. model_executor/layers/x.py (letters, digits, '_', '-', '/', no '..')")
        return value

    _check_sha = field_validator("sha256")(lambda v: _sha256(v))


class Overlay(Strict):
    name: str
    pr: int | None = Field(None, ge=1)
    files: tuple[OverlayFile, ...] = Field(min_length=1)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return grammar.name(value, "overlay")


class _DebVersioned(Strict):
    @field_validator("version", check_fields=False)
    @classmethod
    def _version(cls, value: str | None) -> str | None:
        return value if value is None else grammar.deb_version(value)


class PackagePin(_DebVersioned):
    version: str | None = None


class DriverPin(_DebVersioned):
    branch: int = Field(580, ge=450, le=999)
    version: str | None = None


class Risk(Strict):
    """A known upstream problem of a pin set, carried as data and shown by check/plan/status."""

    issue: str  # link to the public issue
    symptom: str
    mitigation: str
    variants: tuple[str, ...] = ()  # empty: every variant on the pin set


class MirrorMap(Strict):
    """Where an air-gapped fleet finds pin-set sources: source prefix -> local mirror (a path, a git
    bundle, file:// or an internal URL); `wheels` is a directory of vLLM wheels or a package index."""

    prefixes: dict[str, str] = {}
    wheels: str | None = None


class PinSet(Strict):
    name: str
    description: str = ""
    base_image: ImageRef
    vllm_version: str
    cuda: str = "13.0"
    genesis: GenesisPin | None = None
    overlays: tuple[Overlay, ...] = ()
    python_deps: dict[str, str] = {}
    pip_index_url: str | None = None
    driver: DriverPin = DriverPin(branch=580)
    toolkit: PackagePin = PackagePin()
    docker: PackagePin = PackagePin()
    # the variants this pin set is meant to serve: verified against upstream even before a rig runs them
    variants: tuple[str, ...] = ()
    risks: tuple[Risk, ...] = ()

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return grammar.name(value, "pin set")

    @field_validator("vllm_version")
    @classmethod
    def _vllm_version(cls, value: str) -> str:
        return grammar.pep440(value, "vLLM version")

    @field_validator("cuda")
    @classmethod
    def _cuda(cls, value: str) -> str:
        if not re.match(r"^[0-9]{1,2}\.[0-9]{1,2}$", value):
            raise grammar.bad("not a CUDA version", "write MAJOR.MINOR in quotes, e.g. \"13.0\"")
        return value

    @field_validator("pip_index_url")
    @classmethod
    def _index(cls, value: str | None) -> str | None:
        return value if value is None else grammar.url(value, ("https", "http", "file"))

    @field_validator("python_deps", mode="before")
    @classmethod
    def _pinned(cls, value: Any) -> Any:
        if isinstance(value, dict):
            for name, version in value.items():
                if not isinstance(name, str) or not isinstance(version, str):
                    raise grammar.bad(f"{name!r:.60}: give the version as a quoted string",
                                      'write NAME: "1.2.3"')
                grammar.python_requirement(name, version)
        return value


class GenesisFlags(Strict):
    enable: tuple[str, ...]
    disable: tuple[str, ...]
    tunables: dict[str, str]
    budget_from_batched_tokens: tuple[str, ...]
    pin_policy: Literal["strict", "warn"]
    kind: PatchTreeKind = "genesis-v7"  # the patch-tree layout these flags are written for

    def env(self, batched_tokens: int) -> dict[str, str]:
        """GENESIS_* environment, with the token budgets tied to --max-num-batched-tokens."""
        env = {f"GENESIS_ENABLE_{flag}": "1" for flag in self.enable}
        env |= {f"GENESIS_ENABLE_{flag}": "0" for flag in self.disable}
        env |= self.tunables
        env |= {name: str(batched_tokens) for name in self.budget_from_batched_tokens}
        env["GENESIS_VLLM_PIN_POLICY"] = self.pin_policy
        return env


class Measured(Strict):
    kv_pool_tokens: int
    source: str


class Variant(Strict):
    name: str
    description: str
    model: str
    weights: str
    served_model_names: tuple[str, ...]
    container_name: str
    upstream_image: str
    port: int
    quantization: str
    dtype: str
    tensor_parallel_size: int
    pipeline_parallel_size: int
    gpu_count: int
    min_vram_mib: int
    max_model_len: int
    kv_cache_dtype: str
    long_prefill_token_threshold: int | None = Field(None, ge=1)
    mtp_tokens: int = Field(ge=0)
    max_num_seqs: int = Field(ge=1)
    gpu_memory_utilization: float = Field(gt=0, le=0.98)
    max_num_batched_tokens: int = Field(ge=1)
    trust_remote_code: bool
    chat_template: str | None
    reasoning_parser: str
    default_chat_template_kwargs: dict[str, Any]
    enable_auto_tool_choice: bool
    tool_call_parser: str
    enable_prefix_caching: bool
    enable_chunked_prefill: bool
    sampling: dict[str, int | float]
    custom_all_reduce: Literal["disabled", "nvlink"]
    shm_size: str
    ipc: str
    restart: str
    gpu_reservation: dict[str, Any]
    env: dict[str, str]
    genesis: GenesisFlags | None
    measured: Measured | None = None

    @property
    def needs_genesis(self) -> bool:
        return self.genesis is not None
