"""From a priced model to a plan: search (the exact DP within the time limit, CP-SAT for what it
does not prove), explain infeasibility, compare with what the user would do otherwise (the GPU
frameworks' default splits, or PopLiner's greedy and an even split on an IPU), sweep the number of
devices, and solve the chunks of pipeline schedules."""

from __future__ import annotations

import time as _time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from ..common.deadline import Deadline, TimeLimitReached, check_deadline, without_deadline
from ..common.text import show
from ..errors import OptionError, StagesplitError
from ..model.costmodel import RangeTable, StageCostModel
from ..model.traffic import Traffic, layer_traffic
from ..solver.cpsat import ORDER, PHASE_NAMES, PhaseResult, SolverResult, model_seconds_estimate, solve_split_cpsat
from ..solver.dp import Solution, UnlayeredFirst, conservative_split, dp_cells, dp_mode, exact_optimum, greedy, uniform
from ..solver.problem import (
    SolveOptions,
    Split,
    SplitProblem,
    build_problem,
    evaluate_split,
    in_flight,
    in_flight_values,
    kept_back_from,
    stage_capacities,
    with_devices,
)
from ..solver.request import Objective, SharedPolicy, SolveRequest
from .baselines import framework_baselines, layer_roles
from .build import make_plan, make_schedule_plan, refused_plan
from .records import Plan, PlanInputs
from .text import step_text

if TYPE_CHECKING:
    import pandas as pd

    from ..model.phases import PhaseTable
    from ..solver.chunk_cpsat import ChunkSolve
    from ..solver.chunk_problem import ChunkProblem, ChunkResult
    from ..solver.runtime_reserve import RuntimeReserve

__all__ = ["Advice", "DP_CELLS_PER_SECOND", "DP_CELLS_PER_SECOND_ONE_COUNT", "SweepResult", "SweepRow", "advise",
           "advise_schedule", "device_capacities", "dp_seconds_estimate", "explain_infeasible",
           "fewest_stages_that_fit", "framework_plans", "inputs_for", "inputs_of", "layer_parameter_bytes", "price",
           "result_message",
           "schedule_problem", "search", "sweep", "sweep_options"]


@dataclass
class Advice:
    plan: Plan
    result: SolverResult | None
    problem: SplitProblem | None           #: None: a schedule search, or a count refused
    baselines: list[Plan] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    #: a schedule search given a step to beat (``schedule='auto'``) proved that no split beats it
    slower: bool = False


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


def explain_infeasible(model: StageCostModel, problem: SplitProblem, table: RangeTable) -> str:
    """Say plainly why nothing fits: a layer too big for any device, or how many devices would do."""
    names = model.layers.names
    cap = int(problem.capacity.max())
    single = table.single(1)
    too_big = np.flatnonzero(single > cap)
    n = problem.devices
    if len(too_big):
        l = int(too_big[np.argmax(single[too_big])])
        tile = table.tile_of(1, l, l)
        return (f"layer '{names[l]}' alone needs {int(single[l]):,} bytes on tile {tile}, more than a device holds "
                f"({cap:,} bytes per tile after headroom), so no number of devices fits; split that layer "
                f"(a finer `layer_regex`) or free memory on that tile")
    o = problem.options
    L = len(names)
    if o.exact and n > L:
        works = _fewest_with_own_micro_batches(model, o) if o.micro_batches_auto else \
            fewest_stages_that_fit(table, problem.capacity, o)
        return (f"{L} layers cannot fill exactly {n:,} devices: `exact` puts at least one layer on each; use `devices="
                f"{L}` or fewer, or drop `exact`" + _holds_text(o, works))
    enough = fewest_stages_that_fit(table, problem.capacity, o)
    rules = _given_rules(o)
    if enough is None and o.micro_batches_auto and o.schedule.value in ("gpipe", "1f1b"):
        # the micro-batches follow the devices: fewer devices would have fewer in flight
        held = "on every stage" if o.schedule.value == "gpipe" else "on the first stages"
        return (f"no split of the {L} layers fits on {n:,} device(s) with {o.micro_batches:,} micro-batches in flight "
                f"{held} under {o.schedule.value} (`micro_batches` not given: one per device), nor on fewer devices "
                f"with that many" + _holds_text(o, _fewest_with_own_micro_batches(model, o)))
    if enough is None:
        return f"no split of the {L} layers fits on {n} device(s), nor on any number of such devices"
    if enough > n:
        kinds = list(dict.fromkeys(kind for kind, _, _, _ in rules))
        caveat = f" (ignoring {_join(kinds, 'and')})" if kinds else ""
        return (f"no split of the {len(names)} layers fits on {n} device(s); the smallest number that fits is "
                f"{enough}{caveat}")
    if not rules:                                      # not expected: every rule that can bind is listed
        return f"no split fits on {n} device(s), although {enough} device(s) would hold the layers"
    # the layers fit on `enough` <= n devices, so a rule the request gives binds: find which
    binding = [name for _, _, name, relax in rules if _fits_without(model, problem, table, relax)]
    head = f"no split fits on {'exactly ' if o.exact else ''}{n} device(s)"
    if len(rules) == 1 and binding and o.exact:
        text = f"{head}; on at most {n}, {enough} would do"
        if o.schedule == "1f1b" and o.micro_batches > 1:
            text += (f" (with 1F1B, the first of P stages holds min({o.micro_batches}, P) micro-batches in flight, "
                     "so more stages need more memory on the first ones)")
        return text
    given = [phrase for _, phrase, _, _ in rules if phrase]
    head += f" with {_join(given, 'and')}" if given else ""
    if len(rules) == 1 and binding:
        return f"{head}; without it {enough} device(s) would do"
    blame = f"it would fit without {_join(binding, 'or')}" if binding else \
        "dropping any one of these rules alone is not enough"
    return f"{head}; {blame}, and without all of them {enough} device(s) would do"


#: seconds the exact DP may take to check one relaxed problem when explaining infeasibility
EXPLAIN_SECONDS = 2.0


def _fewest_with_own_micro_batches(model: StageCostModel, o: SolveOptions) -> tuple[int, int] | None:
    """Where the micro-batch count follows the devices (not given): the fewest ``devices=m``
    whose ``m`` micro-batches fit, as (m, the stages that hold the model then), pins and layer-count
    limits ignored; None where none up to the layer count does, or the ranges of each count could
    not be priced within ``EXPLAIN_SECONDS``."""
    stop = _time.monotonic() + EXPLAIN_SECONDS
    for m in range(1, min(o.devices, model.num_layers) + 1):
        if _time.monotonic() > stop:
            return None
        trial = with_devices(replace(o, exact=False), m)
        capacity, _ = stage_capacities(model.profile.target, trial)
        stages = fewest_stages_that_fit(price(model, trial, max_devices=m), capacity, trial, limit=m)
        if stages is not None:
            return m, stages
    return None


def _holds_text(o: SolveOptions, works: int | tuple[int, int] | None) -> str:
    """What would hold the model: ``works`` is the fewest stages (micro-batches as given), or
    (``devices=m``, stages) where the micro-batches follow the devices; "" where nothing is known."""
    if works is None:
        return ""
    caveat = " (ignoring the pins and layer-count limits)" if len(_given_rules(o)) > o.exact else ""
    if isinstance(works, tuple):
        m, stages = works
        return (f"; the fewest `devices` that hold the model is {m} (so {m * o.chunks_per_rank} micro-batches), "
                f"on {stages} device{'s' if stages != 1 else ''}{caveat}")
    micro = f" with {o.micro_batches:,} micro-batches" if o.schedule.value != "none" else ""
    return f"; {works} device{'s are' if works != 1 else ' is'} the fewest that hold the model{micro}{caveat}"


def _given_rules(o: SolveOptions) -> list[tuple[str, str, str, dict[str, Any]]]:
    """The rules of the request beyond memory that can leave no split: (kind, the rule as the
    request gives it ("" for the exact device count, which the message's head says), its name,
    the option values that drop it)."""
    def layers(n: int) -> str:
        return f"{n} layer{'s' if n != 1 else ''} per stage"
    rules: list[tuple[str, str, str, dict[str, Any]]] = []
    if o.exact:
        rules.append(("the exact device count", "", "the exact device count", {"exact": False}))
    if o.pinned_splits:
        rules.append(("the pinned splits", "the pinned splits", "the pinned splits", {"pinned_splits": ()}))
    if o.pinned_layers:
        rules.append(("the pinned layers", "the layers pinned to devices", "the layers pinned to devices",
                      {"pinned_layers": ()}))
    if o.min_layers > 1:
        rules.append(("the layer-count limits", f"at least {layers(o.min_layers)}",
                      f"the minimum of {layers(o.min_layers)}", {"min_layers": 1}))
    if o.max_layers is not None:
        rules.append(("the layer-count limits", f"at most {layers(o.max_layers)}",
                      f"the maximum of {layers(o.max_layers)}", {"max_layers": None}))
    return rules


def _fits_without(model: StageCostModel, problem: SplitProblem, table: RangeTable, relax: dict[str, Any]) -> bool:
    """Whether some split fits once the rule ``relax`` drops is dropped (False when the DP
    cannot say within ``EXPLAIN_SECONDS``)."""
    relaxed = replace(problem.options, objective=Objective.DEVICES, communication=False, **relax)
    answer = exact_optimum(build_problem(model, relaxed, table=table), deadline=_time.monotonic() + EXPLAIN_SECONDS)
    return answer.complete and answer.feasible


def _join(items: list[str], word: str) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + f" {word} {items[-1]}"


def inputs_of(model: StageCostModel, options: SolveOptions | PlanInputs, **request: Any) -> PlanInputs:
    """``options`` as a plan's inputs: resolved options given directly (tests, benchmarks and
    tools working in layer indices) get the request they resolve from, pins named by layer;
    ``request`` sets its other fields (``compare=True``)."""
    if isinstance(options, PlanInputs):
        return replace(options, request=replace(options.request, **request)) if request else options
    names = model.layers.names
    target = model.profile.target
    req = SolveRequest(
        devices=options.devices, objective=options.objective, exact=options.exact, schedule=options.schedule,
        micro_batches=None if options.micro_batches_auto else options.micro_batches, headroom=options.headroom,
        reserve=options.reserve, min_layers=options.min_layers, max_layers=options.max_layers,
        pin_splits=tuple(names[j] for j in options.pinned_splits),
        pin_layers=tuple((names[layer], position) for layer, position in options.pinned_layers),
        communication=options.communication, link_bandwidth=options.link_bytes_per_s,
        time_limit=max(options.time_limit, 1e-6),      # the request wants > 0; options may say 0 (DP only)
        workers=options.workers, shared=SharedPolicy(model.shared), layering=model.layers.options, **request)
    return PlanInputs(request=req, options=options, targets=(target,) * options.devices)


def advise(model: StageCostModel, inputs: PlanInputs | SolveOptions, *, traffic: Traffic | None = None,
           table: RangeTable | None = None, progress: Callable[[int, int], None] | None = None,
           log: Callable[[str], None] | None = None, deadline: Deadline | None = None) -> Advice:
    """Solve for ``options.devices`` devices by ``deadline`` (default: the time limit from the
    search's start) and describe the result as a Plan. With
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
    result = search(problem, hint=base.split, log=log, deadline=deadline)
    message = result_message(model, problem, table, result)
    notes = []
    if options.objective == "devices" and options.exact and result.split is not None \
            and evaluate_split(problem, result.split).feasible:
        notes.append(_exact_devices_note(options, fewest_stages_that_fit(table, problem.capacity, options,
                                                                 limit=options.devices)))
    plan = make_plan(model, problem, result.split, inputs, method="cp-sat", traffic=traffic, result=result,
                     message=message, notes=notes)
    warnings += _tied_warnings(plan)
    advice = Advice(plan=plan, result=result, problem=problem, warnings=warnings)
    if compare and model.profile.target.kind == "gpu":      # a GPU: the frameworks' defaults
        advice.baselines.extend(framework_plans(model, problem, traffic, inputs))
    elif compare:
        if unlayered_first:
            base = greedy(problem, unlayered_first=popliner_tables(model, problem.in_flight_values,
                                                                   int(problem.capacity.max())))
        for solution in (base, uniform(problem)):
            advice.baselines.append(_baseline_plan(model, problem, solution, traffic, inputs))
    return advice


def _exact_devices_note(o: SolveOptions, fewest: int | None) -> str:
    """``objective='devices'`` with ``exact``: the count is given, not searched; how many devices the
    fewest that hold the model are (``fewest_stages_that_fit``, proven by its prefix search)."""
    if fewest is None or fewest >= o.devices:
        return f"no fewer than the {o.devices} devices `exact` uses hold the model"
    caveat = " (ignoring the pins and layer-count limits)" if len(_given_rules(o)) > 1 else ""
    return (f"{fewest} device{'s are' if fewest != 1 else ' is'} the fewest that hold the model{caveat}; `exact` uses "
            f"all {o.devices} (without it, `objective='devices'` uses {fewest})")


def result_message(model: StageCostModel, problem: SplitProblem, table: RangeTable, result: SolverResult) -> str:
    """What the plan's message says of the search: why nothing fits, that nothing was found in
    the time limit, or that the split is not proven optimal ("" when it is)."""
    options = problem.options
    if result.split is None:
        if result.status == "infeasible":
            return explain_infeasible(model, problem, table)
        return (f"no split was found within the time limit ({options.time_limit:g} s); "
                "allow more time with `time_limit`")
    if result.status == "feasible":
        gaps = [p.gap for p in result.phases if p.status != "OPTIMAL"]
        known = [g for g in gaps if g is not None]
        gap = "gap unknown" if len(known) < len(gaps) else f"gap {100 * max(known, default=0):.1f}%"
        return f"stopped by the time limit ({options.time_limit:g} s): best split found, not proven optimal ({gap})"
    return ""


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
        ev = evaluate_split(problem, split)
        out.append(make_plan(model, problem, split, inputs, method=b.key, traffic=traffic,
                             message="" if ev.feasible else ev.reason))
    return out


def popliner_tables(model: StageCostModel, in_flight_counts: Iterable[int], capacity: int | None = None) -> UnlayeredFirst:
    """Stage memory as PopLiner counts it: the operations with no layer (and the items only
    they use) on the first stage, nowhere else. The first stage is priced with
    ``shared="every"``, the others with ``shared="none"`` (the ranges that can fit ``capacity``
    bytes per tile), whatever the model's own policy."""
    ks = tuple(in_flight_counts)
    every = model if model.shared == "every" else StageCostModel(model.profile, model.layers, shared="every")
    none = model if model.shared == "none" else StageCostModel(model.profile, model.layers, shared="none")
    rest = none.price_ranges(ks, capacity=capacity)
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

    @overload
    def __getitem__(self, index: int) -> SweepRow: ...
    @overload
    def __getitem__(self, index: slice) -> SweepResult: ...
    def __getitem__(self, index: int | slice) -> SweepRow | SweepResult:
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

    def frame(self) -> pd.DataFrame:
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

        # f(row, bottleneck stage, fullest stage), both there where the row has a split; None: no split
        def each(f: Callable[[SweepRow, Any, Any], Any]) -> list[Any]:
            return [f(r, r.plan.bottleneck, r.plan.worst_memory) if r.plan.stages else None for r in rows]

        cols: dict[str, tuple[Iterable[Any], Any]] = {
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
          on_row: Callable[[SweepRow], None] | None = None, phases: PhaseTable | None = None) -> SweepResult:
    """Solve for each device count (pricing every range once, unless ``table`` is given); the
    rows, in the order of ``device_counts``, as a ``SweepResult`` (a sequence of rows). With
    ``phases`` (a ``PhaseTable``) each count is solved under the schedule's own actions
    (``advise_schedule``)."""
    inputs = inputs_of(model, inputs)
    traffic = layer_traffic(model)
    if table is None and phases is None:
        table = price(model, sweep_options(inputs, device_counts), max_devices=max(device_counts), progress=progress)
    rows = []
    for n in device_counts:
        row_inputs = inputs_for(inputs, n)
        if phases is not None:
            try:
                advice = advise_schedule(model, row_inputs, table=phases, traffic=traffic)
            except TimeLimitReached as exc:                     # not known, not refused
                advice = Advice(plan=refused_plan(model, row_inputs, str(exc), status="unknown"), result=None,
                                problem=None)
            except (StagesplitError, OptionError) as exc:       # e.g. more chunks than layers
                advice = Advice(plan=refused_plan(model, row_inputs, str(exc)), result=None, problem=None)
        else:
            advice = advise(model, row_inputs, traffic=traffic, table=table)
        row = SweepRow(n, advice.plan, row_inputs.micro_batches)
        rows.append(row)
        if on_row:
            on_row(row)
    return SweepResult(rows)



def sweep_options(inputs: PlanInputs, device_counts: Sequence[int]) -> SolveOptions:
    """``inputs``' options for pricing the ranges of a sweep over ``device_counts``: what a GPU keeps
    back follows the device count (the pipeline's communicators), so the ranges are priced for the
    least any count keeps back (the largest capacity a row can have)."""
    o = inputs.options
    if inputs.runtime_reserve is None or not o.kept_back:
        return o
    least = min(min(inputs_for(inputs, n).options.kept_back) for n in device_counts)
    return replace(o, kept_back=(least,) * o.devices)


def inputs_for(inputs: PlanInputs, devices: int) -> PlanInputs:
    """The same inputs for another device count: a defaulted micro-batch count follows it, one
    target (or the list) repeats, pins to positions beyond it are dropped."""
    targets = inputs.targets
    if targets:
        targets = tuple(targets[i % len(targets)] for i in range(devices))
    kept = inputs.runtime_reserve
    options = with_devices(inputs.options, devices)
    if kept is not None:           # the pipeline's communicators follow the device count
        kept = _reserve_for(kept, devices, inputs)
        options = replace(options, kept_back=kept.per_device(devices))
    return replace(inputs, request=inputs.request.with_devices(devices), options=options, targets=targets,
                   runtime_reserve=kept)


def _reserve_for(kept: RuntimeReserve, devices: int, inputs: PlanInputs) -> RuntimeReserve:
    """``kept`` for another device count: the same figures, the communicators of that many devices."""
    from ..solver.runtime_reserve import communicators
    channels = kept.nccl_channels
    if not channels:
        return replace(kept, retry_bytes=())
    tp = max((c.ranks for c in kept.communicators if c.name == "tensor parallel"), default=1)
    comms = communicators(channels, devices=devices, tensor_parallel=tp, data_parallel=inputs.request.dp,
                          schedule=inputs.request.schedule.value)
    return replace(kept, communicators=comms, retry_bytes=())


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
    if schedule.chunks > model.num_layers:
        raise StagesplitError(f"{kind.value} with {v} chunks on each of {o.devices} devices needs {schedule.chunks} "
                              f"chunks, but the model has {model.num_layers} layers: use fewer devices or chunks")
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


def _solve_chunks(problem: ChunkProblem, log: Callable[[str], None] | None, default_recompute: bool,
                  deadline: Deadline | None = None) -> tuple[ChunkProblem, ChunkSolve]:
    """CP-SAT on ``problem`` by ``deadline`` (default: the problem's time limit from now); where
    recompute was left to stagesplit and nothing fits without it, again with recompute chosen per
    layer (and a note that says so), with the time the first search left (at least a second:
    CP-SAT says little in less)."""
    from ..solver.chunk_cpsat import solve_chunks_cpsat
    from ..solver.request import RecomputeMode
    deadline = deadline if deadline is not None else Deadline.after(problem.time_limit)
    solved = solve_chunks_cpsat(problem, deadline=deadline)
    fits = solved.result is not None and solved.result.feasible
    if fits or not default_recompute or problem.table.recompute is None:
        return problem, solved
    if problem.cutoff is not None:
        # a step to beat: recompute only adds time and memory only rules splits out, so where no
        # split beats it without either, none does with recompute (a much smaller model to prove)
        relaxed = replace(problem, capacities=np.full_like(problem.capacities, _NO_LIMIT))
        bound = solve_chunks_cpsat(relaxed, deadline=deadline.at_least(1.0))
        if bound.status == "slower":
            return problem, replace(bound, result=solved.result, seconds=solved.seconds + bound.seconds)
    if log:
        log("CP-SAT: nothing fits without recompute; choosing recompute per layer")
    # the deadline is the whole solve's: the second search gets what the first left
    auto = replace(problem, recompute=RecomputeMode.AUTO)
    again = solve_chunks_cpsat(auto, deadline=deadline.at_least(1.0))
    if again.result is not None and again.result.feasible:
        again.notes.append("no split fits without activation recompute: the layers marked in the recompute "
                           "column are recomputed (`recompute='none'` to refuse, auto to let it choose always)")
        return auto, again
    if again.status != "infeasible":        # not proven without recompute's help either: unknown
        return auto, again
    return problem, solved


#: a capacity no split reaches (the relaxation without memory limits)
_NO_LIMIT = 2**60


def advise_schedule(model: StageCostModel, inputs: PlanInputs, *, table: PhaseTable | None = None, traffic: Traffic | None = None,
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
            problem, solved = _solve_chunks(problem, log, inputs.request.recompute is None, deadline)
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
        return Advice(plan=plan, result=None, problem=None, warnings=_tied_warnings(plan))
    with without_deadline():
        plan = make_schedule_plan(model, problem, solved, inputs, traffic=traffic,
                                  message=_schedule_message(problem, solved, o.time_limit))
    return Advice(plan=plan, result=None, problem=None, warnings=_tied_warnings(plan), slower=solved.status == "slower")


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
    quick_fits: dict[int, tuple[ChunkProblem, ChunkResult, float]] = {}       # counts the quick search found a fit on: (problem, split, seconds)

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
            problem, solved = _solve_chunks(problem, log, inputs.request.recompute is None, part)
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
    return _join(parts, "and")


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
    return f"{text}: try {_join(options, 'or')}"


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


def _tied_warnings(plan: Plan) -> list[str]:
    return [f"parameter '{show(tied.name)}' is used by layers on stages {', '.join(map(str, stages))} (tied weights): "
            f"pipeline frameworks keep one copy per stage, so sum the copies' gradients across those stages before "
            f"each optimizer step (the torch-pipelining export does), or they untie; torchtitan refuses such models"
            for tied, stages in plan.tied_across_stages()]
