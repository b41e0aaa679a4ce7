"""`atomic_write`: the one way a file that must survive kill -9 is replaced."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from templar.core.atomic import atomic_write


def test_replaces_content_and_leaves_no_temporary_files(tmp_path):
    path = tmp_path / "sub" / "state.bin"
    atomic_write(path, b"old")
    atomic_write(path, b"new")
    assert path.read_bytes() == b"new"
    assert sorted(p.name for p in path.parent.iterdir()) == ["state.bin"]


def test_a_failing_writer_keeps_the_old_file(tmp_path):
    path = tmp_path / "book.json"
    atomic_write(path, b"{}")

    def broken(tmp: Path) -> None:
        tmp.write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, broken)
    assert path.read_bytes() == b"{}"
    assert [p.name for p in tmp_path.iterdir()] == ["book.json"]


def test_mode_is_set_before_the_file_appears(tmp_path):
    path = tmp_path / "secret"
    atomic_write(path, os.urandom(32), mode=0o600)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_stamp_sets_the_modification_time(tmp_path):
    path = tmp_path / "obj"
    atomic_write(path, lambda p: p.write_bytes(b"x"), stamp=1_700_000_123.5)
    assert path.stat().st_mtime == pytest.approx(1_700_000_123.5, abs=1e-3)


def test_staging_dir_holds_the_temporary_file(tmp_path):
    staging = tmp_path / ".staging"
    staging.mkdir()
    seen = []

    def writer(tmp: Path) -> None:
        seen.append(tmp.parent)
        tmp.write_bytes(b"y")

    atomic_write(tmp_path / "a" / "b", writer, staging_dir=staging)
    assert seen == [staging] and (tmp_path / "a" / "b").read_bytes() == b"y"
    assert list(staging.iterdir()) == []
