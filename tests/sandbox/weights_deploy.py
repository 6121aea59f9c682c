"""A deploy file with the model_weights role only (tests/sandbox/test_fleet_cache.py: the weights of
a fleet with a download cache, every rig in one `pyinfra` run)."""

from pyinfra import host

from rigfleet.context import for_rig
from rigfleet.roles import run_roles
from rigfleet.roles.model_weights import model_weights

run_roles(for_rig(host.name), [model_weights])
