"""Command-line guards: bounded numeric option types, and checks of every output path before
any work is done or any file is written (so a bad ``--plot`` cannot be found only after
``--out`` was replaced, and no output can overwrite an input)."""

from __future__ import annotations

import argparse
import math
import os
import stat
from pathlib import Path
from typing import Callable, Iterable

from ..errors import StagesplitError
from .safeinput import show


def int_in(lo: int, hi: int) -> Callable[[str], int]:
    """An argparse type: a whole number in lo..hi."""
    def parse(text: str) -> int:
        try:
            value = int(text.strip()) if len(text) <= 30 else None
        except ValueError:
            value = None
        if value is None or not lo <= value <= hi:
            bounds = f"<= {hi:,}" if lo <= -2**63 else f"in {lo}..{hi:,}"
            raise argparse.ArgumentTypeError(f"expected a whole number {bounds}, got {show(text)[:40]!r}")
        return value
    parse.__name__ = "integer"
    return parse


def float_in(lo: float, hi: float, *, low_open: bool = False, high_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number in the interval (brackets as given)."""
    left, right = "(" if low_open else "[", ")" if high_open else "]"

    def parse(text: str) -> float:
        try:
            value = float(text) if len(text) <= 40 else math.nan
        except ValueError:
            value = math.nan
        ok = math.isfinite(value) and (value > lo if low_open else value >= lo) and \
            (value < hi if high_open else value <= hi)
        if not ok:
            raise argparse.ArgumentTypeError(f"expected a finite number in {left}{lo:g}, {hi:g}{right}, "
                                             f"got {show(text)[:40]!r}")
        return value
    parse.__name__ = "number"
    return parse


def device_counts(text: str, limit: int) -> list[int]:
    """``1..16`` or ``2,4,8``: device counts in 1..limit, checked before any list is built."""
    bad = StagesplitError(f"--devices: expected a range like 1..16 or a list like 2,4,8 of counts in 1..{limit:,}, "
                          f"got {show(text)[:40]!r}")
    if len(text) > 10_000:
        raise bad
    try:
        if ".." in text:
            lo_text, hi_text = text.split("..", 1)
            lo, hi = int(lo_text), int(hi_text)
            if not 1 <= lo <= hi <= limit:
                raise bad
            return list(range(lo, hi + 1))
        counts = [int(x) for x in text.split(",")]
    except ValueError:
        raise bad from None
    if not counts or min(counts) < 1 or max(counts) > limit:
        raise bad
    return counts


def _same(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def check_outputs(outputs: Iterable[tuple[str, str | None, tuple[str, ...] | None]],
                  inputs: Iterable[str | None]) -> None:
    """Refuse, before anything is read or written: an output in a missing folder, one that is
    a folder or a device, one with a suffix its writer cannot make, one that is also an input
    (``--out`` equal to the profile would destroy it), and two outputs to the same file."""
    seen: dict[str, str] = {}
    input_paths = [Path(p) for p in inputs if p]
    for flag, value, suffixes in outputs:
        if not value:
            continue
        path = Path(value)
        if suffixes is not None and path.suffix.lower() not in suffixes:
            raise StagesplitError(f"{flag} {show(value)}: expected a file name ending in {' or '.join(suffixes)}")
        directory = path.parent if str(path.parent) else Path(".")
        if not directory.is_dir():
            problem = "is not a folder" if directory.exists() else "does not exist"
            raise StagesplitError(f"{flag} {show(value)}: cannot write: folder {show(directory)} {problem}")
        if path.exists() or path.is_symlink():
            try:
                mode = os.stat(path).st_mode
            except OSError:
                mode = None
            if mode is not None and stat.S_ISDIR(mode):
                raise StagesplitError(f"{flag} {show(value)}: is a folder, expected a file name")
            if mode is not None and not stat.S_ISREG(mode):
                raise StagesplitError(f"{flag} {show(value)}: is not a regular file; outputs are written by "
                                      "replacing a regular file")
        for source in input_paths:
            if _same(path, source) or path.resolve() == source.resolve():
                raise StagesplitError(f"{flag} {show(value)}: is also an input ({show(source)}); writing it would "
                                      "destroy that input: choose another file name")
        key = str(path.resolve())
        if key in seen:
            raise StagesplitError(f"{flag} {show(value)}: is also the {seen[key]} output: choose different files")
        seen[key] = flag
