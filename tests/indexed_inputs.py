"""Plan inputs for options written directly in layer indices, as tests and benchmarks build them
(toy capacities per device position, pins by index). The package's own path only resolves
forwards, from a user's request to options (plan/engine.py's ``resolve``); a test that starts from
options needs the request a user would have written for them, because a plan records its request
(``--from-plan`` reads it back). This module writes that request: it lives beside the tests, not
in the package, so the package never converts backwards."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from stagesplit.model.costmodel import StageCostModel
from stagesplit.plan.records import PlanInputs
from stagesplit.solver.problem import SolveOptions
from stagesplit.solver.request import SharedPolicy, SolveRequest


def indexed_inputs(model: StageCostModel, options: SolveOptions | PlanInputs, **request: Any) -> PlanInputs:
    """``options`` with the request it resolves from (pins named by layer); ``request`` sets the
    request's other fields (``compare=True``). Plan inputs given are passed through (with
    ``request`` applied)."""
    if isinstance(options, PlanInputs):
        return replace(options, request=replace(options.request, **request)) if request else options
    names = model.layers.names
    req = SolveRequest(
        devices=options.devices, objective=options.objective, exact=options.exact, schedule=options.schedule,
        micro_batches=None if options.micro_batches_auto else options.micro_batches, headroom=options.headroom,
        reserve=options.reserve, min_layers=options.min_layers, max_layers=options.max_layers,
        pin_splits=tuple(names[j] for j in options.pinned_splits),
        pin_layers=tuple((names[layer], position) for layer, position in options.pinned_layers),
        communication=options.communication, link_bandwidth=options.link_bytes_per_s,
        time_limit=max(options.time_limit, 1e-6),      # the request wants > 0; options may say 0 (DP only)
        workers=options.workers, shared=SharedPolicy(model.shared), layering=model.layers.options, **request)
    return PlanInputs(request=req, options=options, targets=(model.profile.target,) * options.devices)
