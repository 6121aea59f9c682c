"""pyinfra deploy: converge every rig of the inventory, layer by layer.

    pyinfra inventory.py deploy.py

Roles run in order; each reads the rig's validated model (rigfleet.context), never raw host.data.
"""

from pyinfra import host

from rigfleet.context import for_rig
from roles import ROLES

context = for_rig(host.name)
for role in ROLES:
    role(context)
