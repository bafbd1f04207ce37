"""Optimal split points with OR-Tools CP-SAT.

The model gives every layer ``l`` the device position ``x[l]`` of its stage (non-decreasing in
``l``; a jump of more than one leaves positions empty). Which layers a stage may hold is
prefix-closed: if layers ``a..e-1`` fit on a device (memory, and bounds on time or memory
cost), so do ``a..e'-1`` for e' < e. So with ``reach[a]`` the first layer that no longer fits
with ``a``, every stage fits if and only if ``x[reach[a]] >= x[a] + 1`` for every layer ``a``
(a stage starting before ``a`` in the same stage reaches no further). These are difference
constraints: CP-SAT's precedence propagation proves at the root that a bound is too tight.
Device-dependent limits (mixed capacities, and the 1F1B in-flight count, which is one more than
the number of stages after a stage) make the constraint conditional on the position and count.

Bottleneck objectives (stage time, stage memory) are minimised by bisection over the values a
stage can take: each step is one CP-SAT feasibility model with the bound built into ``reach``.
The gap is between the best split found and the smallest value not yet proven infeasible. The
devices objective minimises the number of stages directly. Lexicographic tie-breaks run as
further phases with the earlier optima as bounds.

Given the exact DP's answer for some phases (``advise`` runs CP-SAT only for the phases the DP did
not prove in the time limit; tests give it all), each such phase's value is the DP's optimum and
CP-SAT only tries to prove the next smaller value impossible; a phase it cannot prove in a short
deterministic budget records the DP as its proof. Every range is read on the band of the range
table (the stages that can fit a device), so nothing of size (L+1)^2 per in-flight count is built.
OR-Tools is imported when a model is first built.
"""

from __future__ import annotations

import time as _time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..common.deadline import Deadline
from ..common.interrupt import solve_interruptibly
from ..model.rangetable import OVER
from .dp import ORDER, Solution
from .problem import BandBytes, Evaluation, Split, SplitProblem, evaluate_split

__all__ = ["BIG", "DP_CONFIRM_S", "DP_CONFIRM_SIZE", "MODEL_SIZE_PER_SECOND", "ORDER", "PHASE_NAMES", "PhaseResult",
           "SolverResult", "model_seconds_estimate", "solve_split_cpsat"]

PHASE_NAMES = {"time": "bottleneck stage time", "memory": "worst stage memory", "devices": "devices used"}
BIG = OVER
DP_CONFIRM_S = 0.25     # CP-SAT's deterministic time to prove the DP's optimum tight before the DP's bound is used
DP_CONFIRM_SIZE = 20_000    # above this many fit constraints CP-SAT is not asked at all (see _model_size)
#: fit constraints (``_model_size``) CP-SAT's model gets per second of building, at the least
#: (measured 30,000-100,000 on the 2-core development machine)
MODEL_SIZE_PER_SECOND = 30_000


@dataclass(frozen=True)
class PhaseResult:
    """One objective phase's outcome: its value, the bound proven, and how it was settled."""

    quantity: str
    status: str
    value: int | None
    bound: int | None
    seconds: float
    checks: int = 0
    proof: str = "cp-sat"        # what proved ``bound``: "cp-sat", or "dp" (the exact oracle's optimum)

    @property
    def gap(self) -> float | None:
        if self.value is None or self.bound is None:
            return None
        return 0.0 if self.value == self.bound else (self.value - self.bound) / max(abs(self.value), 1)


@dataclass
class SolverResult:
    """A search's answer: the split, its evaluation and each objective phase's outcome."""

    split: Split | None
    evaluation: Evaluation | None
    phases: list[PhaseResult] = field(default_factory=list)
    #: what a reader of the plan must know about how it was found (e.g. the DP set aside)
    notes: list[str] = field(default_factory=list)
    #: wall seconds of the exact DP and of CP-SAT (None: that solver did not run)
    dp_seconds: float | None = None
    cpsat_seconds: float | None = None

    @property
    def status(self) -> str:
        """optimal | feasible (stopped by the time limit) | infeasible | unknown (nothing found in time)."""
        if not self.phases:
            return "unknown"
        if self.phases[0].status == "INFEASIBLE":
            return "infeasible"
        if self.split is None:
            return "unknown"
        return "optimal" if all(p.status == "OPTIMAL" for p in self.phases) else "feasible"

    @property
    def proven_optimal(self) -> bool:
        return self.status == "optimal"

    @property
    def seconds(self) -> float:
        """Wall seconds of the whole search (the DP and CP-SAT)."""
        if self.dp_seconds is None and self.cpsat_seconds is None:
            return sum(p.seconds for p in self.phases)
        return (self.dp_seconds or 0.0) + (self.cpsat_seconds or 0.0)


def _cp_model() -> Any:
    """OR-Tools' CP-SAT module, imported when first needed (it takes half a second and 100 MB).
    Any to mypy: this module calls its models' pre-PEP 8 method names (NewIntVar, Add, ...), which
    ortools makes at run time and its stubs do not declare."""
    from ortools.sat.python import cp_model
    return cp_model


class _Tables:
    """Per-stage quantities on the band: entry [a, j] is the stage a..e-1, e = a+1+j (``ends``),
    for j < W, the longest stage that fits any device; longer stages fit nowhere. With profile
    variants, a stage is ok when any variant fits it within the bounds (each variant's ok set is
    prefix-closed, so their union is too)."""

    def __init__(self, problem: SplitProblem):
        p = self.p = problem
        L = self.L = p.num_layers
        W = self.W = max(p.width, 1)
        self.rows = np.arange(L)
        a = self.rows[:, None]
        e = a + 1 + np.arange(W)[None, :]
        self.real = e <= L
        self.ends = np.minimum(e, L)
        self.tables = p.variant_tables()
        self.variants = len(self.tables)
        self.times = [np.where(self.real, up[self.ends] - down[a], BIG) for _, up, down in self.tables]
        self.computes = [np.where(self.real, (up - p.cut_units)[self.ends] - (down + p.cut_units)[a], BIG)
                         for _, up, down in self.tables]
        self.time, self.compute = self.times[0], self.computes[0]
        cap = p.options.max_layers
        self.length_ok = self.real & ((e - a) <= cap if cap is not None else True)
        self._bytes = BandBytes(p)
        self.caps = sorted({int(c) for c in p.capacity})

    def nbytes(self, k: int, v: int = 0) -> np.ndarray:
        """(L, W) worst-tile bytes with ``k`` in flight in variant ``v`` (a few counts kept)."""
        return self._bytes(k, v)

    def memcost(self, capacity: int, k: int, v: int = 0) -> np.ndarray:
        """Memory objective of every stage on a device of ``capacity``: bytes, or ppm of it on
        mixed devices."""
        m = self.nbytes(k, v)
        if self.p.homogeneous:
            return m
        return np.where(m < BIG, -((-m * 1_000_000) // int(capacity)), BIG)

    def ok(self, capacity: int, k: int, time_bound: int, memory_bound: int, with_transfers: bool = False) -> np.ndarray:
        """Stages that fit a device of ``capacity`` with ``k`` in flight within the bounds, in
        some variant (ignoring communication, which is not monotone and is checked separately,
        unless ``with_transfers``)."""
        out: np.ndarray | None = None
        for v in range(self.variants):
            fits = self.nbytes(k, v) <= capacity
            ok = self.length_ok & fits & ((self.times if with_transfers else self.computes)[v] <= time_bound)
            if memory_bound < BIG:
                ok &= self.memcost(capacity, k, v) <= memory_bound
            out = ok if out is None else out | ok
        assert out is not None                # a problem has at least one variant
        return out

    def over(self, capacity: int, k: int, time_bound: int, memory_bound: int) -> np.ndarray:
        """With variants and communication: the stages that some variant allows on compute
        alone but none with its transfers (forbidden apart from ``reach``)."""
        out: np.ndarray = self.ok(capacity, k, time_bound, memory_bound) & \
            ~self.ok(capacity, k, time_bound, memory_bound, with_transfers=True)
        return out

    def reach(self, ok: np.ndarray) -> np.ndarray:
        """reach[a] = the first layer that cannot share a stage with layer a (L when every later
        layer can): the band's first stage that is not ok, or the first layer past the band."""
        L = self.L
        length = np.where(ok.all(axis=1), self.W, np.argmin(ok, axis=1))
        return np.minimum(self.rows + length, L)

    def fit_anywhere(self, k: int, v: int = 0) -> np.ndarray:
        return self.length_ok & (self.nbytes(k, v) <= self.caps[-1])

    def candidates(self, quantity: str) -> np.ndarray:
        """Sorted values a stage's time or memory cost can take (over stages that fit somewhere,
        in any variant)."""
        ks = self.p.in_flight_values
        if quantity == "time":   # more in flight: fewer stages fit
            return np.unique(np.concatenate([self.times[v][self.fit_anywhere(min(ks), v)]
                                             for v in range(self.variants)]))
        values = [self.memcost(cap, k, v)[self.length_ok & (self.nbytes(k, v) <= cap)]
                  for cap in self.caps for k in ks for v in range(self.variants)]
        return np.unique(np.concatenate(values)) if values else np.zeros(0, np.int64)


class _Feasibility:
    """One CP-SAT model: is there a split with every stage within the bounds?"""

    def __init__(self, tables: _Tables, time_bound: int, memory_bound: int, devices_bound: int,
                 minimise_devices: bool, hint: Split | None):
        p = tables.p
        o = p.options
        L, N = p.num_layers, p.devices
        self.p = p
        cp_model = _cp_model()
        m = self.m = cp_model.CpModel()
        x = self.x = [m.NewIntVar(0, N - 1, f"x{l}") for l in range(L)]
        # s[a]: a stage starts at layer a
        s = self.s = [m.NewConstant(1)] + [m.NewBoolVar(f"start{a}") for a in range(1, L)]
        symmetric = p.homogeneous and not o.pinned_layers
        for a in range(1, L):
            m.Add(x[a] >= x[a - 1])
            m.Add(x[a] >= x[a - 1] + 1).OnlyEnforceIf(s[a])
            m.Add(x[a] == x[a - 1]).OnlyEnforceIf(s[a].Not())
            if o.exact or symmetric:
                m.Add(x[a] <= x[a - 1] + 1)
        if o.exact:
            m.Add(x[0] == 0)
            m.Add(x[L - 1] == N - 1)
        elif symmetric:
            m.Add(x[L - 1] == N - 1)                        # empty positions first
        stages = sum(s)
        m.Add(stages <= devices_bound)
        # in-flight count of the stage holding layer a: min(M, 1 + stages starting after a)
        ks = p.in_flight_values
        k_var: list[Any] = []
        if o.schedule == "1f1b" and len(ks) > 1:
            for a in range(L):
                after = m.NewIntVar(0, L - 1 - a, f"after{a}")
                m.Add(after == sum(s[a + 1:]))
                one_more = m.NewIntVar(1, L - a, f"stages_from{a}")
                m.Add(one_more == after + 1)
                k = m.NewIntVar(1, max(ks), f"k{a}")
                m.AddMinEquality(k, [one_more, m.NewConstant(o.micro_batches)])
                k_var.append(k)
        # every stage fits: x[reach[a]] >= x[a] + 1 (conditional when the limit depends on where)
        positions: list[int | None] = [None] if p.homogeneous else list(range(N))
        at = {}
        if not p.homogeneous:
            for a in range(L):
                for pos in range(N):                     # the positions, as integers
                    at[a, pos] = self._equals(x[a], pos)
        is_k = {}
        if k_var:
            for a in range(L):
                for k in ks:
                    is_k[a, k] = self._equals(k_var[a], k)
        reaches: dict[tuple[int, int], np.ndarray] = {}
        overs: dict[tuple[int, int], np.ndarray] = {}
        variant_transfers = tables.variants > 1 and o.communication and time_bound < BIG
        for position in positions:
            cap = int(p.capacity[position if position is not None else 0])
            for k in (ks if k_var else ks[:1]):
                if (cap, k) not in reaches:               # devices of one capacity share their limits
                    reaches[cap, k] = tables.reach(tables.ok(cap, k, time_bound, memory_bound))
                reach = reaches[cap, k]
                for a in range(L):
                    conditions = ([at[a, position]] if position is not None else []) + \
                        ([is_k[a, k]] if k_var else [])
                    self._limit(a, int(reach[a]), conditions)
                if variant_transfers:
                    # which variant a stage can take depends on where it is: the stages no
                    # variant allows with its transfers are forbidden there (see below)
                    if (cap, k) not in overs:
                        overs[cap, k] = tables.over(cap, k, time_bound, memory_bound)
                    for a, j in zip(*np.nonzero(overs[cap, k])):
                        a = int(a)
                        conditions = ([at[a, position]] if position is not None else []) + \
                            ([is_k[a, k]] if k_var else [])
                        self._forbid(a, int(tables.ends[a, j]), conditions)
        # layer-count limits and pins
        if o.min_layers > 1:
            for a in range(L):
                last = a + o.min_layers - 1
                if last < L:
                    m.Add(x[last] == x[a]).OnlyEnforceIf(s[a])
                elif a == 0:
                    m.AddBoolOr([])                            # fewer layers than one stage needs
                else:
                    m.Add(s[a] == 0)                           # a stage starting here would be too short
        for j in o.pinned_splits:
            m.Add(s[j] == 1)
        for layer, position in o.pinned_layers:
            m.Add(x[layer] == position)
        # communication makes stage time non-monotone: forbid the ranges it pushes over the bound.
        # A stage is exactly a..e-1 iff a stage starts at a and at e (or e == L) and layers a and
        # e-1 share a position; so given both starts, e-1 must sit on a later position than a.
        # (The reach constraints above already exclude ranges whose compute alone is over.)
        if o.communication and time_bound < BIG and not variant_transfers:
            over = (tables.time > time_bound) & (tables.compute <= time_bound) & tables.real
            for a, j in zip(*np.nonzero(over)):
                self._forbid(int(a), int(tables.ends[a, j]), [])
        if minimise_devices:
            m.Minimize(stages)
        if hint is not None:
            layer_position = np.zeros(L, np.int64)
            for position, first, last in hint.stages:
                layer_position[first:last + 1] = position
            for var, value in zip(x, layer_position):
                m.AddHint(var, int(value))

    def _equals(self, var: Any, value: int) -> Any:
        lit = self.m.NewBoolVar("")
        self.m.Add(var == value).OnlyEnforceIf(lit)
        self.m.Add(var != value).OnlyEnforceIf(lit.Not())
        return lit

    def _forbid(self, a: int, e: int, conditions: list[Any]) -> None:
        """No stage is exactly layers a..e-1 (under ``conditions``): given a stage starting at
        ``a`` and at ``e`` (or e == L), layer e-1 sits on a later position than layer a."""
        m, x, s = self.m, self.x, self.s
        starts = [s[a]] + ([s[e]] if e < self.p.num_layers else []) + list(conditions)
        if e - a == 1:
            m.AddBoolOr([lit.Not() for lit in starts])
        else:
            m.Add(x[e - 1] >= x[a] + 1).OnlyEnforceIf(starts)

    def _limit(self, a: int, reach: int, conditions: list[Any]) -> None:
        """Layer ``reach`` cannot share a stage with layer ``a`` (under ``conditions``); when
        ``reach == a``, layer ``a`` cannot be placed under them at all."""
        m, x = self.m, self.x
        if reach >= self.p.num_layers:
            return
        if reach > a:
            c = m.Add(x[reach] >= x[a] + 1)
            if conditions:
                c.OnlyEnforceIf(conditions)
        else:
            m.AddBoolOr([lit.Not() for lit in conditions])

    def solve(self, seconds: float, workers: int, deterministic: float | None = None) -> tuple[str, Split | None, float]:
        """``deterministic``: also stop after this much of CP-SAT's deterministic time (about
        seconds, but the same on every run and machine, so the answer does not vary)."""
        cp_model = _cp_model()
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = max(seconds, 0.01)
        if deterministic is not None:
            solver.parameters.max_deterministic_time = deterministic
        solver.parameters.num_workers = workers
        solver.parameters.random_seed = 1
        start = _time.monotonic()
        status = solve_interruptibly(solver, self.m)     # Ctrl-C: stop the search, raise KeyboardInterrupt
        elapsed = _time.monotonic() - start
        name = solver.StatusName(status)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return name, None, elapsed
        positions = [int(solver.Value(v)) for v in self.x]
        return name, _split_from_positions(positions, self.p.devices), elapsed


def _split_from_positions(positions: list[int], devices: int) -> Split:
    L = len(positions)
    bounds = [0] * (devices + 1)
    bounds[devices] = L
    for position in range(devices - 1, -1, -1):
        first = next((l for l, x in enumerate(positions) if x >= position), L)
        bounds[position] = first
    return Split(tuple(bounds))


def _quantity(evaluation: Evaluation, quantity: str) -> int:
    return {"time": evaluation.time, "memory": evaluation.memory, "devices": evaluation.devices}[quantity]


def solve_split_cpsat(problem: SplitProblem, hint: Split | None = None,
                      log: Callable[[str], None] | None = None, oracle: Solution | None = None,
                      time_limit: float | None = None,
                      deadline: Deadline | None = None) -> SolverResult:
    """Solve ``problem`` lexicographically (see the module docstring) by ``deadline``, or within
    ``time_limit`` seconds for all phases together (default: the options' ``time_limit``). ``hint``: a known
    feasible split, used as the starting upper bound. ``oracle``: the exact DP's answer
    (``dp.exact_optimum``); its split is the starting point and, for each phase it proved
    (``oracle.proven``), its optimum is the phase's value. CP-SAT is asked only to prove the next
    smaller value impossible (within ``DP_CONFIRM_S`` of deterministic time, on models of at most
    ``DP_CONFIRM_SIZE`` fit constraints); where it does not, the phase's ``proof`` is "dp"."""
    o = problem.options
    started = _time.monotonic()
    end = deadline.at if deadline is not None else started + float(o.time_limit if time_limit is None else time_limit)
    tables = _Tables(problem)
    bounds = {"time": BIG, "memory": BIG, "devices": problem.devices}
    result = SolverResult(None, None)
    best = hint if hint is not None and evaluate_split(problem, hint).feasible else None
    known: dict[str, int] = {}
    # what the oracle claims: the phases it proved, or, an answer that says nothing of it, all
    claimed = () if oracle is None else \
        oracle.proven if (oracle.proven or oracle.stopped) else ORDER[o.objective]
    if claimed:
        assert oracle is not None                # only an oracle claims
        if not oracle.feasible:              # the DP enumerates every split implicitly: none fits
            result.phases.append(PhaseResult(ORDER[o.objective][0], "INFEASIBLE", None, None, 0.0, 0, "dp"))
            result.cpsat_seconds = _time.monotonic() - started
            return result
        best = oracle.split
        evaluation = oracle.evaluation
        assert evaluation is not None            # a feasible answer comes with its evaluation
        known = {q: _quantity(evaluation, q) for q in claimed}
    elif oracle is not None and oracle.feasible:
        best = oracle.split
    for phase, quantity in enumerate(ORDER[o.objective]):
        if log:
            log(f"CP-SAT phase {phase + 1}/2: minimising {PHASE_NAMES[quantity]}")
        start = _time.monotonic()

        # called only within this phase's iteration: its quantity, and best as it stands at the call
        def check(value: int, minimise: bool = False, budget: float | None = None) -> tuple[str, Split | None, float]:
            limits = dict(bounds)
            limits[quantity] = value  # noqa: B023
            model = _Feasibility(tables, limits["time"], limits["memory"], limits["devices"], minimise, best)  # noqa: B023
            remaining = end - _time.monotonic()
            return model.solve(remaining, o.workers, deterministic=budget)

        if quantity in known:
            # The DP's split reaches its optimum (``evaluate_split`` checked it). CP-SAT is asked only
            # whether the next smaller value is possible; if it cannot say so within a short
            # budget, the DP's optimum is the bound (proof "dp").
            value = known[quantity]
            proof, below = "dp", None              # large: building CP-SAT's model alone would take seconds
            if _model_size(problem) <= DP_CONFIRM_SIZE:
                proof, below = "cp-sat", _next_below(tables, quantity, value)
            contradiction = None
            if below is not None:
                status, found, _ = check(below, budget=DP_CONFIRM_S)
                found_eval = evaluate_split(problem, found) if found is not None else None
                if found_eval is not None and found_eval.feasible and _quantity(found_eval, quantity) < value:
                    contradiction = (found, _quantity(found_eval, quantity))
                elif status != "INFEASIBLE":
                    proof = "dp"                   # not proven in the budget: the DP's optimum is the bound
            if contradiction is None:
                bounds[quantity] = value
                result.phases.append(PhaseResult(quantity, "OPTIMAL", value, value, _time.monotonic() - start,
                                                 int(below is not None), proof))
                continue
            # CP-SAT found a split the exact DP says cannot exist: one of the two is wrong. Trust
            # the split that evaluates better, drop the DP's answers, and search with CP-SAT alone.
            result.notes.append(
                f"CP-SAT found a split with {PHASE_NAMES[quantity]} {contradiction[1]:,}, below the exact DP's optimum "
                f"{value:,}: the DP's answer was set aside and CP-SAT searched alone (please report this profile)")
            known.clear()
            best = contradiction[0]
        if quantity == "devices":
            status, split, _ = check(problem.devices, minimise=True)
            checks = 1
            if split is None:
                result.phases.append(PhaseResult(quantity, "INFEASIBLE" if status == "INFEASIBLE" else "UNKNOWN",
                                                 None, None, _time.monotonic() - start, checks))
                break
            value = evaluate_split(problem, split).devices
            phase_status = status
            bound = value if status == "OPTIMAL" else 1
        else:
            candidates = tables.candidates(quantity)
            checks = 0
            split = None
            hi = None
            if best is not None:
                current = _quantity(evaluate_split(problem, best), quantity)
                hi = int(np.searchsorted(candidates, current))
                split = best
            if hi is None or hi >= len(candidates):
                if not len(candidates):
                    result.phases.append(PhaseResult(quantity, "INFEASIBLE", None, None,
                                                     _time.monotonic() - start, 0))
                    break
                status, split, _ = check(int(candidates[-1]))
                checks += 1
                if split is None:
                    result.phases.append(PhaseResult(quantity, "INFEASIBLE" if status == "INFEASIBLE" else "UNKNOWN",
                                                     None, None, _time.monotonic() - start, checks))
                    break
                hi = int(np.searchsorted(candidates, _quantity(evaluate_split(problem, split), quantity)))
            lo = -1                      # candidates[lo] proven infeasible (none yet)
            unknown = False
            while hi - lo > 1:
                if _time.monotonic() >= end:
                    unknown = True
                    break
                mid = (lo + hi) // 2
                status, found, _ = check(int(candidates[mid]))
                checks += 1
                if found is not None:
                    split = found
                    hi = int(np.searchsorted(candidates, _quantity(evaluate_split(problem, found), quantity)))
                elif status == "INFEASIBLE":
                    lo = mid
                else:
                    unknown = True
                    break
            value = int(candidates[hi])
            bound = int(candidates[lo + 1]) if lo + 1 <= hi else value
            phase_status = "OPTIMAL" if not unknown and bound == value else "FEASIBLE"
        best = split
        bounds[quantity] = value
        result.phases.append(PhaseResult(quantity, phase_status, value, bound, _time.monotonic() - start, checks))
    if best is not None and result.phases and result.phases[0].value is not None:
        result.split = _canonical(problem, best)
        result.evaluation = evaluate_split(problem, result.split)
    result.cpsat_seconds = _time.monotonic() - started
    return result


def model_seconds_estimate(problem: SplitProblem) -> float:
    """About how long building one CP-SAT model of ``problem`` takes, at the most."""
    return _model_size(problem) / MODEL_SIZE_PER_SECOND


def _model_size(problem: SplitProblem) -> int:
    """Rough count of the conditional fit constraints CP-SAT's model would hold."""
    o = problem.options
    positions = 1 if problem.homogeneous else problem.devices
    counts = len(problem.in_flight_values) if o.schedule == "1f1b" else 1
    return problem.num_layers * positions * counts


def _next_below(tables: _Tables, quantity: str, value: int) -> int | None:
    """The largest value below ``value`` that a stage (or the device count) can take, if any:
    the largest of ``candidates`` below it, without sorting them all."""
    if quantity == "devices":
        return value - 1 if value > 1 else None
    p = tables.p
    best = None
    for cap in tables.caps:
        for k in p.in_flight_values:
            for v in range(tables.variants):
                fits = tables.length_ok & (tables.nbytes(k, v) <= cap)
                values = tables.times[v] if quantity == "time" else tables.memcost(cap, k, v)
                below = values[fits & (values < value)]
                if below.size and (best is None or below.max() > best):
                    best = int(below.max())
    return best


def _canonical(problem: SplitProblem, split: Split) -> Split:
    """With identical devices, present the stages on the first positions (devices 0..P-1)."""
    if not (problem.homogeneous and not problem.options.pinned_layers):
        return split
    stages = split.stages
    bounds = [a for _, a, _ in stages] + [problem.num_layers] * (problem.devices - len(stages) + 1)
    moved = Split(tuple(bounds))
    return moved if evaluate_split(problem, moved).feasible else split
