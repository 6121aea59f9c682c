"""The pyinfra inventory of a fleet: what an inventory.py entry file hands to pyinfra.

    from rigfleet.inventory import groups
    globals().update(groups())             # or groups(Path(__file__).parent / "inventory")

The inventory is validated and the compatibility guard runs here, before pyinfra connects to
any host: bad input exits 2 with one line per problem.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rigfleet import paths
from rigfleet.context import fleet, pyinfra_groups
from rigfleet.errors import InputError
from rigfleet.hostkeys import install_hints


def groups(default: Path | str | None = None) -> dict[str, Any]:
    """pyinfra's groups: `all` (every rig with its connection data) and one list per inventory group.

    `default` is the entry file's own inventory; RIGFLEET_INVENTORY overrides it. The choice is
    fixed for the process, so deploy.py's roles read the same inventory.
    """
    try:
        chosen = paths.inventory_dir(default)
    except InputError:
        chosen = None
    loaded = fleet(chosen)  # no inventory given: prints how to name one, exits 2
    paths.select(loaded.inventory_dir)
    # a refused host key (strict checking, never accept-new) is reported with the way out:
    # check the fingerprint with `rigfleet hostkeys`, then `rigfleet hostkeys --record`
    install_hints()
    return pyinfra_groups(loaded)
