"""CP-SAT splits: hand-computed optima, the exact oracle and the greedy baseline."""

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, event, given, settings

from helpers import UNIT, layer_model, options, random_problems, stage_ranges
from indexed_inputs import indexed_inputs
from stagesplit.plan.advise import advise
from stagesplit.plan.files import plan_document
from stagesplit.plan.search import fewest_stages_that_fit, price
from stagesplit.solver.cpsat import solve_split_cpsat
from stagesplit.solver.dp import exact_optimum, greedy, uniform
from stagesplit.solver.problem import SolveOptions, Split, build_problem, evaluate_split, in_flight


def solve(model, opts):
    problem = build_problem(model, opts)
    return problem, solve_split_cpsat(problem)


# Six layers of equal weight (4) on devices of capacity 12: at most three layers per stage.
WEIGHTS = [4, 4, 4, 4, 4, 4]
COMPUTE = [1, 1, 1, 1, 5, 5]


class TestHandComputed:
    def test_optimal_split_and_greedy_strictly_worse(self):
        model = layer_model(WEIGHTS, COMPUTE)
        problem, result = solve(model, options(3, 12))
        # (3,2,1) layers: compute 3, 6, 5 -> bottleneck 6; every other split is worse
        assert result.status == "optimal"
        assert stage_ranges(result.split) == [(0, 2), (3, 4), (5, 5)]
        assert result.evaluation.time == 6
        assert result.phases[0].value == result.phases[0].bound == 6
        # PopLiner's greedy first asks for 3+ layers per stage (12 bytes): 50% (6) ... 90% (10.8)
        # overflow; at 100% (12) two devices of three layers hold everything
        g = greedy(problem)
        assert g.method == "greedy (3+ layers, 100% of memory)"
        assert stage_ranges(g.split) == [(0, 2), (3, 5)]
        assert g.evaluation.time == 11 > result.evaluation.time
        # one layer at a time (the loop's last round) gives the old first-fit: 50% (6) and 60%
        # (7.2) hold one layer per device and fail, 70% (8.4) two per device
        g1 = greedy(problem, min_layers_order=(1,))
        assert g1.method == "greedy (1+ layers, 70% of memory)"
        assert stage_ranges(g1.split) == [(0, 1), (2, 3), (4, 5)]
        # 2+ layers: 50%, 60% overflow at two layers (8); 70% (8.4) takes two per device
        g2 = greedy(problem, min_layers_order=(2, 1))
        assert g2.method == "greedy (2+ layers, 70% of memory)"
        u = uniform(problem)
        assert stage_ranges(u.split) == [(0, 1), (2, 3), (4, 5)]

    def test_memory_tie_break_after_compute(self):
        # compute ties everywhere: the secondary objective (worst memory) decides
        model = layer_model(WEIGHTS, [1] * 6)
        _, result = solve(model, options(3, 12))
        assert result.evaluation.time == 2
        assert result.evaluation.memory == 8 * UNIT
        assert stage_ranges(result.split) == [(0, 1), (2, 3), (4, 5)]

    def test_memory_objective(self):
        model = layer_model([1, 2, 3, 4, 5, 6], [1] * 6)
        _, result = solve(model, options(3, 100, objective="memory"))
        # sums 1..6 = 21; the best 3-way contiguous split has a largest part of 9: [1 2 3 | 4 5 | 6]... or
        # [1 2 3 | 4 | 5 6]? 6, 4, 11 no; [1 2 3 4 | 5 | 6] -> 10; [1 2 3 | 4 5 | 6] -> 6, 9, 6 -> 9
        assert result.evaluation.memory == 9 * UNIT
        assert stage_ranges(result.split) == [(0, 2), (3, 4), (5, 5)]

    def test_devices_objective_uses_fewest_then_balances(self):
        model = layer_model(WEIGHTS, COMPUTE)
        _, result = solve(model, options(5, 12, objective="devices"))
        # 6 layers x 4 with at most 3 layers per device: 2 devices, only [0 1 2 | 3 4 5]
        assert result.evaluation.devices == 2
        assert stage_ranges(result.split) == [(0, 2), (3, 5)]

    def test_infeasible_names_the_layer(self):
        model = layer_model([1, 9, 1], [1, 1, 1])
        opts = options(3, 5)
        advice = advise(model, indexed_inputs(model, opts))
        assert not advice.plan.feasible and advice.plan.status == "infeasible"
        assert "layer 'l1' alone needs 9,000 bytes" in advice.plan.message
        assert "no number of devices fits" in advice.plan.message

    def test_infeasible_says_smallest_device_count(self):
        model = layer_model(WEIGHTS, COMPUTE)
        advice = advise(model, indexed_inputs(model, options(2, 8)))
        assert not advice.plan.feasible
        assert advice.plan.message.endswith("the smallest number that fits is 3")

    def test_min_layers(self):
        model = layer_model(WEIGHTS, COMPUTE)
        _, result = solve(model, options(3, 12, min_layers=3))
        assert stage_ranges(result.split) == [(0, 2), (3, 5)]
        assert result.evaluation.time == 11
        _, exact = solve(model, options(3, 12, min_layers=3, exact=True))
        assert exact.status == "infeasible"

    def test_max_layers(self):
        model = layer_model(WEIGHTS, COMPUTE)
        _, result = solve(model, options(3, 12, max_layers=2))
        assert stage_ranges(result.split) == [(0, 1), (2, 3), (4, 5)]

    def test_pinned_split(self):
        model = layer_model(WEIGHTS, COMPUTE)
        _, result = solve(model, options(3, 12, pinned_splits=(4,)))
        # a stage must start at layer 4: [4 5] together (10) or apart (then 0..3 = 16 > 12); memory tie-break
        assert result.evaluation.time == 10
        assert stage_ranges(result.split) == [(0, 1), (2, 3), (4, 5)]

    def test_pinned_layer_to_a_device(self):
        model = layer_model(WEIGHTS, COMPUTE)
        _, result = solve(model, options(3, 12, pinned_layers=((5, 1),)))
        # layer 5 on device 1 leaves device 2 empty: [0 1 2 | 3 4 5] would need 12 on device 1: 3 layers
        assert [p for p, a, b in result.split.stages if a <= 5 <= b] == [1]
        assert stage_ranges(result.split) == [(0, 2), (3, 5)]

    def test_heterogeneous_capacities(self):
        model = layer_model(WEIGHTS, COMPUTE)
        _, result = solve(model, options(3, [4, 12, 12]))
        # device 0 holds one layer: [0 | 1 2 3 | 4 5] -> 1, 3, 10
        assert stage_ranges(result.split) == [(0, 0), (1, 3), (4, 5)]
        assert result.evaluation.time == 10

    def test_one_f_one_b_memory_with_four_stages(self):
        # training: each layer 10 weights + 5 activation; stage s of 4 holds 4 - s micro-batches,
        # each extra one adding the stashed activation (5), except the last layer, never stashed
        model = layer_model([10] * 4, [1] * 4, training=True, activations=[5] * 4)
        opts = options(4, 100, schedule="1f1b", micro_batches=8, exact=True)
        advice = advise(model, indexed_inputs(model, opts))
        stages = advice.plan.stages
        assert [s.in_flight for s in stages] == [4, 3, 2, 1]
        assert [s.worst_tile_bytes for s in stages] == [30 * UNIT, 25 * UNIT, 20 * UNIT, 15 * UNIT]
        assert [s.memory_at_worst_tile.stashed_copies for s in stages] == [15 * UNIT, 10 * UNIT, 5 * UNIT, 0]
        gpipe = advise(model, indexed_inputs(model, replace(opts, schedule="gpipe"))).plan.stages
        assert [s.worst_tile_bytes for s in gpipe] == [50 * UNIT, 50 * UNIT, 50 * UNIT, 15 * UNIT]

    def test_one_f_one_b_limits_the_first_stage(self):
        model = layer_model([10] * 4, [1] * 4, training=True, activations=[5] * 4)
        # capacity 27: the first of 4 stages would hold 30; three stages: 10+5+2*5 = 25 fits for layer 0 ...
        _, exact = solve(model, options(4, 27, schedule="1f1b", micro_batches=8, exact=True))
        assert exact.status == "infeasible"

    def test_communication_cost_moves_the_cut(self):
        # equal compute; the cut after layer 1 carries 0 bytes, the others a lot
        model = layer_model([1] * 4, [100] * 4, output=[20, 0, 20, 0])
        opts = options(2, 200, communication=True, link_bytes_per_s=1e9)
        advice = advise(model, indexed_inputs(model, opts))
        assert advice.plan.split_text == "[ l0 l1 | l2 l3 ]"
        assert advice.plan.stages[0].bytes_sent == 0


class TestProblem:
    def test_in_flight(self):
        assert [in_flight("1f1b", 8, s, 4) for s in range(4)] == [4, 3, 2, 1]
        assert [in_flight("1f1b", 2, s, 4) for s in range(4)] == [2, 2, 2, 1]
        assert [in_flight("gpipe", 6, s, 3) for s in range(3)] == [6, 6, 6]
        assert in_flight("none", 6, 0, 3) == 1

    def test_evaluate_rejects_bad_splits(self):
        problem = build_problem(layer_model(WEIGHTS, COMPUTE), options(3, 12))
        assert not evaluate_split(problem, Split((0, 4, 6, 6))).feasible          # 4 layers = 16 > 12
        assert not evaluate_split(problem, Split((0, 3, 2, 6))).feasible          # not monotone
        assert evaluate_split(problem, Split((0, 3, 5, 6))).feasible

    def test_option_checks(self):
        model = layer_model(WEIGHTS, COMPUTE)
        from stagesplit.errors import StagesplitError
        for bad in (dict(devices=0), dict(micro_batches=0), dict(headroom=1.0), dict(pinned_splits=(0,)),
                    dict(pinned_layers=((9, 0),)), dict(min_layers=3, max_layers=2), dict(communication=True)):
            with pytest.raises(StagesplitError):
                build_problem(model, replace(options(3, 12), **bad))

    def test_headroom_reduces_capacity(self):
        problem = build_problem(layer_model(WEIGHTS, COMPUTE), replace(options(3, 12), headroom=0.25))
        assert problem.capacity.tolist() == [9 * UNIT] * 3

    def test_fewest_devices(self):
        model = layer_model(WEIGHTS, COMPUTE)
        opts = options(1, 8)
        problem = build_problem(model, opts)
        assert fewest_stages_that_fit(price(model, opts), problem.capacity, opts) == 3


def test_same_inputs_give_the_same_plan(sample_analysis):
    """The README's promise: only the ``run`` section (date, version, wall times) differs."""
    opts = SolveOptions(devices=4, time_limit=30)
    first = plan_document(advise(sample_analysis.model, indexed_inputs(sample_analysis.model, opts)).plan)
    second = plan_document(advise(sample_analysis.model, indexed_inputs(sample_analysis.model, opts)).plan)
    assert set(first["run"]) == {"stagesplit", "created", "solver_seconds", "phase_seconds", "versions", "dp_seconds",
                                 "cpsat_seconds"}
    assert len(first["run"]["phase_seconds"]) == len(first["objective"]) >= 1
    first.pop("run"), second.pop("run")
    assert first == second


def test_same_command_writes_the_same_plan_but_for_run(tmp_path):
    """Two CLI solves of one profile write plan files that differ only in ``run``."""
    import json

    from helpers import PROFILES
    from stagesplit.cli import main
    docs = []
    for name in ("a.json", "b.json"):
        out = tmp_path / name
        assert main(["solve", str(PROFILES / "bert-base.stagesplit"), "--devices", "6", "--out", str(out)]) == 0
        doc = json.loads(out.read_text())
        doc.pop("run")
        docs.append(doc)
    assert docs[0] == docs[1]
    assert all("seconds" not in phase for phase in docs[0]["objective"])


def test_samples_cp_sat_matches_oracle_and_beats_greedy(sample_analysis):
    model = sample_analysis.model
    opts = SolveOptions(devices=1, time_limit=30)
    fewest = fewest_stages_that_fit(price(model, opts), build_problem(model, opts).capacity, opts)
    assert fewest is not None and fewest > 1                 # the samples do not fit on one IPU
    infeasible = solve_split_cpsat(build_problem(model, replace(opts, devices=fewest - 1)))
    assert infeasible.status == "infeasible" and not exact_optimum(build_problem(model, replace(opts, devices=fewest - 1))).feasible
    for n in (fewest, fewest + 3):
        problem = build_problem(model, SolveOptions(devices=n, time_limit=30))
        result = solve_split_cpsat(problem)
        oracle = exact_optimum(problem)
        assert result.status == "optimal"
        assert result.evaluation.key("compute") == oracle.evaluation.key("compute")
        g = greedy(problem)
        if g.feasible:
            assert result.evaluation.key("compute") <= g.evaluation.key("compute")


def check_cp_sat_against_oracle(case):
    model, opts = case
    problem = build_problem(model, opts)
    result = solve_split_cpsat(problem)
    oracle = exact_optimum(problem)
    event(f"{result.status}, {opts.objective}, {opts.schedule}, {'exact' if opts.exact else 'at most'}"
          f"{', communication' if opts.communication else ''}")
    assert result.status in ("optimal", "infeasible")
    if not oracle.feasible:
        assert result.status == "infeasible"
        return
    assert result.status == "optimal"
    assert result.evaluation.feasible
    assert result.evaluation.key(opts.objective) == oracle.evaluation.key(opts.objective)
    g = greedy(problem)
    if g.feasible:
        assert result.evaluation.key(opts.objective) <= g.evaluation.key(opts.objective)
    # with the DP's answer as hint and bound (what advise() does), the same optimum, proven
    informed = solve_split_cpsat(problem, oracle=oracle)
    assert informed.status == "optimal"
    assert informed.evaluation.key(opts.objective) == oracle.evaluation.key(opts.objective)
    assert all(p.value == p.bound for p in informed.phases)


_PROPERTY = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@settings(max_examples=100, **_PROPERTY)
@given(random_problems(max_layers=16, max_devices=6))
def test_property_cp_sat_equals_exact_oracle_quick(case):
    """CP-SAT against the DP (itself checked against brute force in test_oracle.py), half of the
    instances with communication; the slow variant below runs 500 larger ones."""
    check_cp_sat_against_oracle(case)


@pytest.mark.slow
@settings(max_examples=500, **_PROPERTY)
@given(random_problems())
def test_property_cp_sat_equals_exact_oracle_and_never_loses_to_greedy(case):
    check_cp_sat_against_oracle(case)


def test_time_limit_returns_best_found_with_its_gap(monkeypatch):
    model = layer_model(WEIGHTS, COMPUTE)
    problem = build_problem(model, options(3, 12))
    start = greedy(problem)                               # [0 1 2 | 3 4 5]: bottleneck 11; the optimum is 6
    stopped = solve_split_cpsat(build_problem(model, replace(options(3, 12), time_limit=0.0)), hint=start.split)
    assert stopped.status == "feasible" and not stopped.proven_optimal
    first = stopped.phases[0]
    assert first.status == "FEASIBLE" and first.value == 11
    assert first.bound < first.value and first.gap > 0
    assert stopped.evaluation.time == 11
    # advise() runs the exact DP first when its estimated time fits in the limit: its split is
    # optimal, every phase proved by the DP, and CP-SAT is not run (it could add no proof)
    advice = advise(model, indexed_inputs(model, options(3, 12)))
    assert advice.plan.status == "optimal" and [p.proof for p in advice.plan.phases] == ["dp", "dp"]
    assert advice.plan.phases[0].value == 6
    assert advice.plan.run.dp_seconds is not None and advice.plan.run.cpsat_seconds is None
    # with no time at all neither the DP nor CP-SAT is run, and the plan says so: the greedy split
    # it started from is given, not proven
    advice = advise(model, indexed_inputs(model, replace(options(3, 12), time_limit=0.0)))
    assert advice.plan.status == "feasible" and advice.plan.phases[0].value == 11
    assert advice.plan.message == ("stopped by the time limit (0 s): best split found, not proven optimal "
                                   "(gap unknown)")
    assert advice.plan.notes[0].startswith("the exact DP was not run: it would take about ")
    assert advice.plan.notes[1].startswith("CP-SAT was not run: its model would take about ")
    assert advice.plan.run.dp_seconds is None and advice.plan.run.cpsat_seconds is None


def test_user_compute_override_changes_the_split():
    model = layer_model(WEIGHTS, [1] * 6)
    base = model
    model = base.with_compute({"l5": 100})
    assert base.range_compute(5, 5) == 1                        # the original is unchanged
    _, result = solve(model, options(3, 12))
    assert result.evaluation.time == 100
    assert stage_ranges(result.split)[-1] == (5, 5)           # the heavy layer alone
    from stagesplit.errors import StagesplitError
    with pytest.raises(StagesplitError, match="no layer named 'l9'"):
        model.with_compute({"l9": 1})
