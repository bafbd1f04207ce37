"""The searches judge thousands of splits of one schedule, so two of their measures have fast forms
that must equal the slow ones they replace: ``rank_peaks`` (every rank's peak from the schedule's
memory signatures, stacked once) equals ``rank_memory``'s action-by-action peaks, and
``critical_path``'s walk over plain numbers equals ``simulate``'s step (each rank's optimizer step
after its last action) and its chain's own sum. Every schedule kind, random figures."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from stagesplit.solver.schedule_generation import build_schedule
from stagesplit.solver.schedule_kinds import is_valid
from stagesplit.solver.schedule_memory import ChunkMemory, rank_memory, rank_peaks
from stagesplit.solver.schedule_simulation import critical_path, simulate

KINDS = ("gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zb-h1", "zbv", "dualpipev")


@st.composite
def schedules(draw):
    kind = draw(st.sampled_from(KINDS))
    P = draw(st.integers(1, 4))
    v = draw(st.integers(1, 3))
    M = draw(st.integers(1, 8))
    for chunks in (v, 2, 1):
        if is_valid(kind, P, M, chunks):
            return build_schedule(kind, P, M, chunks)
        if is_valid(kind, P, 2 * P * chunks, chunks):
            return build_schedule(kind, P, 2 * P * chunks, chunks)
    return build_schedule("gpipe", P, M)


@settings(max_examples=150, deadline=None)
@given(schedules(), st.integers(0, 2**32 - 1), st.booleans())
def test_rank_peaks_equal_the_action_by_action_peaks(schedule, seed, unsharded):
    rng = np.random.default_rng(seed)
    C = schedule.chunks

    def figures():
        return rng.integers(0, 10**6, C)
    memory = ChunkMemory(figures(), figures(), figures(), figures(), figures(), figures(), figures(),
                         retained=figures(), unsharded=figures() if unsharded else np.zeros(C, np.int64))
    assert rank_peaks(schedule, memory).tolist() == [r.peak for r in rank_memory(schedule, memory)]


@settings(max_examples=150, deadline=None)
@given(schedules(), st.integers(0, 2**32 - 1))
def test_the_critical_path_is_the_simulated_step_and_its_chain_sums_to_it(schedule, seed):
    rng = np.random.default_rng(seed)
    C, P = schedule.chunks, schedule.devices
    f, b, w, opt = rng.random(C), rng.random(C), rng.random(C), rng.random(P)
    t = rng.random(max(C - 1, 0))
    path = critical_path(schedule, f, b, w, t, opt)
    sim = simulate(schedule, f, b, w, t)
    finish = [(float(e[-1]) if len(e) else 0.0) + o for e, o in zip(sim.end, opt)]
    assert path.length == pytest.approx(max(finish), rel=1e-12)
    ranks = np.asarray(schedule.chunk_rank)
    crossing = np.where(ranks[:-1] == ranks[1:], 0.0, t)
    chain = (path.forward @ f + path.backward_input @ b + path.backward_weight @ w + path.transfers @ crossing
             + opt[path.optimizer_rank])
    assert chain == pytest.approx(path.length, rel=1e-9)
