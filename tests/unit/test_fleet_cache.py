"""The fleet's download cache (rigfleet.fleetcache): who runs it, how every rig's apt reaches it,
apt-cacher-ng's settings, and the inventory mistakes the guard refuses (exit 2, rig, field, fix)."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import yaml
from click.testing import CliRunner

from rigfleet import fleetcache, guard, render
from rigfleet.cli import main
from rigfleet.loader import load_fleet
from tests.conftest import write_yaml

MIRROR = "http://mirror.example.invalid:8080/nvidia/cuda/"


def with_cache(inventory: Path, *hosts: str, **group_vars: object) -> Path:
    path = inventory / "hosts.yml"
    data = yaml.safe_load(path.read_text())
    data["all"]["children"]["cache"] = {"hosts": dict.fromkeys(hosts), **({"vars": group_vars} if group_vars else {})}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return inventory


def set_all(inventory: Path, **values: object) -> None:
    path = inventory / "group_vars" / "all.yml"
    write_yaml(path, {**yaml.safe_load(path.read_text()), **values})


def errors(inventory: Path) -> list[str]:
    return [p.render() for p in guard.check(load_fleet(inventory)) if not p.warning]


def apt_conf(inventory: Path, rig: str) -> str:
    fleet = load_fleet(inventory)
    route = fleetcache.apt_route(fleet, fleet.rig(rig))
    return render.host_files(fleet.rig(rig), apt_proxy=route.proxy, direct_mirrors=route.direct_mirrors,
                             apt_check=route.check)["apt/99rigfleet-lock-timeout"]


def check_cli(inventory: Path) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["check"], env={"RIGFLEET_INVENTORY": str(inventory)})
    return result.exit_code, result.output


def test_without_a_cache_group_apt_is_as_before(example_inventory: Path) -> None:
    set_all(example_inventory, apt_proxy="http://proxy.example.invalid:3128",
            cuda_repo={"url": MIRROR, "key_url": f"{MIRROR}key.asc", "key_fingerprint": "A" * 40})
    fleet = load_fleet(example_inventory)
    assert fleetcache.of(fleet) is None
    rig = fleet.rig("rig-02")
    assert apt_conf(example_inventory, "rig-02") == render.host_files(rig)["apt/99rigfleet-lock-timeout"]
    text = apt_conf(example_inventory, "rig-02")
    assert 'Acquire::http::Proxy "http://proxy.example.invalid:3128";' in text
    assert 'Acquire::http::Proxy::mirror.example.invalid "DIRECT";' in text
    assert "Pre-Invoke" not in text


def test_every_rig_goes_through_the_cache_and_the_cache_out_through_apt_proxy(example_inventory: Path) -> None:
    set_all(example_inventory, apt_proxy="http://proxy.example.invalid:3128",
            cuda_repo={"url": MIRROR, "key_url": f"{MIRROR}key.asc", "key_fingerprint": "A" * 40},
            docker_repo={"url": "https://download.example.invalid/linux/debian",
                         "key_url": "https://download.example.invalid/gpg", "key_fingerprint": "B" * 40})
    with_cache(example_inventory, "rig-01")
    fleet = load_fleet(example_inventory)
    found = fleetcache.of(fleet)
    assert found is not None and found.rig == "rig-01" and found.url == "http://192.0.2.10:3142"
    for rig in ("rig-01", "rig-02", "rig-12"):
        text = apt_conf(example_inventory, rig)
        assert 'Acquire::http::Proxy "http://192.0.2.10:3142";' in text, rig
        assert "DIRECT" not in text, "the fleet's own plain-HTTP mirror is cached too"
    assert "Pre-Invoke" not in apt_conf(example_inventory, "rig-01"), "the cache host checks its cache in its role"
    assert "Pre-Invoke" in apt_conf(example_inventory, "rig-02")
    config = fleetcache.config_text(found)
    assert "Port: 3142\n" in config and "BindAddress: 192.0.2.10\n" in config
    assert "Proxy: http://proxy.example.invalid:3128\n" in config
    assert "AllowUserPorts: 80 8080\n" in config, "the mirror's port"
    assert "PassThroughPattern: ^(download\\.example\\.invalid):443$\n" in config, "https: tunnelled, not cached"


def test_cache_without_a_way_out_downloads_direct(example_inventory: Path) -> None:
    with_cache(example_inventory, "rig-11", cache_port=3150)
    found = fleetcache.of(load_fleet(example_inventory))
    assert found is not None and found.url == "http://192.0.2.21:3150"
    assert "\nProxy:\n" in fleetcache.config_text(found) and fleetcache.bootstrap_proxy(found) == "DIRECT"


def test_a_cache_that_does_not_answer_stops_apt_update_with_the_fix(example_inventory: Path) -> None:
    with_cache(example_inventory, "rig-01", cache_bind_address="127.0.0.1")
    fleet = load_fleet(example_inventory)
    found = fleetcache.of(fleet)
    assert found is not None
    # a port nothing listens on, on this machine's loopback: what apt's Pre-Invoke runs
    dead = fleetcache.Cache(found.rig, "127.0.0.1", "127.0.0.1", 9, None, (), ())
    command = fleetcache.check_command(dead, fleet.rig("rig-02"))
    proc = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    assert "rig-02" in proc.stderr and "fleet cache on rig-01" in proc.stderr and "http://127.0.0.1:9" in proc.stderr
    assert "Fix: converge rig-01 first" in proc.stderr and "out of the cache group" in proc.stderr
    # and it is a valid apt.conf string (no double quote or backslash)
    assert '"' not in command and "\\" not in command and shlex.split(command)


def test_two_cache_hosts_exit_2(example_inventory: Path) -> None:
    with_cache(example_inventory, "rig-01", "rig-02")
    code, out = check_cli(example_inventory)
    assert code == 2 and "Traceback" not in out
    assert "group cache" in out and "rig-01" in out and "rig-02" in out and "put one host in the cache group" in out


def test_bad_cache_port_exits_2(example_inventory: Path) -> None:
    with_cache(example_inventory, "rig-01")
    write_yaml(example_inventory / "host_vars" / "rig-01.yml", {"cache_port": 70000})
    code, out = check_cli(example_inventory)
    assert code == 2 and "Traceback" not in out
    assert "rig-01" in out and "cache_port" in out and "70000" in out


def test_cache_port_taken_by_ssh(example_inventory: Path) -> None:
    with_cache(example_inventory, "rig-02", cache_port=2222)  # rig-02's ssh_port
    (message,) = [e for e in errors(example_inventory) if "cache_port" in e]
    assert "rig-02" in message and "2222" in message and "ssh_port" in message and "Fix:" in message


def test_cache_on_loopback_is_refused_for_a_fleet(example_inventory: Path) -> None:
    with_cache(example_inventory, "rig-01", cache_bind_address="127.0.0.1")
    (message,) = [e for e in errors(example_inventory) if "cache_bind_address" in e]
    assert "rig-01" in message and "127.0.0.1" in message and "cannot reach" in message


def test_cache_host_named_by_dns_needs_a_bind_address(example_inventory: Path) -> None:
    with_cache(example_inventory, "rig-01")
    write_yaml(example_inventory / "host_vars" / "rig-01.yml", {"ssh_hostname": "rig-01.example.invalid"})
    (message,) = [e for e in errors(example_inventory) if "cache_bind_address" in e]
    assert "rig-01" in message and "set cache_bind_address" in message
    write_yaml(example_inventory / "host_vars" / "rig-01.yml",
               {"ssh_hostname": "rig-01.example.invalid", "cache_bind_address": "0.0.0.0"})
    assert not [e for e in errors(example_inventory) if "cache" in e]
    found = fleetcache.of(load_fleet(example_inventory))
    assert found is not None and found.url == "http://rig-01.example.invalid:3142"


def test_cache_settings_on_a_rig_without_the_cache(example_inventory: Path) -> None:
    write_yaml(example_inventory / "host_vars" / "rig-11.yml", {"cache_port": 3150})
    (message,) = [e for e in errors(example_inventory) if "cache_port" in e]
    assert "rig-11" in message and "3150" in message and "not in the cache group" in message


def test_example_fleet_with_a_cache_passes(example_inventory: Path) -> None:
    with_cache(example_inventory, "rig-01")
    assert errors(example_inventory) == []


def test_the_cache_serves_its_model_dir_to_the_other_rigs(example_inventory: Path) -> None:
    with_cache(example_inventory, "rig-01")
    fleet = load_fleet(example_inventory)
    found = fleetcache.of(fleet)
    assert found is not None and found.weights_url == "http://192.0.2.10:3142/rigfleet-models/"
    model_dir = fleet.rig("rig-01").model_dir
    # the package's own mapping kept: a later file's LocalDirs replaces the shipped one
    assert f"LocalDirs: acng-doc /usr/share/doc/apt-cacher-ng ; rigfleet-models {model_dir}\n" in \
        fleetcache.config_text(found)
    assert fleetcache.weights_from(fleet, fleet.rig("rig-02")) == found
    assert fleetcache.weights_from(fleet, fleet.rig("rig-01")) is None, "the cache host fetches from its source"


def test_cache_weights_false(example_inventory: Path) -> None:
    with_cache(example_inventory, "rig-01")
    write_yaml(example_inventory / "host_vars" / "rig-02.yml", {"cache_weights": False})
    fleet = load_fleet(example_inventory)
    assert fleetcache.weights_from(fleet, fleet.rig("rig-02")) is None
    assert fleetcache.weights_from(fleet, fleet.rig("rig-11")) is not None
    write_yaml(example_inventory / "host_vars" / "rig-01.yml", {"cache_weights": False})
    fleet = load_fleet(example_inventory)
    found = fleetcache.of(fleet)
    assert found is not None and found.weights_url is None
    assert "LocalDirs: acng-doc /usr/share/doc/apt-cacher-ng\n" in fleetcache.config_text(found)
    assert all(fleetcache.weights_from(fleet, rig) is None for rig in fleet.rigs)


def test_a_served_model_dir_apt_cacher_ng_cannot_hold_exits_2(example_inventory: Path) -> None:
    with_cache(example_inventory, "rig-01")
    write_yaml(example_inventory / "host_vars" / "rig-01.yml", {"model_dir": "/srv/models;x"})
    code, out = check_cli(example_inventory)
    assert code == 2 and "Traceback" not in out
    assert "rig-01" in out and "model_dir" in out and "/srv/models;x" in out and "cache_weights: false" in out
    write_yaml(example_inventory / "host_vars" / "rig-01.yml", {"model_dir": "/srv/models;x", "cache_weights": False})
    assert not [e for e in errors(example_inventory) if "model_dir" in e]
