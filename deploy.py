"""pyinfra deploy: converge every rig of the inventory, layer by layer.

    pyinfra inventory.py deploy.py

Roles run in order; each reads the rig's validated model (rigfleet.context), never raw host.data.
"""

from pyinfra import host

from rigfleet import deadpeer
from rigfleet.context import for_rig
from rigfleet.roles import ROLES

deadpeer.arm(host.connector)  # pyinfra connected before loading this file; see rigfleet.deadpeer
context = for_rig(host.name)
# host.loop gives each role its own place in pyinfra's operation order: without it, operations
# of two roles called from this one line could share an identity and tangle the order.
for role in host.loop(ROLES):
    role(context)
