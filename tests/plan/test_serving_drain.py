"""The serving swap behind the fleet's gateway: out of the gateway (drain, wait until nothing is in
flight, maint) before the serving release is stopped, back (ready) only after the new release's
gate passed; a failed gate leaves the rig out. The runtime-API commands themselves meet the real
HAProxy in tests/unit/test_gateway_haproxy.py."""

from __future__ import annotations

import shlex
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pyinfra.api.command import StringCommand

from rigfleet.operations import serving as ops
from rigfleet.roles.serving import release_spec
from tests.plan.test_serving import FakeRig, context, hf_token  # noqa: F401 - the autouse HF_TOKEN fixture

BACKEND = "model-qwen"


class FakeGateway:
    """The gateway host: answers the runtime API (set server ..., show stat) and logs each command."""

    def __init__(self, events: list[str], sessions: list[int]) -> None:
        self.events, self.sessions = events, sessions
        self.name = "gw"

    def run_shell_command(self, command: Any, **kwargs: Any) -> tuple[bool, Any]:
        from pyinfra.connectors.util import CommandOutput, OutputLine

        text = command.get_raw_value() if isinstance(command, StringCommand) else str(command)
        runtime = shlex.split(text)[-1]
        self.events.append(f"gateway: {runtime}")
        out = ""
        if runtime == "show stat":
            scur = self.sessions.pop(0) if self.sessions else 0
            out = f"# pxname,svname,scur,status\n{BACKEND},FRONTEND,0,OPEN\n{BACKEND},rig-01,{scur},DRAIN\n"
        return True, CommandOutput([OutputLine("stdout", line) for line in out.splitlines()])


def behind_gateway(example_inventory: Path, sessions: list[int] | None = None,
                   **update: Any) -> tuple[FakeRig, FakeGateway, ops.ReleaseSpec, Any, list[str]]:
    events: list[str] = []
    rig = FakeRig()
    respond = rig.respond

    def logged(cmd: str, stdin: str | None) -> tuple[bool, str]:
        events.append(f"rig: {cmd}")
        return respond(cmd, stdin)

    rig.respond = logged  # type: ignore[method-assign]
    gw = FakeGateway(events, list(sessions or []))
    state = SimpleNamespace(inventory=SimpleNamespace(get_host=lambda name, default=None: gw if name == "gw" else None),
                            active_hosts={gw})
    spec = release_spec(context(example_inventory, **update))
    spec = replace(spec, drain=ops.DrainSpec("gw", "rig-01", (BACKEND,), timeout_s=30, poll_s=0))
    rig.images.add(spec.image)
    return rig, gw, spec, state, events


def serve(rig: FakeRig, spec: ops.ReleaseSpec, state: Any) -> None:
    ops.apply_release(state, rig, spec, {"_sudo": True})  # type: ignore[arg-type]


def index(events: list[str], text: str) -> int:
    return next(i for i, event in enumerate(events) if text in event)


def test_a_serving_rig_is_drained_before_its_stop_and_back_after_its_gate(example_inventory: Path) -> None:
    rig, _, spec, state, events = behind_gateway(example_inventory, sessions=[2, 1, 0])
    serve(rig, spec, state)  # the first release: nothing was serving, nothing to drain
    assert not any("state drain" in e for e in events)
    assert events[-1] == f"gateway: set server {BACKEND}/rig-01 state ready"
    events.clear()
    other = release_spec(context(example_inventory, variant="tq3-nomtp"))
    other = replace(other, drain=spec.drain)
    rig.images.add(other.image)
    serve(rig, other, state)
    drain, maint = index(events, "state drain"), index(events, "state maint")
    stop = index(events, "docker compose down")
    gate, ready = index(events, "--level basic"), index(events, "state ready")
    assert drain < maint < stop < gate < ready
    # it waited until the gateway had no session left on the rig (2, 1, then 0)
    assert sum(1 for e in events[drain:maint] if e == "gateway: show stat") == 3
    assert any("drained from the gateway" in line for line in rig.logs)


def test_a_failed_gate_leaves_the_rig_out_of_the_gateway(example_inventory: Path) -> None:
    rig, _, spec, state, events = behind_gateway(example_inventory)
    serve(rig, spec, state)
    events.clear()
    other = replace(release_spec(context(example_inventory, variant="tq3-nomtp")), drain=spec.drain)
    rig.images.add(other.image)
    rig.gate_ok[other.release_id] = False
    with pytest.raises(ops.ServingError, match="failed the basic gate"):
        serve(rig, other, state)
    assert any("state maint" in e for e in events) and not any("state ready" in e for e in events)
    assert rig.running() == [spec.release_id]  # the previous release serves again, but out of the gateway


def test_no_gateway_connection_swaps_without_a_drain(example_inventory: Path) -> None:
    rig, _, spec, _, events = behind_gateway(example_inventory)
    nobody = SimpleNamespace(inventory=SimpleNamespace(get_host=lambda name, default=None: None), active_hosts=set())
    serve(rig, spec, nobody)
    other = replace(release_spec(context(example_inventory, variant="tq3-nomtp")), drain=spec.drain)
    rig.images.add(other.image)
    serve(rig, other, nobody)
    assert not any(e.startswith("gateway:") for e in events)
    assert any("swapping without a drain" in line for line in rig.logs)


class SilentGateway(FakeGateway):
    """A gateway host whose HAProxy is not running yet (its runtime API's socket is not there)."""

    def run_shell_command(self, command: Any, **kwargs: Any) -> tuple[bool, Any]:
        from pyinfra.connectors.util import CommandOutput, OutputLine

        text = command.get_raw_value() if isinstance(command, StringCommand) else str(command)
        self.events.append(f"gateway: {shlex.split(text)[-1]}")
        return False, CommandOutput([OutputLine("stderr", "FileNotFoundError: [Errno 2] No such file or directory")])


def test_a_gateway_not_running_yet_swaps_without_a_drain(example_inventory: Path) -> None:
    """The first deploy of a gateway onto a fleet that already serves: the rigs swap before HAProxy
    runs; each swap goes on (and passes) without a drain instead of failing on the runtime API."""
    rig, _, spec, _, events = behind_gateway(example_inventory)
    silent = SilentGateway(events, [])
    state = SimpleNamespace(inventory=SimpleNamespace(get_host=lambda name, default=None: silent),
                            active_hosts={silent})
    serve(rig, spec, state)
    other = replace(release_spec(context(example_inventory, variant="tq3-nomtp")), drain=spec.drain)
    rig.images.add(other.image)
    serve(rig, other, state)
    assert rig.running() == [other.release_id]
    assert any("does not answer" in line and "swapping without a drain" in line for line in rig.logs)
    assert not any("drained from the gateway" in line or "back in the gateway" in line for line in rig.logs)


def test_a_drained_rig_the_gateway_cannot_take_back_fails_its_swap(example_inventory: Path) -> None:
    """Drained, swapped, gated, and then the gateway stops answering: the swap fails loudly (a rollout
    that only takes rigs out would empty the gateway)."""
    rig, gw, spec, state, events = behind_gateway(example_inventory)
    serve(rig, spec, state)
    other = replace(release_spec(context(example_inventory, variant="tq3-nomtp")), drain=spec.drain)
    rig.images.add(other.image)
    answer = gw.run_shell_command

    def fails_on_ready(command: Any, **kwargs: Any) -> tuple[bool, Any]:
        text = command.get_raw_value() if isinstance(command, StringCommand) else str(command)
        if "state ready" in text:
            return SilentGateway(events, []).run_shell_command(command, **kwargs)
        return answer(command, **kwargs)

    gw.run_shell_command = fails_on_ready  # type: ignore[method-assign]
    with pytest.raises(ops.ServingError, match="gateway runtime API: set server"):
        serve(rig, other, state)
    assert any("drained from the gateway" in line for line in rig.logs)


class BusyGateway(FakeGateway):
    """A gateway host whose sshd, like a real one, refuses a session beyond MaxSessions (10) open at
    once on its connection; each runtime command takes a while (yielding to the other rigs)."""

    MAX_SESSIONS = 10

    def __init__(self) -> None:
        super().__init__([], [])
        self.open = self.most = 0

    def run_shell_command(self, command: Any, **kwargs: Any) -> tuple[bool, Any]:
        import gevent
        from paramiko.ssh_exception import ChannelException

        if self.open >= self.MAX_SESSIONS:
            raise ChannelException(2, "Connect failed")
        self.open += 1
        self.most = max(self.most, self.open)
        try:
            gevent.sleep(0.01)
            return super().run_shell_command(command, **kwargs)
        finally:
            self.open -= 1


def test_a_wave_of_16_rigs_drains_over_one_gateway_connection_within_its_session_limit() -> None:
    import gevent

    gw = BusyGateway()
    state = SimpleNamespace(inventory=SimpleNamespace(get_host=lambda name, default=None: gw), active_hosts={gw})
    drains = [ops.Drain(ops.DrainSpec("gw", f"rig-{i:02}", (BACKEND, "model-qwen-stream"), timeout_s=30),
                        ops.Remote(SimpleNamespace(name=f"rig-{i:02}")), state)  # type: ignore[arg-type]
              for i in range(16)]
    greenlets = [gevent.spawn(d.set, "drain") for d in drains]
    gevent.joinall(greenlets, raise_error=True)
    assert all(g.successful() for g in greenlets)
    assert len(gw.events) == 32  # every rig's two backends
    assert 1 < gw.most <= ops.GATEWAY_SESSIONS
