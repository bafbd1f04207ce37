"""The comment header every export starts with: the profile, its hash, its precision where it
records one, the objective, and each stage's layers and memory. Every name in it is escaped by ``render.comment``; its first two
lines are fixed text, so no name can reach the place where Python looks for a coding cookie."""

from __future__ import annotations

from ._plan_view import PlanView
from .render import comment

__all__ = ["header_lines", "SAFETY_LINE"]

#: the header's second line (fixed text: Python reads a ``coding:`` cookie from lines 1 and 2)
SAFETY_LINE = "names from the plan are escaped below (\\n, \\x.., \\u....): they are comments and data, never code"


def _bytes(n: float) -> str:
    if n >= 2**30:
        return f"{n / 2**30:,.2f} GiB"
    return f"{n / 2**20:,.2f} MiB" if n >= 2**20 else f"{int(n):,} bytes"


def header_lines(view: PlanView, fmt: str) -> list[str]:
    """The header's lines (without the comment marker), every plan text escaped."""
    synthetic = " (synthetic)" if view.synthetic else ""
    source = f" from {comment(view.profile_path)}" if view.profile_path else ""
    lines = [f"stagesplit export --to {fmt}", SAFETY_LINE,
             f"profile: {comment(view.profile_name or '?')}{synthetic}{source}, target {comment(view.target or '?')}",
             f"profile sha256: {comment(view.sha256 or 'not recorded')}"]
    if view.parameter_dtype:                      # a capture records the precision it ran in
        lines.append(f"precision: {view.precision_text}, as captured and priced")
    sched = (f", schedule {comment(view.schedule)} with {view.micro_batches} micro-batches"
             if view.schedule != "none" else "")
    head = f", {view.headroom:.0%} headroom" if view.headroom else ""
    lines.append(f"objective: {comment(view.objective or '?')}{sched}{head}; status: {comment(view.status)}; "
                 f"split: {comment(view.split_text)}")
    names, paths = view.layer_names, view.module_paths
    tile_note = "" if view.tiles == 1 else " at the worst tile"
    for s in view.stages:
        first, last = s.layers[0], s.layers[-1]
        if len(s.layers) <= 8:
            layers = " ".join(comment(names[i]) for i in s.layers)
        else:
            layers = f"{comment(names[first])}..{comment(names[last])} ({len(s.layers)} layers)"
        where = ""
        if paths[first]:
            where = f" [{comment(paths[first])}{' .. ' + comment(paths[last]) if last != first and paths[last] else ''}]"
        share = f" ({s.worst_tile_bytes / s.capacity_bytes:.1%})" if s.capacity_bytes else ""
        flight = f"; {s.in_flight} micro-batches in flight" if s.in_flight > 1 else ""
        if s.memory_proportion is not None:
            flight += f"; memory proportion {s.memory_proportion:g} (its profile variant's)"
        lines.append(f"stage {s.index} on device {s.device}: layer{'s' if len(s.layers) > 1 else ''} {layers}{where}; "
                     f"memory {_bytes(s.worst_tile_bytes)} of {_bytes(s.capacity_bytes)}{share}{tile_note}{flight}")
    return lines
