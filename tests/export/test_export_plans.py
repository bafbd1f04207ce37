"""``stagesplit export``: plans into training frameworks' own forms.

Each format is checked by what reads it: torch.distributed.pipelining for real on the example
GPT; Megatron's and DeepSpeed's own code where they are installed (grammar parsers written from
their documentation otherwise); and, for the IPU frameworks that cannot be installed, stand-ins
that record the BeginBlock and stage calls the snippet makes.
"""

from __future__ import annotations

import ast
import contextlib
import json
import re
import sys
import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import PROFILES, ROOT
from stagesplit.stagememory import MemoryBreakdown
from stagesplit.cli import main
from stagesplit.errors import StagesplitError
from stagesplit.export import FORMATS, export_plan, header_lines
from stagesplit.layers import LayerOptions, group_layers, module_path
from stagesplit.plan import Plan, StagePlan, read_plan, write_plan

PYTHON_FORMATS = ("poptorch", "popart", "tf-ipu", "optimum-ipu", "torch-pipelining", "deepspeed")


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def make_plan(names, starts, paths=None, devices=None, headroom=0.0, micro_batches=1) -> Plan:
    """A plan splitting ``names`` into stages beginning at ``starts`` (indices)."""
    bounds = list(starts) + [len(names)]
    devices = devices or list(range(len(starts)))
    stages = [StagePlan(stage=k, device=devices[k], first_layer=a, last_layer=b - 1, layers=names[a:b], in_flight=1,
                        capacity_bytes=1000, worst_tile=0, worst_tile_bytes=100 * (k + 1), memory_at_worst_tile=MemoryBreakdown(),
                        memory_total=MemoryBreakdown(), compute=float(b - a), time_s=None, bytes_received=0, bytes_sent=0)
              for k, (a, b) in enumerate(zip(bounds, bounds[1:]))]
    return Plan(profile={"name": "handmade", "sha256": "ab" * 32, "target": "ipu-mk2"},
                inputs={"objective": "compute", "headroom": headroom, "micro_batches": micro_batches,
                        "schedule": "none"},
                layer_names=list(names), devices=max(devices) + 1, method="cp-sat", status="optimal", feasible=True,
                message="", stages=stages, module_paths=list(paths) if paths is not None else [])


def stages_of(plan: Plan) -> list[list[str]]:
    return [list(s.layers) for s in plan.stages]


splits = st.integers(1, 12).flatmap(
    lambda n: st.tuples(st.just(n), st.sets(st.integers(1, n - 1), max_size=n - 1) if n > 1 else st.just(set())))


def plan_from(n_and_cuts, root="blocks") -> Plan:
    n, cuts = n_and_cuts
    names = [str(i) for i in range(n)]
    return make_plan(names, [0] + sorted(cuts), paths=[f"{root}.{i}" for i in range(n)])


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
    from stagesplit.builder import ProfileBuilder
    from stagesplit.profile import Target
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


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_hand_edited_plan_missing_a_layer_is_rejected(capsys, tmp_path, plan_doc, fmt):
    plan_doc["stages"][1]["layers"].remove("4")                      # a layer deleted from a stage's list
    code, out, err = _export_edited(capsys, tmp_path, plan_doc, fmt)
    assert (code, out) == (2, "")
    assert err.strip().splitlines() == ["stagesplit: error: layer '4' is in no stage: the plan would drop it"]


def test_hand_edited_plan_dropping_the_last_layer_is_rejected(capsys, tmp_path, plan_doc):
    last = plan_doc["stages"][-1]
    last["layers"].remove("11")
    last["last_layer"] = 10                                          # consistent indices, still a drop
    code, out, err = _export_edited(capsys, tmp_path, plan_doc, "megatron")
    assert code == 2 and out == ""
    assert err.strip().splitlines() == ["stagesplit: error: layer '11' is in no stage: the plan would drop it"]


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_hand_edited_plan_duplicating_a_layer_is_rejected(capsys, tmp_path, plan_doc, fmt):
    plan_doc["stages"][2]["layers"].insert(0, "5")                   # layer 5 also in stage 2
    code, out, err = _export_edited(capsys, tmp_path, plan_doc, fmt)
    assert (code, out) == (2, "")
    assert err.strip().splitlines() == ["stagesplit: error: layer '5' is in more than one stage (stages 1, 2)"]


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_hand_edited_plan_with_an_empty_stage_is_rejected(capsys, tmp_path, plan_doc, fmt):
    plan_doc["stages"][2]["layers"] = []
    code, out, err = _export_edited(capsys, tmp_path, plan_doc, fmt)
    assert (code, out) == (2, "")
    assert err.strip().splitlines() == [
        "stagesplit: error: stage 2 holds no layer (an empty stage); remove it or give it layers"]


def test_empty_stage_by_indices_and_reordered_stages_are_rejected(capsys, tmp_path, plan_doc):
    doc = json.loads(json.dumps(plan_doc))
    doc["stages"][2]["last_layer"] = doc["stages"][2]["first_layer"] - 1
    code, _, err = _export_edited(capsys, tmp_path, doc)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "stages[2].last_layer" in err
    doc = json.loads(json.dumps(plan_doc))
    doc["stages"][1]["layers"] = ["5", "4", "3"]                     # the stage's layers out of the plan's order
    code, _, err = _export_edited(capsys, tmp_path, doc)
    assert code == 2 and err.strip().splitlines() == [
        "stagesplit: error: stage 1 holds layers 5, 4, 3: expected consecutive layers from '3' in the plan's order"]
    doc = json.loads(json.dumps(plan_doc))
    doc["stages"][0]["stage"], doc["stages"][1]["stage"] = 1, 0     # stage numbers swapped
    code, _, err = _export_edited(capsys, tmp_path, doc)
    assert code == 2 and err.strip().splitlines() == [
        "stagesplit: error: stages[0] is numbered 1: stages must be listed in order 0, 1, 2, ..."]


def test_plan_without_a_split_is_rejected(capsys, tmp_path, plan_doc):
    plan_doc["stages"] = []
    code, _, err = _export_edited(capsys, tmp_path, plan_doc)
    assert code == 2 and err.strip().splitlines() == [
        "stagesplit: error: the plan has no stages (no split fitted); nothing to export"]


@pytest.mark.parametrize("fmt", ["poptorch", "torch-pipelining"])
def test_formats_needing_module_paths_say_so_without_guessing(capsys, tmp_path, fmt):
    plan = make_plan(["0", "1", "2"], [0, 2])                        # no module paths recorded
    write_plan(plan, tmp_path / "p.json")
    code, out, err = run(capsys, "export", tmp_path / "p.json", "--to", fmt)
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [
        f"stagesplit: error: {fmt} needs the module path of layer '{'0' if fmt == 'poptorch' else '2'}', but the plan "
        "has only its layer name; solve again from a profile whose operation names carry module paths "
        "(e.g. from stagesplit capture)"]


@pytest.mark.parametrize("fmt", [f for f in FORMATS if not FORMATS[f].needs_module_paths])
def test_formats_without_module_paths_work_from_layer_names(fmt):
    plan = make_plan(["0", "1", "2", "3"], [0, 1, 3])
    assert "stage 1 on device 1: layers 1 2; memory 200 bytes of 1,000 bytes (20.0%)" in export_plan(plan, fmt)


# -- the header -----------------------------------------------------------------------------------

def test_header_names_profile_hash_objective_and_every_stage(capsys, tmp_path):
    plan_path = tmp_path / "bert.json"
    assert main(["solve", str(PROFILES / "bert-base.stagesplit"), "--devices", "4", "--headroom", "0.1",
                 "--out", str(plan_path)]) == 0
    capsys.readouterr()
    plan = read_plan(plan_path)
    for fmt in FORMATS:
        code, out, _ = run(capsys, "export", plan_path, "--to", fmt)
        assert code == 0
        if fmt == "json":
            header = json.loads(out)["header"]
        else:
            header = [line[2:] for line in out.splitlines()[:4 + len(plan.stages)]]
            assert all(line.startswith("# ") for line in out.splitlines()[:4 + len(plan.stages)])
        assert header[0] == f"stagesplit export --to {fmt}"
        assert header[1].startswith("profile: bert-base (synthetic) from ")
        assert header[2] == f"profile sha256: {plan.profile['sha256']}"
        assert header[3].startswith("objective: compute, 10% headroom; status: optimal; split: [ 0 1 2 ")
        for s, line in zip(plan.stages, header[4:]):
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
    plan = plan_from(case)
    for fmt in PYTHON_FORMATS:
        ast.parse(export_plan(plan, fmt))
        inference = export_plan(plan, fmt, training=False)
        ast.parse(inference)
        assert not re.search(r"ccumulation", inference.split("\n\n", 1)[1])     # no gradient accumulation


# -- stand-ins for the IPU frameworks ------------------------------------------------------------

class ModuleRef:
    """Stands in for the user's model: records the attribute/index path of every module the
    snippet reads, and every assignment back into the model."""

    def __init__(self, path: str, log: list):
        object.__setattr__(self, "_path", path)
        object.__setattr__(self, "_log", log)

    def __getattr__(self, name):
        return ModuleRef(f"{self._path}.{name}", self._log)

    def __getitem__(self, index):
        return ModuleRef(f"{self._path}.{index}", self._log)

    def __setattr__(self, name, value):
        self._log.append((f"{self._path}.{name}", value))

    def __setitem__(self, index, value):
        self._log.append((f"{self._path}.{index}", value))


def _install(monkeypatch, name: str, **attrs) -> types.ModuleType:
    module = types.ModuleType(name)
    for key, value in attrs.items():
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, name, module)
    return module


def _run_poptorch(monkeypatch, text):
    blocks, options = [], []

    class Options:
        def __init__(self):
            self.Training = types.SimpleNamespace(gradientAccumulation=lambda n: options.append(("accumulation", n)))

        def setExecutionStrategy(self, strategy):
            options.append(("strategy", strategy))

        def setAvailableMemoryProportion(self, proportions):
            options.append(("memory", proportions))

    def begin_block(module, user_id=None, ipu_id=None):
        blocks.append((module._path, user_id, ipu_id))
        return ("block", module._path)

    _install(monkeypatch, "poptorch", BeginBlock=begin_block, Options=Options,
             PipelinedExecution=lambda stage: ("pipelined", stage),
             AutoStage=types.SimpleNamespace(AutoIncrement="auto-increment"))
    assigned = []
    exec(compile(text, "poptorch-snippet", "exec"), {"model": ModuleRef("model", assigned)})
    return blocks, assigned, dict(options)


def _stages_from_starts(plan, start_paths):
    index = {p: i for i, p in enumerate(plan.module_paths)}
    bounds = [index[p] for p in start_paths] + [len(plan.layer_names)]
    return [plan.layer_names[a:b] for a, b in zip(bounds, bounds[1:])]


@given(splits, st.sampled_from([0.0, 0.15]))
@settings(max_examples=30, deadline=None)
def test_poptorch_snippet_begins_a_block_at_every_stage_start(case, headroom):
    with pytest.MonkeyPatch.context() as monkeypatch:
        plan = plan_from(case)
        plan.inputs["headroom"] = headroom
        blocks, assigned, options = _run_poptorch(monkeypatch, export_plan(plan, "poptorch"))
    paths = [p.removeprefix("model.") for p, _, _ in blocks]
    assert _stages_from_starts(plan, paths) == stages_of(plan)
    assert [(u, i) for _, u, i in blocks] == [(f"stage{s.stage}", s.device) for s in plan.stages]
    assert assigned == [(p, ("block", p)) for p, _, _ in blocks]            # each wrapped module put back
    assert options["strategy"] == ("pipelined", "auto-increment")
    assert options["accumulation"] >= 2 * len(plan.stages)
    if headroom:
        assert options["memory"] == {f"IPU{s.device}": 0.51 for s in plan.stages}     # 0.6 x (1 - 0.15)
    else:
        assert "memory" not in options


def test_poptorch_snippet_indexes_module_lists_and_uses_plan_devices(monkeypatch):
    plan = make_plan(["0", "1", "2", "3"], [0, 2, 3], paths=["transformer.h.0", "transformer.h.1", "transformer.h.2",
                                                          "transformer.h.3"], devices=[0, 2, 3], micro_batches=16)
    text = export_plan(plan, "poptorch")
    assert 'model.transformer.h[2] = poptorch.BeginBlock(model.transformer.h[2], "stage1", ipu_id=2)' in text
    blocks, _, options = _run_poptorch(monkeypatch, text)
    assert blocks == [("model.transformer.h.0", "stage0", 0), ("model.transformer.h.2", "stage1", 2),
                      ("model.transformer.h.3", "stage2", 3)]
    assert options["accumulation"] == 16                              # the plan's micro-batches beat 2 x 3
    inference = export_plan(plan, "poptorch", training=False)
    assert "gradientAccumulation" not in inference


class FakeBuilder:
    """PopART's builder as the snippet uses it: virtualGraph and pipelineStage scopes."""

    def __init__(self):
        self.virtual_graph = None
        self.pipeline_stage = None

    @contextlib.contextmanager
    def _scope(self, attr, value):
        old = getattr(self, attr)
        setattr(self, attr, value)
        try:
            yield
        finally:
            setattr(self, attr, old)

    def virtualGraph(self, value):
        return self._scope("virtual_graph", value)

    def pipelineStage(self, value):
        return self._scope("pipeline_stage", value)


@given(splits)
@settings(max_examples=30, deadline=None)
def test_popart_snippet_places_every_layer_on_its_stage_and_device(case):
    plan = plan_from(case)
    plan.stages = [s.__class__(**{**s.__dict__, "device": 2 * s.device}) for s in plan.stages]   # devices 0, 2, 4
    with pytest.MonkeyPatch.context() as monkeypatch:
        opts = types.SimpleNamespace()
        _install(monkeypatch, "popart", SessionOptions=lambda: opts,
                 VirtualGraphMode=types.SimpleNamespace(Manual="manual"))
        ns = {}
        exec(compile(export_plan(plan, "popart"), "popart-snippet", "exec"), ns)
    builder = FakeBuilder()
    placed = {}
    for name in plan.layer_names:                                     # build each layer in its scope
        with ns["stage_scope"](builder, name):
            placed[name] = (builder.pipeline_stage, builder.virtual_graph)
        assert (builder.pipeline_stage, builder.virtual_graph) == (None, None)
    assert placed == {name: (s.stage, s.device) for s in plan.stages for name in s.layers}
    assert (opts.virtualGraphMode, opts.enablePipelining, opts.enableGradientAccumulation) == ("manual", True, True)
    assert opts.accumulationFactor >= 2 * len(plan.stages)


@given(splits)
@settings(max_examples=30, deadline=None)
def test_tf_ipu_snippet_runs_each_stage_s_layers_in_order(case):
    plan = plan_from(case)
    calls = {}
    with pytest.MonkeyPatch.context() as monkeypatch:
        ipu = types.SimpleNamespace(pipelining_ops=types.SimpleNamespace(pipeline=lambda **kw: calls.update(kw)))
        tf = _install(monkeypatch, "tensorflow")
        tf.python = _install(monkeypatch, "tensorflow.python", ipu=ipu)
        ran = []
        ns = {"run_layer": lambda name, x: (ran.append(name), x + 1)[1]}
        exec(compile(export_plan(plan, "tf-ipu"), "tf-snippet", "exec"), ns)
        ns["build_pipeline"](inputs=["x"])
    assert calls["device_mapping"] == [s.device for s in plan.stages]
    assert calls["gradient_accumulation_count"] >= 2 * len(plan.stages) and calls["inputs"] == ["x"]
    got, x = [], 0
    for stage in calls["computational_stages"]:
        ran.clear()
        x2 = stage(x)
        got.append(list(ran))
        assert x2 == x + len(ran)                                      # each stage threads its input through
        x = x2
    assert got == stages_of(plan)


@given(splits, st.sampled_from([0.0, 0.2]))
@settings(max_examples=30, deadline=None)
def test_optimum_ipu_config_reproduces_the_plan(case, headroom):
    plan = plan_from(case)
    plan.inputs["headroom"] = headroom
    configs = []
    with pytest.MonkeyPatch.context() as monkeypatch:
        optimum = _install(monkeypatch, "optimum")
        optimum.graphcore = _install(monkeypatch, "optimum.graphcore", IPUConfig=lambda **kw: configs.append(kw))
        exec(compile(export_plan(plan, "optimum-ipu"), "optimum-snippet", "exec"), {})
    (config,) = configs
    assert config["ipus_per_replica"] == len(plan.stages)
    counts = config["layers_per_ipu"]
    bounds = [sum(counts[:k]) for k in range(len(counts) + 1)]
    assert [plan.layer_names[a:b] for a, b in zip(bounds, bounds[1:])] == stages_of(plan)
    assert config.get("matmul_proportion") == ([0.48] * len(plan.stages) if headroom else None)   # 0.6 x 0.8


# -- DeepSpeed ------------------------------------------------------------------------------------

def _deepspeed_boundaries(text: str) -> list[int]:
    """BOUNDARIES as the snippet assigns it, read with the AST (the documented grammar of a
    PipelineModule partition: parts[0] = 0 < parts[1] < ... < parts[-1] = number of layers)."""
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "BOUNDARIES":
            return ast.literal_eval(node.value)
    raise AssertionError("no BOUNDARIES in the snippet")


@given(splits)
@settings(max_examples=30, deadline=None)
def test_deepspeed_partition_grammar(case):
    plan = plan_from(case)
    parts = _deepspeed_boundaries(export_plan(plan, "deepspeed"))
    assert parts[0] == 0 and parts[-1] == len(plan.layer_names) and parts == sorted(set(parts))
    assert [plan.layer_names[a:b] for a, b in zip(parts, parts[1:])] == stages_of(plan)


def _deepspeed():
    return pytest.importorskip(
        "deepspeed", reason="DeepSpeed is not installed here (DS_BUILD_OPS=0 pip install deepspeed); "
                            "test_deepspeed_partition_grammar still checks the partition")


@pytest.mark.parametrize("starts, first_block, extra", [([0, 3, 6, 9], 0, 1), ([0, 1, 11], 1, 2), ([0], 0, 0),
                                                        ([0, 5], 2, 0)])
def test_deepspeed_partition_by_deepspeeds_own_code(starts, first_block, extra):
    _deepspeed()
    import torch
    from deepspeed.runtime.pipe.topology import PipeDataParallelTopology
    plan = make_plan([str(i) for i in range(12)], starts)
    text = export_plan(plan, "deepspeed").replace("FIRST_BLOCK = 0", f"FIRST_BLOCK = {first_block}")
    ns = {}
    exec(compile(text, "deepspeed-snippet", "exec"), ns)
    cls = ns["StagesplitPipelineModule"]
    n = first_block + len(plan.layer_names) + extra              # e.g. embedding + blocks + head + loss
    p = len(plan.stages)
    for rank in range(p):                                        # PipelineModule.__init__'s partition step
        module = cls.__new__(cls)
        torch.nn.Module.__init__(module)
        module.num_stages, module.global_rank = p, rank
        module._topo = PipeDataParallelTopology(num_pp=p, num_dp=1)
        module._layer_specs, module._num_layers = [None] * n, n
        module._partition_layers()
        owned = range(module._local_start, module._local_stop)
        blocks = [plan.layer_names[i - first_block] for i in owned if first_block <= i < first_block + 12]
        assert blocks == plan.stages[rank].layers
        assert all(module.stage_owner(i) == rank for i in owned)
    assert module.stage_owner(0) == 0 and module.stage_owner(n - 1) == p - 1
    module.num_stages = p + 1                                    # a PipelineModule with the wrong stage count
    with pytest.raises(ValueError, match=f"the plan has {p} stages"):
        module._partition_layers()


# -- Megatron -------------------------------------------------------------------------------------

LAYOUT_GRAMMAR = re.compile(r"E?(?:t(?:\*\d+)?)?L?(?:\|E?(?:t(?:\*\d+)?)?L?)*")


def _layout_of(text: str) -> tuple[int, str]:
    m = re.search(r'--pipeline-model-parallel-size (\d+) --pipeline-model-parallel-layout "([^"]*)"', text)
    assert m, text
    return int(m.group(1)), m.group(2)


def _decoder_counts(layout: str) -> list[int]:
    """Decoder layers per stage, read with the grammar Megatron documents: stages separated by
    '|', E (embedding) first, L (loss) last, 't' a decoder layer and 't*N' N of them."""
    assert LAYOUT_GRAMMAR.fullmatch(layout), layout
    stages = layout.split("|")
    assert stages[0].startswith("E") and stages[-1].endswith("L") and layout.count("E") == layout.count("L") == 1
    return [sum(int(n or 1) for n in re.findall(r"t(?:\*(\d+))?", s)) for s in stages]


@given(splits)
@settings(max_examples=40, deadline=None)
def test_megatron_layout_grammar(case):
    plan = plan_from(case)
    size, layout = _layout_of(export_plan(plan, "megatron"))
    counts = _decoder_counts(layout)
    assert size == len(counts) == len(plan.stages)
    assert counts == [len(s.layers) for s in plan.stages]


def _megatron():
    return pytest.importorskip(
        "megatron.core", reason="megatron-core is not installed here (pip install megatron-core); "
                                "test_megatron_layout_grammar still checks the layout")


@pytest.mark.filterwarnings("ignore")
@given(splits)
@settings(max_examples=25, deadline=None)
def test_megatron_layout_by_megatrons_own_parser(case):
    _megatron()
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout
    plan = plan_from(case)
    size, layout = _layout_of(export_plan(plan, "megatron"))
    parsed = PipelineParallelLayerLayout(layout, size)
    parsed.validate_layer_layout(num_layers=len(plan.layer_names), mtp_num_layers=None)
    got = [[plan.layer_names[i] for i in parsed.get_layer_id_list(pp_rank=r)] for r in range(size)]
    assert got == stages_of(plan)


def _uneven_flags(text: str) -> dict[str, int]:
    line = [x for x in text.splitlines() if x.startswith("--")][0]
    return {k: int(v) for k, v in re.findall(r"--([a-z-]+) (\d+)", line)}


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("starts", [[0, 3, 6, 9], [0, 2, 5, 8], [0, 4, 7, 10], [0, 1, 4, 7, 10], [0, 5], [0]])
def test_megatron_uneven_flags_by_megatrons_own_code(starts):
    _megatron()
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset
    plan = make_plan([str(i) for i in range(12)], starts)
    if len(starts) == 1:
        with pytest.raises(StagesplitError, match="one stage needs no pipeline split"):
            export_plan(plan, "megatron-uneven")
        return
    flags = _uneven_flags(export_plan(plan, "megatron-uneven"))
    config = types.SimpleNamespace(
        num_layers=flags["num-layers"], pipeline_model_parallel_size=flags["pipeline-model-parallel-size"],
        num_layers_in_first_pipeline_stage=flags.get("decoder-first-pipeline-num-layers"),
        num_layers_in_last_pipeline_stage=flags.get("decoder-last-pipeline-num-layers"),
        pipeline_model_parallel_layout=None, virtual_pipeline_model_parallel_size=None,
        account_for_embedding_in_pipeline_split=False, account_for_loss_in_pipeline_split=False)
    got = []
    for rank in range(config.pipeline_model_parallel_size):
        offset = get_transformer_layer_offset(config, pp_rank=rank)
        got.append(plan.layer_names[offset:offset + get_num_layers_to_build(config, pp_rank=rank)])
    assert got == stages_of(plan)


def test_megatron_uneven_cannot_express_unequal_middle_stages(capsys, tmp_path):
    plan = make_plan([str(i) for i in range(12)], [0, 2, 5, 9])      # middle stages hold 3 and 4 layers
    write_plan(plan, tmp_path / "p.json")
    code, out, err = run(capsys, "export", tmp_path / "p.json", "--to", "megatron-uneven")
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [
        "stagesplit: error: megatron-uneven cannot express this plan: Megatron's --decoder-first/last-pipeline-num-"
        "layers need equal decoder layers in every stage but the first and last; this plan's middle stages hold 3, 4; "
        "use --to megatron (the layout flag)"]
    code, out, _ = run(capsys, "export", tmp_path / "p.json", "--to", "megatron")   # the layout expresses it
    assert code == 0 and _decoder_counts(_layout_of(out)[1]) == [2, 3, 4, 3]
    assert "not expressible without the layout flag" in out


# -- json -----------------------------------------------------------------------------------------

@given(splits)
@settings(max_examples=30, deadline=None)
def test_json_export_lists_each_stage_s_layers(case):
    plan = plan_from(case)
    doc = json.loads(export_plan(plan, "json"))
    assert [s["layers"] for s in doc["stages"]] == stages_of(plan)
    assert [s["module_paths"] for s in doc["stages"]] == [[f"blocks.{n}" for n in s.layers] for s in plan.stages]
    assert doc["header"] == header_lines(plan, "json")


# -- torch.distributed.pipelining, for real, on the example GPT -----------------------------------

GPT_CONFIG = dict(vocab_size=256, context=16, d_model=32, heads=2, layers=6, batch=2)
FACTORY = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
from examples.gpt import GPTConfig, build as build_gpt


def build():
    return build_gpt(GPTConfig(**{GPT_CONFIG!r}))
"""


@pytest.fixture(scope="module")
def captured_gpt(tmp_path_factory):
    """``stagesplit capture`` of examples/gpt.py (a small configuration), with exact bytes."""
    pytest.importorskip("torch")
    folder = tmp_path_factory.mktemp("capture")
    (folder / "small_gpt.py").write_text(FACTORY)
    path = folder / "gpt.stagesplit"
    assert main(["capture", f"{folder / 'small_gpt.py'}:build", "-o", str(path), "--allocator-round", "1"]) == 0
    return path


def _expected_stage_params(profile, plan, parameters: set[str]):
    """Per stage, the parameters (name -> bytes) that its layers' operations use, from the
    captured profile and the plan alone (a tied parameter is one variable, named by its first
    name, shared with the others: 'transformer.wte.weight [shared with lm_head.weight]')."""
    layers = group_layers(profile)
    names = profile.names
    stage_of_layer = {i: s.stage for s in plan.stages for i in range(s.first_layer, s.last_layer + 1)}
    out = [dict() for _ in plan.stages]
    ops = profile.operations
    for op in range(len(ops)):
        layer = int(layers.op_layer[op])
        assert layer >= 0, ops.name[op]
        for v in ops.vars[op]:
            name = names[profile.variables.name[v]].split(" [shared with ", 1)[0]
            if name in parameters:
                out[stage_of_layer[layer]][name] = int(profile.variables.bytes[v])
    return out


@pytest.mark.slow
@pytest.mark.parametrize("devices, pins", [(3, ["2", "4"]), (4, ["1", "2", "5"]), (2, ["5"])])
def test_torch_pipelining_stages_hold_exactly_the_planned_parameters(capsys, captured_gpt, tmp_path, devices, pins):
    """The exported split_spec, given to torch.distributed.pipelining.pipeline on CPU, gives stage
    modules that hold exactly the parameters the plan's layers use in the capture."""
    from stagesplit.io import load_profile
    from examples.gpt import GPTConfig, build_real
    argv = ["solve", captured_gpt, "--devices", devices, "--exact", "--out", tmp_path / "plan.json"]
    for pin in pins:
        argv += ["--pin-split", pin]
    code, _, err = run(capsys, *argv)
    assert code == 0, err
    plan = read_plan(tmp_path / "plan.json")
    assert [s.first_layer for s in plan.stages[1:]] == [int(p) for p in pins]
    assert plan.module_paths == [f"transformer.h.{i}" for i in range(GPT_CONFIG["layers"])]
    code, _, err = run(capsys, "export", tmp_path / "plan.json", "--to", "torch-pipelining", "-o", tmp_path / "pipe.py")
    assert code == 0, err

    model, example_input = build_real(GPTConfig(**GPT_CONFIG))
    canonical = {}                                               # tied parameters: one name per tensor
    for name, p in model.named_parameters(remove_duplicate=False):
        canonical.setdefault(id(p), name)
    alias = {name: canonical[id(p)] for name, p in model.named_parameters(remove_duplicate=False)}
    ns = {"model": model, "example_input": example_input}
    exec(compile((tmp_path / "pipe.py").read_text(), "pipe.py", "exec"), ns)
    pipe = ns["pipe"]
    assert pipe.num_stages == len(plan.stages)
    got = [{alias[n]: p.numel() * p.element_size() for n, p in pipe.get_stage_module(k).named_parameters()}
           for k in range(pipe.num_stages)]
    expected = _expected_stage_params(load_profile(captured_gpt), plan, set(canonical.values()))
    assert sum(map(len, expected)) >= len(canonical)             # every parameter is in some stage
    assert got == expected


@pytest.mark.filterwarnings("ignore")
def test_megatron_reads_embedding_and_head_layers_of_a_per_layer_plan(capsys, tmp_path):
    """LLaMA's per-layer profile has the embedding and the head as layers of their own: they
    become Megatron's E and L, not decoder layers."""
    code, _, err = run(capsys, "solve", PROFILES / "llama-7b-layers.json", "--devices", 4, "--exact",
                       "--pin-split", "layers.7", "--pin-split", "layers.15", "--pin-split", "layers.22",
                       "--out", tmp_path / "plan.json")
    assert code == 0, err
    plan = read_plan(tmp_path / "plan.json")
    assert (plan.layer_names[0], plan.layer_names[-1]) == ("embed_tokens", "lm_head")
    code, out, _ = run(capsys, "export", tmp_path / "plan.json", "--to", "megatron")
    assert code == 0
    size, layout = _layout_of(out)
    assert "--num-layers 32 " in out
    counts = _decoder_counts(layout)                                 # decoder layers: layers.0 .. layers.31
    assert counts == [7, 8, 7, 10]
    blocks = [[n for n in s.layers if n.startswith("layers.")] for s in plan.stages]
    assert [len(b) for b in blocks] == counts
    try:
        from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout
    except ImportError:
        return                                                       # the grammar check above still ran
    parsed = PipelineParallelLayerLayout(layout, size)
    parsed.validate_layer_layout(num_layers=32, mtp_num_layers=None)
    assert [[f"layers.{i}" for i in parsed.get_layer_id_list(pp_rank=r)] for r in range(size)] == blocks


def test_model_name_option_names_the_model_in_snippets(capsys, tmp_path):
    plan = make_plan(["0", "1"], [0, 1], paths=["blocks.0", "blocks.1"])
    write_plan(plan, tmp_path / "p.json")
    code, out, _ = run(capsys, "export", tmp_path / "p.json", "--to", "torch-pipelining", "--model", "net")
    assert code == 0 and "pipe = pipeline(net, mb_args=(example_input,), split_spec=split_spec)" in out
    code, out, err = run(capsys, "export", tmp_path / "p.json", "--to", "poptorch", "--model", "my model")
    assert code == 2 and err.strip().splitlines() == ["stagesplit: error: --model: expected a Python name, got 'my model'"]
