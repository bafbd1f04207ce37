"""Plan records and files: contents, round trips through JSON and YAML, validation."""

import json

import pytest

from helpers import PROFILES, UNIT, layer_model, options
from indexed_inputs import indexed_inputs
from stagesplit.errors import ProfileError, StagesplitError
from stagesplit.plan import read_plan, write_plan
from stagesplit.plan.advise import advise
from stagesplit.plan.files import plan_document
from stagesplit.plan.text import split_text
from stagesplit.solver.problem import SolveOptions


def small_plan(tmp_path=None):
    model = layer_model([4, 4, 4, 4, 4, 4], [1, 1, 1, 1, 5, 5])
    return advise(model, indexed_inputs(model, options(3, 12), compare=True))


def test_plan_contents():
    advice = small_plan()
    plan = advice.plan
    assert plan.feasible and plan.status == "optimal" and plan.method == "cp-sat"
    assert plan.split_text == "[ l0 l1 l2 | l3 l4 | l5 ]"
    assert [s.worst_tile_bytes for s in plan.stages] == [12 * UNIT, 8 * UNIT, 4 * UNIT]
    assert [s.capacity_bytes for s in plan.stages] == [12 * UNIT] * 3
    assert [s.headroom_bytes for s in plan.stages] == [0, 4 * UNIT, 8 * UNIT]
    assert [s.compute for s in plan.stages] == [3.0, 6.0, 5.0]
    assert plan.bottleneck.stage == 1
    assert plan.stages[0].memory_at_worst_tile.always_live == 12 * UNIT
    assert plan.phases[0].value == plan.phases[0].bound == 6 and plan.phases[0].gap == 0.0
    assert plan.inputs.request.devices == 3 and plan.inputs.objective == "compute"
    # an A100 profile: compared with the GPU frameworks' default splits (tests/plan/test_baselines.py)
    assert [b.method for b in advice.baselines] == ["megatron-even", "deepspeed-parameters", "deepspeed-uniform",
                                                    "torchtitan-default", "torch-pipelining-equal"]
    # PopLiner's loop: 3+ layers per stage first, which fit (12) only at 100% of memory
    from stagesplit.solver.dp import greedy
    assert greedy(advice.problem).method == "greedy (3+ layers, 100% of memory)"
    assert abs(plan.pipeline_efficiency(1) - (14 / 18) / 3) < 1e-9    # balance 14/(3*6), bubble 2/3


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_round_trip(tmp_path, suffix):
    plan = small_plan().plan
    path = tmp_path / f"plan{suffix}"
    write_plan(plan, path)
    back = read_plan(path)
    assert back.split_text == plan.split_text
    assert [(s.first_layer, s.last_layer, s.worst_tile_bytes, s.compute) for s in back.stages] == \
        [(s.first_layer, s.last_layer, s.worst_tile_bytes, s.compute) for s in plan.stages]
    assert back.layer_names == plan.layer_names and back.status == plan.status
    assert [p.value for p in back.phases] == [p.value for p in plan.phases]
    # units, scale and solver values survive; wall times come back from ``run``
    assert [(p.unit, p.scale, p.solver_value, p.solver_bound, p.seconds) for p in back.phases] == \
        [(p.unit, p.scale, p.solver_value, p.solver_bound, p.seconds) for p in plan.phases]
    assert [p.unit for p in plan.phases] == ["flops", "bytes"]
    assert [s.time for s in back.stages] == [s.time for s in plan.stages] == [3.0, 6.0, 5.0]
    assert back.notes == plan.notes == []


def test_plan_records_profile_hash(tmp_path):
    from stagesplit.common.fileio import file_sha256
    from stagesplit.model.analysis import Analysis
    path = PROFILES / "bert-base.stagesplit"
    model = Analysis.load(path).model
    plan = advise(model, indexed_inputs(model, SolveOptions(devices=4))).plan
    assert plan.profile.sha256 == file_sha256(path) and len(plan.profile.sha256) == 64
    assert plan.profile.synthetic is True


def test_bad_plan_files(tmp_path):
    path = tmp_path / "p.json"
    with pytest.raises(StagesplitError):
        read_plan(path)
    path.write_text("{not json")
    with pytest.raises(ProfileError, match="valid JSON"):
        read_plan(path)
    doc = plan_document(small_plan().plan)
    doc["stages"][1]["first_layer"] = 4
    path.write_text(json.dumps(doc))
    with pytest.raises(ProfileError, match=r"stages\[1\]\.first_layer: expected 3 \(stages are contiguous\)"):
        read_plan(path)
    doc["format"] = "other"
    path.write_text(json.dumps(doc))
    with pytest.raises(ProfileError, match="format"):
        read_plan(path)


def test_split_text():
    assert split_text(["a", "b", "c"], [(0, 1), (2, 2)]) == "[ a b | c ]"


def test_wide_tensors_round_trip_and_bad_ones_are_refused_naming_the_field(tmp_path):
    """The plan's wide tensors (what a traced split would send past a stage) survive a file; a record
    whose layers are out of order or out of range, or with an unknown key, is refused naming its field."""
    from dataclasses import replace

    from stagesplit.model.traffic import WideTensor
    plan = replace(small_plan().plan, wide_tensors=(WideTensor("mask", 0, 2), WideTensor("rotary <cos>", 1, 5)))
    path = tmp_path / "p.json"
    write_plan(plan, path)
    assert read_plan(path).wide_tensors == plan.wide_tensors
    for bad, field in (({"name": "x", "first_layer": 3, "last_layer": 3}, r"wide_tensors\[0\]\.last_layer"),
                       ({"name": "x", "first_layer": 0, "last_layer": 6}, r"wide_tensors\[0\]\.last_layer"),
                       ({"name": "x", "first_layer": -1, "last_layer": 2}, r"wide_tensors\[0\]\.first_layer"),
                       ({"name": "x", "first_layer": 0, "last_layer": 2, "code": 1}, r"wide_tensors\[0\]")):
        doc = plan_document(plan)
        doc["wide_tensors"] = [bad]
        path.write_text(json.dumps(doc))
        with pytest.raises(ProfileError, match=field):
            read_plan(path)


def test_a_schedule_plan_states_the_runtime_it_was_priced_under_and_the_export_sets_it(tmp_path):
    """A plan solved under a schedule records the runtime its per-rank memory assumed (the last stage
    keeps no outputs, the gradients stay allocated between steps); the file keeps it, a hand-made
    file saying otherwise is read as it says, and the torch-pipelining export sets exactly what the
    plan records (an unknown key is refused naming the field)."""
    from stagesplit.api import solve
    from stagesplit.exporters import export_plan
    from stagesplit.exporters.render import literal_assignments
    from stagesplit.plan.records import RuntimeConditions
    plan = solve(PROFILES / "gpt-captured.stagesplit", 2, schedule="1f1b", micro_batches=4)
    assert plan.schedule.runtime == RuntimeConditions(return_outputs=False, gradients_set_to_none=False)
    path = tmp_path / "p.json"
    write_plan(plan, path)
    doc = json.loads(path.read_text())
    assert doc["schedule"]["runtime"] == {"return_outputs": False, "gradients_set_to_none": False}
    import ast
    code = export_plan(read_plan(path), "torch-pipelining")
    values = literal_assignments(ast.parse(code))
    assert (values["RETURN_OUTPUTS"], values["GRADIENTS_SET_TO_NONE"]) == (False, False)
    doc["schedule"]["runtime"] = {"return_outputs": True, "gradients_set_to_none": True}
    path.write_text(json.dumps(doc))
    code = export_plan(read_plan(path), "torch-pipelining")
    values = literal_assignments(ast.parse(code))
    assert (values["RETURN_OUTPUTS"], values["GRADIENTS_SET_TO_NONE"]) == (True, True)
    assert "return_outputs=True" in code and "set_to_none=True" in code
    del doc["schedule"]["runtime"]                    # a plan written before: the runtime priced then
    path.write_text(json.dumps(doc))
    assert read_plan(path).schedule.runtime == RuntimeConditions()
    doc["schedule"]["runtime"] = {"return_outputs": False, "keep_buffers": 1}
    path.write_text(json.dumps(doc))
    with pytest.raises(ProfileError, match=r"schedule\.runtime"):
        read_plan(path)
