"""pyinfra inventory: the Ansible-style YAML inventory selected by RIGFLEET_INVENTORY.

Usage: pyinfra inventory.py deploy.py   (default inventory: inventory/sandbox)
The inventory is validated and the compatibility guard runs here, before pyinfra connects to
any host: bad input exits 2 with one line per problem.
"""

from rigfleet.context import fleet, pyinfra_host_data
from rigfleet.hostkeys import install_hints

_fleet = fleet()
# a refused host key (strict checking, never accept-new) is reported with the way out:
# check the fingerprint with `rigfleet hostkeys`, then `rigfleet hostkeys --record`
install_hints()

rigs = [(rig.name, pyinfra_host_data(_fleet, rig)) for rig in _fleet.rigs]

# One pyinfra group per inventory group, so `--limit lab` works as operators expect.
for _group in sorted({g for rig in _fleet.rigs for g in rig.groups}):
    globals()[_group.replace("-", "_")] = [rig.name for rig in _fleet.rigs if _group in rig.groups]
