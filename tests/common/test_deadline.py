"""The search's deadline (common/deadline.py) and the loops that check it: outside a block
nothing stops; inside, the schedule's generation, simulation, memory signatures and the searches
stop at it, the searches with the best split they had."""

from __future__ import annotations

import time

import numpy as np
import pytest

from stagesplit.common.deadline import TimeLimitReached, check_deadline, deadline_at, seconds_left, without_deadline
from stagesplit.errors import StagesplitError
from stagesplit.model.phases import PhaseTable
from stagesplit.solver.chunk_cpsat import solve_chunks_cpsat
from stagesplit.solver.chunk_evaluation import evaluate_chunk_split
from stagesplit.solver.chunk_problem import ChunkProblem
from stagesplit.solver.chunk_search import local_search
from stagesplit.solver.schedule_generation import build_schedule
from stagesplit.solver.schedule_memory import memory_signatures, rank_memory
from stagesplit.solver.schedule_simulation import critical_path, simulate

PAST = 0.0           # a deadline on time.monotonic() that has passed


def test_no_deadline_outside_a_block():
    assert seconds_left() == float("inf")
    check_deadline("anything")                      # does not raise


def test_a_passed_deadline_raises_a_one_line_error_naming_the_limit_and_the_work():
    with deadline_at(PAST, 3.0):
        assert seconds_left() == 0.0
        with pytest.raises(TimeLimitReached) as info:
            check_deadline("generating the schedule's actions")
    assert isinstance(info.value, StagesplitError)
    assert str(info.value) == ("no split was found within the time limit (3 s): it was reached while generating the "
                               "schedule's actions; allow more with `time_limit`")
    check_deadline()                                 # the block has ended


def test_a_block_inside_another_keeps_the_earlier_deadline():
    now = time.monotonic()
    with deadline_at(now + 100.0, 100.0):
        with deadline_at(now + 1000.0, 1000.0):      # later: the outer one stands
            assert 99.0 < seconds_left() <= 100.0
        with deadline_at(PAST, 5.0):                 # earlier: it wins, and its limit is named
            with pytest.raises(TimeLimitReached, match=r"time limit \(5 s\)"):
                check_deadline()
            with without_deadline():                 # building the plan after the search
                assert seconds_left() == float("inf")
                check_deadline()
        assert 99.0 < seconds_left() <= 100.0


def test_a_granted_deadline_runs_past_the_block_s_but_never_past_the_command_s_final_one():
    from stagesplit.common.deadline import Deadline
    now = time.monotonic()
    with deadline_at(PAST, 1.0):                     # the solve's own time is spent
        granted = Deadline.after(0.0).at_least(50.0)
        with granted.granted():                      # CP-SAT's floor: the grant stands
            assert 49.0 < seconds_left() <= 50.0
            check_deadline()
        final = Deadline(now + 5.0, 5.0)
        with final.final(), granted.granted():       # the layout search's end caps every grant
            assert 0.0 < seconds_left() <= 5.0
    assert seconds_left() == float("inf")


def _table(L: int) -> PhaseTable:
    """L identical layers: resident 10, stash 3, times 1 / 2 / 1 / 0.1 (F, B, W, optimizer)."""
    i, j = np.triu_indices(L)
    counts = np.zeros((L, L), np.int64)
    counts[i, j] = j - i + 1
    peaks = {k: counts.copy() for k in ("forward", "backward_input", "backward_weight", "full_backward", "optimizer")}
    return PhaseTable(resident=10 * counts, stash=3 * counts, weight_stash=4 * counts, peaks=peaks, model_output=0,
                      forward_cut=np.zeros(L + 1, np.int64), backward_cut=np.zeros(L + 1, np.int64),
                      layer_times=np.tile([1.0, 2.0, 1.0, 0.1], (L, 1)), time_unit="seconds")


def test_every_long_loop_of_the_schedule_stops_at_the_deadline():
    """Past the deadline, each of the schedule's long computations raises; with none, they run."""
    with deadline_at(PAST, 1.0):
        with pytest.raises(TimeLimitReached, match="generating the schedule's actions"):
            build_schedule("interleaved-1f1b", 2, 8, 2)
    s = build_schedule("interleaved-1f1b", 2, 8, 2)
    ones = np.ones(s.chunks)
    with deadline_at(PAST, 1.0):
        with pytest.raises(TimeLimitReached, match="simulating"):
            simulate(s, ones, ones)
        with pytest.raises(TimeLimitReached, match="simulating"):
            critical_path(s, ones, ones)
        with pytest.raises(TimeLimitReached, match="memory signatures"):
            memory_signatures(s)
    problem = ChunkProblem(table=_table(8), schedule=s, capacities=np.full(2, 10**9, np.int64))
    result = evaluate_chunk_split(problem, (0, 2, 4, 6, 8))
    with deadline_at(PAST, 1.0):
        with pytest.raises(TimeLimitReached, match="each device's memory"):
            rank_memory(s, result.memory)
    assert simulate(s, ones, ones).step_time > 0 and len(memory_signatures(s)) == 2


def test_the_searches_return_what_they_had_at_the_deadline():
    """The quick search keeps the split it evaluated first; CP-SAT, given that split as its hint,
    returns it unproven ("time limit"), and with nothing found it returns no split."""
    s = build_schedule("1f1b", 4, 8)
    problem = ChunkProblem(table=_table(12), schedule=s, capacities=np.full(4, 10**9, np.int64), time_limit=60.0)
    balanced = evaluate_chunk_split(problem, (0, 3, 6, 9, 12))
    with deadline_at(time.monotonic() + 0.2, 0.2):
        time.sleep(0.25)
        with pytest.raises(TimeLimitReached):           # nothing evaluated yet: nothing to return
            local_search(problem)
        stopped = solve_chunks_cpsat(problem, hint=balanced)
        assert stopped.status == "time limit" and not stopped.optimal
        assert stopped.result is balanced
        nothing = solve_chunks_cpsat(problem)
        assert nothing.status == "time limit" and nothing.result is None and not nothing.optimal
    proven = solve_chunks_cpsat(problem)
    assert proven.optimal and proven.result.step_time <= balanced.step_time
