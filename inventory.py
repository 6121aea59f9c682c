"""pyinfra inventory: the Ansible-style YAML inventory selected by RIGFLEET_INVENTORY.

Usage: pyinfra inventory.py deploy.py   (default inventory: inventory/sandbox)
The inventory is validated and the compatibility guard runs here, before pyinfra connects to
any host: bad input exits 2 with one line per problem.

pyinfra reads this module's names as groups. Only names starting with '_' (which pyinfra skips)
are bound here besides the groups, and the group names come from rigfleet.context.pyinfra_groups,
which the loader has checked: no inventory group can shadow `all` or another group.
"""

import rigfleet.context as _context
import rigfleet.hostkeys as _hostkeys

# a refused host key (strict checking, never accept-new) is reported with the way out:
# check the fingerprint with `rigfleet hostkeys`, then `rigfleet hostkeys --record`
_hostkeys.install_hints()
globals().update(_context.pyinfra_groups(_context.fleet()))
