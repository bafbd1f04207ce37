"""The schedule drawings' figures: from the plan's stages (time split 1:2, memory by category)
through the solver's schedule simulator and per-rank memory, checked against what the cost model
and the pipeline formula say independently."""

from __future__ import annotations

import numpy as np
import pytest

import stagesplit
from helpers import PROFILES
from stagesplit.reporting.timeline import (
    ChunkFigures,
    gantt_figure,
    plan_chunk_figures,
    rank_memory_figure,
    schedule_view,
)
from stagesplit.solver.schedule_kinds import ScheduleKind


@pytest.fixture(scope="module")
def llama_plan():
    return stagesplit.solve(PROFILES / "llama-7b-layers.json", 4, schedule="1f1b")


def test_figures_split_each_stage_one_to_two(llama_plan):
    f = plan_chunk_figures(llama_plan)
    times = np.array([s.time_s for s in llama_plan.stages])
    assert f.unit == "s"
    assert np.allclose(f.forward, times / 3) and np.allclose(f.backward, 2 * times / 3)
    s0 = llama_plan.stages[0].memory_at_worst_tile
    assert f.memory.resident[0] == s0.always_live
    assert f.memory.stash[0] == s0.stashed_copies // 3                     # stage 0 holds 4 in flight


def test_each_ranks_peak_is_the_stages_memory(llama_plan):
    """The schedule's own count of micro-batches in flight (1F1B: rank s holds P - s) and the
    cost model's agree: each rank's peak is its stage's memory."""
    view = schedule_view(llama_plan)
    assert view.schedule.kind is ScheduleKind.ONE_F_ONE_B and view.schedule.devices == 4
    for s, rank in zip(llama_plan.stages, view.memory):
        assert rank.peak == pytest.approx(s.worst_tile_bytes, rel=1e-6)
    assert list(view.capacity) == [s.capacity_bytes for s in llama_plan.stages]


def test_a_balanced_pipeline_takes_m_plus_p_minus_one_stage_times(llama_plan):
    """Equal stages of 3 time units (F 1, B 2), 4 ranks, 4 micro-batches: the step is
    (M + P - 1) x 3 = 21 and the bubble (P - 1) / (M + P - 1) = 3/7."""
    f = plan_chunk_figures(llama_plan)
    equal = ChunkFigures(forward=np.ones(4), backward=2 * np.ones(4), memory=f.memory, unit="s")
    view = schedule_view(llama_plan, equal)
    assert view.simulation.step_time == pytest.approx(21.0)
    assert view.simulation.bubble_fraction == pytest.approx(3 / 7)


def test_the_drawings(llama_plan):
    view = schedule_view(llama_plan)
    gantt = gantt_figure(view)
    bars = [path for c in gantt.axes[0].collections for path in c.get_paths()]     # one collection per rank and op
    assert len(bars) == 4 * 4 * 2                                # 4 ranks x 4 micro-batches x (F, B)
    assert gantt.axes[0].get_xlabel() == "time in one step (ms)"
    memory = rank_memory_figure(view)
    assert memory.axes[0].get_ylabel() == "device memory (GiB)" and len(memory.axes[0].lines) == 4 + 1
    top = max(line.get_ydata().max() for line in memory.axes[0].lines[:4])
    assert top == pytest.approx(llama_plan.worst_memory.worst_tile_bytes / 2**30, rel=1e-6)


def test_a_schedule_that_cannot_run_the_plan_says_why():
    plan = stagesplit.solve(PROFILES / "llama-7b-layers.json", 4, schedule="1f1b", micro_batches=2)
    with pytest.raises(stagesplit.StagesplitError, match="micro"):
        schedule_view(plan)
