"""rigfleet.facts.cache: a batched read gives each fact what its own read gives, and a fact is served
from an earlier read only while nothing was executed on the rig since."""

from __future__ import annotations

import subprocess
from collections import Counter
from typing import Any

import pytest
from pyinfra.api import FactBase, deploy
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.server import RebootRequired
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus
from pyinfra.operations import server
from typing_extensions import override

from rigfleet.facts import cache
from rigfleet.facts.apt import AptRepositoryFiles, HeldPackages
from rigfleet.facts.docker import DockerDaemonConfig
from rigfleet.facts.files import ManagedFile, ManagedFiles
from rigfleet.facts.system import Platform
from tests.plan import scenarios
from tests.plan.fakerig import FakeRig, context_for, plan


class Lines(FactBase[list[str]]):
    @override
    def command(self, text: str) -> str:
        return text

    @override
    @staticmethod
    def default() -> list[str]:
        return ["<default>"]

    @override
    def process(self, output: list[str]) -> list[str]:
        return list(output)


class NeedsProgram(Lines):
    @override
    def requires_command(self, *args: Any, **kwargs: Any) -> str:
        return "rigfleet-no-such-program"


class Picky(Lines):
    @override
    def process(self, output: list[str]) -> list[str]:
        raise ValueError("cannot parse")


def alone(instance: FactBase[Any], **kwargs: Any) -> Any:
    """What pyinfra makes of the fact read alone: its stdout lines processed, or its default."""
    proc = subprocess.run(["sh", "-c", instance.command(**kwargs)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0
    lines = proc.stdout.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return instance.process(lines) if lines else instance.default()


def batched(reads: list[cache.Read]) -> list[Any]:
    batch = cache.Batch()
    command = batch.command(tuple(reads))
    proc = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=False)
    lines = proc.stdout.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return batch.process(lines)


CASES = [
    "echo one; echo two",
    "printf 'no newline at the end'",
    "true",
    "echo; echo",  # empty lines are output too
    "echo a; exit 0; echo never",  # an exit leaves only its own subshell
    "cd /; set -- x y; echo \"$#\"",
    "echo 'a line # with a hash'  # and a comment",
]


def test_each_fact_of_a_batch_is_what_its_own_read_gives() -> None:
    reads = [cache.reading(Lines, text=text) for text in CASES]
    assert batched(reads) == [alone(Lines(), text=text) for text in CASES]


def test_a_failing_missing_or_unparsable_fact_is_left_to_its_own_read() -> None:
    reads = [
        cache.reading(Lines, text="echo before"),
        cache.reading(Lines, text="echo partial; exit 3"),
        cache.reading(NeedsProgram, text="echo would run"),
        cache.reading(Picky, text="echo x"),
        cache.reading(Lines, text="echo after"),
    ]
    assert batched(reads) == [["before"], cache.MISSING, cache.MISSING, cache.MISSING, ["after"]]


def test_real_facts_are_batchable_and_keyed_with_their_defaults() -> None:
    for cls in (DebPackages, HeldPackages, ManagedFile, AptRepositoryFiles, Platform, SystemdStatus, RebootRequired):
        assert cache.batchable(cls), cls
    default = cache.reading(DockerDaemonConfig, path="/etc/docker/daemon.json")
    assert cache.reading(DockerDaemonConfig).key == default.key
    assert cache.reading(ManagedFile, path="/a").key != cache.reading(ManagedFile, path="/b").key


# --- served from an earlier read only while nothing was executed -------------------------------


class Counting(FakeRig):
    """A fake rig that counts the real reads (a batch is one round trip)."""

    reads: Counter[str]
    in_batch: bool = False

    def fact(self, cls: type, *args: Any, **kwargs: Any) -> Any:
        if self.in_batch:  # a part of the batch's one round trip
            return super().fact(cls, *args, **kwargs)
        self.reads[cls.__name__] += 1
        self.in_batch = cls is cache.Batch
        try:
            return super().fact(cls, *args, **kwargs)
        finally:
            self.in_batch = False


def counting(rig: FakeRig) -> Counting:
    counted = Counting(**{name: getattr(rig, name) for name in rig.__dataclass_fields__})
    counted.reads = Counter()
    return counted


@cache.operation(reads=lambda change, **_: [cache.reading(DebPackages)])
def reader(change: bool):
    """+ change: yield a command (as an operation that changes something does)"""
    cache.fact(DebPackages)
    if change:
        yield "true"


@cache.operation()
def reads_after_its_own_change():
    """Reads, changes, reads again."""
    cache.fact(DebPackages)
    yield "true"
    cache.fact(DebPackages)


def run(rig: Counting, *steps: str, preview: bool = False) -> Counting:
    @deploy("steps")
    def steps_role(context: Any) -> None:
        for step in steps:
            if step == "noop":
                reader(name="reads, changes nothing", change=False)
            elif step == "change":
                reader(name="reads, changes", change=True)
            elif step == "shell":
                server.shell(name="pyinfra's own operation runs a command", commands=["true"])
            elif step == "twice":
                reads_after_its_own_change(name="reads, changes, reads")

    context = context_for("debian-13")
    plan(context, rig, roles=[steps_role], check_for_changes=preview)
    return rig


@pytest.fixture
def rig() -> Counting:
    context = context_for("debian-13")
    return counting(scenarios.converged(context, "debian-13"))


@pytest.mark.parametrize("preview", [False, True])
def test_nothing_executed_one_round_trip_for_every_reader(rig: Counting, preview: bool) -> None:
    run(rig, "noop", "noop", "noop", preview=preview)
    assert rig.reads == Counter({"DebPackages": 1})  # one wanted fact: read alone, no batch


@pytest.mark.parametrize("preview", [False, True])
def test_after_a_change_the_next_reader_reads_again(rig: Counting, preview: bool) -> None:
    run(rig, "noop", "change", "noop", "noop", preview=preview)
    assert rig.reads["DebPackages"] == 2, "the planned read, then one after the change"


def test_after_pyinfras_own_operation_ran_a_command_the_next_reader_reads_again(rig: Counting) -> None:
    run(rig, "noop", "shell", "noop")
    assert rig.reads["DebPackages"] == 2


def test_a_read_after_the_operations_own_command_is_a_real_read(rig: Counting) -> None:
    run(rig, "twice")
    assert rig.reads["DebPackages"] == 2, "the first read was planned; the one after the command is real"


def test_a_converged_host_layer_reads_in_three_round_trips() -> None:
    context = context_for("debian-13")
    rig = counting(scenarios.converged(context, "debian-13"))
    result = plan(context, rig, check_for_changes=False)  # as the fleet commands and `pyinfra -y` run
    assert result.events == []
    # what the deploy code reads first; the kernel headers and the disk that follow from it; and
    # what the operations read: three round trips, every fact in one of them
    assert rig.reads == Counter({"Batch": 3}), rig.reads


# --- reads of one fact for many files or units: one command, each reader its own part -----------

def test_many_files_in_one_read_give_each_file_what_its_own_read_gives(tmp_path: Any) -> None:
    (tmp_path / "plain.conf").write_text("a\n")
    (tmp_path / "private key").write_text("secret\n")
    (tmp_path / "private key").chmod(0o600)
    (tmp_path / "a-dir").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "plain.conf")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    paths = [str(tmp_path / name) for name in ("plain.conf", "private key", "a-dir", "link", "dangling", "absent")]
    reads = [cache.reading(ManagedFile, path=path) for path in paths]
    planned = cache.merged(reads)
    assert [(one.cls, readers) for one, readers in planned] == [(ManagedFiles, reads)]  # one read for all
    values: dict[Any, Any] = {}
    cache.keep(values, planned[0][0], reads, alone(ManagedFiles(), **planned[0][0].kwargs))
    assert [values[one.key] for one in reads] == [alone(ManagedFile(), path=path) for path in paths]
    assert values[reads[1].key].mode == "600" and values[reads[2].key] is None  # not flattened


def test_units_merged_into_one_systemctl_show_each_reader_keeps_its_own_units() -> None:
    one, two = (cache.reading(SystemdStatus, services=[unit]) for unit in ("docker.service", "haproxy.service"))
    enabled = cache.reading(SystemdEnabled, services=["docker.service"])
    everything = cache.reading(SystemdStatus)  # no unit named: all of them, left as it is
    planned = cache.merged([one, two, enabled, everything])
    merged_status = next(read for read, readers in planned if readers == [one, two])
    assert merged_status.kwargs["services"] == ["docker.service", "haproxy.service"]
    assert (enabled, [enabled]) in planned and (everything, [everything]) in planned
    # what `systemctl show --all --property Id --property SubState A B` prints: one block per unit
    shown = ["Id=docker.service", "SubState=running", "", "Id=haproxy.service", "SubState=dead"]
    values: dict[Any, Any] = {}
    cache.keep(values, merged_status, [one, two], SystemdStatus().process(shown))
    assert values[one.key] == {"docker.service": True} and values[two.key] == {"haproxy.service": False}


def test_a_path_the_merged_output_would_escape_is_read_alone() -> None:
    odd = cache.reading(ManagedFile, path="/etc/odd\\name")
    plain = [cache.reading(ManagedFile, path=f"/etc/{n}") for n in ("a", "b")]
    assert (odd, [odd]) in cache.merged([odd, *plain])
