"""The frameworks' default splits (plan/baselines.py), each checked against the framework's own
code where it installs here: DeepSpeed's partition functions, torchtitan's module-name split,
megatron-core's layers per rank, torch.distributed.pipelining's split points; and how --compare
prices them under the same cost model."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from stagesplit.plan.baselines import (
    deepspeed_parameters,
    deepspeed_uniform,
    framework_baselines,
    megatron_even,
    torch_pipelining_equal,
    torchtitan_default,
)

# -- the rules by hand ------------------------------------------------------------------------------

def test_rules_by_hand():
    assert deepspeed_uniform(10, 4) == [0, 3, 6, 8, 10]            # 10 = 3 + 3 + 2 + 2
    assert deepspeed_uniform(3, 5) == [0, 1, 2, 3, 3, 3]
    # parts [5 | 1 1 1 | 2 2]: sums 5, 3, 4 - spread 2, the least of every 3-way split
    assert deepspeed_parameters([5, 1, 1, 1, 2, 2], 3) == [0, 1, 4, 6]
    assert megatron_even(32, 4) == [8, 8, 8, 8]
    assert "divisible" in megatron_even(33, 4)
    # torchtitan: 32 blocks + 1 + 1 = 34 over 4: 9, 9, 8, 8 less the embedding and the head
    assert torchtitan_default(32, 4) == [8, 9, 8, 7]
    assert torch_pipelining_equal(10, 4) == [2, 2, 2, 4]          # split points every 10 // 4 layers


def test_a_profile_with_embedding_and_head_layers():
    """llama-like: embed_tokens, 32 blocks, lm_head. Megatron puts the embedding on stage 0 and
    the head on stage 3 beside 8 blocks each; DeepSpeed counts them as layers."""
    by = {b.key: b for b in framework_baselines(34, 4, [1.0] * 34, embedding=True, head=True)}
    assert by["megatron-even"].bounds == (0, 9, 17, 25, 34)
    assert by["deepspeed-uniform"].bounds == (0, 9, 18, 26, 34)
    assert by["torchtitan-default"].bounds == (0, 9, 18, 26, 34)
    assert by["torch-pipelining-equal"].bounds == (0, 9, 17, 25, 34)
    refused = {b.key: b.reason for b in framework_baselines(35, 4, [1.0] * 35, embedding=True, head=True)}
    assert "33 layers on 4 ranks" in refused["megatron-even"]


# -- against the frameworks' own code ----------------------------------------------------------------

def _deepspeed_utils():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed here (pip install deepspeed)")
    from deepspeed.runtime import utils
    return utils


@pytest.mark.filterwarnings("ignore")
@given(st.integers(1, 40), st.integers(1, 12))
@settings(max_examples=60, deadline=None)
def test_deepspeed_uniform_is_deepspeeds(items, parts):
    assert deepspeed_uniform(items, parts) == list(_deepspeed_utils().partition_uniform(items, parts))


@pytest.mark.filterwarnings("ignore")
@given(st.lists(st.integers(0, 50), min_size=1, max_size=18), st.integers(1, 6))
@settings(max_examples=80, deadline=None)
def test_deepspeed_parameters_is_deepspeeds(weights, parts):
    """Small integer weights make many ties: DeepSpeed's choice among equals is kept too."""
    ours = deepspeed_parameters(weights, parts)
    theirs = [int(x) for x in _deepspeed_utils().partition_balanced(weights, parts)]
    assert ours == theirs


def _torchtitan_split():
    pytest.importorskip("torchtitan", reason="torchtitan is not installed here (pip install torchtitan)")
    from torchtitan.distributed.pipeline_parallel import _generate_llm_fqn_per_model_part
    return _generate_llm_fqn_per_model_part


@pytest.mark.slow                                          # importing torchtitan takes seconds
@pytest.mark.filterwarnings("ignore")
@given(st.integers(1, 40), st.integers(1, 10))
@settings(max_examples=60, deadline=None)
def test_torchtitan_default_is_torchtitans(blocks, stages):
    split = _torchtitan_split()
    try:
        modules = split(stages, blocks)                  # its defaults: input_weight = output_weight = 1
    except ValueError:
        assert isinstance(torchtitan_default(blocks, stages), str)
        return
    assert torchtitan_default(blocks, stages) == [sum(m.startswith("layers.") for m in part) for part in modules]


@pytest.mark.slow
def test_torchtitans_defaults_are_one_and_one():
    pytest.importorskip("torchtitan", reason="torchtitan is not installed here")
    from torchtitan.config.configs import ParallelismConfig
    config = ParallelismConfig()
    assert (config.pipeline_parallel_first_stage_less_layers, config.pipeline_parallel_last_stage_less_layers) == (1, 1)


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("layers, ranks", [(8, 4), (32, 4), (12, 3), (9, 4), (7, 2), (6, 6)])
def test_megatron_even_is_megatron_cores(layers, ranks):
    pytest.importorskip("megatron.core", reason="megatron-core is not installed here (pip install megatron-core)")
    import torch
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_config import TransformerConfig
    config = TransformerConfig(num_layers=layers, hidden_size=16, num_attention_heads=2,
                               pipeline_model_parallel_size=ranks, pipeline_dtype=torch.float32,
                               use_cpu_initialization=True)
    ours = megatron_even(layers, ranks)
    if layers % ranks:
        with pytest.raises(AssertionError, match="divisible"):
            get_num_layers_to_build(config, pp_rank=0)
        assert isinstance(ours, str)
    else:
        assert ours == [get_num_layers_to_build(config, pp_rank=r) for r in range(ranks)]


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("blocks, stages", [(8, 4), (10, 4), (5, 2), (7, 3)])
def test_torch_pipelining_equal_split_is_what_pipeline_builds(blocks, stages):
    """The split_spec of torch's examples, given to torch's own pipeline(): each stage module
    holds the blocks this rule says."""
    torch = pytest.importorskip("torch")
    from torch import nn
    from torch.distributed.pipelining import SplitPoint, pipeline

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(4, 4)
            self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(blocks))
            self.head = nn.Linear(4, 4)

        def forward(self, x):
            x = self.embed(x)
            for layer in self.layers:
                x = layer(x)
            return self.head(x)

    step = blocks // stages
    spec = {f"layers.{i * step}": SplitPoint.BEGINNING for i in range(1, stages)}
    pipe = pipeline(Net(), mb_args=(torch.zeros(2, 4),), split_spec=spec)
    counts = []
    for s in range(pipe.num_stages):
        names = {n.rsplit(".", 1)[0] for n, _ in pipe.get_stage_module(s).named_parameters()}
        counts.append(sum(1 for n in names if n.startswith("layers")))
    assert torch_pipelining_equal(blocks, stages) == counts


# -- priced by the cost model -------------------------------------------------------------------------

def test_compare_on_a_gpu_profile_prices_every_framework(tmp_path):
    """llama-7b-layers.json on 4 A100s with 1F1B: the frameworks' splits become plans priced by
    the same cost model; the plan's step is never slower than a feasible alternative's."""
    import stagesplit
    from helpers import PROFILES
    from stagesplit.reporting.units import device_words
    from stagesplit.reporting.why import compare_line, comparisons, step_time
    plan = stagesplit.solve(PROFILES / "llama-7b-layers.json", 4, schedule="1f1b", compare=True)
    methods = [b.method for b in plan.baselines]
    assert methods == ["megatron-even", "deepspeed-parameters", "deepspeed-uniform", "torchtitan-default",
                       "torch-pipelining-equal"]
    by = {b.method: b for b in plan.baselines}
    assert [(s.first_layer, s.last_layer) for s in by["megatron-even"].stages] == [(0, 8), (9, 16), (17, 24), (25, 33)]
    assert [(s.first_layer, s.last_layer) for s in by["torchtitan-default"].stages] == \
        [(0, 8), (9, 17), (18, 25), (26, 33)]
    for b in plan.baselines:
        if b.feasible:
            assert step_time(plan) <= step_time(b) * (1 + 1e-9)
    lines = [compare_line(c) for c in comparisons(plan, plan.baselines, device_words(1))]
    # torchtitan's last stage holds 8 blocks and the head: slower than the optimal stage 3 (8 blocks)
    speedup = step_time(by["torchtitan-default"]) / step_time(plan)
    assert lines[3] == f"{speedup:.2f}x faster than torchtitan's default split"
    assert speedup > 1.01


def test_a_framework_split_that_does_not_fit_says_which_stage(tmp_path):
    """Mixed capacities: a 40 GB first device cannot hold the even split's stage 0 (the
    embedding, 8 blocks and 4 micro-batches of stashed activations: 43.4 GiB)."""
    import stagesplit
    from helpers import PROFILES
    from stagesplit.reporting.units import device_words
    from stagesplit.reporting.why import comparisons
    plan = stagesplit.solve(PROFILES / "llama-7b-layers.json", 4, schedule="1f1b", compare=True,
                            min_layers=1, reserve=0, headroom=0.0,
                            targets=("a100-40gb", "a100-80gb", "a100-80gb", "a100-80gb"))
    by = {c.label: c for c in comparisons(plan, plan.baselines, device_words(1))}
    megatron = by["Megatron's even layout"]
    even = next(b for b in plan.baselines if b.method == "megatron-even")
    stage = even.stages[0]
    # kept back on every device: the CUDA context (512 MiB) and NCCL's buffers for a middle stage's two
    # neighbours and the pipeline group (4 x 16 channels x 4 MiB)
    kept = plan.inputs.runtime_reserve.estimate_bytes
    assert kept == 512 * 2**20 + 4 * 64 * 2**20
    assert stage.worst_tile_bytes > stage.capacity_bytes == 40 * 2**30 - kept
    assert megatron.problem == (f"does not fit stage 0 ({stage.worst_tile_bytes / 2**30:,.2f} of 39.25 GiB)")
    assert megatron.speedup is not None
    assert plan.feasible and all(s.fits for s in plan.stages)


def test_an_ipu_profile_still_compares_with_popliners_greedy():
    import stagesplit
    from helpers import PROFILES
    plan = stagesplit.solve(PROFILES / "bert-base.stagesplit", 4, compare=True)
    assert [b.method.split(" ")[0] for b in plan.baselines] == ["greedy", "uniform"]


def test_parameter_weights_are_the_layers_own_always_live_bytes():
    from helpers import PROFILES
    from stagesplit.model.analysis import Analysis
    from stagesplit.plan.comparison import layer_parameter_bytes
    model = Analysis.load(PROFILES / "llama-7b-layers.json").model
    weights = layer_parameter_bytes(model)
    assert len(weights) == 34
    assert weights[1] == weights[2] > weights[0] > 0                  # a block's weights outweigh the embedding's
    assert np.all(weights[1:33] == weights[1])
