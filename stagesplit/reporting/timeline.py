"""The plan's pipeline schedule, drawn: each rank's actions over one step (a Gantt chart:
forwards, backwards, the optimizer step, idle time) and each rank's memory over the schedule's
steps, from the solver's schedules (``build_schedule``, ``simulate``, ``rank_memory``).

A plan solved under a schedule (``plan.schedule``) records every duration its step time was
simulated from: per chunk the forward, input-gradient and weight-gradient times, per boundary
the transfer time and per rank the optimizer step. The drawing runs the solver's simulator on
exactly those, so its step and bubble are the plan's (``ScheduleView.matches_plan``). A plan
solved with the stage model records no schedule: ``plan_chunk_figures`` then splits each
stage's time 1:2 between its forward and its backward (the drawing is an illustration; the
plan's own step is ``M + P - 1`` times its slowest stage). Memory comes from the plan's stages:
their always-live bytes resident, the activations one micro-batch stashes (the stage's stashed
bytes per extra micro-batch in flight, or its peak not-always-live bytes when only one is in
flight) and that peak as the transient of a forward or a backward.

Past ``MAX_DRAWN_RANKS`` ranks or ``MAX_DRAWN_ACTIONS`` actions a step is not drawn action by
action (it would take minutes and give an unreadable picture): ``summary_figure`` draws each
rank's busy share of the step and its peak memory, as the plan records them, and nothing of the
size of the schedule is built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..common.text import escape_surrogates
from ..errors import StagesplitError
from ..plan.records import Plan
from ..solver.problem import bubble_fraction
from ..solver.schedule_generation import Op, ScheduleInstance, build_schedule
from ..solver.schedule_kinds import ScheduleKind, traits
from ..solver.schedule_memory import ChunkMemory, RankMemory, rank_memory
from ..solver.schedule_simulation import Simulation, simulate
from .plot import byte_scale
from .why import stage_times

__all__ = ["MAX_DRAWN_ACTIONS", "MAX_DRAWN_RANKS", "ChunkFigures", "ScheduleView", "StepSummary", "gantt_figure",
           "plan_chunk_figures", "rank_memory_figure", "schedule_kind", "schedule_view", "step_summary", "step_text",
           "summary_figure", "too_large_to_draw"]

OP_COLORS = {Op.FORWARD: "#1f77b4", Op.BACKWARD_INPUT: "#ff7f0e", Op.BACKWARD_WEIGHT: "#2ca02c",
             Op.FULL_BACKWARD: "#ff7f0e"}
OP_NAMES = {Op.FORWARD: "forward", Op.BACKWARD_INPUT: "backward (input gradient)",
            Op.BACKWARD_WEIGHT: "backward (weight gradient)", Op.FULL_BACKWARD: "backward"}
OPTIMIZER_COLOR = "#7f7f7f"
#: the most ranks, and actions in one step, drawn one by one (see the module docstring)
MAX_DRAWN_RANKS = 64
MAX_DRAWN_ACTIONS = 20_000
#: the most ranks the memory figure's legend names one by one
LEGEND_RANKS = 16
#: the most micro-batch numbers written on the bars
MAX_BAR_LABELS = 600


@dataclass(frozen=True)
class ChunkFigures:
    """What one micro-batch costs on each chunk (model order): ``forward``/``backward`` times
    (``backward_weight`` for schedules that split the backward; a full backward takes both), in
    ``unit`` ("s" or the profile's compute unit), and the chunk's bytes (``memory``);
    ``transfer`` per boundary and ``optimizer`` per rank where the plan records them."""

    forward: np.ndarray
    backward: np.ndarray
    memory: ChunkMemory
    unit: str
    backward_weight: np.ndarray | None = None
    transfer: np.ndarray | None = None
    optimizer: np.ndarray | None = None
    #: True: the durations the plan was solved with; False: each stage's time split 1:2
    solved: bool = False


def schedule_kind(plan: Plan) -> ScheduleKind:
    """The schedule the plan was solved for (no schedule: GPipe, every micro-batch forward
    then backward, as torch runs a plan with none)."""
    value = plan.schedule.kind if plan.schedule is not None else getattr(plan.inputs.schedule, "value",
                                                                          plan.inputs.schedule)
    try:
        return ScheduleKind(value)
    except ValueError:
        return ScheduleKind.GPIPE


def _stage_memory(plan: Plan) -> ChunkMemory:
    resident, stash, peak = [], [], []
    for s in plan.stages:
        m = s.memory_at_worst_tile
        code = m.vertex_code + m.vertex_state + m.exchange_code + m.control_code
        resident.append(m.always_live + code)
        one = m.stashed_copies // (s.in_flight - 1) if s.in_flight > 1 else m.not_always_live
        stash.append(min(one, m.not_always_live))
        peak.append(m.not_always_live)
    zero = np.zeros(len(plan.stages), np.int64)
    return ChunkMemory(resident=np.array(resident, np.int64), stash=np.array(stash, np.int64), weight_stash=zero,
                       forward_peak=np.array(peak, np.int64), backward_peak=np.array(peak, np.int64),
                       weight_peak=zero, optimizer_peak=zero)


def _recorded_times(plan: Plan) -> bool:
    s = plan.schedule
    return s is not None and len(s.chunk_times) == len(plan.stages) and len(plan.stages) > 0


def plan_chunk_figures(plan: Plan) -> ChunkFigures:
    """Per-chunk figures from the plan alone (see the module docstring): the durations the
    plan records under its schedule, else each stage's time split 1:2."""
    memory = _stage_memory(plan)
    if _recorded_times(plan):
        s = plan.schedule
        assert s is not None                  # recorded times are the schedule's
        times = np.asarray(s.chunk_times, np.float64).reshape(len(plan.stages), 3)
        M = s.micro_batches
        if s.optimizer_times:
            optimizer = np.asarray(s.optimizer_times, np.float64)
        else:                          # an older plan: what its busy time leaves (to rounding)
            work = np.bincount(np.asarray(s.chunk_ranks), weights=times.sum(axis=1), minlength=len(s.ranks))
            optimizer = np.maximum(np.array([r.busy for r in s.ranks]) - M * work, 0.0)
        transfer = np.asarray(s.transfer_times, np.float64) if s.transfer_times else None
        return ChunkFigures(forward=times[:, 0], backward=times[:, 1], backward_weight=times[:, 2], memory=memory,
                            unit="s" if s.time_unit == "seconds" else s.time_unit, transfer=transfer,
                            optimizer=optimizer, solved=True)
    stage_figures, seconds = stage_times(plan)
    t = np.asarray(stage_figures, np.float64)
    return ChunkFigures(forward=t / 3, backward=2 * t / 3, memory=memory, unit="s" if seconds else plan.compute_unit)


def _schedule_shape(plan: Plan) -> tuple[ScheduleKind, int, int, int]:
    """(kind, ranks, micro-batches, chunks per rank) of the plan's schedule."""
    s = plan.schedule
    if s is not None:
        return schedule_kind(plan), len(s.ranks), s.micro_batches, s.chunks_per_rank
    return schedule_kind(plan), len(plan.stages), plan.inputs.micro_batches, 1


def too_large_to_draw(plan: Plan) -> str:
    """Why the plan's step is too large to draw action by action ("" when it is not), counted
    without building the schedule."""
    kind, P, M, v = _schedule_shape(plan)
    actions = P * v * M * (3 if traits(kind).splits_backward else 2)
    if P > MAX_DRAWN_RANKS:
        return f"{P:,} ranks (at most {MAX_DRAWN_RANKS} are drawn action by action)"
    if actions > MAX_DRAWN_ACTIONS:
        return (f"up to {actions:,} actions in one step (at most {MAX_DRAWN_ACTIONS:,} are drawn action by "
                "action)")
    return ""


@dataclass(frozen=True)
class ScheduleView:
    """One step of the plan's schedule: the actions, their simulated times, each rank's optimizer
    step after its last action, the step time (the last rank to finish) and its bubble, each
    rank's memory and capacity."""

    schedule: ScheduleInstance
    simulation: Simulation
    memory: tuple[RankMemory, ...]
    capacity: np.ndarray
    unit: str
    one_tile: bool
    optimizer: np.ndarray | None = None
    step_time: float = 0.0
    bubble: float = 0.0
    #: whether the durations are the ones the plan was solved with (else each stage's time split 1:2)
    solved: bool = False


def _finite(value: float, what: str) -> float:
    if not math.isfinite(value):
        raise StagesplitError(f"{what} is too large to compute (it overflows a float): the plan's stage times "
                              "(stages[].time_s, schedule.chunk_times) are out of range")
    return value


def schedule_view(plan: Plan, figures: ChunkFigures | None = None) -> ScheduleView:
    """The plan's schedule built, simulated and its memory followed; raises StagesplitError
    (a reason a reader can act on) when the schedule cannot run this plan or is too large to draw."""
    if not plan.stages:
        raise StagesplitError("the plan has no stages (no split fits)")
    too_large = too_large_to_draw(plan)
    if too_large:
        raise StagesplitError(f"the schedule is too large to draw: {too_large}")
    figures = figures or plan_chunk_figures(plan)
    kind, P, M, v = _schedule_shape(plan)
    schedule = build_schedule(kind, P, M, v)
    if schedule.chunks != len(figures.forward):
        raise StagesplitError(f"the {kind.value} schedule has {schedule.chunks} chunks; the figures give "
                              f"{len(figures.forward)}")
    with np.errstate(over="ignore", invalid="ignore"):          # an overflow is refused just below
        simulation = simulate(schedule, figures.forward, figures.backward, figures.backward_weight, figures.transfer)
        optimizer = figures.optimizer
        last = np.array([e[-1] if len(e) else 0.0 for e in simulation.end])
        finish = last + optimizer if optimizer is not None else last
        step = _finite(float(finish.max()) if len(finish) else 0.0, "the step time")
        busy = float(simulation.busy.sum()) + (float(optimizer.sum()) if optimizer is not None else 0.0)
    bubble = max(1.0 - busy / (P * step), 0.0) if step > 0 else 0.0
    memory = rank_memory(schedule, figures.memory)
    capacity = np.zeros(schedule.devices, np.int64)
    for s in plan.stages:
        capacity[schedule.chunk_rank[s.stage]] = s.capacity_bytes
    return ScheduleView(schedule, simulation, memory, capacity, figures.unit, plan.profile.one_tile, optimizer,
                        step, bubble, figures.solved)


@dataclass(frozen=True)
class StepSummary:
    """One step as the plan tells it, without the schedule's actions: the step time and its
    bubble, and per rank its busy time and its peak memory with its capacity."""

    step_time: float
    bubble: float
    busy: np.ndarray
    peak: np.ndarray
    capacity: np.ndarray
    unit: str
    one_tile: bool
    #: True: the plan's simulated schedule; False: the stage model, (M + P - 1) x the slowest stage
    simulated: bool


def step_summary(plan: Plan) -> StepSummary:
    """The plan's step (see ``StepSummary``); raises StagesplitError when it overflows."""
    if not plan.stages:
        raise StagesplitError("the plan has no stages (no split fits)")
    s = plan.schedule
    if s is not None:
        return StepSummary(s.step_time, s.bubble, np.array([r.busy for r in s.ranks], np.float64),
                           np.array([r.peak_bytes for r in s.ranks], np.int64),
                           np.array([r.capacity_bytes for r in s.ranks], np.int64),
                           "s" if s.time_unit == "seconds" else s.time_unit, plan.profile.one_tile, True)
    times, seconds = stage_times(plan)
    t = np.asarray(times, np.float64)
    M, P = plan.inputs.micro_batches, len(plan.stages)
    with np.errstate(over="ignore"):
        busy = M * t
        step = (M + P - 1) * float(t.max())
    _finite(step, "the step time")
    return StepSummary(step, bubble_fraction(P, M), busy, np.array([x.worst_tile_bytes for x in plan.stages]),
                       np.array([x.capacity_bytes for x in plan.stages]), "s" if seconds else plan.compute_unit,
                       plan.profile.one_tile, False)


def summary_figure(summary: StepSummary, title: str = ""):
    """Each rank's busy share of the step (the rest of the step it idles) and each rank's peak
    memory against its capacity: two lines over the ranks, whatever their number."""
    from matplotlib.figure import Figure
    P = len(summary.busy)
    fig = Figure(figsize=(10.0, 6.0), dpi=110, layout="constrained")
    ax_busy, ax_memory = fig.subplots(2, 1)
    edges = np.arange(P + 1) - 0.5
    share = summary.busy / summary.step_time if summary.step_time > 0 else np.zeros(P)
    ax_busy.stairs(100 * share, edges, fill=True, color=OP_COLORS[Op.FORWARD], label="busy")
    ax_busy.set_ylim(0, 100)
    ax_busy.set_xlim(edges[0], edges[-1])
    ax_busy.set_ylabel("busy share of the step (%)")
    ax_busy.set_xlabel("rank")
    scale, unit = byte_scale(float(max(summary.peak.max(), 1)), summary.one_tile)
    ax_memory.stairs(summary.peak / scale, edges, fill=True, color="#9467bd", label="peak memory")
    if summary.capacity.max() <= 4 * max(summary.peak.max(), 1):
        ax_memory.stairs(summary.capacity / scale, edges, baseline=None, color="black", linestyle="--",
                         label="capacity")
    ax_memory.set_xlim(edges[0], edges[-1])
    ax_memory.set_ylim(bottom=0)
    ax_memory.set_ylabel(f"{'device' if summary.one_tile else 'worst tile'} peak memory ({unit})")
    ax_memory.set_xlabel("rank")
    ax_memory.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(escape_surrogates(title or f"{P:,} ranks: each rank's busy share of the step and its peak memory"),
                 fontsize=10)
    return fig


def _time_scale(view: ScheduleView) -> tuple[float, str]:
    if view.unit == "s":
        return 1e3, "ms"
    return 1.0, view.unit


def step_text(value: float, unit: str) -> str:
    """A step time as the plan's summary writes it: ms (seconds_text) or the compute unit."""
    from ..plan.text import seconds_text
    return seconds_text(value) if unit == "s" else f"{value:.4g} {unit}"


def gantt_figure(view: ScheduleView, title: str = ""):
    """One row per rank: each action a bar from its start to its end (forward blue, backward
    orange, weight gradient green, the optimizer step grey), idle time left blank, micro-batch
    numbers on the bars wide enough for them."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
    P = view.schedule.devices
    fig = Figure(figsize=(10.0, 1.2 + 0.5 * P), dpi=110, layout="constrained")
    ax = fig.subplots()
    scale, unit = _time_scale(view)
    step = view.step_time * scale
    labels = 0
    for r, leaves in enumerate(view.schedule.leaves):
        starts = view.simulation.start[r] * scale
        ends = view.simulation.end[r] * scale
        ops = np.array([list(OP_COLORS).index(a.op) for a in leaves], np.int64)
        for k, op in enumerate(OP_COLORS):
            mask = ops == k
            if mask.any():
                ax.broken_barh(list(zip(starts[mask], (ends - starts)[mask])), (r - 0.35, 0.7),
                               facecolors=OP_COLORS[op], edgecolor="white", linewidth=0.5)
        if view.optimizer is not None and view.optimizer[r] > 0:
            last = ends[-1] if len(ends) else 0.0
            ax.broken_barh([(last, view.optimizer[r] * scale)], (r - 0.35, 0.7), facecolors=OPTIMIZER_COLOR,
                           edgecolor="white", linewidth=0.5)
        for a, s, e in zip(leaves, starts, ends):
            if step > 0 and (e - s) / step > 0.015 and labels < MAX_BAR_LABELS:
                ax.text((s + e) / 2, r, str(a.micro_batch), ha="center", va="center", fontsize=6, color="white")
                labels += 1
    ax.set_yticks(range(P), [f"rank {r}" for r in range(P)])
    ax.set_ylim(P - 0.5, -0.5)
    ax.set_xlim(0, step if step > 0 else 1)
    ax.set_xlabel(f"time in one step ({unit})")
    used = sorted({a.op for leaves in view.schedule.leaves for a in leaves}, key=lambda op: list(OP_COLORS).index(op))
    handles = [Patch(color=OP_COLORS[op], label=OP_NAMES[op]) for op in used]
    if view.optimizer is not None and np.any(view.optimizer > 0):
        handles.append(Patch(color=OPTIMIZER_COLOR, label="optimizer step"))
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(escape_surrogates(title or f"{view.schedule.kind.value}: {P} ranks, "
                                   f"{view.schedule.micro_batches} micro-batches, step "
                                   f"{step_text(view.step_time, view.unit)}, "
                                   f"bubble {view.bubble:.1%} (blank: idle)"), fontsize=10)
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
        x, y = np.array(xs), np.array(ys, np.float64) / scale_b
        named = P <= LEGEND_RANKS                      # beyond, a legend of every rank would not fit the figure
        ax.plot(x, y, color=cmap(r % 10), linewidth=1.2,
                label=f"rank {r} (peak {m.peak / scale_b:,.3g} {unit_b})" if named else None)
    caps = sorted(set(int(c) for c in view.capacity if c))
    for c in caps:
        if c <= 4 * max(peak, 1):
            ax.axhline(c / scale_b, color="black", linestyle="--", linewidth=1.2, label="capacity")
    ax.set_xlabel(f"time in one step ({unit_t})")
    ax.set_ylabel(f"{'device' if view.one_tile else 'worst tile'} memory ({unit_b})")
    ax.set_ylim(bottom=0)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fullest = max(view.memory, key=lambda m: m.peak, default=None)
    where = "" if P <= LEGEND_RANKS or fullest is None else \
        f"; the fullest, rank {fullest.rank}, peaks at {fullest.peak / scale_b:,.3g} {unit_b}"
    ax.set_title(escape_surrogates(title or f"Memory of each rank over the step ({P} ranks{where})"), fontsize=10)
    return fig
