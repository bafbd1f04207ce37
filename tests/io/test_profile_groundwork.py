"""The profile's groundwork for zero-bubble schedules and recorded grouping: every operation's
phase (``Phase``, ``Operations.phase``) and the grouping its source used
(``ProfileInfo.layer_grouping``), carried by both file formats as optional fields, validated,
and absent from older files (which load with every phase UNKNOWN and no grouping)."""

from __future__ import annotations

import io
import json
import zipfile

import numpy as np
import pytest

from helpers import ROOT
from stagesplit.errors import ProfileError
from stagesplit.io import load_profile, save_profile
from stagesplit.io.builder import ProfileBuilder
from stagesplit.io.profile import PHASE_LABELS, LayerGrouping, Phase, Target
from stagesplit.layers import LayerOptions


def test_phase_values_and_labels():
    assert [(p.name, p.value) for p in Phase] == [("UNKNOWN", 0), ("FORWARD", 1), ("BACKWARD_INPUT", 2),
                                                   ("BACKWARD_WEIGHT", 3), ("OPTIMIZER", 4), ("RECOMPUTE", 5)]
    assert PHASE_LABELS == ("unknown", "forward", "backward_input", "backward_weight", "optimizer", "recompute")
    assert all(Phase.from_label(p.label) is p for p in Phase)


GROUPING = LayerGrouping(method="module-tree", layer_regex=r"^blocks\.(\d+)[./]", first_layer_regex="embed",
                         last_layer_regex="head", call_regex=LayerOptions().call_regex, order="steps",
                         layers=("0", "1"), module_paths=("blocks.0", None))


def small(phases=(Phase.FORWARD, Phase.FORWARD, Phase.BACKWARD_INPUT, Phase.BACKWARD_WEIGHT, Phase.OPTIMIZER,
                  Phase.RECOMPUTE), grouping=GROUPING):
    b = ProfileBuilder(Target("t", 1, 10_000), 6, "flops")
    x = b.variable(64, 0, [(0, 4)], "x")
    w = b.variable(32, 0, "always", "w")
    for i, name in enumerate(["blocks.0/mm", "blocks.1/mm", "blocks.1/backward/mm", "blocks.1/backward/mm",
                              "blocks.1/optimizer/add_", "blocks.0/recompute/mm"]):
        b.operation(name, i, i, vars=[x, w], compute=10.0)
    p = b.build()
    p.operations.phase = np.array([int(x) for x in phases], np.int8)
    p.info.layer_grouping = grouping
    return p.validate()


@pytest.mark.parametrize("suffix", [".json", ".stagesplit"])
def test_phases_and_grouping_round_trip_in_both_formats(tmp_path, suffix):
    p = small()
    path = tmp_path / f"p{suffix}"
    save_profile(p, path)
    back = load_profile(path)
    assert back.operations.phase.dtype == np.int8
    assert back.operations.phase.tolist() == [1, 1, 2, 3, 4, 5]
    assert back.info.layer_grouping == GROUPING
    if suffix == ".json":
        doc = json.loads(path.read_text())
        assert [op.get("phase") for op in doc["operations"]] == ["forward", "forward", "backward_input",
                                                                "backward_weight", "optimizer", "recompute"]
        assert doc["layer_grouping"]["layers"] == [{"name": "0", "module_path": "blocks.0"},
                                                   {"name": "1", "module_path": None}]


@pytest.mark.parametrize("suffix", [".json", ".stagesplit"])
def test_traced_stages_round_trip_and_are_written_only_where_true(tmp_path, suffix):
    """A capture records that the export traces the stages of a model whose layers are one stack's blocks
    (``traced_stages``); the key is written only where it is true, so earlier files read as before."""
    from dataclasses import replace
    for traced in (True, False):
        path = tmp_path / f"p{traced}{suffix}"
        save_profile(small(grouping=replace(GROUPING, traced_stages=traced)), path)
        assert load_profile(path).info.layer_grouping == replace(GROUPING, traced_stages=traced)
        if suffix == ".json":
            assert ("traced_stages" in json.loads(path.read_text())["layer_grouping"]) is traced


@pytest.mark.parametrize("suffix", [".json", ".stagesplit"])
def test_without_phases_or_grouping_nothing_is_written_and_all_load_unknown(tmp_path, suffix):
    p = small(phases=[Phase.UNKNOWN] * 6, grouping=None)
    path = tmp_path / f"p{suffix}"
    save_profile(p, path)
    if suffix == ".json":
        doc = json.loads(path.read_text())
        assert "layer_grouping" not in doc and all("phase" not in op for op in doc["operations"])
    else:
        with zipfile.ZipFile(path) as zf:
            assert "op_phase.npy" not in zf.namelist()
    back = load_profile(path)
    assert back.operations.phase.tolist() == [0] * 6 and back.info.layer_grouping is None


@pytest.mark.parametrize("name", ["tiny.json", "gpt.stagesplit", "cnn.stagesplit"])
def test_files_written_before_phases_load_with_every_phase_unknown(name):
    p = load_profile(ROOT / "profiles" / name)
    assert (p.operations.phase == Phase.UNKNOWN).all() and len(p.operations.phase) == len(p.operations)
    assert p.info.layer_grouping is None


def test_validator_checks_the_phase_range_and_length():
    p = small()
    p.operations.phase[3] = 6
    with pytest.raises(ProfileError, match=r"operations\[3\]\.phase: expected one of 0 \(unknown\), 1 \(forward\).*, got 6"):
        p.validate("x.json")
    p.operations.phase = np.zeros(2, np.int8)
    with pytest.raises(ProfileError, match=r"operations\.phase: expected 6 entries"):
        p.validate("x.json")


def _json_doc(tmp_path):
    path = tmp_path / "p.json"
    save_profile(small(), path)
    return json.loads(path.read_text())


def _write_json(tmp_path, doc):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("edit,field,expected", [
    (lambda d: d["operations"][2].__setitem__("phase", "backward"), r"operations\[2\]\.phase",
     "one of unknown, forward, backward_input, backward_weight, optimizer, recompute"),
    (lambda d: d["operations"][1].__setitem__("phase", 2), r"operations\[1\]\.phase", "one of unknown"),
    (lambda d: d["layer_grouping"].pop("layer_regex"), r"layer_grouping\.layer_regex", "a value"),
    (lambda d: d["layer_grouping"].__setitem__("order", "random"), r"layer_grouping\.order", "one of steps, natural"),
    (lambda d: d["layer_grouping"]["layers"][1].__setitem__("name", "0"), r"layer_grouping\.layers\[1\]\.name",
     "a layer name not given before"),
    (lambda d: d["layer_grouping"]["layers"][0].__setitem__("module_path", 7), r"layer_grouping\.layers\[0\]\.module_path",
     "a string"),
    (lambda d: d["layer_grouping"]["layers"][0].__setitem__("extra", 1), r"layer_grouping\.layers\[0\]\.extra",
     "a known field"),
    (lambda d: d.__setitem__("layer_grouping", []), r"layer_grouping", "an object"),
])
def test_bad_phase_or_grouping_in_json_is_one_line_naming_the_field(tmp_path, edit, field, expected):
    doc = _json_doc(tmp_path)
    edit(doc)
    path = _write_json(tmp_path, doc)
    with pytest.raises(ProfileError, match=rf"bad\.json: {field}: expected {expected}") as info:
        load_profile(path)
    assert "\n" not in str(info.value)


def _rewrite_compact(src, dst, change):
    with np.load(src, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    change(arrays)
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    dst.write_bytes(buffer.getvalue())


def _header(arrays):
    return json.loads(arrays["header"].tobytes().decode())


def _set_header(arrays, header):
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), np.uint8).copy()


@pytest.mark.parametrize("change,field,expected", [
    (lambda a: a.__setitem__("op_phase", np.array([1, 1, 2, 9, 4, 5], np.int8)), r"op_phase\[3\]", "a phase in 0..5"),
    (lambda a: a.__setitem__("op_phase", np.array([1, 1], np.int8)), "op_phase", "6 entries"),
    (lambda a: a.__setitem__("op_phase", np.array([1.0] * 6)), "op_phase", "a 1-d array of kind 'i'"),
    (lambda a: _set_header(a, {**_header(a), "info": {**_header(a)["info"], "layer_grouping": {"method": 3}}}),
     r"header\.info\.layer_grouping\.method", "a string"),
])
def test_bad_phase_or_grouping_in_compact_is_one_line_naming_the_array(tmp_path, change, field, expected):
    good = tmp_path / "p.stagesplit"
    save_profile(small(), good)
    bad = tmp_path / "bad.stagesplit"
    _rewrite_compact(good, bad, change)
    with pytest.raises(ProfileError, match=rf"bad\.stagesplit: {field}: expected {expected}"):
        load_profile(bad)
