"""The Python front door (api.py) and its options record (options.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import stagesplit
from helpers import PROFILES
from indexed_inputs import indexed_inputs
from stagesplit.cli import main
from stagesplit.errors import LayerRangeError, OptionError, StagesplitError
from stagesplit.model.costmodel import StageCostModel
from stagesplit.plan import read_plan
from stagesplit.plan.advise import advise
from stagesplit.solver.problem import SolveOptions
from stagesplit.solver.request import Objective, Schedule, SharedPolicy, SolveRequest

BERT = str(PROFILES / "bert-base.stagesplit")


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# -- the options record ------------------------------------------------------------------------

@pytest.mark.parametrize("options, parameter", [
    ({"devices": 0}, "devices"),
    ({"devices": 2000}, "devices"),
    ({"devices": 4, "objective": "fastest"}, "objective"),
    ({"devices": 4, "schedule": "2f2b"}, "schedule"),
    ({"devices": 4, "shared": "some"}, "shared"),
    ({"devices": 4, "micro_batches": 0}, "micro_batches"),
    ({"devices": 4, "headroom": 1.0}, "headroom"),
    ({"devices": 4, "headroom": float("nan")}, "headroom"),
    ({"devices": 4, "reserve": -1}, "reserve"),
    ({"devices": 4, "min_layers": 3, "max_layers": 2}, "max_layers"),
    ({"devices": 4, "pin_layers": {"3": 4}}, "pin_layers"),
    ({"devices": 4, "pin_layers": [("3",)]}, "pin_layers"),
    ({"devices": 4, "efficiency": 0}, "efficiency"),
    ({"devices": 4, "time_limit": 0}, "time_limit"),
    ({"devices": 4, "workers": 0}, "workers"),
    ({"devices": 4, "targets": ("ipu-mk2", "ipu-mk2")}, "targets"),
    ({"devices": 4, "targets": (7,)}, "targets"),
    ({"devices": True}, "devices"),
])
def test_bad_options_name_the_parameter(options, parameter):
    with pytest.raises(OptionError) as info:
        SolveRequest(**options)
    assert info.value.parameter == parameter
    assert str(info.value).startswith(f"{parameter}: ")
    assert isinstance(info.value, StagesplitError) and isinstance(info.value, ValueError)


def test_request_is_frozen_with_enums():
    r = SolveRequest(devices=4, objective="memory", schedule="1f1b", shared="none", pin_layers={"5": 2},
                     targets="ipu-mk2")
    assert (r.objective, r.schedule, r.shared) == (Objective.MEMORY, Schedule.ONE_F_ONE_B, SharedPolicy.NONE)
    assert r.pin_layers == (("5", 2),) and r.targets == ("ipu-mk2",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.devices = 5
    assert SolveRequest(devices=4, objective=Objective.DEVICES).objective is Objective.DEVICES


def test_enums_are_the_settings_files_choices(tmp_path):
    """A settings file is a template of the request: its choices are the request's enums."""
    from stagesplit.solver.problem import OBJECTIVES, SCHEDULES
    assert OBJECTIVES == tuple(o.value for o in Objective) and SCHEDULES == tuple(s.value for s in Schedule)
    for field, kind in (("objective", Objective), ("schedule", Schedule), ("shared", SharedPolicy)):
        for member in kind:
            path = tmp_path / "s.yaml"
            path.write_text(f"{field}: {member.value}\n")
            assert getattr(SolveRequest.from_settings(path), field) is member


def test_record_round_trip_keeps_every_option():
    r = SolveRequest(devices=3, targets=("ipu-mk2", "ipu-bow", "ipu-mk2"), objective="devices", exact=True,
                     schedule="gpipe", micro_batches=6, headroom=0.1, reserve=1024, min_layers=2, max_layers=5,
                     pin_splits=("4",), pin_layers=(("7", 2),), communication=True, link_bandwidth=1e9,
                     efficiency=0.5, shared="none", layer_compute={"3": 12.5}, time_limit=5, workers=2)
    record = json.loads(json.dumps(r.to_record()))
    back = SolveRequest.from_record(record, "plan.json")
    assert back.to_record() == record
    assert [t.name for t in back.targets] == ["ipu-mk2", "ipu-bow", "ipu-mk2"]      # in full, not by name
    assert back.layer_compute == (("3", 12.5),) and back.objective is Objective.DEVICES


def test_with_devices_repeats_targets_and_drops_pins_beyond():
    r = SolveRequest(devices=4, targets=("a", "b", "c", "d"), pin_layers={"1": 0, "9": 3})
    assert r.with_devices(2).targets == ("a", "b") and r.with_devices(2).pin_layers == (("1", 0),)


# -- solve -------------------------------------------------------------------------------------

def test_solve_by_names_equals_solving_with_indices():
    """The front door (names) and the engine (indices) give the same split and values."""
    plan = stagesplit.solve(BERT, devices=5, schedule="1f1b", micro_batches=2, pin_splits=["6"], objective="memory",
                            pin_layers={"11": 4})
    analysis = stagesplit.analyze(BERT)
    names = analysis.layers.names
    options = SolveOptions(devices=5, schedule="1f1b", micro_batches=2, objective="memory",
                           pinned_splits=(names.index("6"),), pinned_layers=((names.index("11"), 4),))
    direct = advise(analysis.model, indexed_inputs(analysis.model, options)).plan
    assert plan.split_text == direct.split_text
    assert [p.value for p in plan.phases] == [p.value for p in direct.phases]
    assert plan.stages[-1].device == 4 and "11" in plan.stages[-1].layers
    assert any(s.first_layer == names.index("6") for s in plan.stages)


def test_solve_matches_the_command_line(tmp_path, capsys):
    out = tmp_path / "plan.json"
    code, _, _ = run(capsys, "solve", BERT, "--devices", "4", "--headroom", "0.05", "--objective", "memory", "--out",
                     str(out))
    assert code == 0
    cli = read_plan(out)
    api = stagesplit.solve(BERT, devices=4, headroom=0.05, objective="memory")
    assert api.split_text == cli.split_text
    assert api.inputs.request == cli.inputs.request
    assert api.profile.sha256 == cli.profile.sha256


def test_unknown_layer_or_option_is_an_option_error():
    analysis = stagesplit.analyze(BERT)
    with pytest.raises(OptionError, match="pin_splits: no layer named 'nope'") as info:
        stagesplit.solve(analysis, devices=4, pin_splits=["nope"])
    assert info.value.parameter == "pin_splits"
    with pytest.raises(OptionError) as info:
        stagesplit.solve(analysis, devices=4, colour="blue")
    assert info.value.parameter == "colour"
    with pytest.raises(OptionError) as info:
        stagesplit.solve(analysis, devices=4, target="ipu-mk1")       # 1216 tiles, the profile has 1472
    assert info.value.parameter == "targets" and "1216 tiles" in str(info.value)


def test_command_line_names_the_flag(capsys):
    code, _, err = run(capsys, "solve", BERT, "--devices", "4", "--pin-layer", "nope=1")
    assert code == 2 and err.strip() == ("stagesplit: error: --pin-layer: no layer named 'nope' (layers: 0, 1, 2, 3, "
                                         "4, 5, 6, 7, 8, 9, 10, 11)")


def test_layer_compute_is_recorded_and_does_not_change_the_analysis():
    analysis = stagesplit.analyze(BERT)
    before = analysis.model.layer_compute.copy()
    plan = stagesplit.solve(analysis, devices=4, layer_compute={"0": 1e9})
    assert (analysis.model.layer_compute == before).all()
    assert plan.inputs.request.layer_compute == (("0", 1e9),)
    assert plan.stages[0].layers == ["0"]                          # the heavy layer alone
    assert plan.stages[0].compute == 1e9


def test_library_errors_stay_in_the_hierarchy():
    analysis = stagesplit.analyze(BERT)
    with pytest.raises(LayerRangeError):
        analysis.model.stage_memory(3, 20)
    with pytest.raises(IndexError):                                # and it is still an IndexError
        analysis.model.stage_memory(-1, 2)
    with pytest.raises(OptionError) as info:
        StageCostModel(analysis.profile, analysis.layers, shared="sometimes")
    assert info.value.parameter == "shared"
    with pytest.raises(OptionError):
        stagesplit.analyze(42)


def test_sweep_records_each_rows_request():
    rows = stagesplit.sweep(str(PROFILES / "cnn.stagesplit"), "2..4", micro_batches=8, schedule="1f1b")
    assert [r.devices for r in rows] == [2, 3, 4]
    assert [r.plan.inputs.request.devices for r in rows] == [2, 3, 4]
    assert all(r.plan.inputs.request.micro_batches == 8 for r in rows)


# -- reproducible plans ------------------------------------------------------------------------

SAMPLES = [("tiny.json", ["--devices", "2", "--schedule", "1f1b"]),
           ("bert-base.stagesplit", ["--devices", "6", "--schedule", "1f1b", "--micro-batches", "2"]),
           ("gpt.stagesplit", ["--devices", "8", "--headroom", "0.02", "--objective", "memory"]),
           ("cnn.stagesplit", ["--devices", "12", "--schedule", "gpipe", "--micro-batches", "4", "--compare"]),
           ("llama-7b-layers.json", ["--devices", "4", "--target", "a100-80gb", "--schedule", "1f1b",
                                     "--micro-batches", "16", "--reserve", "2GiB"])]


@pytest.mark.parametrize("name, options", SAMPLES)
def test_from_plan_reproduces_every_shipped_sample(tmp_path, capsys, name, options):
    plan_path = tmp_path / "plan.json"
    code, _, _ = run(capsys, "solve", str(PROFILES / name), *options, "--out", str(plan_path))
    assert code == 0
    code, out, _ = run(capsys, "solve", "--from-plan", str(plan_path))
    assert code == 0
    assert out.rstrip().splitlines()[-1] == (f"reproduced: the split is identical to {plan_path}'s "
                                             f"{read_plan(plan_path).split_text}")
    again = stagesplit.reproduce(plan_path)
    assert again.identical and again.profile_matches and again.differences == []


def test_from_plan_reports_a_different_split_and_profile(tmp_path, capsys):
    plan_path = tmp_path / "plan.json"
    assert run(capsys, "solve", BERT, "--devices", "4", "--out", str(plan_path))[0] == 0
    doc = json.loads(plan_path.read_text())
    doc["stages"][0]["last_layer"] = 1                    # as if the recorded split had been different
    doc["stages"][1]["first_layer"] = 2
    doc["profile"]["sha256"] = "0" * 64
    plan_path.write_text(json.dumps(doc))
    code, out, _ = run(capsys, "solve", "--from-plan", str(plan_path))
    assert code == 1
    lines = out.rstrip().splitlines()
    assert lines[-2].startswith(f"differs from {plan_path}: recorded [ 0 1 | 2 ")
    assert lines[-1].startswith("note: the profile's SHA-256")
    again = stagesplit.reproduce(plan_path)
    assert not again.identical and again.profile_matches is False


def test_from_plan_without_a_recorded_request_says_so(tmp_path, capsys):
    plan_path = tmp_path / "plan.json"
    assert run(capsys, "solve", BERT, "--devices", "4", "--out", str(plan_path))[0] == 0
    doc = json.loads(plan_path.read_text())
    del doc["request"]
    plan_path.write_text(json.dumps(doc))
    code, _, err = run(capsys, "solve", "--from-plan", str(plan_path))
    assert code == 2 and f"{plan_path}: request: expected" in err and len(err.strip().splitlines()) == 1


def test_profile_hash_is_taken_from_the_bytes_read(tmp_path):
    import hashlib

    from stagesplit.io import load_profile
    profile = load_profile(BERT)
    assert profile.info.sha256 == hashlib.sha256(Path(BERT).read_bytes()).hexdigest()
    assert profile.info.path == BERT


def test_diagnose_by_layer_names_and_by_plan(tmp_path):
    analysis = stagesplit.analyze(BERT)
    one = stagesplit.diagnose(analysis, layers="3:5")
    pair = stagesplit.diagnose(analysis, layers=("3", "5"))
    sm = analysis.model.stage_memory(3, 5)
    for d in (one, pair):
        assert [(s.first, s.last) for s in d.stages] == [(3, 5)]
        assert d.stages[0].tile == sm.worst_tile() and d.stages[0].total == sm.worst_bytes()
    plan = stagesplit.solve(analysis, devices=4)
    stagesplit.write_plan(plan, tmp_path / "plan.json")
    by_path = stagesplit.diagnose(analysis, plan=tmp_path / "plan.json")
    assert [(s.first, s.last) for s in by_path.stages] == [(s.first_layer, s.last_layer) for s in plan.stages]
    assert [s.total for s in by_path.stages] == [s.worst_tile_bytes for s in plan.stages]
    with pytest.raises(OptionError) as info:
        stagesplit.diagnose(analysis, layers="5:3")
    assert info.value.parameter == "layers"
    with pytest.raises(OptionError) as info:
        stagesplit.diagnose(analysis, layers="3:5", plan=plan)
    assert info.value.parameter == "plan"


def test_public_functions_stay_functions_after_their_modules_load():
    """A package attribute named like a submodule is replaced when the submodule is imported;
    no public name may share a module's name."""
    import importlib
    import pkgutil
    modules = {m.name for m in pkgutil.iter_modules(stagesplit.__path__)}
    assert not modules & set(stagesplit.__all__)
    for name in modules:
        importlib.import_module(f"stagesplit.{name}") if name not in ("capturing", "__main__") else None
    assert callable(stagesplit.breakdown) and callable(stagesplit.diagnose) and callable(stagesplit.solve)


def test_every_public_name_and_method_has_a_docstring():
    import inspect
    for name in stagesplit.__all__:
        obj = getattr(stagesplit, name)
        assert (obj.__doc__ or "").strip(), name
        if inspect.isclass(obj):
            for attr, value in vars(obj).items():
                if not attr.startswith("_") and callable(value):
                    assert (value.__doc__ or "").strip(), f"{name}.{attr}"
