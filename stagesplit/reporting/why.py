"""Why this split: what binds the plan (memory, or the compute of one layer alone, or the
balance of the layers' compute; under a schedule's own actions, the critical path of the step)
and what would change it, with the fullest device's headroom; and how it compares with what the
user would do otherwise, each in one line.

Every claim is computed from the plan's own figures and the model it was solved on: "memory
binds" only where the best split with memory ignored (the same rules, found exactly for the stage
model, by CP-SAT under a schedule) is faster than the plan, which, the plan being the fastest
that fits, cannot fit; a layer named is on the stage named. tests/reporting/test_why.py parses
each claim of random plans' lines and checks it by brute force.

A stage's time is what the solver minimised: its roofline seconds where the target gives them
(``StagePlan.time_s``), else its compute with transfers (``StagePlan.stage_time``). A pipeline
step of ``P`` stages and ``M`` micro-batches takes ``(M + P - 1)`` times the slowest stage
(GPipe and 1F1B alike), which is how plans with different stage counts are compared.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..errors import StagesplitError
from ..plan.records import Plan
from ..plan.text import split_text
from .units import DeviceWords

__all__ = ["Comparison", "StepPath", "balanced_bottleneck", "compare_line", "comparisons", "headroom_text",
           "layer_times", "least_slowest", "stage_times", "step_path", "step_ratio", "step_time", "why_line"]

#: relative tolerance under which two stage times are the same
SAME = 1e-6
#: relative difference under which a float optimum here and the solver's (on integers scaled to
#: at most 10**9 units: solver/problem.py) are taken as equal
TOLERANCE = 1e-4
#: a device this close to its capacity (a share of it) is full enough that memory may bind a
#: scheduled plan; only then is the memory-free split searched for
FULL_MARGIN = 0.05
#: the most seconds that search may take (it ends early where it proves its optimum)
RELAXED_SECONDS = 10.0
#: a capacity no split reaches (the search with memory ignored)
NO_LIMIT = 2**60
#: up to this many layers the line says how many devices would lower the slowest stage, whatever
#: the count (a search of cube time in the layers); beyond, whether one more device would
SCAN_LAYERS = 200


def balanced_bottleneck(compute: Sequence[float], stages: int) -> float:
    """The least possible slowest-stage compute of ``compute`` (one figure per layer) split into
    at most ``stages`` contiguous stages, memory ignored (the linear partition problem)."""
    c = np.asarray(compute, np.float64)
    L = len(c)
    if L == 0:
        return 0.0
    prefix = np.concatenate([[0.0], np.cumsum(c)])
    span = prefix[None, :] - prefix[:, None]              # span[a, e]: layers a..e-1
    best = span[0].copy()                                  # one stage: layers 0..e-1
    for _ in range(1, min(stages, L)):
        # best'[e] = min over a of max(best[a], span[a, e]), a <= e
        candidates = np.maximum(best[:, None], span)
        candidates[np.tril_indices(L + 1, -1)] = np.inf
        best = np.minimum(best, candidates.min(axis=0))
    return float(best[L])


def _timed(plan: Plan) -> bool:
    return bool(plan.stages) and all(s.time_s is not None for s in plan.stages)


def stage_times(plan: Plan, seconds: bool | None = None) -> tuple[list[float], bool]:
    """Each stage's time as the solver saw it, and whether it is in seconds (``seconds``: force
    the choice; seconds are used only where every stage has them)."""
    if (_timed(plan) if seconds is None else seconds and _timed(plan)):
        return [float(s.time_s) for s in plan.stages if s.time_s is not None], True    # all have one
    return [s.stage_time for s in plan.stages], False


def layer_times(model) -> tuple[np.ndarray, bool]:
    """Each layer's time as the solver saw it (roofline seconds, else compute), and whether in seconds."""
    seconds = getattr(model, "layer_time_s", None)
    if seconds is not None:
        return np.asarray(seconds, np.float64), True
    return np.nan_to_num(np.asarray(model.layer_compute, np.float64)), False


def step_time(plan: Plan, seconds: bool | None = None) -> float:
    """One pipeline step: (M + P - 1) x the slowest stage (see ``stage_times``)."""
    if not plan.stages:
        return float("inf")
    M = plan.inputs.micro_batches
    return (M + len(plan.stages) - 1) * max(stage_times(plan, seconds)[0])


def step_ratio(plan: Plan, reference: Plan) -> float | None:
    """``plan``'s step time over ``reference``'s, both in seconds where both have them."""
    if not plan.stages or not reference.stages:
        return None
    seconds = _timed(plan) and _timed(reference)
    base = step_time(reference, seconds)
    return step_time(plan, seconds) / base if base > 0 else None


def _time(plan: Plan, value: float, seconds: bool, words: DeviceWords) -> str:
    if seconds:
        return words.seconds(value)
    s = plan.bottleneck                       # compute in the profile's unit, seconds where known
    if s is not None and s.time_s is not None and s.stage_time > 0:
        return words.seconds(value * s.time_s / s.stage_time)
    return f"{value:.4g} {plan.compute_unit}"


# -- what every line ends with: the fullest device's headroom ----------------------------------------

def headroom_text(plan: Plan, words: DeviceWords) -> str:
    """``headroom: device 0, the fullest, uses 0.32 of 80.00 GiB (0.4%), 79.68 GiB free``: the
    fullest device of a scheduled plan (its peak under the schedule's actions; on a GPU where the
    caching allocator was replayed, what it reserves: "reserves"), else the fullest stage (on an
    IPU, its worst tile), against the capacity the solver allowed it."""
    s = plan.schedule
    verb = "uses"
    if s is not None and s.ranks:
        r = max(s.ranks, key=lambda r: (r.needed_bytes / max(r.capacity_bytes, 1), -r.rank))
        who, used, capacity, tile = f"device {r.rank}", r.needed_bytes, r.capacity_bytes, ""
        verb = "uses" if r.reserved_bytes is None else "reserves"
    else:
        w = plan.worst_memory
        assert w is not None                  # a plan with stages has one
        who, used, capacity = f"stage {w.stage}", w.worst_tile_bytes, w.capacity_bytes
        tile = "" if words.one_tile else f" on tile {w.worst_tile}"
    share = f" ({used / capacity:.1%})" if capacity > 0 else ""
    rest = f"{words.bytes(capacity - used)} free" if used <= capacity else f"{words.bytes(used - capacity)} over"
    if used > capacity and s is not None and s.ranks and r.fits_after_retries:
        rest += " (within it once the allocator frees cached blocks and retries)"
    return f"headroom: {who}, the fullest, {verb} {words.bytes_of(used, capacity)}{tile}{share}, {rest}"


def _stage_text(plan: Plan, stage: int) -> str:
    """``stage 2 (layers 4..6)``, ``stage 3 (layer 7)``: a stage and the layers it holds, by name."""
    s = plan.stages[stage]
    first, last = plan.layer_names[s.first_layer], plan.layer_names[s.last_layer]
    return f"stage {s.stage} (layer {first})" if s.first_layer == s.last_layer else \
        f"stage {s.stage} (layers {first}..{last})"


# -- the least slowest stage the layer boundaries allow (memory ignored) -----------------------------

def least_slowest(layer_times: Sequence[float] | np.ndarray, positions: int, *, cuts: Sequence[float] | None = None,
                  min_layers: int = 1, max_layers: int | None = None, pinned_splits: Sequence[int] = (),
                  pinned_layers: Sequence[tuple[int, int]] = (), empty_allowed: bool = True
                  ) -> tuple[list[float], _Splits]:
    """The least slowest stage of the layers split into contiguous stages on ``positions`` device
    positions in order, memory ignored, for 1, 2, ..., ``positions`` positions, with each best
    split as (first, last) layer ranges. A stage of layers a..e-1 takes the sum of their
    ``layer_times`` plus ``cuts[a] + cuts[e]`` (each cut's transfer, as the solver prices it);
    the rules are the solver's (``SplitProblem.allowed``): ``min_layers`` to ``max_layers``
    layers a stage, a stage starts at each of ``pinned_splits``, each (layer, position) of
    ``pinned_layers`` puts that layer on that position, and a position may hold nothing where
    ``empty_allowed`` and no layer is pinned to it. ``inf`` (and no split) where no split keeps
    the rules."""
    t = np.asarray(layer_times, np.float64)
    L = len(t)
    c = np.zeros(L + 1) if cuts is None else np.asarray(cuts, np.float64)
    prefix = np.concatenate([[0.0], np.cumsum(t)])
    columns = np.arange(L + 1)
    best = np.full(L + 1, np.inf)
    best[0] = 0.0
    parents: list[np.ndarray] = []
    values: list[float] = []
    pinned_positions = {pos for _, pos in pinned_layers}
    ruled: np.ndarray | None = None
    if pinned_layers:          # each position its own rules: the spans and the rules start by end
        a, e = np.meshgrid(columns, columns, indexing="ij")
        span = prefix[None, :] - prefix[:, None] + c[:, None] + c[None, :]     # span[a, e]: layers a..e-1
        n = e - a
        rule = (n >= max(min_layers, 1)) & ((n <= max_layers) if max_layers is not None else True)
        for j in pinned_splits:
            rule &= ~((a < j) & (j < e))
    else:
        # every position keeps the same rules: the spans they allow, once, stored end by start (so
        # that the minimum over the starts runs along memory) and built so, by broadcasting: the
        # same sums in the same order as ``span`` above, without its index grids and transpose
        end_col, start_row = columns[:, None], columns[None, :]
        n = end_col - start_row
        rule = (n >= max(min_layers, 1)) & ((n <= max_layers) if max_layers is not None else True)
        for j in pinned_splits:
            rule &= ~((start_row < j) & (j < end_col))
        ruled = np.where(rule, prefix[:, None] - prefix[None, :] + c[None, :] + c[:, None], np.inf)
    # where a position may stay empty, a start matters at an end only where it beats the best so
    # far there: a span is at least prefix[e] - prefix[a] + c[e] + the least cut (times >= 0), so
    # those starts are a band, searched alone once it is narrow (same answers, ties included)
    banded = ruled is not None and empty_allowed and bool(np.all(t >= 0)) and bool(np.all(np.isfinite(c)))
    least_cut = float(c.min()) if banded else 0.0
    scale = float(prefix[-1]) + 2 * float(np.abs(c).max()) if banded else 0.0
    rows = columns[:, None] * (L + 1)                      # each end's row of ``ruled``, flat
    for p in range(positions):
        narrow, first, width = False, columns, 0
        if banded:        # a start below first[e] has a span above best[e] (with a margin for rounding)
            lowest = prefix + c + least_cut - best - 1e-9 * (scale + np.abs(best))
            first = np.minimum(np.searchsorted(prefix, lowest, side="left"), columns)
            width = int((columns - first).max()) + 1
            narrow = 4 * width <= L + 1
        if ruled is None:
            allowed = rule.copy()
            for layer, pos in pinned_layers:
                allowed &= ((a <= layer) & (layer < e)) == (pos == p)
            candidates = np.where(allowed, np.maximum(best[:, None], span), np.inf).T
        elif narrow:
            starts = np.minimum(first[:, None] + np.arange(width)[None, :], L)
            candidates = np.maximum(best[starts], ruled.ravel()[starts + rows])
        else:
            candidates = np.maximum(best[None, :], ruled)
        pick = candidates.argmin(axis=1)
        new = candidates[columns, pick]
        start = starts[columns, pick] if narrow else pick
        parent = np.where(np.isfinite(new), start, -2)
        if empty_allowed and p not in pinned_positions:
            keep = best <= new
            new = np.where(keep, best, new)
            parent = np.where(keep & np.isfinite(best), -1, parent)
        best = new
        parents.append(parent)
        values.append(float(best[L]))
    return values, _Splits(parents, values, L)


class _Splits(Sequence):
    """``least_slowest``'s best split for each position count, traced back when asked (the
    callers read one or two of them; tracing every one costs a why line tenths of a second)."""

    def __init__(self, parents: list[np.ndarray], values: list[float], L: int) -> None:
        self._parents, self._values, self._L = parents, values, L

    def __len__(self) -> int:
        return len(self._parents)

    def __getitem__(self, p):
        if isinstance(p, slice):
            return [self[i] for i in range(*p.indices(len(self)))]
        p = range(len(self))[p]
        return _ranges(self._parents[:p + 1], self._L) if np.isfinite(self._values[p]) else []


def _ranges(parents: list[np.ndarray], L: int) -> list[tuple[int, int]]:
    out = []
    end = L
    for parent in reversed(parents):
        start = int(parent[end])
        if start >= 0:
            out.append((start, end - 1))
            end = start
    return out[::-1]


def _worse(value: float, than: float) -> bool:
    """``value`` exceeds ``than`` by more than the solver's integer scaling can account for."""
    return value > than * (1 + TOLERANCE) + 1e-300


# -- the stage model (no schedule's own actions): what binds the slowest stage -----------------------

@dataclass(frozen=True)
class _LayerFigures:
    """Each layer's time and each cut's transfer as the stage-model solver priced them, in the
    plan's stage-time figure (seconds or the profile's unit)."""

    layers: np.ndarray
    cuts: np.ndarray
    seconds: bool


def _layer_figures(plan: Plan, model) -> _LayerFigures | None:
    """The solver's per-layer figures for ``plan`` (solver/problem.py), or None where they do not
    add up to every stage's time in the plan (not the model the plan was solved on)."""
    from ..solver.problem import _raw_times
    if model is None or getattr(model, "num_layers", None) != len(plan.layer_names):
        return None
    try:
        compute, cuts, _, unit = _raw_times(model, plan.inputs.options, None)
    except StagesplitError:           # a model that cannot price the plan's options
        return None
    seconds = unit == "seconds"
    prefix = np.concatenate([[0.0], np.cumsum(compute)])
    for s in plan.stages:
        figure = s.time_s if seconds else s.stage_time
        if figure is None:
            return None
        priced = prefix[s.last_layer + 1] - prefix[s.first_layer] + cuts[s.first_layer] + cuts[s.last_layer + 1]
        if not np.isclose(priced, figure, rtol=1e-6, atol=1e-12 * max(abs(figure), 1e-300)):
            return None
    return _LayerFigures(np.asarray(compute, np.float64), np.asarray(cuts, np.float64), seconds)


def _stage_model_why(plan: Plan, model, words: DeviceWords, headroom: str) -> str:
    """The stage model's why: memory binds (the least slowest stage that keeps the rules, memory
    ignored, is faster than the plan's), or one layer alone makes the slowest stage, or the
    balance of the layers' compute does."""
    figures = _layer_figures(plan, model)
    if figures is None:
        times, seconds = stage_times(plan)
        b = int(np.argmax(times))
        return (f"why: {_stage_text(plan, b)} is the slowest at {_time(plan, times[b], seconds, words)}; "
                f"{headroom}")
    if not len(figures.layers) or figures.layers.max() <= 0:
        return f"why: no compute estimates, so memory decides; {headroom}"
    o = plan.inputs.options
    figures_of: list[Any] = [s.time_s if figures.seconds else s.stage_time for s in plan.stages]   # seconds: all have one
    b = int(np.argmax(figures_of))
    have = float(figures_of[b])
    stage = plan.stages[b]
    rules: dict[str, Any] = dict(cuts=figures.cuts, min_layers=o.min_layers, max_layers=o.max_layers, pinned_splits=o.pinned_splits,
                 pinned_layers=o.pinned_layers, empty_allowed=not o.exact)
    L = len(plan.layer_names)
    # every device count that can matter (a stage holds a layer at least), where that is cheap
    scanned = max(plan.devices, L) + 1 if L <= SCAN_LAYERS else plan.devices + 1
    values, splits = least_slowest(figures.layers, scanned, **rules)
    free = values[plan.devices - 1]

    def text(value: float) -> str:
        return _time(plan, value, figures.seconds, words)
    if have < free * (1 - TOLERANCE):          # not the rules or figures the plan was solved with
        return (f"why: {_stage_text(plan, b)} is the slowest at {text(have)}; {headroom}")
    if _worse(have, free):
        faster = split_text(plan.layer_names, splits[plan.devices - 1])
        return (f"why: memory binds: ignoring memory, {plan.devices} devices could reach {text(free)} per stage "
                f"instead of {text(have)} ({have / free:.2f}x) with {faster}, which does not fit (more memory "
                f"per device would allow it); {headroom}")
    own = figures.layers[stage.first_layer:stage.last_layer + 1]
    slowest = stage.first_layer + int(np.argmax(own))
    floor = float(figures.layers[slowest])
    if float(own.sum()) <= floor * (1 + SAME):
        return (f"why: the compute of layer {plan.layer_names[slowest]} alone binds stage {stage.stage}: more "
                f"devices cannot help below {text(floor)} per micro-batch (a finer `layer_regex`, or tensor "
                f"parallelism inside that layer, would); {headroom}")
    lower = next((n for n in range(plan.devices + 1, len(values) + 1) if values[n - 1] < have * (1 - TOLERANCE)),
                 None)
    if lower is not None:
        change = f"{lower} devices could bring it to {text(values[lower - 1])} if memory allows"
    elif scanned > L:
        change = "no number of devices would lower it"
    else:
        change = "one more device would not lower it"
    return (f"why: the balance of the layers' compute binds: stage {stage.stage} ({text(have)}) is the best the "
            f"layer boundaries allow on {plan.devices} devices; {change}; {headroom}")


# -- a pipeline schedule's own actions: the critical path of the step --------------------------------

@dataclass(frozen=True)
class StepPath:
    """The chain of actions that makes a scheduled plan's step (``schedule.critical_path`` on the
    plan's own per-chunk times): how long it runs on each device (that device's optimizer step
    included where the chain ends there) and in transfers between devices."""

    step: float
    device_time: tuple[float, ...]
    transfer_time: float
    end_device: int


def step_path(plan: Plan, model=None) -> StepPath | None:
    """The critical path of ``plan``'s schedule from its record: each chunk's forward, backward
    and weight-gradient times, each device's optimizer time (its busy time less its actions),
    and, with communication, each boundary's transfer from ``model``'s phase table. None where
    the chain does not add up to the recorded step time (the figures were not all recorded)."""
    from ..solver.schedule_generation import build_schedule
    from ..solver.schedule_simulation import critical_path
    s = plan.schedule
    if s is None or not s.ranks or len(s.chunk_times) != len(plan.stages):
        return None
    try:
        schedule = build_schedule(s.kind, len(s.ranks), s.micro_batches, s.chunks_per_rank)
    except StagesplitError:          # a record no schedule of this version runs
        return None
    if tuple(schedule.chunk_rank) != s.chunk_ranks:
        return None
    times = np.asarray(s.chunk_times, np.float64)
    f, b, w = times[:, 0], times[:, 1], times[:, 2]
    optimizer = np.array([max(r.busy - s.micro_batches * float(sum(f[c] + b[c] + w[c] for c in r.chunks)), 0.0)
                          for r in s.ranks])
    transfer = _transfers(plan, model)
    if transfer is None:
        return None
    path = critical_path(schedule, f, b, w, transfer, optimizer)
    if not np.isclose(path.length, s.step_time, rtol=1e-6, atol=0):
        return None
    ranks = np.asarray(schedule.chunk_rank)
    per_chunk = path.forward * f + path.backward_input * b + path.backward_weight * w
    device = np.bincount(ranks, weights=per_chunk, minlength=len(s.ranks))
    device[path.optimizer_rank] += optimizer[path.optimizer_rank]
    crossing = np.where(ranks[:-1] == ranks[1:], 0.0, np.asarray(transfer, np.float64))
    return StepPath(float(path.length), tuple(float(x) for x in device), float(path.transfers @ crossing),
                    int(path.optimizer_rank))


def _transfers(plan: Plan, model) -> np.ndarray | None:
    """Each chunk boundary's transfer time as the solver priced it (solver/chunk_problem.py): none
    without communication; else from ``model``'s phase table (None without one)."""
    C = len(plan.stages)
    o = plan.inputs.options
    if not o.communication:
        return np.zeros(max(C - 1, 0))
    table = _table(model)
    if table is None or not o.link_bytes_per_s:
        return None
    cuts = np.array([s.first_layer for s in plan.stages[1:]], np.int64)
    return (table.forward_cut[cuts] + table.backward_cut[cuts]) / 2 / float(o.link_bytes_per_s)


def _table(model):
    """``model``'s phase table (model/phases.py), made once per model; None without phases."""
    from ..model.phases import has_phases
    if model is None or not has_phases(model):
        return None
    return model.phase_table


def _schedule_why(plan: Plan, model, words: DeviceWords, headroom: str) -> str:
    """A scheduled plan's why: the critical path of its step (on which device it runs longest),
    the slowest stage against the least the layer boundaries allow, whether memory rules out a
    faster split, and the headroom."""
    s = plan.schedule
    assert s is not None                      # a scheduled plan

    def text(value: float) -> str:
        return words.seconds(value) if s.time_unit == "seconds" else f"{value:.4g} {s.time_unit}"
    chunk = [f + b + w for f, b, w in s.chunk_times]
    slowest = int(np.argmax(chunk))
    parts = []
    path = step_path(plan, model)
    named: tuple[int, ...] = ()
    if path is not None:
        d = int(np.argmax(path.device_time))
        named = s.ranks[d].chunks
        runs = ", ".join(_stage_text(plan, c) for c in named)
        parts.append(f"why: the step's critical path ({text(s.step_time)}, bubble {s.bubble:.1%}) spends "
                     f"{text(path.device_time[d])} on device {d}, which runs {runs}")
    else:
        parts.append(f"why: the step takes {text(s.step_time)} (bubble {s.bubble:.1%})")
    which = f"stage {slowest}" if slowest in named else _stage_text(plan, slowest)
    parts.append(f"{which} is the slowest: {text(chunk[slowest])} per micro-batch")
    problem = _schedule_problem(plan, model)
    if problem is not None:
        balance = _schedule_balance(plan, problem, chunk[slowest], text)
        parts += balance
        parts += _schedule_memory(plan, problem, text, any(c.endswith(_NO_FIT) for c in balance))
    parts.append(headroom)
    return "; ".join(parts)


def _schedule_problem(plan: Plan, model):
    """The chunk-split problem ``plan`` was solved as (plan/scheduled.py), or None where ``model``
    cannot give it (no phases, another model)."""
    from ..plan.scheduled import schedule_problem
    table = _table(model)
    if table is None or table.num_layers != len(plan.layer_names):
        return None
    try:
        problem = schedule_problem(model, plan.inputs, table)
    except StagesplitError:          # the plan's options no longer fit this model
        return None
    assert plan.schedule is not None          # a scheduled plan
    if problem.schedule.chunks != len(plan.stages) or problem.schedule.kind.value != plan.schedule.kind:
        return None
    return problem


def _recomputes(plan: Plan) -> bool:
    return any(s.recomputed_layers for s in plan.stages)


def _schedule_balance(plan: Plan, problem, have: float, text) -> list[str]:
    """The slowest stage against the least slowest stage any split into as many chunks allows
    (each chunk's forward, backward and weight-gradient time, recompute aside), memory ignored;
    where that split is not the plan's, what it would give."""
    from ..solver.chunk_evaluation import evaluate_chunk_split
    C = problem.chunks
    layers = problem.table.layer_times[:, :3].sum(axis=1)
    values, splits = least_slowest(layers, C, min_layers=problem.min_layers, max_layers=problem.max_layers,
                                   pinned_splits=problem.pinned_splits, empty_allowed=False)
    least = values[C - 1]
    if not np.isfinite(least):
        return []
    if not _worse(have, least):
        return [f"no split into {C} stages has a faster slowest stage"]
    ranges = splits[C - 1]
    clause = f"the layers allow a slowest stage of {text(least)} ({split_text(plan.layer_names, ranges)}), but "
    if not _recomputes(plan) and problem.fixed_choice() is not None:
        bounds = (0, *[a for a, _ in ranges[1:]], len(plan.layer_names))
        other = evaluate_chunk_split(problem, bounds)
        if other.feasible:
            return [clause + f"that split's step takes {text(other.step_time)}"]
        if "needs" in other.reason:                   # a rank over its capacity (the rules are kept)
            return [clause + _NO_FIT]
    return [clause + "no split that fits has a faster step than this one"]


#: how the balance clause ends where the split of the least slowest stage does not fit
_NO_FIT = "that split does not fit"


def _schedule_memory(plan: Plan, problem, text, balanced_does_not_fit: bool) -> list[str]:
    """"memory binds" where the fastest split with memory ignored (same schedule, rules and fixed
    recompute) is faster than the plan: the plan being the fastest that fits, that split does
    not. That search runs only where memory may bind: a device within ``FULL_MARGIN`` of its
    capacity, recompute needed, or the split of the least slowest stage not fitting."""
    from ..solver.chunk_cpsat import solve_chunks_cpsat
    from ..solver.request import RecomputeMode
    s = plan.schedule
    assert s is not None                      # a scheduled plan
    full = any(r.peak_bytes >= (1 - FULL_MARGIN) * r.capacity_bytes for r in s.ranks)
    if not (full or _recomputes(plan) or balanced_does_not_fit):
        return []
    fixed = plan.inputs.request.recompute
    relaxed = replace(problem, capacities=np.full_like(problem.capacities, NO_LIMIT), cutoff=None,
                      recompute=fixed if fixed in (RecomputeMode.FULL, RecomputeMode.SELECTIVE) else RecomputeMode.NONE,
                      time_limit=min(problem.time_limit, RELAXED_SECONDS))
    result = solve_chunks_cpsat(relaxed).result
    if result is None or not result.feasible or not _worse(s.step_time, result.step_time):
        return []
    ranges = [(a, b - 1) for a, b in zip(result.bounds, result.bounds[1:])]
    return [f"memory binds: ignoring memory, {split_text(plan.layer_names, ranges)} would take "
            f"{text(result.step_time)} per step instead of {text(s.step_time)} "
            f"({s.step_time / result.step_time:.2f}x), but it does not fit"]


def why_line(plan: Plan, model, words: DeviceWords) -> str:
    """One line: what binds the plan and what would change it, and the fullest device's
    headroom. ``model``: the cost model the plan was solved on (each layer's time); without it
    the compute objective gets no line (what binds needs the layers' times). Every figure is the
    plan's own (tests/reporting/test_why.py parses each claim and checks it)."""
    if not plan.stages:
        return ""
    headroom = headroom_text(plan, words)
    if plan.status != "optimal":
        return ("why: the search stopped at its time limit, so what binds this split is not known; allow more "
                f"`time_limit` for a proven split; {headroom}")
    o = plan.inputs.options
    if o.objective == "memory":
        kind = "device" if plan.schedule is not None else "stage"
        return (f"why: the objective is memory: no split on {plan.devices} devices leaves its fullest {kind} "
                f"emptier (more devices, fewer micro-batches in flight or recompute may); {headroom}")
    if o.objective == "devices" and o.exact:
        return f"why: `exact` uses all {plan.devices} devices, so the device count was given, not searched; {headroom}"
    if o.objective == "devices":
        used = len(plan.schedule.ranks) if plan.schedule is not None else len(plan.stages)
        are = "device is the fewest that holds" if used == 1 else "devices are the fewest that hold"
        return f"why: {used} {are} the model (fewer would not fit); {headroom}"
    if plan.variants:
        return f"{_variants_why(plan, words)}; {headroom}"
    if model is None:                 # a plan read back from its file: nothing to weigh its figures by
        return ""
    if plan.schedule is not None:
        return _schedule_why(plan, model, words, headroom)
    return _stage_model_why(plan, model, words, headroom)


def _variants_why(plan: Plan, words: DeviceWords) -> str:
    """The why of a plan solved on profile variants: the bottleneck stage and its proportion,
    and which stages run below the highest proportion."""
    times, seconds = stage_times(plan)
    b = plan.stages[int(np.argmax(times))]
    highest = max((v.proportion for v in plan.variants if v.proportion is not None), default=None)
    lower = [s.stage for s in plan.stages if highest is not None and s.memory_proportion is not None
             and s.memory_proportion < highest]
    text = (f"why: each stage's memory proportion was chosen with the split; stage {b.stage} binds at "
            f"{_time(plan, max(times), seconds, words)} with proportion {b.memory_proportion:g} ({b.variant})")
    if lower:
        stages = ", ".join(map(str, lower))
        text += (f"; stage{'s' if len(lower) > 1 else ''} {stages} run{'s' if len(lower) == 1 else ''} below the "
                 f"highest proportion ({highest:g}): a higher one does not fit there or is not faster")
    return text


@dataclass(frozen=True)
class Comparison:
    """The plan against one alternative: how many times faster a pipeline step is (> 1: the
    plan is faster), and what is wrong with the alternative (empty when it fits)."""

    label: str
    speedup: float | None           # None: the alternative has no split
    same_split: bool
    problem: str


def _label(method: str) -> str:
    from ..plan.baselines import LABELS  # (the baselines' module only where a plan is compared)
    if method.startswith("greedy"):
        return "PopLiner's greedy"
    return LABELS.get(method, method)


def _problem(alternative: Plan, words: DeviceWords) -> str:
    if not alternative.stages:
        return alternative.message or "no split"
    over = [s for s in alternative.stages if not s.fits]
    if over:
        s = over[0]
        return f"does not fit stage {s.stage} ({words.bytes_of(s.worst_tile_bytes, s.capacity_bytes)})"
    if not alternative.feasible:
        return alternative.message or "breaks a rule of the request"
    return ""


def comparisons(plan: Plan, alternatives: Sequence[Plan], words: DeviceWords) -> list[Comparison]:
    out = []
    bounds = [(s.first_layer, s.last_layer, s.memory_proportion) for s in plan.stages]
    for alt in alternatives:
        speedup = step_ratio(alt, plan)
        same = bounds == [(s.first_layer, s.last_layer, s.memory_proportion) for s in alt.stages]
        out.append(Comparison(_label(alt.method), speedup, same, _problem(alt, words)))
    return out


def compare_line(c: Comparison) -> str:
    """E.g. "1.31x faster than Megatron's even layout, which does not fit stage 0 (...)"."""
    if c.speedup is None:
        return f"{c.label}: not possible here: {c.problem}"
    if c.same_split:
        head = f"the same split as {c.label}"
    elif c.speedup > 1 + SAME:
        head = f"{c.speedup:.2f}x faster than {c.label}"
    elif c.speedup < 1 - SAME:
        head = f"{1 / c.speedup:.2f}x slower than {c.label}"
    else:
        head = f"as fast as {c.label}"
    return head + (f", which {c.problem}" if c.problem else "")
