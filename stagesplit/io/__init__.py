"""Profile readers and writers. ``load_profile`` picks the reader from the file itself, so
nothing downstream needs to know which reader made a Profile. Each reader is imported when a
file needs it: a JSON profile's solve does not load the compact format (zip, its array rules,
the PopVision exporter's shared tables)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

from ..common.fileio import atomic_write_text
from ..common.safeinput import InputFile
from ..common.text import show
from ..errors import ProfileError, StagesplitError
from .jsonprofile import dumps_profile, read_json_profile
from .limits import check_profile_limits
from .profile import Profile

__all__ = ["COMPACT_SUFFIXES", "load_profile", "save_profile"]

COMPACT_SUFFIXES = (".stagesplit", ".npz")


def load_profile(path: str | Path, debug: str | Path | None = None,
                 progress: Callable[[int, int], None] | None = None) -> Profile:
    """Read a JSON profile, a compact ``.stagesplit`` profile, or a PopVision ``profile.pop``
    (with its ``debug.cbor``; needs the Poplar SDK's libpva). ``progress(done, total)`` is
    called while a large PopVision profile loads."""
    path = Path(path)
    if not path.exists():
        raise StagesplitError(f"{show(path)}: no such file")
    if path.is_dir():
        raise StagesplitError(f"{show(path)}: is a folder, expected a profile file")
    if path.suffix == ".pop":
        from .popvision import read_popvision
        profile = read_popvision(path, debug, progress)
        profile.info.path = str(path)
        return check_profile_limits(profile, str(path))
    if debug is not None:
        raise StagesplitError(f"{show(debug)}: a debug.cbor file only goes with a PopVision profile.pop, "
                              f"not with {show(path.name)}")
    # opened once: the format is sniffed from the same handle that is then read to the end (a
    # FIFO or process substitution cannot be reopened), and a pipe or device is read with a cap
    with InputFile(path, "profile") as f:
        head = f.head(64)
        reader: Callable[[Path, bytes], Profile]
        if head.startswith(b"PK"):
            from .compact import read_compact
            reader = read_compact
        elif head.removeprefix(b"\xef\xbb\xbf").lstrip()[:1] in (b"{", b"["):   # a UTF-8 byte order mark may lead
            reader = read_json_profile
        else:
            raise StagesplitError(f"{show(path)}: not a profile: expected stagesplit JSON, a compact .stagesplit "
                                  "file or a PopVision profile.pop")
        data = f.read_all(None)
    digest = hashlib.sha256(data).hexdigest()           # the plan's record of its input, from the one read
    profile = reader(path, data)
    del data
    profile.info.sha256 = digest
    profile.info.path = str(path)
    try:
        return check_profile_limits(profile, str(path))
    except ProfileError as exc:                         # a compact file: name the array holding the field too
        if not head.startswith(b"PK"):
            raise
        from .compact import with_compact_field
        gt = profile.ground_truth
        raise with_compact_field(exc, categories=list(gt.categories) if gt is not None else None) from None


def save_profile(profile: Profile, path: str | Path) -> None:
    """Write ``profile`` atomically: compact form for .stagesplit/.npz, JSON for anything else."""
    path = Path(path)
    if path.suffix in COMPACT_SUFFIXES:
        from .compact import write_compact
        write_compact(profile, path)
    else:
        atomic_write_text(path, dumps_profile(profile))
