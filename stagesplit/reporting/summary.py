"""Tables of plans, comparisons and sweeps, and ``solve``'s text (a plan's own text summary is
``Plan.summary``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..common.text import one_line
from ..plan.records import Plan
from ..solver.problem import bubble_fraction
from .table import Column, Table, gpu_view, render
from .units import device_words
from .why import compare_line, comparisons, step_ratio, why_line

__all__ = ["candidates_table", "comparison_table", "kept_back_line", "method_label", "recompute_text", "solve_text", "stages_table",
           "layout_lines", "summary_with_why", "sweep_table", "tensor_parallel_text"]


def stages_table(plan: Plan) -> Table:
    """One row per stage; on a GPU, ``gpu_view`` leaves out the per-tile and code columns and
    shows bytes in GiB. Columns a narrow terminal can spare have ``drop`` > 0."""
    timed = any(s.time_s is not None for s in plan.stages)
    recomputing = any(s.recomputed_layers for s in plan.stages)
    variants = any(s.memory_proportion is not None for s in plan.stages)
    t = Table("Stages" if plan.method == "cp-sat" else f"Stages ({method_label(plan.method)})",
              [Column("stage", "id"), Column("device", "id", 4), Column("layers"), Column("in flight", "int", 2),
               Column("worst tile", "id", 3), Column("worst tile bytes", "int"), Column("of capacity", "percent"),
               Column("variables", "int", 3), Column("stashed copies", "int", 3), Column("code+state", "int", 3),
               Column(f"compute ({plan.compute_unit})", "compute", 1 if timed else 0)]
              + ([Column("time (ms)", "float")] if timed else [])
              + [Column("received", "bytes", 5), Column("sent", "bytes", 5)]
              + ([Column("recompute"), Column("saved per micro-batch", "bytes"),
                  Column("recompute (ms)" if timed else f"recompute ({plan.compute_unit})", "float")]
                 if recomputing else [])
              + ([Column("memory proportion", "float"), Column("variant", "text", 2)] if variants else []))
    for s in plan.stages:
        at = s.memory_at_worst_tile
        code = at.vertex_code + at.vertex_state + at.exchange_code + at.control_code
        span = s.layers[0] if len(s.layers) == 1 else f"{s.layers[0]}..{s.layers[-1]} ({len(s.layers)})"
        t.add(s.stage, s.device, span, s.in_flight, s.worst_tile, s.worst_tile_bytes,
              s.worst_tile_bytes / s.capacity_bytes if s.capacity_bytes else None,
              at.always_live + at.not_always_live, at.stashed_copies, code, s.compute,
              *([s.time_s * 1e3 if s.time_s is not None else None] if timed else []), s.bytes_received, s.bytes_sent,
              *([recompute_text(s.recompute), s.recompute_saved_bytes,
                 s.recompute_time * (1e3 if timed else 1)] if recomputing else []),
              *([s.memory_proportion, s.variant] if variants else []))
    return t


def recompute_text(options) -> str:
    """A stage's recompute in a few characters: '-', 'full 3/4', 'selective 2/4, full 1/4'."""
    n = len(options)
    parts = [f"{kind} {sum(1 for o in options if o == kind)}/{n}" for kind in ("selective", "full")
             if any(o == kind for o in options)]
    return ", ".join(parts) or "-"


def method_label(method: str) -> str:
    """How the comparison names a plan's method."""
    if method == "cp-sat":
        return "stagesplit (optimal)"
    return method


def comparison_table(plans: Sequence[Plan], gpu: bool = False) -> Table:
    """The optimal plan (first) against the alternatives, each priced by the same cost model:
    its split, the slowest stage, the fullest stage's memory (the device's on a GPU, the worst
    tile's on an IPU) and both as multiples of the optimal plan's."""
    memory = Column("memory", "gib") if gpu else Column("worst tile bytes", "int")
    t = Table("Comparison (every split priced by the same cost model)",
              [Column("method"), Column("fits"), Column("stages", "int", 2), Column("split", "text", 3),
               Column("bottleneck compute", "compute"), memory,
               Column("step vs optimal", "float"), Column("memory vs optimal", "float", 1)])
    best = next((p for p in plans if p.method == "cp-sat" and p.stages), None)
    for p in plans:
        if not p.stages:
            t.add(method_label(p.method), "no", 0, "-", None, None, None, None)
            continue
        worst = max(s.worst_tile_bytes for s in p.stages)
        assert p.bottleneck is not None               # a plan with stages has one
        ratio_c = step_ratio(p, best) if best else None
        ratio_m = worst / max(s.worst_tile_bytes for s in best.stages) if best else None
        t.add(method_label(p.method), "yes" if p.feasible else "NO", len(p.stages), p.short_split_text(), p.bottleneck.compute,
              worst, ratio_c, ratio_m)
    t.note = ("vs optimal: the method's pipeline step time ((micro-batches + stages - 1) x slowest stage) or fullest "
              "stage's memory divided by the optimal plan's (1.000 = as good)")
    return t


def sweep_table(rows: Sequence, gpu: bool = False) -> Table:
    """One row per device count; on a GPU (``gpu``) the fullest stage's memory in GiB too. Rows
    solved under a schedule's own actions show the schedule, its step time and bubble."""
    if any(r.plan.schedule is not None or r.plan.inputs.request.schedule.value not in ("none", "gpipe", "1f1b")
           for r in rows):
        return _schedule_sweep_table(rows, gpu)
    t = Table("Devices sweep", [Column("devices", "id"), Column("fits"), Column("used", "int"),
                                Column("bottleneck compute", "compute", 1), Column("bottleneck ms", "float"),
                                Column("efficiency", "percent"), Column("bubble", "percent", 2),
                                Column("worst memory", "percent")] + ([Column("memory", "gib", 2)] if gpu else [])
              + [Column("status", "text", 3), Column("split")])
    for r in rows:
        p = r.plan
        if not p.stages:
            t.add(r.devices, "unknown" if r.unknown else "no", 0, None, None, None, None, None,
                  *([None] if gpu else []), p.status, p.message)
            continue
        b, w = p.bottleneck, p.worst_memory
        t.add(r.devices, "yes", len(p.stages), b.compute, b.time_s * 1e3 if b.time_s is not None else None,
              p.pipeline_efficiency(r.micro_batches), bubble_fraction(len(p.stages), r.micro_batches),
              w.worst_tile_bytes / w.capacity_bytes, *([w.worst_tile_bytes] if gpu else []), p.status,
              p.short_split_text())
    if rows and rows[0].plan.inputs.micro_batches_auto:
        t.note = (f"`micro_batches` not given: each row uses as many micro-batches as devices (the fewest that "
                  f"fill its {rows[0].plan.inputs.schedule.value} pipeline)")
    elif rows and rows[0].plan.notes:
        t.note = rows[0].plan.notes[0]
    return t


def _schedule_sweep_table(rows: Sequence, gpu: bool) -> Table:
    t = Table("Devices sweep", [Column("devices", "id"), Column("fits"), Column("schedule"), Column("M", "int", 2),
                                Column("step (ms)", "float"), Column("per micro-batch (ms)", "float", 1),
                                Column("bubble", "percent", 2),
                                Column("worst memory", "percent")] + ([Column("memory", "gib", 2)] if gpu else [])
              + [Column("recomputed layers", "int", 3), Column("status", "text", 3), Column("split")])
    for r in rows:
        p, s = r.plan, r.plan.schedule
        if not p.stages or s is None:
            t.add(r.devices, "unknown" if r.unknown else "no", None, r.micro_batches, None, None, None, None,
                  *([None] if gpu else []), None, p.status, p.message)
            continue
        fullest = max(s.ranks, key=lambda x: x.peak_bytes / max(x.capacity_bytes, 1))
        step = s.step_time * 1e3 if s.time_unit == "seconds" else s.step_time
        t.add(r.devices, "yes" if p.feasible else "NO", s.kind + (f" x{s.chunks_per_rank}" if s.chunks_per_rank > 1
                                                               else ""),
              s.micro_batches, step, step / s.micro_batches, s.bubble, fullest.peak_bytes / max(fullest.capacity_bytes, 1),
              *([fullest.peak_bytes] if gpu else []), sum(st.recomputed_layers for st in p.stages), p.status,
              p.short_split_text())
    if rows and rows[0].plan.inputs.micro_batches_auto:
        t.note = "`micro_batches` not given: each row uses as many micro-batches as chunks (devices x chunks per device)"
    return t


def candidates_table(plan: Plan) -> Table:
    """``schedule='auto'``: every schedule tried, fastest first, the plan's marked."""
    unit = plan.schedule.time_unit if plan.schedule else "seconds"
    step = Column("step (ms)" if unit == "seconds" else f"step ({unit})", "float")
    t = Table("Schedules tried (`schedule='auto'`)", [Column("schedule"), Column("chunks per device", "int"),
                                                   Column("status"), step, Column("bubble", "percent"),
                                                   Column("fullest device", "percent"), Column("solve (s)", "float", 2),
                                                   Column("note", "text", 3)])
    scale = 1e3 if unit == "seconds" else 1.0
    chosen = (plan.schedule.kind, plan.schedule.chunks_per_rank) if plan.schedule else None
    order = sorted(plan.candidates, key=lambda c: (c.step_time is None, c.step_time or 0.0))
    for c in order:
        mark = " (plan)" if (c.schedule, c.chunks_per_rank) == chosen else ""
        t.add(c.schedule + mark, c.chunks_per_rank, c.status, None if c.step_time is None else c.step_time * scale,
              c.bubble, c.worst_memory, c.seconds, c.note)
    return t


def summary_with_why(plan: Plan, gpu: bool) -> str:
    """The plan's summary with the one-line "why" under the split."""
    lines = plan.summary(plan.inputs.micro_batches, gpu=gpu).split("\n")
    why = why_line(plan, plan.analysis, device_words(plan.profile.tiles))
    if why:
        lines.insert(1, one_line(why))
    return "\n".join(lines)


def _devices_used(plan: Plan) -> int:
    return len({s.device for s in plan.stages}) if plan.stages else 0


def tensor_parallel_text(tp: int, sequence_parallel: bool, devices: int, dp: int) -> str:
    """The layout line of a plan made from one tensor-parallel rank's profile: what a pipeline device
    is, and the GPUs the plan uses in all (pipeline devices x tensor x data parallel)."""
    sp = " with sequence parallelism" if sequence_parallel else ""
    data = f" x {dp} data-parallel" if dp > 1 else ""
    return (f"tensor parallel: every pipeline device is {tp} GPUs{sp} (the profile is one of them); figures are "
            f"one GPU's; {devices} pipeline x {tp} tensor-parallel{data} = {devices * tp * dp} GPUs in all")


def layout_lines(plan: Plan) -> list[str]:
    """The lines that say a plan's layout beside the pipeline (tensor and data parallelism), as solve
    prints them and the report shows them; none for a pipeline alone."""
    p, request = plan.profile, plan.inputs.request
    lines = []
    if p.tensor_parallel > 1:
        lines.append(tensor_parallel_text(p.tensor_parallel, p.sequence_parallel, _devices_used(plan), request.dp))
    if p.context_parallel > 1:
        lines.append(f"context parallel: the profile is one of {p.context_parallel} context-parallel ranks (each holds "
                     f"1/{p.context_parallel} of every sequence, attention as torch's ring); the data-parallel ranks "
                     "are data x context parallel (the gradients are shared over both)")
    if p.expert_parallel > 1:
        lines.append(f"expert parallel: each rank holds 1/{p.expert_parallel} of the routed experts (composed from "
                     f"rules); the {p.expert_parallel} expert-parallel ranks are taken from the data-parallel ones")
    if request.dp > 1:
        lines.append(f"data parallel: {request.data_layout().describe()}")
    return lines


def _gib(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB"


def kept_back_line(plan: Plan) -> str | None:
    """What a GPU plan keeps back on every device for what the profile does not hold (the CUDA
    context, NCCL's buffers), with the request's reserve and the total: one line, from the plan's
    record (None where it has none: not a GPU, or a plan written before it was recorded)."""
    kept = plan.inputs.runtime_reserve
    if kept is None:
        return None
    reserve = plan.inputs.options.reserve
    if kept.setting == "off":
        items = "nothing for the CUDA context and NCCL's buffers (turned off)"
    elif kept.setting == "given":
        items = f"{_gib(kept.given_bytes)} given in place of the CUDA context and NCCL estimate"
    else:
        n = len(kept.communicators)
        items = (f"CUDA context {_gib(kept.cuda_context_bytes)}, NCCL buffers {_gib(kept.nccl_bytes)} "
                 f"({n} communicator{'' if n == 1 else 's'})")
    total = kept.estimate_bytes + reserve
    text = f"kept back per device: {items}, reserve {_gib(reserve)}: {_gib(total)} in all"
    o = plan.inputs.options
    caps = set(o.capacities) if o.capacities else {plan.profile.bytes_per_tile}
    if len(caps) == 1 and not any(kept.retry_bytes):       # alike devices: what each leaves to the plan
        left = int(caps.pop() * (1.0 - o.headroom)) - total
        text += f", {_gib(left)} of each device left for the plan"
    if any(kept.retry_bytes):
        text += ("; solved again keeping back the allocator's excess too: "
                 + ", ".join(f"device {i} {_gib(b)}" for i, b in enumerate(kept.retry_bytes) if b))
    return text


def solve_text(plan: Plan, profile: str | None, gpu: bool, width: int | None = None,
               naming: Callable[[str], str] | None = None) -> str:
    """What ``solve`` prints: what was asked (the profile, named by ``profile`` where it has no
    name of its own, the devices and their memory, the objective and schedule), the summary and
    why, the comparison with what the user would do otherwise, and the tables, fitted to
    ``width`` columns (None: no limit); on a GPU (``gpu``) in GiB without the IPU-only columns.
    ``naming``: how the caller names things in the tables (reporting/table.py's ``worded``)."""
    inputs, o, p = plan.inputs, plan.inputs.options, plan.profile
    cap = o.capacities[0] if o.capacities else p.bytes_per_tile
    size = f"{cap / 2**30:,.2f} GiB each" if gpu else f"{p.tiles:,} tiles x {cap:,} bytes"
    reserve = f", {o.reserve / 2**30:,.2f} GiB reserved" if gpu else f", {o.reserve:,} bytes reserved"
    header = (f"{one_line(p.name or (profile or p.path) or '')}{' (synthetic)' if p.synthetic else ''}: "
              f"{len(plan.layer_names)} layers on {'exactly' if o.exact else 'at most'} {o.devices} x "
              f"{', '.join(sorted(set(inputs.target_names)))} ({size}"
              f"{f', {o.headroom:.{0 if round(o.headroom, 2) == o.headroom else 1}%} kept free' if o.headroom else ''}"
              f"{reserve if o.reserve else ''})\n"
              f"objective: {o.objective.value}; schedule: {o.schedule.value}"
              f"{f' with {o.micro_batches} micro-batches' if o.schedule != 'none' else ''}")
    for line in layout_lines(plan):
        header += "\n" + line
    kept = kept_back_line(plan)
    if kept is not None:
        header += "\n" + kept
    if plan.variants:
        header += ("\nprofile variants (memory proportion): "
                   + ", ".join(f"{one_line(v.name)} ({v.proportion:g})" if v.proportion is not None
                               else one_line(v.name) for v in plan.variants))
    text = header + "\n" + summary_with_why(plan, gpu) + "\n"
    if plan.baselines and plan.stages:
        words = device_words(p.tiles)
        text += "compared with what you would do otherwise, under the same cost model:\n"
        text += "".join(f"  {one_line(compare_line(c))}\n" for c in comparisons(plan, plan.baselines, words))
    if plan.stages:
        table = stages_table(plan)
        text += "\n" + render([gpu_view(table) if gpu else table], width=width, naming=naming)
    if plan.baselines:
        text += "\n" + render([comparison_table([plan] + plan.baselines, gpu=gpu)], width=width, naming=naming)
    if plan.candidates:
        text += "\n" + render([candidates_table(plan)], width=width, naming=naming)
    return text
