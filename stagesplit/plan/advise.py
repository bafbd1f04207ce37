"""From a priced model to a plan on the stage-level model: one search, its message and notes, and
the baselines ``compare`` asks for. Its inputs come resolved, forwards, from a request (engine.py's
``resolve``). The search, the explanations, the comparison, the device sweep and the scheduled path
are modules of their own (search.py, explain.py, comparison.py, sweep.py, scheduled.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from ..common.deadline import Deadline
from ..common.text import show
from ..model.costmodel import RangeTable, StageCostModel
from ..model.traffic import Traffic, layer_traffic
from ..solver.cpsat import SolverResult
from ..solver.dp import greedy, uniform
from ..solver.problem import SplitProblem, build_problem, evaluate_split, with_devices
from .build import make_plan
from .explain import exact_devices_note, result_message
from .records import Plan, PlanInputs
from .search import fewest_stages_that_fit, price, search

if TYPE_CHECKING:
    from ..solver.runtime_reserve import RuntimeReserve

__all__ = ["Advice", "advise", "inputs_for", "tied_warnings"]


@dataclass
class Advice:
    """A solve's plan with what explains it: the search result, the problem and the baselines."""

    plan: Plan
    result: SolverResult | None
    problem: SplitProblem | None           #: None: a schedule search, or a count refused
    baselines: list[Plan] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    #: a schedule search given a step to beat (``schedule='auto'``) proved that no split beats it
    slower: bool = False


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


def advise(model: StageCostModel, inputs: PlanInputs, *, traffic: Traffic | None = None,
           table: RangeTable | None = None, progress: Callable[[int, int], None] | None = None,
           log: Callable[[str], None] | None = None, deadline: Deadline | None = None) -> Advice:
    """Solve for ``options.devices`` devices by ``deadline`` (default: the time limit from the
    search's start) and describe the result as a Plan. With
    the request's ``compare``, add PopLiner's greedy and a uniform split; its ``unlayered_first``
    makes the greedy put the unlayered operations on the first stage, as PopLiner does (see
    ``popliner_tables``)."""
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
        notes.append(exact_devices_note(options, fewest_stages_that_fit(table, problem.capacity, options,
                                                                 limit=options.devices)))
    plan = make_plan(model, problem, result.split, inputs, method="cp-sat", traffic=traffic, result=result,
                     message=message, notes=notes)
    warnings += tied_warnings(plan)
    advice = Advice(plan=plan, result=result, problem=problem, warnings=warnings)
    if compare:                                              # only then: the baselines' code is loaded
        from .comparison import baseline_plan, framework_plans, popliner_tables
    if compare and model.profile.target.kind == "gpu":      # a GPU: the frameworks' defaults
        advice.baselines.extend(framework_plans(model, problem, traffic, inputs))
    elif compare:
        if unlayered_first:
            base = greedy(problem, unlayered_first=popliner_tables(model, problem.in_flight_values,
                                                                   int(problem.capacity.max())))
        for solution in (base, uniform(problem)):
            advice.baselines.append(baseline_plan(model, problem, solution, traffic, inputs))
    return advice



def tied_warnings(plan: Plan) -> list[str]:
    return [f"parameter '{show(tied.name)}' is used by layers on stages {', '.join(map(str, stages))} (tied weights): "
            f"pipeline frameworks keep one copy per stage, so sum the copies' gradients across those stages before "
            f"each optimizer step (the torch-pipelining export does), or they untie; torchtitan refuses such models"
            for tied, stages in plan.tied_across_stages()]
