"""The plan's pipeline schedule, drawn: each rank's actions over one step (a Gantt chart:
forwards, backwards, idle time) and each rank's memory over the schedule's steps, from
``stagesplit.solver.schedule`` (``build_schedule``, ``simulate``, ``rank_memory``).

The per-chunk figures come from ``ChunkFigures``. Until the cost model prices forward and
backward separately, ``plan_chunk_figures`` derives them from the plan's stages: a stage's
time split 1:2 between its forward and its backward, its always-live bytes resident, the
activations one micro-batch stashes (the stage's stashed bytes per extra micro-batch in
flight, or its peak not-always-live bytes when only one is in flight) and that peak as the
transient of a forward or a backward. Feed ``schedule_view`` real per-chunk figures and the
drawings follow them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..common.text import escape_surrogates
from ..errors import StagesplitError
from ..plan.records import Plan
from ..solver.schedule import (ChunkMemory, Op, RankMemory, Schedule, ScheduleKind, Simulation, build_schedule,
                               rank_memory, simulate)
from .plot import byte_scale
from .why import stage_times

__all__ = ["ChunkFigures", "ScheduleView", "gantt_figure", "plan_chunk_figures", "rank_memory_figure",
           "schedule_kind", "schedule_view"]

OP_COLORS = {Op.FORWARD: "#1f77b4", Op.BACKWARD_INPUT: "#ff7f0e", Op.BACKWARD_WEIGHT: "#2ca02c",
             Op.FULL_BACKWARD: "#ff7f0e"}
OP_NAMES = {Op.FORWARD: "forward", Op.BACKWARD_INPUT: "backward (input gradient)",
            Op.BACKWARD_WEIGHT: "backward (weight gradient)", Op.FULL_BACKWARD: "backward"}


@dataclass(frozen=True)
class ChunkFigures:
    """What one micro-batch costs on each chunk (model order): ``forward``/``backward`` times
    (``backward_weight`` for schedules that split the backward), in ``unit`` ("s" or the
    profile's compute unit), and the chunk's bytes (``memory``)."""

    forward: np.ndarray
    backward: np.ndarray
    memory: ChunkMemory
    unit: str
    backward_weight: np.ndarray | None = None


def schedule_kind(plan: Plan) -> ScheduleKind:
    """The schedule the plan was solved for (no schedule: GPipe, every micro-batch forward
    then backward, as torch runs a plan with none)."""
    value = getattr(plan.inputs.schedule, "value", plan.inputs.schedule)
    try:
        return ScheduleKind(value)
    except ValueError:
        return ScheduleKind.GPIPE


def plan_chunk_figures(plan: Plan) -> ChunkFigures:
    """Per-stage figures from the plan alone (see the module docstring): one chunk per stage."""
    times, seconds = stage_times(plan)
    t = np.asarray(times, np.float64)
    resident, stash, peak = [], [], []
    for s in plan.stages:
        m = s.memory_at_worst_tile
        code = m.vertex_code + m.vertex_state + m.exchange_code + m.control_code
        resident.append(m.always_live + code)
        one = m.stashed_copies // (s.in_flight - 1) if s.in_flight > 1 else m.not_always_live
        stash.append(min(one, m.not_always_live))
        peak.append(m.not_always_live)
    zero = np.zeros(len(plan.stages), np.int64)
    memory = ChunkMemory(resident=np.array(resident, np.int64), stash=np.array(stash, np.int64), weight_stash=zero,
                         forward_peak=np.array(peak, np.int64), backward_peak=np.array(peak, np.int64),
                         weight_peak=zero, optimizer_peak=zero)
    return ChunkFigures(forward=t / 3, backward=2 * t / 3, memory=memory, unit="s" if seconds else plan.compute_unit)


@dataclass(frozen=True)
class ScheduleView:
    """One step of the plan's schedule: the actions, their simulated times, each rank's memory
    and capacity."""

    schedule: Schedule
    simulation: Simulation
    memory: tuple[RankMemory, ...]
    capacity: np.ndarray
    unit: str
    one_tile: bool


def schedule_view(plan: Plan, figures: ChunkFigures | None = None) -> ScheduleView:
    """The plan's schedule built, simulated and its memory followed; raises StagesplitError
    (a reason a reader can act on) when the schedule cannot run this plan."""
    if not plan.stages:
        raise StagesplitError("the plan has no stages (no split fits)")
    figures = figures or plan_chunk_figures(plan)
    kind = schedule_kind(plan)
    schedule = build_schedule(kind, len(plan.stages), plan.inputs.micro_batches)
    if schedule.chunks != len(figures.forward):
        raise StagesplitError(f"the {kind.value} schedule has {schedule.chunks} chunks; the figures give "
                              f"{len(figures.forward)}")
    simulation = simulate(schedule, figures.forward, figures.backward, figures.backward_weight)
    memory = rank_memory(schedule, figures.memory)
    capacity = np.zeros(schedule.devices, np.int64)
    for s in plan.stages:
        capacity[schedule.chunk_rank[s.stage]] = s.capacity_bytes
    return ScheduleView(schedule, simulation, memory, capacity, figures.unit, plan.profile.one_tile)


def _time_scale(view: ScheduleView) -> tuple[float, str]:
    if view.unit == "s":
        return 1e3, "ms"
    return 1.0, view.unit


def gantt_figure(view: ScheduleView, title: str = ""):
    """One row per rank: each action a bar from its start to its end (forward blue, backward
    orange, weight gradient green), idle time left blank, micro-batch numbers on the bars."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
    P = view.schedule.devices
    fig = Figure(figsize=(10.0, 1.2 + 0.5 * P), dpi=110, layout="constrained")
    ax = fig.subplots()
    scale, unit = _time_scale(view)
    step = view.simulation.step_time * scale
    for r, leaves in enumerate(view.schedule.leaves):
        starts = view.simulation.start[r] * scale
        ends = view.simulation.end[r] * scale
        for a, s, e in zip(leaves, starts, ends):
            ax.barh(r, e - s, left=s, height=0.7, color=OP_COLORS[a.op], edgecolor="white", linewidth=0.5)
            if step > 0 and (e - s) / step > 0.015:
                ax.text((s + e) / 2, r, str(a.micro_batch), ha="center", va="center", fontsize=6, color="white")
    ax.set_yticks(range(P), [f"rank {r}" for r in range(P)])
    ax.invert_yaxis()
    ax.set_xlim(0, step if step > 0 else 1)
    ax.set_xlabel(f"time in one step ({unit})")
    used = sorted({a.op for leaves in view.schedule.leaves for a in leaves}, key=lambda op: list(OP_COLORS).index(op))
    ax.legend(handles=[Patch(color=OP_COLORS[op], label=OP_NAMES[op]) for op in used], fontsize=7,
              loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(escape_surrogates(title or f"{view.schedule.kind.value}: {P} ranks, "
                                   f"{view.schedule.micro_batches} micro-batches, step {step:.3g} {unit}, "
                                   f"bubble {view.simulation.bubble_fraction:.0%} (blank: idle)"), fontsize=10)
    return fig


def rank_memory_figure(view: ScheduleView, title: str = ""):
    """Each rank's memory while each of its actions runs, over the step's time, with its
    capacity (when the capacity is within sight of the peaks)."""
    from matplotlib.figure import Figure
    P = view.schedule.devices
    fig = Figure(figsize=(10.0, 4.2), dpi=110, layout="constrained")
    ax = fig.subplots()
    peak = max((m.peak for m in view.memory), default=0)
    scale_b, unit_b = byte_scale(max(peak, 1), view.one_tile)
    scale_t, unit_t = _time_scale(view)
    from matplotlib import colormaps
    cmap = colormaps["tab10"]
    for r, m in enumerate(view.memory):
        starts = view.simulation.start[r] * scale_t
        ends = view.simulation.end[r] * scale_t
        # while an action runs: its peak; while the rank idles until its next action: what stays
        xs, ys = [], []
        for i in range(len(starts)):
            xs += [starts[i], ends[i]]
            ys += [m.during[i], m.during[i]]
            if i + 1 < len(starts) and starts[i + 1] > ends[i]:
                xs += [ends[i], starts[i + 1]]
                ys += [m.after[i], m.after[i]]
        xs, ys = np.array(xs), np.array(ys, np.float64) / scale_b
        ax.plot(xs, ys, color=cmap(r % 10), linewidth=1.2, label=f"rank {r} (peak {m.peak / scale_b:,.3g} {unit_b})")
    caps = sorted(set(int(c) for c in view.capacity if c))
    for c in caps:
        if c <= 4 * max(peak, 1):
            ax.axhline(c / scale_b, color="black", linestyle="--", linewidth=1.2, label="capacity")
    ax.set_xlabel(f"time in one step ({unit_t})")
    ax.set_ylabel(f"{'device' if view.one_tile else 'worst tile'} memory ({unit_b})")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(escape_surrogates(title or f"Memory of each rank over the step ({P} ranks)"), fontsize=10)
    return fig
