"""Atomic file output: write to a temporary file beside the target, then rename over it, so a
reader never sees a half-written file and an interrupted run leaves the old file intact."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from ..errors import StagesplitError
from .interrupt import deferred_signals
from .text import show

__all__ = ["atomic_output", "atomic_write_bytes", "atomic_write_text", "file_sha256"]


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file renamed over it. Ctrl-C (or SIGTERM)
    arriving meanwhile is held until the temporary file is gone: before the rename the write
    is abandoned (the old file stays), then the interrupt takes effect."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        problem = "is not a folder" if directory.exists() else "does not exist"
        raise StagesplitError(f"{show(path)}: cannot write: folder {show(directory)} {problem}")
    with deferred_signals() as interrupted:
        try:
            fd, tmp = _temporary_beside(path, directory)
        except OSError as exc:
            raise StagesplitError(f"{show(path)}: cannot write: {exc.strerror or exc}") from None
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp, 0o644)
            if interrupted():
                raise KeyboardInterrupt
            os.replace(tmp, path)
        except OSError as exc:
            _remove(tmp)
            raise StagesplitError(f"{show(path)}: cannot write: {exc.strerror or exc}") from None
        except BaseException:
            _remove(tmp)
            raise


@contextmanager
def atomic_output(path: str | Path) -> Iterator[BinaryIO]:
    """A binary file to write ``path`` through, for output too large to hold as one bytes
    object: a temporary file beside it, renamed over it when the block ends without an error
    (as ``atomic_write_bytes`` does); an error or Ctrl-C while writing removes it and leaves
    the old file as it was."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        problem = "is not a folder" if directory.exists() else "does not exist"
        raise StagesplitError(f"{show(path)}: cannot write: folder {show(directory)} {problem}")
    try:
        fd, tmp = _temporary_beside(path, directory)
    except OSError as exc:
        raise StagesplitError(f"{show(path)}: cannot write: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w+b") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        with deferred_signals() as interrupted:
            if interrupted():
                raise KeyboardInterrupt
            os.replace(tmp, path)
    except OSError as exc:
        _remove(tmp)
        raise StagesplitError(f"{show(path)}: cannot write: {exc.strerror or exc}") from None
    except BaseException:
        _remove(tmp)
        raise


#: how the temporary file is opened: new (never an existing file or a link), for this user only
_TEMPORARY_FLAGS = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | \
    getattr(os, "O_BINARY", 0)


def _temporary_beside(path: Path, directory: Path) -> tuple[int, str]:
    """A new file ``.NAME.<random>.tmp`` in ``directory``, open for writing, mode 0600: what
    ``tempfile.mkstemp`` makes, without importing tempfile (which brings shutil, random, bz2 and
    lzma: 5 ms of every command)."""
    for _ in range(100):
        tmp = os.path.join(directory, f".{path.name}.{os.urandom(6).hex()}.tmp")
        try:
            return os.open(tmp, _TEMPORARY_FLAGS, 0o600), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no unused temporary name in {directory}")


def _remove(tmp: str) -> None:
    try:
        os.unlink(tmp)
    except OSError:
        pass


def atomic_write_text(path: str | Path, text: str) -> None:
    """UTF-8 text; characters UTF-8 cannot hold (lone surrogates from JSON escapes in names)
    are written as backslash escapes rather than failing the write."""
    atomic_write_bytes(path, text.encode("utf-8", "backslashreplace"))


def file_sha256(path: str | Path) -> str | None:
    """The file's SHA-256; None for a pipe or device (it cannot be read a second time)."""
    import hashlib
    import stat
    if not stat.S_ISREG(os.stat(path).st_mode):
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
