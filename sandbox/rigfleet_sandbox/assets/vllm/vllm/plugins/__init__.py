"""vLLM general plugins (SIMULATED stand-in of vllm/plugins/__init__.py).

Loads every entry point of group `vllm.general_plugins` (filtered by VLLM_PLUGINS) and calls it,
as vLLM does in each process it starts; the Genesis plugin registers through this.
"""

from __future__ import annotations

import os
import traceback
from importlib.metadata import entry_points

from vllm.logger import init_logger

logger = init_logger(__name__)
GROUP = "vllm.general_plugins"


def load_general_plugins() -> list[str]:
    found = list(entry_points(group=GROUP))
    if not found:
        return []
    allowed = os.environ.get("VLLM_PLUGINS")
    names = [p.strip() for p in allowed.split(",")] if allowed is not None else None
    logger.info("Available plugins for group %s:", GROUP)
    for ep in found:
        logger.info("- %s -> %s", ep.name, ep.value)
    if names is None:
        logger.info(
            "All plugins in this group will be loaded. Set `VLLM_PLUGINS` to control which plugins to load."
        )
    loaded = []
    for ep in found:
        if names is not None and ep.name not in names:
            continue
        try:
            ep.load()()
            loaded.append(ep.name)
        except Exception:
            logger.error("Failed to load plugin %s", ep.name)
            traceback.print_exc()
    return loaded
