"""FSDP2 under a pipeline schedule: torch's runtime does not reshard a stage's parameters after a
backward (``stage.py``: ``set_reshard_after_backward(False)`` until the last micro-batch), and the
next forward's ``post_forward`` reshards them. So ``ChunkMemory.unsharded`` is held from each
backward on a chunk to that chunk's next forward (its peak, at its end, no longer holds them), once
however many backwards ran, and not at the optimizer step (the final post-backward reshards).

Hand cases on 1F1B and interleaved 1F1B, the linear forms CP-SAT is built from agreeing with the
action-by-action count on random figures, and CP-SAT's split fitting exactly at its per-rank peaks
with the rule on. The rule against real processes: tests/exporters/test_export_tensor_parallel.py."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from stagesplit.solver.schedule_generation import Op, build_schedule
from stagesplit.solver.schedule_memory import ChunkMemory, memory_signatures, rank_memory


def _memory(chunks: int, resident=100, stash=10, forward=5, backward=7, unsharded=50, optimizer=3) -> ChunkMemory:
    def each(x):
        return np.full(chunks, x, np.int64)
    return ChunkMemory(resident=each(resident), stash=each(stash), weight_stash=each(0), forward_peak=each(forward),
                       backward_peak=each(backward), weight_peak=each(0), optimizer_peak=each(optimizer),
                       full_backward_peak=each(backward), unsharded=each(unsharded))


def test_one_f_one_b_holds_the_parameters_from_a_backward_to_the_next_forward():
    """1F1B on 2 ranks, 3 micro-batches; rank 0 runs F0 F1 BW0 F2 BW1 BW2 (chunk 0 only):
    F0 100+5, F1 100+10+5, BW0 100+2x10-10+7 (after it: 100+10+50), F2 reshards first:
    100+10+5 (after: 100+20), BW1 100+20-10+7 (after: 100+10+50), BW2 100+10+50-10+7 = 157
    (the parameters are already whole: not counted twice); the optimizer step 100+3."""
    schedule = build_schedule("1f1b", 2, 3)
    assert [(a.op, a.micro_batch) for a in schedule.leaves[0]] == [
        (Op.FORWARD, 0), (Op.FORWARD, 1), (Op.FULL_BACKWARD, 0), (Op.FORWARD, 2), (Op.FULL_BACKWARD, 1),
        (Op.FULL_BACKWARD, 2)]
    rank = rank_memory(schedule, _memory(2))[0]
    assert rank.during.tolist() == [105, 115, 117, 115, 117, 157]
    assert rank.after.tolist() == [110, 120, 160, 120, 160, 150]
    assert (rank.optimizer, rank.peak, rank.peak_action) == (103, 157, 5)
    # without the rule the last backward is the first's
    assert rank_memory(schedule, _memory(2, unsharded=0))[0].during.tolist() == [105, 115, 117, 115, 117, 107]


def test_each_chunk_of_a_rank_keeps_its_own_parameters_whole():
    """Interleaved 1F1B, 2 ranks x 2 chunks, 2 micro-batches: rank 0 holds chunks 0 and 2. After
    chunk 2's first backward its parameters stay whole through chunk 0's backward, and both are
    whole at the end; a forward of one chunk reshards only that chunk's."""
    schedule = build_schedule("interleaved-1f1b", 2, 2, 2)
    leaves = schedule.leaves[0]
    memory = _memory(4, resident=0, stash=0, forward=0, backward=0, unsharded=50, optimizer=0)
    rank = rank_memory(schedule, memory)[0]
    whole: set[int] = set()
    for a, during, after in zip(leaves, rank.during, rank.after):
        if a.op is Op.FORWARD:
            whole.discard(a.chunk)
        assert during == 50 * len(whole), (a, during)
        if a.op in (Op.FULL_BACKWARD, Op.BACKWARD_INPUT):
            whole.add(a.chunk)
        assert after == 50 * len(whole), (a, after)
    assert whole == {0, 2} and rank.optimizer == 0


@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(["1f1b", "interleaved-1f1b", "gpipe", "zb-h1", "zbv"]), devices=st.integers(2, 3),
       rounds=st.integers(1, 2), seed=st.integers(0, 2**31 - 1))
def test_the_linear_forms_agree_with_the_action_by_action_count(kind, devices, rounds, seed):
    """What CP-SAT is built from (``memory_signatures(..., unsharded=True)``) gives every rank's
    peak as ``rank_memory`` does, for random figures."""
    schedule = build_schedule(kind, devices, rounds * devices)
    rng = np.random.default_rng(seed)
    C = schedule.chunks

    def figures():
        return rng.integers(0, 1000, C)
    memory = ChunkMemory(resident=figures(), stash=figures(), weight_stash=figures(), forward_peak=figures(),
                         backward_peak=figures(), weight_peak=figures(), optimizer_peak=figures(),
                         full_backward_peak=figures(), retained=figures(), unsharded=figures())
    ranks = rank_memory(schedule, memory)
    for rs, rank in zip(memory_signatures(schedule, unsharded=True), ranks):
        assert rs.peak(memory) == rank.peak


def test_cp_sat_prices_the_rule_as_the_action_by_action_count():
    """A table of four equal layers with 40 bytes of FSDP2 parameters each left unsharded after a
    backward: CP-SAT's split under interleaved 1F1B (2 ranks x 2 chunks, 4 micro-batches) fits at
    exactly the per-rank peaks ``rank_memory`` gives it, and not one byte below on either rank; and
    those peaks count the rule (they exceed the same split's without it)."""
    from dataclasses import replace

    from stagesplit.model.phases import PhaseTable
    from stagesplit.solver.chunk_cpsat import solve_chunks_cpsat
    from stagesplit.solver.chunk_problem import ChunkProblem, chunk_memory

    L = 4

    def ranges(value):
        out = np.zeros((L, L), np.int64)
        for a in range(L):
            for b in range(a, L):
                out[a, b] = value * (b - a + 1)
        return out
    peaks = {k: ranges(3) for k in ("forward", "backward_input", "backward_weight", "full_backward", "optimizer")}
    plain = PhaseTable(resident=ranges(10), stash=ranges(6), weight_stash=ranges(6), peaks=peaks, model_output=0,
                       forward_cut=np.array([0, 8, 8, 8, 0], np.int64), backward_cut=np.array([0, 8, 8, 8, 0], np.int64),
                       layer_times=np.ones((L, 4)), time_unit="seconds")
    table = replace(plain, unsharded_after_backward=np.full(L, 40, np.int64))
    schedule = build_schedule("interleaved-1f1b", 2, 4, 2)
    bounds = (0, 1, 2, 3, 4)
    assert chunk_memory(table, bounds, schedule).unsharded.tolist() == [40, 40, 40, 40]
    peaks_with = np.array([r.peak for r in rank_memory(schedule, chunk_memory(table, bounds, schedule))], np.int64)
    peaks_without = [r.peak for r in rank_memory(schedule, chunk_memory(plain, bounds, schedule))]
    assert all(a > b for a, b in zip(peaks_with, peaks_without))
    solved = solve_chunks_cpsat(ChunkProblem(table=table, schedule=schedule, capacities=peaks_with))
    assert solved.result is not None and solved.result.feasible and tuple(solved.result.bounds) == bounds
    for rank in range(2):
        tight = peaks_with.copy()
        tight[rank] -= 1
        solved = solve_chunks_cpsat(ChunkProblem(table=table, schedule=schedule, capacities=tight))
        assert solved.result is None or not solved.result.feasible
