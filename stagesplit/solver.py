"""Optimal split points with OR-Tools CP-SAT.

Variables: the boundary ``b[i]`` where device position i's stage starts (``b[0] = 0``,
``b[N] = L``, non-decreasing; an equal pair is an empty position). Each position's pair
``(b[i], b[i+1])`` (with its in-flight count and memory cost) is constrained to a table of the
stages that fit on that device and obey the layer-count and pin rules; stage memory is not
additive over layers, so every candidate range was priced by the cost model beforehand. Stage
time is read from prefix sums through element constraints. Objectives are lexicographic and
solved in phases: each phase fixes the previous optimum (or best value found) as a bound.

With identical devices and no layer pinned to a device, empty positions are kept in front, so
every non-empty stage's 1F1B in-flight count is fixed by its position; otherwise that count is
a variable, the number of non-empty stages from the position on, capped at M.
"""

from __future__ import annotations

import time as _time
from dataclasses import dataclass, field
from typing import Callable

from ortools.sat.python import cp_model

from .problem import Evaluation, Split, SplitProblem, evaluate, in_flight

PHASE_NAMES = {"time": "bottleneck stage time", "memory": "worst stage memory", "devices": "devices used"}
ORDER = {"compute": ("time", "memory"), "memory": ("memory", "time"), "devices": ("devices", "time")}


@dataclass(frozen=True)
class PhaseResult:
    quantity: str
    status: str
    value: int | None
    bound: int | None
    seconds: float

    @property
    def gap(self) -> float | None:
        if self.value is None or self.bound is None:
            return None
        return 0.0 if self.value == self.bound else (self.value - self.bound) / max(abs(self.value), 1)


@dataclass
class SolverResult:
    split: Split | None
    evaluation: Evaluation | None
    phases: list[PhaseResult] = field(default_factory=list)

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
        return sum(p.seconds for p in self.phases)


class _Model:
    """One CP-SAT model of the problem; phases add bounds and an objective."""

    def __init__(self, problem: SplitProblem, hint: Split | None):
        self.p = problem
        o = problem.options
        L, N = problem.num_layers, problem.devices
        m = self.m = cp_model.CpModel()
        self.b = [m.NewIntVar(0, L, f"b{i}") for i in range(N + 1)]
        m.Add(self.b[0] == 0)
        m.Add(self.b[N] == L)
        self.ne = [m.NewBoolVar(f"used{i}") for i in range(N)]
        for i in range(N):
            m.Add(self.b[i + 1] >= self.b[i] + 1).OnlyEnforceIf(self.ne[i])
            m.Add(self.b[i + 1] == self.b[i]).OnlyEnforceIf(self.ne[i].Not())
            if not problem.empty_allowed(i):
                m.Add(self.ne[i] == 1)
        self.symmetric = problem.homogeneous and not o.pinned_layers and not o.exact
        if self.symmetric:
            for i in range(N - 1):
                m.AddImplication(self.ne[i], self.ne[i + 1])     # empty positions first
        # in-flight micro-batches per position
        self.k: list[int | cp_model.IntVar] = []
        for i in range(N):
            if problem.variable_in_flight:
                count = m.NewIntVar(0, N - i, f"count{i}")
                m.Add(count == sum(self.ne[i:]))
                at_least_one = m.NewIntVar(1, N - i, f"count1_{i}")      # k is unused on an empty position
                m.AddMaxEquality(at_least_one, [count, 1])
                k = m.NewIntVar(1, max(problem.in_flight_values), f"k{i}")
                m.AddMinEquality(k, [at_least_one, o.micro_batches])
                self.k.append(k)
            else:
                self.k.append(problem.fixed_in_flight(i))
        # stage time
        top = int(problem.time_up.max()) - min(0, int(problem.time_down.min()))
        self.T = m.NewIntVar(0, max(top, 0), "bottleneck_time")
        up, down = [int(x) for x in problem.time_up], [int(x) for x in problem.time_down]
        self.times = []
        for i in range(N):
            u = m.NewIntVar(min(up), max(up), f"up{i}")
            d = m.NewIntVar(min(down), max(down), f"down{i}")
            m.AddElement(self.b[i + 1], up, u)
            m.AddElement(self.b[i], down, d)
            m.Add(self.T >= u - d).OnlyEnforceIf(self.ne[i])
            self.times.append((u, d))
        self.used = sum(self.ne)
        self.M = None
        if hint is not None:
            for var, value in zip(self.b, hint.bounds):
                m.AddHint(var, value)

    def tables(self, with_memory: bool) -> None:
        """Restrict each position to the stages that fit (and record their memory cost)."""
        p, m = self.p, self.m
        L = p.num_layers
        mem_vars, tops = [], []
        for i in range(p.devices):
            ks = p.in_flight_values if p.variable_in_flight else (self.k[i],)
            tuples = []
            for k in ks:
                for a in range(L):
                    for e in range(a + 1, L + 1):
                        if not p.fits(i, k, a, e):
                            break                   # longer ranges from a only need more memory
                        if p.allowed(i, a, e):
                            row = (a, e) + ((k,) if p.variable_in_flight else ())
                            tuples.append(row + ((p.mem_cost(i, k, a, e),) if with_memory else ()))
                if p.empty_allowed(i):
                    for a in range(L + 1):
                        row = (a, a) + ((k,) if p.variable_in_flight else ())
                        tuples.append(row + ((0,) if with_memory else ()))
            variables = [self.b[i], self.b[i + 1]] + ([self.k[i]] if p.variable_in_flight else [])
            if with_memory:
                top = max((t[-1] for t in tuples), default=0)
                mv = m.NewIntVar(0, top, f"mem{i}")
                variables.append(mv)
                mem_vars.append(mv)
                tops.append(top)
            m.AddAllowedAssignments(variables, tuples)
        if with_memory:
            self.M = m.NewIntVar(0, max(tops, default=0), "worst_memory")
            m.AddMaxEquality(self.M, mem_vars)

    def quantity(self, name: str):
        return {"time": self.T, "memory": self.M, "devices": self.used}[name]


def solve_cpsat(problem: SplitProblem, hint: Split | None = None,
                log: Callable[[str], None] | None = None) -> SolverResult:
    """Solve ``problem`` lexicographically with CP-SAT (see the module docstring)."""
    o = problem.options
    order = ORDER[o.objective]
    bounds: dict[str, int] = {}
    result = SolverResult(None, None)
    best: Split | None = hint
    for phase, quantity in enumerate(order):
        model = _Model(problem, best)
        model.tables(with_memory="memory" in order[:phase + 1])
        for name, value in bounds.items():
            model.m.Add(model.quantity(name) <= value)
        model.m.Minimize(model.quantity(quantity))
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = float(o.time_limit)
        solver.parameters.num_workers = int(o.workers)
        solver.parameters.random_seed = 1
        if log:
            log(f"CP-SAT phase {phase + 1}/{len(order)}: minimising {PHASE_NAMES[quantity]}")
        start = _time.monotonic()
        status = solver.Solve(model.m)
        seconds = _time.monotonic() - start
        name = solver.StatusName(status)
        if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            value = int(round(solver.ObjectiveValue()))
            bound = int(round(solver.BestObjectiveBound()))
            best = Split(tuple(int(solver.Value(v)) for v in model.b))
            bounds[quantity] = value
            result.phases.append(PhaseResult(quantity, name, value, bound, seconds))
        else:
            result.phases.append(PhaseResult(quantity, name, None, None, seconds))
            if phase == 0:
                return result
            break
    if best is not None:
        result.split = _canonical(problem, best)
        result.evaluation = evaluate(problem, result.split)
    return result


def _canonical(problem: SplitProblem, split: Split) -> Split:
    """With identical devices, present the stages on the first positions (devices 0..P-1)."""
    if not (problem.homogeneous and not problem.options.pinned_layers):
        return split
    stages = split.stages
    bounds = [a for _, a, _ in stages] + [problem.num_layers] * (problem.devices - len(stages) + 1)
    moved = Split(tuple(bounds))
    return moved if evaluate(problem, moved).feasible else split
