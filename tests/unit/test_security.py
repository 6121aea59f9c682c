"""Security and supply chain, as unit tests: secrets only by reference, strict host keys,
no `curl | sh`, repository keys checked by fingerprint (the real keyring script, run here with
a throwaway key), Genesis by full SHA, overlays and weights by sha256, base images by digest."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from rigfleet import catalog, loader
from rigfleet.context import pyinfra_host_data
from rigfleet.errors import InputError
from rigfleet.operations.apt import keyring_script
from rigfleet.render import Release
from rigfleet.schema import GenesisPin, ImageRef, OverlayFile
from tests import REPO_ROOT
from tests.conftest import write_yaml

SECRET = "hf_SeCrEtVaLuE" + "x9" * 8

# Everything that runs on a rig or is rendered for one: roles, operations, templates, deploy files.
SHIPPED = [*REPO_ROOT.joinpath("roles").rglob("*.py"), *REPO_ROOT.joinpath("rigfleet", "operations").rglob("*.py"),
           *REPO_ROOT.joinpath("rigfleet", "facts").rglob("*.py"), *REPO_ROOT.joinpath("templates").rglob("*"),
           REPO_ROOT / "deploy.py", REPO_ROOT / "inventory.py", *REPO_ROOT.joinpath("rigfleet").glob("*.py")]
PIPE_TO_SHELL = re.compile(r"\b(curl|wget)\b[^\n;&]*\|\s*(sudo\s+(-\S+\s+)*)?(env\s+\S+\s+)?(ba|da|z|k)?sh\b")


def shipped_text() -> dict[Path, str]:
    return {path: path.read_text(encoding="utf-8", errors="replace") for path in SHIPPED if path.is_file()}


def test_pipe_to_shell_pattern_matches_what_it_must() -> None:
    for bad in ("curl -fsSL https://x/install.sh | sh", "wget -qO- https://x | sudo -E bash",
                "curl https://get.docker.com | sudo sh -s --", "curl -s x|bash"):
        assert PIPE_TO_SHELL.search(bad), bad
    assert not PIPE_TO_SHELL.search('curl -fsSL -o "$d/key" url; gpg --import "$d/key"')


def test_no_curl_pipe_to_shell_anywhere_shipped() -> None:
    texts = shipped_text()
    assert len(texts) > 30  # the globs found the roles, operations and templates
    hits = [f"{path.relative_to(REPO_ROOT)}: {m.group(0)}" for path, text in texts.items()
            for m in PIPE_TO_SHELL.finditer(text)]
    assert hits == []


def test_never_accept_new_or_unchecked_host_keys() -> None:
    lax = re.compile(r"accept-new|StrictHostKeyChecking\s*=?\s*(no|off)|strict_host_key_checking\"?\s*[:\]=]\s*"
                     r"[\"']?(no|off|accept)", re.I)
    paths = [*SHIPPED, *REPO_ROOT.joinpath("rigfleet").rglob("*.py")]
    hits = [str(p.relative_to(REPO_ROOT)) for p in set(paths) if p.is_file() and
            # the docstring that says "never accept-new" is the one allowed mention
            any("never" not in line.lower() for line in p.read_text(errors="replace").splitlines()
                if lax.search(line))]
    assert hits == []


def test_every_rig_connects_with_strict_host_keys_from_the_inventory(example_inventory: Path) -> None:
    fleet = loader.load_fleet(example_inventory)
    for rig in fleet.rigs:
        data = pyinfra_host_data(fleet, rig)
        assert data["ssh_strict_host_key_checking"] == "yes"
        assert Path(data["ssh_known_hosts_file"]) == example_inventory / "known_hosts"


@pytest.mark.parametrize("field", ["hf_token", "api_key"])
def test_inline_secret_is_refused_and_never_echoed(example_inventory: Path, field: str) -> None:
    write_yaml(example_inventory / "host_vars" / "rig-01.yml", {field: SECRET})
    with pytest.raises(InputError) as caught:
        loader.load_fleet(example_inventory)
    rendered = "\n".join(p.render() for p in caught.value.problems)
    assert f"rig-01: {field}" in rendered and "by reference" in rendered
    assert SECRET not in rendered and SECRET not in repr(caught.value.problems)


def test_secret_values_only_in_the_env_file(example_inventory: Path) -> None:
    write_yaml(example_inventory / "host_vars" / "rig-01.yml",
               {"hf_token": {"env": "RIGFLEET_T_HF"}, "api_key": {"file": "/run/keys/api"}})
    fleet = loader.load_fleet(example_inventory)
    rig = fleet.rig("rig-01")
    release = Release(rig, fleet.pinsets[rig.pinset], catalog.variants()[rig.variant])
    api_key = "sk-" + SECRET
    files = release.files(secrets={"hf_token": SECRET, "api_key": api_key}, release_id="r1")
    holding = {name for name, text in files.items() if SECRET in text or api_key in text}
    assert holding == {"rigfleet.env"}
    # without values (what the release id hashes, what `render` writes) only the references appear
    assert all(SECRET not in text for text in release.files(secrets=None).values())


def keyring_fixture(tmp_path: Path) -> tuple[Path, str]:
    """A throwaway signing key exported to a file; returns (path, fingerprint)."""
    home = tmp_path / "gnupg"
    home.mkdir(mode=0o700)
    env = {**os.environ, "GNUPGHOME": str(home)}
    subprocess.run(["gpg", "--batch", "--quiet", "--passphrase", "", "--quick-gen-key", "rigfleet test <t@x>",
                    "ed25519", "sign", "1d"], env=env, check=True, capture_output=True)
    listing = subprocess.run(["gpg", "--batch", "--with-colons", "--list-keys"], env=env, check=True,
                             capture_output=True, text=True).stdout
    fingerprint = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))
    key = tmp_path / "key.asc"
    key.write_text(subprocess.run(["gpg", "--batch", "--armor", "--export", fingerprint], env=env, check=True,
                                  capture_output=True, text=True).stdout)
    subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "all"], env=env, capture_output=True)
    return key, fingerprint


@pytest.mark.skipif(not (shutil.which("gpg") and shutil.which("curl")), reason="needs gpg and curl")
def test_repository_key_with_a_wrong_fingerprint_is_refused(tmp_path: Path) -> None:
    key, fingerprint = keyring_fixture(tmp_path)
    wrong = ("0" * 40 if fingerprint != "0" * 40 else "1" * 40)
    dest = tmp_path / "out" / "wrong.gpg"
    refused = subprocess.run(["sh", "-c", keyring_script(str(key), str(dest), wrong)], capture_output=True,
                             text=True)
    assert refused.returncode != 0
    assert f"does not have fingerprint {wrong}; not trusting it" in refused.stderr
    assert not dest.exists()
    good = tmp_path / "out" / "good.gpg"
    accepted = subprocess.run(["sh", "-c", keyring_script(str(key), str(good), fingerprint)], capture_output=True,
                              text=True)
    assert accepted.returncode == 0, accepted.stderr
    assert good.stat().st_size > 0 and good.stat().st_mode & 0o777 == 0o644


def test_schema_pins_sources_by_content() -> None:
    sha = "a" * 64
    with pytest.raises(ValidationError, match="full 40-hex-digit commit"):
        GenesisPin(source="https://example.invalid/g.git", commit="7b9fd31")
    with pytest.raises(ValidationError, match="full 40-hex-digit commit"):
        GenesisPin(source="https://example.invalid/g.git", commit="v7.72.2")
    GenesisPin(source="https://example.invalid/g.git", commit="7b9fd3194ee6efa1644973383cd44ee5604a5d85")
    for bad in ("abc", "A" * 64 + "0", "z" * 64):
        with pytest.raises(ValidationError):
            OverlayFile(source="https://example.invalid/x.py", target="a/x.py", sha256=bad)
    OverlayFile(source="https://example.invalid/x.py", target="a/x.py", sha256=sha)
    with pytest.raises(ValidationError, match="sha256:<64 hex digits>"):
        ImageRef(repository="vllm/vllm-openai", tag="x", digest="sha256:abc")


@pytest.mark.parametrize("address", ["127.0.0.1", "10.0.5.7", "0.0.0.0"])
def test_compose_publishes_the_port_on_the_configured_address_only(example_inventory: Path, address: str) -> None:
    write_yaml(example_inventory / "host_vars" / "rig-01.yml", {"bind_address": address, "port": 8123})
    fleet = loader.load_fleet(example_inventory)
    rig = fleet.rig("rig-01")
    release = Release(rig, fleet.pinsets[rig.pinset], catalog.variants()[rig.variant])
    compose = yaml.safe_load(release.compose("r1"))
    [service] = compose["services"].values()
    assert service["ports"] == [f"{address}:8123:{service['ports'][0].split(':')[-1]}"]
    assert "network_mode" not in service  # host networking would bypass the published address
