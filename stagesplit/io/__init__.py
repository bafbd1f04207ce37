"""Profile readers and writers. ``load_profile`` picks the reader from the file itself, so
nothing downstream needs to know which reader made a Profile."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

from ..common.fileio import atomic_write_text
from ..common.safeinput import InputFile
from ..common.text import show
from ..errors import ProfileError, StagesplitError
from .jsonprofile import dumps_profile
from .limits import check_profile_limits
from .profile import Profile
from .variantfile import read_json_variants
from .variants import ParallelVariants, parallel_variants

__all__ = ["COMPACT_SUFFIXES", "ParallelVariants", "load_profile", "load_variants", "save_profile"]

COMPACT_SUFFIXES = (".stagesplit", ".npz")


def load_profile(path: str | Path, debug: str | Path | None = None,
                 progress: Callable[[int, int], None] | None = None) -> Profile:
    """Read a JSON profile, a compact ``.stagesplit`` profile, or a PopVision ``profile.pop``
    (with its ``debug.cbor``; needs the Poplar SDK's libpva). ``progress(done, total)`` is
    called while a large PopVision profile loads. A file holding one profile per
    tensor-parallel degree (``load_variants``) is refused in one line naming its degrees."""
    variants = load_variants(path, debug, progress)
    if len(variants.profiles) > 1:
        degrees = ", ".join(map(str, variants.degrees))
        raise StagesplitError(f"{show(path)}: holds one rank's profile at each of {len(variants.profiles)} "
                              f"tensor-parallel degrees ({degrees}); this command takes one profile (the layout "
                              "search and breakdown take the file whole)")
    return variants.profiles[0]


def load_variants(path: str | Path, debug: str | Path | None = None,
                  progress: Callable[[int, int], None] | None = None) -> ParallelVariants:
    """Every profile a file holds, by tensor-parallel degree (io/variantfile.py): one for a file
    of one profile, one per degree for a file a capture at several degrees wrote. Each has the
    file's path and SHA-256 and is checked against the limits."""
    path = Path(path)
    if not path.exists():
        raise StagesplitError(f"{show(path)}: no such file")
    if path.is_dir():
        raise StagesplitError(f"{show(path)}: is a folder, expected a profile file")
    if path.suffix == ".pop":
        from .popvision import read_popvision
        profile = read_popvision(path, debug, progress)
        profile.info.path = str(path)
        return ParallelVariants((check_profile_limits(profile, str(path)),))
    if debug is not None:
        raise StagesplitError(f"{show(debug)}: a debug.cbor file only goes with a PopVision profile.pop, "
                              f"not with {show(path.name)}")
    # opened once: the format is sniffed from the same handle that is then read to the end (a
    # FIFO or process substitution cannot be reopened), and a pipe or device is read with a cap
    with InputFile(path, "profile") as f:
        head = f.head(64)
        compact = head.startswith(b"PK")
        if not compact and head.removeprefix(b"\xef\xbb\xbf").lstrip()[:1] not in (b"{", b"["):
            # (a UTF-8 byte order mark may lead a JSON document)
            raise StagesplitError(f"{show(path)}: not a profile: expected stagesplit JSON, a compact .stagesplit "
                                  "file or a PopVision profile.pop")
        data = f.read_all(None)
    digest = hashlib.sha256(data).hexdigest()           # the plan's record of its input, from the one read
    if compact:            # (the compact readers, numpy's zip of arrays, imported for compact files only)
        from .compact import read_compact
        from .variantfile import read_compact_variants
        found = read_compact_variants(path, data)
        profiles = found if found is not None else (read_compact(path, data),)
    else:
        profiles = read_json_variants(path, data)
    del data
    for profile in profiles:
        profile.info.sha256 = digest
        profile.info.path = str(path)
        try:
            check_profile_limits(profile, str(path))
        except ProfileError as exc:                     # a compact file: name the array holding the field too
            if not compact or len(profiles) > 1:
                raise
            from .compact import with_compact_field
            gt = profile.ground_truth
            raise with_compact_field(exc, categories=list(gt.categories) if gt is not None else None) from None
    return parallel_variants(profiles, show(path)) if len(profiles) > 1 else ParallelVariants(profiles)


def save_profile(profile: Profile | ParallelVariants, path: str | Path) -> None:
    """Write ``profile`` atomically: compact form for .stagesplit/.npz, JSON for anything else;
    variants by tensor-parallel degree as one file of either form (io/variantfile.py)."""
    from .compact import write_compact
    from .variantfile import write_variants
    path = Path(path)
    if isinstance(profile, ParallelVariants):
        write_variants(profile, path, compact=path.suffix in COMPACT_SUFFIXES)
    elif path.suffix in COMPACT_SUFFIXES:
        write_compact(profile, path)
    else:
        atomic_write_text(path, dumps_profile(profile))
