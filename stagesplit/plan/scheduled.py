"""The scheduled path: the chunks of a pipeline schedule solved under the schedule's own actions
(solver/chunk_cpsat.py), each device's capacity, the devices objective searched count by count, and
what the plan's message says of it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from ..common.deadline import Deadline, TimeLimitReached, check_deadline, without_deadline
from ..errors import OptionError, StagesplitError
from ..model.costmodel import StageCostModel
from ..model.traffic import Traffic, layer_traffic
from ..solver.problem import SolveOptions, kept_back_from, with_devices
from .advise import Advice, inputs_for, tied_warnings
from .build import make_schedule_plan
from .records import PlanInputs
from .text import joined, step_text

if TYPE_CHECKING:
    from ..model.phases import PhaseTable
    from ..solver.chunk_cpsat import ChunkSolve
    from ..solver.chunk_problem import ChunkProblem, ChunkResult

__all__ = ["advise_schedule", "check_chunk_count", "chunks_per_rank_of", "device_capacities", "runnable_device_counts", "schedule_problem",
           "solve_chunks"]


# -- pipeline schedules with chunks (solver/chunk_cpsat.py) -----------------------------------------

def device_capacities(model: StageCostModel, options: SolveOptions) -> np.ndarray:
    """Bytes each device may use: its target's memory less the headroom and the reserve."""
    target = model.profile.target
    n = options.devices
    raw = np.array(options.capacities if options.capacities else [target.bytes_per_tile] * n, np.int64)
    capacity = np.floor(raw * (1.0 - options.headroom)).astype(np.int64) - int(options.reserve)
    if (capacity <= 0).any():
        raise OptionError("reserve", f"{options.reserve:,} bytes leaves no memory on a device "
                          f"({int(raw.min()):,} bytes)")
    result: np.ndarray = kept_back_from(capacity, options)
    return result


def schedule_problem(model: StageCostModel, inputs: PlanInputs, table: PhaseTable | None = None) -> ChunkProblem:
    """The chunk-split problem of ``inputs``' schedule on ``model`` (a profile with phases)."""
    from ..errors import StagesplitError
    from ..solver.chunk_problem import ChunkProblem
    from ..solver.schedule_generation import build_schedule
    from ..solver.schedule_kinds import ScheduleKind, traits
    o = inputs.options
    kind = ScheduleKind(o.schedule.value)
    v = chunks_per_rank_of(inputs)
    schedule = build_schedule(kind, o.devices, o.micro_batches, v)
    from ..solver.request import RecomputeMode
    fixed = inputs.request.recompute
    if fixed in (RecomputeMode.FULL, RecomputeMode.SELECTIVE) and traits(kind).splits_backward:
        raise StagesplitError(f"`recompute='{fixed.value}'` under {kind.value}: torch refuses selective checkpointing "
                              "under a split backward and re-runs a fully checkpointed block again for its weight "
                              "gradients; use `recompute='auto'` (none under a split backward) or a schedule that does "
                              "not split the backward (gpipe, 1f1b, interleaved-1f1b, looped-bfs)")
    check_chunk_count(kind.value, v, o.devices, model.num_layers)
    table = table if table is not None else model.phase_table
    seconds_per_byte = 0.0
    if o.communication:
        if table.time_unit != "seconds":
            raise StagesplitError(f"communication cost needs compute in time units: the profile's compute is in "
                                  f"{table.time_unit} and the target cannot convert it")
        assert o.link_bytes_per_s is not None       # SolveOptions checks: communication needs it
        seconds_per_byte = 1.0 / float(o.link_bytes_per_s)
    return ChunkProblem(table=table, schedule=schedule, capacities=device_capacities(model, o),
                        seconds_per_byte=seconds_per_byte, objective=o.objective, min_layers=o.min_layers,
                        max_layers=o.max_layers, pinned_splits=o.pinned_splits, time_limit=o.time_limit,
                        workers=o.workers, recompute=inputs.request.recompute or RecomputeMode.NONE)


def check_chunk_count(schedule: str, chunks_per_rank: int, devices: int, layers: int) -> None:
    """Refuse a schedule whose chunks outnumber the layers (each chunk holds one at least), in the
    words the solve and the layout search both use."""
    if devices * chunks_per_rank > layers:
        raise StagesplitError(f"{schedule} with {chunks_per_rank} chunks on each of {devices} devices needs "
                              f"{devices * chunks_per_rank} chunks, but the model has {layers} layers: use fewer "
                              "devices or chunks")


def solve_chunks(problem: ChunkProblem, log: Callable[[str], None] | None, default_recompute: bool,
                  deadline: Deadline | None = None) -> tuple[ChunkProblem, ChunkSolve]:
    """CP-SAT on ``problem`` by ``deadline`` (default: the problem's time limit from now); where
    recompute was left to stagesplit and nothing fits without it, again with recompute chosen per
    layer (and a note that says so), with the time the first search left (at least a second:
    CP-SAT says little in less).

    Where recompute may follow, the search without it gets half of the time first: on a deep model
    whose splits all need recompute it would otherwise spend the whole limit finding none (the
    Llama-3.1-405B's TP 8 rank on 4 to 64 stages: no split in a 3 s share, where the quick search
    with recompute finds one in a fraction of a second). Where it does find a fit in its half, it
    goes on from that split with the rest of the time."""
    from ..solver.chunk_cpsat import solve_chunks_cpsat
    from ..solver.request import RecomputeMode
    deadline = deadline if deadline is not None else Deadline.after(problem.time_limit)
    may_recompute = default_recompute and problem.table.recompute is not None
    first = deadline.part(deadline.left() / 2) if may_recompute else deadline
    with first.watched():
        solved = solve_chunks_cpsat(problem, deadline=first)
    found = solved.result
    fits = found is not None and found.feasible
    if found is not None and fits and may_recompute and solved.status == "time limit" and deadline.left() > 0.05:
        with deadline.watched():
            more = solve_chunks_cpsat(problem, hint=found, deadline=deadline)
        if more.result is not None and more.result.feasible:
            best = more.result if more.result.key(problem) <= found.key(problem) else found
            solved = replace(more, result=best, bound=max(more.bound, solved.bound), paths=solved.paths + more.paths,
                             seconds=solved.seconds + more.seconds, notes=solved.notes + more.notes)
    if fits or not may_recompute:
        return problem, solved
    if problem.cutoff is not None:
        # a step to beat: recompute only adds time and memory only rules splits out, so where no
        # split beats it without either, none does with recompute (a much smaller model to prove)
        relaxed = replace(problem, capacities=np.full_like(problem.capacities, _NO_LIMIT))
        granted = deadline.at_least(1.0)
        with granted.granted():
            bound = solve_chunks_cpsat(relaxed, deadline=granted)
        if bound.status == "slower":
            return problem, replace(bound, result=solved.result, seconds=solved.seconds + bound.seconds)
    if log:
        log("CP-SAT: nothing fits without recompute; choosing recompute per layer")
    # the deadline is the whole solve's: the second search gets what the first left
    auto = replace(problem, recompute=RecomputeMode.AUTO)
    granted = deadline.at_least(1.0)
    with granted.granted():
        again = solve_chunks_cpsat(auto, deadline=granted)
    if again.result is not None and again.result.feasible:
        again.notes.append("no split fits without activation recompute: the layers marked in the recompute "
                           "column are recomputed (`recompute='none'` to refuse, auto to let it choose always)")
        return auto, again
    if again.status != "infeasible":        # not proven without recompute's help either: unknown
        return auto, again
    return problem, solved


#: a capacity no split reaches (the relaxation without memory limits)
_NO_LIMIT = 2**60


def advise_schedule(model: StageCostModel, inputs: PlanInputs, *, table: PhaseTable | None = None,
                    traffic: Traffic | None = None,
                    log: Callable[[str], None] | None = None, cutoff: float | None = None,
                    deadline: Deadline | None = None) -> Advice:
    """Solve for the chunks of ``inputs``' pipeline schedule: every device fits under the
    schedule's own actions and the simulated step is fastest (or the fullest device emptiest,
    with ``objective="memory"``); the devices objective tries 1, 2, ... devices. ``cutoff``: a
    step time to beat (``schedule='auto'``: another schedule's); where no split beats it, the
    search stops there (``Advice.slower``) instead of proving this schedule's own optimum. The
    search ends by ``deadline`` (default: the time limit from now)."""
    from ..solver.request import Objective
    traffic = traffic or layer_traffic(model)
    o = inputs.options
    deadline = deadline if deadline is not None else Deadline.after(o.time_limit)
    # every part of the search (the schedule's actions, its simulation, CP-SAT's models) stops at the
    # deadline (common/deadline.py); the plan is built after it, from what the search found
    with deadline.watched():
        if o.objective is Objective.DEVICES and not o.exact:
            problem, solved, n, shown = _fewest_devices_under_schedule(model, inputs, table, log, deadline)
        else:
            problem = schedule_problem(model, inputs, table)
            if cutoff is not None and o.objective is Objective.COMPUTE:
                problem = replace(problem, cutoff=float(cutoff))
            if log:
                log(f"CP-SAT: {problem.schedule.kind.value}, {problem.schedule.chunks} chunks on {o.devices} devices")
            problem, solved = solve_chunks(problem, log, inputs.request.recompute is None, deadline)
    if o.objective is Objective.DEVICES and not o.exact:
        fits = solved.result is not None and solved.result.feasible
        if fits:
            solved.notes.append(shown)
        message = _schedule_message(problem, solved, o.time_limit) if fits else shown
        if solved.status == _FEWER_UNKNOWN:
            message = (f"stopped by the time limit ({o.time_limit:g} s): the split is the fastest on {n} devices, "
                       f"but fewer devices were not all ruled out (see the note)")
        with without_deadline():
            plan = make_schedule_plan(model, problem, solved, inputs_for(inputs, n), traffic=traffic, message=message)
        return Advice(plan=plan, result=None, problem=None, warnings=tied_warnings(plan))
    with without_deadline():
        plan = make_schedule_plan(model, problem, solved, inputs, traffic=traffic,
                                  message=_schedule_message(problem, solved, o.time_limit))
    return Advice(plan=plan, result=None, problem=None, warnings=tied_warnings(plan), slower=solved.status == "slower")


def chunks_per_rank_of(inputs: PlanInputs) -> int:
    """The chunks each device runs under ``inputs``' schedule (``SolveRequest.resolved_chunks``)."""
    return inputs.request.resolved_chunks()


def runnable_device_counts(inputs: PlanInputs, num_layers: int) -> list[int]:
    """The device counts up to the request's on which its schedule can run: torch's schedule
    class accepts the count with the micro-batches it then has (a defaulted count follows the
    devices), and every chunk gets a layer. Not monotone: 1F1B needs micro-batches >= devices,
    interleaved 1F1B micro-batches that are a multiple of max(1, M // devices)."""
    from ..solver.schedule_kinds import ScheduleKind, is_valid
    kind = ScheduleKind(inputs.options.schedule.value)
    v = chunks_per_rank_of(inputs)
    return [n for n in range(1, inputs.options.devices + 1)
            if n * v <= num_layers and is_valid(kind, n, with_devices(inputs.options, n).micro_batches, v)]


def _fewest_devices_under_schedule(model: StageCostModel, inputs: PlanInputs, table: PhaseTable | None,
                                   log: Callable[[str], None] | None, deadline: Deadline
                                   ) -> tuple[ChunkProblem, ChunkSolve, int, str]:
    """The fewest devices (up to the request's) on which the schedule fits, among the counts it
    can run with (``runnable_device_counts``) that the resident bytes alone do not rule out: a
    bisection (the quick search first, CP-SAT where that finds no fit) finds a count that fits,
    then CP-SAT checks the fewer counts it passed over, fewest first, while time is left (a
    schedule's memory need not shrink with more devices: 1F1B's first stage holds a micro-batch
    more for each). Returns the problem and search at the count chosen, the count, and what the
    search showed about fewer devices (a note; or, where none fits, the plan's message)."""
    import dataclasses
    import math
    import time

    from ..errors import StagesplitError
    from ..solver.chunk_cpsat import ChunkSolve
    from ..solver.chunk_search import local_search
    from ..solver.request import Objective
    table = table if table is not None else model.phase_table
    o = inputs.options
    tried: dict[int, tuple[ChunkProblem, ChunkSolve]] = {}
    # counts the quick search found a fit on: (problem, split, seconds)
    quick_fits: dict[int, tuple[ChunkProblem, ChunkResult, float]] = {}

    left = deadline.left

    def attempt(n: int, prove: bool, share: float = 1 / 3) -> bool:
        """Whether ``n`` devices fit: the quick search, then (``prove``, or where it finds no fit)
        CP-SAT with ``share`` of the time the whole solve has left. False where the time limit
        stops it before either finds a fit (the count is then not known)."""
        begun = time.monotonic()
        trial = inputs_for(inputs, n)
        trial = replace(trial, options=replace(trial.options, objective=Objective.COMPUTE),
                        request=replace(trial.request, objective=Objective.COMPUTE))
        try:
            problem = schedule_problem(model, trial, table)
            part = deadline.part(left() * share).at_least(1.0)
            if not prove and n not in tried:
                quick = local_search(problem, budget_s=max(min(2.0, left() / 12), 0.2))
                if quick.feasible:
                    quick_fits[n] = (problem, quick, time.monotonic() - begun)
                    return True
            if log:
                log(f"CP-SAT: {problem.schedule.kind.value} on {n} device(s)")
            problem, solved = solve_chunks(problem, log, inputs.request.recompute is None, part)
        except TimeLimitReached:
            return False
        if n in tried and fits(n) and not (solved.result is not None and solved.result.feasible):
            return True                      # a later search of the same count ran out of time: keep the first
        tried[n] = (problem, solved)
        return fits(n)

    def fits(n: int) -> bool:
        solved = tried[n][1] if n in tried else None
        return solved is not None and solved.result is not None and solved.result.feasible

    runnable = runnable_device_counts(inputs, table.num_layers)
    if not runnable:
        raise StagesplitError(f"no device count up to {o.devices} can run {o.schedule.value} with "
                              f"{chunks_per_rank_of(inputs)} chunk(s) per device on {table.num_layers} layers and "
                              + _micro_words(o))
    capacity = float(device_capacities(model, o).max())
    need = max(1, math.ceil(float(table.resident[0, table.num_layers - 1]) / capacity))
    counts = [n for n in runnable if n >= need] or runnable[-1:]
    found = None
    if attempt(counts[-1], prove=False):
        low, high = 0, len(counts) - 1
        while low < high:
            mid = (low + high) // 2
            if attempt(counts[mid], prove=False):
                high = mid
            else:
                low = mid + 1
        found = counts[high]
    # the counts below the one found (all, where none was) that no search has ruled out, fewest first
    for n in [m for m in counts if (found is None or m < found) and m not in tried]:
        if left() < 1.0:
            break
        if attempt(n, prove=True, share=0.5):
            found = n
            break
    if found is None:
        n = counts[-1]
        if n not in tried or not _proven_out(tried, n) and left() >= 1.0:    # again, with the time left
            attempt(n, prove=True, share=0.9)
        if n not in tried:
            check_deadline()                 # nothing was found before the time limit: the one-line error
            raise TimeLimitReached(f"no split was found within the time limit ({o.time_limit:g} s); allow more "
                                   "with `time_limit`")
        return (*tried[n], n, _none_fits(inputs, runnable, counts, need, tried))
    if not fits(found) or not tried[found][1].optimal:
        attempt(found, prove=True, share=0.9)
    if not fits(found):                      # the time limit stopped CP-SAT: the quick search's split, not proven
        problem, quick, seconds = quick_fits[found]
        tried[found] = (problem, ChunkSolve(quick, False, 0.0, 0, seconds, "time limit"))
    problem, solved = tried[found]
    if any(need <= m < found and not _proven_out(tried, m) for m in runnable) and solved.optimal:
        # the split is the fastest on `found` devices, but fewer may hold the model: not proven
        solved = dataclasses.replace(solved, optimal=False, status=_FEWER_UNKNOWN)
    return problem, solved, found, _fewer_note(runnable, found, need, tried)


#: the status of a devices search's split that is the fastest on its count, where the time limit
#: left some fewer count not known
_FEWER_UNKNOWN = "fewer not known"


def _micro_words(o: SolveOptions) -> str:
    return f"{o.micro_batches} micro-batches" if not o.micro_batches_auto else "as many micro-batches as chunks"


def _counts_text(counts: list[int]) -> str:
    """``1..3, 5 and 7``: device counts, runs of consecutive ones as ranges."""
    runs: list[list[int]] = []
    for n in counts:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    parts = [str(a) if a == b else f"{a} and {b}" if b == a + 1 else f"{a}..{b}" for a, b in runs]
    return joined(parts, "and")


def _proven_out(tried: dict[int, tuple[ChunkProblem, ChunkSolve]], n: int) -> bool:
    return n in tried and tried[n][1].status == "infeasible"


def _fewer_note(runnable: list[int], n: int, need: int, tried: dict[int, tuple[ChunkProblem, ChunkSolve]]) -> str:
    """What the device search showed about fewer than ``n`` devices: every count the schedule
    runs with below ``n`` is below what the resident bytes need, proven not to fit by CP-SAT, or
    not known (the time limit stopped the search first)."""
    head = f"`objective='devices'`: {n} device{'s hold' if n != 1 else ' holds'} the model"
    if n == 1:
        return head
    parts = []
    if need > 1:
        parts.append(f"fewer than {need} cannot hold even the bytes resident all step (parameters, gradients, "
                     f"optimizer state)")
    fewer = [m for m in runnable if need <= m < n]
    proven = [m for m in fewer if _proven_out(tried, m)]
    unknown = [m for m in fewer if m not in proven]
    if proven:
        parts.append(f"{_counts_text(proven)} {_do(proven)} not fit (proven by CP-SAT)")
    if unknown:
        parts.append(f"whether {_counts_text(unknown)} {_do(unknown)} is not known (the time limit stopped the "
                     f"search first), so {n} is not proven the fewest")
    idle = [m for m in range(1, n) if m not in runnable]
    if idle:
        parts.append(f"the schedule cannot run on {_counts_text(idle)}")
    return head + "; " + "; ".join(parts)


def _none_fits(inputs: PlanInputs, runnable: list[int], counts: list[int], need: int,
               tried: dict[int, tuple[ChunkProblem, ChunkSolve]]) -> str:
    """The message of a devices search where no count fits: which counts were ruled out, how,
    and what would allow more devices."""
    o = inputs.options
    below = [m for m in runnable if m < need]
    proven = [m for m in counts if m >= need and _proven_out(tried, m)]
    unknown = [m for m in counts if m >= need and m not in proven]
    text = f"no split fits on any number of devices up to {o.devices} that {o.schedule.value} can run with " \
        f"{_micro_words(o)}"
    from ..solver.request import RecomputeMode
    problem = tried[counts[-1]][0]
    recompute = problem.table.recompute is not None
    said = [f"{_counts_text(below)}: the bytes resident all step alone need {need} devices"] if below else []
    if proven:
        said.append(f"{_counts_text(proven)}: proven not to fit by CP-SAT" +
                    (", even with recompute chosen per layer" if recompute and inputs.request.recompute in
                     (None, RecomputeMode.AUTO) else ""))
    if unknown:
        said.append(f"{_counts_text(unknown)}: no split found within the time limit, not proven")
    text += " (" + "; ".join(said) + ")"
    most = min(o.devices, problem.num_layers // chunks_per_rank_of(inputs))
    options = []
    if runnable[-1] < most:
        text += f"; {o.schedule.value} runs on at most {runnable[-1]} of them with {_micro_words(o)}"
        options.append("more micro-batches (to allow more devices)")
    if recompute and inputs.request.recompute is RecomputeMode.NONE:
        options.append("recompute (`recompute='auto'`)")
    options += ["another schedule", "devices with more memory"]
    return f"{text}: try {joined(options, 'or')}"


def _do(counts: list[int]) -> str:
    return "does" if counts == [1] else "do"


def _schedule_message(problem: ChunkProblem, solved: ChunkSolve, limit: float | None = None) -> str:
    """The plan's message on how the search ended ("" where proven); ``limit``: the time limit
    to name (default the problem's own)."""
    r = solved.result
    limit = problem.time_limit if limit is None else limit
    if solved.status == "slower":
        assert problem.cutoff is not None            # only a search given a step to beat is slower
        return (f"no split is faster than {step_text(problem.cutoff, problem.table.time_unit)} (proven)"
                + ("" if r is not None and r.feasible else "; none that fits was found"))
    if r is None or not r.feasible:
        if solved.status == "infeasible":
            fullest = "" if r is None else f" (the closest split still needs {max(r.peaks / problem.capacities):.0%} " \
                f"of a device)"
            return (f"no split into {problem.schedule.chunks} chunks fits {problem.schedule.devices} devices under "
                    f"{problem.schedule.kind.value} with {problem.schedule.micro_batches} micro-batches{fullest}: use "
                    f"more devices, fewer micro-batches in flight (another schedule), or recompute")
        return f"CP-SAT found no split within the time limit ({limit:g} s); allow more with `time_limit`"
    if not solved.optimal:
        gap = (r.step_time - solved.bound) / r.step_time if r.step_time else 0.0
        return (f"stopped by the time limit ({limit:g} s): best split found, not proven optimal "
                f"(gap {100 * gap:.1f}%)")
    return ""
