"""The DeepSpeed export, checked with DeepSpeed's own code: its partition grammar, its
``_partition_layers``/``stage_owner`` on the exported subclass, the FIRST_BLOCK check at
construction, and one real ``train_batch`` on CPU (2 processes, gloo) whose loss equals the
unpipelined model's."""

from __future__ import annotations

import ast
import os

import pytest
from exporthelpers import GPT_CONFIG, make_plan, plan_from, run, run_ranks, splits, stages_of
from hypothesis import given, settings

from stagesplit.exporters import export_plan
from stagesplit.plan import read_plan


def _deepspeed():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    return pytest.importorskip(
        "deepspeed", reason="DeepSpeed is not installed here (DS_BUILD_OPS=0 pip install deepspeed); "
                            "test_deepspeed_partition_grammar still checks the partition")


def _assigned(text: str, name: str):
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == name:
            return ast.literal_eval(node.value)
    raise AssertionError(f"no {name} in the snippet")


@given(splits)
@settings(max_examples=30, deadline=None)
def test_deepspeed_partition_grammar(case):
    """BOUNDARIES as the snippet assigns it (read with the AST) is a PipelineModule partition:
    parts[0] = 0 < parts[1] < ... < parts[-1] = number of layers."""
    plan = plan_from(case)
    parts = _assigned(export_plan(plan, "deepspeed"), "BOUNDARIES")
    assert parts[0] == 0 and parts[-1] == len(plan.layer_names) and parts == sorted(set(parts))
    assert [plan.layer_names[a:b] for a, b in zip(parts, parts[1:])] == stages_of(plan)


def _partition(cls, p, rank, specs):
    """PipelineModule.__init__'s partition step alone, on DeepSpeed's own topology."""
    import torch
    from deepspeed.runtime.pipe.topology import PipeDataParallelTopology
    module = cls.__new__(cls)
    torch.nn.Module.__init__(module)
    module.num_stages, module.global_rank = p, rank
    module._topo = PipeDataParallelTopology(num_pp=p, num_dp=1)
    module._layer_specs, module._num_layers = list(specs), len(specs)
    module._partition_layers()
    return module


@pytest.mark.parametrize("starts, first_block, extra", [([0, 3, 6, 9], 0, 1), ([0, 1, 11], 1, 2), ([0], 0, 0),
                                                        ([0, 5], 2, 0)])
def test_deepspeed_partition_by_deepspeeds_own_code(starts, first_block, extra):
    _deepspeed()
    plan = make_plan([str(i) for i in range(12)], starts)
    text = export_plan(plan, "deepspeed").replace("FIRST_BLOCK = 0", f"FIRST_BLOCK = {first_block}")
    ns: dict = {}
    exec(compile(text, "deepspeed-snippet", "exec"), ns)
    cls = ns["StagesplitPipelineModule"]
    n = first_block + len(plan.layer_names) + extra              # e.g. embedding + blocks + head + loss
    p = len(plan.stages)
    for rank in range(p):
        module = _partition(cls, p, rank, [None] * n)
        owned = range(module._local_start, module._local_stop)
        blocks = [plan.layer_names[i - first_block] for i in owned if first_block <= i < first_block + 12]
        assert blocks == plan.stages[rank].layers
        assert all(module.stage_owner(i) == rank for i in owned)
    assert module.stage_owner(0) == 0 and module.stage_owner(n - 1) == p - 1
    module.num_stages = p + 1                                    # a PipelineModule with the wrong stage count
    with pytest.raises(ValueError, match=f"the plan has {p} stages"):
        module._partition_layers()


def test_a_wrong_first_block_is_caught_at_construction():
    """#21: with the embedding as its own entry, the default FIRST_BLOCK = 0 shifted every stage
    by one without an error. The layer entries standing for the plan's blocks must be one class."""
    deepspeed = _deepspeed()
    from deepspeed.pipe import LayerSpec
    from torch import nn
    plan = make_plan([str(i) for i in range(6)], [0, 3])
    text = export_plan(plan, "deepspeed")
    ns: dict = {}
    exec(compile(text, "deepspeed-snippet", "exec"), ns)
    cls = ns["StagesplitPipelineModule"]
    assert deepspeed.__version__ >= "0.19"

    class Block(nn.Module):
        pass

    modules = [nn.Embedding(4, 2), *[Block() for _ in range(6)], nn.Linear(2, 4)]
    specs = [LayerSpec(nn.Embedding, 4, 2), *[LayerSpec(Block) for _ in range(6)], LayerSpec(nn.Linear, 2, 4)]
    for entries in (modules, specs):
        with pytest.raises(ValueError) as exc:
            _partition(cls, 2, 0, entries)
        assert str(exc.value) == ("layers[0:6] should be the plan's 6 transformer blocks, entries of one class, but "
                                  "they are ['Block', 'Embedding'] with FIRST_BLOCK=0; FIRST_BLOCK = 1 would make "
                                  "them one")
    fixed = text.replace("FIRST_BLOCK = 0", "FIRST_BLOCK = 1")
    exec(compile(fixed, "deepspeed-snippet", "exec"), ns)
    module = _partition(ns["StagesplitPipelineModule"], 2, 1, modules)
    assert module.parts == [0, 4, 8]                             # embedding + blocks 0-2 | blocks 3-5 + head


def test_per_layer_plans_keep_embedding_and_head_out_of_the_blocks(capsys, tmp_path):
    from helpers import PROFILES
    code, _, err = run(capsys, "solve", PROFILES / "llama-7b-layers.json", "--devices", 4, "--out",
                       tmp_path / "plan.json")
    assert code == 0, err
    text = export_plan(read_plan(tmp_path / "plan.json"), "deepspeed")
    assert _assigned(text, "BLOCKS") == [1, 33]                  # embed_tokens is 0, lm_head 33
    assert "other than 'embed_tokens' (the embedding) and 'lm_head' (the head) are transformer blocks" in text


# -- a real train_batch ---------------------------------------------------------------------------------

def _gpt_layers(model):
    """The example GPT as a PipelineModule layer list: the embedding, the blocks, the head."""
    import torch
    from torch import nn

    class Embed(nn.Module):
        def __init__(self, t):
            super().__init__()
            self.wte, self.wpe = t.wte, t.wpe

        def forward(self, idx):
            return self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))

    class Head(nn.Module):
        def __init__(self, gpt):
            super().__init__()
            self.ln_f, self.lm_head = gpt.transformer.ln_f, gpt.lm_head

        def forward(self, x):
            return self.lm_head(self.ln_f(x))

    return [Embed(model.transformer), *model.transformer.h, Head(model)]


def _train_batch_rank(rank, world, text, micro_batches, stage_layers, out_dir):
    import deepspeed
    import deepspeed.ops
    import torch
    from torch.nn import functional as F

    from examples.gpt import GPTConfig, build_real
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False    # no C++ build: gloo collectives suffice
    deepspeed.init_distributed(dist_backend="gloo")
    cfg = GPTConfig(**{**GPT_CONFIG, "batch": 2 * micro_batches})
    model, _ = build_real(cfg)
    ns: dict = {}
    exec(compile(text.replace("FIRST_BLOCK = 0", "FIRST_BLOCK = 1"), "deepspeed.py", "exec"), ns)   # the documented edit

    def loss_fn(logits, target):
        return F.cross_entropy(logits.flatten(0, 1), target.flatten())

    layers = _gpt_layers(model)
    module = ns["StagesplitPipelineModule"](layers=layers, num_stages=world, loss_fn=loss_fn)
    owned = [i - 1 for i in range(module._local_start, module._local_stop) if 1 <= i <= cfg.layers]
    assert owned == stage_layers[rank], (rank, owned)
    assert ns["GRADIENT_ACCUMULATION_STEPS"] == micro_batches
    engine, *_ = deepspeed.initialize(model=module, model_parameters=list(module.parameters()), config={
        "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": ns["GRADIENT_ACCUMULATION_STEPS"],
        "train_batch_size": 2 * micro_batches, "optimizer": {"type": "SGD", "params": {"lr": 0.0}},
        "steps_per_print": 10**9})
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, cfg.vocab_size, (2 * micro_batches, cfg.context), generator=g)
    targets = torch.randint(0, cfg.vocab_size, ids.shape, generator=g)
    batches = [(ids[i:i + 2], targets[i:i + 2]) for i in range(0, len(ids), 2)]
    loss = float(engine.train_batch(data_iter=iter(batches)))
    with torch.no_grad():                                           # the unpipelined model, the same weights
        reference = sum(float(loss_fn(model(x), y)) for x, y in batches) / len(batches)
    assert abs(loss - reference) <= 1e-6 * abs(reference), (loss, reference)
    (out_dir / f"rank{rank}").write_text(f"{loss!r} {reference!r}")


@pytest.mark.slow
def test_deepspeed_train_batch_matches_the_unpipelined_loss(capsys, captured_gpt, tmp_path):
    _deepspeed()
    code, _, err = run(capsys, "solve", captured_gpt, "--devices", 2, "--exact", "--schedule", "1f1b",
                       "--micro-batches", 4, "--pin-split", "4", "--out", tmp_path / "plan.json")
    assert code == 0, err
    plan = read_plan(tmp_path / "plan.json")
    text = export_plan(plan, "deepspeed", source=tmp_path / "plan.json")
    stage_layers = [list(range(s.first_layer, s.last_layer + 1)) for s in plan.stages]
    assert stage_layers == [[0, 1, 2, 3], [4, 5]]
    run_ranks(2, _train_batch_rank, text, 4, stage_layers, tmp_path)
    losses = [tuple(map(float, (tmp_path / f"rank{r}").read_text().split())) for r in range(2)]
    assert losses[0] == losses[1]                                    # every rank reports the same mean loss
