"""The CP-SAT parameters the schedule's search runs under (solver/chunk_cpsat.py ``_solver``): the time left
and the workers asked for; without recompute variables no LP relaxation or probing (they cost more than they
prune on the chunk tables); with them the LP relaxation, and CP-SAT's presolve on every model, deep ones too
(off above 64 layers while the range lookups had (L + 1)^2 entries, where it overran the time limit by
minutes; over the ranges a chunk may hold it takes the 126-layer Llama-3.1-405B shape's deep looped models
from 1.8 GB to 0.75 GB: docs/benchmarks.md, bench_layouts.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from stagesplit.solver import chunk_cpsat


@pytest.mark.parametrize("layers, recompute, presolve, lp", [
    (8, False, True, False), (200, False, True, False), (64, True, True, True), (65, True, True, True),
    (126, True, True, True),
])
def test_the_solver_parameters(layers, recompute, presolve, lp):
    solver = chunk_cpsat._solver(SimpleNamespace(workers=3, num_layers=layers), 12.5, recompute)
    p = solver.parameters
    assert (p.max_time_in_seconds, p.num_search_workers) == (12.5, 3)
    assert p.cp_model_presolve is presolve
    if lp:                       # the defaults: the LP bound is what proves with recompute variables
        assert p.linearization_level == 1 and p.cp_model_probing_level == 2
    else:
        assert p.linearization_level == 0 and p.cp_model_probing_level == 0
