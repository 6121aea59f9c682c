"""gateway role: HAProxy from the distribution on the rig of the `gateway` group, its configuration
generated from the inventory (rigfleet.gateway), the fleet's API keys as a 0600 file written
through stdin (never in argv or a log), reloaded (not restarted) when the configuration changed:
HAProxy's master starts new workers and the old ones finish their requests.

Runs last: the rigs behind it are served before the routes to them change.
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Iterator

from pyinfra.api import deploy
from pyinfra.operations import server

from rigfleet import gateway
from rigfleet.context import RigContext
from rigfleet.facts import cache
from rigfleet.facts.files import ManagedFile
from rigfleet.operations import apt as apt_ops
from rigfleet.operations import files as files_ops
from rigfleet.operations import systemd as systemd_ops
from rigfleet.operations.ordering import role_scope
from rigfleet.operations.serving import SecretError, SecretSource

q = shlex.quote


class KeysStdin:
    """The key file as an op's `_stdin`, read from the references only when pyinfra writes it; printed
    as its references (pyinfra prints an op's arguments with --debug-operations)."""

    def __init__(self, sources: list[SecretSource]):
        self.sources = sources

    def readlines(self) -> list[str]:
        return gateway.keys_text([source.read() for source in self.sources]).splitlines(keepends=True)

    def __iter__(self) -> Iterator[str]:
        return iter(self.readlines())

    def __repr__(self) -> str:
        return f"<{len(self.sources)} API key reference(s)>"

    to_json = __repr__


def key_sources(context: RigContext, gw: gateway.Gateway) -> list[SecretSource]:
    out = []
    for ref in gw.keys:
        path = context.fleet.path(ref.file)
        out.append(SecretSource("api_key", env=ref.env, path=str(path) if path else None))
    return out


def wanted_keys_digest(sources: list[SecretSource]) -> str | None:
    try:
        return hashlib.sha256(gateway.keys_text([s.read() for s in sources]).encode()).hexdigest()
    except SecretError:
        return None  # the write below fails this host, naming the missing reference


@deploy("Gateway")
def gateway_role(context: RigContext) -> None:
    with role_scope(10):
        gw = gateway.of(context.fleet)
        if gw is None or gw.rig != context.rig.name:
            return
        haproxy = gateway.facts()["haproxy"]
        apt_ops.install(name="HAProxy (the fleet's gateway)", packages=[haproxy["package"]])
        changed = []
        if gw.keys:
            sources = key_sources(context, gw)
            current = cache.fact(ManagedFile, path=gateway.KEYS_FILE)
            want = wanted_keys_digest(sources)
            if want is None or current is None or current.sha256 != want or current.mode != "600":
                directory = gateway.KEYS_FILE.rsplit("/", 1)[0]
                keys = server.shell(
                    name="The fleet's API keys for the gateway (0600, through stdin)",
                    commands=[f'set -e; t=$(mktemp {q(directory)}/.rigfleet.XXXXXX); cat > "$t"; '
                              f'chmod 0600 "$t"; mv -f "$t" {q(gateway.KEYS_FILE)}'],
                    _stdin=KeysStdin(sources))  # type: ignore[arg-type]
                changed.append(keys.did_change)
        for path, content in gateway.files(gw).items():
            changed.append(files_ops.config_file(name=f"Gateway: {path}", dest=path, content=content).did_change)
        systemd_ops.service(name="HAProxy running and enabled", service=haproxy["service"], running=True, enabled=True)
        # the runtime states a swap set (drain, maint) are saved first and read back by the new
        # workers (server-state-file); a configuration HAProxy refuses is never loaded
        server.shell(
            name="Check the gateway configuration and reload HAProxy (connections kept)",
            commands=[f"haproxy -c -q -f {q(haproxy['config'])}",
                      f"{gateway.runtime_command('show servers state')} > {q(gateway.STATE_FILE)} || true",
                      f"systemctl reload {q(haproxy['service'])}"],
            _if=lambda: any(check() for check in changed))
