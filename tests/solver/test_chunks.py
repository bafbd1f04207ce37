"""Chunk splits for pipeline schedules (solver/chunk_*.py): the runtime's memory rules by hand,
the step time against the schedule simulator and textbook formulas, and CP-SAT's proven split
against every split tried (the exhaustive oracle) on random layer tables."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import event, given, settings, strategies as st

from stagesplit.model.phases import PhaseTable
from stagesplit.model.recompute import RecomputeTable
from stagesplit.solver.chunk_cpsat import solve_chunks_cpsat
from stagesplit.solver.chunk_evaluation import evaluate_chunk_split, fitting_choice
from stagesplit.solver.chunk_problem import ChunkProblem, chunk_memory
from stagesplit.solver.chunk_search import exhaustive, local_search
from stagesplit.solver.request import Objective, RecomputeMode
from stagesplit.solver.schedule_generation import build_schedule
from stagesplit.solver.schedule_kinds import is_valid
from stagesplit.solver.schedule_simulation import critical_path, simulate

KINDS = ("gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zb-h1", "zbv", "dualpipev")


def recompute_of(saved_selective, saved_full, selective_time, full_time, rerun_full=None) -> RecomputeTable:
    L = len(saved_full)
    zeros = np.zeros(L, np.int64)
    rerun_full = saved_full if rerun_full is None else rerun_full
    return RecomputeTable(saved=np.array([zeros, saved_selective, saved_full], np.int64),
                          rerun=np.array([zeros, saved_selective, rerun_full], np.int64),
                          added=np.array([np.zeros(L), selective_time, full_time], float), time_unit="seconds")


def make_table(resident, stash, weight_extra, peak, cut, times, model_output=0, back_cut=None,
               recompute=None) -> PhaseTable:
    """A table whose range figures add layer by layer (peaks: the largest layer's)."""
    L = len(resident)

    def ranges(values, combine):
        out = np.zeros((L, L), np.int64)
        for a in range(L):
            for b in range(a, L):
                out[a, b] = combine(values[a:b + 1])
        return out
    peaks = {k: ranges(np.asarray(peak) * (i + 1), max) for i, k in
             enumerate(("forward", "backward_input", "backward_weight", "full_backward", "optimizer"))}
    back = cut if back_cut is None else back_cut
    return PhaseTable(resident=ranges(resident, sum), stash=ranges(stash, sum),
                      weight_stash=ranges(np.asarray(stash) + np.asarray(weight_extra), sum), peaks=peaks,
                      model_output=model_output, forward_cut=np.asarray([0, *cut, 0], np.int64),
                      backward_cut=np.asarray([0, *back, 0], np.int64),
                      layer_times=np.asarray(times, float), time_unit="seconds", recompute=recompute)


def test_chunk_memory_runtime_rules_by_hand():
    """Three layers, split 1 | 2 with GPipe and M = 4 micro-batches:
    * the second chunk receives cut[1] = 30 bytes per micro-batch and keeps one buffer each:
      resident 20 + 4 x 30, and its stash does not count the received input again (9 - 30 < 0: 0)
      but keeps the model's output (7);
    * the first chunk keeps a buffer for the gradient it receives (backward cut 5): 10 + 4 x 5;
      it retains what it sends (30 forward) - GPipe waits on sends at the step's end."""
    t = make_table(resident=[10, 12, 8], stash=[100, 4, 5], weight_extra=[1, 1, 1], peak=[3, 3, 3],
                   cut=[30, 40], back_cut=[5, 6], times=np.ones((3, 4)), model_output=7)
    s = build_schedule("gpipe", 2, 4)
    cm = chunk_memory(t, (0, 1, 3), s)
    assert cm.resident.tolist() == [10 + 4 * 5, 20 + 4 * 30]
    assert cm.stash.tolist() == [100, max(9 - 30, 0) + 7]
    assert cm.weight_stash.tolist() == [101, max(11 - 30, 0) + 7]
    assert cm.retained.tolist() == [30 + 0, 0 + 5]          # chunk 1 sends the gradient of its input back
    # zero bubble splits the backward: the table's B and W peaks are priced with the stash and W's
    # inputs held through B (model/phases.py), so they are B's and W's figures as they are
    plain = chunk_memory(t, (0, 1, 2, 3), build_schedule("gpipe", 3, 3))
    # not split: B and W run as one action, so each stands for the whole backward (the table's 4 x 3;
    # its split peaks are then never priced: model/phases.py), nothing of a split's added (the last
    # chunk's output is not held to B's end: 12, not 12 + 7)
    # (W's, less the chunk's input, its receive buffer: 12 - 30 and 12 - 40, clipped at 0)
    assert plain.backward_peak.tolist() == [4 * 3] * 3 and plain.weight_peak.tolist() == [4 * 3, 0, 0]
    zb = chunk_memory(t, (0, 1, 2, 3), build_schedule("zb-h1", 3, 3))
    # the first chunk's B does nothing (the model's input needs no gradient): its figure is the
    # stash it holds; its W runs the whole backward (full backward peak 4 x 3) from that stash
    # the last chunk's B holds the model's output (7) to its end, and lets it go as B ends (torch pops
    # it from the forward cache): its weight stash is max(5 + 1 - 40, 0), without the 7 GPipe keeps
    assert zb.backward_peak.tolist() == [100, 6, 6 + 7]
    assert zb.weight_stash[2] == 0 and chunk_memory(t, (0, 1, 2, 3), build_schedule("gpipe", 3, 3)).weight_stash[2] == 7
    # from B on, the output a chunk sent (cut 30 out of chunk 0, 40 out of chunk 1) is held once, in what
    # the runtime keeps of its send (``retained``): the weight stash does not count it again
    assert zb.stash[0] == 100 and zb.weight_stash[0] == 100 - 30 and zb.weight_peak[0] == 12
    assert zb.retained[0] == 30 and zb.weight_stash[0] + zb.retained[0] == zb.stash[0]
    # W's peak (the table's 3 x 3) holds the chunk's input, which is its receive buffer (resident):
    # taken off, 9 - 30 and 9 - 40, clipped at 0
    assert zb.weight_peak[1:].tolist() == [0, 0]


def test_1f1b_keeps_the_last_chunk_s_output_and_input_gradient_between_micro_batches():
    """Schedule1F1B waits on a send at its next one: the first chunk keeps its last sent output
    (cut 50) and the last chunk its output (9) and sent input gradient (60) through its actions.
    GPipe keeps every send to the step's end (``retained``) instead, and its last chunk holds
    its output (9) through its backward only."""
    t = make_table(resident=[1, 1], stash=[2, 2], weight_extra=[0, 0], peak=[100, 100], cut=[50], back_cut=[60],
                   times=np.ones((2, 4)), model_output=9)
    one = chunk_memory(t, (0, 1, 2), build_schedule("1f1b", 2, 4))
    gpipe = chunk_memory(t, (0, 1, 2), build_schedule("gpipe", 2, 4))
    assert (one.forward_peak - gpipe.forward_peak).tolist() == [50, 9 + 60]
    assert (one.full_backward_peak - gpipe.full_backward_peak).tolist() == [50, 9 + 60 - 9]


def test_a_chunk_s_input_is_its_receive_buffer_and_the_last_chunk_holds_its_output_through_its_backward():
    """Where the backward is not split: the whole-model peaks of a range count its input, which
    is the receive buffer already resident (cut 30 into the second chunk): the transients drop
    it; the last chunk's backward adds its output (7), which the runtime holds through it."""
    t = make_table(resident=[10, 12, 8], stash=[100, 4, 5], weight_extra=[1, 1, 1], peak=[300, 300, 300],
                   cut=[30, 40], back_cut=[5, 6], times=np.ones((3, 4)), model_output=7)
    cm = chunk_memory(t, (0, 1, 3), build_schedule("gpipe", 2, 4))
    assert cm.forward_peak.tolist() == [300, 300 - 30]
    assert cm.full_backward_peak.tolist() == [4 * 300, 4 * 300 - 30 + 7]
    # zero bubble keeps its own rules (measured separately): the transients are the table's
    zb = chunk_memory(t, (0, 1, 3), build_schedule("zb-h1", 2, 4))
    assert zb.forward_peak.tolist() == [300, 300] and zb.full_backward_peak.tolist() == [4 * 300, 4 * 300]


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize("P, M", [(2, 4), (4, 8), (3, 3)])
def test_equal_chunks_take_m_plus_p_minus_1_slots_and_the_optimizer_follows(kind, P, M):
    """Equal stages (F = 1, B = 2 per layer, one layer each): (M + P - 1)(F + B), plus the
    slowest rank's optimizer step after its last action."""
    L = P
    times = np.tile([1.0, 2.0, 0.0, 0.5], (L, 1))
    t = make_table([1] * L, [1] * L, [0] * L, [1] * L, [0] * (L - 1), times)
    prob = ChunkProblem(t, build_schedule(kind, P, M), np.full(P, 10**9))
    r = evaluate_chunk_split(prob, tuple(range(L + 1)))
    # the last rank ends last in GPipe; in 1F1B the first; both after (M + P - 1) x 3, then 0.5
    assert r.step_time == pytest.approx((M + P - 1) * 3 + 0.5)
    assert r.bubble == pytest.approx(1 - (P * (M * 3 + 0.5)) / (P * r.step_time))


@pytest.mark.parametrize("kind, P, M, v", [("interleaved-1f1b", 2, 4, 2), ("zbv", 2, 4, 2), ("zb-h1", 3, 6, 1),
                                           ("dualpipev", 2, 4, 2), ("looped-bfs", 2, 4, 3), ("1f1b", 4, 8, 1)])
def test_critical_path_is_the_simulated_step_and_its_chain_adds_up(kind, P, M, v):
    rng = np.random.default_rng(3)
    s = build_schedule(kind, P, M, v)
    C = s.chunks
    f, b, w = rng.uniform(0.5, 2, C), rng.uniform(0.5, 2, C), rng.uniform(0.2, 1, C)
    t = rng.uniform(0, 0.3, C - 1)
    path = critical_path(s, f, b, w, t)
    assert path.length == pytest.approx(simulate(s, f, b, w, t).step_time)
    ranks = np.asarray(s.chunk_rank)
    crossing = np.where(ranks[:-1] == ranks[1:], 0.0, t)
    chain = path.forward @ f + path.backward_input @ b + path.backward_weight @ w + path.transfers @ crossing
    assert chain == pytest.approx(path.length)
    opt = np.linspace(0.1, 0.4, P)
    with_opt = critical_path(s, f, b, w, t, opt)
    assert with_opt.length >= path.length and with_opt.length <= path.length + opt.max() + 1e-12


# -- the proven split against every split -----------------------------------------------------------------

@st.composite
def problems(draw):
    kind = draw(st.sampled_from(KINDS))
    P = draw(st.integers(1, 3))
    v = {"interleaved-1f1b": draw(st.integers(1, 2)), "looped-bfs": draw(st.integers(1, 2)),
         "zb-h1": draw(st.integers(1, 2)), "zbv": 2, "dualpipev": 2}.get(kind, 1)
    M = draw(st.integers(1, 6))
    if not is_valid(kind, P, M, v):
        M = P * max(v, 1) * 2
        if not is_valid(kind, P, M, v):
            kind, v = "gpipe", 1
    C = P * v
    L = draw(st.integers(C, min(C + 4, 8)))
    ints = st.lists(st.integers(0, 100), min_size=L, max_size=L)
    times = np.asarray(draw(st.lists(st.lists(st.integers(1, 20), min_size=4, max_size=4), min_size=L, max_size=L)),
                       float)
    t = make_table(draw(ints), draw(ints), draw(ints), draw(ints),
                   draw(st.lists(st.integers(0, 50), min_size=L - 1, max_size=L - 1)), times,
                   model_output=draw(st.integers(0, 30)))
    schedule = build_schedule(kind, P, M, v)
    objective = draw(st.sampled_from([Objective.COMPUTE, Objective.MEMORY]))
    loose = ChunkProblem(t, schedule, np.full(P, 10**12))
    peaks = sorted(float(evaluate_chunk_split(loose, b).peaks.max()) for b in _some_splits(L, C))
    cap = int(peaks[draw(st.integers(0, len(peaks) - 1))] * draw(st.sampled_from([0.9, 1.0, 1.1, 1.3, 2.0])))
    return ChunkProblem(t, schedule, np.full(P, max(cap, 1)), seconds_per_byte=draw(st.sampled_from([0.0, 0.05])),
                        objective=objective, time_limit=30.0)


def _some_splits(L, C):
    import itertools
    return [(0, *c, L) for c in itertools.combinations(range(1, L), C - 1)]


@settings(max_examples=120, deadline=None)
@given(problems())
def test_cp_sat_split_is_as_good_as_every_split(problem):
    best = exhaustive(problem)
    solved = solve_chunks_cpsat(problem)
    event(f"{problem.schedule.kind.value}: {'fits' if best is not None else 'no split fits'}")
    if best is None:
        assert solved.result is None or not solved.result.feasible
        return
    assert solved.result is not None and solved.result.feasible and solved.optimal
    got = evaluate_chunk_split(problem, solved.result.bounds)
    assert got.feasible
    if problem.objective is Objective.MEMORY:
        share = lambda r: float(np.max(r.peaks / problem.capacities))  # noqa: E731
        assert share(got) <= share(best) + 1e-6
    else:
        # integer times in the model: equal up to its rounding
        assert got.step_time <= best.step_time * (1 + 1e-6) + 1e-9
    assert solved.bound <= best.key(problem)[1] * (1 + 1e-6) + 1e-9


@settings(max_examples=100, deadline=None)
@given(problems(), st.sampled_from([0.97, 1.03]))
def test_a_step_to_beat_is_refuted_exactly_where_no_split_beats_it(problem, factor):
    """With a cutoff (``--schedule auto``: another schedule's step), CP-SAT ends "slower" where no
    split that fits is faster (the oracle: every split), with a bound at the cutoff; where one is,
    it finds the optimum and proves it, as without a cutoff."""
    problem = replace(problem, objective=Objective.COMPUTE)
    best = exhaustive(problem)
    if best is None:
        solved = solve_chunks_cpsat(replace(problem, cutoff=1.0))
        assert solved.status == "slower" and (solved.result is None or not solved.result.feasible)
        return
    cutoff = best.step_time * factor
    solved = solve_chunks_cpsat(replace(problem, cutoff=cutoff))
    event(f"cutoff x {factor}")
    if factor < 1:
        assert solved.status == "slower" and not solved.optimal
        assert cutoff * (1 - 1e-4) <= solved.bound <= best.step_time     # less the rounding of times
        assert solved.result is None or solved.result.step_time >= best.step_time * (1 - 1e-9)
    else:
        assert solved.optimal and solved.result.feasible
        assert solved.result.step_time <= best.step_time * (1 + 1e-6) + 1e-9


@settings(max_examples=60, deadline=None)
@given(problems())
def test_every_chunk_of_every_split_that_fits_is_in_its_possible_ranges(problem):
    """The ranges CP-SAT may give a chunk (those that fit its device alone) hold every chunk of
    every split that fits."""
    from stagesplit.solver.chunk_cpsat_tables import fits_alone, memory_tables
    from stagesplit.solver.schedule_memory import memory_signatures
    allowed = fits_alone(problem, memory_tables(problem), memory_signatures(problem.schedule))
    fitting = 0
    for bounds in _some_splits(problem.num_layers, problem.chunks):
        if evaluate_chunk_split(problem, bounds).feasible:
            fitting += 1
            assert all(allowed[c, bounds[c], bounds[c + 1] - 1] for c in range(problem.chunks)), bounds
    event(f"{'some' if fitting else 'no'} split fits")


def test_local_search_fits_where_a_split_fits_and_cp_sat_never_loses_to_it():
    rng = np.random.default_rng(0)
    for _trial in range(10):
        L = 8
        t = make_table(rng.integers(0, 50, L), rng.integers(0, 50, L), rng.integers(0, 10, L), rng.integers(0, 20, L),
                       rng.integers(0, 20, L - 1), rng.integers(1, 10, (L, 4)).astype(float), model_output=5)
        prob = ChunkProblem(t, build_schedule("interleaved-1f1b", 2, 4, 2), np.full(2, 10**9))
        quick = local_search(prob)
        proven = solve_chunks_cpsat(prob)
        assert quick.feasible and proven.optimal
        assert proven.result.step_time <= quick.step_time + 1e-9
        assert proven.result.step_time == pytest.approx(exhaustive(prob).step_time, rel=1e-6)


def test_no_split_fits_gives_none_and_the_reason_names_the_rank():
    t = make_table([100, 100, 100], [10, 10, 10], [0, 0, 0], [5, 5, 5], [1, 1], np.ones((3, 4)))
    prob = ChunkProblem(t, build_schedule("1f1b", 2, 2), np.full(2, 150))
    assert exhaustive(prob) is None
    assert solve_chunks_cpsat(prob).result is None
    r = evaluate_chunk_split(prob, (0, 1, 3))
    assert not r.feasible and r.reason.startswith("rank 1 needs ") and "more than its 150" in r.reason


def test_pins_and_layer_limits_are_kept():
    t = make_table([1] * 6, [1] * 6, [0] * 6, [1] * 6, [0] * 5, np.ones((6, 4)))
    prob = ChunkProblem(t, build_schedule("gpipe", 3, 3), np.full(3, 10**9), pinned_splits=(1,), max_layers=3)
    solved = solve_chunks_cpsat(prob)
    assert 1 in solved.result.bounds and max(np.diff(solved.result.bounds)) <= 3
    assert solved.result.bounds == exhaustive(prob).bounds or \
        math.isclose(solved.result.step_time, exhaustive(prob).step_time)


# -- recompute chosen with the split -------------------------------------------------------------------------

def _stash_only_table(stash, forward_times, recompute) -> PhaseTable:
    """Layers that hold only their stash: every transient is the range's stash (the action holds
    its own micro-batch's activations and nothing else), no cuts, nothing resident."""
    L = len(stash)
    sums = np.zeros((L, L), np.int64)
    for a in range(L):
        for b in range(a, L):
            sums[a, b] = sum(stash[a:b + 1])
    zero = np.zeros((L, L), np.int64)
    f = np.asarray(forward_times, float)
    times = np.stack([f, 2 * f, np.zeros(L), np.zeros(L)], axis=1)     # B = 2 F, W inside B, no optimizer
    return PhaseTable(resident=zero, stash=sums, weight_stash=sums,
                      peaks={"forward": sums, "backward_input": sums, "backward_weight": sums, "full_backward": sums,
                             "optimizer": zero},
                      model_output=0, forward_cut=np.zeros(L + 1, np.int64), backward_cut=np.zeros(L + 1, np.int64),
                      layer_times=times, time_unit="seconds", recompute=recompute)


def test_one_layer_must_be_recomputed_and_the_arithmetic_says_which():
    """3 layers, 2 ranks, GPipe with 2 micro-batches, 36 bytes per rank. Stashes 10, 12, 16, of
    which 8, 10, 14 are the layer's own (what full recompute saves and holds again while its
    backward runs) and 2 are kept anyway; full recompute costs the layer's forward again (1, 1.5,
    2; B = 2 F) and is chosen as prefixes (a chunk's first layers). Every transient is the
    chunk's stash, so a rank peaks at its second forward or its first backward: the other
    micro-batch's stash (S - saved) plus the action's, which holds the kept 2s, what the earlier
    layers kept of their own and one layer's own bytes at a time.

    * [0 | 1 2]: rank 1 holds 28 -> 56 bytes. Layer 1 full: stash 18; the forward peaks in
      layer 2 at 4 + 0 + 14 = 18, the backward at 4 + max(kept 14, layer 1's rerun 10) = 18:
      36, fits. Chunk 1: F 3.5, B 7 + 1.5; rank 1's forwards end at 4.5 and 8, its backwards at
      16.5 and 25, rank 0's last (B 2) at 27: step 27. Rank 0: 2 x 10 = 20.
    * [0 1 | 2]: rank 0 holds 22 -> 44 bytes. Layer 0 full: stash 14; the forward peaks in layer
      1 at 4 + 0 + 10 = 14, the backward at 4 + max(10, 8) = 14: 28. Rank 1: 2 x 16 = 32. Chunk
      0 (F 2.5, B 5 + 1), chunk 1 (F 2, B 4): rank 0's forwards end at 5, rank 1's at 7, rank
      1's backwards at 11 and 15, rank 0's at 17 and 23: step 23.
    So: split [0 1 | 2], recompute exactly layer 0 (full), step 23."""
    rc = recompute_of([0, 0, 0], [8, 10, 14], [0, 0, 0], [1, 1.5, 2])
    table = _stash_only_table([10, 12, 16], [1, 1.5, 2], rc)
    problem = ChunkProblem(table, build_schedule("gpipe", 2, 2), np.full(2, 36), recompute=RecomputeMode.AUTO)
    best = exhaustive(problem)
    assert best.bounds == (0, 2, 3) and best.choice == (2, 0, 0) and best.step_time == pytest.approx(23)
    assert best.peaks.tolist() == [28, 32]
    proven = solve_chunks_cpsat(problem)
    assert proven.optimal and proven.result.bounds == (0, 2, 3) and proven.result.choice == (2, 0, 0)
    assert proven.result.step_time == pytest.approx(23)
    # the other split needs the first layer of its second chunk
    other = fitting_choice(problem, (0, 1, 3))
    assert other.feasible and other.choice == (0, 2, 0) and other.step_time == pytest.approx(27)
    assert other.peaks.tolist() == [20, 36]
    # without recompute nothing fits; with full recompute everywhere the best split pays for all three
    assert exhaustive(ChunkProblem(table, problem.schedule, problem.capacities)) is None
    every = exhaustive(ChunkProblem(table, problem.schedule, problem.capacities, recompute=RecomputeMode.FULL))
    assert every.choice == (2, 2, 2) and every.step_time > 23


def test_a_step_to_beat_without_memory_limits_or_recompute_is_refuted_before_recompute_is_tried():
    """The case above (nothing fits without recompute; split [0 1 | 2] with layer 0 recomputed,
    step 23, is optimal). Given a step to beat that no split reaches even without memory limits,
    the solve ends "slower" without the recompute model; given 25, recompute is chosen and the
    optimum proven as without a step to beat; given one between the split's best without memory
    limits and 23, "slower" again, now from the recompute model (with the split it found, 23)."""
    from stagesplit.plan.scheduled import solve_chunks
    rc = recompute_of([0, 0, 0], [8, 10, 14], [0, 0, 0], [1, 1.5, 2])
    table = _stash_only_table([10, 12, 16], [1, 1.5, 2], rc)
    problem = ChunkProblem(table, build_schedule("gpipe", 2, 2), np.full(2, 36))
    unlimited = exhaustive(replace(problem, capacities=np.full(2, 10**12)))
    assert unlimited.step_time < 23 * 0.99
    used, solved = solve_chunks(replace(problem, cutoff=unlimited.step_time * 0.99), None, True)
    assert solved.status == "slower" and used.recompute is RecomputeMode.NONE and solved.result is None
    used, solved = solve_chunks(replace(problem, cutoff=25.0), None, True)
    assert used.recompute is RecomputeMode.AUTO and solved.optimal
    assert solved.result.bounds == (0, 2, 3) and solved.result.choice == (2, 0, 0)
    assert solved.result.step_time == pytest.approx(23)
    cutoff = (unlimited.step_time + 23) / 2
    used, solved = solve_chunks(replace(problem, cutoff=cutoff), None, True)
    assert solved.status == "slower" and not solved.optimal and solved.bound >= cutoff * (1 - 1e-4)
    # what it found on the way (the quick search's split with recompute) is kept, slower than the cutoff
    assert used.recompute is RecomputeMode.AUTO and solved.result.feasible and solved.result.step_time >= cutoff


def test_the_recompute_search_gets_its_second_even_when_the_first_search_spent_the_time():
    """The case above, solved with recompute left to stagesplit and the whole solve's time already
    spent (as a layout search's share can be): the search with recompute still gets its second
    (``Deadline.at_least``) and finds split [0 1 | 2] with layer 0 recomputed. It once got nothing:
    the second was measured against the spent deadline the solve watches. Under the command's final
    deadline (the layout search's end) no second is granted past it."""
    from stagesplit.common.deadline import Deadline, deadline_at
    from stagesplit.plan.scheduled import solve_chunks
    rc = recompute_of([0, 0, 0], [8, 10, 14], [0, 0, 0], [1, 1.5, 2])
    table = _stash_only_table([10, 12, 16], [1, 1.5, 2], rc)
    problem = ChunkProblem(table, build_schedule("gpipe", 2, 2), np.full(2, 36))
    spent = Deadline.after(0.0)
    with deadline_at(spent.at, 0.0):
        used, solved = solve_chunks(problem, None, True, spent)
    assert used.recompute is RecomputeMode.AUTO and solved.result is not None and solved.result.feasible
    assert solved.result.bounds == (0, 2, 3) and solved.result.choice == (2, 0, 0)
    with spent.final(), deadline_at(spent.at, 0.0):
        used, solved = solve_chunks(problem, None, True, spent)
    assert solved.result is None or not solved.result.feasible


@st.composite
def recompute_problems(draw):
    kind = draw(st.sampled_from(["gpipe", "1f1b", "interleaved-1f1b", "zbv"]))
    P = draw(st.integers(1, 2))
    v = 2 if kind in ("interleaved-1f1b", "zbv") else 1
    M = draw(st.integers(1, 4))
    if not is_valid(kind, P, M, v):
        M = 2 * P * v
        if not is_valid(kind, P, M, v):
            kind, v = "gpipe", 1
    C = P * v
    L = draw(st.integers(C, min(C + 2, 5)))
    stash = draw(st.lists(st.integers(1, 60), min_size=L, max_size=L))
    full = [draw(st.integers(0, x)) for x in stash]
    selective = [draw(st.integers(0, x)) for x in full]
    f_times = draw(st.lists(st.integers(1, 9), min_size=L, max_size=L))
    rc = recompute_of(selective, full, [draw(st.integers(0, t)) for t in f_times], f_times,
                      rerun_full=[x + draw(st.integers(0, 5)) for x in full])
    times = np.stack([f_times, [2 * t for t in f_times], [draw(st.integers(0, 5)) for _ in range(L)],
                      [draw(st.integers(0, 3)) for _ in range(L)]], axis=1).astype(float)
    small = st.integers(0, 15)
    t = make_table(draw(st.lists(small, min_size=L, max_size=L)), stash, draw(st.lists(small, min_size=L, max_size=L)),
                   [x + draw(st.integers(0, 10)) for x in stash],
                   draw(st.lists(st.integers(0, 30), min_size=L - 1, max_size=L - 1)), times,
                   model_output=draw(st.integers(0, 20)), recompute=rc)
    schedule = build_schedule(kind, P, M, v)
    # a capacity between what the best split needs with every layer fully recomputed and without
    lowest, highest = (min(float(evaluate_chunk_split(ChunkProblem(t, schedule, np.full(P, 10**12), recompute=mode), b)
                                 .peaks.max()) for b in _some_splits(L, C))
                       for mode in (RecomputeMode.FULL, RecomputeMode.NONE))
    cap = int(lowest + draw(st.sampled_from([-0.1, 0.0, 0.1, 0.3, 0.6])) * (highest - lowest))
    return ChunkProblem(t, schedule, np.full(P, max(cap, 1)), recompute=RecomputeMode.AUTO,
                        objective=draw(st.sampled_from([Objective.COMPUTE, Objective.MEMORY])), time_limit=30.0)


@settings(max_examples=150, deadline=None)
@given(recompute_problems())
def test_cp_sat_recompute_and_split_is_as_good_as_every_split_and_recompute_prefix(problem):
    best = exhaustive(problem)
    solved = solve_chunks_cpsat(problem)
    event(f"{'fits' if best is not None else 'nothing fits'}"
          + (f", {sum(1 for c in best.choice if c)} layers recomputed" if best is not None else ""))
    if best is None:
        assert solved.result is None or not solved.result.feasible
        return
    assert solved.result is not None and solved.result.feasible and solved.optimal
    got = evaluate_chunk_split(problem, solved.result.bounds, solved.result.choice)
    assert got.feasible
    if problem.objective is Objective.MEMORY:
        share = lambda r: float(np.max(r.peaks / problem.capacities))  # noqa: E731
        assert share(got) <= share(best) + 1e-6
    else:
        assert got.step_time <= best.step_time * (1 + 1e-6) + 1e-9


@settings(max_examples=80, deadline=None)
@given(recompute_problems())
def test_with_recompute_chosen_every_chunk_of_every_split_and_prefixes_that_fit_is_in_its_possible_ranges(problem):
    """With AUTO recompute, the ranges CP-SAT may give a chunk are those that fit its device alone
    with the most bytes its recompute prefixes can save taken off: every chunk of every split and
    prefix choice that fits (the oracle's own enumeration) is among them."""
    from stagesplit.solver.chunk_cpsat_tables import fits_alone, memory_tables
    from stagesplit.solver.chunk_evaluation import evaluate_chunk_choice
    from stagesplit.solver.chunk_search import _prefix_choices
    from stagesplit.solver.schedule_memory import memory_signatures
    allowed = fits_alone(problem, memory_tables(problem), memory_signatures(problem.schedule))
    fitting = 0
    for bounds in _some_splits(problem.num_layers, problem.chunks):
        for choice in _prefix_choices(problem, bounds):
            if evaluate_chunk_choice(problem, bounds, choice).feasible:
                fitting += 1
                assert all(allowed[c, bounds[c], bounds[c + 1] - 1] for c in range(problem.chunks)), (bounds, choice)
    event(f"{'some' if fitting else 'no'} split fits; {int(allowed.sum())} ranges allowed")


def test_a_range_whose_stash_recompute_cannot_bring_under_the_device_is_left_out():
    """Two layers of stash 10 per micro-batch, of which 2 are their own (what full recompute saves
    and holds again in the backward) and 8 kept anyway; a third of stash 5, own 2. GPipe on 2 ranks,
    2 micro-batches, 30 bytes each, nothing resident. Chunk 0 holding layers 0..1 keeps at least
    20 - 4 = 16 bytes per micro-batch whatever its prefixes, and GPipe runs both forwards before a
    backward: at least 32 > 30 (the bound takes 4 off the forward's transient of 20 too). So that
    range is left out of chunk 0's (with resident bytes alone, nothing is), and indeed no recompute
    choice fits split [0 1 | 2]: with both layers full, the second forward holds the first's 16,
    its own 16 and the running layer's own 2 again, 34. Chunk 0 holding layer 0 alone is kept."""
    from stagesplit.solver.chunk_cpsat_tables import fits_alone, memory_tables
    from stagesplit.solver.chunk_evaluation import evaluate_chunk_choice
    from stagesplit.solver.chunk_search import _prefix_choices
    from stagesplit.solver.schedule_memory import memory_signatures
    rc = recompute_of([0, 0, 0], [2, 2, 2], [0, 0, 0], [1, 1, 1])
    table = _stash_only_table([10, 10, 5], [1, 1, 1], rc)
    problem = ChunkProblem(table, build_schedule("gpipe", 2, 2), np.full(2, 30), recompute=RecomputeMode.AUTO)
    allowed = fits_alone(problem, memory_tables(problem), memory_signatures(problem.schedule))
    assert not allowed[0, 0, 1] and allowed[0, 0, 0]
    every = [evaluate_chunk_choice(problem, (0, 2, 3), choice) for choice in _prefix_choices(problem, (0, 2, 3))]
    assert len(every) == 6 and not any(r.feasible for r in every)
    assert min(int(r.peaks[0]) for r in every) == 16 + 16 + 2
    assert evaluate_chunk_choice(problem, (0, 2, 3), np.array([2, 2, 0])).peaks[0] == 16 + 16 + 2


def test_a_v_s_turn_keeps_nothing_the_runtime_sends_only_to_other_ranks():
    """ZBV, P = 2: rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2 (the V's turn). Four layers,
    one per chunk, forward cuts 30 / 40 / 50, backward cuts 5 / 6 / 7. torch's multi-stage runtime
    keeps each send until the step ends, but hands chunk 1's output to chunk 2 (and chunk 2's
    input gradient back to chunk 1) on the same rank without a send (measured on the exported
    pipelines, tests/exporters/test_export_hf_pipelines.py). So, per backward:
    * chunk 0 sends its output on to rank 1: 30; nothing back (the first chunk);
    * chunk 1 sends its input gradient back to rank 0: 5; its output stays on rank 1;
    * chunk 2 sends its output on to rank 0: 50; its input gradient stays on rank 1;
    * chunk 3 sends its input gradient back to rank 1: 7; nothing on (the last chunk).
    Under GPipe's loop placement (0, 1, 0, 1) every link crosses ranks: 30, 40 + 5, 50 + 6, 7."""
    t = make_table(resident=[10, 12, 8, 9], stash=[3, 4, 5, 6], weight_extra=[1, 1, 1, 1], peak=[3, 3, 3, 3],
                   cut=[30, 40, 50], back_cut=[5, 6, 7], times=np.ones((4, 4)))
    bounds = (0, 1, 2, 3, 4)
    zbv = build_schedule("zbv", 2, 4, 2)
    assert zbv.chunk_rank == (0, 1, 1, 0)
    assert chunk_memory(t, bounds, zbv).retained.tolist() == [30, 5, 50, 7]
    looped = build_schedule("interleaved-1f1b", 2, 4, 2)
    assert looped.chunk_rank == (0, 1, 0, 1)
    assert chunk_memory(t, bounds, looped).retained.tolist() == [30, 40 + 5, 50 + 6, 7]
    # CP-SAT's tables price the split as chunk_memory does: it fits at exactly its per-rank peaks (which
    # the every-link-kept rule exceeds on rank 1, whose links to each other stay on the rank; rank 0's
    # links all cross) and not one byte below either
    from stagesplit.solver.schedule_memory import rank_memory
    peaks = np.array([r.peak for r in rank_memory(zbv, chunk_memory(t, bounds, zbv))], np.int64)
    kept_all = replace(chunk_memory(t, bounds, zbv), retained=np.array([30, 45, 56, 7], np.int64))
    # rank 1 (resident 156 + 196) peaks at its last B (chunk 1, micro-batch 3): three of chunk 1's B have
    # kept their input gradient sent back (3 x 5), all four of chunk 2's their output sent on (4 x 50),
    # and B's own figure is 6 (its W peaks are 0: the table's 9 less the input, the receive buffer)
    assert peaks.tolist() == [399, 156 + 196 + 3 * 5 + 4 * 50 + 6] == [399, 573]
    # keeping every link, its peak is at the first W after all eight B: 4 x 45 + 4 x 56 kept
    assert [r.peak for r in rank_memory(zbv, kept_all)] == [399, 156 + 196 + 4 * 45 + 4 * 56]
    solved = solve_chunks_cpsat(ChunkProblem(table=t, schedule=zbv, capacities=peaks))
    assert solved.result is not None and solved.result.feasible and tuple(solved.result.bounds) == bounds
    for rank in range(2):
        tight = peaks.copy()
        tight[rank] -= 1
        solved = solve_chunks_cpsat(ChunkProblem(table=t, schedule=zbv, capacities=tight))
        assert solved.result is None or not solved.result.feasible


def test_a_split_backward_frees_the_loss_side_as_b_ends_and_a_v_holds_a_tied_embedding_once():
    """Four layers, one per chunk, ZBV on P = 2 (rank 0: chunks 0 and 3; rank 1: chunks 1 and 2).
    * The last layer's B frees 2 bytes of its stash as it ends (the loss's saved log-softmax):
      its weight stash is the table's (stash 6 + W's gradients 1 - 2 = 5, what the table already
      holds); its B peak is the table's (2 x 3, priced with the stash held through B, the 2 bytes
      included); its W peak is the table's less the 2 bytes B let go of and its input, the receive
      buffer (5): 3 x 3 - 2 - 5 = 2.
    * Layer 0 and layer 3 use one tied embedding of 4 bytes (with its gradient and state): the V
      puts chunks 0 and 3 on rank 0, where the stages built from one stack share the tensor, so
      the last chunk's resident is 9 + 4 x 5 received (M = 4, cut 5) - 4 = 25; GPipe's loop
      placement keeps both copies (one per rank) and a table without the sharing keeps it twice too."""
    t = make_table(resident=[10, 12, 8, 9], stash=[3, 4, 5, 6], weight_extra=[1, 1, 1, -1], peak=[3, 3, 3, 3],
                   cut=[5, 5, 5], back_cut=[5, 5, 5], times=np.ones((4, 4)))
    t = replace(t, input_backward_frees=np.array([0, 0, 0, 2], np.int64),
                tied_with_first=np.array([0, 4, 4, 4], np.int64))
    bounds = (0, 1, 2, 3, 4)
    zbv = build_schedule("zbv", 2, 4, 2)
    cm = chunk_memory(t, bounds, zbv)
    assert cm.weight_stash[3] - cm.stash[3] == -1
    # W's peak also takes off the chunk's input, its receive buffer (cut 5, resident)
    assert cm.backward_peak[3] == 2 * 3 and cm.weight_peak[3] == 3 * 3 - 2 - 5
    assert cm.resident.tolist() == [10 + 4 * 5, 12 + 4 * (5 + 5), 8 + 4 * (5 + 5), 9 + 4 * 5 - 4]
    looped = chunk_memory(t, bounds, build_schedule("interleaved-1f1b", 2, 4, 2))
    # not split: B and W are one action, whose figure (the table's 4 x 3) each stands for
    assert looped.resident[3] == 9 + 4 * 5 and looped.backward_peak[3] == 4 * 3
    assert chunk_memory(replace(t, tied_with_first=None), bounds, zbv).resident[3] == 9 + 4 * 5
    # CP-SAT's per-range tables price the V's shared embedding as chunk_memory does
    from stagesplit.solver.chunk_cpsat_tables import memory_tables
    tables = memory_tables(ChunkProblem(table=t, schedule=zbv, capacities=np.full(2, 10 ** 9)))
    assert tables["resident"][3, 3] == 9 + 4 * 5 - 4 and tables["resident"][1, 1] == 12 + 4 * (5 + 5)
    assert tables["backward"][3, 3] == cm.backward_peak[3]


def test_a_v_s_turn_hands_the_output_to_the_next_chunk_s_receive_slot():
    """ZBV, P = 2 (rank 0: chunks 0 and 3; rank 1: chunks 1 and 2), one layer per chunk, stashes
    100 / 120 / 130 / 140, forward cuts 30 / 40 / 50. Chunk 1 hands its output (40 bytes) to chunk 2 on
    its own rank: torch's set_local_fwd_input makes it chunk 2's receive slot for that micro-batch and
    lets go of the tensor the slot held, so chunk 1's forward adds its stash less what it receives (30)
    and less what it hands on (40): 50; every other chunk sends to another rank (or is the last):
    100, 130 - 40 = 90, 140 - 50 = 90. Weight stashes (stash + 1 for W) follow: 101, 51, 91, 91. Under
    interleaved 1F1B's loop placement nothing is handed: 100, 80, 90, 90. CP-SAT's per-range tables
    hold the handed figures, and the chunk solve finds the split exactly at its per-rank peaks."""
    t = make_table(resident=[10, 12, 8, 9], stash=[100, 120, 130, 140], weight_extra=[1, 1, 1, 1],
                   peak=[3, 3, 3, 3], cut=[30, 40, 50], back_cut=[5, 6, 7], times=np.ones((4, 4)))
    bounds = (0, 1, 2, 3, 4)
    zbv = build_schedule("zbv", 2, 4, 2)
    cm = chunk_memory(t, bounds, zbv)
    assert cm.stash.tolist() == [100, 120 - 30 - 40, 130 - 40, 140 - 50]
    # chunk 0's B does nothing; from B on, an output sent to another rank (chunk 0: 30, chunk 2: 50) is
    # held once, in what the runtime keeps of its send, not again in the weight stash
    assert cm.weight_stash.tolist() == [100 - 30, 121 - 30 - 40, 131 - 40 - 50, 141 - 50]
    looped = chunk_memory(t, bounds, build_schedule("interleaved-1f1b", 2, 4, 2))
    assert looped.stash.tolist() == [100, 120 - 30, 130 - 40, 140 - 50]
    from stagesplit.solver.chunk_cpsat_tables import memory_tables
    from stagesplit.solver.schedule_memory import rank_memory
    problem = ChunkProblem(table=t, schedule=zbv, capacities=np.full(2, 10 ** 9))
    tables = memory_tables(problem)
    assert tables["stash_handed"][1, 1] == 50 and tables["stash"][1, 1] == 90
    assert tables["weight_stash_handed"][1, 1] == 51
    peaks = np.array([r.peak for r in rank_memory(zbv, cm)], np.int64)
    solved = solve_chunks_cpsat(ChunkProblem(table=t, schedule=zbv, capacities=peaks))
    assert solved.result is not None and solved.result.feasible and tuple(solved.result.bounds) == bounds
    tight = peaks.copy()
    tight[1] -= 1
    solved = solve_chunks_cpsat(ChunkProblem(table=t, schedule=zbv, capacities=tight))
    assert solved.result is None or not solved.result.feasible


def test_a_crossing_tensor_no_backward_reads_is_held_by_the_forward_cache_not_the_stash():
    """A bfloat16 block whose norm saves a float32 copy of its input reads neither its input nor its
    output in the backward: the table's stashes hold neither (``forward_cut_unstashed``). Three layers,
    split 1 | 2, GPipe, M = 4, cut 30 not stashed: chunk 1's stash (9) has no received input to take
    off, and the last chunk keeps the model's output (7): 16; chunk 0's stash (100) gains the output the
    runtime keeps in its forward cache until the backward (30): 130, which its backward holds too
    (4 x 300 + 30); its weight stash does not (B let go of the output): 101, and the forward peak still
    counts the received input once (chunk 1: 300 - 30). On a V's turn (ZBV, P = 2), chunk 1 hands an
    unstashed output (40) to chunk 2's receive slot: its stash adds the output and the slot takes it off
    again (120 - 30 + 40 - 40 = 90), its weight stash never held it (121 - 30 = 91)."""
    import dataclasses
    t = make_table(resident=[10, 12, 8], stash=[100, 4, 5], weight_extra=[1, 1, 1], peak=[300, 300, 300],
                   cut=[30, 40], back_cut=[5, 6], times=np.ones((3, 4)), model_output=7)
    t = dataclasses.replace(t, forward_cut_unstashed=np.array([0, 30, 0, 0], np.int64))
    cm = chunk_memory(t, (0, 1, 3), build_schedule("gpipe", 2, 4))
    assert cm.stash.tolist() == [100 + 30, 9 + 7]
    assert cm.weight_stash.tolist() == [101, 11 + 7]
    assert cm.full_backward_peak.tolist() == [4 * 300 + 30, 4 * 300 - 30 + 7]
    assert cm.forward_peak.tolist() == [300, 300 - 30]
    v = make_table(resident=[10, 12, 8, 9], stash=[100, 120, 130, 140], weight_extra=[1, 1, 1, 1],
                   peak=[3, 3, 3, 3], cut=[30, 40, 50], back_cut=[5, 6, 7], times=np.ones((4, 4)))
    v = dataclasses.replace(v, forward_cut_unstashed=np.array([0, 0, 40, 0, 0], np.int64))
    zbv = chunk_memory(v, (0, 1, 2, 3, 4), build_schedule("zbv", 2, 4, 2))
    assert zbv.stash.tolist() == [100, 120 - 30 + 40 - 40, 130 - 0, 140 - 50]
    # from B on, an output sent to another rank is held once, in what the runtime keeps of its send
    # (chunk 0: 30, chunk 2: 50); chunk 1's is handed on its own rank, chunk 3 is the last
    assert zbv.weight_stash.tolist() == [100 - 30, 121 - 30, 131 - 50, 141 - 50]
    from stagesplit.solver.schedule_memory import rank_memory
    schedule = build_schedule("zbv", 2, 4, 2)
    peaks = np.array([r.peak for r in rank_memory(schedule, zbv)], np.int64)
    solved = solve_chunks_cpsat(ChunkProblem(table=v, schedule=schedule, capacities=peaks))
    assert solved.result is not None and solved.result.feasible and tuple(solved.result.bounds) == (0, 1, 2, 3, 4)
    tight = peaks.copy()
    tight[1] -= 1
    solved = solve_chunks_cpsat(ChunkProblem(table=v, schedule=schedule, capacities=tight))
    assert solved.result is None or not solved.result.feasible


def test_a_chunk_s_ranges_leave_its_rank_s_other_chunks_their_least_busy_time():
    """Interleaved 1F1B on 2 ranks, 2 chunks each, 4 micro-batches, 7 layers of F = B = W = optimizer = 1 s:
    a range of n layers keeps its device busy 4 x 3 n + n = 13 n s. Under a step to beat of 52 s a
    chunk alone could hold 4 layers (52 s), but its rank's other chunk holds a layer at least (13 s):
    3 layers at most (39 + 13 = 52). Every split whose ranks are each busy 52 s at most keeps each of
    its chunks' ranges (the oracle: all 20 splits); none with a chunk of 4 layers does, and its rank
    is busy 65 s at least."""
    import itertools

    from ortools.sat.python import cp_model

    from stagesplit.solver.chunk_cpsat_model import _chunk_ranges, model_tables
    from stagesplit.solver.schedule_memory import memory_signatures
    L, limit = 7, 52.0
    t = make_table([1] * L, [1] * L, [0] * L, [1] * L, [1] * (L - 1), np.ones((L, 4)))
    problem = ChunkProblem(t, build_schedule("interleaved-1f1b", 2, 4, 2), np.full(2, 10**9))
    tables = model_tables(problem, memory_signatures(problem.schedule), 1000.0)
    m = cp_model.CpModel()
    s = [m.NewIntVar(0, L, f"s{c}") for c in range(5)]
    ranges = _chunk_ranges(m, problem, tables, s, limit)
    kept = [{(int(a), int(b)) for a, b in r.rows} for r in ranges]
    assert max(b - a + 1 for rows in kept for a, b in rows) == 3
    ranks = problem.schedule.chunk_rank
    for inner in itertools.combinations(range(1, L), 3):
        bounds = (0, *inner, L)
        lengths = np.diff(bounds)
        busy = np.bincount(ranks, weights=13.0 * lengths)
        held = all((bounds[c], bounds[c + 1] - 1) in kept[c] for c in range(4))
        if busy.max() <= limit:
            assert held, (bounds, busy)
        if lengths.max() >= 4:
            assert not held and busy.max() >= 65, (bounds, busy)
