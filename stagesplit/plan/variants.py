"""Plans from profile variants: several profiles of one model compiled at different memory
proportions (an IPU's ``availableMemoryProportion``), the split and each stage's variant chosen
together (solver/problem.py ``build_variant_problem``).

Objectives with variants (every one exact, see solver/problem.py):

* ``compute``: the slowest stage's time first, each stage in its fastest variant that fits;
  then the fullest stage's memory within that time (a stage may take a slower, smaller variant
  where that time allows).
* ``memory``: the fullest stage's memory first, each stage in its least-memory variant that
  fits (usually the lowest proportion); then the slowest stage's time within that memory.
* ``devices``: the fewest devices on which every stage fits in some variant; then time.

Each stage then takes its fastest variant that keeps both optimal values (the plan records its
proportion and name). With ``compare``, each variant alone is solved as the baseline: one
proportion on every IPU, as a plan without variants must be compiled.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from ..common.deadline import Deadline
from ..model.costmodel import RangeTable, StageCostModel
from ..model.rangetable import OVER
from ..model.traffic import layer_traffic
from ..solver.dp import greedy
from ..solver.problem import SplitProblem, build_variant_problem
from .advise import Advice, advise, tied_warnings
from .build import make_plan, plan_profile
from .explain import explain_infeasible, result_message
from .records import PlanInputs, PlanVariant
from .search import price, search

__all__ = ["advise_variants", "fit_table"]


def fit_table(problem: SplitProblem) -> RangeTable:
    """Per range and in-flight count the fewest bytes of any variant: a range fits a device in
    some variant exactly when it fits in this table (explaining infeasibility reads it)."""
    tables = [t for t, _, _ in problem.variant_tables()]
    ks = tables[0].in_flight
    L, W = problem.num_layers, max(t.width for t in tables)

    def padded(band: np.ndarray) -> np.ndarray:
        return np.concatenate([band, np.full((L, W - band.shape[1]), OVER, np.int64)], axis=1)
    bands = np.stack([np.min([padded(t.band(k)) for t in tables], axis=0) for k in ks])
    return RangeTable(tuple(ks), tables[0].capacity, bands)


def advise_variants(models: Sequence[StageCostModel], names: Sequence[str], proportions: Sequence[float | None],
                    inputs: PlanInputs, *, tables: Sequence[RangeTable] | None = None,
                    log: Callable[[str], None] | None = None, deadline: Deadline | None = None) -> Advice:
    """Solve the request of ``inputs`` (by ``deadline``: default, its time limit from the
    search's start) on the profile variants ``models`` (one model's layers;
    ``names`` and ``proportions`` in the same order) and describe the result as a Plan whose
    stages record their variant (see the module docstring). With the request's ``compare``,
    ``baselines`` holds each variant solved alone."""
    model = models[0]
    options = inputs.options
    traffic = layer_traffic(model)
    tables = list(tables) if tables is not None else [price(m, options) for m in models]
    problem = build_variant_problem(models, names, proportions, options, traffic=traffic, tables=tables)
    warnings = []
    if all(m.layer_compute.sum() == 0 for m in models) and options.objective == "compute":
        warnings.append("the profiles have no compute estimates, so compute cannot be balanced: the split "
                        "minimises the worst stage's memory instead")
    result = search(problem, hint=greedy(problem).split, log=log, deadline=deadline)
    if result.split is None and result.status == "infeasible":
        fit = fit_table(problem)
        message = explain_infeasible(model, replace(problem, table=fit, variants=()), fit) + \
            f" (with the stages in any of the {len(models)} profile variants)"
    else:
        message = result_message(model, problem, tables[0], result)
    records = []
    for name, proportion, m in zip(names, proportions, models):
        recorded = plan_profile(m)
        records.append(PlanVariant(name=str(name), proportion=proportion, path=recorded.path,
                                   sha256=recorded.sha256))
    plan = make_plan(model, problem, result.split, inputs, method="cp-sat", traffic=traffic, result=result,
                     message=message, variant_models=models, variants=tuple(records))
    warnings += tied_warnings(plan)
    advice = Advice(plan=plan, result=result, problem=problem, warnings=warnings)
    if inputs.request.compare:
        alone = replace(inputs, request=replace(inputs.request, compare=False))
        for name, proportion, m, table in zip(names, proportions, models, tables):
            baseline = advise(m, alone, traffic=traffic, table=table).plan
            advice.baselines.append(replace(baseline, method=f"{name} alone" + (
                f" (proportion {proportion:g} on every IPU)" if proportion is not None else "")))
    return advice
