"""Guards: device counts in range, and checks of every output path before any work is done or
any file is written (so a bad plot path cannot be found only after the plan file was replaced,
and no output can overwrite an input). The command line's own (which of its arguments name
files) are in cli/files.py."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from ..errors import OptionError
from .text import show

__all__ = ["device_counts", "gpu_counts", "same_file", "capture_inputs", "check_outputs"]


def _counts(text: str, limit: int, bad: OptionError) -> tuple[int, int] | list[int]:
    """``lo..hi`` as (lo, hi) or ``a,b,c`` as a list, every count in 1..limit (else ``bad``), checked
    before any list is built: the command line's forms of device and GPU counts."""
    if len(text) > 10_000:
        raise bad
    try:
        if ".." in text:
            lo_text, hi_text = text.split("..", 1)
            lo, hi = int(lo_text), int(hi_text)
            if not 1 <= lo <= hi <= limit:
                raise bad
            return lo, hi
        counts = [int(x) for x in text.split(",")]
    except ValueError:
        raise bad from None
    if not counts or min(counts) < 1 or max(counts) > limit:
        raise bad
    return counts


def device_counts(text: str, limit: int) -> list[int]:
    """``1..16`` or ``2,4,8``: device counts in 1..limit, checked before any list is built."""
    bad = OptionError("devices", f"expected a range like 1..16 or a list like 2,4,8 of counts in 1..{limit:,}, "
                      f"got {show(text)[:40]!r}")
    counts = _counts(text, limit, bad)
    return list(range(counts[0], counts[1] + 1)) if isinstance(counts, tuple) else counts


def gpu_counts(text: str, limit: int) -> list[int]:
    """GPU counts for the layout sweep: ``8..64``, the powers of two from 8 to 64 (clusters come in
    nodes of a power of two), or a list ``8,16,24`` as given; in 1..limit, checked before any list
    is built."""
    bad = OptionError("gpus", f"expected a range like 8..64 (its powers of two) or a list like 8,16,24 of counts in "
                      f"1..{limit:,}, got {show(text)[:40]!r}")
    counts = _counts(text, limit, bad)
    if isinstance(counts, tuple):
        lo, hi = counts
        powers = [1 << k for k in range(hi.bit_length()) if lo <= 1 << k <= hi]
        if not powers:
            raise OptionError("gpus", f"no power of two lies in {lo}..{hi}: give a list like {lo},{hi}")
        return powers
    return list(dict.fromkeys(counts))


def _identity(path: str | Path) -> tuple[int, int] | None:
    """(device, inode) of the file ``path`` names, through symlinks; None when it names nothing."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):           # missing, a symlink loop, a name too long, a NUL byte
        return None
    return st.st_dev, st.st_ino


def _real(path: str | Path) -> str:
    """``path`` with every symlink resolved, as far as it exists (never raises on a loop)."""
    try:
        return os.path.realpath(os.path.abspath(path))
    except (OSError, ValueError):
        return os.path.abspath(path)


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether ``a`` and ``b`` are one file: the same device and inode (hard links, symlinks,
    bind mounts), or, where one does not exist yet, the same path once symlinks are resolved."""
    ida, idb = _identity(a), _identity(b)
    if ida is not None and idb is not None:
        return ida == idb
    return _real(a) == _real(b)


def capture_inputs(spec: str | None) -> list[str]:
    """The source files a ``capture`` MODEL names: ``file.py:function`` gives the file;
    ``package.module:function`` the module's file (and its packages' ``__init__.py``), found the
    way ``import`` would find them but without running anything."""
    if not spec:
        return []
    where, sep, _ = spec.rpartition(":")
    if not sep or not where:
        return []
    if where.endswith(".py") or "/" in where or "\\" in where:
        return [where]
    import importlib.machinery
    import sys
    files: list[str] = []
    search: list[str] | None = None
    parts = where.split(".")
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        if not all(part.isidentifier() for part in parts[:depth]):
            break
        try:
            spec_ = importlib.machinery.PathFinder.find_spec(name, search if depth > 1 else
                                                             [p or os.getcwd() for p in sys.path])
        except (ImportError, OSError, ValueError):
            break
        if spec_ is None:
            break
        if spec_.origin and spec_.has_location:
            files.append(spec_.origin)
        search = list(spec_.submodule_search_locations or [])
        if not search and depth < len(parts):
            break
    return files


def check_outputs(outputs: Iterable[tuple[str, str | None, tuple[str, ...] | None]],
                  inputs: Iterable[str | Path | None]) -> None:
    """Refuse, before anything is read or written: an output in a missing folder, one that is
    a folder or a device, one with a suffix its writer cannot make, one that is also an input
    (``out`` equal to the profile would destroy it: same device and inode, through symlinks
    and hard links, or the same resolved path for a file not made yet), and two outputs to the
    same file."""
    seen: list[tuple[str, str]] = []
    input_paths = [str(p) for p in inputs if p]
    for flag, value, suffixes in outputs:
        if not value:
            continue
        parameter = flag.lstrip("-").replace("-", "_")        # the API's name; the CLI shows its flag

        def refuse(message: str, parameter: str = parameter, value: str = value) -> None:
            raise OptionError(parameter, message, subject=show(value))

        path = Path(value)
        if suffixes is not None and path.suffix.lower() not in suffixes:
            refuse(f"expected a file name ending in {' or '.join(suffixes)}")
        for source in input_paths:
            if same_file(path, source):
                refuse(f"is also an input ({show(source)}); writing it would destroy that input: choose another "
                       "file name")
        directory = path.parent if str(path.parent) else Path(".")
        if not _is_dir(directory):
            problem = "is not a folder" if _exists(directory) else "does not exist"
            refuse(f"cannot write: folder {show(directory)} {problem}")
        try:
            mode = os.stat(path).st_mode
        except (OSError, ValueError):
            mode = None
        if mode is not None and stat.S_ISDIR(mode):
            refuse("is a folder, expected a file name")
        if mode is not None and not stat.S_ISREG(mode):
            refuse("is not a regular file; outputs are written by replacing a regular file")
        for other_flag, other in seen:
            if same_file(path, other):
                refuse(f"is also the {other_flag} output: choose different files")
        seen.append((flag, value))


def _is_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def _exists(path: Path) -> bool:
    try:
        os.stat(path)
        return True
    except (OSError, ValueError):
        return False
