"""``--objective devices`` under a pipeline schedule (plan/scheduled.py
``_fewest_devices_under_schedule``): the search tries the device counts the schedule can run with
the given micro-batches (not only the request's count, which 1F1B cannot run with fewer
micro-batches than devices), finds the fewest that fit, and says what it proved about fewer; each
claim is checked by a solve at that count."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import plan_inputs
from stagesplit import api
from stagesplit.errors import OptionError
from stagesplit.plan.scheduled import runnable_device_counts
from stagesplit.solver.schedule_kinds import check_schedule

CAPTURED = Path(__file__).resolve().parents[2] / "profiles" / "gpt-captured.stagesplit"
DEVICE_BYTES = 80 * 2**30          # a100-80gb, the capture's target
MIB = 2**20
#: these tests give every device a fixed memory (the reserve keeps back the rest): nothing more is kept
#: back for the CUDA context and NCCL's buffers, which would differ with the device count tried
OFF = {"runtime_reserve": "off"}


def _solve(devices: int, **request):
    return api.solve(str(CAPTURED), devices, schedule="1f1b", recompute="none", **OFF, **request)


def _fits_exactly(devices: int, micro_batches: int, **request) -> bool:
    """An independent check: the schedule solved at exactly ``devices`` for the step time."""
    plan = _solve(devices, micro_batches=micro_batches, exact=True, **request)
    assert plan.status in ("optimal", "infeasible"), plan.message
    return plan.feasible


@pytest.mark.parametrize("schedule, micro_batches, chunks, layers, expected", [
    # 1F1B: torch's Schedule1F1B needs micro-batches >= devices
    ("1f1b", 4, None, 8, [1, 2, 3, 4]),
    # GPipe: any count, but a stage needs a layer
    ("gpipe", 4, None, 3, [1, 2, 3]),
    # interleaved 1F1B with M = 10: M must be a multiple of max(1, M // P): 3 devices (rounds 3) cannot;
    # 2 chunks per device, 12 layers: at most 6 devices
    ("interleaved-1f1b", 10, 2, 12, [1, 2, 4, 5, 6]),
    # DualPipeV: micro-batches >= 2 x devices
    ("dualpipev", 6, None, 40, [1, 2, 3]),
])
def test_the_counts_a_schedule_can_run_by_hand(schedule, micro_batches, chunks, layers, expected):
    inputs = plan_inputs(32, schedule=schedule, micro_batches=micro_batches, chunks_per_rank=chunks)
    got = runnable_device_counts(inputs, layers)
    assert got == expected
    v = chunks or (2 if schedule == "dualpipev" else 1)
    for n in range(1, 33):                     # against torch's own rules, as check_schedule states them
        try:
            check_schedule(schedule, n, micro_batches, v)
            accepted = n * v <= layers
        except OptionError:
            accepted = False
        assert accepted == (n in got), n


def test_a_defaulted_micro_batch_count_follows_the_devices():
    """No --micro-batches: M = devices, so 1F1B runs on every count (up to the layers)."""
    inputs = plan_inputs(32, schedule="1f1b", micro_batches_auto=True)
    assert runnable_device_counts(inputs, 8) == list(range(1, 9))


def test_issue_34_more_devices_than_micro_batches_finds_the_fewest():
    """The issue's example: --devices 32 --micro-batches 4 with 1F1B answered "no device count up to
    32 can run the schedule"; one device holds the capture (0.32 GiB of 80)."""
    plan = _solve(32, micro_batches=4, objective="devices")
    assert plan.feasible and plan.devices == 1 and len(plan.stages) == 1
    assert "`objective='devices'`: 1 device holds the model" in plan.notes
    assert _fits_exactly(1, 4)


def test_the_fewest_of_several_with_the_fewer_proven_not_to_fit():
    """With 200 MiB per device the capture needs 3 devices; 1 and 2 do not fit, each checked by a
    solve at exactly that count."""
    reserve = DEVICE_BYTES - 200 * MIB
    plan = _solve(32, micro_batches=4, objective="devices", reserve=reserve)
    assert plan.feasible and plan.devices == 3 and plan.status == "optimal"
    assert "`objective='devices'`: 3 devices hold the model; 1 and 2 do not fit (proven by CP-SAT)" in plan.notes
    assert _fits_exactly(3, 4, reserve=reserve)
    assert not _fits_exactly(2, 4, reserve=reserve)
    assert not _fits_exactly(1, 4, reserve=reserve)
    # the split is the fastest on 3 devices: the same step as the exact solve's
    exact = _solve(3, micro_batches=4, exact=True, reserve=reserve)
    assert plan.schedule.step_time == pytest.approx(exact.schedule.step_time, rel=1e-9)


def test_where_no_count_fits_the_message_names_the_counts_tried_and_the_micro_batches():
    """150 MiB per device: none of 1..4 devices fits, and 1F1B with 4 micro-batches cannot run on 5
    or more; the message says both (each claim checked)."""
    reserve = DEVICE_BYTES - 150 * MIB
    plan = _solve(32, micro_batches=4, objective="devices", reserve=reserve)
    assert not plan.feasible
    assert plan.message == ("no split fits on any number of devices up to 32 that 1f1b can run with 4 micro-batches "
                            "(1..4: proven not to fit by CP-SAT); 1f1b runs on at most 4 of them with 4 micro-batches: "
                            "try more micro-batches (to allow more devices), recompute (`recompute='auto'`), another "
                            "schedule or devices with more memory")
    for n in (1, 2, 3, 4):
        assert not _fits_exactly(n, 4, reserve=reserve)
    with pytest.raises(OptionError):
        check_schedule("1f1b", 5, 4, 1)
    # recompute, as suggested, makes it fit (the fewest with it is one device, as below)
    with_recompute = api.solve(str(CAPTURED), 32, schedule="1f1b", micro_batches=4, objective="devices",
                               reserve=reserve, recompute="auto", **OFF)
    assert with_recompute.feasible


def test_where_recompute_was_chosen_the_message_says_so():
    """Recompute left to stagesplit: each count was also tried with recompute chosen per layer.
    70 MiB per device: not even that fits on 1..4 devices (on one, not even the resident bytes)."""
    reserve = DEVICE_BYTES - 70 * MIB
    plan = api.solve(str(CAPTURED), 32, schedule="1f1b", micro_batches=4, objective="devices", reserve=reserve,
                     **OFF)
    assert not plan.feasible
    assert plan.message == ("no split fits on any number of devices up to 32 that 1f1b can run with 4 micro-batches "
                            "(1: the bytes resident all step alone need 2 devices; 2..4: proven not to fit by CP-SAT, "
                            "even with recompute chosen per layer); 1f1b runs on "
                            "at most 4 of them with 4 micro-batches: try more micro-batches (to allow more devices), "
                            "another schedule or devices with more memory")
    for n in (1, 2, 3, 4):
        exact = api.solve(str(CAPTURED), n, schedule="1f1b", micro_batches=4, exact=True, reserve=reserve,
                          recompute="auto", **OFF)
        assert exact.status == "infeasible"
    # the bytes resident all step (the whole model's) need more than one device of 70 MiB, not more than two
    resident = int(api.analyze(str(CAPTURED)).model.phase_table.resident[0, -1])
    assert 70 * MIB < resident <= 2 * 70 * MIB
