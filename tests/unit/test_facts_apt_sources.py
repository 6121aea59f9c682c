"""AptSourceEntries: one-line and deb822 sources as apt reads them."""

from __future__ import annotations

from rigfleet.facts.apt import AptSourceEntries, SourceEntry, parse_sources
from rigfleet.operations.apt import missing_components

KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"


def test_parse_one_line_and_deb822() -> None:
    lines = [
        "==> /etc/apt/sources.list",
        "# deb http://old.example.invalid/debian bookworm main",
        "deb [arch=amd64 signed-by=/k.gpg] http://mirror.example.invalid/debian/ bookworm main contrib",
        "deb-src http://mirror.example.invalid/debian bookworm main",
        "==> /etc/apt/sources.list.d/debian.sources",
        "Types: deb deb-src",
        "URIs: http://mirror.example.invalid/debian",
        "Suites: bookworm bookworm-updates",
        "Components: main non-free-firmware",
        f"Signed-By: {KEYRING}",
        "",
        "# a disabled stanza",
        "Types: deb",
        "URIs: http://disabled.example.invalid/debian",
        "Suites: bookworm",
        "Components: main",
        "Enabled: no",
    ]
    assert parse_sources(lines) == [
        SourceEntry("http://mirror.example.invalid/debian", "bookworm", ("main", "contrib"), "/k.gpg"),
        SourceEntry("http://mirror.example.invalid/debian", "bookworm", ("main", "non-free-firmware"), KEYRING),
        SourceEntry(
            "http://mirror.example.invalid/debian", "bookworm-updates", ("main", "non-free-firmware"), KEYRING
        ),
    ]


def test_the_managed_file_is_left_out_of_the_fact() -> None:
    command = AptSourceEntries().command(exclude="/etc/apt/sources.list.d/rigfleet-x.sources")
    assert "[ \"$f\" != /etc/apt/sources.list.d/rigfleet-x.sources ]" in command


def test_missing_components_per_suite_of_this_release_only() -> None:
    entries = [
        SourceEntry("http://m.invalid/debian", "trixie", ("main", "contrib"), None),
        SourceEntry("http://m.invalid/debian", "trixie", ("non-free", "non-free-firmware"), None),
        SourceEntry("http://m.invalid/debian", "trixie-updates", ("main",), KEYRING),
        SourceEntry("http://m.invalid/debian", "bookworm", ("main",), None),
        SourceEntry("http://s.invalid/debian-security", "trixie-security", ("contrib",), None),
    ]
    required = ["main", "contrib", "non-free", "non-free-firmware"]
    assert missing_components(entries, "trixie", required) == [
        ("http://m.invalid/debian", "trixie-updates", KEYRING, ["contrib", "non-free", "non-free-firmware"])
    ]
