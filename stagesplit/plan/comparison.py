"""What ``compare`` sets beside the optimal plan, priced under the same cost model: the GPU
frameworks' default splits (plan/baselines.py), or PopLiner's greedy and an even split on an IPU."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..model.costmodel import StageCostModel
from ..model.traffic import Traffic
from ..solver.dp import Solution, UnlayeredFirst
from ..solver.problem import Split, SplitProblem, evaluate_split
from .baselines import framework_baselines, layer_roles
from .build import make_plan
from .records import Plan, PlanInputs

__all__ = ["baseline_plan", "framework_plans", "layer_parameter_bytes", "popliner_tables"]


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


def popliner_tables(model: StageCostModel, in_flight_counts: Iterable[int],
                    capacity: int | None = None) -> UnlayeredFirst:
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


def baseline_plan(model: StageCostModel, problem: SplitProblem, solution: Solution, traffic: Traffic,
                   inputs: PlanInputs) -> Plan:
    split = solution.split
    message = "" if solution.feasible else (solution.evaluation.reason if solution.evaluation else "no split found")
    return make_plan(model, problem, split, inputs, method=solution.method, traffic=traffic, message=message)
