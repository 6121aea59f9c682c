"""The deploy: converge the rig pyinfra runs this on, role by role, in order.

A deploy.py entry file is `from rigfleet.deploy import run` and `run()`. Each role reads the
rig's validated model (rigfleet.context), never raw host.data.
"""

from __future__ import annotations

from rigfleet import deadpeer
from rigfleet.context import for_rig
from rigfleet.roles import ROLES


def run() -> None:
    from pyinfra import host

    deadpeer.arm(host.connector)  # pyinfra connected before loading deploy.py; see rigfleet.deadpeer
    context = for_rig(host.name)
    # host.loop gives each role its own place in pyinfra's operation order: without it, operations
    # of two roles called from this one line could share an identity and tangle the order.
    for role in host.loop(ROLES):
        role(context)
