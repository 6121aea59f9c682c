"""vllm_image role: the patched vLLM image of the rig's pin set, built on the rig when missing.

The image tag is a content hash of every build input (render.image_tag), so "the tag exists"
means "this exact image exists": then the role adds no operation at all. Otherwise, in
/var/lib/rigfleet/build/<tag>/, in this order: fleet registry (when configured), overlays
(sha256 checked before anything else), Genesis at its full SHA, the base image checked against
its digest, pinned wheels, the rendered Dockerfile and entrypoint, `docker build`. Genesis
apply_all is never run here (it needs the GPU; the entrypoint runs it). Build log:
/var/log/rigfleet/image-build-<tag>.log; one line per build in /var/lib/rigfleet/image-builds.jsonl.
"""

from __future__ import annotations

from pyinfra.api import deploy
from pyinfra.facts.server import Which
from pyinfra.operations import apt

from rigfleet import render
from rigfleet.context import RigContext
from rigfleet.facts import cache
from rigfleet.facts.image import DockerImageInfo
from rigfleet.operations import image
from rigfleet.operations.image import is_tarball
from rigfleet.upstream.sources import resolve


def provenance_labels(ctx: RigContext, tag: str) -> dict[str, str]:
    """Labels added at build time on top of the Dockerfile's (which carry the pinned inputs)."""
    return {"io.rigfleet.image-tag": tag, "io.rigfleet.pinset": ctx.pinset.name}


def planning_reads(ctx: RigContext) -> list[cache.Read]:
    """The fact the role's deploy code reads first (in the run's first batch, rigfleet.roles.run_roles)."""
    return [cache.reading(DockerImageInfo, ref=render.image_tag(ctx.pinset))]


@deploy("vllm_image")
def vllm_image(ctx: RigContext) -> None:
    pinset = ctx.pinset
    tag = render.image_tag(pinset)
    # Branching at plan time is safe here: nothing earlier in a deploy removes images, and
    # every operation below re-checks the tag at execute time.
    if cache.fact(DockerImageInfo, ref=tag) is not None:
        return

    tools = ["curl", "ca-certificates"]
    if pinset.genesis and not is_tarball(pinset.genesis.source):
        tools.append("git")
    if any(cache.fact(Which, command=tool) is None for tool in tools if tool != "ca-certificates"):
        apt.packages(name="Tools the image build needs", packages=tools, update=True, cache_time=3600)

    if ctx.rig.registry:
        image.pulled_from_registry(name=f"Image {tag} from the fleet registry", tag=tag, registry=ctx.rig.registry)
    for overlay in pinset.overlays:
        for file in overlay.files:
            image.overlay_fetched(name=f"Overlay {overlay.name}: fetch and verify {file.target}",
                                  tag=tag, overlay=overlay.name, file=file)
    if pinset.genesis:
        # fetched through the inventory's mirror map (mirrors.yml); the tag keeps naming the
        # pin set's own source, so a mirrored build and a direct one are the same image
        tree = pinset.genesis.model_copy(update={"source": resolve(pinset.genesis.source, ctx.fleet.mirrors)})
        image.genesis_fetched(name=f"Genesis {pinset.genesis.commit[:12]}: fetch and verify", tag=tag,
                              genesis=tree)
    image.base_image_present(name=f"Base image {pinset.base_image.ref}: get and verify", tag=tag,
                             base=pinset.base_image, registry=ctx.rig.registry)
    image.wheels_fetched(name="Python deps: download wheels", tag=tag, from_ref=pinset.base_image.ref,
                         deps=render.wheel_deps(pinset), index_url=pinset.pip_index_url)
    image.context_files(name="Dockerfile and entrypoint", tag=tag, rendered=render.image_files(pinset))
    image.image_built(name=f"Build {tag}", tag=tag, labels=provenance_labels(ctx, tag), registry=ctx.rig.registry,
                      base=pinset.base_image)
