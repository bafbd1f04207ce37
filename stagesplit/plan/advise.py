"""From a priced model to a plan: solve with CP-SAT, explain infeasibility, compare with what
the user would do otherwise (the GPU frameworks' default splits, or PopLiner's greedy and an
even split on an IPU), and sweep the number of devices."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator

import numpy as np

from ..common.text import show
from ..model.costmodel import RangeTable, StageCostModel
from ..model.traffic import Traffic, layer_traffic
from ..solver.cpsat import SolverResult, solve_cpsat
from ..solver.dp import Solution, UnlayeredFirst, exact_optimum, greedy, uniform
from ..solver.problem import (SolveOptions, Split, SplitProblem, build_problem, evaluate, in_flight, in_flight_values,
                              with_devices)
from .baselines import framework_baselines, layer_roles
from .build import make_plan, make_schedule_plan
from ..solver.request import SolveRequest
from .records import Plan, PlanInputs

__all__ = ["Advice", "SweepResult", "SweepRow", "advise", "advise_schedule", "device_capacities", "explain_infeasible",
           "fewest_devices", "framework_plans", "inputs_for", "inputs_of", "layer_parameter_bytes", "price",
           "schedule_problem", "sweep"]


@dataclass
class Advice:
    plan: Plan
    result: SolverResult | None
    problem: SplitProblem
    baselines: list[Plan] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


#: the exact DP runs before CP-SAT when its work, about N^2/2 x (L+1) x W array cells per pass
#: (W: the most layers a stage that fits can hold), is at most this: 500 layers on 128 devices
#: with stages of up to 100 layers is 4e8, a few seconds per pass
DP_BUDGET = 2e9


def dp_affordable(problem: SplitProblem) -> bool:
    """Whether the exact DP (oracle.py) is cheap enough to give CP-SAT its optimum as a bound."""
    L = problem.num_layers
    mem = problem.mem[0]                               # the fewest micro-batches in flight: the widest band
    fits = np.triu(mem <= int(problem.capacity.max()))
    width = int((np.where(fits, np.arange(L)[None, :] - np.arange(L)[:, None] + 1, 0)).max(initial=0))
    return problem.devices ** 2 / 2 * (L + 1) * max(width, 1) <= DP_BUDGET


def price(model: StageCostModel, options: SolveOptions, max_devices: int | None = None,
          progress: Callable[[int, int], None] | None = None) -> RangeTable:
    """Price every range once for all the in-flight counts a solve (or sweep) may need, and for
    one micro-batch and any stage count, which explaining an infeasible problem needs."""
    stages = max(options.devices, max_devices or 0, model.num_layers)
    ks = {1, *in_flight_values(options.schedule, options.micro_batches, stages)}
    return model.price_ranges(tuple(sorted(ks)), progress=progress)


def fewest_devices(table: RangeTable, capacity: np.ndarray, options: SolveOptions, limit: int | None = None) -> int | None:
    """The fewest stages, stage s on a device like ``capacity[s % len(capacity)]``, that hold
    the model; pins and layer-count limits are ignored. None if no number of stages fits.

    For each stage count, the prefixes of layers the first s stages can hold are tracked as a
    set: a stage starting at layer a can end anywhere up to the last layer that still fits
    (a stage's memory grows with its last layer). First fit, which always takes as many layers
    as fit, is optimal on identical devices but not on mixed ones: taking one more layer onto a
    large device can leave a layer in front of a small device that cannot hold it."""
    L = table.worst_bytes.shape[1]
    rows = np.arange(L)
    reach_cache: dict[tuple[int, int], np.ndarray] = {}

    def reach(k: int, cap: int) -> np.ndarray:
        """reach[a] = the end (exclusive) of the longest stage starting at layer a that fits."""
        key = (k, cap)
        if key not in reach_cache:
            bad = (table.worst_bytes[table.k_index(k)] > cap) & (rows[None, :] >= rows[:, None])
            reach_cache[key] = np.where(bad.any(axis=1), bad.argmax(axis=1), L)   # == a: no stage fits
        return reach_cache[key]

    for stages in range(1, (limit or L) + 1):
        starts = np.zeros(L + 1, bool)                          # prefixes the stages so far can hold
        starts[0] = True
        for s in range(stages):
            k = in_flight(options.schedule, options.micro_batches, s, stages)
            if k not in table.in_flight:
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


def explain_infeasible(model: StageCostModel, problem: SplitProblem, table: RangeTable) -> str:
    """Say plainly why nothing fits: a layer too big for any device, or how many devices would do."""
    names = model.layers.names
    cap = int(problem.capacity.max())
    single = np.diagonal(table.worst_bytes[table.k_index(1)])
    too_big = np.flatnonzero(single > cap)
    n = problem.devices
    if len(too_big):
        l = int(too_big[np.argmax(single[too_big])])
        tile = int(table.worst_tile[table.k_index(1), l, l])
        return (f"layer '{names[l]}' alone needs {int(single[l]):,} bytes on tile {tile}, more than a device holds "
                f"({cap:,} bytes per tile after headroom), so no number of devices fits; split that layer "
                f"(a finer --layer-regex) or free memory on that tile")
    o = problem.options
    constrained = bool(o.pinned_splits or o.pinned_layers or o.min_layers > 1 or o.max_layers)
    enough = fewest_devices(table, problem.capacity, o)
    if enough is None:
        return f"no split of the {len(names)} layers fits on {n} device(s), nor on any number of such devices"
    if enough <= n:
        return (f"no split fits on {n} device(s) under the given pins and layer-count limits; without them "
                f"{enough} device(s) would do")
    caveat = " (ignoring pins and layer-count limits)" if constrained else ""
    return f"no split of the {len(names)} layers fits on {n} device(s); the smallest number that fits is {enough}{caveat}"


def inputs_of(model: StageCostModel, options: SolveOptions | PlanInputs, **request: Any) -> PlanInputs:
    """``options`` as a plan's inputs: resolved options given directly (tests, benchmarks and
    tools working in layer indices) get the request they resolve from, pins named by layer;
    ``request`` sets its other fields (``compare=True``)."""
    if isinstance(options, PlanInputs):
        return replace(options, request=replace(options.request, **request)) if request else options
    names = model.layers.names
    target = model.profile.target
    request = SolveRequest(
        devices=options.devices, objective=options.objective, exact=options.exact, schedule=options.schedule,
        micro_batches=None if options.micro_batches_auto else options.micro_batches, headroom=options.headroom,
        reserve=options.reserve, min_layers=options.min_layers, max_layers=options.max_layers,
        pin_splits=tuple(names[j] for j in options.pinned_splits),
        pin_layers=tuple((names[layer], position) for layer, position in options.pinned_layers),
        communication=options.communication, link_bandwidth=options.link_bytes_per_s,
        time_limit=max(options.time_limit, 1e-6),      # the request wants > 0; options may say 0 (DP only)
        workers=options.workers, shared=model.shared, layering=model.layers.options, **request)
    return PlanInputs(request=request, options=options, targets=(target,) * options.devices)


def advise(model: StageCostModel, inputs: PlanInputs | SolveOptions, *, traffic: Traffic | None = None,
           table: RangeTable | None = None, progress: Callable[[int, int], None] | None = None,
           log: Callable[[str], None] | None = None) -> Advice:
    """Solve for ``options.devices`` devices and describe the result as a Plan. With
    the request's ``compare``, add PopLiner's greedy and a uniform split; its ``unlayered_first``
    makes the greedy put the unlayered operations on the first stage, as PopLiner does (see
    ``popliner_tables``)."""
    inputs = inputs_of(model, inputs)
    options = inputs.options
    compare, unlayered_first = inputs.request.compare, inputs.request.unlayered_first
    traffic = traffic or layer_traffic(model)
    table = table if table is not None else price(model, options, progress=progress)
    problem = build_problem(model, options, traffic=traffic, table=table)
    warnings = []
    if model.layer_compute.sum() == 0 and options.objective == "compute":
        warnings.append("the profile has no compute estimates, so compute cannot be balanced: the split "
                        "minimises the worst stage's memory instead")
    base = greedy(problem)
    oracle = exact_optimum(problem) if dp_affordable(problem) else None
    result = solve_cpsat(problem, hint=base.split, log=log, oracle=oracle)
    message = ""
    if result.split is None:
        if result.status == "infeasible":
            message = explain_infeasible(model, problem, table)
        else:
            message = (f"CP-SAT found no split within the time limit ({options.time_limit:g} s); "
                       "allow more time with --time-limit")
    elif result.status == "feasible":
        message = (f"stopped by the time limit ({options.time_limit:g} s): best split found, not proven optimal "
                   f"(gap {100 * max(p.gap or 0 for p in result.phases):.1f}%)")
    plan = make_plan(model, problem, result.split, inputs, method="cp-sat", traffic=traffic, result=result,
                     message=message)
    warnings += _tied_warnings(plan)
    advice = Advice(plan=plan, result=result, problem=problem, warnings=warnings)
    if compare and model.profile.target.kind == "gpu":      # a GPU: the frameworks' defaults
        advice.baselines.extend(framework_plans(model, problem, traffic, inputs))
    elif compare:
        if unlayered_first:
            base = greedy(problem, unlayered_first=popliner_tables(model, problem.in_flight_values))
        for solution in (base, uniform(problem)):
            advice.baselines.append(_baseline_plan(model, problem, solution, traffic, inputs))
    return advice


def layer_parameter_bytes(model: StageCostModel) -> np.ndarray:
    """Each layer's own always-live bytes (its parameters with their gradients and optimizer
    state), the shared items left out: what DeepSpeed's "parameters" partition balances."""
    shared = int(model.shared_memory().always_live.sum()) if model.shared == "every" else 0
    return np.array([max(int(model.stage_memory(l, l).always_live.sum()) - shared, 0)
                     for l in range(model.num_layers)], np.float64)


def framework_plans(model: StageCostModel, problem: SplitProblem, traffic: Traffic, inputs: PlanInputs) -> list[Plan]:
    """The GPU frameworks' default splits (plan/baselines.py) priced as plans; one a framework
    refuses for this model is a plan with no stages whose message says why."""
    _, first_re, last_re, _ = model.layers.options.compiled()
    embedding, head = layer_roles(model.layers.names, first_re, last_re)
    out = []
    for b in framework_baselines(model.num_layers, problem.devices, layer_parameter_bytes(model), embedding, head):
        if b.bounds is None:
            out.append(make_plan(model, problem, None, inputs, method=b.key, traffic=traffic, message=b.reason))
            continue
        split = Split(b.bounds)
        ev = evaluate(problem, split)
        out.append(make_plan(model, problem, split, inputs, method=b.key, traffic=traffic,
                             message="" if ev.feasible else ev.reason))
    return out


def popliner_tables(model: StageCostModel, in_flight_counts) -> UnlayeredFirst:
    """Stage memory as PopLiner counts it: the operations with no layer (and the items only
    they use) on the first stage, nowhere else. The first stage is priced with
    ``shared="every"``, the others with ``shared="none"``, whatever the model's own policy."""
    from ..model.costmodel import StageCostModel
    ks = tuple(in_flight_counts)
    every = model if model.shared == "every" else StageCostModel(model.profile, model.layers, shared="every")
    none = model if model.shared == "none" else StageCostModel(model.profile, model.layers, shared="none")
    table = none.price_ranges(ks)
    rest = np.stack([table.worst_bytes[table.k_index(k)] for k in ks])
    first = np.array([[every.stage_memory(0, e).worst_bytes(k) for e in range(model.num_layers)] for k in ks],
                     np.int64).reshape(len(ks), model.num_layers)
    alone = np.array([every.shared_memory().worst_bytes(k) for k in ks], np.int64)
    return UnlayeredFirst(first=first, rest=rest, alone=alone)


def _baseline_plan(model: StageCostModel, problem: SplitProblem, solution: Solution, traffic: Traffic,
                   inputs: PlanInputs) -> Plan:
    split = solution.split
    message = "" if solution.feasible else (solution.evaluation.reason if solution.evaluation else "no split found")
    return make_plan(model, problem, split, inputs, method=solution.method, traffic=traffic, message=message)


@dataclass
class SweepRow:
    devices: int
    plan: Plan
    micro_batches: int

    @property
    def fits(self) -> bool:
        return self.plan.feasible


@dataclass(repr=False)
class SweepResult:
    """The rows of a devices sweep, one per device count, in the order asked for. Behaves as a
    sequence of ``SweepRow`` (iterate, ``len``, index); ``frame()`` gives a pandas DataFrame and
    notebooks show it as a table."""

    rows: list[SweepRow] = field(default_factory=list)
    #: what the command line prints as warnings (the profile's, the grouping's)
    warnings: list[str] = field(default_factory=list)

    def __iter__(self) -> Iterator[SweepRow]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index):
        """A row by position; a slice gives a ``SweepResult`` of those rows."""
        if isinstance(index, slice):
            return SweepResult(self.rows[index])
        return self.rows[index]

    def __repr__(self) -> str:
        fewest = self.fewest_devices
        return (f"SweepResult(devices {[r.devices for r in self.rows]}, "
                f"{f'fewest that fit: {fewest}' if fewest is not None else 'none fits'})")

    @property
    def fewest_devices(self) -> int | None:
        """The fewest device counts of the sweep whose plan fits (None if none does)."""
        return min((r.devices for r in self.rows if r.fits), default=None)

    def frame(self):
        """A pandas DataFrame with one row per device count (index ``devices``): ``fits``,
        ``stages`` (devices used), ``micro_batches``, ``status``, ``bottleneck_stage``,
        ``bottleneck_compute`` (in ``attrs["compute_unit"]``), ``bottleneck_time`` (compute
        unit, transfers included), ``bottleneck_time_s`` (NaN without seconds),
        ``efficiency`` (pipeline efficiency), ``bubble``, ``worst_memory`` (fullest stage's
        fraction of its capacity), ``worst_memory_bytes``, ``split`` and ``message``. A row whose
        plan has no split has ``stages`` 0, NaN figures and <NA> in the nullable Int64 columns."""
        from ..common.frames import frame
        from ..solver.problem import bubble_fraction
        rows = self.rows

        def each(f):                                   # f(row, bottleneck stage, fullest stage); None: no split
            return [f(r, r.plan.bottleneck, r.plan.worst_memory) if r.plan.stages else None for r in rows]

        cols = {
            "fits": ([r.fits for r in rows], "bool"),
            "stages": ([len(r.plan.stages) for r in rows], "int64"),
            "micro_batches": ([r.micro_batches for r in rows], "int64"),
            "status": ([r.plan.status for r in rows], object),
            "bottleneck_stage": (each(lambda r, b, w: b.stage), "Int64"),
            "bottleneck_compute": (each(lambda r, b, w: b.compute), "float64"),
            "bottleneck_time": (each(lambda r, b, w: b.stage_time), "float64"),
            "bottleneck_time_s": (each(lambda r, b, w: b.time_s), "float64"),
            "efficiency": (each(lambda r, b, w: r.plan.pipeline_efficiency(r.micro_batches)), "float64"),
            "bubble": (each(lambda r, b, w: bubble_fraction(len(r.plan.stages), r.micro_batches)), "float64"),
            "worst_memory": (each(lambda r, b, w: w.worst_tile_bytes / w.capacity_bytes if w.capacity_bytes else None),
                             "float64"),
            "worst_memory_bytes": (each(lambda r, b, w: w.worst_tile_bytes), "Int64"),
            "split": ([r.plan.short_split_text() if r.plan.stages else None for r in rows], object),
            "message": ([r.plan.message for r in rows], object),
        }
        unit = rows[0].plan.compute_unit if rows else ""
        return frame(cols, index=("devices", [r.devices for r in rows], "int64"), attrs={"compute_unit": unit})

    def _repr_html_(self) -> str:
        """Notebook display: the fewest devices that fit, then the frame; names are escaped."""
        from ..common.frames import html_summary
        name = self.rows[0].plan.profile.name if self.rows else ""
        counts = [r.devices for r in self.rows]
        title = f"stagesplit devices sweep of {name or 'a profile'}" + \
            (f": {min(counts)}..{max(counts)} devices" if counts else "")
        fewest = self.fewest_devices
        lines = [f"fewest devices that fit: {fewest}" if fewest is not None else "no device count in the sweep fits"]
        if self.rows and self.rows[0].plan.notes:
            lines.append(f"note: {self.rows[0].plan.notes[0]}")
        return html_summary(title, lines, self.frame().to_html())


def sweep(model: StageCostModel, inputs: PlanInputs | SolveOptions, device_counts: list[int], *,
          table: RangeTable | None = None, progress: Callable[[int, int], None] | None = None,
          on_row: Callable[[SweepRow], None] | None = None) -> SweepResult:
    """Solve for each device count (pricing every range once, unless ``table`` is given); the
    rows, in the order of ``device_counts``, as a ``SweepResult`` (a sequence of rows)."""
    inputs = inputs_of(model, inputs)
    traffic = layer_traffic(model)
    if table is None:
        table = price(model, inputs.options, max_devices=max(device_counts), progress=progress)
    rows = []
    for n in device_counts:
        row_inputs = inputs_for(inputs, n)
        advice = advise(model, row_inputs, traffic=traffic, table=table)
        row = SweepRow(n, advice.plan, row_inputs.micro_batches)
        rows.append(row)
        if on_row:
            on_row(row)
    return SweepResult(rows)



def inputs_for(inputs: PlanInputs, devices: int) -> PlanInputs:
    """The same inputs for another device count: a defaulted micro-batch count follows it, one
    target (or the list) repeats, pins to positions beyond it are dropped."""
    targets = inputs.targets
    if targets:
        targets = tuple(targets[i % len(targets)] for i in range(devices))
    return replace(inputs, request=inputs.request.with_devices(devices), options=with_devices(inputs.options, devices),
                   targets=targets)


# -- pipeline schedules with chunks (solver/chunks.py) ----------------------------------------------

def device_capacities(model: StageCostModel, options: SolveOptions) -> np.ndarray:
    """Bytes each device may use: its target's memory less the headroom and the reserve."""
    target = model.profile.target
    n = options.devices
    raw = np.array(options.capacities if options.capacities else [target.bytes_per_tile] * n, np.int64)
    capacity = np.floor(raw * (1.0 - options.headroom)).astype(np.int64) - int(options.reserve)
    if (capacity <= 0).any():
        from ..errors import StagesplitError
        raise StagesplitError(f"--reserve {options.reserve:,} bytes leaves no memory on a device ({int(raw.min()):,} bytes)")
    return capacity


def schedule_problem(model: StageCostModel, inputs: PlanInputs, table=None):
    """The chunk-split problem of ``inputs``' schedule on ``model`` (a profile with phases)."""
    from ..errors import StagesplitError
    from ..model.phases import phase_table
    from ..solver.chunks import ChunkProblem
    from ..solver.schedule import ScheduleKind, build_schedule, traits
    o = inputs.options
    kind = ScheduleKind(o.schedule.value)
    v = inputs.request.chunks_per_rank or traits(kind).fixed_chunks_per_rank or \
        (1 if kind in (ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B) else 2)
    schedule = build_schedule(kind, o.devices, o.micro_batches, v)
    from ..solver.request import RecomputeMode
    fixed = inputs.request.recompute
    if fixed in (RecomputeMode.FULL, RecomputeMode.SELECTIVE) and traits(kind).splits_backward:
        raise StagesplitError(f"--recompute {fixed.value} under {kind.value}: torch refuses selective checkpointing "
                              "under a split backward and re-runs a fully checkpointed block again for its weight "
                              "gradients; use --recompute auto (none under a split backward) or a schedule that does "
                              "not split the backward (gpipe, 1f1b, interleaved-1f1b, looped-bfs)")
    if schedule.chunks > model.num_layers:
        raise StagesplitError(f"{kind.value} with {v} chunks on each of {o.devices} devices needs {schedule.chunks} "
                              f"chunks, but the model has {model.num_layers} layers: use fewer devices or chunks")
    table = table if table is not None else phase_table(model)
    seconds_per_byte = 0.0
    if o.communication:
        if table.time_unit != "seconds":
            raise StagesplitError(f"communication cost needs compute in time units: the profile's compute is in "
                                  f"{table.time_unit} and the target cannot convert it")
        seconds_per_byte = 1.0 / float(o.link_bytes_per_s)
    return ChunkProblem(table=table, schedule=schedule, capacities=device_capacities(model, o),
                        seconds_per_byte=seconds_per_byte, objective=o.objective, min_layers=o.min_layers,
                        max_layers=o.max_layers, pinned_splits=o.pinned_splits, time_limit=o.time_limit,
                        workers=o.workers, recompute=inputs.request.recompute or RecomputeMode.NONE)


def _solve_chunks(problem, log: Callable[[str], None] | None, default_recompute: bool):
    """CP-SAT on ``problem``; where recompute was left to stagesplit and nothing fits without it,
    again with recompute chosen per layer (and a note that says so)."""
    from ..solver.chunks import solve_cpsat
    from ..solver.request import RecomputeMode
    solved = solve_cpsat(problem)
    fits = solved.result is not None and solved.result.feasible
    if fits or not default_recompute or problem.table.recompute is None:
        return problem, solved
    if log:
        log("CP-SAT: nothing fits without recompute; choosing recompute per layer")
    auto = replace(problem, recompute=RecomputeMode.AUTO)
    again = solve_cpsat(auto)
    if again.result is not None and again.result.feasible:
        again.notes.append("no split fits without activation recompute: the layers marked in the recompute "
                           "column are recomputed (--recompute none to refuse, auto to let it choose always)")
        return auto, again
    return problem, solved


def advise_schedule(model: StageCostModel, inputs: PlanInputs, *, table=None, traffic: Traffic | None = None,
                    log: Callable[[str], None] | None = None) -> Advice:
    """Solve for the chunks of ``inputs``' pipeline schedule: every device fits under the
    schedule's own actions and the simulated step is fastest (or the fullest device emptiest,
    with ``objective="memory"``); the devices objective tries 1, 2, ... devices."""
    from ..solver.request import Objective
    traffic = traffic or layer_traffic(model)
    o = inputs.options
    if o.objective is Objective.DEVICES:
        last = None
        for n in range(1, o.devices + 1):
            trial = inputs_for(inputs, n)
            trial = replace(trial, options=replace(trial.options, objective=Objective.COMPUTE),
                            request=replace(trial.request, objective=Objective.COMPUTE))
            try:
                problem = schedule_problem(model, trial, table)
            except Exception:            # too few layers or micro-batches for n devices: not a candidate
                continue
            if log:
                log(f"CP-SAT: {problem.schedule.kind.value} on {n} device(s)")
            problem, solved = _solve_chunks(problem, log, inputs.request.recompute is None)
            last = (problem, solved, trial)
            if solved.result is not None and solved.result.feasible:
                break
        if last is None:
            from ..errors import StagesplitError
            raise StagesplitError(f"no device count up to {o.devices} can run the schedule")
        problem, solved, trial = last
        plan = make_schedule_plan(model, problem, solved, inputs_for(inputs, problem.schedule.devices),
                                  traffic=traffic, message=_schedule_message(problem, solved))
        return Advice(plan=plan, result=None, problem=None, warnings=_tied_warnings(plan))
    problem = schedule_problem(model, inputs, table)
    if log:
        log(f"CP-SAT: {problem.schedule.kind.value}, {problem.schedule.chunks} chunks on {o.devices} devices")
    problem, solved = _solve_chunks(problem, log, inputs.request.recompute is None)
    plan = make_schedule_plan(model, problem, solved, inputs, traffic=traffic, message=_schedule_message(problem, solved))
    return Advice(plan=plan, result=None, problem=None, warnings=_tied_warnings(plan))


def _schedule_message(problem, solved) -> str:
    r = solved.result
    if r is None or not r.feasible:
        if solved.status == "infeasible":
            fullest = "" if r is None else f" (the closest split still needs {max(r.peaks / problem.capacities):.0%} " \
                f"of a device)"
            return (f"no split into {problem.schedule.chunks} chunks fits {problem.schedule.devices} devices under "
                    f"{problem.schedule.kind.value} with {problem.schedule.micro_batches} micro-batches{fullest}: use "
                    f"more devices, fewer micro-batches in flight (another schedule), or recompute")
        return f"CP-SAT found no split within the time limit ({problem.time_limit:g} s); allow more with --time-limit"
    if not solved.optimal:
        gap = (r.step_time - solved.bound) / r.step_time if r.step_time else 0.0
        return (f"stopped by the time limit ({problem.time_limit:g} s): best split found, not proven optimal "
                f"(gap {100 * gap:.1f}%)")
    return ""


def _tied_warnings(plan: Plan) -> list[str]:
    return [f"parameter '{show(tied.name)}' is used by layers on stages {', '.join(map(str, stages))} (tied weights): "
            f"pipeline frameworks keep one copy per stage, so sum the copies' gradients across those stages before "
            f"each optimizer step (the torch-pipelining export does), or they untie; torchtitan refuses such models"
            for tied, stages in plan.tied_across_stages()]
