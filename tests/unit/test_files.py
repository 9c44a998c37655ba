"""rayline.files: a file is replaced whole or not at all, and no temporary file is left either way."""

import os

import pytest

from rayline.files import atomic_path, atomic_write


def test_atomic_write_replaces_text_and_bytes_and_leaves_nothing_else(tmp_path):
    target = tmp_path / "record.json"
    atomic_write(target, "old")
    atomic_write(str(target), b"new \xe2\x9c\x93")
    assert target.read_text(encoding="utf-8") == "new \u2713"
    assert os.listdir(tmp_path) == ["record.json"]


def test_a_failing_writer_leaves_the_old_file_and_no_temporary_one(tmp_path):
    target = tmp_path / "scores.csv"
    target.write_text("old scores")
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(target) as tmp:
            tmp.write_text("half of the new")
            assert tmp.parent == tmp_path and tmp.name.startswith(".scores.csv.partial-")
            raise KeyboardInterrupt  # Ctrl-C in the middle of writing
    assert target.read_text() == "old scores"
    assert os.listdir(tmp_path) == ["scores.csv"]


def test_a_reader_never_sees_the_file_being_written(tmp_path):
    target = tmp_path / "cluster.json"
    with atomic_path(target) as tmp:
        tmp.write_text("{}")
        assert not target.exists()  # until the block ends, only the temporary file exists
    assert target.read_text() == "{}"


def test_an_unwritable_directory_is_an_oserror_and_leaves_nothing(tmp_path):
    with pytest.raises(OSError):
        atomic_write(tmp_path / "missing" / "x.json", "{}")
    assert os.listdir(tmp_path) == []
