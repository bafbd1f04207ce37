"""The batch a step was captured at (``ProfileInfo.batch_size``, issue #32): a capture records its
inputs' leading dimension, both file forms and the micro-batch scaling carry it, and the layout search
scales every micro-batch size from it unless told another. Before, a capture of one sample searched at
micro-batches of 2 was priced as if captured at 2, every activation halved."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from fractions import Fraction

import pytest

from stagesplit import api
from stagesplit.errors import OptionError
from tests.helpers import refused_line, run_cli

torch = pytest.importorskip("torch")

from linear_stack import linear_stack  # noqa: E402

#: every degree fixed, so that the rows compared are one layout's: two stages under 1F1B
FIXED = dict(target="h100-80gb", gpus=2, global_batch=8, micro_batch_size=2, schedule="1f1b", tp=1, pp=2, dp=1,
             zero=0, time_limit=60)


def _inputs(*shapes, dtype=torch.float32):
    return tuple(torch.empty(*s, dtype=dtype, device="meta") for s in shapes)


@pytest.mark.parametrize("inputs, batch", [
    (torch.empty(3, 5, device="meta"), 3),
    ({"input_ids": torch.zeros(2, 8, dtype=torch.long), "attention_mask": torch.ones(2, 8)}, 2),
    (_inputs((4, 3, 8, 8), (4,)), 4),                        # images and their labels
    (_inputs((3, 4)) + (7, None), 3),                        # what is not a tensor has no batch
    (torch.empty(5, device="meta"), None),                   # a vector alone: no dimension to tell
    (_inputs((2, 8), (1, 8)), None),                         # two leading sizes: none is the batch
    (_inputs((4, 8), (8,)), None),                           # a vector of another size
    (torch.empty(0, 4, device="meta"), None),
], ids=["tensor", "token ids", "images and labels", "non-tensors", "vector", "two sizes", "vector of another size",
        "empty"])
def test_the_batch_is_the_leading_dimension_the_inputs_share(inputs, batch):
    from stagesplit.capturing.pytorch import batch_size
    assert batch_size(torch, inputs) == batch


def test_a_capture_records_its_batch_through_both_file_forms_and_the_scaling(tmp_path):
    from stagesplit.io import load_profile, save_profile
    from stagesplit.model.batchscale import scale_batch
    stack = linear_stack(batch=8)
    assert stack.info.batch_size == 8
    for name in ("stack.json", "stack.stagesplit"):
        save_profile(stack, tmp_path / name)
        assert load_profile(tmp_path / name).info.batch_size == 8
    assert json.loads((tmp_path / "stack.json").read_text())["batch_size"] == 8
    unrecorded = replace(stack, info=replace(stack.info, batch_size=None))
    for name in ("none.json", "none.stagesplit"):
        save_profile(unrecorded, tmp_path / name)
        assert load_profile(tmp_path / name).info.batch_size is None
    assert "batch_size" not in json.loads((tmp_path / "none.json").read_text())
    # a profile scaled to another micro-batch size is a capture at that size; a fraction of a sample is none
    assert [scale_batch(stack, r).info.batch_size for r in (Fraction(1, 2), Fraction(3), Fraction(1, 3))] == [4, 24, None]


def test_the_search_scales_from_the_recorded_batch():
    """A capture of one sample searched at micro-batches of 2 is the capture at 2: the same rank
    peaks (to the bytes of the scalar loss, which the rule grows with the rest) and step. Taken as
    a capture at 2 (what the search assumed before), it holds less."""
    one, two = linear_stack(batch=1, width=256), linear_stack(batch=2, width=256)
    recorded = api.layouts(one, **FIXED)
    assert (recorded.request.captured_batch, recorded.request.captured_from) == (1, "recorded")
    at_two = api.layouts(two, **FIXED)
    assert (at_two.request.captured_batch, at_two.request.captured_from) == (2, "recorded")
    assert recorded.best.rank_peaks == pytest.approx(at_two.best.rank_peaks, abs=64)
    assert recorded.best.step_s == pytest.approx(at_two.best.step_s, rel=0.02)     # as tests/model/test_batchscale.py
    given = api.layouts(one, captured_batch=1, **FIXED)
    assert given.request.captured_from == "given" and given.best.rank_peaks == recorded.best.rank_peaks
    mistaken = api.layouts(one, captured_batch=2, **FIXED)          # the capture of 1 taken for one of 2
    # each rank's micro-batches in flight hold half the activations: 256 floats per layer's output
    # per sample fewer, at least one such output per rank
    assert all(m <= r - 256 * 4 for m, r in zip(mistaken.best.rank_peaks, recorded.best.rank_peaks))


def test_profiles_that_record_no_batch_are_taken_at_the_size_fixed_else_one():
    stack = linear_stack(batch=2)
    unrecorded = replace(stack, info=replace(stack.info, batch_size=None))
    fixed = api.layouts(unrecorded, **FIXED)
    assert (fixed.request.captured_batch, fixed.request.captured_from, fixed.request.recorded_batch) == \
        (2, "assumed", None)
    searched = api.layouts(unrecorded, **(FIXED | dict(micro_batch_size=None)))
    assert (searched.request.captured_batch, searched.request.captured_from) == (1, "assumed")


def test_profiles_captured_at_different_batches_are_refused_in_one_line(tmp_path, capsys):
    from stagesplit.io import save_profile
    save_profile(linear_stack(batch=8), tmp_path / "stack.json")
    save_profile(linear_stack(batch=4, width=32), tmp_path / "half.json")
    with pytest.raises(OptionError, match="captured at different batches"):
        api.layouts(str(tmp_path / "stack.json"), tp_profiles={2: str(tmp_path / "half.json")}, **FIXED)
    line = refused_line(capsys, "layouts", tmp_path / "stack.json", "--tp-profile", f"2={tmp_path / 'half.json'}",
                        "--gpus", 4, "--global-batch", 16, "--target", "h100-80gb")
    assert line.startswith("--captured-batch: ") and "stack.json at 8" in line and "half.json at 4" in line, line
    # given, the size stands for both
    code, _, err = run_cli(capsys, "layouts", tmp_path / "stack.json", "--tp-profile", f"2={tmp_path / 'half.json'}",
                           "--gpus", 4, "--global-batch", 16, "--target", "h100-80gb", "--captured-batch", 8,
                           "--time-limit", 30)
    assert code == 0, err


@pytest.mark.parametrize("flags, size, source", [
    (("--micro-batch-size", 2), 4, "as their capture recorded"),
    (("--micro-batch-size", 2, "--captured-batch", 2), 2, "as given, their capture recorded 4"),
    (("--captured-batch", 4), 4, "as given"),
    ((), 4, "as their capture recorded"),
])
def test_the_header_says_the_captured_batch_and_where_it_comes_from(tmp_path, capsys, flags, size, source):
    from stagesplit.io import save_profile
    save_profile(linear_stack(batch=4), tmp_path / "stack.json")
    argv = ("layouts", tmp_path / "stack.json", "--gpus", 2, "--global-batch", 8, "--target", "h100-80gb",
            "--time-limit", 30, *flags)
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    header = out.splitlines()[0]
    found = re.search(r"\((micro-batches of (\d+)|micro-batch size searched); profiles captured at (\d+) \(([^)]*)\)\)",
                      header)
    assert found, header
    code, out, err = run_cli(capsys, *argv, "--format", "json")
    doc = json.loads(out)
    assert (int(found.group(3)), found.group(4)) == (doc["captured_batch"], source) == (size, source)
    assert doc["captured_from"] == ("given" if source.startswith("as given") else "recorded")
    assert doc["recorded_batch"] == 4
    assert (found.group(2) and int(found.group(2))) == doc["micro_batch_size"] or found.group(2) is None \
        and doc["micro_batch_size"] is None
