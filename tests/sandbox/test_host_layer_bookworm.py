"""The host layer on a Debian 12 (bookworm) rig, Docker CE path: a fresh rig converges, the
second converge changes nothing (test_host_layer.py's tests, on bookworm's own root and
stand-ins; the driver-change rehearsal runs there, on Debian 13)."""

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
DOCKER_SOURCE = "docker-ce"

pytestmark = pytest.mark.sandbox
