"""The plan's activation recompute in each export (#24), read by the frameworks' own code where it
installs (torchtitan's ConfigManager, megatron-core's TransformerConfig, DeepSpeed's
PipelineModule, torch's checkpointing), PopTorch by its stand-in; what a framework cannot
express is said in one line, and names from the plan stay data.

The plans here are made by hand (exporthelpers.make_plan) with a recompute option per layer;
tests/exporters/test_export_recompute_torch.py runs the torch-pipelining export of solved plans
for real."""

from __future__ import annotations

import ast
import dataclasses
import shlex

import pytest
from exporthelpers import ModuleRef, make_plan, run
from standins import PopTorchRecord, installed, poptorch_module

from stagesplit.errors import ExportError
from stagesplit.exporters import export_plan
from stagesplit.exporters.render import literal_assignments
from stagesplit.model.recompute import EXPENSIVE_OPERATIONS
from stagesplit.plan import write_plan

NAMES = [str(i) for i in range(6)]
PATHS = [f"transformer.h.{i}" for i in range(6)]


def _plan(choices, starts=(0, 3), schedule="1f1b", names=NAMES, paths=PATHS, **kw):
    """A plan of six layers split at ``starts`` with per-layer recompute ``choices``."""
    plan = make_plan(list(names), list(starts), paths=list(paths) if paths else None, schedule=schedule,
                     micro_batches=4, **kw)
    bounds = list(starts) + [len(names)]
    plan.stages = [dataclasses.replace(s, recompute=tuple(choices[a:b]))
                   for s, (a, b) in zip(plan.stages, zip(bounds, bounds[1:]))]
    return plan


MIXED = ("full", "none", "selective", "none", "full", "full")


# -- torch-pipelining --------------------------------------------------------------------------------

def test_torch_pipelining_names_every_recomputed_block_and_its_option():
    text = export_plan(_plan(MIXED), "torch-pipelining")
    data = literal_assignments(ast.parse(text))
    assert data["RECOMPUTE"] == {"transformer.h.0": "full", "transformer.h.2": "selective", "transformer.h.4": "full",
                                 "transformer.h.5": "full"}
    # traced stages are wrapped after pipeline(); stages built from modules wrap each block as they take it
    assert "            apply_recompute(modules[k])" in text
    assert ('        modules = model_stages(model, BLOCKS, STAGE_STARTS, example_microbatch, '
            'wrap=lambda i, block: recompute_block(f"{BLOCKS}.{i}", block))') in text
    # no recompute: no recompute code at all
    plain = export_plan(_plan(("none",) * 6), "torch-pipelining")
    assert "RECOMPUTE" not in plain and "checkpoint" not in plain
    # inference has no backward: nothing to recompute
    assert "RECOMPUTE" not in export_plan(_plan(MIXED), "torch-pipelining", training=False)


def test_the_exported_selective_policy_keeps_what_the_cost_model_keeps():
    """The snippet's own policy, called the way torch's selective checkpointing calls it, on
    real aten operations: matrix products and attention kept, everything else re-run."""
    torch = pytest.importorskip("torch")
    from torch.utils.checkpoint import CheckpointPolicy
    text = export_plan(_plan(MIXED), "torch-pipelining")
    namespace: dict = {}
    exec(compile(text, "pipe.py", "exec"), namespace)
    assert namespace["SELECTIVE_KEEPS"].pattern == EXPENSIVE_OPERATIONS.pattern
    aten = torch.ops.aten
    kept = [aten.mm.default, aten.addmm.default, aten.bmm.default, aten.convolution.default,
            aten._scaled_dot_product_flash_attention_for_cpu.default]
    rerun = [aten.gelu.default, aten._softmax.default, aten.native_layer_norm.default, aten.add.Tensor,
             aten.clone.default, aten.native_dropout.default]
    policy = namespace["keep_expensive"]
    assert [policy(None, op) for op in kept] == [CheckpointPolicy.MUST_SAVE] * len(kept)
    assert [policy(None, op) for op in rerun] == [CheckpointPolicy.PREFER_RECOMPUTE] * len(rerun)


def test_apply_recompute_wraps_exactly_the_plan_s_blocks_of_a_stage():
    """``apply_recompute`` on a real module tree: the named blocks become checkpoint wrappers
    around the very same modules, the others (and blocks of other stages) stay as they were."""
    torch = pytest.importorskip("torch")
    from torch import nn
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
    text = export_plan(_plan(MIXED), "torch-pipelining")
    namespace: dict = {}
    exec(compile(text, "pipe.py", "exec"), namespace)
    stage = nn.Module()                           # what a stage module holding blocks 3..5 looks like
    stage.transformer = nn.Module()
    stage.transformer.h = nn.ModuleDict({str(i): nn.Linear(2, 2) for i in (3, 4, 5)})
    before = {i: stage.transformer.h[str(i)] for i in (3, 4, 5)}
    namespace["apply_recompute"](stage)
    h = stage.transformer.h
    assert h["3"] is before[3]
    for i in (4, 5):
        assert isinstance(h[str(i)], CheckpointWrapper) and h[str(i)]._checkpoint_wrapped_module is before[i]
    x = torch.ones(1, 2, requires_grad=True)
    h["4"](x).sum().backward()                    # it runs, and its backward re-runs the block
    assert x.grad is not None


def test_selective_recompute_under_a_split_backward_is_refused_in_one_line(capsys, tmp_path):
    write_plan(_plan(MIXED, schedule="zb-h1"), tmp_path / "p.json")
    code, out, err = run(capsys, "export", tmp_path / "p.json", "--to", "torch-pipelining")
    assert (code, out) == (2, "")
    assert err.strip().splitlines() == [
        f"stagesplit: error: {tmp_path / 'p.json'}: torch-pipelining: torch refuses selective activation "
        "checkpointing under zb-h1's split backward (it allows one backward per checkpointed region); solve with "
        "--recompute full or auto, or another schedule"]


def test_hostile_names_stay_data_and_a_bad_module_path_is_refused():
    names = ["emb\n__import__('os').system('x')", "l1\u2028import os", *NAMES[2:]]
    text = export_plan(_plan(MIXED, names=names), "torch-pipelining")
    tree = ast.parse(text)
    assert "__import__" not in "".join(ast.unparse(node) for node in tree.body)     # only in comments
    assert literal_assignments(tree)["RECOMPUTE"]["transformer.h.0"] == "full"
    paths = ["transformer.h.0;import os", *PATHS[1:]]
    with pytest.raises(ExportError, match="is not a dotted Python path"):
        export_plan(_plan(MIXED, paths=paths), "torch-pipelining", source="p.json")


def test_a_read_back_that_differs_from_the_plan_writes_nothing(monkeypatch):
    from stagesplit.exporters import torch_pipelining
    real = torch_pipelining.recompute_map

    def wrong(view, fmt=torch_pipelining.NAME):
        out = real(view, fmt)
        out["transformer.h.1"] = "full"                 # a block the plan does not recompute
        return out
    monkeypatch.setattr(torch_pipelining, "recompute_map", wrong)
    with pytest.raises(ExportError) as exc:
        export_plan(_plan(MIXED), "torch-pipelining", source="p.json")
    assert str(exc.value) == ("p.json: torch-pipelining: internal check failed: layer '1' would be recomputed 'full', "
                              "the plan says 'none'; nothing written")


# -- torchtitan ---------------------------------------------------------------------------------------

def _words(text: str) -> list[str]:
    return shlex.split(text, comments=True)


@pytest.mark.parametrize("choices, mode, note", [
    (("full",) * 6, "full", None),
    (("selective",) * 6, "selective", "torchtitan's selective policy also re-runs every second matrix product"),
    (MIXED, "full", "torchtitan applies one activation checkpointing mode to every block and cannot take the plan's "
                    "per-layer choice (3 full, 1 selective, 2 none): full on every block below, slower than the plan, "
                    "not larger"),
    (("none", "selective", "none", "none", "selective", "none"), "selective", "(2 selective, 4 none): selective")])
def test_torchtitan_gets_one_mode_for_every_block(choices, mode, note):
    text = export_plan(_plan(choices, paths=[f"layers.{i}" for i in range(6)]), "torchtitan")
    assert _words(text)[-1] == f"activation-checkpoint:{mode}"
    if note:
        assert note in text
    plain = export_plan(_plan(("none",) * 6), "torchtitan")
    assert not any(w.startswith("activation-checkpoint") for w in _words(plain))
    assert "torchtitan's default activation checkpointing is selective" in plain


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("choices, config", [(("full",) * 6, "FullAC"), (("selective",) * 6, "SelectiveAC"),
                                             (MIXED, "FullAC")])
def test_torchtitan_s_config_manager_reads_the_recompute(monkeypatch, choices, config):
    pytest.importorskip("torchtitan")
    from test_export_torchtitan import _without_triton_kernels
    _without_triton_kernels(monkeypatch)
    from torchtitan.config.manager import ConfigManager
    text = export_plan(_plan(choices), "torchtitan")
    parsed = ConfigManager().parse_args(["--module", "llama3", "--config", "llama3_debugmodel", *_words(text)])
    assert type(parsed.activation_checkpoint).__qualname__ == f"{config}.Config"
    assert parsed.parallelism.pipeline_parallel_degree == 2 and parsed.training.local_batch_size == 4


# -- Megatron -----------------------------------------------------------------------------------------

def _flags(text: str) -> dict[str, str]:
    words = _words(text)
    return dict(zip(words[::2], words[1::2]))


@pytest.mark.parametrize("choices, flags, note", [
    (("full", "full", "none", "full", "full", "none"),
     {"--recompute-granularity": "full", "--recompute-method": "block", "--recompute-num-layers": "2"}, None),
    (("full", "none", "none", "full", "full", "full"),
     {"--recompute-granularity": "full", "--recompute-method": "block", "--recompute-num-layers": "3"},
     "Megatron takes one --recompute-num-layers for every stage and cannot take the plan's per-stage counts (1, 3): "
     "3 on every stage, at least the plan's recompute"),
    (("none", "full", "none", "full", "none", "none"),
     {"--recompute-granularity": "full", "--recompute-method": "block", "--recompute-num-layers": "1"},
     "Megatron recomputes the first 1 decoder layer of each stage, the plan other layers of it"),
    (("selective",) * 6, {"--recompute-granularity": "selective"},
     "Megatron's selective recompute re-runs the modules of --recompute-modules (core attention by default) in every "
     "decoder layer, not the plan's choice of operations: its memory differs")])
def test_megatron_recompute_arguments(choices, flags, note):
    text = export_plan(_plan(choices), "megatron")
    got = {k: v for k, v in _flags(text).items() if k.startswith("--recompute")}
    assert got == flags
    comments = [line for line in text.splitlines() if line.startswith("# Megatron")]
    assert comments == ([f"# {note}"] if note else [])
    uneven = _flags(export_plan(_plan(choices), "megatron-uneven"))
    assert {k: v for k, v in uneven.items() if k.startswith("--recompute")} == flags


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("choices", [("full", "full", "none", "full", "full", "none"), ("selective",) * 6, MIXED])
def test_megatron_s_transformer_config_takes_the_recompute(choices):
    pytest.importorskip("megatron.core", reason="megatron-core is not installed here")
    from test_export_megatron import CONFIG_FIELDS, transformer_config
    text = export_plan(_plan(choices), "megatron")
    fields = {"--recompute-granularity": "recompute_granularity", "--recompute-method": "recompute_method",
              "--recompute-num-layers": "recompute_num_layers"}
    recompute = {k: v for k, v in _flags(text).items() if k in fields}
    plain = " ".join(f"{k} {shlex.quote(v)}" for k, v in _flags(text).items() if k in CONFIG_FIELDS)
    config = transformer_config(plain)
    checked = dataclasses.replace(config, **{fields[k]: (int(v) if k.endswith("layers") else v)
                                             for k, v in recompute.items()})
    assert checked.recompute_granularity == recompute["--recompute-granularity"]
    if checked.recompute_granularity == "full":
        assert checked.recompute_method == "block" and checked.recompute_num_layers == int(
            recompute["--recompute-num-layers"])
    else:
        assert checked.recompute_modules == ["core_attn"]        # what Megatron's selective re-runs


# -- DeepSpeed ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("choices, interval, note", [
    (("none",) * 6, 0, None), (("full",) * 6, 1, None),
    (MIXED, 1, "DeepSpeed checkpoints every block or none, and has no selective recompute: it cannot take the plan's "
               "per-layer choice (3 full, 1 selective, 2 none); every block is checkpointed below, at least the plan's "
               "recompute")])
def test_deepspeed_checkpoints_every_block_or_none(choices, interval, note):
    text = export_plan(_plan(choices), "deepspeed")
    assert literal_assignments(ast.parse(text))["ACTIVATION_CHECKPOINT_INTERVAL"] == interval
    assert (f"# {note}" in text.splitlines()) if note else "DeepSpeed checkpoints every block" not in text
    assert ("activation_checkpoint_interval=ACTIVATION_CHECKPOINT_INTERVAL" in text) == bool(interval)


def test_deepspeed_s_own_pipeline_module_checkpoints_the_blocks_only():
    """DeepSpeed's own ``_is_checkpointable`` on the subclass: with the interval set, the block
    entries are checkpointed, the embedding and head entries are not."""
    import os
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    pytest.importorskip("deepspeed")
    import torch
    from deepspeed.runtime import activation_checkpointing
    from deepspeed.runtime.pipe.topology import PipeDataParallelTopology
    from torch import nn
    text = export_plan(_plan(("full",) * 6), "deepspeed").replace("FIRST_BLOCK = 0", "FIRST_BLOCK = 1")
    namespace: dict = {}
    exec(compile(text, "deepspeed-snippet", "exec"), namespace)
    cls = namespace["StagesplitPipelineModule"]

    class Block(nn.Linear):
        pass

    entries = [nn.Embedding(4, 2), *[Block(2, 2) for _ in range(6)], nn.Linear(2, 4)]
    module = cls.__new__(cls)
    torch.nn.Module.__init__(module)
    module.num_stages, module.global_rank, module.checkpointable_layers = 2, 0, None
    module._topo = PipeDataParallelTopology(num_pp=2, num_dp=1)
    module._layer_specs, module._num_layers = list(entries), len(entries)
    module.activation_checkpoint_func = activation_checkpointing.checkpointing.checkpoint
    module._partition_layers()
    assert module.checkpointable_layers == ["Block"]
    assert module._is_checkpointable([entries[1]]) and not module._is_checkpointable([entries[0]])
    assert not module._is_checkpointable([entries[-1]])


# -- PopTorch (stand-in) --------------------------------------------------------------------------------

class _Recording(ModuleRef):
    """A model stand-in whose modules also record forward hooks."""

    def __getattr__(self, name):
        if name == "register_forward_hook":
            return lambda hook: self._log.append((self._path, hook))
        return _Recording(f"{self._path}.{name}", self._log)

    def __getitem__(self, index):
        return _Recording(f"{self._path}.{index}", self._log)


def _poptorch(text):
    record, log, settings = PopTorchRecord(), [], {}
    module = poptorch_module(record)
    module.recomputationCheckpoint = lambda tensor: ("checkpoint", tensor)
    options = module.Options

    class Options(options):
        def __init__(self):
            super().__init__()
            self._Popart = type("Popart", (), {"set": lambda _, key, value: settings.__setitem__(key, value)})()
    module.Options = Options
    with installed(module):
        exec(compile(text, "poptorch-snippet", "exec"), {"model": _Recording("model", log)})
    hooks = [(path, hook) for path, hook in log if callable(hook)]
    return record, hooks, settings


@pytest.mark.parametrize("choices", [("full",) * 6, MIXED])
def test_poptorch_checkpoints_every_block_output_under_pipeline_recomputation(choices):
    text = export_plan(_plan(choices), "poptorch")
    record, hooks, settings = _poptorch(text)
    record.check(True)
    assert [path for path, _ in hooks] == [f"model.{p}" for p in PATHS]
    assert settings == {"autoRecomputation": 3}                  # RecomputationType::Pipeline
    hook = hooks[0][1]
    assert hook(None, (), "y") == ("checkpoint", "y")
    assert hook(None, (), ("a", "b")) == (("checkpoint", "a"), ("checkpoint", "b"))
    assert ("PopART recomputes every block of every pipeline stage and cannot take the plan's per-layer choice"
            in text) == (choices == MIXED)
    plain, hooks, settings = _poptorch(export_plan(_plan(("none",) * 6), "poptorch"))
    assert hooks == [] and settings == {}
