"""The torchtitan export (#21): command-line overrides that torchtitan 0.3's own ConfigManager
parses to the plan's module groups, schedule and micro-batches; tied embeddings refused as
torchtitan refuses them."""

from __future__ import annotations

import shlex
import sys
import types

import pytest
from exporthelpers import make_plan, run

from helpers import PROFILES
from stagesplit.exporters import export_plan, plan_tied_splits
from stagesplit.plan import read_plan, write_plan


def _words(text: str) -> list[str]:
    return shlex.split(text, comments=True)


def _groups(text: str) -> list[list[str]]:
    words = _words(text)
    i = words.index("--parallelism.module_fqns_per_model_part") + 1
    out = []
    while i < len(words) and not words[i].startswith("--"):
        out.append(words[i].split(","))
        i += 1
    return out


def test_module_groups_of_a_captured_plan():
    """A capture's layers are blocks with the embedding and head folded into the first and last:
    torchtitan's tok_embeddings joins the first group, norm and lm_head the last."""
    plan = make_plan([str(i) for i in range(6)], [0, 2, 5], paths=[f"layers.{i}" for i in range(6)],
                     schedule="1f1b", micro_batches=4)
    text = export_plan(plan, "torchtitan")
    assert _groups(text) == [["tok_embeddings", "layers.0", "layers.1"], ["layers.2", "layers.3", "layers.4"],
                             ["layers.5", "norm", "lm_head"]]
    words = _words(text)
    assert words[:4] == ["--parallelism.pipeline_parallel_degree", "3", "--parallelism.pipeline_parallel_schedule",
                         "1F1B"]
    assert words[-5:] == ["--parallelism.pipeline_parallel_microbatch_size", "1", "--training.local_batch_size", "4",
                          "--training.disable_cuda_graphs"]


def test_module_groups_of_a_per_layer_plan(capsys, tmp_path):
    code, _, err = run(capsys, "solve", PROFILES / "llama-7b-layers.json", "--devices", 4, "--schedule", "gpipe",
                       "--micro-batches", 8, "--out", tmp_path / "plan.json")
    assert code == 0, err
    plan = read_plan(tmp_path / "plan.json")
    groups = _groups(export_plan(plan, "torchtitan"))
    want = [[{"embed_tokens": "tok_embeddings"}.get(n, n) for n in s.layers] for s in plan.stages]
    want[-1][-1:] = ["norm", "lm_head"]                               # lm_head: the final norm and the head
    assert groups == want


@pytest.mark.parametrize("schedule, micro_batches, stages, message", [
    ("1f1b", 2, [0, 2, 4], "torchtitan: torch's Schedule1F1B needs at least as many micro-batches as stages; the plan "
                           "has 2 for 3 stages (solve with --micro-batches 3 or more)"),
    ("gpipe", 4, [0], "torchtitan: one stage needs no pipeline parallelism")])
def test_what_torchtitan_cannot_run_is_refused_in_one_line(capsys, tmp_path, schedule, micro_batches, stages, message):
    write_plan(make_plan([str(i) for i in range(6)], stages, schedule=schedule, micro_batches=micro_batches),
               tmp_path / "p.json")
    code, out, err = run(capsys, "export", tmp_path / "p.json", "--to", "torchtitan")
    assert (code, out) == (2, "")
    assert err.strip().splitlines() == [f"stagesplit: error: {tmp_path / 'p.json'}: {message}"]


def test_tied_embeddings_are_refused_as_torchtitan_refuses_them():
    plan = make_plan([str(i) for i in range(6)], [0, 3], paths=[f"layers.{i}" for i in range(6)], micro_batches=2)
    tied = plan_tied_splits(plan, {"tok_embeddings.weight": [0, 5]})     # the embedding's and the head's layers
    with pytest.raises(Exception) as exc:
        export_plan(plan, "torchtitan", tied=tied, source="p.json")
    assert str(exc.value) == ("p.json: torchtitan refuses pipeline parallelism for models with tied weights (\"Weight "
                              "tying is not supported with Pipeline Parallel\"), and this model ties "
                              "'tok_embeddings.weight' across stages 0, 1; untie it or do not pipeline")
    assert "--parallelism.pipeline_parallel_degree 2" in export_plan(plan, "torchtitan")   # untied: fine


# -- torchtitan's own ConfigManager -------------------------------------------------------------------------

def torchtitan_config(monkeypatch, words: list[str]):
    """torchtitan's own ConfigManager's reading of the export's ``words`` after its debug Llama's
    module and config arguments (skipped where torchtitan is not installed)."""
    pytest.importorskip("torchtitan")
    pytest.importorskip("tyro")
    _without_triton_kernels(monkeypatch)
    from torchtitan.config.manager import ConfigManager
    return ConfigManager().parse_args(["--module", "llama3", "--config", "llama3_debugmodel", *words])


def _without_triton_kernels(monkeypatch):
    """torchtitan's model registry imports its GPU expert-parallel kernels, which need triton (a
    CUDA-only package); parsing a config never calls them. Stand in for that one module."""
    name = "torchtitan.distributed.minimal_async_ep.kernels"
    kernels = types.ModuleType(name)

    def missing(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)

        def kernel(*args, **kwargs):
            raise RuntimeError("triton kernel stand-in: not callable on CPU")
        return kernel
    kernels.__getattr__ = missing
    monkeypatch.setitem(sys.modules, name, kernels)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("starts, schedule, micro_batches", [([0, 2, 5], "1f1b", 4), ([0, 3], "gpipe", 6),
                                                             ([0, 1, 2, 4], "1f1b", 8)])
def test_torchtitan_s_config_manager_parses_the_plan_s_groups(monkeypatch, starts, schedule, micro_batches):
    pytest.importorskip("torchtitan")
    pytest.importorskip("tyro")
    _without_triton_kernels(monkeypatch)
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class
    from torchtitan.config.manager import ConfigManager
    from torchtitan.models.llama3 import model_registry
    plan = make_plan([str(i) for i in range(6)], starts, schedule=schedule, micro_batches=micro_batches)
    assert len(model_registry("debugmodel").model.layers) == 6         # the debug model has the plan's 6 layers
    text = export_plan(plan, "torchtitan")
    config = ConfigManager().parse_args(["--module", "llama3", "--config", "llama3_debugmodel", *_words(text)])
    p = config.parallelism
    assert p.pipeline_parallel_degree == len(plan.stages)
    assert p.module_fqns_per_model_part == _groups(text)
    flat = [f for group in p.module_fqns_per_model_part for f in group]
    assert flat == ["tok_embeddings", *[f"layers.{i}" for i in range(6)], "norm", "lm_head"]
    assert [[f for f in g if f.startswith("layers.")] for g in p.module_fqns_per_model_part] == \
        [[f"layers.{n}" for n in s.layers] for s in plan.stages]
    assert config.training.local_batch_size // p.pipeline_parallel_microbatch_size == micro_batches
    cls = get_schedule_class(p.pipeline_parallel_schedule)
    assert issubclass(cls, PipelineScheduleSingle) and cls.__name__ == {"1f1b": "Schedule1F1B",
                                                                         "gpipe": "ScheduleGPipe"}[schedule]
    with pytest.raises(NotImplementedError, match="Weight tying is not supported with Pipeline Parallel"):
        model_registry("1B").model.update_from_config(config=config)    # torchtitan's own refusal of tying


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("schedule, name", [("interleaved-1f1b", "Interleaved1F1B"), ("looped-bfs", "LoopedBFS"),
                                            ("zb-h1", "InterleavedZeroBubble"), ("zbv", "ZBVZeroBubble"),
                                            ("dualpipev", "DualPipeV")])
def test_a_chunked_plan_gives_torchtitan_its_stages_on_the_plan_s_ranks(monkeypatch, capsys, captured_gpt, tmp_path,
                                                                        schedule, name):
    """Two chunks per device: torchtitan's ConfigManager reads 2 x P module groups, and its own
    stage-to-rank mapping for the schedule (looped, or V-shaped for ZBV and DualPipeV) puts each
    group on the device the plan put that chunk on."""
    pytest.importorskip("torchtitan")
    pytest.importorskip("tyro")
    _without_triton_kernels(monkeypatch)
    import dataclasses

    from torchtitan.config.manager import ConfigManager
    from torchtitan.distributed.pipeline_parallel import _get_pp_rank_to_stage_indices_mapping
    code, _, err = run(capsys, "solve", captured_gpt, "--devices", 2, "--schedule", schedule, "--chunks-per-rank", 2,
                       "--micro-batches", 4, "--out", tmp_path / "p.json")
    assert code == 0, err
    plan = read_plan(tmp_path / "p.json")
    # the example GPT ties its embedding and head, which torchtitan refuses: the same split, untied, in
    # torchtitan's own module names
    plan = dataclasses.replace(plan, tied=(), module_paths=[f"layers.{i}" for i in range(len(plan.layer_names))])
    text = export_plan(plan, "torchtitan")
    config = ConfigManager().parse_args(["--module", "llama3", "--config", "llama3_debugmodel", *_words(text)])
    p = config.parallelism
    assert p.pipeline_parallel_degree == 2 and p.pipeline_parallel_schedule == name
    assert [[f for f in g if f.startswith("layers.")] for g in p.module_fqns_per_model_part] == \
        [[f"layers.{i}" for i in range(s.first_layer, s.last_layer + 1)] for s in plan.stages]
    for rank in range(2):
        mine = _get_pp_rank_to_stage_indices_mapping(rank, 2, p.pipeline_parallel_schedule, len(plan.stages))
        assert sorted(mine) == [k for k, s in enumerate(plan.stages) if s.device == rank]
