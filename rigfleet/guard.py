"""Compatibility guard: refuse a fleet description that cannot work, before any host is contacted.

Run by `rigfleet check`, `rigfleet plan`, and at the start of every deploy. Errors stop
everything (exit 2); warnings are printed and the run goes on.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from packaging.version import Version

from rigfleet import catalog, exposure, fleetcache, gateway, planner, release
from rigfleet.errors import FLEET, InputError, Problem, one_of
from rigfleet.loader import Fleet
from rigfleet.render import Release
from rigfleet.schema import PinSet, Rig, Variant
from rigfleet.upstream import fleet as upstream_fleet

# rigfleet itself uses these ports on a rig; the serving port must not take one of them.
RESERVED_RIG_PORTS = {5000: "the fleet registry"}


def check(fleet: Fleet) -> list[Problem]:
    """Every problem in the fleet, errors and warnings; raise nothing.

    A pin set no rig uses (a draft, or the one a re-pin moves away from) cannot break a rig:
    its problems are reported as warnings so they are seen without blocking the fleet.
    """
    used = {rig.pinset for rig in fleet.rigs}
    problems = []
    for name, pinset in sorted(fleet.pinsets.items()):
        for problem in _pinset(name, pinset):
            if name not in used and not problem.warning:
                problem = replace(problem, warning=True, message=f"(unused pin set) {problem.message}")
            problems.append(problem)
    for rig in fleet.rigs:
        problems += list(_rig(rig, fleet))
    problems += list(_risks(fleet))
    problems += gateway.problems(fleet)
    problems += fleetcache.problems(fleet)
    for problem in upstream_fleet.problems(fleet):
        name = problem.rig.removeprefix("pinset ")
        if problem.rig.startswith("pinset ") and name not in used and not problem.warning:
            problem = replace(problem, warning=True, message=f"(unused pin set) {problem.message}")
        problems.append(problem)
    return problems


def enforce(fleet: Fleet) -> list[Problem]:
    """Raise InputError on any error; return the warnings."""
    problems = check(fleet)
    if any(not p.warning for p in problems):
        raise InputError(problems)
    return problems


def _risks(fleet: Fleet) -> Iterator[Problem]:
    """Known upstream risks of the pin sets rigs run, as warnings naming the exposed rigs."""
    variants = catalog.variants()
    for name, pinset in sorted(fleet.pinsets.items()):
        for risk in pinset.risks:
            exposed = [rig.name for rig in fleet.rigs if rig.pinset == name
                       and (not risk.variants or rig.variant in risk.variants)
                       and not (rig.mtp_drafter == "off" and variants.get(rig.variant) is not None
                                and variants[rig.variant].mtp_tokens)]
            if exposed:
                yield Problem(f"pinset {name}", "risks", risk.issue, f"known upstream risk on {', '.join(exposed)}: "
                              f"{risk.symptom}", risk.mitigation, warning=True)


def _pinset(name: str, pinset: PinSet) -> Iterator[Problem]:
    owner = f"pinset {name}"
    compat = catalog.compat()
    if not pinset.base_image.digest:
        yield Problem(owner, "base_image.digest", None, "the base image is pinned by tag only; a tag can be "
                      "re-pushed or purged", "add digest: sha256:... from your registry or mirror", warning=True)
    for overlay in pinset.overlays:
        for index, file in enumerate(overlay.files):
            if not file.sha256:
                yield Problem(owner, f"overlays.{overlay.name}.files.{index}.sha256", None,
                              f"overlay file {file.target} is not checksummed",
                              "add sha256: of the file you reviewed", warning=True)
    min_branch = compat["cuda_min_driver_branch"].get(pinset.cuda)
    if min_branch is None:
        yield Problem(owner, "cuda", pinset.cuda, "unknown CUDA version",
                      one_of(pinset.cuda, compat["cuda_min_driver_branch"], "CUDA versions"))
    elif pinset.driver.branch < min_branch:
        yield Problem(owner, "driver.branch", pinset.driver.branch,
                      f"a CUDA {pinset.cuda} image needs driver branch {min_branch} or newer on a GeForce card",
                      f"set driver: {{branch: {min_branch}}} or use a base image built for an older CUDA")
    if pinset.genesis is not None:
        yield from _genesis_pin(owner, pinset)
    yield from _overlay_conflicts(owner, pinset)


def _genesis_pin(owner: str, pinset: PinSet) -> Iterator[Problem]:
    genesis = pinset.genesis
    assert genesis is not None
    known = catalog.compat()["genesis_known_good_vllm"].get(genesis.commit)
    allowed = tuple(known) if known else genesis.known_good_vllm
    if allowed is None:
        yield Problem(owner, "genesis.commit", genesis.commit,
                      "rigfleet does not know which vLLM versions this Genesis commit allows",
                      "add genesis.known_good_vllm (copied from its KNOWN_GOOD_VLLM_PINS) so the guard can "
                      "check it; until then the image's strict pin gate decides at boot", warning=True)
    elif pinset.vllm_version not in allowed:
        yield Problem(owner, "vllm_version", pinset.vllm_version,
                      f"Genesis {genesis.version or genesis.commit[:12]} does not allow this vLLM "
                      "(its strict pin gate would stop every boot)",
                      f"use a base image carrying one of: {', '.join(allowed)}, or a Genesis commit that "
                      "allows this vLLM")


def _overlay_conflicts(owner: str, pinset: PinSet) -> Iterator[Problem]:
    seen: set[str] = set()
    for overlay in pinset.overlays:
        for file in overlay.files:
            if file.target in seen:
                yield Problem(owner, f"overlays.{overlay.name}", file.target,
                              "two overlays write the same file", "keep one overlay per target file")
            seen.add(file.target)


def _rig(rig: Rig, fleet: Fleet) -> Iterator[Problem]:
    sources = fleet.sources.get(rig.name, {})
    variants = catalog.variants()
    pinset, variant = release.parts(fleet, rig)

    def problem(field: str, value: object, message: str, fix: str, warning: bool = False) -> Problem:
        return Problem(rig.name, field, value, message, fix, sources.get(field.split(".")[0]), warning)

    if variant is None:
        yield problem("variant", rig.variant, "not a known variant", one_of(rig.variant, variants, "variants"))
    if pinset is None:
        yield problem("pinset", rig.pinset, "no pin set of that name in pinsets.yml",
                      one_of(rig.pinset, fleet.pinsets, "pin sets") if fleet.pinsets
                      else f"define it in {fleet.inventory_dir / 'pinsets.yml'}")
    gpu = catalog.gpus().get(rig.gpu_model)
    if gpu is None:
        yield problem("gpu_model", rig.gpu_model, "not a GPU the catalog knows",
                      one_of(rig.gpu_model, catalog.gpus(), "GPU models"))
        return
    if rig.power_limit_w is not None and not gpu["power_min_w"] <= rig.power_limit_w <= gpu["power_max_w"]:
        yield problem("power_limit_w", rig.power_limit_w,
                      f"outside what a {gpu['name']} accepts ({gpu['power_min_w']}-{gpu['power_max_w']} W)",
                      f"choose {gpu['power_min_w']}-{gpu['power_max_w']} W (the seed rigs run 250-290 W)")
    if variant is None:
        return
    yield from _rig_variant(rig, variant, gpu, problem)
    yield from exposure.problems(rig, rig.port or variant.port, problem)
    if pinset is not None:
        yield from _kv_dtype_on_card(variant, pinset, gpu, problem)
        yield from _rig_pinset(rig, variant, pinset, problem)


def _rig_variant(rig: Rig, variant: Variant, gpu: dict, problem) -> Iterator[Problem]:  # type: ignore[no-untyped-def]
    model = catalog.models()[variant.model]
    tp, pp = planner.tensor_parallel(rig, variant), planner.pipeline_parallel(rig, variant)
    if tp * pp != rig.gpu_count:
        yield problem("tensor_parallel_size", tp,
                      f"TP {tp} x PP {pp} = {tp * pp} GPUs, but the service uses all {rig.gpu_count} GPUs of the rig",
                      f"make tensor_parallel_size x pipeline_parallel_size equal gpu_count ({rig.gpu_count})")
    if tp not in model["valid_tp"]:
        yield problem("tensor_parallel_size", tp, f"{variant.model} shards only at TP {model['valid_tp']}",
                      f"use one of {model['valid_tp']}")
    if rig.gpu_count < variant.gpu_count:
        yield problem("gpu_count", rig.gpu_count, f"variant {variant.name} needs {variant.gpu_count} GPUs",
                      "choose a single-GPU variant or a rig with more GPUs")
    if gpu["vram_mib"] < variant.min_vram_mib:
        yield problem("gpu_model", rig.gpu_model, f"{variant.name} needs {variant.min_vram_mib} MiB per GPU",
                      "choose a variant for smaller cards")
    if variant.mtp_tokens > model["mtp_max_tokens"]:
        yield problem("variant", variant.name, f"MTP {variant.mtp_tokens} exceeds the model's head",
                      f"use at most {model['mtp_max_tokens']}")
    if variant.max_model_len > model["max_ctx_supported"]:
        yield problem("variant", variant.name, f"max_model_len {variant.max_model_len} exceeds the model",
                      f"use at most {model['max_ctx_supported']}")
    port = rig.port or variant.port
    if port == rig.ssh_port:
        yield problem("port", port, "the serving port is the rig's SSH port", "choose another port")
    if port in RESERVED_RIG_PORTS:
        yield problem("port", port, f"reserved for {RESERVED_RIG_PORTS[port]}", "choose another port")
    capacity = planner.predict(rig, variant)
    if capacity.max_full_context_streams < 1:
        yield problem("variant", variant.name,
                      f"the predicted KV pool ({capacity.kv_pool_tokens} tokens) holds no full "
                      f"{variant.max_model_len}-token stream", "choose a variant with a smaller KV dtype")
    elif variant.max_num_seqs > capacity.max_full_context_streams:
        yield problem("variant", variant.name,
                      f"max-num-seqs {variant.max_num_seqs} exceeds the {capacity.max_full_context_streams} "
                      "full-context streams the pool holds; long requests will queue", "accept, or reduce load",
                      warning=True)


def _kv_dtype_on_card(variant: Variant, pinset: PinSet, gpu: dict, problem) -> Iterator[Problem]:  # type: ignore[no-untyped-def]
    first = gpu.get("kv_cache_dtype_min_vllm", {}).get(variant.kv_cache_dtype)
    if first is not None and Version(pinset.vllm_version) < Version(first):
        yield problem("variant", variant.name,
                      f"KV dtype {variant.kv_cache_dtype} runs on sm_{gpu['compute_capability']} only from vLLM "
                      f"{first}; pin set {pinset.name} has {pinset.vllm_version}",
                      f"use a pin set with vLLM >= {first}, or a variant with fp8_e5m2, int8_per_token_head "
                      "or turboquant KV")


def _rig_pinset(rig: Rig, variant: Variant, pinset: PinSet, problem) -> Iterator[Problem]:  # type: ignore[no-untyped-def]
    if variant.needs_genesis and pinset.genesis is None:
        yield problem("variant", variant.name,
                      f"needs Genesis (TurboQuant 3-bit with MTP is only correct with P67) but pin set "
                      f"{pinset.name} carries none", "add genesis: to the pin set or choose tq3-nomtp / int8")
    if variant.kv_cache_dtype.startswith("turboquant_") and variant.mtp_tokens and not variant.needs_genesis:
        yield problem("variant", variant.name, "TurboQuant KV with MTP but without Genesis P67 serves garbage",
                      "use tq3-mtp-genesis or turn MTP off")
    if (variant.genesis is not None and pinset.genesis is not None
            and variant.genesis.kind != pinset.genesis.kind):
        yield problem("variant", variant.name, f"its patch flags are written for a {variant.genesis.kind} tree but "
                      f"pin set {pinset.name} carries a {pinset.genesis.kind} tree",
                      f"choose a variant for {pinset.genesis.kind} (see `rigfleet pins`)")
    env = Release(rig, pinset, variant).environment()
    yield from _genesis_flags(env, pinset, variant, problem)


def _genesis_flags(env: dict[str, str], pinset: PinSet, variant: Variant, problem) -> Iterator[Problem]:  # type: ignore[no-untyped-def]
    compat = catalog.compat()

    def on(flag: str) -> bool:
        return env.get(f"GENESIS_ENABLE_{flag}", "0") == "1"

    if variant.genesis is None:
        return
    for first, second in compat["genesis_mutually_exclusive"]:
        if on(first) and on(second):
            yield problem("engine_env", f"GENESIS_ENABLE_{first}", f"{first} and {second} must never be on together",
                          f"remove GENESIS_ENABLE_{first}")
    targets = {f.target for o in pinset.overlays for f in o.files}
    for flag, target in compat["genesis_flag_conflicts_with_overlay"].items():
        if on(flag) and target in targets:
            yield problem("engine_env", f"GENESIS_ENABLE_{flag}",
                          f"{flag} text-patches {target}, which pin set {pinset.name} overlays",
                          f"set GENESIS_ENABLE_{flag}=0 while the overlay is baked")
    budget = str(variant.max_num_batched_tokens)
    for name in variant.genesis.budget_from_batched_tokens:
        if env.get(name) != budget:
            yield problem("engine_env", name, f"{name}={env.get(name)} but --max-num-batched-tokens is {budget}",
                          f"remove {name} from engine_env: rigfleet ties it to the batched-token budget")
    if variant.mtp_tokens and variant.kv_cache_dtype.startswith("turboquant_") and not on("P67_TQ_MULTI_QUERY_KERNEL"):
        yield problem("engine_env", "GENESIS_ENABLE_P67_TQ_MULTI_QUERY_KERNEL", env.get(
            "GENESIS_ENABLE_P67_TQ_MULTI_QUERY_KERNEL"), "TQ3 + MTP without P67 serves garbage",
            "leave P67 on")


__all__ = ["check", "enforce", "FLEET"]
