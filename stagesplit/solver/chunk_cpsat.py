"""The chunk split of a pipeline schedule, proven optimal with CP-SAT (``solve_chunks_cpsat``).

CP-SAT chooses the boundaries with every rank's memory as exact table lookups and the step time
bounded below by a growing set of chains of actions (each the critical path of a split it
proposed, ``schedule_simulation.critical_path``); when the split it proposes is as fast as its
bound, no split is faster. The search runs in rounds: each builds the model afresh with the chains
known so far (``chunk_cpsat_model``), solves it, evaluates the split it proposes exactly
(``chunk_evaluation``) and adds that split's chain, and those of the splits around it, for the next.
The quick search (``chunk_search.local_search``) gives the first split and the first chains.
"""

from __future__ import annotations

import math
import time as _time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..common.deadline import Deadline, TimeLimitReached
from .chunk_cpsat_model import ChunkModel, ModelTables, build_chunk_model, model_tables, solution_log, time_slack_units
from .chunk_evaluation import evaluate_chunk_choice
from .chunk_problem import ChunkProblem, ChunkResult, step_durations
from .chunk_recompute import prefix_choice
from .chunk_search import local_search
from .request import Objective
from .schedule_memory import memory_signatures
from .schedule_simulation import CriticalPath, critical_path

__all__ = ["CUTOFF", "MAX_SEED_PATHS", "ChunkSolve", "solve_chunks_cpsat"]

#: each round of the compute objective looks only for splits faster than the best known
CUTOFF = True

#: how many of the quick search's chains seed the CP-SAT model
MAX_SEED_PATHS = 200


@dataclass
class ChunkSolve:
    """What ``solve_chunks_cpsat`` found: the best split (None: none fits), whether it is proven
    optimal, the proven lower bound on the objective, the chains it used and how long it took."""

    result: ChunkResult | None
    optimal: bool
    bound: float
    paths: int
    seconds: float
    status: str
    notes: list[str] = field(default_factory=list)


def _scale(problem: ChunkProblem) -> float:
    """Integer time units per second (or compute unit): the whole step fits in about 1e9."""
    total = float(problem.table.layer_times.sum()) * problem.schedule.micro_batches * 4 + 1e-30
    return 1e9 / total


def _path_key(path: CriticalPath) -> tuple[int, bytes, bytes, bytes, bytes]:
    return (path.optimizer_rank, path.forward.tobytes(), path.backward_input.tobytes(),
            path.backward_weight.tobytes(), path.transfers.tobytes())


@dataclass
class _Search:
    """What the search has so far (what it returns where the time limit stops it in a long
    computation): the best split, the proven bound, the status, and the chains without repeats."""

    problem: ChunkProblem
    scale: float
    best: ChunkResult | None = None
    bound: float = 0.0
    status: str = "unknown"
    paths: list[CriticalPath] = field(default_factory=list)
    keys: set[tuple[int, bytes, bytes, bytes, bytes]] = field(default_factory=set)

    @property
    def slack(self) -> float:
        """The model's rounding of times to integers, in seconds (or compute units)."""
        return time_slack_units(self.problem.chunks) / self.scale

    def offer(self, result: ChunkResult) -> None:
        """Keep ``result`` where it is better than the best so far."""
        if self.best is None or result.key(self.problem) < self.best.key(self.problem):
            self.best = result

    def path_of(self, r: ChunkResult) -> CriticalPath:
        if r.path is not None:
            return r.path
        f, bi, bw, transfer, optimizer = step_durations(self.problem, r.bounds, r.choice)
        return critical_path(self.problem.schedule, f, bi, bw, transfer, optimizer)

    def add_path(self, path: CriticalPath) -> bool:
        """Keep a chain (every chain is a lower bound for every split); False if known."""
        key = _path_key(path)
        if key in self.keys:
            return False
        self.keys.add(key)
        self.paths.append(path)
        return True

    def step_to_beat(self) -> float:
        """The compute objective's step to beat: the best known, or the cutoff where that is lower
        (infinite with the memory objective)."""
        problem = self.problem
        if problem.objective is Objective.MEMORY or not CUTOFF:
            return math.inf
        return min(self.best.step_time if self.best is not None else math.inf,
                   problem.cutoff if problem.cutoff is not None else math.inf)


def solve_chunks_cpsat(problem: ChunkProblem, hint: ChunkResult | None = None, max_rounds: int = 50,
                       deadline: Deadline | None = None) -> ChunkSolve:
    """The optimal split (see the module docstring), or the best found by ``deadline`` (default: the
    problem's time limit from now) with a proven bound. With ``problem.cutoff``, only splits faster than it are sought: status
    "slower" (bound at the cutoff) where none fits, otherwise as without it. Where the search's
    time limit (common/deadline.py) is reached inside a long computation, the best split so far
    (None if none) with status "time limit"."""
    started = _time.monotonic()
    deadline = deadline if deadline is not None else Deadline.after(problem.time_limit)
    search = _Search(problem, _scale(problem))
    time_left = deadline.left

    try:
        tables = _start(search, hint, deadline)
        rounds = 0
        while rounds < max_rounds:
            rounds += 1
            if time_left() <= 0.05:
                search.status = "time limit"
                break
            built = build_chunk_model(problem, tables, search.paths, search.step_to_beat(), search.best)
            # building the model took time too: the search gets what is left of the limit
            remaining = time_left()
            if remaining <= 0.05:
                search.status = "time limit"
                break
            if not _solve_round(search, tables, built, remaining):
                break
    except TimeLimitReached:            # stopped in a long computation: the best split so far, not proven
        search.status = "time limit"
    seconds = _time.monotonic() - started
    if search.status == "infeasible":
        return ChunkSolve(None, False, math.inf, len(search.paths), seconds, search.status)
    best, bound = search.best, search.bound
    optimal = search.status == "optimal"
    if best is not None and optimal and problem.objective is not Objective.MEMORY:
        # rounding of times to integers: the proof holds up to one time unit per action
        bound = min(max(bound, best.step_time - 2 * search.slack), best.step_time)
    return ChunkSolve(best, optimal, bound, len(search.paths), seconds, search.status)


def _start(search: _Search, hint: ChunkResult | None, deadline: Deadline) -> ModelTables:
    """The first split (``hint``, or the quick search's), the chains of every split the quick
    search tried (a tight start for the step's bound), and the tables every round's model reads."""
    problem = search.problem
    seen: list[ChunkResult] = []
    if hint is None or not hint.feasible:
        hint = local_search(problem, budget_s=min(2.0, deadline.left() / 4), seen=seen)
    seen.append(hint)
    search.best = hint if hint.feasible else None
    kept = problem.table.unsharded_after_backward       # FSDP2 under a schedule: parameters left unsharded
    signatures = memory_signatures(problem.schedule, unsharded=kept is not None and bool(np.any(kept)))
    # (after the hint: a split to return if time runs out)
    for r in sorted(seen, key=lambda r: r.key(problem))[:MAX_SEED_PATHS]:
        search.add_path(search.path_of(r))
    return model_tables(problem, signatures, search.scale)


def _solver(problem: ChunkProblem, remaining: float, recompute: bool) -> Any:   # a cp_model.CpSolver
    from ortools.sat.python import cp_model

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = remaining
    solver.parameters.num_search_workers = problem.workers
    # measured on the schedule models (bench_schedules.py): the LP relaxation and probing cost
    # more than they prune here (element tables of chunk figures): a third of the time
    if not recompute:               # with recompute variables, the LP bound is what proves
        solver.parameters.linearization_level = 0
        solver.parameters.cp_model_probing_level = 0
    # CP-SAT's presolve stays on with recompute variables, on deep models too. It was off above 64
    # layers while the range lookups had (L + 1)^2 entries: on the Llama-3.1-405B shape (126 layers, 2
    # chunks) it ran minutes past a 20 s limit and took 8 GB. Over the ranges a chunk may hold
    # (``_chunk_ranges``, ``_prefix_pairs``) it is what keeps deep models small: the model loaded
    # without it expands every lookup, and the 405B's TP 8 rank in 64 chunks (interleaved 1F1B)
    # took 1.8 GB in 60 s, 0.75 GB with it; its 2-chunk split is proven in 7 s with it, unproven in
    # 20 s without (benchmarks/bench_layouts.py, docs/benchmarks.md)
    return solver


def _solve_round(search: _Search, tables: ModelTables, built: ChunkModel, remaining: float) -> bool:
    """Solve one round's model and learn from its answer; False where the search ends there."""
    from ortools.sat.python import cp_model

    problem = search.problem
    y = built.recompute
    solver = _solver(problem, remaining, bool(y))
    log = solution_log(built.boundaries, y, problem.chunks)
    code = solver.Solve(built.model, log)
    if code == cp_model.MODEL_INVALID:
        raise RuntimeError(f"internal error: CP-SAT model invalid: {built.model.Validate()}")
    if code == cp_model.INFEASIBLE:
        _nothing_better(search)
        return False
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        search.status = "time limit"
        return False
    bounds = tuple(int(solver.Value(x)) for x in built.boundaries)
    L, C = problem.num_layers, problem.chunks
    choice = tables.fixed if tables.fixed is not None else np.zeros(L, np.int64)
    if tables.auto:
        choice = prefix_choice(problem, bounds, [solver.Value(y[c, "full"]) for c in range(C)],
                               [solver.Value(y[c, "selective"]) for c in range(C)]) if y else \
            np.zeros(L, np.int64)
    found = evaluate_chunk_choice(problem, bounds, choice)
    search.offer(found)
    if problem.objective is Objective.MEMORY:
        # the model's share is in whole parts per million, rounded up: the true share is at
        # least one part below its bound
        search.bound = max(solver.BestObjectiveBound() - 1, 0) / 10**6
        search.status = "optimal" if code == cp_model.OPTIMAL else "time limit"
        return False
    search.bound = max(search.bound, solver.BestObjectiveBound() / search.scale)
    path = search.path_of(found)
    known = _path_key(path) in search.keys
    if code == cp_model.OPTIMAL and (known or found.step_time <= solver.ObjectiveValue() / search.scale
                                     + search.slack):
        search.status = "optimal"
        return False
    if known:                   # the model cannot improve on it within its time limit
        search.status = "time limit"
        return False
    search.add_path(path)
    _add_nearby_chains(search, bounds, choice, log.found, bool(y))
    return True


def _nothing_better(search: _Search) -> None:
    """The model has no solution: no split beats the cutoff ("slower"), or none beats the best
    known ("optimal"), or none fits ("infeasible")."""
    problem = search.problem
    best = search.best
    slower = problem.cutoff is not None and problem.objective is not Objective.MEMORY and \
        (best is None or best.step_time >= problem.cutoff)
    if slower:                        # nothing beats the cutoff: not this schedule's own proof
        search.status = "slower"
        assert problem.cutoff is not None
        search.bound = max(search.bound, problem.cutoff - 2 * search.slack)
    elif best is not None and problem.objective is not Objective.MEMORY:
        search.status = "optimal"            # nothing beats the best known
    else:
        search.status = "infeasible"


def _add_nearby_chains(search: _Search, bounds: tuple[int, ...], choice: np.ndarray,
                       found: list[tuple[tuple[int, ...], tuple[list[int], list[int]] | None]],
                       recompute: bool) -> None:
    """The chains of the other splits the round's search went through on its way, and of the
    proposed split's neighbours (each boundary moved by one layer); any better split is kept."""
    problem = search.problem
    for other, counts in found[:-1]:
        if other != bounds:
            if recompute:
                assert counts is not None         # a recompute round's solutions carry their prefix counts
                other_choice = prefix_choice(problem, other, *counts)
            else:
                other_choice = choice
            r = evaluate_chunk_choice(problem, other, other_choice)
            search.add_path(search.path_of(r))
            search.offer(r)
    for c in range(1, problem.chunks):
        for step in (-1, 1):
            b = list(bounds)
            b[c] += step
            if b[c - 1] < b[c] < b[c + 1]:
                neighbour = evaluate_chunk_choice(problem, tuple(b), choice)
                search.add_path(search.path_of(neighbour))
                search.offer(neighbour)
