"""stagesplit/fileio.py: atomic writes leave either the old file or the new one, never a
temporary file, and say plainly why a write failed. (The Ctrl-C cases are in test_bad_input.)"""

import errno
import hashlib
import os
import stat

import pytest

from stagesplit.common import fileio as fileio
from stagesplit.common.fileio import atomic_write_bytes, atomic_write_text, file_sha256
from stagesplit.errors import StagesplitError


def test_writes_exact_bytes_to_a_new_file(tmp_path):
    data = bytes(range(256)) * 3 + b"\r\n\x00"
    atomic_write_bytes(tmp_path / "out.bin", data)
    assert (tmp_path / "out.bin").read_bytes() == data
    assert os.listdir(tmp_path) == ["out.bin"]
    assert stat.S_IMODE(os.stat(tmp_path / "out.bin").st_mode) == 0o644      # not mkstemp's 0o600


def test_text_is_utf8_and_not_translated(tmp_path):
    atomic_write_text(tmp_path / "out.txt", "a\u00e9\u4e2d\U0001f600\nline 2\r\n")
    assert (tmp_path / "out.txt").read_bytes() == b"a\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80\nline 2\r\n"


def test_text_with_a_lone_surrogate_is_escaped(tmp_path):
    # a name from a JSON "\udc80" escape: UTF-8 cannot hold it, so it is written as the escape
    atomic_write_text(tmp_path / "out.txt", "layer\udc80/x")
    assert (tmp_path / "out.txt").read_bytes() == b"layer\\udc80/x"


def test_replaces_an_existing_file(tmp_path):
    target = tmp_path / "plan.json"
    target.write_text("old contents that are longer than the new ones\n")
    old_inode = os.stat(target).st_ino
    atomic_write_text(target, "new\n")
    assert target.read_text() == "new\n"
    assert os.listdir(tmp_path) == ["plan.json"]
    # renamed over, not rewritten in place: a reader holding the old file keeps the old contents
    assert os.stat(target).st_ino != old_inode


def test_a_reader_of_the_old_file_never_sees_the_new_contents(tmp_path):
    target = tmp_path / "plan.json"
    target.write_text("old\n")
    with open(target) as reader:
        atomic_write_text(target, "new\n")
        assert reader.read() == "old\n"
    assert target.read_text() == "new\n"


def test_relative_path_in_the_working_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    atomic_write_text("out.txt", "x")
    assert (tmp_path / "out.txt").read_text() == "x"
    assert os.listdir(tmp_path) == ["out.txt"]


def test_temporary_file_is_beside_the_target_and_hidden(tmp_path, monkeypatch):
    seen = []
    real_replace = os.replace

    def spy(src, dst):
        seen.append((str(src), str(dst), sorted(os.listdir(tmp_path))))
        real_replace(src, dst)

    monkeypatch.setattr(fileio.os, "replace", spy)
    atomic_write_text(tmp_path / "plan.json", "x")
    ((src, dst, listing),) = seen
    assert os.path.dirname(src) == str(tmp_path) and dst == str(tmp_path / "plan.json")
    name = os.path.basename(src)
    assert name.startswith(".plan.json.") and name.endswith(".tmp")
    assert listing == [name]                        # the target does not exist before the rename
    assert os.listdir(tmp_path) == ["plan.json"]


def test_failed_rename_keeps_the_old_file_and_removes_the_temporary_one(tmp_path, monkeypatch):
    target = tmp_path / "plan.json"
    target.write_text("old\n")

    def refuse(src, dst):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(fileio.os, "replace", refuse)
    with pytest.raises(StagesplitError) as excinfo:
        atomic_write_text(target, "new\n")
    assert str(excinfo.value) == f"{target}: cannot write: Permission denied"
    assert target.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["plan.json"]


def test_failed_write_keeps_the_old_file_and_removes_the_temporary_one(tmp_path, monkeypatch):
    target = tmp_path / "plan.json"
    target.write_text("old\n")

    def disk_full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fileio.os, "fsync", disk_full)
    with pytest.raises(StagesplitError, match=r"plan\.json: cannot write: No space left on device$"):
        atomic_write_bytes(target, b"new\n")
    assert target.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["plan.json"]


def test_unexpected_exception_is_raised_as_is_and_cleans_up(tmp_path, monkeypatch):
    # not an OSError (a bug, or an interrupt): passed on unchanged, the temporary file still removed
    target = tmp_path / "plan.json"
    target.write_text("old\n")

    def boom(fd):
        raise RuntimeError("boom")

    monkeypatch.setattr(fileio.os, "fsync", boom)
    with pytest.raises(RuntimeError, match="^boom$"):
        atomic_write_text(target, "new\n")
    assert target.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["plan.json"]


def test_failure_with_no_previous_file_leaves_nothing(tmp_path, monkeypatch):
    def io_error(src, dst):
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(fileio.os, "replace", io_error)
    with pytest.raises(StagesplitError, match="cannot write: I/O error"):
        atomic_write_text(tmp_path / "new.json", "x")
    assert os.listdir(tmp_path) == []


def test_missing_folder(tmp_path):
    target = tmp_path / "nowhere" / "plan.json"
    with pytest.raises(StagesplitError) as excinfo:
        atomic_write_text(target, "x")
    assert str(excinfo.value) == f"{target}: cannot write: folder {tmp_path / 'nowhere'} does not exist"
    assert os.listdir(tmp_path) == []


def test_folder_that_is_a_file(tmp_path):
    (tmp_path / "file").write_text("keep\n")
    target = tmp_path / "file" / "plan.json"
    with pytest.raises(StagesplitError) as excinfo:
        atomic_write_text(target, "x")
    assert str(excinfo.value) == f"{target}: cannot write: folder {tmp_path / 'file'} is not a folder"
    assert (tmp_path / "file").read_text() == "keep\n"


def test_read_only_folder(tmp_path, monkeypatch):
    folder = tmp_path / "ro"
    folder.mkdir()
    (folder / "plan.json").write_text("old\n")
    folder.chmod(0o555)
    if os.access(folder, os.W_OK):
        # root writes into any folder: the refusal the OS gives everyone else, made where the
        # temporary file is created
        from stagesplit.common import fileio

        def refused(*args, **kwargs):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
        monkeypatch.setattr(fileio.os, "open", refused)
    try:
        with pytest.raises(StagesplitError, match=r"plan\.json: cannot write: Permission denied$"):
            atomic_write_text(folder / "plan.json", "new\n")
        assert (folder / "plan.json").read_text() == "old\n"
        assert os.listdir(folder) == ["plan.json"]
    finally:
        folder.chmod(0o755)


def test_file_sha256(tmp_path):
    (tmp_path / "abc").write_bytes(b"abc")
    assert file_sha256(tmp_path / "abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    (tmp_path / "empty").write_bytes(b"")
    assert file_sha256(tmp_path / "empty") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    big = bytes(range(256)) * 5000 + b"tail"                # more than one 1 MiB chunk
    (tmp_path / "big").write_bytes(big)
    assert file_sha256(str(tmp_path / "big")) == hashlib.sha256(big).hexdigest()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes")
def test_file_sha256_of_a_pipe_is_none(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    assert file_sha256(tmp_path / "pipe") is None           # and it does not block reading it
