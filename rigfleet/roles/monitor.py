"""Prometheus on the rigs of the `monitor` group: the distribution's package, listening only on the
inventory's address, with scrape targets generated from the inventory and the fleet's alert rules.
A changed configuration is checked with the package's promtool before Prometheus restarts on it.
"""

from __future__ import annotations

import shlex

from pyinfra.api import deploy
from pyinfra.operations import server

from rigfleet import monitoring
from rigfleet.context import RigContext
from rigfleet.operations import apt as apt_ops
from rigfleet.operations import files as files_ops
from rigfleet.operations import systemd as systemd_ops
from rigfleet.operations.ordering import role_scope


@deploy("Prometheus (monitor host)")
def monitor(context: RigContext) -> None:
    rig = context.rig
    if not monitoring.is_monitor(rig):
        return
    with role_scope(9):
        prom = monitoring.prometheus()
        # before the package, whose postinst starts Prometheus (dpkg keeps conffiles already there)
        defaults = files_ops.config_file(name="Prometheus arguments", dest=prom["defaults_file"],
                                         content=monitoring.prometheus_defaults(rig))
        config = files_ops.config_file(name="Prometheus scrape targets", dest=prom["config"],
                                       content=monitoring.prometheus_config(context.fleet, rig))
        rules = files_ops.config_file(name="Prometheus alert rules", dest=prom["rules"],
                                      content=monitoring.alert_rules(rig))
        apt_ops.install(name="Prometheus from the distribution", packages=[prom["package"]], recommends=False)
        changed = lambda: defaults.did_change() or config.did_change() or rules.did_change()  # noqa: E731
        server.shell(name="Check the Prometheus configuration with promtool",
                     commands=[f"{prom['promtool']} check config {shlex.quote(prom['config'])}"], _if=changed)
        systemd_ops.service(name="Enable and start Prometheus", service=prom["service"], running=True, enabled=True)
        systemd_ops.service(name="Restart Prometheus (configuration changed)", service=prom["service"], running=True,
                        restarted=True, _if=changed)
