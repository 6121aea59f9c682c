"""model_weights role: the variant's weights in MODEL_DIR/<subdir>, fetched once and verified,
and the variant's chat template where the compose mounts it.

Source: weights_source.url (a fleet mirror of MODEL_DIR over HTTP: <url>/<subdir>/SHA256SUMS
lists the files) or, without one, the Hugging Face hub (the catalog's hf_repo; the token from the
rig's hf_token SecretRef, read on the control machine and sent to the rig on stdin only). In a fleet
with a download cache the other rigs take the weights the cache host holds from it instead
(rigfleet.fleetcache), and their own source only for weights it does not hold.
When the stamp says every file is verified and untouched (and the chat template is in place)
the role adds no operation at all.
"""

from __future__ import annotations

from typing import Any

from pyinfra.api import deploy
from pyinfra.facts.files import File
from pyinfra.facts.server import Which
from pyinfra.operations import apt, files

from rigfleet import catalog, fleetcache
from rigfleet.context import RigContext
from rigfleet.facts import cache
from rigfleet.facts.weights import WeightsState
from rigfleet.operations import weights
from rigfleet.operations.serving import SecretError, SecretSource, SecretStdin
from rigfleet.schema import SecretRef


def weights_spec(ctx: RigContext) -> dict[str, Any]:
    return dict(catalog.models()[ctx.variant.model]["weights"][ctx.variant.weights])


def hub_token_source(ctx: RigContext, ref: SecretRef) -> SecretSource:
    path = ctx.fleet.path(ref.file)
    return SecretSource("hf_token", env=ref.env, path=str(path) if path else None)


def read_secret(ctx: RigContext, ref: SecretRef) -> tuple[str | None, str | None]:
    """(value, None) or (None, why not): a missing secret fails this rig, not the whole run."""
    try:
        return hub_token_source(ctx, ref).read(), None
    except SecretError as exc:
        return None, f"{exc} on the control machine" if "control machine" not in str(exc) else str(exc)


def hub_token_stdin(ctx: RigContext, ref: SecretRef) -> SecretStdin:
    return SecretStdin(hub_token_source(ctx, ref))


def _template(ctx: RigContext) -> str | None:
    chat = ctx.variant.chat_template
    return f"{ctx.rig.model_dir}/chat-templates/{chat}.jinja" if chat else None


def planning_reads(ctx: RigContext) -> list[cache.Read]:
    """The facts the role's deploy code reads (in the run's first batch, rigfleet.roles.run_roles)."""
    subdir = weights_spec(ctx)["subdir"]
    template = _template(ctx)
    return [cache.reading(WeightsState, dest=f"{ctx.rig.model_dir}/{subdir}",
                          stamp=weights.stamp_path(ctx.rig.model_dir, subdir)),
            *([cache.reading(File, path=template)] if template else [])]


@deploy("model_weights")
def model_weights(ctx: RigContext) -> None:
    rig, variant = ctx.rig, ctx.variant
    spec = weights_spec(ctx)
    subdir = spec["subdir"]
    dest = f"{rig.model_dir}/{subdir}"
    template = _template(ctx)

    # Plan-time branch: nothing earlier in a deploy touches weights; the operations re-check.
    state = cache.fact(WeightsState, dest=dest, stamp=weights.stamp_path(rig.model_dir, subdir))
    verified = weights.is_verified(state)
    if verified and (template is None or cache.fact(File, path=template)):
        return

    mirror = rig.weights_source.url
    tools = ["curl"] if mirror else ["curl", "python3"]
    if any(cache.fact(Which, command=tool) is None for tool in tools):
        apt.packages(name="Tools the weights fetch needs", packages=[*tools, "ca-certificates"], update=True,
                     cache_time=3600)
    files.directory(name=f"Weights dir {dest}", path=dest, mode="0755")

    # the token is checked here (a missing one fails this rig with the reason) but travels as a
    # reference: pyinfra prints an op's _stdin with --debug-operations
    error = read_secret(ctx, rig.hf_token)[1] if rig.hf_token and not mirror else None
    token = hub_token_stdin(ctx, rig.hf_token) if rig.hf_token and not mirror and not error else None
    revision = str(spec.get("revision") or "main")
    source = weights.Source(mirror=mirror, repo=str(spec.get("hf_repo", "")), revision=revision,
                            token_error=error)
    if not mirror:
        files.put(name="Hub fetch helper", src=str(weights.HUB_HELPER), dest=weights.HUB_HELPER_ON_RIG, mode="0755")
    via = fleetcache.weights_from(ctx.fleet, rig)
    if via is None:
        weights.source_weights(name=f"Weights {subdir} {source.label}", dest=dest, model_dir=rig.model_dir,
                               subdir=subdir, source=source, _stdin=token or "\n")
    served = fleetcache.of(ctx.fleet)
    if served is not None and served.weights_url and (via is not None or served.rig == rig.name):
        # One operation for the cache host and the rigs that fetch from it: pyinfra starts it on
        # them all only after each has finished the one before, so the cache host's download
        # above has ended (verified, or failed) before the others look for the weights there.
        weights.cached_weights(name=f"Weights {subdir} through the fleet cache on {served.rig}", dest=dest,
                               model_dir=rig.model_dir, subdir=subdir, cache_url=served.weights_url if via else None,
                               cache_rig=served.rig, source=source, _stdin=token or "\n")

    if variant.chat_template:
        weights.chat_template_placed(
            name=f"Chat template {variant.chat_template}", model_dir=rig.model_dir, template=variant.chat_template,
            weights_dir=dest, mirror_root=weights.mirror_root_url(mirror, subdir) if mirror else None,
        )
