"""Atomic file output: write to a temporary file beside the target, then rename over it, so a
reader never sees a half-written file and an interrupted run leaves the old file intact."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import StagesplitError


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        problem = "is not a folder" if directory.exists() else "does not exist"
        raise StagesplitError(f"{path}: cannot write: folder {directory} {problem}")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise StagesplitError(f"{path}: cannot write: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise StagesplitError(f"{path}: cannot write: {exc.strerror or exc}") from None
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))
