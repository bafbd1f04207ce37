"""One chunk split evaluated exactly: each rank's peak from the schedule's own memory accounting
(``schedule_memory.rank_memory``), the step time as the schedule simulated
(``schedule_simulation.critical_path``, each rank's optimizer step after its last action), the
bubble, and whether it fits and keeps the layer-count and pin rules. With recompute left to the
search (AUTO), a split gets the least recompute that makes its ranks fit (``fitting_choice``).
Every search (``chunk_search``, ``chunk_cpsat``) judges its splits with these.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from .chunk_problem import Bounds, ChunkProblem, ChunkResult, chunk_memory, step_durations
from .chunk_recompute import prefix_choice, recompute_option_figures, recompute_options
from .schedule_memory import chunks_in_flight, rank_peaks
from .schedule_simulation import critical_path

__all__ = ["chunk_rule_violation", "evaluate_chunk_choice", "evaluate_chunk_split", "fitting_choice"]


def chunk_rule_violation(problem: ChunkProblem, bounds: Bounds) -> str:
    """Which layer-count or pin rule the split ``bounds`` breaks, in words (empty where it keeps them all)."""
    b = np.asarray(bounds)
    sizes = np.diff(b)
    if np.any(sizes < max(problem.min_layers, 1)):
        return "a chunk holds fewer layers than allowed"
    if problem.max_layers is not None and np.any(sizes > problem.max_layers):
        return "a chunk holds more layers than allowed"
    missing = [j for j in problem.pinned_splits if j not in set(b.tolist())]
    if missing:
        return f"no chunk starts at pinned layer {missing[0]}"
    return ""


def evaluate_chunk_split(problem: ChunkProblem, bounds: Bounds, choice: ArrayLike | None = None) -> ChunkResult:
    """The split ``bounds`` (C + 1 boundaries from 0 to L) evaluated exactly, with each layer's
    recompute option ``choice`` (default: the problem's fixed one; with AUTO, the least
    recompute that makes every rank fit, ``fitting_choice``)."""
    bounds = tuple(int(x) for x in bounds)
    if choice is None:
        choice = problem.fixed_choice()
        if choice is None:
            return fitting_choice(problem, bounds)
    return evaluate_chunk_choice(problem, bounds, np.asarray(choice, np.int64))


def evaluate_chunk_choice(problem: ChunkProblem, bounds: tuple[int, ...], choice: np.ndarray) -> ChunkResult:
    """The split ``bounds`` evaluated exactly with each layer's recompute option ``choice`` as given."""
    memory = chunk_memory(problem.table, bounds, problem.schedule, choice)
    peaks = rank_peaks(problem.schedule, memory)
    f, bi, bw, transfer, optimizer = step_durations(problem, bounds, choice)
    path = critical_path(problem.schedule, f, bi, bw, transfer, optimizer)
    busy = np.bincount(np.asarray(problem.schedule.chunk_rank), weights=problem.schedule.micro_batches * (f + bi + bw),
                       minlength=problem.schedule.devices) + optimizer
    step = path.length
    bubble = max(1.0 - float(busy.sum()) / (problem.schedule.devices * step), 0.0) if step > 0 else 0.0
    reason = chunk_rule_violation(problem, bounds)
    over = np.flatnonzero(peaks > np.asarray(problem.capacities))
    if not reason and len(over):
        r = int(over[0])
        reason = f"rank {r} needs {int(peaks[r]):,} bytes, more than its {int(problem.capacities[r]):,}"
    return ChunkResult(bounds, not reason, reason, step, bubble, tuple(int(p) for p in peaks), memory,
                       tuple(int(x) for x in choice), path, problem.schedule)


def fitting_choice(problem: ChunkProblem, bounds: Bounds) -> ChunkResult:
    """A split with the recompute its ranks need to fit (AUTO), as recompute prefixes (each
    chunk's first layers full, the next selective: ``prefix_choice``): from none, on each rank
    that does not fit, the prefix extensions that save the most bytes per unit of time added, as
    many as its excess needs (each saving counted once per micro-batch its chunk holds in
    flight), until every rank fits or no extension is left. A good choice, not a proven one
    (``solve_chunks_cpsat`` proves)."""
    bounds = tuple(int(x) for x in bounds)
    L, C = problem.num_layers, len(bounds) - 1
    current = evaluate_chunk_choice(problem, bounds, np.zeros(L, np.int64))
    if (problem.table.recompute is None or chunk_rule_violation(problem, bounds)
            or all(len(o) == 1 for o in recompute_options(problem))):
        return current
    saved, _, added = recompute_option_figures(problem)
    copies = chunks_in_flight(problem.schedule)
    rank_of = np.asarray(problem.schedule.chunk_rank)
    full, selective = [0] * C, [0] * C

    def moves(c: int) -> list[tuple[int, float, int, int]]:
        """(bytes saved per micro-batch, time added, new full, new selective) of chunk c's
        extensions: the full prefix by one layer (over a selective one, it shrinks that), or the
        selective part by one."""
        a, e = bounds[c], bounds[c + 1]
        p, r = a + full[c], a + full[c] + selective[c]
        out = []
        if p < e:
            was = 1 if selective[c] else 0
            out.append((int(saved[2, p] - saved[was, p]), float(added[2, p] - added[was, p]), full[c] + 1,
                        max(selective[c] - 1, 0)))
        if r < e:
            out.append((int(saved[1, r]), float(added[1, r]), full[c], selective[c] + 1))
        return out

    while not current.feasible:
        changed = False
        for rank, peak in enumerate(current.rank_peaks):
            excess = int(peak - problem.capacities[rank])
            while excess > 0:
                options = [(-gain / max(cost, 1e-30), c, gain, f, g) for c in np.flatnonzero(rank_of == rank)
                           for gain, cost, f, g in moves(int(c)) if gain > 0]
                if not options:
                    break
                _, c, gain, f, g = min(options)
                full[c], selective[c] = f, g
                excess -= gain * int(copies[c])
                changed = True
        if not changed:
            break
        current = evaluate_chunk_choice(problem, bounds, prefix_choice(problem, bounds, full, selective))
    return current
