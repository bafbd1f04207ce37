"""The IPU exports (PopTorch, PopART, TensorFlow for IPU, optimum-graphcore), which cannot be
installed here: each generated file runs against a stand-in that records what it does and
enforces the framework's documented rules (standins.py), for training and inference."""

from __future__ import annotations

import pytest
from exporthelpers import ModuleRef, make_plan, plan_from, run, splits, stages_of
from hypothesis import given, settings, strategies as st
from standins import (
    FakeBuilder,
    PopTorchRecord,
    RuleError,
    installed,
    optimum_modules,
    popart_module,
    poptorch_module,
    tensorflow_modules,
)

from helpers import PROFILES
from stagesplit.exporters import export_plan
from stagesplit.plan import read_plan, write_plan

# -- PopTorch -------------------------------------------------------------------------------------

def _run_poptorch(text, model="model"):
    record = PopTorchRecord()
    assigned = []
    with installed(poptorch_module(record)):
        exec(compile(text, "poptorch-snippet", "exec"), {model: ModuleRef(model, assigned)})
    return record, assigned


def _stages_from_starts(plan, start_paths):
    index = {p: i for i, p in enumerate(plan.module_paths)}
    bounds = [index[p] for p in start_paths] + [len(plan.layer_names)]
    return [plan.layer_names[a:b] for a, b in zip(bounds, bounds[1:])]


@given(splits, st.sampled_from([0.0, 0.15]), st.booleans(), st.sampled_from([1, 4, 30]))
@settings(max_examples=40, deadline=None)
def test_poptorch_snippet_begins_a_block_at_every_stage_start(case, headroom, training, micro_batches):
    plan = plan_from(case, headroom=headroom, micro_batches=micro_batches)
    record, assigned = _run_poptorch(export_plan(plan, "poptorch", training=training))
    record.check(training)                                            # PopTorch's pipelining rules
    paths = [p.removeprefix("model.") for p, _, _ in record.blocks]
    assert _stages_from_starts(plan, paths) == stages_of(plan)
    assert [(u, i) for _, u, i in record.blocks] == [(f"stage{s.stage}", s.device) for s in plan.stages]
    assert assigned == [(p, ("block", p)) for p, _, _ in record.blocks]      # each wrapped module put back
    p = len(plan.stages)
    if training:
        assert record.accumulation == max(2 * p, micro_batches) and record.device_iterations is None
    else:
        assert record.device_iterations == max(p, micro_batches) and record.accumulation is None
    if headroom:
        assert record.memory == {f"IPU{s.device}": 0.51 for s in plan.stages}     # 0.6 x (1 - 0.15)
    else:
        assert record.memory is None


def test_poptorch_stand_in_refuses_what_poptorch_refuses():
    record = PopTorchRecord(blocks=[("a", "stage0", 0), ("b", "stage1", 1), ("c", "stage2", 2)],
                            strategy=("pipelined", "auto-increment"), accumulation=4)
    with pytest.raises(RuleError, match="gradient accumulation >= 5"):
        record.check(training=True)
    record.device_iterations = 2
    with pytest.raises(RuleError, match="deviceIterations >= 3"):
        record.check(training=False)
    with pytest.raises(TypeError):                                    # BeginBlock's real signature
        poptorch_module(record).BeginBlock(ModuleRef("m", []), "stage0", ipu=1)


def test_poptorch_snippet_indexes_module_lists_and_uses_plan_devices():
    plan = make_plan(["0", "1", "2", "3"], [0, 2, 3], paths=["transformer.h.0", "transformer.h.1", "transformer.h.2",
                                                          "transformer.h.3"], devices=[0, 2, 3], micro_batches=16)
    text = export_plan(plan, "poptorch")
    assert 'model.transformer.h[2] = poptorch.BeginBlock(model.transformer.h[2], "stage1", ipu_id=2)' in text
    record, _ = _run_poptorch(text)
    assert record.blocks == [("model.transformer.h.0", "stage0", 0), ("model.transformer.h.2", "stage1", 2),
                             ("model.transformer.h.3", "stage2", 3)]
    assert record.accumulation == 16                                  # the plan's micro-batches beat 2 x 3
    record, _ = _run_poptorch(export_plan(plan, "poptorch", training=False))
    assert record.accumulation is None and record.device_iterations == 16


def test_poptorch_model_option_names_a_dotted_model():
    plan = make_plan(["0", "1"], [0, 1], paths=["blocks.0", "blocks.1"])
    record, assigned = _run_poptorch(export_plan(plan, "poptorch", model="net"), model="net")
    assert [p for p, _, _ in record.blocks] == ["net.blocks.0", "net.blocks.1"]
    text = export_plan(plan, "poptorch", model="self.net")
    assert "self.net.blocks[1] = poptorch.BeginBlock(self.net.blocks[1]" in text
    record = PopTorchRecord()
    with installed(poptorch_module(record)):
        exec(compile(text, "poptorch-snippet", "exec"), {"self": ModuleRef("self", [])})
    assert [p for p, _, _ in record.blocks] == ["self.net.blocks.0", "self.net.blocks.1"]


# -- PopART ---------------------------------------------------------------------------------------

@given(splits, st.booleans(), st.sampled_from([1, 20]))
@settings(max_examples=30, deadline=None)
def test_popart_snippet_places_every_layer_on_its_stage_and_device(case, training, micro_batches):
    plan = plan_from(case, micro_batches=micro_batches, devices=[2 * k for k in range(len(case[1]) + 1)])
    options = []
    ns: dict = {}
    with installed(popart_module(options)):
        exec(compile(export_plan(plan, "popart", training=training), "popart-snippet", "exec"), ns)
    (opts,) = options
    opts.check(len(plan.stages), training, ns.get("BATCHES_PER_STEP"))      # PopART's pipelining rules
    builder = FakeBuilder()
    placed = {}
    for name in plan.layer_names:                                     # build each layer in its scope
        with ns["stage_scope"](builder, name):
            placed[name] = (builder.pipeline_stage, builder.virtual_graph)
        assert (builder.pipeline_stage, builder.virtual_graph) == (None, None)
    assert placed == {name: (s.stage, s.device) for s in plan.stages for name in s.layers}
    if training:
        assert opts.accumulationFactor == max(2 * len(plan.stages), micro_batches)
    else:
        assert ns["BATCHES_PER_STEP"] == max(len(plan.stages), micro_batches)
        assert not hasattr(opts, "accumulationFactor")


# -- TensorFlow for IPU ---------------------------------------------------------------------------

@given(splits.filter(lambda c: len(c[1]) >= 1), st.booleans())
@settings(max_examples=30, deadline=None)
def test_tf_ipu_snippet_runs_each_stage_s_layers_in_order(case, training):
    plan = plan_from(case, micro_batches=3)
    calls = []
    ran = []

    def run_layer(name, *args, **kwargs):
        ran.append(name)
        if kwargs:                                                    # the dict infeed, first layer only
            assert not args and ran == [plan.layer_names[0]]
            return kwargs["x"] + 1
        (x,) = args
        return x + 1

    ns = {"run_layer": run_layer}
    with installed(*tensorflow_modules(calls, training)):
        exec(compile(export_plan(plan, "tf-ipu", training=training), "tf-snippet", "exec"), ns)
        ns["build_pipeline"](inputs=["x"])                            # the stand-in enforces pipeline()'s rules
    (call,) = calls
    assert call["device_mapping"] == [s.device for s in plan.stages] and call["inputs"] == ["x"]
    p = len(plan.stages)
    assert call["gradient_accumulation_count"] == (max(2 * p, 3) if training else max(p, 3))
    got, x = [], 0
    for k, stage in enumerate(call["computational_stages"]):
        ran.clear()
        x2 = stage(x=x) if k == 0 else stage(x)                      # a dict infeed: keyword arguments
        got.append(list(ran))
        assert x2 == x + len(ran)                                      # each stage threads its input through
        x = x2
    assert got == stages_of(plan)


def test_tf_ipu_refuses_a_one_stage_pipeline(capsys, tmp_path):
    write_plan(make_plan(["0", "1"], [0]), tmp_path / "p.json")
    code, out, err = run(capsys, "export", tmp_path / "p.json", "--to", "tf-ipu")
    assert (code, out) == (2, "")
    assert err.strip().splitlines() == [
        f"stagesplit: error: {tmp_path / 'p.json'}: tf-ipu: TensorFlow's pipelining_ops.pipeline() needs at least 2 "
        "computational stages and this plan has 1; run the model without pipelining"]
    with pytest.raises(ValueError, match="at least two computational stages"):   # what TF itself would say
        with installed(*tensorflow_modules([], True)):
            import tensorflow.python
            tensorflow.python.ipu.pipelining_ops.pipeline([lambda x: x], gradient_accumulation_count=4,
                                                          device_mapping=[0])


# -- optimum-graphcore ----------------------------------------------------------------------------

def _run_optimum(text):
    configs = []
    with installed(*optimum_modules(configs)):
        exec(compile(text, "optimum-snippet", "exec"), {})
    (config,) = configs
    return config


@given(splits, st.sampled_from([0.0, 0.2]), st.booleans())
@settings(max_examples=30, deadline=None)
def test_optimum_ipu_config_reproduces_the_plan(case, headroom, training):
    plan = plan_from(case, headroom=headroom)
    config = _run_optimum(export_plan(plan, "optimum-ipu", training=training))
    ipus = config.layer_ipus(len(plan.layer_names), training)        # optimum's expansion and checks
    assert [[plan.layer_names[i] for i, ipu in enumerate(ipus) if ipu == k] for k in range(len(plan.stages))] \
        == stages_of(plan)
    prefix = "" if training else "inference_"
    assert getattr(config, f"{prefix}ipus_per_replica") == len(plan.stages)
    want = [0.16] * len(plan.stages) if headroom else 0.2              # optimum's default 0.2 x 0.8, or 0.2 itself
    assert getattr(config, f"{prefix}matmul_proportion") == want


def test_optimum_counts_transformer_layers_of_a_per_layer_plan(capsys, tmp_path):
    """#21: LLaMA's per-layer plan has the embedding and the head as layers of their own; they
    are not transformer layers, so layers_per_ipu sums to 32 (it said 34, which optimum refuses)."""
    code, _, err = run(capsys, "solve", PROFILES / "llama-7b-layers.json", "--devices", 8, "--schedule", "1f1b",
                       "--micro-batches", 16, "--out", tmp_path / "plan.json")
    assert code == 0, err
    plan = read_plan(tmp_path / "plan.json")
    assert (plan.layer_names[0], plan.layer_names[-1], len(plan.layer_names)) == ("embed_tokens", "lm_head", 34)
    text = export_plan(plan, "optimum-ipu")
    config = _run_optimum(text)
    ipus = config.layer_ipus(32, training=True)
    blocks = [[n for n in s.layers if n.startswith("layers.")] for s in plan.stages]
    assert [[f"layers.{i}" for i, ipu in enumerate(ipus) if ipu == k] for k in range(8)] == blocks
    assert "'embed_tokens' is the embedding; 'lm_head' is the head: not counted" in text
    with pytest.raises(Exception, match="correct number of layers"):  # 34 would be refused by optimum
        config.layer_ipus(34, training=True)
