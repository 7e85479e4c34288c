"""The one way plait writes (and reads back) files, on real files: links planted at a path are
refused, never written through; whole files are replaced atomically; reads are capped."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest

from plait import _files
from plait.errors import FileError, PlaitError


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file of the user's that a planted link points at."""
    path = tmp_path / "victim.txt"
    path.write_text("precious\n")
    return path


def test_a_whole_file_is_replaced_with_its_permissions_and_no_temporary_left(
    tmp_path: Path,
) -> None:
    target = tmp_path / "state.json"
    target.write_text("old")
    target.chmod(0o600)
    _files.write_atomically(target, "new")
    assert target.read_text() == "new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert os.listdir(tmp_path) == ["state.json"]
    _files.write_atomically(tmp_path / "raw.bin", b"\x00\x01")
    assert (tmp_path / "raw.bin").read_bytes() == b"\x00\x01"


def test_a_write_that_fails_midway_keeps_the_old_file_and_leaves_no_temporary(
    tmp_path: Path,
) -> None:
    target = tmp_path / "state.json"
    target.write_text("old")
    with pytest.raises(RuntimeError, match="midway"), _files.replacing(target) as file:
        file.write("half of the new")
        raise RuntimeError("midway")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["state.json"]


@pytest.mark.parametrize(
    "write",
    [
        lambda path: _files.write_atomically(path, "overwritten"),
        lambda path: _files.open_for_writing(path).write("overwritten"),
        lambda path: _files.open_for_writing(path, append=True).write("appended"),
        lambda path: _files.read_json(path),
    ],
    ids=["replace", "truncate", "append", "read"],
)
def test_a_link_at_the_path_is_refused_and_the_file_it_points_at_is_untouched(
    tmp_path: Path, victim: Path, write
) -> None:
    link = tmp_path / "out.json"
    link.symlink_to(victim)
    with pytest.raises(
        FileError, match=rf"{re.escape(str(link))}.* symbolic link.*remove the link"
    ):
        write(link)
    assert victim.read_text() == "precious\n"
    assert link.is_symlink()
    assert sorted(os.listdir(tmp_path)) == ["out.json", "victim.txt"]


def test_a_link_at_the_old_fixed_temporary_name_is_ignored(tmp_path: Path, victim: Path) -> None:
    target = tmp_path / "state.json"
    (tmp_path / "state.json.tmp").symlink_to(victim)
    (tmp_path / "state.tmp").symlink_to(victim)
    _files.write_atomically(target, "new")
    assert target.read_text() == "new" and not target.is_symlink()
    assert victim.read_text() == "precious\n"


def test_a_fifo_a_directory_or_a_missing_folder_is_a_clear_error_that_never_blocks(
    tmp_path: Path,
) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    folder = tmp_path / "folder"
    folder.mkdir()
    for path in (fifo, folder):
        for attempt in (
            lambda p: _files.write_atomically(p, "x"),
            lambda p: _files.open_for_writing(p),
            lambda p: _files.read_json(p),
        ):
            with pytest.raises(FileError, match=rf"{re.escape(str(path))} is not a regular file"):
                attempt(path)
    missing = tmp_path / "no" / "such" / "out.json"
    with pytest.raises(
        FileError, match=rf"{re.escape(str(missing))} cannot be written.*No such file"
    ):
        _files.write_atomically(missing, "x")
    with pytest.raises(
        FileError, match=rf"{re.escape(str(missing))} cannot be opened.*No such file"
    ):
        _files.open_for_writing(missing)


def test_the_error_is_a_plait_error_and_an_os_error_or_the_class_the_caller_names(
    tmp_path: Path, victim: Path
) -> None:
    class CallersError(Exception):
        pass

    link = tmp_path / "link"
    link.symlink_to(victim)
    with pytest.raises(FileError) as caught:
        _files.write_atomically(link, "x")
    assert isinstance(caught.value, PlaitError) and isinstance(caught.value, OSError)
    with pytest.raises(CallersError, match="symbolic link"):
        _files.write_atomically(link, "x", error=CallersError)


def test_lines_come_one_at_a_time_and_an_overlong_line_is_skipped_not_kept(
    tmp_path: Path,
) -> None:
    path = tmp_path / "lines.jsonl"
    path.write_bytes(b"a\n" + b"x" * 300_000 + b"\nb\n" + b"y" * 300_000)
    with _files.open_for_reading(path) as file:
        assert list(_files.read_lines(file, limit=100_000)) == [b"a\n", None, b"b\n", None]
    assert _files.open_for_reading(tmp_path / "missing") is None


def test_json_is_read_capped_and_deep_nesting_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    assert _files.read_json(path) is None
    path.write_text('{"a": [1, 2]}')
    assert _files.read_json(path) == {"a": [1, 2]}
    with pytest.raises(FileError, match=rf"{re.escape(str(path))} is larger than"):
        _files.read_json(path, limit=5)
    path.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(FileError, match=rf"{re.escape(str(path))} is nested too deeply"):
        _files.read_json(path)
    path.write_text("{not json")
    with pytest.raises(FileError, match=rf"{re.escape(str(path))} is not valid JSON"):
        _files.read_json(path)
