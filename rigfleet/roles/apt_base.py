"""apt base: dpkg lock timeout and apt proxy, the unattended-upgrades blacklist, and the few tools
the later roles use (curl and gpg to fetch and check repository keys)."""

from __future__ import annotations

from pyinfra.api import deploy

from rigfleet import fleetcache, render
from rigfleet.context import RigContext
from rigfleet.operations import apt as apt_ops
from rigfleet.operations import files as files_ops
from rigfleet.operations.ordering import role_scope
from rigfleet.roles.preflight import target

APT_CONF = "/etc/apt/apt.conf.d"
TOOLS = ["ca-certificates", "curl", "gpg"]


@deploy("apt base")
def apt_base(context: RigContext) -> None:
    with role_scope(2):
        if target(context) is None:
            return  # preflight refuses this rig
        # with a cache group, every rig's apt (the cache host's too) goes through the fleet's cache
        route = fleetcache.apt_route(context.fleet, context.rig)
        rendered = render.host_files(context.rig, apt_proxy=route.proxy, direct_mirrors=route.direct_mirrors,
                                     apt_check=route.check)
        # first: every apt call after this one waits for the dpkg lock instead of failing
        files_ops.config_file(
            name="apt: wait for the dpkg lock, use the fleet's apt proxy",
            dest=f"{APT_CONF}/99rigfleet-lock-timeout",
            content=rendered["apt/99rigfleet-lock-timeout"],
        )
        # a dpkg run cut off mid-install (a dropped SSH link) is finished before anything installs
        apt_ops.dpkg_repaired(name="dpkg: finish an interrupted run", lock_timeout_s=context.rig.apt_lock_timeout_s)
        files_ops.config_file(
            name="unattended-upgrades: never move the driver, CUDA, Docker or the toolkit",
            dest=f"{APT_CONF}/51rigfleet-unattended-blacklist",
            content=rendered["apt/51rigfleet-unattended-blacklist"],
        )
        apt_ops.install(name="Tools to fetch and check repository keys", packages=TOOLS)
