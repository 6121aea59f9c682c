"""The deploy: converge the rig pyinfra runs this on, role by role, in order.

A deploy.py entry file is `from rigfleet.deploy import run` and `run()`. Each role reads the
rig's validated model (rigfleet.context), never raw host.data.
"""

from __future__ import annotations

from rigfleet import liveness, riglock
from rigfleet.context import for_rig
from rigfleet.roles import run_roles


def run() -> None:
    from pyinfra import host

    liveness.arm(host.connector)  # pyinfra connected before loading deploy.py; see rigfleet.liveness
    if not riglock.hold_or_refuse(host):  # another deploy is converging this rig
        return
    run_roles(for_rig(host.name))
