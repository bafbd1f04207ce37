"""The IPU exports of plans solved on profile variants: each IPU gets the memory proportion of
the variant its stage was priced with, in each framework's own form, run against the stand-ins
(standins.py), which enforce the documented rules (one proportion per IPU, 0 < p <= 1)."""

from __future__ import annotations

import dataclasses

import pytest
from exporthelpers import ModuleRef, plan_from, splits
from hypothesis import given, settings, strategies as st
from standins import (
    FakeBuilder,
    IPUConfig,
    PipelineStageOptions,
    PopTorchRecord,
    RuleError,
    installed,
    optimum_modules,
    popart_module,
    poptorch_module,
    tensorflow_modules,
)

from stagesplit.errors import ExportError
from stagesplit.exporters import export_plan

PROPORTIONS = (0.1, 0.2, 0.25, 0.6, 1.0)


def with_proportions(plan, proportions):
    """``plan`` with each stage on a profile variant of the given proportion."""
    stages = [dataclasses.replace(s, memory_proportion=p, variant=None if p is None else f"amp{p:g}") for s, p in zip(plan.stages, proportions)]
    return dataclasses.replace(plan, stages=stages)


variant_plans = splits.flatmap(lambda case: st.tuples(
    st.just(case), st.lists(st.sampled_from(PROPORTIONS), min_size=len(case[1]) + 1, max_size=len(case[1]) + 1)))


@given(variant_plans, st.booleans(), st.sampled_from([0.0, 0.15]))
@settings(max_examples=30, deadline=None)
def test_poptorch_sets_each_ipu_s_proportion(case, training, headroom):
    (split, proportions) = case
    plan = with_proportions(plan_from(split, headroom=headroom, devices=[2 * k for k in range(len(split[1]) + 1)]),
                            proportions)
    record = PopTorchRecord()
    with installed(poptorch_module(record)):
        exec(compile(export_plan(plan, "poptorch", training=training), "poptorch-snippet", "exec"),
             {"model": ModuleRef("model", [])})
    record.check(training)                    # one proportion in (0, 1] per IPU the blocks use
    # the variants' proportions, not the headroom's scaled default: the plan's memory holds with them
    assert record.memory == {f"IPU{s.device}": p for s, p in zip(plan.stages, proportions)}


@given(variant_plans, st.booleans())
@settings(max_examples=30, deadline=None)
def test_optimum_matmul_proportion_lists_each_ipu_s(case, training):
    (split, proportions) = case
    plan = with_proportions(plan_from(split, headroom=0.2), proportions)
    configs = []
    with installed(*optimum_modules(configs)):
        exec(compile(export_plan(plan, "optimum-ipu", training=training), "optimum-snippet", "exec"), {})
    (config,) = configs
    prefix = "" if training else "inference_"
    assert getattr(config, f"{prefix}matmul_proportion") == list(proportions)
    assert getattr(config, f"{prefix}ipus_per_replica") == len(plan.stages)


@given(variant_plans, st.booleans())
@settings(max_examples=30, deadline=None)
def test_popart_helper_sets_each_operation_s_proportion(case, training):
    (split, proportions) = case
    plan = with_proportions(plan_from(split, devices=[2 * k for k in range(len(split[1]) + 1)]), proportions)
    options, ns = [], {}
    with installed(popart_module(options)):
        exec(compile(export_plan(plan, "popart", training=training), "popart-snippet", "exec"), ns)
    builder = FakeBuilder()
    for name in plan.layer_names:              # one matmul per layer, built in its stage's scope
        with ns["stage_scope"](builder, name):
            ns["set_memory_proportion"](builder, name, f"{name}/matmul:0")
    want = [(f"{name}/matmul:0", p, s.device, s.stage) for s, p in zip(plan.stages, proportions) for name in s.layers]
    assert builder.memory_proportions == want


@given(variant_plans.filter(lambda c: len(c[0][1]) >= 1), st.booleans())
@settings(max_examples=30, deadline=None)
def test_tf_ipu_passes_one_stage_options_per_stage(case, training):
    (split, proportions) = case
    plan = with_proportions(plan_from(split, micro_batches=3), proportions)
    calls = []
    with installed(*tensorflow_modules(calls, training)):
        ns = {"run_layer": lambda name, *a, **k: 0}
        exec(compile(export_plan(plan, "tf-ipu", training=training), "tf-snippet", "exec"), ns)
        ns["build_pipeline"](inputs=["x"])
    (call,) = calls
    flags = [{"availableMemoryProportion": repr(p)} for p in proportions]
    assert [o.matmul_options for o in call["forward_options"]] == flags
    assert [o.convolution_options for o in call["forward_options"]] == flags
    if training:
        assert [o.matmul_options for o in call["backward_options"]] == flags
    else:
        assert call["backward_options"] is None


def test_plans_without_variants_write_no_proportion_lists():
    plan = plan_from((4, {2}))
    assert "MEMORY_PROPORTION_OF_STAGE" not in export_plan(plan, "popart")
    assert "MEMORY_PROPORTION_OF_STAGE" not in export_plan(plan, "tf-ipu")
    assert "setAvailableMemoryProportion" not in export_plan(plan, "poptorch")


def test_a_plan_with_a_stage_missing_its_proportion_is_refused():
    plan = with_proportions(plan_from((4, {1, 2})), [0.2, None, 0.6])
    with pytest.raises(ExportError, match="stage 1 has no memory_proportion but stage 0 has one"):
        export_plan(plan, "poptorch")
    plan = with_proportions(plan_from((4, {2})), [0.2, 1.5])
    with pytest.raises(ExportError, match=r"stage 1: memory_proportion 1\.5: expected a number in \(0, 1\]"):
        export_plan(plan, "optimum-ipu")


def test_stand_ins_refuse_what_the_frameworks_refuse():
    record = PopTorchRecord(blocks=[("a", "stage0", 0), ("b", "stage1", 1)], strategy=("pipelined", "auto-increment"),
                            accumulation=4)
    options = poptorch_module(record).Options()
    with pytest.raises(AssertionError, match="Invalid key: ipu0"):        # PopTorch's own assertion
        options.setAvailableMemoryProportion({"ipu0": 0.2})
    for memory in ({"IPU0": 0.2}, {"IPU0": 0.2, "IPU1": 0.0}, {"IPU0": 0.2, "IPU1": 1.5}):
        options.setAvailableMemoryProportion(memory)
        with pytest.raises(RuleError, match="one proportion in \\(0, 1\\] per IPU"):
            record.check(training=True)
    with pytest.raises(RuleError, match="0 < proportion <= 1"):
        FakeBuilder().setAvailableMemoryProportion("out", 0)
    with pytest.raises(RuleError, match="availableMemoryProportion '1.2' is not in"):
        PipelineStageOptions(matmul_options={"availableMemoryProportion": "1.2"})
    with pytest.raises(TypeError, match="option flags are strings"):
        PipelineStageOptions(matmul_options={"availableMemoryProportion": 0.2})
    with pytest.raises(ValueError, match="must have all elements >= 0"):
        IPUConfig(layers_per_ipu=[1, 1], ipus_per_replica=2, matmul_proportion=[0.2, -0.1])
    with pytest.raises(RuleError, match="in \\(0, 1\\]"):
        IPUConfig(layers_per_ipu=[1, 1], ipus_per_replica=2, matmul_proportion=[0.2, 1.1])
    with pytest.raises(Exception, match="matmul_proportion"):
        IPUConfig(layers_per_ipu=[1, 1], ipus_per_replica=2, matmul_proportion=[0.2])
    calls = []
    with installed(*tensorflow_modules(calls, True)):
        import tensorflow.python
        ops = tensorflow.python.ipu.pipelining_ops
        with pytest.raises(ValueError, match="one PipelineStageOptions per computational stage"):
            ops.pipeline([lambda x: x, lambda x: x], gradient_accumulation_count=4, device_mapping=[0, 1],
                         forward_propagation_stages_poplar_options=[ops.PipelineStageOptions()])
