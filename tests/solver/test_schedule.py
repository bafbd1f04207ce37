"""stagesplit.solver's schedule modules: validity rules, action lists, the step-time simulator and per-rank
memory.

The action lists are checked against torch itself in tests/test_schedule_torch.py; here they are
checked for their invariants, and the simulator and the memory rule against timelines and
memory traces computed by hand (the arithmetic is in the comments)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from stagesplit.errors import OptionError, StagesplitError
from stagesplit.reporting.schedule_text import timeline_text
from stagesplit.solver.schedule_generation import Action, Op, actions, build_schedule
from stagesplit.solver.schedule_kinds import ScheduleKind, check_schedule, chunk_ranks, is_valid, traits
from stagesplit.solver.schedule_memory import ChunkMemory, memory_signatures, rank_memory
from stagesplit.solver.schedule_simulation import simulate

KINDS = [k.value for k in ScheduleKind]


# --- validity -----------------------------------------------------------------------------------

@pytest.mark.parametrize("kind, P, M, v, parameter, words", [
    ("gpipe", 4, 8, 2, "chunks_per_rank", "gpipe runs one stage per rank (torch's ScheduleGPipe): expected 1, got 2"),
    ("1f1b", 4, 3, 1, "micro_batches", "1f1b needs at least as many micro-batches as ranks (torch's Schedule1F1B): "
                                       "expected >= 4, got 3"),
    ("interleaved-1f1b", 2, 5, 2, "micro_batches", "rounds max(1, M // P) = 2 with 2 ranks"),
    ("zb-h1", 4, 9, 2, "micro_batches", "rounds max(1, M // P) = 2 with 4 ranks (torch's "
                                        "ScheduleInterleavedZeroBubble): got 9"),
    ("zbv", 4, 8, 3, "chunks_per_rank", "exactly 2 chunks per rank (the V shape) (torch's ScheduleZBVZeroBubble): "
                                        "expected 2, got 3"),
    ("dualpipev", 4, 7, 2, "micro_batches", "2 x 4 ranks (torch's ScheduleDualPipeV): expected >= 8, got 7"),
    ("dualpipev", 4, 8, 1, "chunks_per_rank", "expected 2, got 1"),
    ("1f1b", 0, 8, 1, "devices", "expected an integer >= 1, got 0"),
    ("gpipe", 2, 0, 1, "micro_batches", "expected an integer >= 1, got 0"),
    ("looped-bfs", 2, 4, 0, "chunks_per_rank", "expected an integer >= 1, got 0"),
    ("looped-bfs", 2, 2.5, 1, "micro_batches", "expected an integer >= 1, got 2.5"),
    ("pipedream", 2, 4, 1, "schedule", "expected one of gpipe, 1f1b, interleaved-1f1b, looped-bfs, zb-h1, zbv, "
                                       "dualpipev, got 'pipedream'"),
])
def test_invalid_configurations_get_one_line_option_errors(kind, P, M, v, parameter, words):
    with pytest.raises(OptionError) as info:
        check_schedule(kind, P, M, v)
    assert info.value.parameter == parameter
    assert isinstance(info.value, StagesplitError)
    message = str(info.value)
    assert "\n" not in message and words in message, message
    if parameter != "schedule":
        assert not is_valid(kind, P, M, v)


@pytest.mark.parametrize("kind, P, M, v", [
    ("gpipe", 8, 1, 1), ("1f1b", 4, 4, 1), ("interleaved-1f1b", 4, 3, 3),   # M < P: one round of 3
    ("interleaved-1f1b", 4, 10, 1), ("zb-h1", 2, 6, 4), ("looped-bfs", 3, 7, 4), ("zbv", 4, 1, 2),
    ("dualpipev", 4, 8, 2), ("interleaved-1f1b", 1, 7, 2),
])
def test_configurations_torch_accepts_are_valid(kind, P, M, v):
    check_schedule(kind, P, M, v)
    assert is_valid(kind, P, M, v)


def test_traits_say_which_schedules_split_the_backward():
    split = {k for k in KINDS if traits(k).splits_backward}
    assert split == {"zb-h1", "zbv", "dualpipev"}
    assert traits("dualpipev").torch_class == "ScheduleDualPipeV"
    assert traits(ScheduleKind.ZB_H1).torch_class == "ScheduleInterleavedZeroBubble"
    assert {k for k in KINDS if traits(k).fixed_chunks_per_rank == 2} == {"zbv", "dualpipev"}


def test_chunk_placement_loop_and_v():
    assert chunk_ranks("interleaved-1f1b", 3, 2).tolist() == [0, 1, 2, 0, 1, 2]
    assert chunk_ranks("looped-bfs", 2, 4).tolist() == [0, 1, 0, 1, 0, 1, 0, 1]
    # the V: rank r holds chunks r and 2P-1-r
    assert chunk_ranks("zbv", 4, 2).tolist() == [0, 1, 2, 3, 3, 2, 1, 0]
    s = build_schedule("dualpipev", 3, 6)
    assert [s.rank_chunks(r) for r in range(3)] == [(0, 5), (1, 4), (2, 3)]


# --- action lists -------------------------------------------------------------------------------

def test_small_action_lists_written_out():
    def names(kind, P, M, v=None):
        return [" ".join(str(a) for a in rank) for rank in actions(kind, P, M, v)]
    # GPipe: all forwards, then all (full) backwards
    assert names("gpipe", 2, 2) == ["F0@0 F1@0 BW0@0 BW1@0", "F0@1 F1@1 BW0@1 BW1@1"]
    # 1F1B, 3 ranks, 4 micro-batches: rank r warms up with P - r forwards
    assert names("1f1b", 3, 4) == ["F0@0 F1@0 F2@0 BW0@0 F3@0 BW1@0 BW2@0 BW3@0",
                                   "F0@1 F1@1 BW0@1 F2@1 BW1@1 F3@1 BW2@1 BW3@1",
                                   "F0@2 BW0@2 F1@2 BW1@2 F2@2 BW2@2 F3@2 BW3@2"]
    # Looped BFS: chunk by chunk forward; backward in reverse chunk and micro-batch order
    assert names("looped-bfs", 2, 2, 2)[0] == "F0@0 F1@0 F0@2 F1@2 BW1@2 BW0@2 BW1@0 BW0@0"
    # ZB-H1 with one chunk per rank: rank 1's W's wait until one backward (rank + k) later
    assert names("zb-h1", 2, 2, 1) == ["F0@0 F1@0 B0@0 W0@0 B1@0 W1@0", "F0@1 B0@1 F1@1 B1@1 W0@1 W1@1"]
    # DualPipeV on one rank: the overlapped pair is one action of two parts
    (only,) = actions("dualpipev", 1, 2)
    assert " ".join(map(str, only)) == "F0@0 F0@1 F1@0 BW0@1 F1@1+BW0@0 BW1@1 B1@0 W1@0"
    pair = only[4]
    assert pair.op is Op.OVERLAP_F_B and pair.torch_repr() == "(1F1;0B0)OVERLAP_F_B"
    assert [p.op for p in pair.leaves] == [Op.FORWARD, Op.FULL_BACKWARD]
    assert Action(Op.BACKWARD_INPUT, 3, 2).torch_repr() == "3I2"


@settings(max_examples=150)
@given(kind=st.sampled_from(KINDS), P=st.integers(1, 8), M=st.integers(1, 32), v=st.integers(1, 4))
def test_every_chunk_and_micro_batch_runs_each_part_once_in_dependency_order(kind, P, M, v):
    if not is_valid(kind, P, M, v):
        with pytest.raises(OptionError):
            build_schedule(kind, P, M, v)
        return
    s = build_schedule(kind, P, M, v)
    assert s.chunks == P * v and len(s.actions) == P
    for r, leaves in enumerate(s.leaves):
        seen: dict[tuple[int, int], list[Op]] = {}
        for a in leaves:
            assert s.chunk_rank[a.chunk] == r, "an action on a chunk this rank does not hold"
            assert 0 <= a.micro_batch < M
            seen.setdefault((a.chunk, a.micro_batch), []).append(a.op)
        assert set(seen) == {(c, m) for c in s.rank_chunks(r) for m in range(M)}
        for ops in seen.values():
            assert ops in ([Op.FORWARD, Op.FULL_BACKWARD], [Op.FORWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT])
            if not s.traits.splits_backward:
                assert ops == [Op.FORWARD, Op.FULL_BACKWARD]
    simulate(s, np.ones(s.chunks), np.ones(s.chunks), np.ones(s.chunks))   # no deadlock


# --- the simulator: timelines by hand ----------------------------------------------------------

def _spans(sim, rank):
    return list(zip(sim.start[rank].tolist(), sim.end[rank].tolist()))


def test_gpipe_by_hand_with_transfer():
    # P=2, M=2; F = (1, 2), full backward = B = (2, 3), W = 0; transfer 0.5 across the boundary.
    # rank 1: F0 starts when F0@0 ends (1) + 0.5 -> [1.5, 3.5]; F1 at max(3.5, 2 + 0.5) -> [3.5, 5.5]
    #         BW0 after F0 and the rank is free -> [5.5, 8.5]; BW1 -> [8.5, 11.5]
    # rank 0: F0 [0, 1], F1 [1, 2]; BW0 waits for BW0@1 (8.5) + 0.5 -> [9, 11];
    #         BW1 waits for BW1@1 (11.5) + 0.5 -> [12, 14].   step 14
    # busy: rank 0 = 1+1+2+2 = 6, rank 1 = 2+2+3+3 = 10; bubble = 1 - 16 / (2 x 14) = 3/7
    s = build_schedule("gpipe", 2, 2)
    sim = simulate(s, [1, 2], [2, 3], [0, 0], [0.5])
    assert _spans(sim, 0) == [(0, 1), (1, 2), (9, 11), (12, 14)]
    assert _spans(sim, 1) == [(1.5, 3.5), (3.5, 5.5), (5.5, 8.5), (8.5, 11.5)]
    assert sim.step_time == 14 and sim.busy.tolist() == [6, 10]
    assert sim.bubble_fraction == pytest.approx(3 / 7)


def test_one_f_one_b_by_hand():
    # P=2, M=3, F = 1, full backward = 2 on both chunks, no transfer.
    # rank 0 runs F0 F1 BW0 F2 BW1 BW2, rank 1 runs F0 BW0 F1 BW1 F2 BW2.
    # r0 F0 [0,1], F1 [1,2]; r1 F0 [1,2], BW0 [2,4]; r0 BW0 (needs r1's BW0, 4) [4,6], F2 [6,7];
    # r1 F1 (needs r0's F1, 2; free at 4) [4,5], BW1 [5,7], F2 (needs r0's F2, 7) [7,8], BW2 [8,10];
    # r0 BW1 (needs 7) [7,9], BW2 (needs 10) [10,12].  step 12 = (M + P - 1) x (F + B) = 4 x 3
    s = build_schedule("1f1b", 2, 3)
    sim = simulate(s, [1, 1], [2, 2])
    assert _spans(sim, 0) == [(0, 1), (1, 2), (4, 6), (6, 7), (7, 9), (10, 12)]
    assert _spans(sim, 1) == [(1, 2), (2, 4), (4, 5), (5, 7), (7, 8), (8, 10)]
    assert sim.step_time == 12


def test_zero_bubble_by_hand_with_split_backward():
    # zb-h1, P=2, M=2, v=1: rank 0 runs F0 F1 B0 W0 B1 W1, rank 1 runs F0 B0 F1 B1 W0 W1.
    # F = (1, 2), B = (1, 2), W = (1, 1), transfer 0.5.
    # r0 F0 [0,1], F1 [1,2]
    # r1 F0 (1 + 0.5) [1.5,3.5], B0 [3.5,5.5], F1 (needs 2.5; free 5.5) [5.5,7.5], B1 [7.5,9.5],
    #    W0 [9.5,10.5], W1 [10.5,11.5]
    # r0 B0 (needs B0@1 5.5 + 0.5) [6,7], W0 [7,8], B1 (needs 9.5 + 0.5) [10,11], W1 [11,12]. step 12
    # busy 6 and 10: bubble = 1 - 16/24 = 1/3
    s = build_schedule("zb-h1", 2, 2, 1)
    sim = simulate(s, [1, 2], [1, 2], [1, 1], [0.5])
    assert _spans(sim, 0) == [(0, 1), (1, 2), (6, 7), (7, 8), (10, 11), (11, 12)]
    assert _spans(sim, 1) == [(1.5, 3.5), (3.5, 5.5), (5.5, 7.5), (7.5, 9.5), (9.5, 10.5), (10.5, 11.5)]
    assert sim.step_time == 12 and sim.bubble_fraction == pytest.approx(1 / 3)


def test_interleaved_by_hand_every_boundary_crosses_ranks():
    # interleaved-1f1b, P=2, M=2, v=2: chunks 0,2 on rank 0 and 1,3 on rank 1; F = 1, full
    # backward = 2 (B = 2, W = 0) everywhere, transfer 1 on each of the three boundaries.
    # rank 0: F0@0 F1@0 F0@2 F1@2 BW0@2 BW1@2 BW0@0 BW1@0
    # rank 1: F0@1 F1@1 F0@3 BW0@3 F1@3 BW1@3 BW0@1 BW1@1
    # r0 F0@0 [0,1], F1@0 [1,2]; r1 F0@1 (1+1) [2,3], F1@1 (2+1) [3,4]
    # r0 F0@2 (3+1) [4,5], F1@2 (4+1) [5,6]; r1 F0@3 (5+1) [6,7], BW0@3 [7,9], F1@3 (6+1; free 9) [9,10],
    # BW1@3 [10,12]; r0 BW0@2 (9+1) [10,12], BW1@2 (12+1) [13,15]; r1 BW0@1 (12+1) [13,15],
    # BW1@1 (15+1) [16,18]; r0 BW0@0 (15+1) [16,18], BW1@0 (18+1) [19,21].  step 21
    s = build_schedule("interleaved-1f1b", 2, 2, 2)
    sim = simulate(s, [1] * 4, [2] * 4, [0] * 4, [1, 1, 1])
    assert _spans(sim, 0) == [(0, 1), (1, 2), (4, 5), (5, 6), (10, 12), (13, 15), (16, 18), (19, 21)]
    assert _spans(sim, 1) == [(2, 3), (3, 4), (6, 7), (7, 9), (9, 10), (10, 12), (13, 15), (16, 18)]
    assert sim.step_time == 21 and sim.busy.tolist() == [12, 12]


def test_dualpipev_on_one_rank_runs_back_to_back_and_same_rank_transfer_is_free():
    # P=1, M=2: both chunks on rank 0, so the transfer given for boundary 0 does not apply and
    # nothing ever waits: the step is the sum of all work, M x (sum F + sum B + sum W)
    # = 2 x ((1+2) + (3+4) + (5+6)) = 42, with no bubble.
    s = build_schedule("dualpipev", 1, 2)
    sim = simulate(s, [1, 2], [3, 4], [5, 6], [100])
    assert sim.step_time == 42 and sim.bubble_fraction == 0
    # the V's turn (chunks 1 and 2 both on rank 1 of 2) is free too: a huge transfer there
    # changes nothing, one on a real boundary does
    s = build_schedule("zbv", 2, 4)
    base = simulate(s, [1] * 4, [1] * 4, [1] * 4, [0, 0, 0]).step_time
    assert simulate(s, [1] * 4, [1] * 4, [1] * 4, [0, 1000, 0]).step_time == base
    assert simulate(s, [1] * 4, [1] * 4, [1] * 4, [1, 0, 0]).step_time > base


@settings(max_examples=60)
@given(kind=st.sampled_from(["gpipe", "1f1b"]), P=st.integers(1, 8), extra=st.integers(0, 24),
       f=st.integers(1, 20), b=st.integers(1, 20), w=st.integers(0, 20))
def test_equal_stages_gpipe_and_1f1b_take_m_plus_p_minus_1_slots(kind, P, extra, f, b, w):
    M = P + extra
    s = build_schedule(kind, P, M)
    sim = simulate(s, [f] * P, [b] * P, [w] * P)
    assert sim.step_time == (M + P - 1) * (f + b + w)
    assert sim.bubble_fraction == pytest.approx((P - 1) / (M + P - 1))


def _valid_configs():
    return st.tuples(st.sampled_from(KINDS), st.integers(1, 5), st.integers(1, 12), st.integers(1, 3)).filter(
        lambda c: is_valid(*c))


def _durations(C):
    return st.lists(st.integers(0, 30), min_size=C, max_size=C)


@settings(max_examples=120)
@given(data=st.data(), config=_valid_configs())
def test_simulated_timeline_obeys_every_rule(data, config):
    s = build_schedule(*config)
    C = s.chunks
    f, b, w = (np.array(data.draw(_durations(C)), float) for _ in range(3))
    t = np.array(data.draw(_durations(C - 1)), float)
    sim = simulate(s, f, b, w, t)
    end: dict[tuple[str, int, int], float] = {}
    for r, leaves in enumerate(s.leaves):
        for a, _st, en in zip(leaves, sim.start[r], sim.end[r]):
            end["B" if a.op in (Op.BACKWARD_INPUT, Op.FULL_BACKWARD) else a.op.value, a.chunk, a.micro_batch] = en
    cross = [0.0 if s.chunk_rank[c] == s.chunk_rank[c + 1] else t[c] for c in range(C - 1)]
    dur = {Op.FORWARD: f, Op.BACKWARD_INPUT: b, Op.BACKWARD_WEIGHT: w, Op.FULL_BACKWARD: b + w}
    for r, leaves in enumerate(s.leaves):
        free = 0.0
        for a, st_, en in zip(leaves, sim.start[r], sim.end[r]):
            c, m = a.chunk, a.micro_batch
            waits = [free]
            if a.op is Op.FORWARD and c > 0:
                waits.append(end["F", c - 1, m] + cross[c - 1])
            if a.op in (Op.BACKWARD_INPUT, Op.FULL_BACKWARD):
                waits.append(end["F", c, m])
                if c < C - 1:
                    waits.append(end["B", c + 1, m] + cross[c])
            if a.op is Op.BACKWARD_WEIGHT:
                waits.append(end["B", c, m])
            assert st_ == max(waits)                     # starts as soon as it may, not sooner
            assert en - st_ == dur[a.op][c]
            free = en
        busy = sum(dur[a.op][a.chunk] for a in leaves)
        assert sim.busy[r] == pytest.approx(busy)
        assert sim.step_time >= busy
    # one micro-batch's chain: all forwards, all input gradients and every crossing twice
    assert sim.step_time >= f.sum() + b.sum() + 2 * sum(cross) - 1e-9
    assert sim.step_time * s.devices >= sim.busy.sum() - 1e-9


@settings(max_examples=80)
@given(data=st.data(), config=_valid_configs())
def test_step_time_is_monotone_in_every_duration(data, config):
    s = build_schedule(*config)
    C = s.chunks
    arrays = [np.array(data.draw(_durations(C)), float) for _ in range(3)]
    arrays.append(np.array(data.draw(_durations(C - 1)), float))
    base = simulate(s, *arrays).step_time
    which = data.draw(st.integers(0, 3))
    if arrays[which].size == 0:
        return
    i = data.draw(st.integers(0, arrays[which].size - 1))
    bigger = [a.copy() for a in arrays]
    bigger[which][i] += data.draw(st.integers(1, 50))
    assert simulate(s, *bigger).step_time >= base


def test_simulator_refuses_bad_durations():
    s = build_schedule("1f1b", 2, 2)
    with pytest.raises(OptionError, match="forward: expected 2 values"):
        simulate(s, [1, 2, 3], [1, 1])
    with pytest.raises(OptionError, match="backward_input: expected finite values >= 0"):
        simulate(s, [1, 1], [1, -1])
    with pytest.raises(OptionError, match="transfer: expected 1 values"):
        simulate(s, [1, 1], [1, 1], None, [1, 1])


def test_timeline_text_draws_the_simulated_step():
    s = build_schedule("1f1b", 2, 3)
    text = timeline_text(s, simulate(s, [1, 1], [2, 2]))
    # the spans of test_one_f_one_b_by_hand, one column per time unit
    assert text.splitlines() == [
        "rank 0 | F0  F1  .   .   BW0 BW0 F2  BW1 BW1 .   BW2 BW2",
        "rank 1 | .   F0  BW0 BW0 F1  BW1 BW1 F2  BW2 BW2 .   .",
    ]


# --- memory -------------------------------------------------------------------------------------

def _memory(C, **given):
    base = dict(resident=[0] * C, stash=[0] * C, weight_stash=[0] * C, forward_peak=[0] * C,
                backward_peak=[0] * C, weight_peak=[0] * C, optimizer_peak=[0] * C)
    base.update(given)
    return ChunkMemory(**{k: np.array(v, np.int64) for k, v in base.items()})


def test_one_f_one_b_first_stage_peak_at_the_optimizer_step_gets_no_stash_added():
    # The case: 1F1B, 4 ranks, 4 micro-batches; rank 0 runs F0 F1 F2 F3 BW0 BW1 BW2 BW3.
    # Rank 0: resident 100, stash 10, forward peak 12, full backward peak 15, optimizer 60.
    # During F_k: 100 + k x 10 (the k stashes already held) + 12 -> 112, 122, 132, 142
    # During BW0: 100 + 3 x 10 (the other three) + 15 = 145; BW1 135, BW2 125, BW3 115
    # Optimizer step: 100 + 60 = 160, with no stash in flight: the peak. The old rule
    # (one-micro-batch peak 160 + (4 - 1) x 10 = 190) over-predicted by 30.
    s = build_schedule("1f1b", 4, 4)
    mem = _memory(4, resident=[100] * 4, stash=[10] * 4, forward_peak=[12] * 4, backward_peak=[15] * 4,
                  optimizer_peak=[60] * 4)
    r0 = rank_memory(s, mem)[0]
    assert r0.during.tolist() == [112, 122, 132, 142, 145, 135, 125, 115]
    assert r0.after.tolist() == [110, 120, 130, 140, 130, 120, 110, 100]
    assert (r0.optimizer, r0.peak, r0.peak_action) == (160, 160, -1)
    # with a small optimizer transient the peak is the first backward, with 3 other stashes
    mem = _memory(4, resident=[100] * 4, stash=[10] * 4, forward_peak=[12] * 4, backward_peak=[15] * 4,
                  optimizer_peak=[40] * 4)
    r0 = rank_memory(s, mem)[0]
    assert (r0.peak, r0.peak_action, str(s.leaves[0][r0.peak_action])) == (145, 4, "BW0@0")
    # the last rank holds one micro-batch at a time: F0 BW0 F1 BW1 ...
    r3 = rank_memory(s, mem)[3]
    assert r3.during.tolist() == [112, 115] * 4


def test_split_backward_keeps_the_weight_stash_until_w():
    # zb-h1, P=2, M=2: rank 1 runs F0 B0 F1 B1 W0 W1 on chunk 1.
    # resident 50, stash 10, weight stash 4, peaks F 11, B 13, W 6, optimizer 20.
    # F0: 50 + 11 = 61 (after: 60)        B0: own stash excluded: 50 + 13 = 63 (after: 54)
    # F1: 50 + 4 + 11 = 65 (after: 64)    B1: 50 + 4 (mb 0 waits for W) + 13 = 67 (after: 58)
    # W0: 50 + 4 (mb 1's) + 6 = 60 (after: 54)   W1: 50 + 6 = 56 (after: 50)   optimizer 70
    s = build_schedule("zb-h1", 2, 2, 1)
    mem = _memory(2, resident=[0, 50], stash=[0, 10], weight_stash=[0, 4], forward_peak=[0, 11],
                  backward_peak=[0, 13], weight_peak=[0, 6], optimizer_peak=[0, 20])
    r1 = rank_memory(s, mem)[1]
    assert r1.during.tolist() == [61, 63, 65, 67, 60, 56]
    assert r1.after.tolist() == [60, 54, 64, 58, 54, 50]
    assert (r1.peak, r1.peak_action) == (70, -1)
    mem = _memory(2, resident=[0, 50], stash=[0, 10], weight_stash=[0, 4], forward_peak=[0, 11],
                  backward_peak=[0, 13], weight_peak=[0, 6], optimizer_peak=[0, 5])
    assert rank_memory(s, mem)[1].peak_action == 3


def test_sent_tensors_kept_until_the_step_ends_where_torch_keeps_them():
    # GPipe, P=2, M=2, rank 0 (chunk 0): F0 F1 BW0 BW1. resident 100, stash 10, retained 3 (the
    # output chunk 0 sent on, which torch's GPipe keeps until the step ends), F peak 12, BW peak 15.
    # F0: 100 + 12 = 112 (after 110)    F1: 100 + 10 + 12 = 122 (after 120)
    # BW0: 100 + 10 + 15 = 125 (after 100 + 10 + 3 = 113)    BW1: 100 + 3 + 15 = 118 (after 106)
    # optimizer step: 100 + 20, the step is over and nothing is kept
    mem = _memory(2, resident=[100, 0], stash=[10, 0], forward_peak=[12, 0], backward_peak=[15, 0],
                  optimizer_peak=[20, 0], retained=[3, 0])
    r0 = rank_memory(build_schedule("gpipe", 2, 2), mem)[0]
    assert r0.during.tolist() == [112, 122, 125, 118] and r0.after.tolist() == [110, 120, 113, 106]
    assert r0.optimizer == 120
    # 1F1B waits on each send at the next one: nothing is kept (rank 0: F0 F1 BW0 BW1 too)
    r0 = rank_memory(build_schedule("1f1b", 2, 2), mem)[0]
    assert r0.during.tolist() == [112, 122, 125, 115] and r0.after.tolist() == [110, 120, 110, 100]
    assert [k for k in KINDS if not traits(k).keeps_sent] == ["1f1b"]


def test_a_rank_s_optimizer_step_needs_its_largest_chunk_s_temporaries_not_their_sum():
    # Interleaved 1F1B, 2 ranks x 2 chunks: rank 0 holds chunks 0 and 2, rank 1 chunks 1 and 3. Each chunk's
    # resident bytes 1,000, optimizer peaks 300, 500, 200, 400 and nothing else: the step runs one parameter's
    # kernels at a time, so rank 0 peaks at 2,000 + max(300, 200) = 2,300 and rank 1 at 2,000 + max(500, 400)
    # = 2,500 (with the sum, 2,500 and 2,900: measured +11% over a real rank of linear blocks).
    s = build_schedule("interleaved-1f1b", 2, 4, 2)
    assert [list(map(int, np.flatnonzero(np.asarray(s.chunk_rank) == r))) for r in range(2)] == [[0, 2], [1, 3]]
    mem = _memory(4, resident=[1000] * 4, optimizer_peak=[300, 500, 200, 400])
    ranks = rank_memory(s, mem)
    assert [r.optimizer for r in ranks] == [2300, 2500]
    assert [r.peak for r in ranks] == [2300, 2500]
    for sig, want in zip(memory_signatures(s), (2300, 2500)):
        values = sig.values(mem)
        optimizer = [v for v, form in zip(values, sig.signatures) if form.op is None]
        assert optimizer == [want]


def test_full_backward_peak_defaults_to_the_larger_of_b_and_w():
    mem = _memory(2, backward_peak=[5, 1], weight_peak=[3, 9])
    assert mem.full_backward_peak.tolist() == [5, 9]
    explicit = ChunkMemory(**{**{k: getattr(mem, k) for k in ("resident", "stash", "weight_stash", "forward_peak",
                                                               "backward_peak", "weight_peak", "optimizer_peak")},
                              "full_backward_peak": np.array([7, 7])})
    assert explicit.full_backward_peak.tolist() == [7, 7]


def test_memory_refuses_bad_figures():
    with pytest.raises(OptionError, match="stash: expected byte counts >= 0"):
        _memory(2, stash=[1, -1])
    with pytest.raises(OptionError, match="forward_peak: expected 2 integer byte counts"):
        ChunkMemory(*[np.array([1, 2])] * 3, np.array([1.5, 2.0]), *[np.array([1, 2])] * 3)
    with pytest.raises(OptionError, match="memory: expected figures for 4 chunks, got 2"):
        rank_memory(build_schedule("1f1b", 4, 4), _memory(2))


def test_gpipe_signatures_are_the_textbook_ones():
    # GPipe, one chunk per rank (rank 0: F0..F4 BW0..BW4). The worst forward has the M - 1 = 4
    # other stashes (every lighter forward is dominated); backward k has 4 - k other stashes
    # and k backwards' kept sends, a trade-off, so all five stay. Plus the optimizer step.
    sig = memory_signatures(build_schedule("gpipe", 2, 5))[0]
    forms = {(s.op.value if s.op else "opt", s.stashes, s.weight_stashes, s.retained) for s in sig.signatures}
    assert forms == ({("F", (4, 0), (0, 0), (0, 0)), ("opt", (0, 0), (0, 0), (0, 0))}
                     | {("BW", (4 - k, 0), (0, 0), (k, 0)) for k in range(5)})
    # without kept sends (1F1B, M = P = 2: F0 F1 BW0 BW1 on rank 0) one backward form dominates
    sig = memory_signatures(build_schedule("1f1b", 2, 2))[0]
    assert sorted((s.op.value if s.op else "opt", s.stashes) for s in sig.signatures) == [
        ("BW", (1, 0)), ("F", (1, 0)), ("opt", (0, 0))]


def _random_memory(data, C):
    def ints():
        return data.draw(st.lists(st.integers(0, 10**6), min_size=C, max_size=C))
    return ChunkMemory(*(np.array(ints(), np.int64) for _ in range(7)),
                       full_backward_peak=np.array(ints(), np.int64) if data.draw(st.booleans()) else None,
                       retained=np.array(ints(), np.int64) if data.draw(st.booleans()) else None)


@settings(max_examples=150)
@given(data=st.data(), config=st.tuples(st.sampled_from(KINDS), st.integers(1, 6), st.integers(1, 16),
                                        st.integers(1, 4)).filter(lambda c: is_valid(*c)))
def test_signatures_give_the_direct_peak(data, config):
    s = build_schedule(*config)
    mem = _random_memory(data, s.chunks)
    direct = rank_memory(s, mem)
    for r, (rank, sig) in enumerate(zip(direct, memory_signatures(s))):
        assert sig.peak(mem) == rank.peak
        kept = sum(int(mem.retained[c]) * s.micro_batches for c in s.rank_chunks(r)) if s.traits.keeps_sent else 0
        assert rank.after[-1] == rank.resident + kept
        assert rank.resident == int(mem.resident[list(s.rank_chunks(r))].sum())
        values = sig.values(mem)
        # every signature is reached by some action (or the optimizer step): none is made up
        reached = set(rank.during.tolist()) | {rank.optimizer}
        assert set(values.tolist()) <= reached
        for i, a in enumerate(sig.signatures):
            assert not any(j != i and b.dominates(a) for j, b in enumerate(sig.signatures))


@settings(max_examples=60)
@given(data=st.data(), config=_valid_configs())
def test_memory_trace_counts_live_stashes_independently(data, config):
    # an independent count: at each leaf action, which (chunk, micro-batch) pairs have run
    # their F and not their B (full stash), or their B and not their W (weight stash)
    s = build_schedule(*config)
    mem = _random_memory(data, s.chunks)
    for r, rank in enumerate(rank_memory(s, mem)):
        leaves = s.leaves[r]
        for i, a in enumerate(leaves):
            before = leaves[:i]
            fwd = {(x.chunk, x.micro_batch) for x in before if x.op is Op.FORWARD}
            bwd = {(x.chunk, x.micro_batch) for x in before if x.op in (Op.BACKWARD_INPUT, Op.FULL_BACKWARD)}
            split = {(x.chunk, x.micro_batch) for x in before if x.op is Op.BACKWARD_INPUT}
            wgt = {(x.chunk, x.micro_batch) for x in before if x.op is Op.BACKWARD_WEIGHT}
            own = (a.chunk, a.micro_batch)
            stashes = sum(int(mem.stash[c]) for c, m in fwd - bwd if (c, m) != own)
            pending = sum(int(mem.weight_stash[c]) for c, m in split - wgt if (c, m) != own)
            kept = sum(int(mem.retained[c]) for c, m in bwd) if s.traits.keeps_sent else 0
            assert rank.during[i] == rank.resident + stashes + pending + kept + int(mem.transient(a.op)[a.chunk])


def test_largest_configuration():
    s = build_schedule("zb-h1", 8, 32, 4)
    sim = simulate(s, np.ones(32), np.ones(32), np.ones(32), np.full(31, 0.1))
    assert sum(len(x) for x in s.leaves) == 8 * 4 * 32 * 3
    # every rank does 4 x 32 x (F + B + W) = 384 units of work; the bubble is what is left
    assert sim.busy.tolist() == [384.0] * 8
    assert sim.step_time > 384 and 0 < sim.bubble_fraction < 0.2
    assert all(len(r.signatures) >= 4 for r in memory_signatures(s))


# --- docs/schedules.md --------------------------------------------------------------------------

# found from wherever this file sits under tests/ (the test tree may gain subfolders)
DOC = next(p / "docs" / "schedules.md" for p in __import__("pathlib").Path(__file__).resolve().parents
           if (p / "docs" / "schedules.md").is_file())


def test_doc_timelines_are_the_simulated_ones():
    import re
    text = DOC.read_text(encoding="utf-8")
    found = re.findall(r"<!-- timeline: (\S+) (\d+) (\d+) (\d+) -->\n```text\n(.*?)```", text, flags=re.S)
    assert {kind for kind, *_ in found} == set(KINDS)
    for kind, P, M, v, picture in found:
        s = build_schedule(kind, int(P), int(M), int(v))
        C = s.chunks
        sim = simulate(s, np.ones(C), np.ones(C), np.ones(C))
        assert picture.rstrip("\n") == timeline_text(s, sim), kind


def test_doc_python_example_prints_what_it_says(capsys):
    import re
    text = DOC.read_text(encoding="utf-8")
    (block,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    exec(compile(block, str(DOC), "exec"), {"__name__": "doc_example"})   # the doc's own code
    printed = capsys.readouterr().out.splitlines()
    claimed = [line.split("# -> ", 1)[1] for line in block.splitlines() if line.startswith("# -> ")]
    assert printed == claimed
