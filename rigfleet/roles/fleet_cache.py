"""fleet_cache role: apt-cacher-ng from the distribution on the rig of the `cache` group, listening
only on the inventory's address, downloading through that rig's apt_proxy when it has one
(rigfleet.fleetcache). Restarted only when its configuration changed.

Runs right after preflight, before apt base points this rig's apt (and then the other rigs') at
it: apt-cacher-ng itself is installed through the way out the cache will use.
"""

from __future__ import annotations

import shlex

from pyinfra.api import deploy
from pyinfra.operations import server

from rigfleet import fleetcache
from rigfleet.context import RigContext
from rigfleet.operations import apt as apt_ops
from rigfleet.operations import files as files_ops
from rigfleet.operations import systemd as systemd_ops
from rigfleet.operations.ordering import role_scope
from rigfleet.roles.preflight import target


@deploy("Fleet download cache")
def fleet_cache(context: RigContext) -> None:
    with role_scope(11):
        found = fleetcache.of(context.fleet)
        if found is None or found.rig != context.rig.name or target(context) is None:
            return
        acng = fleetcache.facts()
        # before the package, whose postinst starts the daemon (dpkg leaves other files alone)
        config = files_ops.config_file(name="apt-cacher-ng: address, port, upstream proxy", dest=acng["config"],
                                       content=fleetcache.config_text(found))
        apt_ops.install(name="apt-cacher-ng from the distribution (the fleet's download cache)",
                        packages=[acng["package"]], proxy=fleetcache.bootstrap_proxy(found))
        systemd_ops.service(name="apt-cacher-ng running and enabled", service=acng["service"],
                            running=True, enabled=True)
        systemd_ops.service(name="Restart apt-cacher-ng (configuration changed)", service=acng["service"],
                            running=True, restarted=True, _if=config.did_change)
        # the rigs' next apt call goes here: wait until it listens (bash's /dev/tcp: curl may not be
        # installed yet, apt base comes next)
        probe = shlex.quote(f"exec 3<>/dev/tcp/{found.address}/{found.port}")
        server.shell(name="apt-cacher-ng listens",
                     commands=[f"for i in $(seq 50); do bash -c {probe} 2>/dev/null && exit 0; sleep 0.2; done; "
                               f"echo {shlex.quote(f'apt-cacher-ng does not listen at {found.url}')} >&2; exit 1"],
                     _if=config.did_change)
