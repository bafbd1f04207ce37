"""Splitting layers into the chunks of a pipeline schedule (one or more per rank) so that every
rank fits and the step is fastest.

A split is ``C = v x P`` contiguous, non-empty chunks (chunk ``c`` runs on rank
``schedule.chunk_rank[c]``). For a split:

* each chunk's figures come from the cost model's ``PhaseTable`` (model/phases.py) with what
  torch.distributed.pipelining's runtime adds (``chunk_memory``);
* each rank's peak is the schedule's own accounting (``schedule.rank_memory``): resident bytes,
  the stashes of the micro-batches in flight at each action, and the action's transient;
* the step time is the schedule simulated (``schedule.critical_path``), each rank's optimizer
  step after its last action.

Three searches share that evaluation: ``exhaustive`` (every split: the oracle for small
problems), ``local_search`` (a balanced start moved a boundary at a time), and ``solve_cpsat``,
which proves optimality: CP-SAT chooses the boundaries with every rank's memory as exact table
lookups and the step time bounded below by a growing set of chains of actions (each the
critical path of a split it proposed); when the split it proposes is as fast as its bound, no
split is faster.
"""

from __future__ import annotations

import itertools
import math
import time as _time
from dataclasses import dataclass, field, replace

import numpy as np

from ..model.phases import PhaseTable
from .request import Objective
from .schedule import (ChunkMemory, Op, RankMemory, Schedule, ScheduleKind, critical_path, memory_signatures,
                       rank_memory)

__all__ = ["ChunkProblem", "ChunkResult", "chunk_memory", "evaluate", "exhaustive", "local_search", "solve_cpsat"]


@dataclass(frozen=True)
class ChunkProblem:
    """What a chunk split must satisfy and minimise."""

    table: PhaseTable
    schedule: Schedule
    capacities: np.ndarray                  # (P,) bytes each rank may use
    seconds_per_byte: float = 0.0           # transfer time of a byte crossing a boundary between ranks
    objective: Objective = Objective.COMPUTE
    min_layers: int = 1
    max_layers: int | None = None
    pinned_splits: tuple[int, ...] = ()     # a chunk starts at each of these layers
    time_limit: float = 60.0
    workers: int = 1

    @property
    def chunks(self) -> int:
        return self.schedule.chunks

    @property
    def num_layers(self) -> int:
        return self.table.num_layers


def chunk_memory(table: PhaseTable, bounds, schedule: Schedule) -> ChunkMemory:
    """The chunks' figures as torch.distributed.pipelining's runtime holds them (each rule
    measured on real pipelines, tests/solver/test_chunks_torch.py):

    * every stage keeps one receive buffer per micro-batch for its input (all but the first
      chunk) and for its output's gradient (all but the last): resident;
    * a chunk's received input is that buffer, so the stash does not count it again;
    * the last chunk keeps each micro-batch's output (the loss's input) until its backward;
    * where the backward is split (zero-bubble), B keeps the whole stash and the output
      gradients W reads (``weight_stash``) and holds them through B and W; the first chunk's
      B does nothing (the model's input needs no gradient) and its W runs the whole backward;
    * runtimes that wait on sends only at the step's end keep each sent output and input
      gradient (``retained``); Schedule1F1B keeps one of the last chunk's outputs and its input
      gradient between micro-batches."""
    cc = table.chunks(bounds)
    b = np.asarray(bounds, np.int64)
    C = len(b) - 1
    M = schedule.micro_batches
    first, last = np.arange(C) == 0, np.arange(C) == C - 1
    received = np.where(first, 0, table.forward_cut[b[:-1]]).astype(np.int64)
    grad_received = np.where(last, 0, table.backward_cut[b[1:]]).astype(np.int64)
    resident = cc.resident + M * (received + grad_received)
    kept_output = np.where(last, cc.output, 0)
    stash = np.maximum(cc.stash - received, 0) + kept_output
    weight_stash = np.maximum(cc.weight_stash - received, 0) + kept_output
    split = schedule.traits.splits_backward
    extra = cc.weight_stash - cc.stash if split else 0
    backward = cc.backward_input_peak + extra
    weight = cc.backward_weight_peak + extra
    if split:
        # the model's input needs no gradient: the first chunk's B has nothing to do and its W
        # runs the whole backward from the stash
        backward[0] = stash[0]
        weight_stash[0] = stash[0]
        weight[0] = cc.full_backward_peak[0]
    forward, full = cc.forward_peak.copy(), cc.full_backward_peak.copy()
    if schedule.kind is ScheduleKind.ONE_F_ONE_B and C > 1:
        held = cc.output[-1] + cc.sent_backward[-1]
        forward[-1] += held
        full[-1] += held
    return ChunkMemory(resident=resident, stash=stash, weight_stash=weight_stash, forward_peak=forward,
                       backward_peak=backward, weight_peak=weight, full_backward_peak=full,
                       optimizer_peak=cc.optimizer_peak, retained=cc.sent_forward + cc.sent_backward)


@dataclass(frozen=True)
class ChunkResult:
    """A split and what it gives: ``feasible`` when every rank fits (and the layer-count and
    pin rules hold), the step time and its bubble, and each rank's memory."""

    bounds: tuple[int, ...]
    feasible: bool
    reason: str
    step_time: float
    bubble: float
    ranks: tuple[RankMemory, ...]
    memory: ChunkMemory

    @property
    def peaks(self) -> np.ndarray:
        return np.array([r.peak for r in self.ranks], np.int64)

    def key(self, problem: ChunkProblem) -> tuple:
        """What the objective orders splits by: feasible ones first; among splits that do not
        fit, the one closest to fitting (the fullest rank's share of its capacity)."""
        shares = self.peaks / problem.capacities
        fraction = float(np.max(shares))
        if not self.feasible:
            return (1, float(np.maximum(shares - 1, 0).sum()), fraction, self.step_time)
        if problem.objective is Objective.MEMORY:
            return (0, fraction, self.step_time)
        return (0, self.step_time, fraction)


def _times(problem: ChunkProblem, bounds) -> tuple:
    cc = problem.table.chunks(bounds)
    b = np.asarray(bounds, np.int64)
    crossing = problem.table.forward_cut[b[1:-1]] + problem.table.backward_cut[b[1:-1]]
    transfer = crossing / 2 * problem.seconds_per_byte      # each direction once per micro-batch
    ranks = np.asarray(problem.schedule.chunk_rank)
    optimizer = np.bincount(ranks, weights=cc.optimizer_time, minlength=problem.schedule.devices)
    return cc.forward_time, cc.backward_input_time, cc.backward_weight_time, transfer, optimizer


def _rules(problem: ChunkProblem, bounds) -> str:
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


def evaluate(problem: ChunkProblem, bounds) -> ChunkResult:
    """The split ``bounds`` (C + 1 boundaries from 0 to L) evaluated exactly."""
    bounds = tuple(int(x) for x in bounds)
    memory = chunk_memory(problem.table, bounds, problem.schedule)
    ranks = rank_memory(problem.schedule, memory)
    f, bi, bw, transfer, optimizer = _times(problem, bounds)
    path = critical_path(problem.schedule, f, bi, bw, transfer, optimizer)
    busy = np.bincount(np.asarray(problem.schedule.chunk_rank), weights=problem.schedule.micro_batches * (f + bi + bw),
                       minlength=problem.schedule.devices) + optimizer
    step = path.length
    bubble = 1.0 - float(busy.sum()) / (problem.schedule.devices * step) if step > 0 else 0.0
    reason = _rules(problem, bounds)
    over = [r.rank for r in ranks if r.peak > problem.capacities[r.rank]]
    if not reason and over:
        r = ranks[over[0]]
        reason = f"rank {r.rank} needs {r.peak:,} bytes, more than its {int(problem.capacities[r.rank]):,}"
    return ChunkResult(bounds, not reason, reason, step, bubble, ranks, memory)


def _all_splits(L: int, C: int):
    for cuts in itertools.combinations(range(1, L), C - 1):
        yield (0, *cuts, L)


def exhaustive(problem: ChunkProblem) -> ChunkResult | None:
    """The best split by trying every one (the oracle of the tests: small problems only)."""
    best = None
    for bounds in _all_splits(problem.num_layers, problem.chunks):
        r = evaluate(problem, bounds)
        if best is None or r.key(problem) < best.key(problem):
            best = r
    return best if best is not None and best.feasible else None


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


def local_search(problem: ChunkProblem, start: tuple[int, ...] | None = None, budget_s: float = 5.0) -> ChunkResult:
    """A good split fast: the balanced split, then single boundary moves (by up to 3 layers)
    while one improves the objective (feasibility first: the summed excess over capacity)."""
    deadline = _time.monotonic() + budget_s
    current = evaluate(problem, start or _balanced(problem))
    improved = True
    while improved and _time.monotonic() < deadline:
        improved = False
        for i in range(1, problem.chunks):
            for step in (-3, -2, -1, 1, 2, 3):
                b = list(current.bounds)
                b[i] += step
                if not b[i - 1] < b[i] < b[i + 1]:
                    continue
                cand = evaluate(problem, b)
                if cand.key(problem) < current.key(problem):
                    current, improved = cand, True
    return current


# --- CP-SAT ----------------------------------------------------------------------------------------

@dataclass
class ChunkSolve:
    """What ``solve_cpsat`` found: the best split (None: none fits), whether it is proven
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


def solve_cpsat(problem: ChunkProblem, hint: ChunkResult | None = None, max_rounds: int = 50) -> ChunkSolve:
    """The optimal split (see the module docstring), or the best found within the time limit
    with a proven bound."""
    from ortools.sat.python import cp_model

    started = _time.monotonic()
    L, C = problem.num_layers, problem.chunks
    P = problem.schedule.devices
    table = problem.table
    scale = _scale(problem)
    lo = max(problem.min_layers, 1)
    sig = memory_signatures(problem.schedule)
    if hint is None or not hint.feasible:
        hint = local_search(problem, budget_s=min(2.0, problem.time_limit / 4))
    paths: list = []
    best = hint if hint.feasible else None
    bound = 0.0

    def path_of(r: ChunkResult):
        f, bi, bw, transfer, optimizer = _times(problem, r.bounds)
        return critical_path(problem.schedule, f, bi, bw, transfer, optimizer)

    if best is not None:
        paths.append(path_of(best))
    # the per-layer prefix times and per-range tables, as integers
    prefix = {k: np.round(np.concatenate([[0.0], np.cumsum(table.layer_times[:, i])]) * scale).astype(np.int64)
              for i, k in enumerate(("F", "B", "W", "O"))}
    cut_units = np.round((table.forward_cut + table.backward_cut) / 2 * problem.seconds_per_byte * scale).astype(np.int64)
    mem = _memory_tables(problem)
    status = "unknown"
    rounds = 0
    while rounds < max_rounds:
        rounds += 1
        remaining = problem.time_limit - (_time.monotonic() - started)
        if remaining <= 0.05:
            status = "time limit"
            break
        m = cp_model.CpModel()
        s = [m.NewConstant(0)] + [m.NewIntVar(c * lo, L - (C - c) * lo, f"s{c}") for c in range(1, C)] + \
            [m.NewConstant(L)]
        for c in range(C):
            m.Add(s[c + 1] - s[c] >= lo)
            if problem.max_layers is not None:
                m.Add(s[c + 1] - s[c] <= problem.max_layers)
        for j in problem.pinned_splits:
            hits = []
            for c in range(1, C):
                h = m.NewBoolVar(f"pin{j}_{c}")
                m.Add(s[c] == j).OnlyEnforceIf(h)
                hits.append(h)
            m.AddBoolOr(hits)
        # prefix times at each boundary
        at = {}
        for k, arr in prefix.items():
            at[k] = []
            for c in range(C + 1):
                v = m.NewIntVar(0, int(arr[-1]), f"{k}{c}")
                m.AddElement(s[c], [int(x) for x in arr], v)
                at[k].append(v)
        cut = []
        for c in range(1, C):
            v = m.NewIntVar(0, int(cut_units.max(initial=0)), f"t{c}")
            m.AddElement(s[c], [int(x) for x in cut_units], v)
            cut.append(v)
        # range lookups: index a * (L + 1) + e of the (L+1) x (L+1) tables
        pair = []
        for c in range(C):
            v = m.NewIntVar(0, (L + 1) ** 2 - 1, f"pair{c}")
            m.Add(v == s[c] * (L + 1) + s[c + 1])
            pair.append(v)

        def lookup(name: str, values: np.ndarray, c: int):
            flat = np.zeros((L + 1, L + 1), np.int64)
            flat[:L, 1:] = values
            v = m.NewIntVar(0, int(max(flat.max(), 0)), f"{name}{c}")
            m.AddElement(pair[c], [int(x) for x in flat.ravel()], v)
            return v

        q = {name: [lookup(name, arr, c) for c in range(C)] for name, arr in mem.items()}
        rank_forms = _rank_forms(sig, q, C)
        for rs, forms in zip(sig, rank_forms):
            for form in forms:
                m.Add(form <= int(problem.capacities[rs.rank]))
        # the step: at least every known chain's length
        horizon = int(prefix["F"][-1] + prefix["B"][-1] + prefix["W"][-1]) * problem.schedule.micro_batches * 2 + \
            int(prefix["O"][-1]) + int(cut_units.sum()) * problem.schedule.micro_batches * 2 + 1
        step = m.NewIntVar(0, horizon, "step")
        rank_of = np.asarray(problem.schedule.chunk_rank)
        for path in paths:
            terms = []
            for c in range(C):
                for k, n in (("F", path.forward[c]), ("B", path.backward_input[c]), ("W", path.backward_weight[c])):
                    if n:
                        terms.append(int(n) * (at[k][c + 1] - at[k][c]))
                if rank_of[c] == path.optimizer_rank:
                    terms.append(at["O"][c + 1] - at["O"][c])
            for j in range(C - 1):
                if path.transfers[j]:
                    terms.append(int(path.transfers[j]) * cut[j])
            m.Add(step >= sum(terms))
        if problem.objective is Objective.MEMORY:
            worst = m.NewIntVar(0, 10**6, "worst_ppm")
            for rs, forms in zip(sig, rank_forms):
                for form in forms:
                    m.Add(worst * int(problem.capacities[rs.rank]) >= form * 10**6)
            m.Minimize(worst)
        else:
            m.Minimize(step)
        if best is not None:
            for c in range(1, C):
                m.AddHint(s[c], best.bounds[c])
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = max(remaining, 0.05)
        solver.parameters.num_search_workers = problem.workers
        code = solver.Solve(m)
        if code == cp_model.MODEL_INVALID:
            raise RuntimeError(f"internal error: CP-SAT model invalid: {m.Validate()}")
        if code == cp_model.INFEASIBLE:
            status = "infeasible"
            return ChunkSolve(None, False, math.inf, len(paths), _time.monotonic() - started, status)
        if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            status = "time limit"
            break
        bounds = tuple(int(solver.Value(x)) for x in s)
        found = evaluate(problem, bounds)
        if best is None or found.key(problem) < best.key(problem):
            best = found
        if problem.objective is Objective.MEMORY:
            # the model's share is in whole parts per million, rounded up: the true share is at
            # least one part below its bound
            bound = max(solver.BestObjectiveBound() - 1, 0) / 10**6
            if code == cp_model.OPTIMAL:
                status = "optimal"
                break
            status = "time limit"
            break
        model_bound = solver.BestObjectiveBound() / scale
        bound = max(bound, model_bound)
        path = path_of(found)
        known = any(_same_path(path, p) for p in paths)
        # times are integers in the model: a chain's length there is within one unit per boundary
        # of each kind it reads of its true length
        slack = (6 * C + 4) / scale
        if code == cp_model.OPTIMAL and (known or found.step_time <= solver.ObjectiveValue() / scale + slack):
            status = "optimal"
            break
        if known:                   # the model cannot improve on it within its time limit
            status = "time limit"
            break
        paths.append(path)
    seconds = _time.monotonic() - started
    optimal = status == "optimal"
    if best is not None and optimal and problem.objective is not Objective.MEMORY:
        # rounding of times to integers: the proof holds up to one time unit per action
        bound = min(bound, best.step_time)
    return ChunkSolve(best, optimal, bound, len(paths), seconds, status)


def _same_path(a, b) -> bool:
    return (a.optimizer_rank == b.optimizer_rank and np.array_equal(a.forward, b.forward)
            and np.array_equal(a.backward_input, b.backward_input)
            and np.array_equal(a.backward_weight, b.backward_weight) and np.array_equal(a.transfers, b.transfers))


def _rank_forms(sig, q: dict, C: int) -> list[list]:
    """Each rank's memory signatures as linear expressions of the chunk lookups ``q`` (built from
    term lists: adding in place to a CP-SAT expression would change the shared part)."""
    out = []
    for rs in sig:
        chunks = list(rs.chunks)
        forms = []
        for k, signature in enumerate(rs.signatures):
            terms = [q["resident"][c] for c in chunks]
            for c in range(C):
                for name, counts in (("stash", rs.stash_counts), ("weight_stash", rs.weight_stash_counts),
                                     ("retained", rs.retained_counts)):
                    if counts[k, c]:
                        terms.append(int(counts[k, c]) * q[name][c])
            if signature.op is None:
                terms += [q["optimizer"][c] for c in chunks]
            else:
                terms.append(q[_TRANSIENT[signature.op]][signature.chunk])
            forms.append(sum(terms))
        out.append(forms)
    return out


_TRANSIENT = {Op.FORWARD: "forward", Op.BACKWARD_INPUT: "backward", Op.BACKWARD_WEIGHT: "weight",
              Op.FULL_BACKWARD: "full_backward"}


def _memory_tables(problem: ChunkProblem) -> dict[str, np.ndarray]:
    """Every range's chunk figures under the runtime's rules, for each chunk position's kind
    (first, middle, last: the receive buffers and kept outputs differ), as (L, L) arrays. The
    figure a chunk gets is the one for its position: ``chunk_memory`` on that range alone."""
    table = problem.table
    L = table.num_layers
    sched = problem.schedule
    names = ("resident", "stash", "weight_stash", "retained", "forward", "backward", "weight", "full_backward",
             "optimizer")
    out = {n: np.zeros((L, L), np.int64) for n in names}
    # chunk position matters only through "first" (a == 0) and "last" (b == L - 1); a range's
    # figures as the only chunk of a one-chunk split would mix both, so build each from a split
    # of the right shape: the range, with the rest of the layers around it as other chunks
    for a in range(L):
        for b in range(a, L):
            bounds = [0] if a > 0 else []
            bounds += [a, b + 1]
            if b + 1 < L:
                bounds.append(L)
            cm = chunk_memory(table, bounds, _stand_in(sched, len(bounds) - 1, a == 0, b == L - 1))
            i = 1 if a > 0 else 0
            for n, arr in (("resident", cm.resident), ("stash", cm.stash), ("weight_stash", cm.weight_stash),
                           ("retained", cm.retained), ("forward", cm.forward_peak), ("backward", cm.backward_peak),
                           ("weight", cm.weight_peak), ("full_backward", cm.full_backward_peak),
                           ("optimizer", cm.optimizer_peak)):
                out[n][a, b] = arr[i]
    return out


@dataclass(frozen=True)
class _StandIn:
    """Just what ``chunk_memory`` reads of a schedule."""

    micro_batches: int
    traits: object
    kind: ScheduleKind


def _stand_in(schedule: Schedule, chunks: int, first: bool, last: bool) -> _StandIn:
    return _StandIn(schedule.micro_batches, schedule.traits, schedule.kind if (chunks > 1) else ScheduleKind.GPIPE)
