"""A GPU plan keeps back the CUDA context and NCCL's buffers (solver/runtime_reserve.py) from every
device before placing layers, records it, prints it, and solves again where what the caching
allocator reserves does not fit."""

import dataclasses
import functools
import json
from pathlib import Path

import pytest

import stagesplit
from stagesplit.io.targets import load_target
from stagesplit.plan.files import plan_document, read_plan, write_plan
from stagesplit.reporting.summary import kept_back_line, solve_text

PROFILES = Path(__file__).resolve().parents[2] / "profiles"
GPT = PROFILES / "gpt-captured.stagesplit"           # captured on an a100-80gb
MiB = 1 << 20
#: on two a100-80gb devices under 1F1B: the context (512 MiB), one neighbour's two-rank communicator and
#: the pipeline group's (16 channels x 4 MiB each)
KEPT_2 = 512 * MiB + 64 * MiB + 64 * MiB


@functools.cache
def plan_on(capacity: int | None = None, **request):
    targets = () if capacity is None else (dataclasses.replace(load_target("a100-80gb"), name="tight",
                                                               bytes_per_tile=capacity),)
    return stagesplit.solve(GPT, 2, schedule="1f1b", targets=targets, **request)


def test_the_solver_uses_capacity_less_what_is_kept_back():
    plan = plan_on()
    kept = plan.inputs.runtime_reserve
    assert kept is not None and kept.setting == "auto" and kept.estimate_bytes == KEPT_2
    assert plan.inputs.options.kept_back == (KEPT_2, KEPT_2)
    device = load_target("a100-80gb").device_bytes
    assert all(r.capacity_bytes == device - KEPT_2 for r in plan.schedule.ranks)
    assert all(s.capacity_bytes == device - KEPT_2 for s in plan.stages)
    # with the request's reserve too, and off
    both = plan_on(reserve=2**30)
    assert all(r.capacity_bytes == device - KEPT_2 - 2**30 for r in both.schedule.ranks)
    off = plan_on(runtime_reserve="off")
    assert off.inputs.runtime_reserve.estimate_bytes == 0
    assert all(r.capacity_bytes == device for r in off.schedule.ranks)
    given = plan_on(runtime_reserve=3 * 2**30)
    assert all(r.capacity_bytes == device - 3 * 2**30 for r in given.schedule.ranks)


def test_a_split_that_fits_only_without_what_is_kept_back_is_not_chosen():
    """The fastest split's fullest device fits a capacity of its peak plus what is kept back, less one byte,
    only when nothing is kept back: with the default, the solver must choose another that fits."""
    free = plan_on(runtime_reserve="off")
    peak = max(r.peak_bytes for r in free.schedule.ranks)
    capacity = peak + KEPT_2 - 1
    without = plan_on(capacity, runtime_reserve="off", allocator="off")
    assert without.split_text == free.split_text                     # it fits when nothing is kept back
    kept = plan_on(capacity, allocator="off")
    assert kept.feasible and kept.split_text != free.split_text
    assert all(r.capacity_bytes == capacity - KEPT_2 and r.peak_bytes <= r.capacity_bytes
               for r in kept.schedule.ranks)
    # the stage-level model (no schedule's actions) keeps it back too
    stage = stagesplit.solve(GPT, 2, targets=(dataclasses.replace(load_target("a100-80gb"), name="tight",
                                                                  bytes_per_tile=capacity),))
    assert all(s.capacity_bytes == capacity - 512 * MiB - 64 * MiB - 64 * MiB for s in stage.stages)


def test_the_printed_line_says_what_the_plan_kept_back():
    plan = plan_on(reserve=2**30)
    kept = plan.inputs.runtime_reserve
    line = kept_back_line(plan)
    device = load_target("a100-80gb").device_bytes
    left = device - kept.cuda_context_bytes - kept.nccl_bytes - 2**30
    assert line == (f"kept back per device: CUDA context {kept.cuda_context_bytes / 2**30:,.2f} GiB, NCCL buffers "
                    f"{kept.nccl_bytes / 2**30:,.2f} GiB ({len(kept.communicators)} communicators), reserve "
                    f"{2**30 / 2**30:,.2f} GiB: {(kept.estimate_bytes + 2**30) / 2**30:,.2f} GiB in all, "
                    f"{left / 2**30:,.2f} GiB of each device left for the plan")
    assert line == ("kept back per device: CUDA context 0.50 GiB, NCCL buffers 0.12 GiB (2 communicators), "
                    "reserve 1.00 GiB: 1.62 GiB in all, 78.38 GiB of each device left for the plan")
    assert left == plan.schedule.ranks[0].capacity_bytes                 # what the plan's headroom is of
    assert line in solve_text(plan, None, gpu=True).splitlines()
    assert kept_back_line(plan_on(runtime_reserve="off")).startswith(
        "kept back per device: nothing for the CUDA context and NCCL's buffers (turned off), reserve 0.00 GiB: "
        "0.00 GiB in all, 80.00 GiB of each device")
    assert kept_back_line(plan_on(runtime_reserve=3 * 2**30)).startswith(
        "kept back per device: 3.00 GiB given in place of the CUDA context and NCCL estimate, reserve 0.00 GiB: "
        "3.00 GiB in all, 77.00 GiB")


def test_an_ipu_plan_keeps_nothing_back():
    plan = stagesplit.solve(PROFILES / "bert-base.stagesplit", 4)
    assert plan.inputs.runtime_reserve is None and plan.inputs.options.kept_back == ()
    assert kept_back_line(plan) is None


def test_plan_files_keep_it_and_older_plans_read_back(tmp_path):
    plan = plan_on()
    write_plan(plan, tmp_path / "plan.json")
    back = read_plan(tmp_path / "plan.json")
    assert back.inputs.runtime_reserve == plan.inputs.runtime_reserve
    assert back.inputs.options.kept_back == plan.inputs.options.kept_back
    assert kept_back_line(back) == kept_back_line(plan)
    doc = plan_document(plan)
    del doc["resolved"]["runtime_reserve"], doc["request"]["runtime_reserve"]      # as written before
    (tmp_path / "old.json").write_text(json.dumps(doc))
    old = read_plan(tmp_path / "old.json")
    assert old.inputs.runtime_reserve is None and old.inputs.options.kept_back == ()
    assert old.schedule.ranks == plan.schedule.ranks
    doc["resolved"]["runtime_reserve"] = {"setting": "sometimes"}
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(stagesplit.StagesplitError, match="resolved.runtime_reserve.setting"):
        read_plan(tmp_path / "bad.json")


def test_a_sweep_keeps_back_each_device_counts_own():
    result = stagesplit.sweep(GPT, [1, 2, 3], schedule="1f1b", time_limit=10)
    by = {row.devices: row.plan.inputs.runtime_reserve for row in result.rows}
    assert len(by[1].communicators) == 0 and by[1].estimate_bytes == 512 * MiB
    assert by[2].estimate_bytes == KEPT_2
    assert by[3].estimate_bytes == 512 * MiB + 2 * 64 * MiB + 2 * 64 * MiB
    for row in result.rows:
        assert row.plan.inputs.options.kept_back == (by[row.devices].estimate_bytes,) * row.devices


def test_solve_again_where_what_the_allocator_reserves_does_not_fit(monkeypatch):
    """A capacity just above the fastest split's priced peak but under what its allocator replay allocates
    (the cuBLAS workspaces come on top): the first plan does not fit, even with retries; the solve keeps
    each device's excess back and solves again, and says so."""
    from stagesplit.plan import engine
    free = plan_on(runtime_reserve=0)
    rank = max(free.schedule.ranks, key=lambda r: r.peak_bytes)
    capacity = rank.peak_bytes + MiB
    assert rank.replayed_bytes > capacity
    monkeypatch.setattr(engine, "REFIT_MIN_SECONDS", 10**9)         # no time for a second solve
    first = plan_on.__wrapped__(capacity, runtime_reserve=0)
    excess = engine._excess(first)
    assert excess[rank.rank] == first.schedule.ranks[rank.rank].needed_bytes - capacity > 0
    assert first.notes[-1] == (f"what the caching allocator reserves does not fit (device {rank.rank} by "
                               f"{excess[rank.rank] / 2**30:,.2f} GiB): not solved again, the time limit leaves too "
                               "little")
    monkeypatch.undo()
    plan = plan_on.__wrapped__(capacity, runtime_reserve=0)
    kept = plan.inputs.runtime_reserve
    assert kept.retry_bytes[rank.rank] >= excess[rank.rank]
    rounds = 1 if kept.retry_bytes == excess else 2
    fits = all(r.fits for r in plan.schedule.ranks)
    assert plan.notes[-1] == (f"what the caching allocator reserves did not fit (device {rank.rank} by "
                              f"{excess[rank.rank] / 2**30:,.2f} GiB): solved again keeping that back too "
                              f"({rounds} time{'' if rounds == 1 else 's'}); "
                              + ("the plan fits what it reserves" if fits else "it still does not fit"))
    assert fits
    # the solver's capacity was the device's less the excess; the plan records the device's own
    assert plan.inputs.options.kept_back == kept.retry_bytes
    assert all(r.capacity_bytes == capacity for r in plan.schedule.ranks)
    assert plan.schedule.ranks[rank.rank].peak_bytes <= capacity - kept.retry_bytes[rank.rank]
    line = kept_back_line(plan)
    assert line.endswith("; solved again keeping back the allocator's excess too: " + ", ".join(
        f"device {i} {b / 2**30:,.2f} GiB" for i, b in enumerate(kept.retry_bytes) if b))


def test_a_sweep_of_a_per_layer_profile_prices_for_each_counts_capacity():
    """A profile without phases: one range table for every count, priced for the largest capacity any count
    has (the fewest communicators); each row's stages have their own count's."""
    result = stagesplit.sweep(PROFILES / "llama-7b-layers.json", [1, 2, 3, 8], schedule="1f1b")
    kept = [row.plan.inputs.runtime_reserve.estimate_bytes for row in result.rows]
    assert kept == [512 * MiB, KEPT_2, 768 * MiB, 768 * MiB]
    device = load_target("a100-80gb").device_bytes
    for row, k in zip(result.rows, kept):
        assert all(s.capacity_bytes == device - k for s in row.plan.stages)
    assert [row.fits for row in result.rows] == [False, True, True, True]


def test_a_second_solve_that_still_does_not_fit_says_so(monkeypatch):
    """A capacity 12 MiB above the fastest split's priced peak: one more solve keeping the first plan's
    excess back is not enough here (the replay of the split it finds passes the device again), and the
    plan says so, as its reserved line does."""
    from stagesplit.plan import engine
    free = plan_on(runtime_reserve=0)
    capacity = max(r.peak_bytes for r in free.schedule.ranks) + 12 * MiB
    monkeypatch.setattr(engine, "REFIT_ROUNDS", 1)
    plan = plan_on.__wrapped__(capacity, runtime_reserve=0)
    assert plan.notes[-1].endswith("solved again keeping that back too (1 time); it still does not fit")
    over = [r for r in plan.schedule.ranks if not r.fits]
    assert over and all(r.needed_bytes > r.capacity_bytes == capacity for r in over)
    worst = max(plan.schedule.ranks, key=lambda r: r.needed_bytes / r.capacity_bytes)
    assert f"does not fit by {(worst.needed_bytes - capacity) / 2**30:,.2f} GiB" in plan.summary(gpu=True)
    monkeypatch.undo()
    again = plan_on.__wrapped__(capacity, runtime_reserve=0)          # with more rounds it does
    assert again.notes[-1].endswith("; the plan fits what it reserves")
    assert all(r.fits for r in again.schedule.ranks)


def test_the_report_says_it_too():
    from stagesplit.reporting.html import report_html
    plan = plan_on()
    assert f'<p class="sub">{kept_back_line(plan)}</p>' in report_html(plan)
