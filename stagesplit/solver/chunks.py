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
from .request import Objective, RecomputeMode
from .schedule import (ChunkMemory, CriticalPath, Op, RankMemory, Schedule, ScheduleKind, chunks_in_flight,
                       critical_path, memory_signatures,
                       rank_memory)

__all__ = ["ChunkProblem", "ChunkResult", "chunk_memory", "evaluate", "exhaustive", "fitting_choice", "local_search",
           "solve_cpsat"]


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
    #: activation recompute: one option on every layer, or AUTO (chosen per layer)
    recompute: RecomputeMode = RecomputeMode.NONE

    def fixed_choice(self) -> np.ndarray | None:
        """Every layer's option where the mode fixes it (None for AUTO)."""
        L = self.num_layers
        if self.recompute is RecomputeMode.AUTO:
            return None
        index = {RecomputeMode.NONE: 0, RecomputeMode.SELECTIVE: 1, RecomputeMode.FULL: 2}[self.recompute]
        return np.full(L, index, np.int64)

    @property
    def chunks(self) -> int:
        return self.schedule.chunks

    @property
    def num_layers(self) -> int:
        return self.table.num_layers


def chunk_memory(table: PhaseTable, bounds, schedule: Schedule, choice: np.ndarray | None = None) -> ChunkMemory:
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
      gradient between micro-batches, and every other chunk's last sent output;
    * where the backward is not split: a chunk's transient figures (taken from the whole
      model) count its input, which is the receive buffer already resident, so it is taken off
      them; the last of several chunks holds its output (the loss's input, which a whole-model
      step frees after the loss) through its backward.

    ``choice``: each layer's recompute option (model/recompute.py; None: none)."""
    cc = table.chunks(bounds)
    b = np.asarray(bounds, np.int64)
    C = len(b) - 1
    M = schedule.micro_batches
    first, last = np.arange(C) == 0, np.arange(C) == C - 1
    received = np.where(first, 0, table.forward_cut[b[:-1]]).astype(np.int64)
    grad_received = np.where(last, 0, table.backward_cut[b[1:]]).astype(np.int64)
    resident = cc.resident + M * (received + grad_received)
    kept_output = np.where(last, cc.output, 0)
    saved = change = forward_change = np.zeros(C, np.int64)
    if choice is not None and table.recompute is not None:
        saved, rerun, _, one = table.recompute.chunk_effects(b, np.asarray(choice, np.int64))
        change, forward_change = rerun - saved, one - saved
    stash = np.maximum(np.maximum(cc.stash - received, 0) + kept_output - saved, 0)
    # what B re-materialises for a recomputed layer stays for W: the weight stash keeps it all
    weight_stash = np.maximum(cc.weight_stash - received, 0) + kept_output
    split = schedule.traits.splits_backward
    extra = cc.weight_stash - cc.stash if split else 0
    hold = np.zeros(C, np.int64)
    one_f_one_b = schedule.kind is ScheduleKind.ONE_F_ONE_B and C > 1
    if one_f_one_b:
        hold[:-1] = cc.sent_forward[:-1]
        hold[-1] = cc.output[-1] + cc.sent_backward[-1]
    # measured on real pipelines where the backward is not split (tests/model/test_recompute_torch.py,
    # tests/exporters/test_export_recompute_torch.py)
    input_again = 0 if split else received
    output_held = np.where(last & (not split) & (not one_f_one_b) & (C > 1), cc.output, 0)
    # clipped before the recompute's change, as the CP-SAT model (_recompute_variables) has it
    forward = np.maximum(np.maximum(cc.forward_peak - input_again + hold, 0) + forward_change, 0)
    full = np.maximum(np.maximum(cc.full_backward_peak - input_again + hold + output_held, 0) + change, 0)
    backward = np.maximum(cc.backward_input_peak + extra + change, 0)
    weight = cc.backward_weight_peak + extra
    if split:
        # the model's input needs no gradient: the first chunk's B has nothing to do and its W
        # runs the whole backward (and any recompute) from the stash
        backward[0] = stash[0]
        weight_stash[0] = stash[0]
        weight[0] = full[0]
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
    #: every layer's recompute option (0 none, 1 selective, 2 full: model/recompute.py)
    choice: tuple[int, ...] = ()
    #: the chain of actions that makes the step time (a valid lower bound for every split)
    path: CriticalPath | None = field(default=None, compare=False, repr=False)

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


def _times(problem: ChunkProblem, bounds, choice: np.ndarray | None = None) -> tuple:
    cc = problem.table.chunks(bounds)
    b = np.asarray(bounds, np.int64)
    backward_input = cc.backward_input_time
    if choice is not None and problem.table.recompute is not None:
        backward_input = backward_input + problem.table.recompute.chunk_effect(b, choice)[2]
    crossing = problem.table.forward_cut[b[1:-1]] + problem.table.backward_cut[b[1:-1]]
    transfer = crossing / 2 * problem.seconds_per_byte      # each direction once per micro-batch
    ranks = np.asarray(problem.schedule.chunk_rank)
    optimizer = np.bincount(ranks, weights=cc.optimizer_time, minlength=problem.schedule.devices)
    return cc.forward_time, backward_input, cc.backward_weight_time, transfer, optimizer


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


def evaluate(problem: ChunkProblem, bounds, choice=None) -> ChunkResult:
    """The split ``bounds`` (C + 1 boundaries from 0 to L) evaluated exactly, with each layer's
    recompute option ``choice`` (default: the problem's fixed one; with AUTO, the least
    recompute that makes every rank fit, ``fitting_choice``)."""
    bounds = tuple(int(x) for x in bounds)
    if choice is None:
        choice = problem.fixed_choice()
        if choice is None:
            return fitting_choice(problem, bounds)
    return _evaluate(problem, bounds, np.asarray(choice, np.int64))


def _evaluate(problem: ChunkProblem, bounds: tuple[int, ...], choice: np.ndarray) -> ChunkResult:
    memory = chunk_memory(problem.table, bounds, problem.schedule, choice)
    ranks = rank_memory(problem.schedule, memory)
    f, bi, bw, transfer, optimizer = _times(problem, bounds, choice)
    path = critical_path(problem.schedule, f, bi, bw, transfer, optimizer)
    busy = np.bincount(np.asarray(problem.schedule.chunk_rank), weights=problem.schedule.micro_batches * (f + bi + bw),
                       minlength=problem.schedule.devices) + optimizer
    step = path.length
    bubble = max(1.0 - float(busy.sum()) / (problem.schedule.devices * step), 0.0) if step > 0 else 0.0
    reason = _rules(problem, bounds)
    over = [r.rank for r in ranks if r.peak > problem.capacities[r.rank]]
    if not reason and over:
        r = ranks[over[0]]
        reason = f"rank {r.rank} needs {r.peak:,} bytes, more than its {int(problem.capacities[r.rank]):,}"
    return ChunkResult(bounds, not reason, reason, step, bubble, ranks, memory, tuple(int(x) for x in choice), path)


def fitting_choice(problem: ChunkProblem, bounds) -> ChunkResult:
    """A split with the recompute its ranks need to fit (AUTO): from none, on each rank that does
    not fit, the options that save the most bytes per unit of time added, as many as its excess
    needs (each layer's saving counted once per micro-batch its chunk holds in flight), until
    every rank fits or no option is left. A good choice, not a proven one (``solve_cpsat``
    proves)."""
    bounds = tuple(int(x) for x in bounds)
    table = problem.table.recompute
    L = problem.num_layers
    choice = np.zeros(L, np.int64)
    current = _evaluate(problem, bounds, choice)
    if table is None or _rules(problem, bounds):
        return current
    b = np.asarray(bounds)
    chunk_of_layer = np.searchsorted(b, np.arange(L), side="right") - 1
    rank_of_layer = np.asarray(problem.schedule.chunk_rank)[chunk_of_layer]
    copies = chunks_in_flight(problem.schedule)[chunk_of_layer]
    options = _options(problem)
    while not current.feasible:
        changed = False
        for r in current.ranks:
            excess = int(r.peak - problem.capacities[r.rank])
            if excess <= 0:
                continue
            candidates = []
            for i in np.flatnonzero(rank_of_layer == r.rank):
                for o in options[i][1:]:
                    gain = int(table.saved[o, i] - table.saved[choice[i], i])
                    if o > choice[i] and gain > 0:
                        cost = float(table.added[o, i] - table.added[choice[i], i])
                        candidates.append((-gain / max(cost, 1e-30), int(i), o, gain * int(copies[i])))
            candidates.sort()
            done = set()
            for _, i, o, reduction in candidates:
                if excess <= 0:
                    break
                if i in done:
                    continue
                choice[i] = o
                done.add(i)
                excess -= reduction
                changed = True
        if not changed:
            break
        current = _evaluate(problem, bounds, choice)
    return current


def _all_splits(L: int, C: int):
    for cuts in itertools.combinations(range(1, L), C - 1):
        yield (0, *cuts, L)


def exhaustive(problem: ChunkProblem) -> ChunkResult | None:
    """The best split by trying every one, and with AUTO recompute every layer's every option
    (the oracle of the tests: small problems only)."""
    best = None
    fixed = problem.fixed_choice()
    choices = [fixed] if fixed is not None else \
        [np.array(c, np.int64) for c in itertools.product(*_options(problem))]
    for bounds in _all_splits(problem.num_layers, problem.chunks):
        for choice in choices:
            r = _evaluate(problem, bounds, choice)
            if best is None or r.key(problem) < best.key(problem):
                best = r
    return best if best is not None and best.feasible else None


def _options(problem: ChunkProblem) -> list[tuple[int, ...]]:
    """Each layer's options worth trying: none, and those that save bytes. None but none where
    the schedule splits the backward: torch refuses selective checkpointing there, and re-runs a
    fully checkpointed block again for the weight gradients, far above what B re-materialises
    (measured: tests/solver/test_chunks_recompute.py)."""
    table = problem.table.recompute
    if table is None or problem.schedule.traits.splits_backward:
        return [(0,)] * problem.num_layers
    return [(0, *[o for o in (1, 2) if table.saved[o, i] > 0]) for i in range(problem.num_layers)]


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
                 seen: list | None = None) -> ChunkResult:
    """A good split fast: the balanced split, then single boundary moves (by up to 3 layers)
    while one improves the objective (feasibility first: the summed excess over capacity).
    ``seen`` collects every split evaluated (their critical paths seed CP-SAT)."""
    deadline = _time.monotonic() + budget_s
    current = evaluate(problem, start or _balanced(problem))
    if seen is not None:
        seen.append(current)
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
                if seen is not None:
                    seen.append(cand)
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
    seen: list = []
    if hint is None or not hint.feasible:
        hint = local_search(problem, budget_s=min(2.0, problem.time_limit / 4), seen=seen)
    seen.append(hint)
    paths: list = []
    keys: set = set()
    best = hint if hint.feasible else None
    bound = 0.0

    def path_of(r: ChunkResult):
        if r.path is not None:
            return r.path
        f, bi, bw, transfer, optimizer = _times(problem, r.bounds, np.asarray(r.choice, np.int64))
        return critical_path(problem.schedule, f, bi, bw, transfer, optimizer)

    def add_path(path) -> bool:
        """Keep a chain (every chain is a lower bound for every split); False if known."""
        key = _path_key(path)
        if key in keys:
            return False
        keys.add(key)
        paths.append(path)
        return True

    # the chains of every split the quick search tried: a tight start for the step's bound
    for r in sorted(seen, key=lambda r: r.key(problem))[:MAX_SEED_PATHS]:
        add_path(path_of(r))
    # the per-layer prefix times and per-range tables, as integers
    fixed = problem.fixed_choice()
    auto = fixed is None and table.recompute is not None
    layer_times = table.layer_times.copy()
    if fixed is not None and table.recompute is not None:
        layer_times[:, 1] += table.recompute.added[fixed, np.arange(L)]
    prefix = {k: np.round(np.concatenate([[0.0], np.cumsum(layer_times[:, i])]) * scale).astype(np.int64)
              for i, k in enumerate(("F", "B", "W", "O"))}
    cut_units = np.round((table.forward_cut + table.backward_cut) / 2 * problem.seconds_per_byte * scale).astype(np.int64)
    mem = _memory_tables(problem)
    # times are integers in the model: a chain's length there is within one unit per boundary of
    # each kind it reads of its true length
    slack_units = 6 * C + 4
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
        added = [0] * C
        y: dict = {}
        if auto:
            q, added, y = _recompute_variables(m, problem, s, q, scale, {k: int(v.max()) for k, v in mem.items()})
        rank_forms = _rank_forms(sig, q, C)
        for rs, forms in zip(sig, rank_forms):
            for form in forms:
                m.Add(form <= int(problem.capacities[rs.rank]))
        # the step: at least every known chain's length
        horizon = int(prefix["F"][-1] + prefix["B"][-1] + prefix["W"][-1]) * problem.schedule.micro_batches * 2 + \
            int(prefix["O"][-1]) + int(cut_units.sum()) * problem.schedule.micro_batches * 2 + 1
        step = m.NewIntVar(0, horizon, "step")
        rank_of = np.asarray(problem.schedule.chunk_rank)
        M = problem.schedule.micro_batches
        # bounds every schedule obeys: a rank is busy for all its actions and its optimizer step,
        # and one micro-batch goes forward through every chunk and back (then the first chunk's W)
        for r in range(P):
            mine = [c for c in range(C) if rank_of[c] == r]
            busy = [M * (at[k][c + 1] - at[k][c]) for c in mine for k in ("F", "B", "W")]
            busy += [at["O"][c + 1] - at["O"][c] for c in mine]
            busy += [M * added[c] for c in mine if auto]
            m.Add(step >= sum(busy))
        chain = [at["F"][C], at["B"][C], at["W"][1]] + [2 * cut[j] for j in range(C - 1)
                                                       if rank_of[j] != rank_of[j + 1]]
        chain += [added[c] for c in range(C) if auto]
        m.Add(step >= sum(chain))
        for path in paths:
            terms = []
            for c in range(C):
                for k, n in (("F", path.forward[c]), ("B", path.backward_input[c]), ("W", path.backward_weight[c])):
                    if n:
                        terms.append(int(n) * (at[k][c + 1] - at[k][c]))
                if path.backward_input[c] and auto:
                    terms.append(int(path.backward_input[c]) * added[c])
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
            if best is not None and CUTOFF:
                # only splits faster than the best known (beyond the model's rounding): where
                # there is none, the best known is optimal
                m.Add(step <= int(math.floor(best.step_time * scale)) - slack_units)
        if best is not None:
            for c in range(1, C):
                m.AddHint(s[c], best.bounds[c])
            if y:
                klass = layer_classes(problem)
                for (c, k, o), var in y.items():
                    m.AddHint(var, int(sum(1 for i in range(best.bounds[c], best.bounds[c + 1])
                                           if klass[i] == k and best.choice[i] == o)))
        invalid = m.Validate()
        if invalid:
            raise RuntimeError(f"internal error: CP-SAT model invalid: {invalid}")
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = max(remaining, 0.05)
        solver.parameters.num_search_workers = problem.workers
        code = solver.Solve(m)
        if code == cp_model.MODEL_INVALID:
            raise RuntimeError(f"internal error: CP-SAT model invalid: {m.Validate()}")
        if code == cp_model.INFEASIBLE:
            if best is not None and problem.objective is not Objective.MEMORY:
                status = "optimal"            # nothing beats the best known
                break
            status = "infeasible"
            return ChunkSolve(None, False, math.inf, len(paths), _time.monotonic() - started, status)
        if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            status = "time limit"
            break
        bounds = tuple(int(solver.Value(x)) for x in s)
        choice = fixed if fixed is not None else np.zeros(L, np.int64)
        if auto:
            choice = _choice_of_counts(problem, bounds, {key: int(solver.Value(var)) for key, var in y.items()})
        found = _evaluate(problem, bounds, choice)
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
        known = _path_key(path) in keys
        slack = slack_units / scale
        if code == cp_model.OPTIMAL and (known or found.step_time <= solver.ObjectiveValue() / scale + slack):
            status = "optimal"
            break
        if known:                   # the model cannot improve on it within its time limit
            status = "time limit"
            break
        add_path(path)
        # and the chains of its neighbours (each boundary moved by one layer)
        for c in range(1, C):
            for step in (-1, 1):
                b = list(bounds)
                b[c] += step
                if b[c - 1] < b[c] < b[c + 1]:
                    neighbour = _evaluate(problem, tuple(b), choice)
                    add_path(path_of(neighbour))
                    if neighbour.key(problem) < best.key(problem):
                        best = neighbour
    seconds = _time.monotonic() - started
    optimal = status == "optimal"
    if best is not None and optimal and problem.objective is not Objective.MEMORY:
        # rounding of times to integers: the proof holds up to one time unit per action
        bound = min(max(bound, best.step_time - 2 * slack_units / scale), best.step_time)
    return ChunkSolve(best, optimal, bound, len(paths), seconds, status)


def layer_classes(problem: ChunkProblem) -> np.ndarray:
    """Each layer's class: layers whose recompute options and figures are the same (a
    transformer's blocks) share one, so the model chooses how many of a chunk's layers of each
    class take each option, not which."""
    table = problem.table.recompute
    keys: dict = {}
    out = np.zeros(problem.num_layers, np.int64)
    for i, opts in enumerate(_options(problem)):
        key = (opts, table.saved[:, i].tobytes(), table.rerun[:, i].tobytes(), table.added[:, i].tobytes())
        out[i] = keys.setdefault(key, len(keys))
    return out


def _recompute_variables(m, problem: ChunkProblem, s: list, q: dict, scale: float, largest: dict[str, int]):
    """AUTO recompute in the CP-SAT model, by layer class (``layer_classes``): per chunk c and
    class k, how many of the chunk's class-k layers take each option (``x``, at most the class's
    layers in the chunk, counted from the boundaries by prefix lookups), and whether any does
    (``u``). Per chunk: bytes saved ``S_c`` and time added ``T_c`` are sums over ``x``, the
    largest rerun ``X_c`` and largest single saving ``X1_c`` maxima over ``u``. The chunk
    figures become, as ``chunk_memory`` has them: stash ``max(0, stash - S)``, B / full
    backward ``max(0, peak + X - S)``, forward ``max(0, peak + X1 - S)``; the weight stash and W
    keep what B re-materialises; a split backward's first chunk keeps its rules (B holds the
    stash, W is the whole backward). Returns the chunk figures, the time added per chunk and
    the count variables ``x[c, k, o]``."""
    table = problem.table.recompute
    L, C = problem.num_layers, problem.chunks
    options = _options(problem)
    klass = layer_classes(problem)
    K = int(klass.max()) + 1
    first_of = [int(np.flatnonzero(klass == k)[0]) for k in range(K)]
    x: dict = {}
    saved_terms = [[] for _ in range(C)]
    added_terms = [[] for _ in range(C)]
    reruns = [[] for _ in range(C)]
    ones = [[] for _ in range(C)]
    for k in range(K):
        i = first_of[k]
        opts = options[i][1:]
        if not opts:
            continue
        prefix = np.concatenate([[0], np.cumsum(klass == k)]).astype(np.int64)
        total = int(prefix[-1])
        at = []
        for c in range(C + 1):
            v = m.NewIntVar(0, total, f"n{k}_{c}")
            m.AddElement(s[c], [int(v_) for v_ in prefix], v)
            at.append(v)
        for c in range(C):
            mine = []
            for o in opts:
                n = m.NewIntVar(0, total, f"x{c}_{k}_{o}")
                u = m.NewBoolVar(f"u{c}_{k}_{o}")
                m.Add(n <= total * u)
                m.Add(n >= u)
                x[c, k, o] = n
                mine.append(n)
                saved_terms[c].append(int(table.saved[o, i]) * n)
                added_terms[c].append(int(round(float(table.added[o, i]) * scale)) * n)
                reruns[c].append((int(table.rerun[o, i]), u))
                ones[c].append((int(table.saved[o, i]), u))
            m.Add(sum(mine) <= at[c + 1] - at[c])
    big = int(table.saved.sum() + table.rerun.max(initial=0)) + 1
    split = problem.schedule.traits.splits_backward
    out = {name: list(values) for name, values in q.items()}
    added = []
    for c in range(C):
        saved = sum(saved_terms[c]) if saved_terms[c] else 0
        rerun = m.NewIntVar(0, int(table.rerun.max(initial=0)), f"x{c}")
        one = m.NewIntVar(0, int(table.saved.max(initial=0)), f"one{c}")
        for var, pairs in ((rerun, reruns[c]), (one, ones[c])):
            for value, u in pairs:
                if value:
                    m.Add(var >= value).OnlyEnforceIf(u)
        added.append(sum(added_terms[c]) if added_terms[c] else 0)

        def clipped(name: str, expression):
            v = m.NewIntVar(0, big + max(largest[name], 0), f"{name}_r{c}")
            m.AddMaxEquality(v, [0, expression])
            return v
        out["stash"][c] = clipped("stash", q["stash"][c] - saved)
        out["forward"][c] = clipped("forward", q["forward"][c] + one - saved)
        out["full_backward"][c] = clipped("full_backward", q["full_backward"][c] + rerun - saved)
        if split and c == 0:
            out["backward"][c] = out["stash"][c]
            out["weight_stash"][c] = out["stash"][c]
            out["weight"][c] = out["full_backward"][c]
        else:
            out["backward"][c] = clipped("backward", q["backward"][c] + rerun - saved)
    return out, added, x


def _choice_of_counts(problem: ChunkProblem, bounds, counts: dict) -> np.ndarray:
    """Per-layer options from per-(chunk, class, option) counts: in each chunk, the first
    layers of a class take full, the next selective (they are interchangeable)."""
    klass = layer_classes(problem)
    choice = np.zeros(problem.num_layers, np.int64)
    for c in range(problem.chunks):
        for k in np.unique(klass[bounds[c]:bounds[c + 1]]):
            layers = [i for i in range(bounds[c], bounds[c + 1]) if klass[i] == k]
            full, selective = counts.get((c, int(k), 2), 0), counts.get((c, int(k), 1), 0)
            for j, i in enumerate(layers):
                choice[i] = 2 if j < full else (1 if j < full + selective else 0)
    return choice


#: each round of the compute objective looks only for splits faster than the best known
CUTOFF = True

#: how many of the quick search's chains seed the CP-SAT model
MAX_SEED_PATHS = 200


def _path_key(path) -> tuple:
    return (path.optimizer_rank, path.forward.tobytes(), path.backward_input.tobytes(),
            path.backward_weight.tobytes(), path.transfers.tobytes())


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
    fixed = problem.fixed_choice()      # AUTO: the tables without recompute, the model adds it
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
            cm = chunk_memory(table, bounds, _stand_in(sched, len(bounds) - 1, a == 0, b == L - 1), fixed)
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
