"""The search for a split within the time limit, on the stage-level model: the exact DP where its
work fits the time left, CP-SAT for what it does not prove; the range table that prices every
stage (``price``) and the fewest stages that hold the model (``fewest_stages_that_fit``)."""

from __future__ import annotations

import time as _time
from collections.abc import Callable

import numpy as np

from ..common.deadline import Deadline
from ..model.costmodel import RangeTable, StageCostModel
from ..solver.cpsat import ORDER, PHASE_NAMES, PhaseResult, SolverResult, model_seconds_estimate, solve_split_cpsat
from ..solver.dp import Solution, conservative_split, dp_cells, dp_mode, exact_optimum
from ..solver.problem import (
    SolveOptions,
    Split,
    SplitProblem,
    evaluate_split,
    in_flight,
    in_flight_values,
    stage_capacities,
)

__all__ = ["DP_CELLS_PER_SECOND", "DP_CELLS_PER_SECOND_ONE_COUNT", "dp_seconds_estimate", "fewest_stages_that_fit",
           "price", "search"]


#: the exact DP's speed, in (state, stage end) cells per second, that its work (``dp.dp_cells``) is
#: checked against the time limit with before it starts: measured 8e7-2.9e8 on the 2-core
#: development machine where the stages' in-flight counts differ, 6e8-1e9 where they are all one
#: count (its arrays are then made once). A DP that runs longer than estimated stops at the limit
#: with the phases it proved.
DP_CELLS_PER_SECOND = 1e8
DP_CELLS_PER_SECOND_ONE_COUNT = 5e8


def dp_seconds_estimate(problem: SplitProblem) -> float:
    """About how long the exact DP would take on ``problem`` (its work over its speed)."""
    rate = DP_CELLS_PER_SECOND_ONE_COUNT if len(problem.in_flight_values) == 1 else DP_CELLS_PER_SECOND
    return dp_cells(problem) / rate


def search(problem: SplitProblem, hint: Split | None = None, log: Callable[[str], None] | None = None,
           clock: Callable[[], float] = _time.monotonic, deadline: Deadline | None = None) -> SolverResult:
    """The optimal split by ``deadline`` (default: the options' time limit from now; ``clock``
    lets a test run the DP on its own clock), for every phase together: the exact DP
    first when its estimated time fits in the limit (it also stops at the limit); CP-SAT, with
    the time left, only for the phases the DP did not prove, given the DP's optimum as hint and
    bound (else ``hint``, e.g. the greedy split), and only when its model can be built in the time
    left. The result says which solver proved each phase and how long each took."""
    limit = float(problem.options.time_limit)          # the user's, named in the notes
    deadline = deadline if deadline is not None else Deadline.after(limit)
    start = clock()
    end = start + deadline.left()
    estimate = dp_seconds_estimate(problem)
    notes = []
    oracle = None
    dp_seconds = None
    found_by = "the greedy first-fit" if hint is not None else ""
    if estimate <= end - start:
        if log:
            log("exact DP")
        oracle = exact_optimum(problem, deadline=end, clock=clock)
        dp_seconds = clock() - start
        if oracle.complete:
            return _dp_result(problem, oracle, dp_seconds)
        proven = " and ".join(PHASE_NAMES[q] for q in oracle.proven)
        notes.append(f"the exact DP stopped at the time limit ({limit:g} s) after {dp_seconds:.2f} s"
                     + (f", having proved the {proven}" if proven else ""))
    else:
        notes.append(f"the exact DP was not run: it would take about {estimate:.3g} s here, more than the time limit "
                     f"({limit:g} s)")
        if dp_mode(problem) == "position-count":
            # the stage count in the DP's state is what costs: without it, a split that fits, fast
            quick = conservative_split(problem, deadline=end, clock=clock)
            dp_seconds = clock() - start
            if quick.feasible and quick.split is not None and (hint is None or _better(problem, quick.split, hint)):
                hint, found_by = quick.split, "the DP with the most micro-batches in flight"
                notes.append("a split that fits was found by the DP with every stage holding the most micro-batches "
                             "its position can have")
    if oracle is not None and oracle.feasible:
        hint, found_by = oracle.split, "the exact DP"
    remaining = max(end - clock(), 0.0)
    build = model_seconds_estimate(problem)
    if build > remaining:
        notes.append(f"CP-SAT was not run: its model would take about {build:.3g} s to build, more than the time left "
                     f"({remaining:.2f} s); " + (f"the split of {found_by} is given, not proven optimal" if found_by
                                                 else "no split was found"))
        result = _unproven_result(problem, hint, oracle)
    else:
        notes.append("CP-SAT searched with the time left")
        result = solve_split_cpsat(problem, hint=hint, log=log, oracle=oracle, deadline=deadline.part(remaining))
    result.dp_seconds = dp_seconds
    result.notes[:0] = notes
    return result


def _better(problem: SplitProblem, split: Split, other: Split) -> bool:
    """Whether ``split`` is lexicographically better than ``other`` (which may not fit)."""
    objective = problem.options.objective
    mine, theirs = evaluate_split(problem, split), evaluate_split(problem, other)
    return not theirs.feasible or mine.key(objective) < theirs.key(objective)


def _unproven_result(problem: SplitProblem, split: Split | None, oracle: Solution | None) -> SolverResult:
    """The best split known, no solver having proved it: the DP's proven phases are OPTIMAL (proof
    "dp"), the others FEASIBLE with no bound (status "feasible"; "unknown" without a split)."""
    evaluation = evaluate_split(problem, split) if split is not None else None
    if evaluation is None or not evaluation.feasible:
        return SolverResult(None, None, [PhaseResult(ORDER[problem.options.objective][0], "UNKNOWN", None, None, 0.0)],
                            cpsat_seconds=None)
    proven = oracle.proven if oracle is not None else ()
    phases = []
    for quantity in ORDER[problem.options.objective]:
        value = int(getattr(evaluation, quantity))
        if quantity in proven:
            phases.append(PhaseResult(quantity, "OPTIMAL", value, value, 0.0, 0, "dp"))
        else:
            phases.append(PhaseResult(quantity, "FEASIBLE", value, None, 0.0, 0, ""))
    return SolverResult(split, evaluation, phases)


def _dp_result(problem: SplitProblem, oracle: Solution, seconds: float) -> SolverResult:
    """The DP's complete answer as a solver result: every phase proved by the DP (or no split fits)."""
    quantities = ORDER[problem.options.objective]
    result = SolverResult(oracle.split, oracle.evaluation, dp_seconds=seconds)
    if oracle.split is None:
        result.phases.append(PhaseResult(quantities[0], "INFEASIBLE", None, None, oracle.seconds[0], 0, "dp"))
        return result
    for quantity, took in zip(quantities, oracle.seconds):
        value = int(getattr(oracle.evaluation, quantity))
        result.phases.append(PhaseResult(quantity, "OPTIMAL", value, value, took, 0, "dp"))
    return result


def price(model: StageCostModel, options: SolveOptions, max_devices: int | None = None,
          progress: Callable[[int, int], None] | None = None) -> RangeTable:
    """Price, once, the ranges that can fit the largest device for all the in-flight counts a
    solve (or sweep) may need, and for one micro-batch and any stage count, which explaining an
    infeasible problem needs."""
    stages = max(options.devices, max_devices or 0, model.num_layers)
    ks = {1, *in_flight_values(options.schedule, options.micro_batches, stages)}
    capacity, _ = stage_capacities(model.profile.target, options)
    return model.price_ranges(tuple(sorted(ks)), progress=progress, capacity=int(capacity.max()))


def fewest_stages_that_fit(table: RangeTable, capacity: np.ndarray, options: SolveOptions,
                           limit: int | None = None) -> int | None:
    """The fewest stages, stage s on a device like ``capacity[s % len(capacity)]``, that hold
    the model; pins and layer-count limits are ignored. None if no number of stages fits.

    For each stage count, the prefixes of layers the first s stages can hold are tracked as a
    set: a stage starting at layer a can end anywhere up to the last layer that still fits
    (a stage's memory grows with its last layer). First fit, which always takes as many layers
    as fit, is optimal on identical devices but not on mixed ones: taking one more layer onto a
    large device can leave a layer in front of a small device that cannot hold it."""
    L = table.num_layers
    reach_cache: dict[tuple[int, int], np.ndarray] = {}

    def reach(k: int, cap: int) -> np.ndarray:
        """reach[a] = the end (exclusive) of the longest stage starting at layer a that fits."""
        key = (k, cap)
        if key not in reach_cache:
            reach_cache[key] = table.reach(k, cap)          # == a: no stage fits
        return reach_cache[key]

    # no stage holds more layers than the band is wide: fewer stages cannot hold them all
    for stages in range(max(1, -(-L // max(table.width, 1))), (limit or L) + 1):
        starts = np.zeros(L + 1, bool)                          # prefixes the stages so far can hold
        starts[0] = True
        for s in range(stages):
            k = in_flight(options.schedule, options.micro_batches, s, stages)
            if not table.supports((k,)):
                starts[:] = False
                break
            end = reach(k, int(capacity[s % len(capacity)]))
            a = np.flatnonzero(starts[:L])
            diff = np.zeros(L + 2, np.int64)                    # ends a+1 .. end[a] become reachable
            ok = end[a] > a
            np.add.at(diff, a[ok] + 1, 1)
            np.add.at(diff, end[a[ok]] + 1, -1)
            starts = np.cumsum(diff)[:L + 1] > 0
            if not starts.any():
                break
        if starts[L]:
            return stages
    return None
