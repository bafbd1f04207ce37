"""The search within the time limit (plan/search.py ``search``): the exact DP's work estimate and
its deadline, CP-SAT only for what the DP did not prove, and what the plan says proved each
phase. Time is a fake clock that advances with the work done, so the tests bound work, not wall
seconds."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from helpers import layer_model, options
from indexed_inputs import indexed_inputs
from stagesplit.io.layerform import LayerSpec, build_layer_profile
from stagesplit.io.targets import load_target
from stagesplit.model.analysis import Analysis
from stagesplit.plan import search as search_module
from stagesplit.plan.advise import advise
from stagesplit.plan.search import DP_CELLS_PER_SECOND, DP_CELLS_PER_SECOND_ONE_COUNT, dp_seconds_estimate, search
from stagesplit.solver import cpsat
from stagesplit.solver.dp import dp_cells, dp_mode, exact_optimum
from stagesplit.solver.problem import SolveOptions, build_problem


class TickClock:
    """A clock that advances one second each time it is read: deadlines count clock reads (a DP
    pass reads it once per position or stage count)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_dp_cells_by_mode():
    # 6 layers of 1000 bytes, capacity 2000: stages of at most 2 layers (W = 2)
    model = layer_model([1] * 6, [1] * 6)
    same = build_problem(model, options(3, 2))
    assert dp_mode(same) == "count" and same.width == 2
    assert dp_cells(same) == 2 * 3 * 6 * 2                      # two passes of N x L x W
    assert dp_seconds_estimate(same) == dp_cells(same) / DP_CELLS_PER_SECOND_ONE_COUNT
    mixed = build_problem(model, options(3, [2, 2, 3]))
    assert dp_mode(mixed) == "position" and mixed.width == 3
    assert dp_cells(mixed) == 2 * 3 * 6 * 3
    # 1F1B with 3 micro-batches: stage counts 1..3 hold 1..3 in flight; with activations of 1000
    # bytes per layer, 2 layers fit 3000 with one in flight, 1 with two or three (2000 + 1000 x k)
    stash = layer_model([1] * 6, [1] * 6, training=True, activations=[1] * 6)
    counted = build_problem(stash, options(3, [4, 4, 5], schedule="1f1b", micro_batches=3))
    assert dp_mode(counted) == "position-count"
    widths = [counted.table.width_for(k, 5000) for k in (1, 2, 3)]
    # positions with c stages from them: 3 with c = 1, 2 with c = 2, 1 with c = 3
    assert dp_cells(counted) == 2 * 6 * (3 * widths[0] + 2 * widths[1] + 1 * widths[2])
    assert widths[0] > widths[2] >= 1
    assert dp_seconds_estimate(counted) == dp_cells(counted) / DP_CELLS_PER_SECOND


def test_the_dp_stops_at_its_deadline_keeping_what_it_proved():
    model = layer_model([1] * 8, [1, 2, 3, 4, 5, 6, 7, 8])
    problem = build_problem(model, options(4, 100))
    full = exact_optimum(problem)
    assert full.complete and full.proven == ("time", "memory")
    # the first pass reads the clock once per stage count (4), the second is cut short
    clock = TickClock()
    part = exact_optimum(problem, deadline=7.5, clock=clock)
    assert part.stopped == "time" and part.proven == ("time",)
    assert part.split == full.split or part.evaluation.time == full.evaluation.time
    clock = TickClock()
    nothing = exact_optimum(problem, deadline=1.5, clock=clock)
    assert nothing.stopped == "time" and nothing.proven == () and nothing.split is None


def test_a_complete_dp_needs_no_cp_sat(monkeypatch):
    model = layer_model([1] * 8, [1, 2, 3, 4, 5, 6, 7, 8])
    problem = build_problem(model, options(4, 100))
    monkeypatch.setattr(cpsat, "_Feasibility", None)           # building a CP-SAT model would fail
    result = search(problem)
    assert result.status == "optimal" and [p.proof for p in result.phases] == ["dp", "dp"]
    assert result.cpsat_seconds is None and result.dp_seconds is not None


def test_a_dp_stopped_at_the_limit_keeps_what_it_proved(monkeypatch):
    """The DP's estimate fit but it ran out (the clock reads count): it proved the bottleneck
    time; no time is left for CP-SAT, so the memory phase is given as found, not proven."""
    model = layer_model([1] * 8, [1, 2, 3, 4, 5, 6, 7, 8])
    problem = build_problem(model, replace(options(4, 100), time_limit=9.0))
    monkeypatch.setattr(search_module, "dp_seconds_estimate", lambda p: 0.0)
    monkeypatch.setattr(cpsat, "_Feasibility", None)           # no CP-SAT model is built
    result = search(problem, clock=TickClock())
    assert [(p.status, p.proof) for p in result.phases] == [("OPTIMAL", "dp"), ("FEASIBLE", "")]
    assert result.status == "feasible" and result.evaluation.time == exact_optimum(problem).evaluation.time
    assert result.notes[0].startswith("the exact DP stopped at the time limit (9 s) after ")
    assert result.notes[0].endswith(", having proved the bottleneck stage time")
    assert result.notes[1].startswith("CP-SAT was not run: its model would take about ")


def test_cp_sat_proves_the_phases_the_dp_did_not():
    model = layer_model([1] * 8, [1, 2, 3, 4, 5, 6, 7, 8])
    problem = build_problem(model, options(4, 100))
    part = exact_optimum(problem, deadline=7.5, clock=TickClock())
    assert part.proven == ("time",)
    result = cpsat.solve_split_cpsat(problem, oracle=part, time_limit=20)
    assert result.status == "optimal" and [p.quantity for p in result.phases] == ["time", "memory"]
    assert result.phases[1].proof == "cp-sat" and result.phases[1].checks >= 1
    assert result.evaluation.key("compute") == exact_optimum(problem).evaluation.key("compute")


def test_the_status_line_says_which_solver_proved_which_phase(monkeypatch):
    model = layer_model([1] * 8, [1, 2, 3, 4, 5, 6, 7, 8])
    plan = advise(model, indexed_inputs(model, options(4, 100))).plan
    assert [p.proof for p in plan.phases] == ["dp", "dp"] and plan.run.cpsat_seconds is None
    assert plan.status_line().startswith("status: optimal, proven optimal by the exact DP in ")
    # with the DP out of the time limit CP-SAT proves both, and the line says so
    monkeypatch.setattr(search_module, "dp_seconds_estimate", lambda p: 1e9)
    plan = advise(model, indexed_inputs(model, options(4, 100))).plan
    assert [p.proof for p in plan.phases] == ["cp-sat", "cp-sat"] and plan.run.dp_seconds is None
    assert plan.status_line().startswith("status: optimal, proven optimal by CP-SAT in ")
    assert plan.notes[:2] == ["the exact DP was not run: it would take about 1e+09 s here, more than the time "
                              "limit (20 s)", "CP-SAT searched with the time left"]


def big_model(layers: int = 800, seed: int = 18):
    """Issue 18's scale: ``layers`` per-layer training layers, about 60 to a stage on 80 GB."""
    rng = np.random.default_rng(seed)
    specs = [LayerSpec(f"block{i}", weights=int(rng.integers(200, 1400)) * 2**20,
                       activations=int(rng.integers(20, 200)) * 2**20, output=int(rng.integers(4, 16)) * 2**20,
                       compute=float(rng.integers(50, 400)) * 1e9) for i in range(layers)]
    return Analysis.of(build_layer_profile(specs, load_target("a100-80gb"), training=True)).model


@pytest.fixture(scope="module")
def model800():
    return big_model()


def test_issue_18_memory_objective_is_proven_by_the_dp_within_the_limit(model800):
    opts = SolveOptions(devices=128, objective="memory", time_limit=2.0)
    problem = build_problem(model800, opts)
    assert dp_mode(problem) == "count" and dp_seconds_estimate(problem) <= 2.0    # the DP's work fits
    result = search(problem)
    assert result.status == "optimal" and [p.proof for p in result.phases] == ["dp", "dp"]


def test_issue_18_when_the_dp_does_not_fit_the_limit_no_phase_runs_past_it(model800, monkeypatch):
    """Mixed capacities with 1F1B: the exact DP needs the stage count in its state (2 x 128 x 129 / 2
    x 800 x W cells, tens of seconds) and CP-SAT's model 800 x 128 x 128 constraints. Neither is
    started; the DP without the count finds a split that fits, given as not proven."""
    caps = tuple((40 if i % 3 == 0 else 80) * 2**30 for i in range(128))
    opts = SolveOptions(devices=128, capacities=caps, schedule="1f1b", micro_batches=128, time_limit=2.0)
    problem = build_problem(model800, opts)
    assert dp_mode(problem) == "position-count" and dp_seconds_estimate(problem) > 2.0
    assert cpsat.model_seconds_estimate(problem) > 2.0
    monkeypatch.setattr(cpsat, "_Feasibility", None)           # no CP-SAT model is built
    monkeypatch.setattr(search_module, "exact_optimum", None)  # nor the exact DP run
    result = search(problem)
    assert result.status == "feasible" and result.evaluation.feasible
    assert [p.status for p in result.phases] == ["FEASIBLE", "FEASIBLE"]
    assert [p.bound for p in result.phases] == [None, None]
    assert result.notes[0].startswith("the exact DP was not run: it would take about ")
    assert result.notes[1] == ("a split that fits was found by the DP with every stage holding the most "
                               "micro-batches its position can have")
    assert result.notes[2].startswith("CP-SAT was not run: its model would take about ")
