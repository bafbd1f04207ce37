"""The layout search's bounds (plan/layouts.py): the bubble factor by hand, the step floor below
every split's and every layout's step (each split simulated, each layout solved alone), the floor
at another micro-batch size below the scaled profile's own figures, a combination the floor cuts
off with the answer unchanged against the search without the floor; and CP-SAT's per-range chunk
tables (solver/chunk_cpsat_tables.py): only the ranges some split reaches, kept for the next search
of the same table."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest

from stagesplit import api

torch = pytest.importorskip("torch")


#: the oracles here simulate 1F1B (conftest.py's ``search_under_1f1b``)
pytestmark = pytest.mark.usefixtures("search_under_1f1b")


def _stack(widths: list[int], batch: int = 8, seed: int = 0):
    from stagesplit.capturing.pytorch import capture_model
    torch.manual_seed(seed)
    model = torch.nn.Sequential(*[torch.nn.Linear(widths[i], widths[i + 1]) for i in range(len(widths) - 1)])
    return capture_model(model, torch.empty(batch, widths[0], device="meta"), allocator_round=1, name="stack")


def _random_widths(seed: int) -> list[int]:
    rng = np.random.default_rng(100 + seed)
    return [int(w) for w in rng.integers(8, 160, int(rng.integers(4, 7)) + 1)]


def test_bubble_factor_by_hand():
    """1F1B and GPipe (one stage per rank, the backward whole): 1 / (1 - (1 - 1/M)^pp), at least
    M / pp and at most the equal stages' (M + pp - 1) / pp; one micro-batch crosses every stage (1);
    any other schedule, or auto: M / pp."""
    from stagesplit.plan.layouts import bubble_factor
    assert bubble_factor("1f1b", 4, 4) == pytest.approx(256 / 175)          # 1 - (3/4)^4 = 175/256
    assert bubble_factor("gpipe", 2, 8) == pytest.approx(64 / 15)           # 1 - (7/8)^2 = 15/64
    assert 4 / 4 <= 256 / 175 <= (4 + 4 - 1) / 4
    assert bubble_factor("1f1b", 1, 8) == 8
    assert bubble_factor("1f1b", 4, 1) == 1
    for schedule in ("interleaved-1f1b", "looped-bfs", "zb-h1", "zbv", "dualpipev", "auto"):
        assert bubble_factor(schedule, 4, 8) == 2


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_every_splits_pipeline_step_is_at_least_the_floor(seed, schedule):
    """Every split of a random stack into pp stages, simulated under the schedule (the chunk
    search's own evaluation): its step is at least the bubble factor times one micro-batch's work on
    all stages, at least M x that work plus the optimizer over pp, and at least M x the slowest
    stage's least work over every split (``slowest_stage``)."""
    from stagesplit.plan.engine import resolve
    from stagesplit.plan.layouts import bubble_factor, slowest_stage
    from stagesplit.plan.scheduled import schedule_problem
    from stagesplit.solver.chunk_evaluation import evaluate_chunk_split
    from stagesplit.solver.request import SolveRequest
    profile = _stack(_random_widths(seed), seed=seed)
    analysis = api.analyze(profile)
    L = analysis.layers.num_layers
    for pp in range(2, min(L, 4) + 1):
        for M in (pp, 2 * pp + 1):
            request = SolveRequest(devices=pp, targets=("h100-80gb",), schedule=schedule, micro_batches=M, exact=True)
            resolved = resolve(request, analysis)
            table = resolved.model.phase_table
            problem = schedule_problem(resolved.model, resolved.inputs, table)
            work = float(table.layer_times[:, :3].sum())
            optimizer = float(table.layer_times[:, 3].sum())
            floor = max(bubble_factor(schedule, pp, M) * work, (M * work + optimizer) / pp)
            per_layer = table.layer_times[:, :3].sum(axis=1)
            slowest = M * slowest_stage(per_layer, pp)
            steps = []
            for inner in itertools.combinations(range(1, L), pp - 1):
                step = evaluate_chunk_split(problem, [0, *inner, L]).step_time
                assert step >= max(floor, slowest) * (1 - 1e-9), (pp, M, inner)
                steps.append(step)
            # the bound is the slowest stage's work of the best split for that alone (found here by
            # trying every split): M x it is reached by no step, but closely
            best = min(max(float(per_layer[a:b].sum()) for a, b in zip([0, *inner], [*inner, L]))
                       for inner in itertools.combinations(range(1, L), pp - 1))
            assert slowest == pytest.approx(M * best, rel=1e-8)


def test_slowest_stage_by_hand():
    """The least work of the slowest stage: [1, 1, 1, 1, 1] on 2 stages is 3 (a split 2 | 3), on 4
    is 2, on 5 or more is 1 (a layer each); [5, 1, 1, 1] on 2 is 5 (the first alone); [2, 3, 4] on 1
    is 9 (the whole); no layers, 0."""
    from stagesplit.plan.layouts import slowest_stage
    ones = [1.0] * 5
    assert slowest_stage(ones, 2) == pytest.approx(3)
    assert slowest_stage(ones, 4) == pytest.approx(2)
    assert slowest_stage(ones, 5) == pytest.approx(1) and slowest_stage(ones, 9) == pytest.approx(1)
    assert slowest_stage([5.0, 1.0, 1.0, 1.0], 2) == pytest.approx(5)
    assert slowest_stage([2.0, 3.0, 4.0], 1) == pytest.approx(9)
    assert slowest_stage([], 3) == 0.0
    # a lower bound: never above the true value
    assert slowest_stage(ones, 2) <= 3 and slowest_stage([5.0, 1.0, 1.0, 1.0], 2) <= 5


def test_the_slowest_stage_bound_cuts_off_a_deep_pipeline_of_few_layers():
    """Five layers on 4 stages: one stage holds two neighbours, so with M micro-batches 1F1B's pipeline
    step is at least M x the lightest neighbouring pair's work (each pair outweighs every single
    layer), above the other bounds here (M = 16: the bubble factor's and (M K + optimizer) / pp):
    ``step_floor`` is that (the collectives and data parallelism add nothing here)."""
    from stagesplit.io.targets import load_target
    from stagesplit.io.topology import node_of
    from stagesplit.plan.layouts import Layout, LayoutRequest, RankWork, bubble_factor, step_floor
    profile = _stack([64] * 6)
    req = LayoutRequest(gpus=4, global_batch=8 * 16, target=load_target("h100-80gb"), node=node_of("h100-80gb"),
                        micro_batch_size=8, captured_batch=8)
    work = RankWork.of(api.analyze(profile), req)
    layer = work.layer_work(1.0)
    k, x = work.per_micro_batch(1.0)
    assert len(layer) == 5 and float(layer.sum()) == pytest.approx(k) and x == 0
    pair = min(layer[i] + layer[i + 1] for i in range(4))
    assert pair > layer.max()
    lay = Layout(1, 4, 1, 0, 16, micro_batch_size=8)
    floor, _ = step_floor(work, lay, req)
    assert floor == pytest.approx(16 * pair, rel=1e-6)
    assert floor > max(bubble_factor("1f1b", 4, 16) * k, (16 * k + work.optimizer_s) / 4) * 1.1


@pytest.mark.parametrize("seed", range(4))
def test_the_step_floor_is_below_every_layouts_step(seed):
    """Every combination of a random stack solved on its own (as the search's property test in
    test_layouts.py does): its step is at least ``step_floor``'s floor, and what it adds to its
    pipeline step at least the floor's ``added`` (the engine's cutoff)."""
    from stagesplit.model.datasharding import parameter_bytes_by_layer
    from stagesplit.plan.layouts import RankWork, enumerate_layouts, key_of, step_floor, step_of
    profile = _stack(_random_widths(seed), seed=seed)
    gpus = (4, 8)[seed % 2]
    lp = api.layouts(profile, target="h100-80gb", gpus=gpus, global_batch=8 * gpus * (1 + seed % 3),
                     micro_batch_size=8, time_limit=60)
    read = api.analyze(profile)
    params, _ = parameter_bytes_by_layer(read.profile, read.layers)
    work = RankWork.of(read, lp.request)
    checked = 0
    for lay in enumerate_layouts(lp.request, [1], read.layers.num_layers):
        assert key_of(lay) == 1
        link = lp.request.node.link(lay.pp, lay.tp * lay.dp).bytes_per_s
        plan = api.solve(profile, devices=lay.pp, target="h100-80gb", schedule="1f1b",
                         micro_batches=lay.micro_batches, dp=lay.dp, zero=lay.zero, exact=True,
                         communication=lay.pp > 1, link_bandwidth=link)
        if not plan.feasible:
            continue
        step, pipeline, _, _ = step_of(lay, plan, read, lp.request, params)
        floor, added = step_floor(work, lay, lp.request)
        assert floor <= step * (1 + 1e-9), lay
        assert added <= (step - pipeline) * (1 + 1e-9) + 1e-15, lay
        checked += 1
    assert checked >= 3


@pytest.mark.parametrize("ratio", [Fraction(1, 2), Fraction(2), Fraction(4)])
def test_the_floor_at_another_micro_batch_size_is_below_the_scaled_profiles(ratio):
    """``per_micro_batch(r)`` is at most what the profile scaled to ``r`` times its micro-batch
    (model/batchscale.py) gives at its own size."""
    from stagesplit.io.targets import load_target
    from stagesplit.io.topology import node_of
    from stagesplit.model.batchscale import scale_batch
    from stagesplit.plan.layouts import LayoutRequest, RankWork
    profile = _stack([64, 256, 64, 64], batch=8)
    req = LayoutRequest(gpus=8, global_batch=64, target=load_target("h100-80gb"), node=node_of("h100-80gb"))
    base = RankWork.of(api.analyze(profile), req)
    scaled = RankWork.of(api.analyze(scale_batch(profile, ratio)), req)
    bound, exact = base.per_micro_batch(float(ratio)), scaled.per_micro_batch(1.0)
    assert bound[0] <= exact[0] * (1 + 1e-12) and bound[1] <= exact[1] * (1 + 1e-12) + 1e-18
    assert bound[0] >= min(1.0, float(ratio)) * base.per_micro_batch(1.0)[0] > 0    # the captured size's, scaled
    assert scaled.optimizer_s == pytest.approx(base.optimizer_s)


def test_a_combination_the_floor_cuts_off_leaves_the_answer_unchanged(monkeypatch):
    """Four Linear(64, 64) on 8 GPUs, 8 micro-batches of 8 per step: TP 1 x PP 1 x DP 8 under ZeRO 3
    is cut off by its step floor (its all-gathers of a layer's 16,640 bytes across 8 ranks, twice per
    micro-batch, alone outlast the best step); without the floor (every combination solved, the
    engine given no cutoff) it is solved, slower than the best, and the best is the same."""
    import stagesplit.plan.layouts as layouts
    from stagesplit.io.topology import node_of
    from stagesplit.model.communication import all_gather
    stack = _stack([64] * 5)
    kw = dict(target="h100-80gb", gpus=8, global_batch=64 * 8, micro_batch_size=8, time_limit=60)
    bounded = api.layouts(stack, **kw)
    cut = {r.layout: r for r in bounded.rows if r.status == "cut off"}
    z3 = layouts.Layout(1, 1, 8, 3, 8, micro_batch_size=8)
    assert z3 in cut and cut[z3].reason.startswith("step floor ")
    link = node_of("h100-80gb").intra
    gathers = 8 * 2 * all_gather(64 * 64 * 4 + 64 * 4, 8, link.bytes_per_s, link.latency_s)
    assert gathers >= bounded.best.step_s
    monkeypatch.setattr(layouts, "step_floor", lambda work, lay, req, measured=None: (0.0, 0.0))
    monkeypatch.setattr(layouts, "pipeline_floors", lambda *a, **k: (0.0, 0.0, 0.0))      # (its own bounds too)
    unbounded = api.layouts(stack, **kw)
    assert not [r for r in unbounded.rows if r.status == "cut off"]
    assert unbounded.best.layout == bounded.best.layout
    assert unbounded.best.step_s == pytest.approx(bounded.best.step_s)
    # each combination cut off: solved (or refuted by the engine's cutoff) without the floor, none faster
    again = {r.layout: r for r in unbounded.rows}
    for lay in cut:
        assert again[lay].status == "slower" and (again[lay].step_s is None
                                                  or again[lay].step_s >= bounded.best.step_s * (1 - 1e-9))
    # and the ZeRO 3 one solved on its own: its step holds those all-gathers
    from stagesplit.model.datasharding import parameter_bytes_by_layer
    read = api.analyze(stack)
    plan = api.solve(stack, devices=1, target="h100-80gb", schedule="1f1b", micro_batches=8, dp=8, zero=3,
                     exact=True)
    step = layouts.step_of(z3, plan, read, bounded.request, parameter_bytes_by_layer(read.profile, read.layers)[0])[0]
    assert step >= gathers >= bounded.best.step_s


def _every_range(L: int, C: int) -> set[tuple[int, int]]:
    out = set()
    for inner in itertools.combinations(range(1, L), C - 1):
        b = [0, *inner, L]
        out |= {(b[c], b[c + 1] - 1) for c in range(C)}
    return out


def test_the_ranges_a_split_reaches_by_hand_and_by_enumeration():
    from stagesplit.solver.chunk_cpsat_tables import reachable
    assert {tuple(x) for x in np.argwhere(reachable(1, 4))} == {(0, 3)}
    assert {tuple(x) for x in np.argwhere(reachable(2, 4))} == {(0, 0), (0, 1), (0, 2), (1, 3), (2, 3), (3, 3)}
    assert {tuple(x) for x in np.argwhere(reachable(3, 4))} == {(0, 0), (0, 1), (1, 1), (1, 2), (2, 2), (2, 3),
                                                                 (3, 3)}
    for L in range(1, 8):
        for C in range(1, L + 1):
            assert {tuple(int(v) for v in x) for x in np.argwhere(reachable(C, L))} == _every_range(L, C), (L, C)


@pytest.mark.parametrize("devices", [1, 2, 3])
def test_chunk_tables_are_the_full_tables_where_a_split_reaches_and_kept(devices):
    """Against the tables priced over every range (``chunk_memory`` range by range, as before they
    were restricted): equal on every range a split reaches; a second search of the same table (and
    one with recompute chosen per layer, whose tables are the ones without it) reads them kept."""
    from dataclasses import replace

    from stagesplit.plan.engine import resolve
    from stagesplit.plan.scheduled import schedule_problem
    from stagesplit.solver import chunk_cpsat_tables as tables
    from stagesplit.solver.request import RecomputeMode, SolveRequest
    analysis = api.analyze(_stack(_random_widths(1), seed=1))
    request = SolveRequest(devices=devices, targets=("h100-80gb",), schedule="1f1b", micro_batches=4, exact=True)
    resolved = resolve(request, analysis)
    problem = schedule_problem(resolved.model, resolved.inputs, resolved.model.phase_table)
    L = problem.num_layers
    got = tables.memory_tables(problem)
    assert len(problem.table.memo) == 1
    full = _full_tables(problem)
    mask = tables.reachable(devices, L)
    assert set(got) == set(full)
    for name in got:
        assert np.array_equal(got[name][mask], full[name][mask]), name
        assert not got[name][~mask].any()
    again = tables.memory_tables(replace(problem, recompute=RecomputeMode.AUTO))
    assert len(problem.table.memo) == 1
    for name in got:
        assert np.array_equal(again[name], got[name])


def test_chunk_tables_are_shared_between_chunk_counts_and_extended():
    """Interleaved 1F1B at 2 then 3 chunks per device on the same phase table: one kept table, priced
    for the ranges 2 chunks reach and then extended to those 3 reach; each count reads exactly what the
    full tables give where its split reaches and 0 elsewhere, the 3-chunk read after the 2-chunk one
    equal to the 3-chunk tables priced alone; 1F1B keeps a table of its own."""
    from dataclasses import replace

    from stagesplit.plan.engine import resolve
    from stagesplit.plan.scheduled import schedule_problem
    from stagesplit.solver import chunk_cpsat_tables as tables
    from stagesplit.solver.request import SolveRequest
    analysis = api.analyze(_stack([40, 24, 64, 16, 48, 32, 56, 8], seed=2))          # 7 layers

    def problem_of(schedule: str, chunks: int | None, model=None):
        request = SolveRequest(devices=2, targets=("h100-80gb",), schedule=schedule, micro_batches=4, exact=True,
                               chunks_per_rank=chunks)
        resolved = resolve(request, analysis)
        return schedule_problem(resolved.model, resolved.inputs, resolved.model.phase_table), resolved.model
    two, model = problem_of("interleaved-1f1b", 2)
    three, _ = problem_of("interleaved-1f1b", 3)
    assert two.table is three.table and two.num_layers == 7
    got2 = tables.memory_tables(two)
    assert len(two.table.memo) == 1
    got3 = tables.memory_tables(three)
    assert len(two.table.memo) == 1                          # the same table, extended
    kept = next(iter(two.table.memo.values()))
    assert np.array_equal(kept["priced"], tables.reachable(4, 7) | tables.reachable(6, 7))
    full = _full_tables(three)
    for got, chunks in ((got2, 4), (got3, 6)):
        mask = tables.reachable(chunks, 7)
        assert set(got) == set(full)
        for name in got:
            assert np.array_equal(got[name][mask], full[name][mask]), name
            assert not got[name][~mask].any()
    fresh = replace(three, table=replace(three.table, memo={}))
    alone = tables.memory_tables(fresh)
    for name in got3:
        assert np.array_equal(alone[name], got3[name]), name
    tables.memory_tables(problem_of("1f1b", None)[0])
    assert len(two.table.memo) == 2


def _full_tables(problem) -> dict[str, np.ndarray]:
    """Every range priced, the restriction lifted (``reachable`` made all-true)."""
    from stagesplit.solver import chunk_cpsat_tables as tables
    L = problem.num_layers
    full = tables._memory_tables(problem, problem.fixed_choice(), np.triu(np.ones((L, L), bool)))
    del full["priced"]
    return full


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_the_pipeline_memory_floor_is_below_every_splits_fullest_rank(seed, schedule):
    """``pipeline_memory_floor`` against every split of a random stack into pp stages, each simulated
    by the schedule's own memory accounting (the chunk search's evaluation) on the rank's profile
    sharded as each ZeRO stage shards it over 2 ranks, with no recompute and with every layer
    recomputed in full: the fullest rank never holds less than the floor, and the floor is more than
    the mean of the always-live bytes over the stages where it counts the activations in flight."""
    from stagesplit.io.targets import load_target
    from stagesplit.io.topology import node_of
    from stagesplit.model.datasharding import DataLayout
    from stagesplit.plan.engine import resolve
    from stagesplit.plan.layouts import Layout, LayoutRequest, StageBytes, pipeline_memory_floor
    from stagesplit.plan.scheduled import schedule_problem
    from stagesplit.solver.chunk_evaluation import evaluate_chunk_choice
    from stagesplit.solver.request import SolveRequest
    profile = _stack(_random_widths(seed), seed=seed)
    whole = api.analyze(profile)
    sb = StageBytes.of(whole)
    assert sb is not None
    L = whole.layers.num_layers
    req = LayoutRequest(gpus=8, global_batch=64, target=load_target("h100-80gb"), node=node_of("h100-80gb"),
                        micro_batch_size=8, captured_batch=8, schedule=schedule)
    exceeded = 0
    for zero in (0, 1, 2, 3):
        analysis = api.analyze(profile, layout=DataLayout(2, zero))
        for pp in range(2, min(L, 4) + 1):
            for M in (pp, 2 * pp + 1):
                lay = Layout(1, pp, 2, zero, M, micro_batch_size=8)
                floor = pipeline_memory_floor(sb, lay, req)
                request = SolveRequest(devices=pp, targets=("h100-80gb",), schedule=schedule, micro_batches=M,
                                       exact=True, dp=2, zero=zero, runtime_reserve="off")
                resolved = resolve(request, analysis)
                problem = schedule_problem(resolved.model, resolved.inputs, resolved.model.phase_table)
                for inner in itertools.combinations(range(1, L), pp - 1):
                    bounds = (0, *inner, L)
                    for choice in (np.zeros(L, np.int64), np.full(L, 2, np.int64)):
                        fullest = max(r.peak for r in evaluate_chunk_choice(problem, bounds, choice).ranks)
                        assert floor <= fullest, (zero, pp, M, bounds, choice[0])
                mean = sum(float(a.sum()) for a in sb.roles.values()) / pp
                exceeded += floor > mean
    assert exceeded > 0


@pytest.mark.parametrize("ratio", [Fraction(1, 2), Fraction(2), Fraction(4)])
def test_the_pipeline_memory_floor_at_another_micro_batch_size(ratio):
    """The floor at ``ratio`` times the captured micro-batch (its receive buffers from the rank scaled
    to that size, its stash from the captured one) against every split of the scaled rank's profile
    (model/batchscale.py), under 1F1B: never above the fullest rank."""
    from stagesplit.io.targets import load_target
    from stagesplit.io.topology import node_of
    from stagesplit.model.batchscale import scale_batch
    from stagesplit.plan.engine import resolve
    from stagesplit.plan.layouts import Layout, LayoutRequest, StageBytes, pipeline_memory_floor
    from stagesplit.plan.scheduled import schedule_problem
    from stagesplit.solver.chunk_evaluation import evaluate_chunk_choice
    from stagesplit.solver.request import SolveRequest
    profile = _stack([64, 256, 128, 256, 64, 64], batch=8)
    scaled = scale_batch(profile, ratio)
    sb = StageBytes.of(api.analyze(profile), api.analyze(scaled))
    L = 5
    req = LayoutRequest(gpus=4, global_batch=64, target=load_target("h100-80gb"), node=node_of("h100-80gb"),
                        micro_batch_size=int(8 * ratio), captured_batch=8)
    analysis = api.analyze(scaled)
    for pp in (2, 3):
        M = 2 * pp
        floor = pipeline_memory_floor(sb, Layout(1, pp, 1, 0, M, micro_batch_size=int(8 * ratio)), req)
        assert floor > 0
        request = SolveRequest(devices=pp, targets=("h100-80gb",), schedule="1f1b", micro_batches=M, exact=True,
                               runtime_reserve="off")
        resolved = resolve(request, analysis)
        problem = schedule_problem(resolved.model, resolved.inputs, resolved.model.phase_table)
        for inner in itertools.combinations(range(1, L), pp - 1):
            for choice in (np.zeros(L, np.int64), np.full(L, 2, np.int64)):
                fullest = max(r.peak for r in evaluate_chunk_choice(problem, (0, *inner, L), choice).ranks)
                assert floor <= fullest, (pp, inner)


def test_the_pipeline_memory_floor_by_hand():
    """Three layers of 10 parameter bytes (and 20 of optimizer state, 1 ZeRO-sharded over 2 ranks: 10
    each), 5 bytes crossing each inner cut either way, a net stash of 4 bytes a layer, 2 micro-batches
    on 2 stages. 1F1B: stage 0 holds one micro-batch's stash besides the running one's, stage 1 none;
    [0 | 1 2]: 20 + 2 x 5 + 4 = 34 and 40 + 2 x 5 = 50; [0 1 | 2]: 40 + 10 + 8 = 58 and 20 + 10 = 30:
    the floor is 50. GPipe: both hold one more; [0 | 1 2]: 34 and 58, [0 1 | 2]: 58 and 34: 58.
    One stage: nothing (the mean floor's case)."""
    from stagesplit.io.targets import load_target
    from stagesplit.io.topology import node_of
    from stagesplit.plan.layouts import Layout, LayoutRequest, StageBytes, pipeline_memory_floor
    L = 3
    first, last = np.arange(L)[:, None], np.arange(L)[None, :]
    sb = StageBytes(roles={"param": np.full(L, 10.0), "grad": np.zeros(L), "state": np.full(L, 20.0),
                           "other": np.zeros(L)},
                    stash=np.where(last >= first, 4.0 * (last - first + 1), 0.0),
                    forward_cut=np.array([0.0, 5, 5, 0]), backward_cut=np.array([0.0, 5, 5, 0]))
    for schedule, expected in (("1f1b", 50), ("gpipe", 58)):
        req = LayoutRequest(gpus=4, global_batch=4, target=load_target("h100-80gb"), node=node_of("h100-80gb"),
                            schedule=schedule)
        assert pipeline_memory_floor(sb, Layout(1, 2, 2, 1, 2), req) == pytest.approx(expected)
        assert pipeline_memory_floor(sb, Layout(1, 1, 4, 1, 1), req) == 0.0


def test_the_search_orders_items_by_bubble_and_forced_recompute_by_hand():
    """``order_estimate`` (the order the layout search takes items up in) by hand: 1F1B adds nothing
    to its floor while everything fits; interleaved 1F1B with v chunks adds (pp - 1) / (v pp) of a
    micro-batch's work and collectives with M >= pp, 1F1B's (pp - 1) / pp with fewer; where a stage's
    activations in flight exceed the room its always-live bytes leave, the share of what recompute can
    save that must go reruns that share of the stage's forwards (a third of its work)."""
    from stagesplit.plan.layouts import Layout, order_estimate
    GiB = 2**30
    one = Layout(tp=1, pp=4, dp=1, zero=0, micro_batches=8)
    k, x = 4.0, 0.4
    assert order_estimate(one, 10.0, k, x, 8 * GiB, 6 * GiB, 20 * GiB, 80 * GiB) == 10.0   # 4 x 2 GiB fit
    looped = Layout(tp=1, pp=4, dp=1, zero=0, micro_batches=8, schedule="interleaved-1f1b", chunks_per_rank=2)
    assert order_estimate(looped, 10.0, k, x, 8 * GiB, 6 * GiB, 20 * GiB, 80 * GiB) == pytest.approx(
        10.0 + 3 / 8 * 4.4)
    few = Layout(tp=1, pp=4, dp=1, zero=0, micro_batches=2, schedule="interleaved-1f1b", chunks_per_rank=2)
    assert order_estimate(few, 10.0, k, x, 8 * GiB, 6 * GiB, 20 * GiB, 80 * GiB) == pytest.approx(10.0 + 3 / 4 * 4.4)
    # 1F1B: 4 micro-batches in flight of 40 / 4 = 10 GiB each = 40 GiB beside 60 GiB always live on 80:
    # 20 GiB too many of the 4 x 30 / 4 = 30 GiB recompute saves, two thirds: 2/3 x 8 x 4 / 12
    assert order_estimate(one, 10.0, k, x, 40 * GiB, 30 * GiB, 60 * GiB, 80 * GiB) == pytest.approx(
        10.0 + 2 / 3 * 8 * 4 / 12)
    # interleaved, 2 chunks: 4 x (1 + 3/8) = 5.5 in flight, 55 GiB beside 60: 35 too many of the 41.25 it saves
    assert order_estimate(looped, 10.0, k, x, 40 * GiB, 30 * GiB, 60 * GiB, 80 * GiB) == pytest.approx(
        10.0 + 3 / 8 * 4.4 + 35 / 41.25 * 8 * 4 / 12)
    assert order_estimate(one, 10.0, k, x, 40 * GiB, 10 * GiB, 70 * GiB, 80 * GiB) == pytest.approx(
        10.0 + 8 * 4 / 12)                                        # more than recompute saves: all of it


def test_the_search_order_by_hand():
    """``search_order``: the list's first schedule (one stage counts as it) before the second; within one,
    families by their lowest estimate, a family's micro-batch sizes smallest first, then by estimate (a
    looped schedule's chunk counts); a second schedule's lower estimates do not pull its families ahead."""
    from stagesplit.plan.layouts import Layout, search_order
    one = Layout(1, 1, 4, 3, 2, micro_batch_size=4)                      # one stage: 1F1B's turn
    a4 = Layout(1, 2, 2, 1, 2, micro_batch_size=4, schedule="1f1b", chunks_per_rank=1)
    a2 = Layout(1, 2, 2, 1, 4, micro_batch_size=2, schedule="1f1b", chunks_per_rank=1)
    b = Layout(2, 2, 1, 0, 4, micro_batch_size=4, schedule="1f1b", chunks_per_rank=1)
    i2 = Layout(1, 2, 2, 1, 2, micro_batch_size=4, schedule="interleaved-1f1b", chunks_per_rank=2)
    i3 = Layout(1, 2, 2, 1, 2, micro_batch_size=4, schedule="interleaved-1f1b", chunks_per_rank=3)
    j = Layout(2, 2, 1, 0, 4, micro_batch_size=4, schedule="interleaved-1f1b", chunks_per_rank=2)
    estimates = {one: 5.0, a4: 3.0, a2: 4.0, b: 3.5, i2: 1.0, i3: 0.5, j: 2.0}
    order = search_order(list(estimates), estimates, ("1f1b", "interleaved-1f1b"))
    # 1F1B: family a (lead 3.0: a4's) with its sizes smallest first, then b (3.5), then the one stage (5.0);
    # interleaved: its family of a's degrees (lead 0.5), x3 before x2 by estimate, then j
    assert order == [a2, a4, b, one, i3, i2, j]
    # one schedule: the same rule without turns
    assert search_order([one, a4, a2, b], estimates, ("1f1b",)) == [a2, a4, b, one]
