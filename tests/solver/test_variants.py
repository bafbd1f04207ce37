"""Profile variants in the solver (solver/problem.py ``build_variant_problem``): the exact DP
against a brute force over every split and every choice of a variant per stage
(tests/bruteforce.py), CP-SAT against the DP, ``evaluate_split``'s choice of variants against every
choice for a split, and a hand-checked case."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from bruteforce import brute_force, brute_variant_keys
from helpers import UNIT
from stagesplit.errors import StagesplitError
from stagesplit.io.layerform import LayerSpec, build_layer_profile
from stagesplit.io.targets import load_target
from stagesplit.model.analysis import Analysis
from stagesplit.model.rangetable import OVER
from stagesplit.solver.cpsat import solve_split_cpsat
from stagesplit.solver.dp import exact_optimum
from stagesplit.solver.problem import (
    SolveOptions,
    Split,
    build_problem,
    build_variant_problem,
    choose_variants,
    evaluate_split,
)

_PROPERTY = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def variant_models(weights, activations, outputs, workspaces, computes, training):
    """One per-layer model per variant: the same layers (l0, l1, ...), weights, activations and
    outputs; each variant its own workspace (the temporary memory a memory proportion sets) and
    compute."""
    target = load_target("a100-80gb")
    models = []
    for workspace, compute in zip(workspaces, computes):
        specs = [LayerSpec(f"l{i}", weights=w * UNIT, activations=a * UNIT, output=o * UNIT, workspace=s * UNIT,
                           compute=c)
                 for i, (w, a, o, s, c) in enumerate(zip(weights, activations, outputs, workspace, compute))]
        models.append(Analysis.of(build_layer_profile(specs, target, training=training)).model)
    return models


@st.composite
def variant_problems(draw, max_layers=6, max_devices=3, max_variants=3):
    """Random problems with 1..max_variants variants of one model, drawn as ``random_problems``
    draws its options (schedules, mixed capacities, pins, layer limits, communication)."""
    layers = draw(st.integers(1, max_layers))
    devices = draw(st.integers(1, max_devices))
    count = draw(st.integers(1, max_variants))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    training = draw(st.booleans())
    weights = rng.integers(1, 20, layers).tolist()
    acts = rng.integers(0, 10, layers).tolist()
    outs = rng.integers(0, 4, layers).tolist()
    workspaces = [rng.integers(0, 15, layers).tolist() for _ in range(count)]
    computes = [rng.integers(0, 50, layers).tolist() for _ in range(count)]
    models = variant_models(weights, acts, outs, workspaces, computes, training)
    biggest = min(max(m.stage_memory(l, l).worst_bytes() for l in range(layers)) for m in models) // UNIT
    whole = max(m.stage_memory(0, layers - 1).worst_bytes() for m in models) // UNIT
    low, high = biggest, max(biggest + 1, 3 * whole // devices + 2)
    mixed = draw(st.booleans())
    caps = [int(x) for x in rng.integers(low, high, devices)] if mixed else [int(rng.integers(low, high))] * devices
    pins = (int(rng.integers(1, layers)),) if layers > 1 and draw(st.integers(0, 3)) == 0 else ()
    pinned_layers = ((int(rng.integers(0, layers)), int(rng.integers(0, devices))),) \
        if draw(st.integers(0, 5)) == 0 else ()
    min_layers = 1 + (draw(st.integers(0, 4)) == 0)
    max_layers = None if draw(st.integers(0, 2)) else max(min_layers, -(-layers // devices) + draw(st.integers(0, 2)))
    communication = draw(st.booleans())
    link = None
    if communication:
        flop_s = 1.0 / models[0].profile.target.seconds_per_unit("flops")
        link = float(UNIT * flop_s / 10 ** rng.uniform(-1, 1) / 10)
    opts = SolveOptions(devices=devices, capacities=tuple(c * UNIT for c in caps),
                        objective=draw(st.sampled_from(["compute", "memory", "devices"])),
                        exact=devices <= layers and draw(st.integers(0, 3)) == 0,
                        schedule=draw(st.sampled_from(["none", "1f1b", "gpipe"])), micro_batches=draw(st.integers(1, 6)),
                        min_layers=min_layers, max_layers=max_layers, pinned_splits=pins, pinned_layers=pinned_layers,
                        communication=communication, link_bytes_per_s=link, time_limit=30)
    names = [f"v{i}" for i in range(count)]
    proportions = [round(0.1 * (i + 1), 1) for i in range(count)]
    return build_variant_problem(models, names, proportions, opts)


def check_dp(problem):
    best, optimal = brute_force(problem)
    dp = exact_optimum(problem)
    objective = problem.options.objective
    if best is None:
        assert not dp.feasible
        return "infeasible"
    assert dp.feasible and dp.split.bounds in optimal
    assert dp.evaluation.key(objective) == best
    # the variants evaluate_split gives the DP's split reach the optimum; each stage takes the fastest
    # variant that keeps both optimal values
    keys = brute_variant_keys(problem, dp.split.bounds)
    assert keys[dp.evaluation.variants] == best
    return "feasible"


@settings(max_examples=250, **_PROPERTY)
@given(variant_problems())
def test_property_dp_equals_brute_force_over_splits_and_variants(problem):
    status = check_dp(problem)
    event(f"{status}, {len(problem.variants)} variants, {problem.options.objective.value}")


@settings(max_examples=150, **_PROPERTY)
@given(variant_problems(), st.data())
def test_property_evaluate_takes_the_best_variants_of_any_split(problem, data):
    """For any split (not only optimal ones), the variants ``evaluate_split`` chooses give the best
    objective key of every choice of variants, and no stage could take a faster variant that
    keeps both of the split's values."""
    L, N = problem.num_layers, problem.devices
    inner = sorted(data.draw(st.lists(st.integers(0, L), min_size=N - 1, max_size=N - 1)))
    bounds = (0, *inner, L)
    ev = evaluate_split(problem, Split(bounds))
    keys = brute_variant_keys(problem, bounds)
    if not ev.feasible:
        assert not keys, ev.reason
        return
    objective = problem.options.objective
    assert keys[ev.variants] == min(keys.values()) == ev.key(objective)
    position_of = [i for i, (a, e) in enumerate(zip(bounds[:-1], bounds[1:])) if e > a]
    ks = [min(problem.options.micro_batches, len(position_of) - s) if problem.options.schedule == "1f1b"
          else problem.options.micro_batches if problem.options.schedule == "gpipe" else 1
          for s in range(len(position_of))]
    for s, (position, k) in enumerate(zip(position_of, ks)):
        a, e = bounds[position], bounds[position + 1]
        mine = [o for o in problem.stage_options(position, k, a, e) if o[0] == ev.variants[s]][0]
        for _v, time, memory in problem.stage_options(position, k, a, e):
            if time <= ev.time and memory <= ev.memory:
                assert (mine[1], mine[2]) <= (time, memory)


@settings(max_examples=80, **_PROPERTY)
@given(variant_problems(max_layers=12, max_devices=4))
def test_property_cp_sat_equals_dp_with_variants(problem):
    oracle = exact_optimum(problem)
    result = solve_split_cpsat(problem)
    objective = problem.options.objective
    event(f"{result.status}, {len(problem.variants)} variants, {objective.value}"
          f"{', communication' if problem.options.communication else ''}")
    if not oracle.feasible:
        assert result.status == "infeasible"
        return
    assert result.status == "optimal"
    assert result.evaluation.key(objective) == oracle.evaluation.key(objective)
    informed = solve_split_cpsat(problem, oracle=oracle)
    assert informed.status == "optimal" and informed.evaluation.key(objective) == oracle.evaluation.key(objective)


@settings(max_examples=60, **_PROPERTY)
@given(variant_problems(max_variants=1))
def test_property_one_variant_or_two_copies_solve_as_the_plain_profile(problem):
    """A problem of one variant, and of that variant twice, has the plain problem's optimum."""
    (variant,) = problem.variants
    plain = exact_optimum(problem)
    objective = problem.options.objective
    twice = dataclasses.replace(problem, variants=(variant, variant))
    doubled = exact_optimum(twice)
    assert plain.feasible == doubled.feasible
    if plain.feasible:
        assert plain.evaluation.key(objective) == doubled.evaluation.key(objective)
        assert plain.split == doubled.split


class TestHandChecked:
    """Two variants of 3 layers on 2 devices of 100,000 bytes, inference (a stage needs its
    layers' weights plus the largest workspace among them: each layer's workspace lives on its
    own step only):

        layer  weights   workspace fast / slow   compute fast / slow
        l0     40,000    30,000 / 10,000         100 / 150
        l1     40,000    30,000 / 10,000         100 / 150
        l2     50,000    40,000 / 10,000         120 / 320

    ("fast" is a high memory proportion, "slow" a low one). The fast variant fits one layer per
    device only (l0+l1: 80,000 + 30,000 = 110,000 > 100,000), so 3 layers on 2 devices need a
    two-layer stage in the slow variant:

    * [l0 l1 | l2]: stage 0 slow (80,000 + 10,000 = 90,000 bytes, 150 + 150 = 300), stage 1
      fast (50,000 + 40,000 = 90,000, 120): bottleneck 300;
    * [l0 | l1 l2]: stage 1 slow (90,000 + 10,000 = 100,000, 150 + 320 = 470): bottleneck 470.

    So the optimum is [l0 l1 | l2] with exactly one stage (the first) on the slow variant. The
    slow variant alone gives 320 (l2 slow), the fast one alone does not fit. The memory
    tie-break (within time 300) keeps 90,000 bytes: stage 1 could take the slow variant at
    60,000 bytes, but stage 0 needs 90,000 anyway, and the fastest within both bounds is fast."""

    WEIGHTS = [40, 40, 50]
    WORKSPACE = {"fast": [30, 30, 40], "slow": [10, 10, 10]}
    COMPUTE = {"fast": [100, 100, 120], "slow": [150, 150, 320]}

    def problem(self, names=("fast", "slow"), objective="compute"):
        models = variant_models(self.WEIGHTS, [0] * 3, [0] * 3, [self.WORKSPACE[n] for n in names],
                                [self.COMPUTE[n] for n in names], training=False)
        opts = SolveOptions(devices=2, capacities=(100 * UNIT,) * 2, objective=objective, time_limit=10)
        return build_variant_problem(models, list(names), [0.6 if n == "fast" else 0.2 for n in names], opts)

    def test_exactly_one_stage_takes_the_low_memory_variant(self):
        problem = self.problem()
        dp = exact_optimum(problem)
        assert dp.split.bounds == (0, 2, 3)
        ev = dp.evaluation
        assert ev.variants == (1, 0)                          # stage 0 slow, stage 1 fast
        assert (ev.time, ev.memory) == (300, 90 * UNIT)
        assert evaluate_split(problem, Split((0, 1, 3))).time == 470
        cp = solve_split_cpsat(problem)
        assert cp.status == "optimal" and cp.split.bounds == (0, 2, 3) and cp.evaluation.variants == (1, 0)

    def test_each_variant_alone(self):
        assert not exact_optimum(self.problem(("fast",))).feasible
        slow = exact_optimum(self.problem(("slow",)))
        assert slow.split.bounds == (0, 2, 3) and slow.evaluation.time == 320

    def test_memory_objective_takes_the_slow_variant_everywhere(self):
        """Least memory first: [l0 | l1 l2] slow needs 100,000, [l0 l1 | l2] slow 90,000 and
        60,000: worst 90,000; within it the fastest: stage 1 fast (90,000 bytes, 120)."""
        problem = self.problem(objective="memory")
        dp = exact_optimum(problem)
        assert dp.split.bounds == (0, 2, 3) and dp.evaluation.memory == 90 * UNIT and dp.evaluation.time == 300
        assert dp.evaluation.variants == (1, 0)

    def test_choose_variants_orders_by_the_objective(self):
        options = [[(0, 100, 90), (1, 300, 50)], [(0, 120, 90), (1, 320, 60)]]
        assert choose_variants("compute", options) == [(0, 100, 90), (0, 120, 90)]
        assert choose_variants("memory", options) == [(1, 300, 50), (1, 320, 60)]


def test_variants_of_different_models_are_refused():
    a = variant_models([1, 1], [0, 0], [0, 0], [[0, 0]], [[1, 1]], False)[0]
    b = variant_models([1, 1, 1], [0, 0, 0], [0, 0, 0], [[0, 0, 0]], [[1, 1, 1]], False)[0]
    opts = SolveOptions(devices=2, capacities=(10 * UNIT,) * 2)
    with pytest.raises(StagesplitError, match="variant b has 3 layers, the first .a. 2"):
        build_variant_problem([a, b], ["a", "b"], [0.2, 0.4], opts)


def test_plain_build_problem_is_unchanged_by_the_variant_path():
    """``build_problem`` is the one-model case of the common builder: its tables, times and
    scale are those of a variant problem's first variant."""
    models = variant_models([3, 4, 5], [1, 1, 1], [1, 0, 1], [[2, 2, 2], [1, 1, 1]], [[7, 8, 9], [9, 9, 9]], True)
    opts = SolveOptions(devices=2, capacities=(40 * UNIT,) * 2)
    plain = build_problem(models[0], opts)
    both = build_variant_problem(models, ["a", "b"], [0.5, 0.2], opts)
    assert np.array_equal(plain.time_up, both.variants[0].time_up) and plain.time_scale == both.time_scale
    assert np.array_equal(plain.band(1), both.variants[0].table.band(1))
    assert both.variants[1].table.bytes_of(1, 0, 2) < both.variants[0].table.bytes_of(1, 0, 2) < OVER


@pytest.mark.slow
@settings(max_examples=1000, **_PROPERTY)
@given(variant_problems(max_layers=7, max_devices=4, max_variants=3))
def test_property_dp_equals_brute_force_over_splits_and_variants_many(problem):
    check_dp(problem)


@pytest.mark.slow
@settings(max_examples=300, **_PROPERTY)
@given(variant_problems(max_layers=20, max_devices=6, max_variants=4))
def test_property_cp_sat_equals_dp_with_variants_many(problem):
    oracle = exact_optimum(problem)
    result = solve_split_cpsat(problem)
    if not oracle.feasible:
        assert result.status == "infeasible"
        return
    assert result.status == "optimal"
    assert result.evaluation.key(problem.options.objective) == oracle.evaluation.key(problem.options.objective)
