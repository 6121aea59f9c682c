"""The sandbox proxy's HTTPS allowlist comes from pip's own configuration, never from a host name
written in the repository (placeholder names here)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from rigfleet_sandbox import pyindex

CONFIG_LIST = """\
global.cert='/etc/ssl/certs/ca-certificates.crt'
global.extra-index-url='file:///srv/local/simple https://extra.example.org/simple'
global.index_url='https://files.example.org/simple'
:env:.default-timeout='60'
:env:.index-url='https://index.example.org:8443/simple'
"""


def test_the_config_list_is_read_as_pip_reads_it() -> None:
    config = pyindex.parse_config_list(CONFIG_LIST)
    assert config["index-url"] == ["https://index.example.org:8443/simple"]  # :env: comes last and wins
    assert config["extra-index-url"] == ["file:///srv/local/simple", "https://extra.example.org/simple"]
    hosts = pyindex.index_hosts(config, default=frozenset({("default.example.org", 443)}))
    assert hosts == {("index.example.org", 8443), ("extra.example.org", 443)}  # no file://, no default


def test_without_an_index_url_pip_default_index_is_allowed() -> None:
    config = pyindex.parse_config_list("global.extra-index-url='file:///srv/local/simple'\n")
    default = frozenset({("default.example.org", 443), ("files.example.org", 443)})
    assert pyindex.index_hosts(config, default) == default


def test_pip_names_its_own_default_hosts() -> None:
    from pip._internal.models.index import PyPI

    hosts = pyindex.pip_default_hosts()
    assert (PyPI.netloc, 443) in hosts and (PyPI.file_storage_domain, 443) in hosts


@pytest.mark.parametrize("url", ["http://mirror.example.net:8080/simple", "https://mirror.example.net/simple"])
def test_this_machine_pip_configuration_is_asked(tmp_path: Path, url: str) -> None:
    conf = tmp_path / "pip.conf"
    conf.write_text(f"[global]\nindex-url = {url}\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    hosts = pyindex.python_index_hosts(sys.executable, {**env, "PIP_CONFIG_FILE": str(conf),
                                                        "PIP_EXTRA_INDEX_URL": "https://extra.example.org/simple"})
    port = 8080 if url.startswith("http:") else 443
    assert ("mirror.example.net", port) in hosts and ("extra.example.org", 443) in hosts
    assert not hosts & pyindex.pip_default_hosts()  # an index-url replaces pip's default index
