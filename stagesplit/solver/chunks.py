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
from dataclasses import dataclass, field

import numpy as np

from ..common.deadline import Deadline, TimeLimitReached, check_deadline, seconds_left
from ..model.phases import PhaseTable
from .request import Objective, RecomputeMode
from .schedule import (ChunkMemory, CriticalPath, Op, RankMemory, Schedule, ScheduleKind, chunks_in_flight,
                       critical_path, memory_signatures,
                       rank_memory)

__all__ = ["ChunkProblem", "ChunkResult", "chunk_memory", "evaluate", "exhaustive", "fitting_choice", "local_search",
           "prefix_choice", "solve_cpsat", "step_durations"]


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
    #: only splits faster than this step time are sought (``--schedule auto``: the fastest plan of
    #: another schedule); where there is none, the search ends "slower" instead of proving its own optimum
    cutoff: float | None = None

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
    * runtimes that wait on sends only at the step's end keep each output and input gradient sent
      to another rank (``retained``; a V's turn hands them to the chunk on the same rank without a
      send); Schedule1F1B keeps one of the last chunk's outputs and its input gradient between
      micro-batches, and every other chunk's last sent output;
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
        saved, forward_change, change, _ = table.recompute.chunk_changes(b, np.asarray(choice, np.int64))
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
    # what the runtime keeps until the step ends is what it sent to another rank: a V's turn hands the
    # output (and its gradient back) to the chunk on the same rank without a send
    sends_on, sends_back = remote_links(schedule, C)
    retained = np.where(sends_on, cc.sent_forward, 0) + np.where(sends_back, cc.sent_backward, 0)
    return ChunkMemory(resident=resident, stash=stash, weight_stash=weight_stash, forward_peak=forward,
                       backward_peak=backward, weight_peak=weight, full_backward_peak=full,
                       optimizer_peak=cc.optimizer_peak, retained=retained.astype(np.int64))


def remote_links(schedule, chunks: int) -> tuple[np.ndarray, np.ndarray]:
    """Per chunk: whether it sends its output on to another rank, and its input gradient back to
    another rank (a V's turn keeps both on one rank; a stand-in schedule without a placement: every
    link is remote)."""
    placement = getattr(schedule, "chunk_rank", None)
    if placement is None:
        return np.arange(chunks) < chunks - 1, np.arange(chunks) > 0
    ranks = np.asarray(placement, np.int64)
    remote = ranks[1:] != ranks[:-1]
    return np.append(remote, False), np.insert(remote, 0, False)


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


def step_durations(problem: ChunkProblem, bounds, choice=None) -> tuple[np.ndarray, ...]:
    """What the step time of the split ``bounds`` is simulated from (``evaluate``): per chunk the
    forward, input-gradient (recompute included) and weight-gradient times, per boundary the
    transfer time, per rank the optimizer step. A plan records them so that its schedule can be
    drawn from the very durations it was solved with."""
    return _times(problem, bounds, None if choice is None else np.asarray(choice, np.int64))


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
    """A split with the recompute its ranks need to fit (AUTO), as recompute prefixes (each
    chunk's first layers full, the next selective: ``prefix_choice``): from none, on each rank
    that does not fit, the prefix extensions that save the most bytes per unit of time added, as
    many as its excess needs (each saving counted once per micro-batch its chunk holds in
    flight), until every rank fits or no extension is left. A good choice, not a proven one
    (``solve_cpsat`` proves)."""
    bounds = tuple(int(x) for x in bounds)
    L, C = problem.num_layers, len(bounds) - 1
    current = _evaluate(problem, bounds, np.zeros(L, np.int64))
    if problem.table.recompute is None or _rules(problem, bounds) or all(len(o) == 1 for o in _options(problem)):
        return current
    saved, _, added = _option_figures(problem)
    copies = chunks_in_flight(problem.schedule)
    rank_of = np.asarray(problem.schedule.chunk_rank)
    full, selective = [0] * C, [0] * C

    def moves(c: int):
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
        for rank in current.ranks:
            excess = int(rank.peak - problem.capacities[rank.rank])
            while excess > 0:
                options = [(-gain / max(cost, 1e-30), c, gain, f, g) for c in np.flatnonzero(rank_of == rank.rank)
                           for gain, cost, f, g in moves(int(c)) if gain > 0]
                if not options:
                    break
                _, c, gain, f, g = min(options)
                full[c], selective[c] = f, g
                excess -= gain * int(copies[c])
                changed = True
        if not changed:
            break
        current = _evaluate(problem, bounds, prefix_choice(problem, bounds, full, selective))
    return current


def _all_splits(L: int, C: int):
    for cuts in itertools.combinations(range(1, L), C - 1):
        yield (0, *cuts, L)


def exhaustive(problem: ChunkProblem) -> ChunkResult | None:
    """The best split by trying every one, and with AUTO recompute every recompute prefix of
    every chunk (``prefix_choice``; the oracle of the tests: small problems only)."""
    best = None
    fixed = problem.fixed_choice()
    for bounds in _all_splits(problem.num_layers, problem.chunks):
        for choice in ([fixed] if fixed is not None else _prefix_choices(problem, bounds)):
            r = _evaluate(problem, bounds, choice)
            if best is None or r.key(problem) < best.key(problem):
                best = r
    return best if best is not None and best.feasible else None


def _prefix_choices(problem: ChunkProblem, bounds) -> list[np.ndarray]:
    """Every distinct per-layer choice of recompute prefixes on ``bounds``."""
    sizes = np.diff(bounds)
    per_chunk = [[(f, g) for f in range(n + 1) for g in range(n + 1 - f)] for n in sizes]
    out: dict[bytes, np.ndarray] = {}
    for combo in itertools.product(*per_chunk):
        choice = prefix_choice(problem, bounds, [f for f, _ in combo], [g for _, g in combo])
        out.setdefault(choice.tobytes(), choice)
    return list(out.values())


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
    ``seen`` collects every split evaluated (their critical paths seed CP-SAT). The search's
    time limit (common/deadline.py) ends it with the best so far; only where it is reached in the
    first evaluation is ``TimeLimitReached`` raised."""
    deadline = _time.monotonic() + min(budget_s, seconds_left())
    current = evaluate(problem, start or _balanced(problem))     # the search's time limit: raised if reached here
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
                    cand = evaluate(problem, b)
                    if seen is not None:
                        seen.append(cand)
                    if cand.key(problem) < current.key(problem):
                        current, improved = cand, True
    except TimeLimitReached:            # the best so far
        pass
    return current


#: what the search was doing where the time limit stops it (common/deadline.py)
_BUILDING = "building CP-SAT's model"


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


def solve_cpsat(problem: ChunkProblem, hint: ChunkResult | None = None, max_rounds: int = 50,
                deadline: Deadline | None = None) -> ChunkSolve:
    """The optimal split (see the module docstring), or the best found by ``deadline`` (default:
    the problem's time limit from now) with a proven bound. With ``problem.cutoff``, only splits
    faster than it are sought: status "slower" (bound at the cutoff) where none fits, otherwise as
    without it. Where the search's
    time limit (common/deadline.py) is reached inside a long computation, the best split so far
    (None if none) with status "time limit"."""
    from ortools.sat.python import cp_model

    started = _time.monotonic()
    deadline = deadline if deadline is not None else Deadline.after(problem.time_limit)
    L, C = problem.num_layers, problem.chunks
    P = problem.schedule.devices
    table = problem.table
    scale = _scale(problem)
    lo = max(problem.min_layers, 1)
    # what the search has where the time limit stops it in a long computation (common/deadline.py)
    best: ChunkResult | None = None
    bound = 0.0
    paths: list = []
    status = "unknown"
    try:
        seen: list = []
        if hint is None or not hint.feasible:
            hint = local_search(problem, budget_s=min(2.0, deadline.left() / 4), seen=seen)
        seen.append(hint)
        best = hint if hint.feasible else None
        sig = memory_signatures(problem.schedule)    # after the hint: a split to return if time runs out
        keys: set = set()

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
        cut_units = np.round((table.forward_cut + table.backward_cut) / 2 * problem.seconds_per_byte
                             * scale).astype(np.int64)
        mem = _memory_tables(problem)
        # each chunk's ranges (first layer a, last b) that fit its device on their own: no other can be
        # in a split that fits, so the range lookups need no other (a much smaller model to presolve)
        fits_alone = _fits_alone(problem, mem, sig)
        range_busy = _range_busy(problem)
        # times are integers in the model: a chain's length there is within one unit per boundary of
        # each kind it reads of its true length
        slack_units = 6 * C + 4
        status = "unknown"
        rounds = 0
        while rounds < max_rounds:
            rounds += 1
            remaining = deadline.left()
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
            # the step to beat (compute objective): the best known, or the cutoff where that is lower
            limit = min(best.step_time if best is not None else math.inf,
                        problem.cutoff if problem.cutoff is not None else math.inf)
            if problem.objective is Objective.MEMORY or not CUTOFF:
                limit = math.inf
            # range lookups: index a * (L + 1) + e of the (L+1) x (L+1) tables, over each chunk's possible
            # ranges: those that fit its device on their own and keep it busy for less than the step to beat
            pair = []
            for c in range(C):
                check_deadline(_BUILDING)
                ok = fits_alone[c] & (range_busy <= limit)
                allowed = [int(a) * (L + 1) + int(b) + 1 for a, b in np.argwhere(ok)]
                if allowed:
                    v = m.NewIntVarFromDomain(cp_model.Domain.FromValues(allowed), f"pair{c}")
                else:                       # no range fits this chunk: no split does
                    v = m.NewIntVar(0, (L + 1) ** 2 - 1, f"pair{c}")
                    m.AddBoolOr([])
                m.Add(v == s[c] * (L + 1) + s[c + 1])
                pair.append(v)

            def lookup(name: str, values: np.ndarray, c: int):
                check_deadline(_BUILDING)
                flat = np.zeros((L + 1, L + 1), np.int64)
                flat[:L, 1:] = values
                v = m.NewIntVar(0, int(max(flat.max(), 0)), f"{name}{c}")
                m.AddElement(pair[c], [int(x) for x in flat.ravel()], v)
                return v

            q = {name: [lookup(name, arr, c) for c in range(C)] for name, arr in mem.items()}
            on, back = remote_links(problem.schedule, C)
            q["retained"] = [int(on[c]) * q["retained_on"][c] + int(back[c]) * q["retained_back"][c]
                             for c in range(C)]
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
                check_deadline(_BUILDING)
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
                if math.isfinite(limit):
                    # only splits faster than the best known (beyond the model's rounding): where
                    # there is none, the best known is optimal
                    m.Add(step <= int(math.floor(limit * scale)) - slack_units)
            if best is not None:
                for c in range(1, C):
                    m.AddHint(s[c], best.bounds[c])
                counts = prefix_counts(best.bounds, best.choice) if y and best.choice else None
                if counts is not None:
                    for c in range(C):
                        m.AddHint(y[c, "full"], counts[0][c])
                        m.AddHint(y[c, "selective"], counts[1][c])
            invalid = m.Validate()
            if invalid:
                raise RuntimeError(f"internal error: CP-SAT model invalid: {invalid}")
            # building the model took time too: the search gets what is left of the limit
            remaining = deadline.left()
            if remaining <= 0.05:
                status = "time limit"
                break
            solver = cp_model.CpSolver()
            solver.parameters.max_time_in_seconds = remaining
            solver.parameters.num_search_workers = problem.workers
            # measured on the schedule models (bench_schedules.py): the LP relaxation and probing cost
            # more than they prune here (element tables of chunk figures): a third of the time
            if not y:                   # with recompute variables, the LP bound is what proves
                solver.parameters.linearization_level = 0
                solver.parameters.cp_model_probing_level = 0
            log = _solution_log(s, y, C)
            code = solver.Solve(m, log)
            if code == cp_model.MODEL_INVALID:
                raise RuntimeError(f"internal error: CP-SAT model invalid: {m.Validate()}")
            if code == cp_model.INFEASIBLE:
                slower = problem.cutoff is not None and problem.objective is not Objective.MEMORY and \
                    (best is None or best.step_time >= problem.cutoff)
                if slower:                        # nothing beats the cutoff: not this schedule's own proof
                    status = "slower"
                    bound = max(bound, problem.cutoff - 2 * slack_units / scale)
                    break
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
                choice = prefix_choice(problem, bounds, [solver.Value(y[c, "full"]) for c in range(C)],
                                       [solver.Value(y[c, "selective"]) for c in range(C)]) if y else \
                    np.zeros(L, np.int64)
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
            # the chains of the other splits the search went through on its way
            for other, counts in log.found[:-1]:
                if other != bounds:
                    r = _evaluate(problem, other, choice if not y else prefix_choice(problem, other, *counts))
                    add_path(path_of(r))
                    if r.key(problem) < best.key(problem):
                        best = r
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
    except TimeLimitReached:            # stopped in a long computation: the best split so far, not proven
        status = "time limit"
    seconds = _time.monotonic() - started
    optimal = status == "optimal"
    if best is not None and optimal and problem.objective is not Objective.MEMORY:
        # rounding of times to integers: the proof holds up to one time unit per action
        bound = min(max(bound, best.step_time - 2 * slack_units / scale), best.step_time)
    return ChunkSolve(best, optimal, bound, len(paths), seconds, status)


def _solution_log(s: list, y: dict, C: int):
    """A CP-SAT callback that keeps every solution found during a round (boundaries, and the
    recompute prefix counts) in ``.found``: the splits the search passes through on its way are as
    good a source of chains as the one it ends on."""
    from ortools.sat.python import cp_model

    class SolutionLog(cp_model.CpSolverSolutionCallback):
        def __init__(self):
            super().__init__()
            self.found: list = []

        def on_solution_callback(self):
            bounds = tuple(int(self.Value(x)) for x in s)
            counts = ([int(self.Value(y[c, "full"])) for c in range(C)],
                      [int(self.Value(y[c, "selective"])) for c in range(C)]) if y else None
            self.found.append((bounds, counts))
    return SolutionLog()


def _fits_alone(problem: ChunkProblem, mem: dict[str, np.ndarray], sig) -> np.ndarray:
    """(C, L, L) booleans: whether chunk ``c`` may hold layers ``a..b``, by the bytes that range
    alone puts on its device (the other chunks' terms are never negative): its resident bytes and,
    at each of the device's memory signatures, its own stashes and transient. With AUTO recompute
    the stashes and transients may shrink, so only the resident bytes count."""
    C = problem.chunks
    L = problem.num_layers
    auto = problem.fixed_choice() is None and problem.table.recompute is not None
    out = np.zeros((C, L, L), bool)
    upper = np.triu(np.ones((L, L), bool))
    on, back = remote_links(problem.schedule, C)
    retained = [int(on[c]) * mem["retained_on"] + int(back[c]) * mem["retained_back"] for c in range(C)]
    for rs in sig:
        cap = int(problem.capacities[rs.rank])
        for c in rs.chunks:
            need = mem["resident"].copy()
            if not auto:
                worst = np.zeros((L, L), np.int64)
                for k, signature in enumerate(rs.signatures):
                    check_deadline(_BUILDING)
                    term = (int(rs.stash_counts[k, c]) * mem["stash"] + int(rs.weight_stash_counts[k, c])
                            * mem["weight_stash"] + int(rs.retained_counts[k, c]) * retained[c])
                    if signature.op is None:
                        term = term + mem["optimizer"]
                    elif signature.chunk == c:
                        term = term + mem[_TRANSIENT[signature.op]]
                    np.maximum(worst, term, out=worst)
                need = need + worst
            out[c] = upper & (need <= cap)
    return out


def _range_busy(problem: ChunkProblem) -> np.ndarray:
    """(L, L) seconds: what a chunk holding layers ``a..b`` keeps its device busy for (every
    micro-batch's F, B and W and its optimizer step; no recompute; infinite below the diagonal):
    a lower bound on the step of any split with that chunk."""
    prefix = np.concatenate([np.zeros((1, 4)), np.cumsum(problem.table.layer_times[:, :4], axis=0)])
    span = prefix[1:][None, :, :] - prefix[:-1][:, None, :]          # [a, b]: layers a..b
    busy = problem.schedule.micro_batches * span[:, :, :3].sum(axis=2) + span[:, :, 3]
    return np.where(np.triu(np.ones(busy.shape, bool)), busy, np.inf)


def _option_figures(problem: ChunkProblem) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per option row (none, selective, full) and layer: bytes saved, rerun and time added where
    the option is open to the layer (``_options``); where it is not, the layer keeps none's
    figures (a recompute prefix passes over it)."""
    table = problem.table.recompute
    L = problem.num_layers
    saved, rerun, added = (np.zeros((3, L), np.int64), np.zeros((3, L), np.int64), np.zeros((3, L)))
    for i, opts in enumerate(_options(problem)):
        for o in opts[1:]:
            saved[o, i], rerun[o, i], added[o, i] = table.saved[o, i], table.rerun[o, i], table.added[o, i]
    return saved, rerun, added


def prefix_choice(problem: ChunkProblem, bounds, full, selective) -> np.ndarray:
    """Per-layer options of the recompute prefixes: in chunk ``c``, its first ``full[c]`` layers
    take full, the next ``selective[c]`` selective, the rest none (a layer an option is not open
    to keeps none)."""
    options = _options(problem)
    choice = np.zeros(problem.num_layers, np.int64)
    for c in range(len(bounds) - 1):
        a = bounds[c]
        for i in range(a, min(a + int(full[c]), bounds[c + 1])):
            choice[i] = 2 if 2 in options[i] else 0
        for i in range(a + int(full[c]), min(a + int(full[c]) + int(selective[c]), bounds[c + 1])):
            choice[i] = 1 if 1 in options[i] else 0
    return choice


def prefix_counts(bounds, choice) -> tuple[list[int], list[int]] | None:
    """``(full, selective)`` per chunk where ``choice`` is recompute prefixes (full layers, then
    selective, then none, in each chunk), else None."""
    full, selective = [], []
    for c in range(len(bounds) - 1):
        run = [int(o) for o in choice[bounds[c]:bounds[c + 1]]]
        f = next((j for j, o in enumerate(run) if o != 2), len(run))
        s = next((j for j, o in enumerate(run[f:]) if o != 1), len(run) - f)
        if any(run[f + s:]):
            return None
        full.append(f)
        selective.append(s)
    return full, selective


def _range_max(values: np.ndarray, offset: np.ndarray | None = None) -> np.ndarray:
    """(L+1, L+1) table: at [p, e], the largest ``values[i] + offset[i] - offset[p]`` over
    ``p <= i < e`` (0 for an empty range). ``offset``: a prefix sum of length L + 1."""
    L = len(values)
    out = np.zeros((L + 1, L + 1), np.int64)
    for p in range(L):
        term = values[p:] + (offset[p:L] - offset[p] if offset is not None else 0)
        out[p, p + 1:] = np.maximum.accumulate(term)
    return out


def _recompute_variables(m, problem: ChunkProblem, s: list, q: dict, scale: float, largest: dict[str, int]):
    """AUTO recompute in the CP-SAT model as recompute prefixes: in chunk c, the first ``f_c``
    layers take full and the next ``g_c`` selective (Megatron's block method, with selective
    after it): recomputing a chunk's first layers costs least, since their rerun comes when the
    later layers' stashes are freed (model/recompute.py). With ``p = s_c + f_c`` and ``r = p +
    g_c``, everything is a lookup: bytes saved ``S`` and time added from prefix sums, the chunk's
    own stash ``U``, and the transients' terms (as ``RecomputeTable.chunk_changes``): the forward
    ``max(largest own over [s_c, p), max over [p, r) of kept-before + own, kept)`` and the
    backward ``max(kept, largest full rerun over [s_c, p), max over [p, r) of kept-through +
    rerun)``, kept = the selective layers' unsaved own bytes + the none layers' own. The chunk
    figures become stash ``max(0, stash - S)``, forward ``max(0, peak - U + forward term)``, B /
    full backward ``max(0, peak - U + backward term)``. Returns the chunk figures, the time added
    per chunk and the variables ``{(c, "full"), (c, "selective")}``."""
    L, C = problem.num_layers, problem.chunks
    if all(len(o) == 1 for o in _options(problem)):
        return q, [0] * C, {}
    saved, rerun, added_t = _option_figures(problem)
    own = problem.table.recompute.saved[2].astype(np.int64)
    kept_full = own - saved[2]                      # a layer of the full prefix that full is not open to
    kept_selective = own - saved[1]                 # what a selective layer still holds of its own bytes

    def cum(v) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(v)])

    O, S2, S1, K2, D = (cum(v).astype(np.int64) for v in (own, saved[2], saved[1], kept_full, kept_selective))
    T2, T1 = (np.round(cum(v) * scale).astype(np.int64) for v in (added_t[2], added_t[1]))
    full_rerun = _range_max(rerun[2] + kept_full, K2)
    full_forward = _range_max(own, K2)
    sel_backward = _range_max(rerun[1] + kept_selective, D)
    sel_forward = _range_max(own, D)
    x: dict = {}
    out = {name: list(values) for name, values in q.items()}
    added = []
    split = problem.schedule.traits.splits_backward
    big = int(own.sum() + rerun.max(initial=0)) + 1
    W = L + 1

    def element(name: str, index, values: np.ndarray):
        v = m.NewIntVar(int(min(values.min(initial=0), 0)), int(max(values.max(initial=0), 0)), name)
        m.AddElement(index, [int(z) for z in values.ravel()], v)
        return v

    for c in range(C):
        f = m.NewIntVar(0, L, f"full{c}")
        g = m.NewIntVar(0, L, f"selective{c}")
        m.Add(f + g <= s[c + 1] - s[c])
        x[c, "full"], x[c, "selective"] = f, g
        p = m.NewIntVar(0, L, f"p{c}")
        r = m.NewIntVar(0, L, f"r{c}")
        m.Add(p == s[c] + f)
        m.Add(r == p + g)
        at = {}
        for key, arr in (("O", O), ("S2", S2), ("S1", S1), ("T2", T2), ("T1", T1), ("K2", K2)):
            at[key] = [element(f"{key}{c}_{j}", idx, arr) for j, idx in enumerate((s[c], p, r, s[c + 1]))]
        pair_fp = m.NewIntVar(0, W * W - 1, f"fp{c}")
        m.Add(pair_fp == s[c] * W + p)
        pair_pr = m.NewIntVar(0, W * W - 1, f"pr{c}")
        m.Add(pair_pr == p * W + r)
        rerun_full = element(f"rf{c}", pair_fp, full_rerun)
        forward_full = element(f"ff{c}", pair_fp, full_forward)
        rerun_sel = element(f"rs{c}", pair_pr, sel_backward)
        forward_sel = element(f"fs{c}", pair_pr, sel_forward)
        kept_f = at["K2"][1] - at["K2"][0]                       # full-prefix layers that full is not open to
        saving = (at["S2"][1] - at["S2"][0]) + (at["S1"][2] - at["S1"][1])
        whole = at["O"][3] - at["O"][0]
        kept = m.NewIntVar(0, big, f"kept{c}")                   # own bytes still held after the chunk's forward
        m.Add(kept == whole - saving)
        backward_term = m.NewIntVar(0, 2 * big, f"bt{c}")
        m.AddMaxEquality(backward_term, [kept, rerun_full, kept_f + rerun_sel])
        forward_term = m.NewIntVar(0, 2 * big, f"ft{c}")
        m.AddMaxEquality(forward_term, [kept, forward_full, kept_f + forward_sel])
        added.append((at["T2"][1] - at["T2"][0]) + (at["T1"][2] - at["T1"][1]))

        def clipped(name: str, expression):
            v = m.NewIntVar(0, 2 * big + max(largest[name], 0), f"{name}_r{c}")
            m.AddMaxEquality(v, [0, expression])
            return v
        out["stash"][c] = clipped("stash", q["stash"][c] - saving)
        out["forward"][c] = clipped("forward", q["forward"][c] - whole + forward_term)
        out["full_backward"][c] = clipped("full_backward", q["full_backward"][c] - whole + backward_term)
        if split and c == 0:
            out["backward"][c] = out["stash"][c]
            out["weight_stash"][c] = out["stash"][c]
            out["weight"][c] = out["full_backward"][c]
        else:
            out["backward"][c] = clipped("backward", q["backward"][c] - whole + backward_term)
    return out, added, x


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
            check_deadline(_BUILDING)
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
    # what a backward leaves until the step's end, by link: the real placement says which are remote
    names = ("resident", "stash", "weight_stash", "retained_on", "retained_back", "forward", "backward", "weight",
             "full_backward", "optimizer")
    out = {n: np.zeros((L, L), np.int64) for n in names}
    # chunk position matters only through "first" (a == 0) and "last" (b == L - 1); a range's
    # figures as the only chunk of a one-chunk split would mix both, so build each from a split
    # of the right shape: the range, with the rest of the layers around it as other chunks
    for a in range(L):
        check_deadline(_BUILDING)
        for b in range(a, L):
            bounds = [0] if a > 0 else []
            bounds += [a, b + 1]
            if b + 1 < L:
                bounds.append(L)
            cm = chunk_memory(table, bounds, _stand_in(sched, len(bounds) - 1, a == 0, b == L - 1), fixed)
            cc = table.chunks(bounds)
            i = 1 if a > 0 else 0
            for n, arr in (("resident", cm.resident), ("stash", cm.stash), ("weight_stash", cm.weight_stash),
                           ("retained_on", cc.sent_forward), ("retained_back", cc.sent_backward),
                           ("forward", cm.forward_peak), ("backward", cm.backward_peak),
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
