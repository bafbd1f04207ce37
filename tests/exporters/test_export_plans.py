"""``stagesplit export``: the plan checks every format shares, the header, the command line.

Each format is checked by what reads it, in its own file: torch.distributed.pipelining,
DeepSpeed, megatron-core and torchtitan with their own code (test_export_torch.py,
test_export_deepspeed.py, test_export_megatron.py, test_export_torchtitan.py); the IPU
frameworks, which cannot be installed, with stand-ins enforcing their documented rules
(test_export_ipu.py); untrusted names in test_export_security.py.
"""

from __future__ import annotations

import ast
import json
import re

import pytest
from exporthelpers import PYTHON_FORMATS, make_plan, plan_from, run, splits, stages_of
from hypothesis import given, settings

from helpers import PROFILES
from stagesplit.cli import main
from stagesplit.errors import ExportError, OptionError, StagesplitError
from stagesplit.exporters import FORMATS, export_plan
from stagesplit.exporters._plan_view import view_of
from stagesplit.exporters.header import SAFETY_LINE, header_lines
from stagesplit.layers import LayerOptions, group_layers, module_path
from stagesplit.plan import read_plan, write_plan

# -- module paths ---------------------------------------------------------------------------------

LAYER_RE = LayerOptions().compiled()[0]                  # the default layer regex, as grouping compiles it


@pytest.mark.parametrize("names, key, expected", [
    (["transformer.h.3.attn.c_attn/aten.addmm", "transformer.h.3.mlp.c_fc/aten.mm"], "3", "transformer.h.3"),
    (["transformer.h.3.mlp.c_fc/aten.mm"], "3", "transformer.h.3"),               # one op: cut at the token
    (["transformer.h.3/aten.add", "transformer.h.3.ln_1/aten.native_layer_norm"], "3", "transformer.h.3"),
    (["bert/encoder/layer3/attention/MatMul", "bert/encoder/layer3/output/Add"], "3", "bert/encoder/layer3"),
    (["model.layers.12.mlp/aten.mm", "model.layers.12.self_attn/aten.bmm"], "12", "model.layers.12"),
    (["encoder/layer3/MatMul", "decoder/layer3/MatMul"], "3", None),                 # no common token: no guess
    (["layer3x/MatMul"], "3", None),                                                 # the match is not a token
    ([], "3", None),
])
def test_module_path_is_the_common_prefix_ending_at_the_layer_token(names, key, expected):
    assert module_path(names, key, LAYER_RE) == expected


def test_group_layers_records_module_paths_and_none_for_explicit_layers():
    from stagesplit.io import load_profile
    bert = group_layers(load_profile(PROFILES / "bert-base.stagesplit"))
    assert bert.module_paths == [f"bert/encoder/layer{i}" for i in range(12)]
    layerform = group_layers(load_profile(PROFILES / "llama-7b-layers.json"))   # explicit layers: no op names
    assert layerform.module_paths == [None] * layerform.num_layers


def test_explicitly_layered_operations_give_a_path_only_when_their_names_agree():
    from stagesplit.io.builder import ProfileBuilder
    from stagesplit.io.profile import Target
    b = ProfileBuilder(Target("cpu", tiles=1, bytes_per_tile=1 << 30), 4)
    b.operation("model.layers.0.mlp/aten.mm", 0, 0, layer="0")            # a capture stating the layer
    b.operation("model.layers.0.attn/aten.bmm", 1, 1, layer="0")
    b.operation("model.layers.1.mlp/aten.mm", 2, 2, layer="block-b")       # the name says 1, the layer another
    b.operation("model.layers.2.mlp/aten.mm", 3, 3)                         # by the regex
    assert group_layers(b.build()).module_paths == ["model.layers.0", None, "model.layers.2"]


def test_plan_round_trips_module_paths_and_reads_old_plans(tmp_path):
    plan = make_plan(["a", "b", "c"], [0, 2], paths=["m.a", None, "m.c"])
    write_plan(plan, tmp_path / "p.json")
    assert read_plan(tmp_path / "p.json").module_paths == ["m.a", None, "m.c"]
    write_plan(plan, tmp_path / "p.yaml")
    assert read_plan(tmp_path / "p.yaml").module_paths == ["m.a", None, "m.c"]
    doc = json.loads((tmp_path / "p.json").read_text())
    del doc["module_paths"]                                          # a plan from before module paths
    (tmp_path / "old.json").write_text(json.dumps(doc))
    old = read_plan(tmp_path / "old.json")
    assert old.module_paths == [] and stages_of(old) == [["a", "b"], ["c"]]
    doc["module_paths"] = ["m.a"]
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(StagesplitError, match=r"module_paths: expected one entry per layer \(3\)"):
        read_plan(tmp_path / "bad.json")


# -- validation: the silent drop ------------------------------------------------------------------

@pytest.fixture
def plan_doc(tmp_path):
    plan = make_plan([str(i) for i in range(12)], [0, 3, 6, 9], paths=[f"h.{i}" for i in range(12)])
    write_plan(plan, tmp_path / "plan.json")
    return json.loads((tmp_path / "plan.json").read_text())


def _export_edited(capsys, tmp_path, doc, fmt="json"):
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(doc))
    return run(capsys, "export", path, "--to", fmt)


def _error(tmp_path, message, name="edited.json"):
    """The one line ``export`` prints for a plan-structure error: the plan file first."""
    return [f"stagesplit: error: {tmp_path / name}: {message}"]


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_hand_edited_plan_missing_a_layer_is_rejected(capsys, tmp_path, plan_doc, fmt):
    plan_doc["stages"][1]["layers"].remove("4")                      # a layer deleted from a stage's list
    code, out, err = _export_edited(capsys, tmp_path, plan_doc, fmt)
    assert (code, out) == (2, "")
    assert err.strip().splitlines() == _error(tmp_path, "layer '4' is in no stage: the plan would drop it")


def test_hand_edited_plan_dropping_the_last_layer_is_rejected(capsys, tmp_path, plan_doc):
    last = plan_doc["stages"][-1]
    last["layers"].remove("11")
    last["last_layer"] = 10                                          # consistent indices, still a drop
    code, out, err = _export_edited(capsys, tmp_path, plan_doc, "megatron")
    assert code == 2 and out == ""
    assert err.strip().splitlines() == _error(tmp_path, "layer '11' is in no stage: the plan would drop it")


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_hand_edited_plan_duplicating_a_layer_is_rejected(capsys, tmp_path, plan_doc, fmt):
    plan_doc["stages"][2]["layers"].insert(0, "5")                   # layer 5 also in stage 2
    code, out, err = _export_edited(capsys, tmp_path, plan_doc, fmt)
    assert (code, out) == (2, "")
    assert err.strip().splitlines() == _error(tmp_path, "layer '5' is in more than one stage (stages 1, 2)")


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_hand_edited_plan_with_an_empty_stage_is_rejected(capsys, tmp_path, plan_doc, fmt):
    plan_doc["stages"][2]["layers"] = []
    code, out, err = _export_edited(capsys, tmp_path, plan_doc, fmt)
    assert (code, out) == (2, "")
    assert err.strip().splitlines() == _error(tmp_path, "stage 2 holds no layer (an empty stage); remove it or give "
                                              "it layers")


def test_empty_stage_by_indices_and_reordered_stages_are_rejected(capsys, tmp_path, plan_doc):
    doc = json.loads(json.dumps(plan_doc))
    doc["stages"][2]["last_layer"] = doc["stages"][2]["first_layer"] - 1
    code, _, err = _export_edited(capsys, tmp_path, doc)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "stages[2].last_layer" in err
    doc = json.loads(json.dumps(plan_doc))
    doc["stages"][1]["layers"] = ["5", "4", "3"]                     # the stage's layers out of the plan's order
    code, _, err = _export_edited(capsys, tmp_path, doc)
    assert code == 2 and err.strip().splitlines() == _error(
        tmp_path, "stage 1 holds layers 5, 4, 3: expected consecutive layers from '3' in the plan's order")
    doc = json.loads(json.dumps(plan_doc))
    doc["stages"][0]["stage"], doc["stages"][1]["stage"] = 1, 0     # stage numbers swapped
    code, _, err = _export_edited(capsys, tmp_path, doc)
    assert code == 2 and err.strip().splitlines() == _error(
        tmp_path, "stages[0] is numbered 1: stages must be listed in order 0, 1, 2, ...")


def test_plan_without_a_split_is_rejected(capsys, tmp_path, plan_doc):
    plan_doc["stages"] = []
    code, _, err = _export_edited(capsys, tmp_path, plan_doc)
    assert code == 2 and err.strip().splitlines() == _error(
        tmp_path, "the plan has no stages (no split fitted); nothing to export")


@pytest.mark.parametrize("fmt", ["poptorch", "torch-pipelining"])
def test_formats_needing_module_paths_say_so_without_guessing(capsys, tmp_path, fmt):
    plan = make_plan(["0", "1", "2"], [0, 2])                        # no module paths recorded
    write_plan(plan, tmp_path / "p.json")
    code, out, err = run(capsys, "export", tmp_path / "p.json", "--to", fmt)
    assert code == 2 and out == ""
    assert err.strip().splitlines() == _error(
        tmp_path, f"{fmt} needs the module path of layer '{'0' if fmt == 'poptorch' else '2'}', but the plan has only "
        "its layer name; solve again from a profile whose operation names carry module paths (e.g. from stagesplit "
        "capture)", "p.json")


@pytest.mark.parametrize("fmt", [f for f in FORMATS if not FORMATS[f].needs_module_paths])
def test_formats_without_module_paths_work_from_layer_names(fmt):
    plan = make_plan(["0", "1", "2", "3"], [0, 1, 3], micro_batches=4)
    assert "stage 1 on device 1: layers 1 2; memory 200 bytes of 1,000 bytes (20.0%)" in export_plan(plan, fmt)


# -- the header -----------------------------------------------------------------------------------

def test_header_names_profile_hash_objective_and_every_stage(capsys, tmp_path):
    plan_path = tmp_path / "bert.json"
    assert main(["solve", str(PROFILES / "bert-base.stagesplit"), "--devices", "4", "--headroom", "0.1",
                 "--out", str(plan_path)]) == 0
    capsys.readouterr()
    plan = read_plan(plan_path)
    for fmt in FORMATS:
        code, out, err = run(capsys, "export", plan_path, "--to", fmt)
        if fmt == "megatron-uneven" and code == 2:                # unequal middle stages: says so
            assert "megatron-uneven cannot express this plan" in err
            continue
        assert code == 0, err
        if fmt == "json":
            header = json.loads(out)["header"]
        else:
            header = [line[2:] for line in out.splitlines()[:5 + len(plan.stages)]]
            assert all(line.startswith("# ") for line in out.splitlines()[:5 + len(plan.stages)])
        assert header[0] == f"stagesplit export --to {fmt}"
        assert header[1] == SAFETY_LINE
        assert header[2].startswith("profile: bert-base (synthetic) from ")
        assert header[3] == f"profile sha256: {plan.profile.sha256}"
        assert header[4].startswith("objective: compute, 10% headroom; status: optimal; split: [ 0 1 2 ")
        for s, line in zip(plan.stages, header[5:]):
            assert line == (f"stage {s.stage} on device {s.device}: layers {' '.join(s.layers)} "
                            f"[bert/encoder/layer{s.first_layer} .. bert/encoder/layer{s.last_layer}]; "
                            f"memory {s.worst_tile_bytes:,} bytes of {s.capacity_bytes:,} bytes "
                            f"({s.worst_tile_bytes / s.capacity_bytes:.1%}) at the worst tile")


def test_output_file_is_written_atomically_and_matches_stdout(capsys, tmp_path):
    plan = make_plan(["0", "1", "2"], [0, 1], paths=["h.0", "h.1", "h.2"])
    write_plan(plan, tmp_path / "p.json")
    code, out, _ = run(capsys, "export", tmp_path / "p.json", "--to", "poptorch")
    code2, out2, err2 = run(capsys, "export", tmp_path / "p.json", "--to", "poptorch", "-o", tmp_path / "x.py")
    assert (code, code2, out2) == (0, 0, "") and err2.strip() == f"wrote {tmp_path / 'x.py'}"
    assert (tmp_path / "x.py").read_text() == out
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    code, _, err = run(capsys, "export", tmp_path / "p.json", "--to", "poptorch", "-o", tmp_path / "nodir" / "x.py")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "cannot write" in err


def test_export_help_lists_every_format(capsys):
    with pytest.raises(SystemExit):
        main(["export", "--help"])
    out = capsys.readouterr().out
    for name, spec in FORMATS.items():
        assert re.search(rf"^  {re.escape(name)}\s+{re.escape(spec.description[:30])}", out, re.M), name


@given(splits)
@settings(max_examples=40, deadline=None)
def test_every_python_snippet_parses(case):
    plan = plan_from(case, micro_batches=12)
    for fmt in PYTHON_FORMATS:
        if fmt == "tf-ipu" and len(plan.stages) < 2:
            continue                                                 # refused (test_export_ipu.py)
        training = export_plan(plan, fmt)
        ast.parse(training)
        inference = export_plan(plan, fmt, training=False)
        ast.parse(inference)
        if fmt == "deepspeed":                                       # micro-batches of train_batch and eval_batch alike
            assert inference == training
        elif fmt != "tf-ipu":                                        # pipeline() requires the count in inference too
            assert not re.search(r"ccumulation", inference.split("\n\n", 1)[1])     # no gradient accumulation




# -- json -----------------------------------------------------------------------------------------

@given(splits)
@settings(max_examples=30, deadline=None)
def test_json_export_lists_each_stage_s_layers(case):
    plan = plan_from(case)
    doc = json.loads(export_plan(plan, "json"))
    assert [s["layers"] for s in doc["stages"]] == stages_of(plan)
    assert [s["module_paths"] for s in doc["stages"]] == [[f"blocks.{n}" for n in s.layers] for s in plan.stages]
    assert doc["header"] == header_lines(view_of(plan), "json")


# -- the Python API: arguments and messages ----------------------------------------------------------

def test_api_errors_name_the_plan_file_or_the_parameter(tmp_path):
    plan = make_plan(["0", "1", "2"], [0, 2])
    plan.stages[1].layers = []
    with pytest.raises(ExportError) as exc:                          # in memory: no file to name
        export_plan(plan, "json")
    assert str(exc.value) == "stage 1 holds no layer (an empty stage); remove it or give it layers"
    with pytest.raises(ExportError) as exc:
        export_plan(plan, "json", source=tmp_path / "p.json")
    assert str(exc.value) == f"{tmp_path / 'p.json'}: stage 1 holds no layer (an empty stage); remove it or give " \
                             "it layers"
    assert exc.value.source == str(tmp_path / "p.json")
    good = make_plan(["0", "1"], [0, 1])
    for args, parameter, message in [
            (({"stages": []}, "json"), "plan", "expected a stagesplit Plan (from solve or read_plan), got dict"),
            ((good, "nope"), "fmt", "unknown export format 'nope': expected one of poptorch, popart, tf-ipu, "
                                    "optimum-ipu, torch-pipelining, deepspeed, megatron, megatron-uneven, torchtitan, "
                                    "json"),
            ((good, "json", {"model": "class"}), "model", "expected a dotted Python name such as model or self.net "
                                                           "(keywords refused), got 'class'"),
            ((good, "json", {"training": "yes"}), "training", "expected True or False, got str"),
            ((good, "json", {"tied": ["x"]}), "tied", "expected TiedSplit records (from plan_tied_splits)")]:
        kwargs = args[2] if len(args) > 2 else {}
        with pytest.raises(OptionError) as exc:
            export_plan(*args[:2], **kwargs)
        assert (exc.value.parameter, exc.value.detail) == (parameter, message)


@pytest.mark.parametrize("field, value, message", [
    ("name", 5, "profile.name: expected a string, got 5"),
    ("path", ["a"], "profile.path: expected a string, got ['a']"),
    ("sha256", {"x": 1}, "profile.sha256: expected a string, got {'x': 1}")])
def test_profile_fields_of_the_wrong_type_are_one_line_naming_the_field(capsys, tmp_path, field, value, message):
    plan = make_plan(["0", "1"], [0, 1])
    write_plan(plan, tmp_path / "p.json")
    doc = json.loads((tmp_path / "p.json").read_text())
    doc["profile"][field] = value
    (tmp_path / "p.json").write_text(json.dumps(doc))
    code, out, err = run(capsys, "export", tmp_path / "p.json", "--to", "json")
    assert (code, out) == (2, "")
    assert err.strip().splitlines() == [f"stagesplit: error: {tmp_path / 'p.json'}: {message}"]


def test_model_option_names_the_model_and_must_be_a_dotted_name(capsys, tmp_path):
    plan = make_plan(["0", "1"], [0, 1], paths=["blocks.0", "blocks.1"])
    write_plan(plan, tmp_path / "p.json")
    code, out, _ = run(capsys, "export", tmp_path / "p.json", "--to", "torch-pipelining", "--model", "net")
    assert code == 0 and "#   stage, schedule, tied = build_pipeline(net, example_microbatch, device, loss_fn)" in out
    for bad in ("my model", "class", "net.def", "__class__", "1net", "net.", "ｍodel"):
        code, out, err = run(capsys, "export", tmp_path / "p.json", "--to", "poptorch", "--model", bad)
        assert (code, out) == (2, "")
        assert err.strip().splitlines() == [f"stagesplit: error: --model: expected a dotted Python name such as "
                                            f"model or self.net (keywords refused), got '{bad}'"]
