"""What a plan says about device counts (issue #34), each sentence checked by solves of its own:
more devices than layers with --exact, micro-batches that follow --devices, and --objective
devices with --exact (the count is given, not searched)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stagesplit import api
from stagesplit.cli import main

LLAMA = Path(__file__).resolve().parents[2] / "profiles" / "llama-7b-layers.json"
LAYERS = 34


def _solve(devices: int, **request):
    return api.solve(str(LLAMA), devices, **request)


def _lines(capsys, *argv) -> dict[str, str]:
    """The plan's lines by their label (``why``, ``status``...), notes joined."""
    assert main(["solve", str(LLAMA), *map(str, argv)]) == 0
    out = capsys.readouterr().out
    lines: dict[str, str] = {}
    for line in out.splitlines():
        label, _, rest = line.partition(": ")
        if label in ("why", "status", "note", "split"):
            lines[label] = (lines[label] + "\n" + rest) if label in lines else rest
    return lines


def test_the_profile_has_34_layers():
    assert len(_solve(2).layer_names) == LAYERS


def test_more_exact_devices_than_layers_says_so_and_what_holds_the_model():
    """--devices 1024 --exact --schedule gpipe said "no split of the 34 layers fits on 1024
    device(s), nor on any number of such devices" although two devices hold it."""
    plan = _solve(1024, exact=True, schedule="gpipe")
    assert not plan.feasible
    assert plan.message == ("34 layers cannot fill exactly 1,024 devices: `exact` puts at least one layer on each; use "
                            "`devices=34` or fewer, or drop `exact`; the fewest `devices` that hold the model is 2 (so "
                            "2 micro-batches), on 2 devices")
    # 34 exact devices (34 micro-batches) do hold it; 2 devices with 2 micro-batches do, 1 with 1 does not
    assert _solve(LAYERS, exact=True, schedule="gpipe").feasible
    two = _solve(2, schedule="gpipe")
    assert two.feasible and len(two.stages) == 2 and two.inputs.options.micro_batches == 2
    assert not _solve(1, schedule="gpipe").feasible


def test_micro_batches_that_follow_the_devices_are_named_as_the_reason():
    """Without --exact, 1,024 devices default to 1,024 micro-batches, all in flight on every
    GPipe stage: no stage count holds that many, but fewer devices have fewer micro-batches."""
    plan = _solve(1024, schedule="gpipe")
    assert not plan.feasible
    assert plan.message == ("no split of the 34 layers fits on 1,024 device(s) with 1,024 micro-batches in flight on "
                            "every stage under gpipe (`micro_batches` not given: one per device), nor on fewer devices "
                            "with that many; the fewest `devices` that hold the model is 2 (so 2 micro-batches), on 2 "
                            "devices")
    # with 1,024 micro-batches no number of stages holds it (34 is the most the layers allow)
    assert not _solve(LAYERS, schedule="gpipe", micro_batches=1024).feasible


def test_more_exact_devices_than_layers_with_micro_batches_given():
    plan = _solve(1024, exact=True, schedule="gpipe", micro_batches=4)
    assert plan.message == ("34 layers cannot fill exactly 1,024 devices: `exact` puts at least one layer on each; use "
                            "`devices=34` or fewer, or drop `exact`; 3 devices are the fewest that hold the model with "
                            "4 micro-batches")
    assert _solve(3, exact=True, schedule="gpipe", micro_batches=4).feasible
    assert not _solve(2, schedule="gpipe", micro_batches=4).feasible


def test_devices_objective_with_exact_says_the_count_was_given(capsys):
    """--devices 8 --objective devices --exact said "8 devices are the fewest that hold the model"
    while 2 hold it: with --exact the count is given, and the note says how many would do."""
    lines = _lines(capsys, "--devices", 8, "--objective", "devices", "--exact")
    assert lines["why"].startswith("--exact uses all 8 devices, so the device count was given, not searched; "
                                   "headroom: stage ")
    assert "the fewest" not in lines["why"]
    assert "2 devices are the fewest that hold the model; --exact uses all 8 (without it, --objective devices uses 2)" \
        in lines["note"].splitlines()
    # without --exact, the devices objective uses 2; 2 exact devices hold it, 1 does not
    fewest = _solve(8, objective="devices")
    assert len(fewest.stages) == 2
    assert _solve(2, exact=True).feasible and not _solve(1, exact=True).feasible


def test_devices_objective_with_exact_where_no_fewer_hold_it(capsys):
    """With --exact on the fewest count itself, the note says no fewer hold the model."""
    lines = _lines(capsys, "--devices", 2, "--objective", "devices", "--exact")
    assert "no fewer than the 2 devices --exact uses hold the model" in lines["note"].splitlines()
    assert not _solve(1, exact=True).feasible


@pytest.mark.parametrize("devices", [2, 8])
def test_devices_objective_without_exact_still_names_the_fewest(capsys, devices):
    lines = _lines(capsys, "--devices", devices, "--objective", "devices")
    assert lines["why"].startswith("2 devices are the fewest that hold the model (fewer would not fit); headroom: ")
