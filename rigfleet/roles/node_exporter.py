"""Node exporter and GPU collector on every monitored rig: the distribution's
prometheus-node-exporter, listening only on the inventory's address, and a timer that writes the
basic nvidia-smi fields, Xid events, engine health and the ledger's last results into its
textfile collector directory (rigfleet.monitoring renders all of it).

The defaults file goes in before the package: its postinst starts the exporter, and dpkg keeps a
conffile that is already there, so the exporter never listens on the package's wildcard default.
"""

from __future__ import annotations

from pyinfra.api import deploy
from pyinfra.operations import systemd

from rigfleet import monitoring
from rigfleet.context import RigContext
from rigfleet.operations import apt as apt_ops
from rigfleet.operations import files as files_ops
from rigfleet.operations import systemd as systemd_ops
from rigfleet.operations.ordering import role_scope


@deploy("Node exporter and GPU collector")
def node_exporter(context: RigContext) -> None:
    rig = context.rig
    if not rig.monitoring.enabled:
        return
    with role_scope(8):
        node = monitoring.node()
        allowlist = monitoring.exporter_allowlist(context.fleet, rig)
        unit_path = f"/etc/systemd/system/{monitoring.EXPORTER_ALLOWLIST_UNIT}"
        if allowlist is not None:
            # before the exporter listens beyond loopback: only the monitor hosts reach it
            script = files_ops.config_file(name="Node exporter allowlist script",
                                           dest=monitoring.EXPORTER_ALLOWLIST_SCRIPT, content=allowlist["script"],
                                           mode="0755")
            fw_unit = files_ops.config_file(name="Node exporter allowlist unit", dest=unit_path,
                                            content=allowlist["unit"])
            systemd.daemon_reload(name="Reload systemd for the exporter allowlist", _if=fw_unit.did_change)
            systemd_ops.service(name="Enable and apply the exporter allowlist",
                                service=monitoring.EXPORTER_ALLOWLIST_UNIT,
                            running=True, enabled=True)
            systemd_ops.service(name="Re-apply the exporter allowlist", service=monitoring.EXPORTER_ALLOWLIST_UNIT,
                            running=True, restarted=True, _if=lambda: script.did_change() or fw_unit.did_change())
        defaults = files_ops.config_file(name="Node exporter arguments", dest=node["defaults_file"],
                                         content=monitoring.node_exporter_defaults(rig))
        apt_ops.install(name="Node exporter from the distribution", packages=[node["package"]], recommends=False)
        systemd_ops.service(name="Enable and start the node exporter", service=node["service"], running=True,
                        enabled=True)
        systemd_ops.service(name="Restart the node exporter (arguments changed)", service=node["service"],
                        running=True, restarted=True, _if=defaults.did_change)
        rendered = monitoring.collector_files(rig)
        files_ops.config_file(name="GPU collector script", dest=monitoring.COLLECTOR_SCRIPT,
                              content=rendered["script"], mode="0755")
        files_ops.config_file(name="GPU collector configuration", dest=monitoring.COLLECTOR_CONFIG,
                              content=rendered["config"])
        unit = files_ops.config_file(name="GPU collector unit", dest=f"/etc/systemd/system/{monitoring.COLLECTOR_UNIT}",
                                     content=rendered["service"])
        timer = files_ops.config_file(name="GPU collector timer",
                                      dest=f"/etc/systemd/system/{monitoring.COLLECTOR_TIMER}",
                                      content=rendered["timer"])
        systemd.daemon_reload(name="Reload systemd for the GPU collector",
                              _if=lambda: unit.did_change() or timer.did_change())
        systemd_ops.service(name="Enable and start the GPU collector timer", service=monitoring.COLLECTOR_TIMER,
                        running=True, enabled=True)
        systemd_ops.service(name="Restart the GPU collector timer (interval changed)",
                            service=monitoring.COLLECTOR_TIMER,
                        running=True, restarted=True, _if=timer.did_change)
