"""serving role: the rig's variant as a release behind the health gate, with automatic rollback.

The role only turns the rig's validated model into a ReleaseSpec (files, gate parameters, where
the secrets come from); rigfleet.operations.serving does the facts-first swap and the ledger.
Runs after vllm_image (the swap refuses to stop anything while the image is missing).
"""

from __future__ import annotations

from ipaddress import ip_address

from pyinfra.api import deploy

from rigfleet import gate, gateway, planner
from rigfleet.context import RigContext
from rigfleet.operations import serving as ops
from rigfleet.render import ENV_FILE, SECRET_ENV
from rigfleet.rigstate import ReleaseRecord
from rigfleet.schema import Rig


def base_url(rig: Rig, port: int) -> str:
    """Where the gate, running on the rig itself, reaches the API: loopback for a wildcard bind."""
    address = ip_address(rig.bind_address)
    if address.is_unspecified:
        host = "[::1]" if address.version == 6 else "127.0.0.1"
    else:
        host = f"[{address}]" if address.version == 6 else str(address)
    return f"http://{host}:{port}"


def drain_spec(ctx: RigContext) -> ops.DrainSpec | None:
    """Where the rig sits in the fleet's gateway, when it is behind one and drain is on."""
    gw = gateway.of(ctx.fleet)
    if gw is None or not ctx.rig.drain or not gw.fronts(ctx.rig.name):
        return None
    return ops.DrainSpec(gateway=gw.rig, server=ctx.rig.name, backends=gw.backends_of(ctx.rig.name),
                         timeout_s=ctx.rig.drain_timeout_s)


def release_spec(ctx: RigContext) -> ops.ReleaseSpec:
    rel, rig, variant = ctx.release, ctx.rig, ctx.variant
    release_id = rel.release_id()
    files = rel.files(secrets=None, release_id=release_id)
    files.pop(ENV_FILE)  # rendered with the secrets' values at execute time only
    secrets = []
    for field_name in SECRET_ENV:
        ref = getattr(rig, field_name)
        if ref is not None:
            path = ctx.fleet.path(ref.file)
            secrets.append(ops.SecretSource(field_name, env=ref.env, path=str(path) if path else None))
    meta = ReleaseRecord.model_validate({
        "release_id": release_id,
        "rig": rig.name,
        "pinset": ctx.pinset.name,
        "variant": variant.name,
        "image": rel.image,
        "container_name": variant.container_name,
        "base_url": base_url(rig, rel.port),
        "port": rel.port,
        "served_model_names": list(variant.served_model_names),
        "needs_genesis": variant.needs_genesis,
        "mtp_tokens": variant.mtp_tokens,
        "max_model_len": variant.max_model_len,
        "kv_predicted": planner.predict(rig, variant).kv_pool_tokens,
        "cache_key": rel.cache_key(),
        "gate": {"level": rig.gate, "timeout_s": rig.gate_timeout_s, **gate.rig_settings(rig)},
    })
    return ops.ReleaseSpec(
        rig=rig.name,
        release_id=release_id,
        image=rel.image,
        files=files,
        meta=meta,
        render_env=rel.env_file,
        secrets=tuple(secrets),
        cache_dirs=tuple(rel.cache_mounts().values()),  # created before the swap: the compile caches
        level=rig.gate,
        timeout_s=rig.gate_timeout_s,
        drain=drain_spec(ctx),
    )


@deploy("Serving")
def serving(ctx: RigContext) -> None:
    spec = release_spec(ctx)
    ops.release(spec=spec, name=f"Serve release {spec.release_id} (gate {spec.level})")


@deploy("Serving rollback")
def serving_rollback(ctx: RigContext) -> None:
    """Not in ROLES: `rigfleet rollback RIG` runs it to return to the ledger's previous release."""
    ops.rollback(rig=ctx.rig.name, level=ctx.rig.gate, timeout_s=ctx.rig.gate_timeout_s, drain=drain_spec(ctx),
                 name=f"Roll back to the previous release (gate {ctx.rig.gate})")
