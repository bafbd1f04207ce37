"""A pipeline schedule's simulated step as plain text: one row per rank, one column per unit of
time, each cell the leaf action running. The tests and docs/schedules.md compare these pictures
with timelines worked out by hand; the plots of the same step are in ``timeline``.
"""

from __future__ import annotations

from ..solver.schedule_generation import ScheduleInstance
from ..solver.schedule_simulation import Simulation

__all__ = ["timeline_text"]


def timeline_text(schedule: ScheduleInstance, simulation: Simulation, unit: float = 1.0) -> str:
    """The step as text, one row per rank and one column per ``unit`` of time: each column shows
    the leaf action running (``F3`` is micro-batch 3's forward; where the rank holds more than
    one chunk, the chunk follows after a dot, e.g. ``B3.5``); ``.`` marks idle time."""
    columns = int(round(simulation.step_time / unit))
    rows = []
    for r, leaves in enumerate(schedule.leaves):
        cells = ["."] * columns
        multi = len(schedule.rank_chunks(r)) > 1
        for a, s, e in zip(leaves, simulation.start[r], simulation.end[r]):
            label = f"{a.op.value}{a.micro_batch}" + (f".{a.chunk}" if multi else "")
            for k in range(int(round(s / unit)), int(round(e / unit))):
                cells[k] = label
        rows.append(cells)
    width = 1 + max((len(cell) for cells in rows for cell in cells), default=1)
    return "\n".join(f"rank {r} | " + "".join(cell.ljust(width) for cell in cells).rstrip()
                     for r, cells in enumerate(rows))
