"""A deploy file with the host layer only (preflight .. gpu_tuning), for checking that layer on the
sandbox apart from the image and serving layers:

    RIGFLEET_E2E_DEPLOY=tests/sandbox/host_layer_deploy.py pytest tests/sandbox/test_host_layer.py
"""

from pyinfra import host

from rigfleet.context import for_rig
from rigfleet.roles import HOST_LAYER, run_roles

run_roles(for_rig(host.name), HOST_LAYER)
