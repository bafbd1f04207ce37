"""The exact DP against a brute-force enumeration of every split (tests/bruteforce.py), on tiny
instances covering communication, schedules, pins, per-device capacities, layer-count limits
and all three objectives; and hand-computed communication cases."""

from dataclasses import replace

from hypothesis import HealthCheck, event, given, settings

from bruteforce import brute_evaluate, brute_force
from helpers import layer_model, options, random_problems, stage_ranges
from stagesplit.solver.dp import exact_optimum
from stagesplit.solver.problem import build_problem, evaluate_split


def check_dp_against_brute_force(model, opts):
    problem = build_problem(model, opts)
    best, optimal = brute_force(problem)
    dp = exact_optimum(problem)
    if best is None:
        assert not dp.feasible
        return "infeasible"
    assert dp.feasible
    ev = dp.evaluation
    assert dp.split.bounds in optimal             # the DP's split is one of the optima (ties allowed)
    assert ev.key(opts.objective) == best
    # problem.evaluate_split agrees with the brute force's own rules on the optimal splits
    for bounds in optimal[:3]:
        value = brute_evaluate(problem, bounds)
        e = evaluate_split(problem, type(dp.split)(bounds))
        assert e.feasible and (e.time, e.memory, e.devices) == value
    return "feasible"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(random_problems(max_layers=8, max_devices=4))
def test_property_dp_equals_brute_force(case):
    model, opts = case
    status = check_dp_against_brute_force(model, opts)
    event(f"{status}, {opts.objective}, {opts.schedule}, comm={opts.communication}")


class TestCommunicationByHand:
    """Four layers of compute 100; the outputs of layers 0..3 are 20, 0, 20, 0 (x 1000 bytes),
    so the cuts before layers 1, 2, 3 carry 20,000, 0 and 20,000 bytes."""

    def model(self):
        return layer_model([1] * 4, [100] * 4, output=[20, 0, 20, 0])

    def test_cut_units_and_stage_times(self):
        model = self.model()
        flop_s = 1.0 / model.profile.target.seconds_per_unit("flops")
        # 20,000 bytes at flop_s / 1000 bytes/s take 20,000 * 1000 / flop_s s = 2e7 FLOP-times
        opts = options(2, 200, communication=True, link_bytes_per_s=flop_s / 1000)
        problem = build_problem(model, opts)
        scale = problem.time_scale
        assert problem.cut_units.tolist() == [0, round(2e7 * scale), 0, round(2e7 * scale), 0]
        assert problem.stage_time(0, 1) == round(100 * scale) + round(2e7 * scale)
        assert problem.stage_time(1, 3) == round(200 * scale) + 2 * round(2e7 * scale)

    def test_dp_and_brute_force_pick_the_free_cut(self):
        model = self.model()
        flop_s = 1.0 / model.profile.target.seconds_per_unit("flops")
        for devices in (2, 3, 4):
            opts = options(devices, 200, communication=True, link_bytes_per_s=flop_s / 1000)
            dp = exact_optimum(build_problem(model, opts))
            # every cut but the free one costs 2e7 >> 400: the best split is the free cut alone
            assert stage_ranges(dp.split) == [(0, 1), (2, 3)]
            assert check_dp_against_brute_force(model, opts) == "feasible"
            exact = replace(opts, exact=True)
            # three or four stages must use a costly cut
            if devices > 2:
                assert exact_optimum(build_problem(model, exact)).evaluation.time > dp.evaluation.time
            check_dp_against_brute_force(model, exact)


# -- PopLiner's greedy, re-derived from its description ---------------------------------------

def popliner_reference(every, none, capacity: int, devices: int):
    """PopLiner's loop written over its own layer list ``[None, 0, ..., L-1]`` (the unlayered
    operations first), stage memory from ``stage_memory`` (not the range tables the greedy
    uses): returns (min layers, share, per-device layer ranges) or None."""
    L = every.num_layers
    names = [None] + list(range(L))

    def peak(i, j):                       # PopLiner layers names[i..j]
        if i == 0:
            return every.shared_memory().worst_bytes() if j == 0 else every.stage_memory(0, j - 1).worst_bytes()
        return none.stage_memory(i - 1, j - 1).worst_bytes()

    for m in (3, 2, 1):
        for share in (0.5, 0.6, 0.7, 0.8, 0.9, 1.0):
            limit = capacity * share
            stages, start = [], 0
            for _ in range(range(devices).stop):
                end = None
                for j in range(start + m - 1, len(names)) or range(start, len(names)):
                    if peak(start, j) > limit:
                        break
                    end = j
                if end is None:
                    break
                stages.append((start, end))
                start = end + 1
                if start >= len(names):
                    return m, share, stages
    return None


def test_property_greedy_with_unlayered_first_matches_popliner():
    import numpy as np

    from helpers import random_block_profile
    from stagesplit.model.analysis import Analysis
    from stagesplit.model.costmodel import StageCostModel
    from stagesplit.plan.comparison import popliner_tables
    from stagesplit.solver.dp import greedy
    from stagesplit.solver.problem import SolveOptions
    checked = 0
    for seed in range(100):
        rng = np.random.default_rng(seed)
        profile = random_block_profile(rng, layers=int(rng.integers(2, 8)), training=bool(seed % 2))
        model = Analysis.of(profile).model
        every, none = model, StageCostModel(profile, model.layers, shared="none")
        L = model.num_layers
        whole = every.stage_memory(0, L - 1).worst_bytes()
        devices = int(rng.integers(1, 5))
        capacity = int(rng.integers(max(1, whole // 3), 2 * whole + 2))
        problem = build_problem(model, SolveOptions(devices=devices, capacities=(capacity,) * devices))
        got = greedy(problem, unlayered_first=popliner_tables(model, problem.in_flight_values))
        want = popliner_reference(every, none, capacity, devices)
        if want is None:
            assert got.split is None
            continue
        m, share, stages = want
        assert got.method == f"greedy ({m}+ layers, {share:.0%} of memory, unlayered code on stage 0)"
        # PopLiner's stage (i, j) holds our layers max(i, 1) - 1 .. j - 1 (stage 0 the unlayered code too)
        bounds = [0] + [j for _, j in stages] + [L] * (devices - len(stages))
        assert got.split.bounds == tuple(bounds)
        checked += 1
    assert checked >= 40
