"""The CP-SAT parameters the schedule's search runs under (solver/chunk_cpsat.py ``_solver``): the time left
and the workers asked for; without recompute variables no LP relaxation or probing (they cost more than they
prune on the chunk tables); with them, CP-SAT's presolve on up to ``_PRESOLVED_LAYERS`` layers and off above
(its presolve of the recompute prefixes' range lookups overran the time limit by minutes and took gigabytes
on the 126-layer Llama-3.1-405B shape: docs/benchmarks.md, bench_layouts.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from stagesplit.solver import chunk_cpsat


@pytest.mark.parametrize("layers, recompute, presolve, lp", [
    (8, False, True, False), (200, False, True, False),
    (chunk_cpsat._PRESOLVED_LAYERS, True, True, True), (chunk_cpsat._PRESOLVED_LAYERS + 1, True, False, True),
    (126, True, False, True),
])
def test_the_solver_parameters(layers, recompute, presolve, lp):
    assert chunk_cpsat._PRESOLVED_LAYERS == 64
    solver = chunk_cpsat._solver(SimpleNamespace(workers=3, num_layers=layers), 12.5, recompute)
    p = solver.parameters
    assert (p.max_time_in_seconds, p.num_search_workers) == (12.5, 3)
    assert p.cp_model_presolve is presolve
    if lp:                       # the defaults: the LP bound is what proves with recompute variables
        assert p.linearization_level == 1 and p.cp_model_probing_level == 2
    else:
        assert p.linearization_level == 0 and p.cp_model_probing_level == 0
