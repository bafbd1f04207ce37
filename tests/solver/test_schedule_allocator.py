"""Each rank's allocations in the schedule's order (solver/schedule_allocator.py) and the plan's
reserved bytes: one chunk and one micro-batch replays the profile as the stage pricing prices it,
every schedule gives a sequence whose frees follow their allocations, and the plan records, prints,
writes and reads back what the caching allocator reserves."""

import dataclasses
import functools
import json
from pathlib import Path

import numpy as np
import pytest

import stagesplit
from stagesplit.errors import OptionError
from stagesplit.io import load_profile
from stagesplit.layers import group_layers
from stagesplit.model.allocator import AllocatorOptions, replay
from stagesplit.model.costmodel import StageCostModel
from stagesplit.model.stagememory import price_stage, stage_items
from stagesplit.plan.files import plan_document, read_plan, write_plan
from stagesplit.solver.schedule_allocator import cublas_workspaces, rank_events, rank_replays
from stagesplit.solver.schedule_generation import build_schedule

PROFILES = Path(__file__).resolve().parents[2] / "profiles"
MiB = 1 << 20


@functools.cache
def gpt_model():
    p = load_profile(PROFILES / "gpt-captured.stagesplit")
    return StageCostModel(p, group_layers(p))


def test_one_chunk_one_micro_batch_replays_the_stage_as_priced():
    """The whole model as one chunk, one micro-batch: the bytes asked for at the peak are the stage
    pricing's peak (always-live bytes plus the most not-always-live bytes live at one step)."""
    m = gpt_model()
    L = m.num_layers
    (sizes, events), = rank_events(m, [0, L], build_schedule("gpipe", 1, 1))
    r = replay(sizes, events)
    vars_, progs, cols = stage_items(m, 0, L - 1)
    priced = price_stage(m, vars_, progs, cols, 0, L - 1)
    assert r.requested_peak == int(priced.variables.sum())
    # what stays allocated after the step: the always-live bytes and what the profile holds to its end
    assert r.requested_at_end <= r.requested_peak
    assert r.reserved_peak >= r.allocated_peak >= r.requested_peak


def test_micro_batches_free_what_they_allocate():
    """GPipe on one device with 1 and 3 micro-batches: each micro-batch's tensors are freed by its own
    actions, a gradient held to the optimizer is allocated once, so the step ends holding the same bytes;
    three micro-batches in flight ask for more at the peak."""
    m = gpt_model()
    L = m.num_layers
    one = replay(*rank_events(m, [0, L], build_schedule("gpipe", 1, 1))[0])
    three = replay(*rank_events(m, [0, L], build_schedule("gpipe", 1, 3))[0])
    assert three.requested_at_end == one.requested_at_end
    assert three.requested_peak > one.requested_peak


@pytest.mark.parametrize("kind, devices, v", [("gpipe", 2, 1), ("1f1b", 2, 1), ("interleaved-1f1b", 2, 2),
                                              ("looped-bfs", 2, 2), ("zb-h1", 2, 1), ("zbv", 2, 2),
                                              ("dualpipev", 2, 2)])
def test_every_schedule_gives_a_valid_sequence(kind, devices, v):
    """Every free follows its allocation (the replay refuses any other) under every schedule, and the
    workspaces come first and stay."""
    m = gpt_model()
    L = m.num_layers
    C = devices * v
    bounds = np.linspace(0, L, C + 1).round().astype(int)
    schedule = build_schedule(kind, devices, 4, v)
    ws = cublas_workspaces("h100-80gb")
    for sizes, events in rank_events(m, bounds, schedule, ws):
        assert tuple(sizes[:3]) == ws and events[:3].tolist() == [0, 1, 2]
        assert ~0 not in events.tolist() and ~1 not in events.tolist() and ~2 not in events.tolist()
        r = replay(sizes, events)
        assert r.reserved_peak >= r.allocated_peak >= r.requested_peak >= sum(ws)


def test_cublas_workspaces():
    """torch's parseChosenWorkspaceSize: 32 MiB on compute capability 9.0, 8 MiB + 128 KiB before it;
    two streams and cuBLASLt's 1 MiB make the 65 MiB measured per process on an H200."""
    assert sum(cublas_workspaces("h200")) == 65 * MiB
    assert cublas_workspaces("h100-80gb") == (32 * MiB, 32 * MiB, MiB)
    assert cublas_workspaces("a100-80gb") == (8 * MiB + 128 * 1024,) * 2 + (MiB,)


def test_rank_replays_compare_with_the_priced_peak():
    m = gpt_model()
    schedule = build_schedule("1f1b", 2, 2)
    ws = cublas_workspaces("a100-80gb")
    reps = rank_replays(m, [0, 6, 8], schedule, [10**12, 0], AllocatorOptions(), ws)
    # a priced peak above the replay's: the difference (runtime buffers) counted on top of the reserved
    assert reps[0].priced_peak == 10**12 + sum(ws)
    assert reps[0].reserved_bytes == reps[0].replay.reserved_peak + reps[0].priced_peak - reps[0].allocated_bytes
    assert reps[1].unreplayed_bytes == 0 and reps[1].reserved_bytes == reps[1].replay.reserved_peak


@functools.cache
def gpt_plan(**request):
    return stagesplit.solve(PROFILES / "gpt-captured.stagesplit", 2, schedule="1f1b", **request)


def test_a_gpu_plan_records_prints_and_keeps_what_is_reserved(tmp_path):
    plan = gpt_plan()
    m = plan.analysis
    bounds = [s.first_layer for s in plan.stages] + [plan.stages[-1].last_layer + 1]
    reps = rank_replays(m, bounds, build_schedule("1f1b", 2, plan.schedule.micro_batches),
                        [r.peak_bytes for r in plan.schedule.ranks], AllocatorOptions(),
                        cublas_workspaces("a100-80gb"))
    for r, rep in zip(plan.schedule.ranks, reps):
        assert (r.reserved_bytes, r.replayed_bytes) == (rep.reserved_bytes, rep.allocated_bytes)
        assert r.needed_bytes == r.reserved_bytes >= r.peak_bytes
        assert r.fits
    text = plan.summary(plan.inputs.micro_batches, gpu=True)
    line = next(x for x in text.splitlines() if x.startswith("reserved: "))
    most = max(plan.schedule.ranks, key=lambda r: r.needed_bytes / r.capacity_bytes)
    assert f"reserves at most {most.needed_bytes / 2**30:,.2f} GiB on device {most.rank}" in line
    assert f"{(most.capacity_bytes - most.needed_bytes) / 2**30:,.2f} GiB left" in line
    doc = plan_document(plan)
    assert [x["reserved_bytes"] for x in doc["schedule"]["ranks"]] == [r.reserved_bytes for r in plan.schedule.ranks]
    write_plan(plan, tmp_path / "plan.json")
    back = read_plan(tmp_path / "plan.json")
    assert back.schedule.ranks == plan.schedule.ranks
    retried = tuple(dataclasses.replace(r, fits_after_retries=r.rank == 0, allocator_retries=2 + r.rank)
                    for r in plan.schedule.ranks)
    write_plan(dataclasses.replace(plan, schedule=dataclasses.replace(plan.schedule, ranks=retried)),
               tmp_path / "retried.json")
    assert read_plan(tmp_path / "retried.json").schedule.ranks == retried


def test_the_replay_can_be_turned_off_and_follows_the_alloc_conf():
    off = gpt_plan(allocator="off")
    assert all(r.reserved_bytes is None and r.needed_bytes == r.peak_bytes for r in off.schedule.ranks)
    assert not any(x.startswith("reserved: ") for x in off.summary(off.inputs.micro_batches, gpu=True).splitlines())
    expandable = gpt_plan(alloc_conf="expandable_segments:True")
    plain = gpt_plan()
    assert [r.peak_bytes for r in expandable.schedule.ranks] == [r.peak_bytes for r in plain.schedule.ranks]
    assert [r.reserved_bytes for r in expandable.schedule.ranks] != [r.reserved_bytes for r in plain.schedule.ranks]
    with pytest.raises(OptionError, match="alloc_conf.*not modelled"):
        stagesplit.solve(PROFILES / "gpt-captured.stagesplit", 2, schedule="1f1b",
                         alloc_conf="garbage_collection_threshold:0.6")
    with pytest.raises(OptionError, match="allocator"):
        stagesplit.solve(PROFILES / "gpt-captured.stagesplit", 2, schedule="1f1b", allocator="yes")


def test_an_ipu_plan_is_not_replayed():
    plan = stagesplit.solve(PROFILES / "tiny.json", 2, schedule="1f1b")
    assert plan.schedule is None or all(r.reserved_bytes is None for r in plan.schedule.ranks)


def test_a_plan_written_before_the_replay_reads_back(tmp_path):
    """A plan file whose ranks have no reserved bytes (written before the replay): read as not replayed."""
    plan = gpt_plan()
    write_plan(plan, tmp_path / "plan.json")
    doc = json.loads((tmp_path / "plan.json").read_text())
    for rank in doc["schedule"]["ranks"]:
        del rank["reserved_bytes"], rank["replayed_bytes"]
    (tmp_path / "old.json").write_text(json.dumps(doc))
    back = read_plan(tmp_path / "old.json")
    assert back.schedule.ranks == tuple(dataclasses.replace(r, reserved_bytes=None, replayed_bytes=None)
                                        for r in plan.schedule.ranks)


def test_recomputed_layers_hold_less_between_forward_and_backward():
    """GPipe on one device, 4 micro-batches in flight: with every layer recomputed in full, each micro-batch
    lets its layers' own stash go as its forward ends and makes it again in its backward, so the peak asks
    for less, by at most the stash the recompute table says full recompute saves per micro-batch in flight."""
    from stagesplit.model.phases import phase_table
    m = gpt_model()
    L = m.num_layers
    schedule = build_schedule("gpipe", 1, 4)
    plain = replay(*rank_events(m, [0, L], schedule)[0])
    full = replay(*rank_events(m, [0, L], schedule, choice=[2] * L)[0])
    saved = int(phase_table(m).recompute.saved[2].sum())
    assert 0 < plain.requested_peak - full.requested_peak <= 4 * saved
    assert full.requested_at_end == plain.requested_at_end


def test_the_command_line_names_its_flags(capsys, tmp_path):
    from helpers import refused_line, run_cli
    profile = PROFILES / "gpt-captured.stagesplit"
    line = refused_line(capsys, "solve", profile, "--devices", 2, "--schedule", "1f1b",
                        "--alloc-conf", "garbage_collection_threshold:0.6")
    assert line.startswith("--alloc-conf: garbage_collection_threshold is not modelled")
    line = refused_line(capsys, "solve", profile, "--devices", 2, "--schedule", "1f1b", "--alloc-conf",
                        "max_split_size_mb:4")
    assert line.startswith("--alloc-conf: expected at least 20971520 bytes")
    assert "--allocator" in refused_line(capsys, "solve", profile, "--devices", 2, "--allocator", "maybe")
    code, out, _ = run_cli(capsys, "solve", profile, "--devices", 2, "--schedule", "1f1b", "--allocator", "off")
    assert code == 0 and "reserved: " not in out and "the fullest, uses" in out
    code, out, _ = run_cli(capsys, "solve", profile, "--devices", 2, "--schedule", "1f1b")
    assert code == 0 and "\nreserved: torch's caching allocator" in out and "the fullest, reserves" in out


def test_schedule_auto_replays_the_plan_it_keeps():
    plan = stagesplit.solve(PROFILES / "gpt-captured.stagesplit", 2, schedule="auto", micro_batches=4)
    assert plan.candidates and all(r.reserved_bytes is not None for r in plan.schedule.ranks)
    assert all(r.reserved_bytes >= r.replayed_bytes for r in plan.schedule.ranks)


def test_a_rank_over_its_capacity_is_replayed_within_it():
    """A capacity under the reserved estimate: the sequence again with that capacity (less what is not
    replayed), torch's allocator freeing cached blocks and retrying; far too small a capacity runs out."""
    m = gpt_model()
    schedule = build_schedule("1f1b", 2, 4)
    free = rank_replays(m, [0, 6, 8], schedule, [0, 0])
    assert all(r.capped is None and r.fits_after_retries is None for r in free)
    tight = [r.reserved_bytes - 2 * MiB for r in free]
    capped = rank_replays(m, [0, 6, 8], schedule, [0, 0], capacities=tight)
    for r, cap in zip(capped, tight):
        assert r.capped is not None and r.replay == free[r.rank].replay
        if r.fits_after_retries:
            assert r.capped.reserved_peak <= cap and r.capped.retries >= 1 and r.capped.oom_event < 0
        else:
            assert r.capped.oom_event >= 0
    small = rank_replays(m, [0, 6, 8], schedule, [0, 0], capacities=[MiB, MiB])
    assert [r.fits_after_retries for r in small] == [False, False]
    plain = rank_replays(m, [0, 6, 8], schedule, [0, 0], AllocatorOptions(expandable_segments=True),
                         capacities=[MiB, MiB])
    assert all(r.capped is None for r in plain)            # not modelled with expandable segments


def test_the_replay_runs_only_when_the_time_left_covers_it_and_the_plan_says_when_not():
    """The replay is bounded by the solve's deadline: about 6 x tensors x micro-batches events (each
    not-always-live tensor allocated and freed in each phase it lives in, per micro-batch) at
    REPLAY_SECONDS_PER_EVENT each. With no time left the plan keeps its priced peaks and says so, with
    the count; with time, every rank gets its reserved bytes."""
    from stagesplit.common.deadline import Deadline
    from stagesplit.plan.build import REPLAY_SECONDS_PER_EVENT, replay_events_estimate, with_reserved
    plan = stagesplit.solve(PROFILES / "gpt-captured.stagesplit", 2, schedule="1f1b", micro_batches=4)
    assert all(r.reserved_bytes is not None for r in plan.schedule.ranks)
    bare = dataclasses.replace(plan, schedule=dataclasses.replace(plan.schedule, ranks=tuple(
        dataclasses.replace(r, reserved_bytes=None, replayed_bytes=None) for r in plan.schedule.ranks)))
    events = 6 * int(np.count_nonzero(plan.analysis.var_nal)) * 4
    assert replay_events_estimate(bare) == events > 0
    skipped = with_reserved(bare, Deadline.after(0.0))
    assert all(r.reserved_bytes is None for r in skipped.schedule.ranks)
    assert skipped.notes[-1] == (f"reserved memory not replayed: about {events:,} allocator events, more than the "
                                 "0.0 s left allow; the plan's priced peaks stand")
    replayed = with_reserved(bare, Deadline.after(events * REPLAY_SECONDS_PER_EVENT + 60.0))
    assert [r.reserved_bytes for r in replayed.schedule.ranks] == [r.reserved_bytes for r in plan.schedule.ranks]
