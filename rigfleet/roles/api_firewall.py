"""API allowlist: a rig whose API is published beyond loopback with `api_allow` admits only those
sources to the published port (DOCKER-USER, see templates/firewall); a rig that no longer needs it
has it taken out. Runs before serving, so a new release is never reachable from anywhere first.

The rules are applied by a oneshot unit tied to docker.service rather than saved with
iptables-persistent: Docker rebuilds its own chains at every start, and a rules file restored at
boot before dockerd would be applied to chains that do not exist yet.
"""

from __future__ import annotations

from pyinfra.api import deploy
from pyinfra.operations import files, systemd

from rigfleet import exposure, gateway, render
from rigfleet.context import RigContext
from rigfleet.facts import cache
from rigfleet.facts.firewall import ApiAllowlist
from rigfleet.operations import files as files_ops
from rigfleet.operations import systemd as systemd_ops
from rigfleet.operations.ordering import role_scope

UNIT_PATH = f"/etc/systemd/system/{render.ALLOWLIST_UNIT}"


def planning_reads(context: RigContext) -> list[cache.Read]:
    """The fact the role's deploy code reads (in the run's first batch, rigfleet.roles.run_roles)."""
    return [cache.reading(ApiAllowlist, script=render.ALLOWLIST_SCRIPT, unit=UNIT_PATH)]


@deploy("API allowlist")
def api_firewall(context: RigContext) -> None:
    with role_scope(7):
        state = cache.fact(ApiAllowlist, script=render.ALLOWLIST_SCRIPT, unit=UNIT_PATH)
        # gateway_only: the gateway's address joins the allowlist (rigfleet.gateway)
        rig = context.rig.model_copy(update={"api_allow": gateway.allow_sources(context.fleet, context.rig)})
        if not exposure.firewalled(rig):
            if state.installed:
                # ExecStop takes the chain and the jump out
                systemd_ops.service(name="Stop the API allowlist (no longer needed)", service=render.ALLOWLIST_UNIT,
                                running=False, enabled=False)
                files.file(name="Remove the allowlist unit", path=UNIT_PATH, present=False)
                files.file(name="Remove the allowlist script", path=render.ALLOWLIST_SCRIPT, present=False)
                systemd.daemon_reload(name="Reload systemd (allowlist unit removed)")
            return
        rendered = render.allowlist_files(rig, context.release.port)
        script = files_ops.config_file(name="API allowlist script", dest=render.ALLOWLIST_SCRIPT,
                                       content=rendered["script"], mode="0755")
        unit = files_ops.config_file(name="API allowlist unit", dest=UNIT_PATH, content=rendered["unit"])
        systemd.daemon_reload(name="Reload systemd for the allowlist unit", _if=unit.did_change)
        systemd_ops.service(name="Enable and start the API allowlist", service=render.ALLOWLIST_UNIT,
                        running=True, enabled=True)
        # a oneshot already active applies a new rule set only when restarted; so does one whose
        # rules were lost behind its back (iptables flushed, Docker restarted without it)
        systemd_ops.service(name="Re-apply the API allowlist", service=render.ALLOWLIST_UNIT, running=True,
                        restarted=True,
                        _if=lambda: state.installed and (script.did_change() or unit.did_change() or not state.live))
