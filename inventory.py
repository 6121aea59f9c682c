"""pyinfra inventory entry file: `pyinfra inventory.py deploy.py`.

The inventory is RIGFLEET_INVENTORY (or ./inventory/hosts.yml); see rigfleet.paths. It is
validated and guarded before pyinfra connects to any host: bad input exits 2.

pyinfra reads this module's names as groups: only `_`-prefixed names (which pyinfra skips) are
bound here besides the groups from rigfleet.context.pyinfra_groups, so none can be shadowed.
"""

from rigfleet.inventory import groups as _groups

globals().update(_groups())
