"""The step of a pipeline schedule in time: every rank's leaf actions (``schedule_generation``) as
one dependency graph, simulated from per-chunk durations (``simulate``: each action's start and
end, the step time, the bubble), and the chain of actions that makes the step time
(``critical_path``), which the chunk search (``chunk_cpsat``) keeps as a lower bound.

Each rank runs its leaf actions one at a time in list order, each starting when the rank is free
and its inputs are there: F(m,c) after F(m,c-1) + transfer; B(m,c) after F(m,c) and after
B(m,c+1) + transfer; W(m,c) after B(m,c). Every rank starts at time 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from numpy.typing import ArrayLike

from ..common.deadline import check_deadline
from ..errors import OptionError
from .schedule_generation import BACKWARD_OPS, Op, ScheduleInstance

__all__ = ["CriticalPath", "Simulation", "critical_path", "simulate"]

#: how often the loops over a step's actions look at the search's deadline (``common/deadline.py``):
#: every 65,536 actions (a few tens of milliseconds)
_EVERY = 0xFFFF
_SIMULATING = "simulating the schedule's step"


@dataclass(frozen=True)
class _Graph:
    """The leaf actions of all ranks as one dependency graph, in an order that respects it."""

    order: np.ndarray         # leaf ids (rank-major numbering), dependencies first
    rank_of: np.ndarray       # per leaf id
    op_of: list[Op]
    chunk_of: np.ndarray
    previous: np.ndarray      # the same rank's previous leaf, -1 for the first
    deps: list[tuple[tuple[int, int], ...]]   # per leaf: (leaf it waits for, boundary crossed or -1)
    rank_offsets: np.ndarray  # leaf ids of rank r: rank_offsets[r] .. rank_offsets[r+1]-1

    @cached_property
    def lists(self) -> tuple[list[int], list[int], np.ndarray]:
        """``order`` and ``previous`` as lists, and each leaf's row in ``_duration_rows`` (0 F, 1 B,
        2 W, 3 full backward): the walk of ``critical_path`` reads plain Python numbers, a few times
        faster than indexing arrays one element at a time (thousands of walks per search)."""
        rows = {Op.FORWARD: 0, Op.BACKWARD_INPUT: 1, Op.BACKWARD_WEIGHT: 2, Op.FULL_BACKWARD: 3}
        return self.order.tolist(), self.previous.tolist(), np.array([rows[op] for op in self.op_of], np.int64)


def _graph(schedule: ScheduleInstance) -> _Graph:
    """The schedule's dependency graph, built once per schedule (kept on the frozen record)."""
    cached = schedule.__dict__.get("_graph_cache")
    if cached is None:
        cached = _build_graph(schedule)
        object.__setattr__(schedule, "_graph_cache", cached)
    return cached


def _build_graph(schedule: ScheduleInstance) -> _Graph:
    leaves = schedule.leaves
    sizes = np.array([len(x) for x in leaves])
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    where: dict[tuple[str, int, int], int] = {}
    op_of: list[Op] = []
    chunk_of, rank_of, previous = [], [], []
    for r, rank_leaves in enumerate(leaves):
        check_deadline(_SIMULATING)
        for i, a in enumerate(rank_leaves):
            lid = int(offsets[r]) + i
            key = "B" if a.op in BACKWARD_OPS else a.op.value
            where[key, a.chunk, a.micro_batch] = lid
            op_of.append(a.op)
            chunk_of.append(a.chunk)
            rank_of.append(r)
            previous.append(lid - 1 if i else -1)
    last = schedule.chunks - 1
    deps: list[tuple[tuple[int, int], ...]] = []
    for rank_leaves in leaves:
        check_deadline(_SIMULATING)
        for a in rank_leaves:
            c, m = a.chunk, a.micro_batch
            if a.op is Op.FORWARD:
                d: tuple[tuple[int, int], ...] = ((where["F", c - 1, m], c - 1),) if c > 0 else ()
            elif a.op in BACKWARD_OPS:
                d = ((where["F", c, m], -1),)
                if c < last:
                    d += ((where["B", c + 1, m], c),)
            else:
                d = ((where["B", c, m], -1),)
            deps.append(d)
    # a list schedule in rounds over the ranks: each rank runs what it can; no progress = deadlock
    n = int(offsets[-1])
    done = np.zeros(n, bool)
    cursor = offsets[:-1].copy()
    order: list[int] = []
    while len(order) < n:
        progress = False
        for r in range(schedule.devices):
            check_deadline(_SIMULATING)
            while cursor[r] < offsets[r + 1] and all(done[d] for d, _ in deps[cursor[r]]):
                done[cursor[r]] = True
                order.append(int(cursor[r]))
                cursor[r] += 1
                progress = True
        if not progress:
            stuck = [str(leaves[r][cursor[r] - offsets[r]]) for r in range(schedule.devices)
                     if cursor[r] < offsets[r + 1]]
            raise ValueError(f"schedule deadlocks: every rank waits ({', '.join(stuck)})")
    return _Graph(np.array(order), np.array(rank_of), op_of, np.array(chunk_of), np.array(previous),
                  deps, offsets)


@dataclass(frozen=True)
class Simulation:
    """The timeline of one step: per rank, the start and end of each leaf action
    (``schedule.leaves[r]``), the step time, each rank's busy time and the bubble."""

    start: tuple[np.ndarray, ...]
    end: tuple[np.ndarray, ...]
    step_time: float
    busy: np.ndarray
    bubble_fraction: float     #: idle share of all ranks over the step: 1 - sum(busy) / (P x step)


#: per-chunk (or per-boundary) durations
_Durations = Sequence[float] | np.ndarray


def _per_chunk(name: str, values: _Durations, size: int) -> np.ndarray:
    a = np.asarray(values, dtype=np.float64)
    if a.shape != (size,):
        raise OptionError(name, f"expected {size} values (one per chunk or boundary), got shape {a.shape}")
    if not np.all(np.isfinite(a)) or np.any(a < 0):
        raise OptionError(name, "expected finite values >= 0")
    return a


def _durations(schedule: ScheduleInstance, forward: _Durations, backward_input: _Durations,
               backward_weight: _Durations | None,
               transfer: _Durations | None) -> tuple[np.ndarray, dict[Op, np.ndarray]]:
    """The checked per-chunk durations of each kind of action, and each boundary's transfer time (0
    between two chunks of one rank: a V's turn sends nothing)."""
    C = schedule.chunks
    f = _per_chunk("forward", forward, C)
    b = _per_chunk("backward_input", backward_input, C)
    w = np.zeros(C) if backward_weight is None else _per_chunk("backward_weight", backward_weight, C)
    t = np.zeros(max(C - 1, 0)) if transfer is None else _per_chunk("transfer", transfer, max(C - 1, 0))
    ranks = np.asarray(schedule.chunk_rank)
    t = np.where(ranks[:-1] == ranks[1:], 0.0, t)
    return t, {Op.FORWARD: f, Op.BACKWARD_INPUT: b, Op.BACKWARD_WEIGHT: w, Op.FULL_BACKWARD: b + w}


def simulate(schedule: ScheduleInstance, forward: Sequence[float] | np.ndarray,
             backward_input: Sequence[float] | np.ndarray,
             backward_weight: Sequence[float] | np.ndarray | None = None,
             transfer: Sequence[float] | np.ndarray | None = None) -> Simulation:
    """Simulate one step of ``schedule`` from per-chunk durations of F, B (input gradient) and W
    (weight gradient; a full backward takes B + W) and per-boundary transfer times (boundary
    ``c`` lies between chunks ``c`` and ``c + 1``; taken as 0 where both are on one rank).

    Each rank runs its leaf actions one at a time in list order, each starting when the rank is
    free and its inputs are there: F(m,c) after F(m,c-1) + transfer; B(m,c) after F(m,c) and
    after B(m,c+1) + transfer; W(m,c) after B(m,c). Every rank starts at time 0."""
    t, duration = _durations(schedule, forward, backward_input, backward_weight, transfer)
    g = _graph(schedule)
    n = len(g.op_of)
    start = np.zeros(n)
    end = np.zeros(n)
    for i, lid in enumerate(g.order):
        if not i & _EVERY:
            check_deadline(_SIMULATING)
        ready = end[g.previous[lid]] if g.previous[lid] >= 0 else 0.0
        for d, boundary in g.deps[lid]:
            arrival = end[d] + (t[boundary] if boundary >= 0 else 0.0)
            if arrival > ready:
                ready = arrival
        start[lid] = ready
        end[lid] = ready + duration[g.op_of[lid]][g.chunk_of[lid]]
    o = g.rank_offsets
    starts = tuple(start[o[r]:o[r + 1]] for r in range(schedule.devices))
    ends = tuple(end[o[r]:o[r + 1]] for r in range(schedule.devices))
    busy = np.array([float(np.sum(e - s)) for s, e in zip(starts, ends)])
    step = float(end.max()) if n else 0.0
    bubble = 1.0 - float(busy.sum()) / (schedule.devices * step) if step > 0 else 0.0
    return Simulation(starts, ends, step, busy, bubble)


@dataclass(frozen=True)
class CriticalPath:
    """The longest chain of one step (one rank's optimizer step at its end): how many forwards,
    B's and W's of each chunk it runs, which boundaries it crosses, and whose optimizer step ends
    it. Its length, sum(counts x durations) + transfers + that optimizer time, is the step time;
    for any other durations it is a lower bound on the step time (the chain still exists)."""

    length: float
    forward: np.ndarray        # (C,) forwards of each chunk on the path
    backward_input: np.ndarray
    backward_weight: np.ndarray
    transfers: np.ndarray      # (C-1,) crossings of each boundary
    optimizer_rank: int        # the rank whose optimizer step ends it


def critical_path(schedule: ScheduleInstance, forward: _Durations, backward_input: _Durations,
                  backward_weight: _Durations | None = None, transfer: _Durations | None = None,
                  optimizer: ArrayLike | None = None) -> CriticalPath:
    """The step time of ``schedule`` with each rank's optimizer step (``optimizer``: seconds per
    rank, default 0) after its last action, and the chain of actions that makes it (see
    ``simulate`` for the rules)."""
    t, duration = _durations(schedule, forward, backward_input, backward_weight, transfer)
    opt = np.zeros(schedule.devices) if optimizer is None else np.asarray(optimizer, float)
    g = _graph(schedule)
    n = len(g.op_of)
    order, previous, rows = g.lists
    table = np.stack([duration[Op.FORWARD], duration[Op.BACKWARD_INPUT], duration[Op.BACKWARD_WEIGHT],
                      duration[Op.FULL_BACKWARD]])
    took: list[float] = table[rows, g.chunk_of].tolist() if n else []
    crossing: list[float] = [*t.tolist(), 0.0]            # boundary -1 (none) reads the 0.0 at the end
    deps = g.deps
    end_of = [0.0] * n
    came_from_of = [-1] * n                       # the predecessor that set the start
    crossed_of = [-1] * n                         # the boundary crossed from it (-1: none)
    for i, lid in enumerate(order):
        if not i & _EVERY:
            check_deadline(_SIMULATING)
        before = previous[lid]
        ready = end_of[before] if before >= 0 else 0.0
        came_from_of[lid] = before
        for d, boundary in deps[lid]:
            arrival = end_of[d] + crossing[boundary]
            if arrival > ready:
                ready, came_from_of[lid], crossed_of[lid] = arrival, d, boundary
        end_of[lid] = ready + took[lid]
    end = np.array(end_of)
    came_from, crossed = np.array(came_from_of, np.int64), np.array(crossed_of, np.int64)
    o = g.rank_offsets
    finish = np.array([end[o[r + 1] - 1] if o[r + 1] > o[r] else 0.0 for r in range(schedule.devices)]) + opt
    r = int(np.argmax(finish))
    C = schedule.chunks
    counts = {op: np.zeros(C, np.int64) for op in (Op.FORWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT)}
    transfers = np.zeros(max(C - 1, 0), np.int64)
    lid = int(o[r + 1] - 1) if o[r + 1] > o[r] else -1
    while lid >= 0:
        op, c = g.op_of[lid], int(g.chunk_of[lid])
        if op is Op.FULL_BACKWARD:
            counts[Op.BACKWARD_INPUT][c] += 1
            counts[Op.BACKWARD_WEIGHT][c] += 1
        else:
            counts[op][c] += 1
        if crossed[lid] >= 0 and t[crossed[lid]] > 0:
            transfers[crossed[lid]] += 1
        lid = int(came_from[lid])
    return CriticalPath(float(finish[r]), counts[Op.FORWARD], counts[Op.BACKWARD_INPUT], counts[Op.BACKWARD_WEIGHT],
                        transfers, r)
