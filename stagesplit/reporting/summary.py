"""Readable summaries of plans, comparisons and sweeps (text tables, or JSON for machines)."""

from __future__ import annotations

from typing import Sequence

from ..plan.records import Plan
from ..solver.problem import bubble_fraction
from ..common.safeinput import one_line
from .table import Column, Table


def seconds_text(seconds: float) -> str:
    """A duration in ms from 0.1 ms up (0.363 ms, 2.8 ms), else in us or ns (30 ns, not 3e-05 ms)."""
    if abs(seconds) >= 1e-4 or seconds == 0:
        return f"{seconds * 1e3:.3g} ms"
    if abs(seconds) >= 1e-6:
        return f"{seconds / 1e-6:.3g} us"
    return f"{seconds / 1e-9:.3g} ns"


def _time(plan: Plan, compute: float, seconds: float | None) -> str:
    if seconds is not None:
        return f"{compute:.4g} {plan.compute_unit} ({seconds_text(seconds)})"
    return f"{compute:.4g} {plan.compute_unit}"


def status_line(plan: Plan) -> str:
    if not plan.feasible:
        return f"status: {plan.status} - {plan.message}"
    phases = "; ".join(f"{p.quantity} {p.status.lower()}" + (f" (gap {100 * p.gap:.2f}%)" if p.gap else "")
                       for p in plan.phases)
    by_dp = any(p.proof != "cp-sat" for p in plan.phases)
    proven = ("NOT proven optimal" if plan.status != "optimal" else
              "proven optimal by the exact DP" if by_dp else "proven optimal by CP-SAT")
    seconds = plan.run.get("solver_seconds")
    text = f"status: {plan.status}, {proven}" + (f" in {seconds:.2f} s" if seconds is not None else "")
    text += f" [{phases}]" if phases else ""
    if plan.message:
        text += f"\nnote: {plan.message}"
    return text


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


def plan_summary(plan: Plan, micro_batches: int = 1, gpu: bool = False) -> str:
    """The plan in a few lines; names from the input (layers, notes) are escaped, so each line
    stays one line whatever the names hold."""
    lines = [f"split: {plan.short_split_text(200)}" if plan.stages else "split: none", *status_line(plan).split("\n")]
    lines += [f"note: {n}" for n in plan.notes]
    if plan.stages:
        b = plan.bottleneck
        w = plan.worst_memory
        lines.append(f"bottleneck: stage {b.stage} (layers {b.layers[0]}..{b.layers[-1]}): "
                     f"{_time(plan, b.stage_time, b.time_s)}"
                     + (" with transfers" if plan.inputs.get("communication") else ""))
        where = (f"{w.worst_tile_bytes / 2**30:,.2f} of {w.capacity_bytes / 2**30:,.2f} GiB" if gpu else
                 f"{w.worst_tile_bytes:,} of {w.capacity_bytes:,} bytes on tile {w.worst_tile}")
        lines.append(f"memory: fullest stage {w.stage} uses {where} ({w.worst_tile_bytes / w.capacity_bytes:.1%}); "
                     f"{len(plan.stages)} of {plan.devices} devices used")
        if len(plan.stages) < plan.devices and plan.inputs.get("schedule") == "1f1b":
            lines.append("note: with 1F1B, stage s of P holds min(M, P - s) micro-batches, so more stages put more "
                         "stashed activations on the first ones; here more devices do not fit or do not help")
        balance = plan.pipeline_efficiency(1) / (1 - bubble_fraction(len(plan.stages), 1))
        text = f"compute balance: {balance:.1%} (mean stage compute / bottleneck)"
        if micro_batches > 1:
            text += (f"; pipeline efficiency with {micro_batches} micro-batches: "
                     f"{plan.pipeline_efficiency(micro_batches):.1%} (bubble "
                     f"{bubble_fraction(len(plan.stages), micro_batches):.1%})")
        lines.append(text)
    return "\n".join(one_line(line) for line in lines)


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
    if rows and rows[0].plan.inputs.get("micro_batches_auto"):
        t.note = (f"--micro-batches not given: each row uses as many micro-batches as devices (the fewest that "
                  f"fill its {rows[0].plan.inputs.get('schedule')} pipeline)")
    elif rows and rows[0].plan.notes:
        t.note = rows[0].plan.notes[0]
    return t
