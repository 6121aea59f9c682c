"""The distribution's Docker as a variation of the host layer (docker_source: distro) on a
Debian 12 rig: docker.io 20.10 with Compose v2 from Debian 13's docker-compose (the pinned trixie
source), held; a fresh rig converges and the second converge changes nothing."""

from __future__ import annotations

import pytest

from .test_host_layer import (  # noqa: F401 - collected here with this module's constants
    docker_source,
    inventory,
    test_fresh_rig_converges,
    test_second_run_changes_nothing,
)

SANDBOX_RIGS = 1
SANDBOX_FRESH = True
SANDBOX_DISTRO = "bookworm"
DOCKER_SOURCE = "distro"

pytestmark = pytest.mark.sandbox
