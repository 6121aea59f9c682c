"""`rigfleet report RIG`: the redactor, the rig-side program and the bundle.

The rig-side program runs against a local SIMULATED rig (tests/unit/test_verify_command.py: the
stand-in engine, nvidia-smi and a docker that answers inspect/logs); the fleet's secrets, the
rig's host name and an address are planted where a real rig has them (the container's env, the
engine's log, the release record) and must not reach the bundle.
"""

from __future__ import annotations

import base64
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from rigfleet import report, runner
from rigfleet.cli import main
from rigfleet.redact import Redactor
from tests.unit.test_verify_command import RELEASE, local_exec, mapped, rigs, site  # noqa: F401 (fixtures)

API_KEY = "sk-report-test-0123456789abcdef"
HF_TOKEN = "hf_reporttestABCDEFGHIJ0123456789"
HOSTNAME = "gpubox-7.lab.example.net"
ADDRESS = "192.0.2.10"  # rig-01's ssh_hostname in the example inventory


# --- the redactor ---------------------------------------------------------------------------
def test_the_fleets_own_secrets_go_wherever_they_are() -> None:
    redact = Redactor(secrets={"plainsecret-42": "api_key", "tok-xyz": "hf_token"})
    text = redact('env VLLM=plainsecret-42 url=http://u:plainsecret-42@h/ {"x":"aplainsecret-42b"} tok-xyz')
    assert "plainsecret-42" not in text and "tok-xyz" not in text
    assert text.count("<redacted:api_key>") == 3 and "<redacted:hf_token>" in text
    assert redact.counts["api_key"] == 3


def test_a_secret_containing_another_is_not_left_half_visible() -> None:
    redact = Redactor(secrets={"abc": "api_key", "abcdef-long": "hf_token"})
    assert redact("abcdef-long abc") == "<redacted:hf_token> <redacted:api_key>"


@pytest.mark.parametrize("line", [
    "token hf_AbCdEfGhIjKlMnOpQrSt1234 used",
    "Authorization: Bearer abc.DEF-123_xyz",
    "VLLM_API_KEY=s3cr3tvalue",
    'HUGGING_FACE_HUB_TOKEN: "s3cr3tvalue"',
    '{"api_key": "s3cr3tvalue"}',
    "vllm serve --api-key s3cr3tvalue --port 8000",
    "curl ...?key=s3cr3tvalue&x=1",
    "password=s3cr3tvalue",
    "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmU=\n-----END OPENSSH PRIVATE KEY-----",
    "sk-abcdefghijklmnop0123",
])
def test_secret_shapes_go_without_knowing_the_value(line: str) -> None:
    for keep in (False, True):  # --no-redact keeps names, never secrets
        text = Redactor(keep_identity=keep)(line)
        assert "s3cr3tvalue" not in text and "<redacted:" in text, text
        for leaked in ("hf_AbCdEfGhIjKlMnOpQrSt1234", "abc.DEF-123_xyz", "b3BlbnNzaC1rZXktdjEAAAAABG5vbmU=",
                       "sk-abcdefghijklmnop0123"):
            assert leaked not in text


def test_ordinary_triage_text_is_left_alone() -> None:
    text = ('gate level basic: 8 checks; max_tokens=30; "kv_pool_tokens": 120000; cache_key: 3f2a; '
            "rigfleet release int8-mtp-abc; generation_tokens_total 512")
    assert Redactor(hostnames=["rig"], addresses=["10.0.0.1"])(text) == text


def test_host_names_addresses_and_homes_go_unless_kept() -> None:
    redact = Redactor(hostnames=["rig-01", "rig-01.lan"], addresses=["10.0.0.1", "fd00::5"], homes=["/srv/op"])
    text = redact("Linux rig-01 6.1; rig-01.lan at 10.0.0.1:8000, not 10.0.0.12 nor 110.0.0.1; fd00::5; "
                  "rig-010 stays; /home/alice/.cache and /srv/op/models")
    assert "rig-01 " not in text and "rig-01.lan" not in text and "10.0.0.1:" not in text and "fd00::5" not in text
    assert "<rig-host> 6.1" in text and "<rig-ip-1>:8000" in text and "10.0.0.12" in text and "110.0.0.1" in text
    assert "rig-010 stays" in text and "/home/<user>/.cache" in text and "~/models" in text
    assert "alice" not in text
    kept = Redactor(hostnames=["rig-01"], addresses=["10.0.0.1"], keep_identity=True)
    assert kept("rig-01 at 10.0.0.1 /home/alice") == "rig-01 at 10.0.0.1 /home/alice"


# --- the bundle, from a local SIMULATED rig ---------------------------------------------------
def probe_locally(root: Path) -> dict[str, Any]:
    encoded = base64.b64encode(mapped(report.program(50), root).encode()).decode()
    code, out = local_exec(root)(f"echo {encoded} | base64 -d | python3 -", "", lambda _: None, 120)
    assert code == 0, out
    return report.ReportProbe().process(out.splitlines())


def plant(root: Path) -> None:
    """Where a real rig holds the secrets and its names: the container env, the log, the record."""
    inspect = json.loads((root / "inspect.json").read_text())
    inspect[0]["Config"]["Env"] = [f"VLLM_API_KEY={API_KEY}", f"HUGGING_FACE_HUB_TOKEN={HF_TOKEN}"]
    inspect[0]["Config"]["Hostname"] = HOSTNAME
    (root / "inspect.json").write_text(json.dumps(inspect))
    with (root / "engine.log").open("a") as log:
        log.write(f"INFO serving on http://{ADDRESS}:8000 host {HOSTNAME} key {API_KEY}\n"
                  f"DEBUG hub login with {HF_TOKEN}\n")
    record = root / "opt/rigfleet/current/release.json"
    record.write_text(json.dumps(json.loads(record.read_text()) | {"rig": "rig-01",
                                                                  "bind": f"http://{ADDRESS}:8000"}))
    book = json.loads((root / "var/lib/rigfleet/ledger.json").read_text())
    book["attempts"] = [{"kind": "deploy", "release_id": RELEASE, "result": "passed", "ended": "t1",
                         "gate": {"level": "full", "ok": True, "checks": [{"name": "chat", "ok": True}]}}]
    book["verifications"] = [{"kind": "verify", "release_id": RELEASE, "level": "soak", "result": "failed",
                              "gate": {"level": "soak", "ok": False, "checks": [{"name": "soak_long", "ok": False}]}}]
    (root / "var/lib/rigfleet/ledger.json").write_text(json.dumps(book))


@pytest.fixture
def secrets_inventory(example_inventory: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (example_inventory / "host_vars" / "rig-01.yml").write_text(yaml.safe_dump(
        {"api_key": {"env": "RIGFLEET_T_API_KEY"}}))
    monkeypatch.setenv("RIGFLEET_T_API_KEY", API_KEY)
    monkeypatch.setenv("HF_TOKEN", HF_TOKEN)  # the example's group_vars/all.yml: hf_token: {env: HF_TOKEN}
    return example_inventory


def bundle_texts(path: Path) -> dict[str, str]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_the_bundle_has_every_section_and_none_of_the_secrets_or_names(
        rigs: Any, secrets_inventory: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    root = rigs("rig-01")
    plant(root)
    probe = probe_locally(root)
    probe["identity"]["hostnames"].append(HOSTNAME)  # the local machine's names are there already
    calls = []

    def read_facts(fleet: Any, names: list[str], fact: type, **kwargs: Any) -> Any:
        calls.append((names, fact, kwargs))
        return {"rig-01": probe}, {name: runner.RigOutcome(name) for name in names}

    monkeypatch.setattr(runner, "read_facts", read_facts)
    out = tmp_path / "bundle.tar.gz"
    result = CliRunner().invoke(main, ["report", "rig-01", "-o", str(out), "--log-lines", "50"],
                                env={"RIGFLEET_INVENTORY": str(secrets_inventory)})
    assert result.exit_code == 0, result.output
    assert calls == [(["rig-01"], report.ReportProbe, {"log_lines": 50})]  # one fact: one command, one session
    assert f"wrote {out}" in result.stdout and (out.stat().st_mode & 0o777) == 0o600
    texts = bundle_texts(out)
    assert sorted(texts) == sorted(f"rigfleet-report-rig/{name}" for name in ["MANIFEST.md", *report.SECTIONS])
    files = {name.split("/", 1)[1]: text for name, text in texts.items()}
    for name, what in report.SECTIONS.items():
        assert f"| {name} | {what} |" in files["MANIFEST.md"]
    everything = "\n".join(texts) + "\n".join(texts.values())
    for secret in (API_KEY, HF_TOKEN, HOSTNAME, ADDRESS, "rig-01"):
        assert secret not in everything, secret
    assert "VLLM_API_KEY=<redacted:api_key>" in files["containers.txt"]
    assert "HUGGING_FACE_HUB_TOKEN=<redacted:hf_token>" in files["containers.txt"]
    assert "<rig-ip-" in files["engine.log"] and "<rig-host>" in files["engine.log"]
    # the sections hold what they say
    assert "Linux" in files["host.txt"] and "uname -r" in files["kernel.txt"]
    assert "NVIDIA-SMI" in files["driver.txt"] or "Driver Version" in files["driver.txt"]
    assert "Driver Version" in files["nvidia-smi-q.txt"]
    assert json.loads(files["release.json"])["release_id"] == RELEASE
    assert json.loads(files["ledger.json"])["current"]["release_id"] == RELEASE
    last = json.loads(files["last-gate-verify.json"])
    assert last["last_gate"]["gate"]["checks"] == [{"name": "chat", "ok": True}]
    assert last["last_verify"]["level"] == "soak" and last["last_verify"]["result"] == "failed"
    assert json.loads(files["declared.json"])["variant"]
    assert len(files["engine.log"].splitlines()) <= 50 + 1  # the log's tail, bounded
    assert "<redacted:api_key>" in files["engine.log"] and "<redacted:hf_token>" in files["engine.log"]


def test_no_redact_keeps_names_never_secrets(rigs: Any, secrets_inventory: Path, tmp_path: Path,  # noqa: F811
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    root = rigs("rig-01")
    plant(root)
    probe = probe_locally(root)
    monkeypatch.setattr(runner, "read_facts", lambda fleet, names, fact, **kw: (
        {"rig-01": probe}, {n: runner.RigOutcome(n) for n in names}))
    out = tmp_path / "kept.tar.gz"
    result = CliRunner().invoke(main, ["report", "rig-01", "--no-redact", "-o", str(out)],
                                env={"RIGFLEET_INVENTORY": str(secrets_inventory)})
    assert result.exit_code == 0, result.output
    everything = "\n".join(bundle_texts(out).values())
    assert HOSTNAME in everything and ADDRESS in everything and "rig-01" in everything
    assert API_KEY not in everything and HF_TOKEN not in everything


def test_an_unreachable_rig_is_one_line_exit_1_and_nothing_written(example_inventory: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", HF_TOKEN)
    out = tmp_path / "r.tar.gz"
    result = CliRunner().invoke(main, ["report", "rig-01", "-o", str(out)],
                                env={"RIGFLEET_INVENTORY": str(example_inventory)})
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("rigfleet report: rig-01: unreachable") and len(result.stderr.splitlines()) == 1
    assert not out.exists() and not list(tmp_path.glob(".*partial"))
    assert "Traceback" not in result.output


@pytest.mark.parametrize(("args", "env", "needles"), [
    (["rig-99"], {}, ["rig-99", "no such rig", "rig-01"]),
    (["rig-01", "--log-lines", "lots"], {}, ["--log-lines", "'lots'", "1 to 5000"]),
    (["rig-01", "-o", "/nonexistent-dir/r.tar.gz"], {}, ["--output", "directory does not exist"]),
    (["rig-01", "-o", "EXISTING"], {}, ["--output", "already exists"]),
    (["rig-01"], {"HF_TOKEN": None}, ["rig-01", "hf_token", "HF_TOKEN", "is not set"]),
])
def test_bad_input_is_one_line_exit_2_and_contacts_nothing(example_inventory: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch, args: list[str],
                                                          env: dict[str, str | None], needles: list[str]) -> None:
    def refuse(*_: Any, **__: Any) -> Any:
        raise AssertionError("a rig was contacted")

    monkeypatch.setattr(runner, "read_facts", refuse)
    monkeypatch.setenv("HF_TOKEN", HF_TOKEN)
    for name, value in env.items():
        if value is None:
            monkeypatch.delenv(name)
    existing = tmp_path / "there.tar.gz"
    existing.write_text("x")
    args = [str(existing) if a == "EXISTING" else a for a in args]
    result = CliRunner().invoke(main, ["report", *args], env={"RIGFLEET_INVENTORY": str(example_inventory)})
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert all(needle in lines[0] for needle in needles), lines[0]
    assert "Traceback" not in result.output and existing.read_text() == "x"
