"""The catalog: variants, models, GPUs, KV dtypes and pin compatibility, read from data files."""

from __future__ import annotations

from functools import cache
from typing import Any

import yaml

from rigfleet.paths import CATALOG_DIR
from rigfleet.schema import Variant


def _load(name: str) -> Any:
    with open(CATALOG_DIR / name, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Variant keys win over `common`; maps (env, sampling) merge one level deep."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


@cache
def variants() -> dict[str, Variant]:
    data = _load("variants.yaml")
    common = data["common"]
    return {
        name: Variant(name=name, **_merge(common, body)) for name, body in data["variants"].items()
    }


@cache
def models() -> dict[str, Any]:
    return dict(_load("models.yaml"))


@cache
def gpus() -> dict[str, Any]:
    return dict(_load("gpus.yaml"))


@cache
def kv_dtypes() -> dict[str, Any]:
    return dict(_load("kv_dtypes.yaml"))


@cache
def compat() -> dict[str, Any]:
    return dict(_load("compat.yaml"))


@cache
def repos() -> dict[str, Any]:
    return dict(_load("repos.yaml"))


@cache
def patch_tree_kinds() -> dict[str, Any]:
    return dict(_load("patch_trees.yaml")["kinds"])


@cache
def platforms() -> dict[str, Any]:
    """Supported platforms and their distribution facts (platforms.yaml)."""
    return dict(_load("platforms.yaml"))


@cache
def gateway() -> dict[str, Any]:
    """The gateway's facts: HAProxy's package, runtime API and states, the engine's gauge."""
    return dict(_load("gateway.yaml"))


@cache
def fleet_cache() -> dict[str, Any]:
    """The fleet's download cache: apt-cacher-ng's package, port and settings (fleet_cache.yaml)."""
    return dict(_load("fleet_cache.yaml"))


@cache
def monitoring() -> dict[str, Any]:
    """The distribution's Prometheus packages, ports and the metric names rigfleet reads (monitoring.yaml)."""
    return dict(_load("monitoring.yaml"))
