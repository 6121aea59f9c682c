"""rigfleet.operations.files.write_file: a config file written by one command, run for real."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api.command import StringCommand
from pyinfra.operations import files

from rigfleet.operations.files import INLINE_MAX_BYTES, FileWriteCommand, fits_inline, write_file

AWKWARD = "it's \"quoted\" $HOME `date` \\n %s %d\n\ttab é ✓\n\n\n"


def run(command: StringCommand) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", command.get_raw_value()], capture_output=True, text=True, timeout=30,
                          check=False)


@pytest.mark.parametrize("content", [AWKWARD, "", "no newline at the end", "x" * (INLINE_MAX_BYTES - 100)])
def test_content_arrives_byte_for_byte(tmp_path: Path, content: str) -> None:
    dest = tmp_path / "new" / "dir" / "file.conf"  # its directory is created
    assert run(FileWriteCommand(str(dest), content, "0644")).returncode == 0
    assert dest.read_bytes() == content.encode()
    assert stat.S_IMODE(dest.stat().st_mode) == 0o644
    assert sorted(p.name for p in dest.parent.iterdir()) == ["file.conf"], "no temporary file left"


def test_replaces_an_existing_file_and_sets_its_mode(tmp_path: Path) -> None:
    dest = tmp_path / "run.sh"
    dest.write_text("old\n")
    dest.chmod(0o600)
    assert run(FileWriteCommand(str(dest), "#!/bin/sh\necho new\n", "0755")).returncode == 0
    assert dest.read_text() == "#!/bin/sh\necho new\n" and stat.S_IMODE(dest.stat().st_mode) == 0o755


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory")
def test_a_failed_write_keeps_the_old_file_and_fails(tmp_path: Path) -> None:
    dest = tmp_path / "file.conf"
    dest.write_text("old\n")
    tmp_path.chmod(0o555)
    try:
        assert run(FileWriteCommand(str(dest), "new\n", "0644")).returncode != 0
    finally:
        tmp_path.chmod(0o755)
    assert dest.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["file.conf"]


def test_a_failed_mode_removes_the_temporary_file(tmp_path: Path) -> None:
    dest = tmp_path / "file.conf"
    dest.write_text("old\n")
    assert run(FileWriteCommand(str(dest), "new\n", "not-a-mode")).returncode != 0
    assert dest.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["file.conf"]


def test_private_or_big_files_take_the_upload_not_the_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """A file others may not read must not show up in the rig's process list while it is written;
    one past the inline cap goes by pyinfra's upload too."""
    uploaded: list[tuple[str, str, str]] = []

    def upload(src: Any, dest: str, mode: str) -> Iterator[str]:
        uploaded.append((dest, src.getvalue(), mode))
        yield f"upload {dest}"

    monkeypatch.setattr(files.put, "_inner", upload)
    inline = list(write_file("/etc/a.conf", "a=1\n", "0644"))
    assert len(inline) == 1 and isinstance(inline[0], FileWriteCommand) and uploaded == []
    # each single quote grows ~17-fold, quoted twice
    big, quotes = "x" * (INLINE_MAX_BYTES + 1), "'" * (INLINE_MAX_BYTES // 10)
    assert fits_inline("x" * (INLINE_MAX_BYTES - 100)) and not fits_inline(big) and not fits_inline(quotes)
    for content, mode in (("token=s3cret\n", "0600"), ("token=s3cret\n", "0640"), (big, "0644"), (quotes, "0644")):
        assert list(write_file("/etc/b.conf", content, mode)) == ["upload /etc/b.conf"]
        assert uploaded.pop() == ("/etc/b.conf", content, mode)
