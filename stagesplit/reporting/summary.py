"""Tables of plans, comparisons and sweeps (a plan's own text summary is ``Plan.summary``)."""

from __future__ import annotations

from typing import Sequence

from ..plan.records import Plan
from ..solver.problem import bubble_fraction
from .table import Column, Table

__all__ = ["comparison_table", "stages_table", "sweep_table"]


def stages_table(plan: Plan) -> Table:
    t = Table(f"Stages ({plan.method})",
              [Column("stage", "id"), Column("device", "id"), Column("layers"), Column("in flight", "int"),
               Column("worst tile", "id"), Column("worst tile bytes", "int"), Column("of capacity", "percent"),
               Column("variables", "int"), Column("stashed copies", "int"), Column("code+state", "int"),
               Column(f"compute ({plan.compute_unit})", "compute"), Column("time (ms)", "float"),
               Column("received", "bytes"), Column("sent", "bytes")])
    for s in plan.stages:
        at = s.memory_at_worst_tile
        code = at.vertex_code + at.vertex_state + at.exchange_code + at.control_code
        span = s.layers[0] if len(s.layers) == 1 else f"{s.layers[0]}..{s.layers[-1]} ({len(s.layers)})"
        t.add(s.stage, s.device, span, s.in_flight, s.worst_tile, s.worst_tile_bytes,
              s.worst_tile_bytes / s.capacity_bytes if s.capacity_bytes else None,
              at.always_live + at.not_always_live, at.stashed_copies, code,
              s.compute, s.time_s * 1e3 if s.time_s is not None else None, s.bytes_received, s.bytes_sent)
    return t


def comparison_table(plans: Sequence[Plan]) -> Table:
    t = Table("Comparison", [Column("method"), Column("fits"), Column("devices used", "int"), Column("split"),
                             Column("bottleneck compute", "compute"), Column("worst tile bytes", "int"),
                             Column("vs optimal (compute)", "float"), Column("vs optimal (memory)", "float")])
    best = next((p for p in plans if p.method == "cp-sat" and p.stages), None)
    for p in plans:
        if not p.stages:
            t.add(p.method, "no", 0, "-", None, None, None, None)
            continue
        worst = max(s.worst_tile_bytes for s in p.stages)
        ratio_c = p.bottleneck.compute / best.bottleneck.compute if best and best.bottleneck.compute else None
        ratio_m = worst / max(s.worst_tile_bytes for s in best.stages) if best else None
        t.add(p.method, "yes" if p.feasible else "NO", len(p.stages), p.short_split_text(), p.bottleneck.compute, worst,
              ratio_c, ratio_m)
    t.note = "vs optimal: the method's figure divided by the optimal plan's (1.000 = as good)"
    return t


def sweep_table(rows: Sequence) -> Table:
    t = Table("Devices sweep", [Column("devices", "id"), Column("fits"), Column("used", "int"),
                                Column("bottleneck compute", "compute"), Column("bottleneck ms", "float"),
                                Column("efficiency", "percent"), Column("bubble", "percent"),
                                Column("worst memory", "percent"), Column("status"), Column("split")])
    for r in rows:
        p = r.plan
        if not p.stages:
            t.add(r.devices, "no", 0, None, None, None, None, None, p.status, p.message)
            continue
        b, w = p.bottleneck, p.worst_memory
        t.add(r.devices, "yes", len(p.stages), b.compute, b.time_s * 1e3 if b.time_s is not None else None,
              p.pipeline_efficiency(r.micro_batches), bubble_fraction(len(p.stages), r.micro_batches),
              w.worst_tile_bytes / w.capacity_bytes, p.status, p.short_split_text())
    if rows and rows[0].plan.inputs.micro_batches_auto:
        t.note = (f"--micro-batches not given: each row uses as many micro-batches as devices (the fewest that "
                  f"fill its {rows[0].plan.inputs.schedule.value} pipeline)")
    elif rows and rows[0].plan.notes:
        t.note = rows[0].plan.notes[0]
    return t
