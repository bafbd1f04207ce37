"""Plain-text pieces of a plan's description: the split as layer names with bars, durations."""

from __future__ import annotations

__all__ = ["fewest_text", "joined", "seconds_text", "split_text", "step_text"]


def split_text(names: list[str], ranges: list[tuple[int, int]], width: int | None = None) -> str:
    """``[ 0 1 2 | 3 4 5 ]``: layer names with a bar at every split. With ``width``, stages of
    more than two layers are shortened to ``first..last`` when the full text is longer."""
    if not ranges:
        return "none"
    full = "[ " + " | ".join(" ".join(names[a:b + 1]) for a, b in ranges) + " ]"
    if width is None or len(full) <= width:
        return full
    return "[ " + " | ".join(" ".join(names[a:b + 1]) if b - a < 2 else f"{names[a]}..{names[b]}"
                             for a, b in ranges) + " ]"


def step_text(value: float, unit: str) -> str:
    """A step time precise enough to tell two schedules apart: whole ms from a second up
    (2,169 ms), four significant figures below (5.142 ms); other units as they are."""
    if unit != "seconds":
        return f"{value:,.6g} {unit}"
    ms = value * 1e3
    return f"{ms:,.0f} ms" if ms >= 1000 else f"{ms:.4g} ms"


def seconds_text(seconds: float) -> str:
    """A duration in ms from 0.1 ms up (0.363 ms, 2.8 ms), else in us or ns (30 ns, not 3e-05 ms)."""
    if abs(seconds) >= 1e-4 or seconds == 0:
        return f"{seconds * 1e3:.3g} ms"
    if abs(seconds) >= 1e-6:
        return f"{seconds / 1e-6:.3g} us"
    return f"{seconds / 1e-9:.3g} ns"


def joined(items: list[str], word: str) -> str:
    """``a, b and c`` (``word`` before the last item)."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + f" {word} {items[-1]}"


def fewest_text(noun: str, scope: str, fits: list[int], unknown: list[int]) -> str:
    """A sweep's last line: the fewest ``noun`` (devices, GPUs) found to fit among the counts that
    ``fits``, naming any fewer whose search the time limit left ``unknown`` (one may fit); else that
    no count in the ``scope`` fits, or that none was found to."""
    fewest = min(fits, default=None)
    left = ", ".join(str(n) for n in unknown if fewest is None or n < fewest)
    if fewest is not None:
        return f"fewest {noun} that fit: {fewest}" + (f" (the time limit left {left} unknown: fewer may fit)"
                                                      if left else "")
    singular = noun[:-1] if noun.endswith("s") else noun
    if left:
        return f"no {singular} count in the {scope} was found to fit: the time limit left {left} unknown"
    return f"no {singular} count in the {scope} fits"
