"""Searching chunk splits without a solver: ``local_search`` (a balanced start, then one boundary
moved at a time while the objective improves: a good split fast, and the chains that seed CP-SAT)
and ``exhaustive`` (every split, and with AUTO recompute every recompute prefix: the oracle of the
tests, small problems only). The proven search is ``chunk_cpsat``.
"""

from __future__ import annotations

import itertools
import math
import time as _time
from collections.abc import Iterator

import numpy as np

from ..common.deadline import TimeLimitReached, seconds_left
from .chunk_evaluation import evaluate_chunk_choice, evaluate_chunk_split
from .chunk_problem import Bounds, ChunkProblem, ChunkResult
from .chunk_recompute import prefix_choice

__all__ = ["exhaustive", "local_search"]


def _all_splits(L: int, C: int) -> Iterator[tuple[int, ...]]:
    for cuts in itertools.combinations(range(1, L), C - 1):
        yield (0, *cuts, L)


def exhaustive(problem: ChunkProblem) -> ChunkResult | None:
    """The best split by trying every one, and with AUTO recompute every recompute prefix of
    every chunk (``prefix_choice``; the oracle of the tests: small problems only)."""
    best = None
    fixed = problem.fixed_choice()
    for bounds in _all_splits(problem.num_layers, problem.chunks):
        for choice in ([fixed] if fixed is not None else _prefix_choices(problem, bounds)):
            r = evaluate_chunk_choice(problem, bounds, choice)
            if best is None or r.key(problem) < best.key(problem):
                best = r
    return best if best is not None and best.feasible else None


def _prefix_choices(problem: ChunkProblem, bounds: Bounds) -> list[np.ndarray]:
    """Every distinct per-layer choice of recompute prefixes on ``bounds``."""
    sizes = np.diff(bounds)
    per_chunk = [[(f, g) for f in range(n + 1) for g in range(n + 1 - f)] for n in sizes]
    out: dict[bytes, np.ndarray] = {}
    for combo in itertools.product(*per_chunk):
        choice = prefix_choice(problem, bounds, [f for f, _ in combo], [g for _, g in combo])
        out.setdefault(choice.tobytes(), choice)
    return list(out.values())


def _balanced(problem: ChunkProblem) -> tuple[int, ...]:
    """Boundaries that split the layers' total time (F + B + W) most evenly: the bottleneck DP
    over C contiguous chunks of at least ``min_layers`` layers."""
    L, C = problem.num_layers, problem.chunks
    t = problem.table.layer_times[:, :3].sum(axis=1)
    prefix = np.concatenate([[0.0], np.cumsum(t)])
    lo = max(problem.min_layers, 1)
    INF = math.inf
    best = np.full((C + 1, L + 1), INF)
    choice = np.zeros((C + 1, L + 1), np.int64)
    best[0, 0] = 0.0
    for c in range(1, C + 1):
        for e in range(c * lo, L + 1):
            starts = np.arange((c - 1) * lo, e - lo + 1)
            if problem.max_layers is not None:
                starts = starts[e - starts <= problem.max_layers]
            if not len(starts):
                continue
            cand = np.maximum(best[c - 1, starts], prefix[e] - prefix[starts])
            k = int(np.argmin(cand))
            best[c, e], choice[c, e] = cand[k], starts[k]
    bounds = [L]
    for c in range(C, 0, -1):
        bounds.append(int(choice[c, bounds[-1]]))
    return tuple(reversed(bounds))


def local_search(problem: ChunkProblem, start: tuple[int, ...] | None = None, budget_s: float = 5.0,
                 seen: list[ChunkResult] | None = None) -> ChunkResult:
    """A good split fast: the balanced split, then single boundary moves (by up to 3 layers)
    while one improves the objective (feasibility first: the summed excess over capacity).
    ``seen`` collects every split evaluated (their critical paths seed CP-SAT). The search's
    time limit (common/deadline.py) ends it with the best so far; only where it is reached in the
    first evaluation is ``TimeLimitReached`` raised."""
    deadline = _time.monotonic() + min(budget_s, seconds_left())
    # the search's time limit: raised if reached in this first evaluation
    current = evaluate_chunk_split(problem, start or _balanced(problem))
    if seen is not None:
        seen.append(current)
    improved = True
    try:
        while improved and _time.monotonic() < deadline:
            improved = False
            for i in range(1, problem.chunks):
                for step in (-3, -2, -1, 1, 2, 3):
                    b = list(current.bounds)
                    b[i] += step
                    if not b[i - 1] < b[i] < b[i + 1]:
                        continue
                    if seconds_left() <= 0:      # the search's limit: one evaluation can take seconds
                        return current
                    cand = evaluate_chunk_split(problem, b)
                    if seen is not None:
                        seen.append(cand)
                    if cand.key(problem) < current.key(problem):
                        current, improved = cand, True
    except TimeLimitReached:            # the best so far
        pass
    return current
