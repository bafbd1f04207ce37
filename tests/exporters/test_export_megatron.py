"""The Megatron exports, checked with megatron-core's own code: its layout grammar and parser,
its real ``TransformerConfig`` (which validates both forms), its layer offsets, and a tiny
``GPTModel`` per rank (gloo, CPU) holding the plan's decoder layers."""

from __future__ import annotations

import json
import re
import shlex

import pytest
from exporthelpers import make_plan, plan_from, run, run_ranks, splits, stages_of
from hypothesis import given, settings

from helpers import PROFILES
from stagesplit.errors import StagesplitError
from stagesplit.exporters import export_plan
from stagesplit.plan import read_plan, write_plan

LAYOUT_GRAMMAR = re.compile(r"E?(?:t(?:\*\d+)?)?L?(?:\|E?(?:t(?:\*\d+)?)?L?)*")
#: Megatron-LM's argument -> megatron-core TransformerConfig field (Megatron-LM's
#: core_transformer_config_from_args: decoder_first/last_pipeline_num_layers become
#: num_layers_in_first/last_pipeline_stage)
CONFIG_FIELDS = {"--num-layers": "num_layers", "--pipeline-model-parallel-size": "pipeline_model_parallel_size",
                 "--pipeline-model-parallel-layout": "pipeline_model_parallel_layout",
                 "--decoder-first-pipeline-num-layers": "num_layers_in_first_pipeline_stage",
                 "--decoder-last-pipeline-num-layers": "num_layers_in_last_pipeline_stage",
                 "--num-virtual-stages-per-pipeline-rank": "virtual_pipeline_model_parallel_size"}


def _arguments(text: str) -> dict[str, str]:
    words = shlex.split(text, comments=True)
    return dict(zip(words[::2], words[1::2]))


def _layout_of(text: str) -> tuple[int, str]:
    args = _arguments(text)
    return int(args["--pipeline-model-parallel-size"]), args["--pipeline-model-parallel-layout"]


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
    return pytest.importorskip("megatron.core", reason="megatron-core is not installed here (pip install "
                                                       "megatron-core); test_megatron_layout_grammar still runs")


def transformer_config(text: str):
    """megatron-core's own TransformerConfig from the export's arguments (it validates them)."""
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig
    args = _arguments(text)
    fields = {CONFIG_FIELDS[k]: (v if k == "--pipeline-model-parallel-layout" else int(v)) for k, v in args.items()}
    return TransformerConfig(hidden_size=16, num_attention_heads=2, pipeline_dtype=torch.float32,
                             use_cpu_initialization=True, **fields)


def decoder_layers_per_rank(config) -> list[list[int]]:
    """The decoder layers each pipeline rank builds, by megatron-core's own functions."""
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset
    layout = config.pipeline_model_parallel_layout
    if layout is not None:                                          # megatron's layout object, parsed by the config
        return [list(layout.get_layer_id_list(pp_rank=r)) for r in range(config.pipeline_model_parallel_size)]
    out = []
    for rank in range(config.pipeline_model_parallel_size):
        offset = get_transformer_layer_offset(config, pp_rank=rank)
        out.append(list(range(offset, offset + get_num_layers_to_build(config, pp_rank=rank))))
    return out


@pytest.mark.filterwarnings("ignore")
@given(splits)
@settings(max_examples=15, deadline=None)
def test_both_megatron_exports_by_megatrons_own_config(case):
    """The layout form always, the first/last form whenever it exports, give megatron-core's
    TransformerConfig exactly the plan's stages (and whatever it refuses, the export refuses)."""
    _megatron()
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout
    plan = plan_from(case)
    text = export_plan(plan, "megatron")
    size, layout = _layout_of(text)
    parsed = PipelineParallelLayerLayout(layout, size)
    parsed.validate_layer_layout(num_layers=len(plan.layer_names), mtp_num_layers=None)
    got = [[plan.layer_names[i] for i in parsed.get_layer_id_list(pp_rank=r)] for r in range(size)]
    assert got == stages_of(plan)
    if size > 1:
        config = transformer_config(text)
        assert [[plan.layer_names[i] for i in ids] for ids in decoder_layers_per_rank(config)] == stages_of(plan)
    try:
        uneven = export_plan(plan, "megatron-uneven")
    except StagesplitError as exc:
        assert "megatron-uneven cannot express this plan" in str(exc)
        return
    config = transformer_config(uneven)
    assert [[plan.layer_names[i] for i in ids] for ids in decoder_layers_per_rank(config)] == stages_of(plan)


def test_megatron_uneven_cannot_express_unequal_middle_stages(capsys, tmp_path):
    plan = make_plan([str(i) for i in range(12)], [0, 2, 5, 9])      # middle stages hold 3 and 4 layers
    write_plan(plan, tmp_path / "p.json")
    code, out, err = run(capsys, "export", tmp_path / "p.json", "--to", "megatron-uneven")
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [
        f"stagesplit: error: {tmp_path / 'p.json'}: megatron-uneven cannot express this plan: Megatron's "
        "--decoder-first/last-pipeline-num-layers need equal decoder layers in every stage but the first and last; "
        "this plan's middle stages hold 3, 4; use --to megatron (the layout flag)"]
    code, out, _ = run(capsys, "export", tmp_path / "p.json", "--to", "megatron")   # the layout expresses it
    assert code == 0 and _decoder_counts(_layout_of(out)[1]) == [2, 3, 4, 3]
    assert "not expressible without the layout flag" in out


@pytest.mark.filterwarnings("ignore")
def test_an_embedding_only_first_stage_is_refused_by_the_uneven_form(capsys, tmp_path):
    """#21: the plan solve itself produces for LLaMA on 9 GPUs with the embedding alone on
    stage 0 exported ``--decoder-first-pipeline-num-layers 0``, which megatron-core refuses."""
    code, _, err = run(capsys, "solve", PROFILES / "llama-7b-layers.json", "--devices", 9, "--schedule", "1f1b",
                       "--micro-batches", 16, "--pin-split", "layers.0", "--out", tmp_path / "plan.json")
    assert code == 0, err
    assert read_plan(tmp_path / "plan.json").stages[0].layers == ["embed_tokens"]
    code, out, err = run(capsys, "export", tmp_path / "plan.json", "--to", "megatron-uneven")
    assert (code, out) == (2, "")
    assert err.strip().splitlines() == [
        f"stagesplit: error: {tmp_path / 'plan.json'}: megatron-uneven cannot express this plan: stage 0 would hold no "
        "decoder layer, and Megatron's first/last-stage layer counts must be larger than 0; use --to megatron (the "
        "layout flag)"]
    code, out, err = run(capsys, "export", tmp_path / "plan.json", "--to", "megatron")
    assert code == 0, err
    assert _layout_of(out) == (9, "E|t*4|t*4|t*4|t*4|t*4|t*4|t*4|t*4L")
    _megatron()
    config = transformer_config(out)                                # megatron-core accepts the layout form
    assert [len(ids) for ids in decoder_layers_per_rank(config)] == [0] + [4] * 8
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig
    with pytest.raises(ValueError, match="num_layers_in_first_pipeline_stage must be larger than 0"):
        TransformerConfig(num_layers=32, hidden_size=16, num_attention_heads=2, pipeline_dtype=torch.float32,
                          pipeline_model_parallel_size=9, num_layers_in_first_pipeline_stage=0)   # what it said


def test_a_head_only_last_stage_is_refused_by_the_uneven_form(capsys, tmp_path):
    """#21: a hand-edited plan whose last stage holds only the head got
    ``--decoder-last-pipeline-num-layers 0``."""
    names = ["embed_tokens", *[f"layers.{i}" for i in range(6)], "lm_head"]
    write_plan(make_plan(names, [0, 4, 7]), tmp_path / "p.json")
    code, out, err = run(capsys, "export", tmp_path / "p.json", "--to", "megatron-uneven")
    assert (code, out) == (2, "")
    assert "stage 2 would hold no decoder layer" in err and len(err.strip().splitlines()) == 1
    code, out, _ = run(capsys, "export", tmp_path / "p.json", "--to", "megatron")
    assert code == 0 and _layout_of(out) == (3, "Et*3|t*3|L")


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
    assert _arguments(out)["--num-layers"] == "32"
    counts = _decoder_counts(layout)                                 # decoder layers: layers.0 .. layers.31
    assert counts == [7, 8, 7, 10]
    blocks = [[n for n in s.layers if n.startswith("layers.")] for s in plan.stages]
    assert [len(b) for b in blocks] == counts
    _megatron()
    config = transformer_config(out)
    assert [[f"layers.{i}" for i in ids] for ids in decoder_layers_per_rank(config)] == blocks


def test_the_argument_file_is_comments_and_one_argument_line(capsys, tmp_path):
    write_plan(make_plan([str(i) for i in range(6)], [0, 2, 4]), tmp_path / "p.json")
    for fmt in ("megatron", "megatron-uneven"):
        code, out, _ = run(capsys, "export", tmp_path / "p.json", "--to", fmt)
        assert code == 0
        lines = [line for line in out.splitlines() if line and not line.startswith("#")]
        assert len(lines) == 1 and lines[0].startswith("--num-layers 6 --pipeline-model-parallel-size 3")


# -- a tiny GPTModel per rank ----------------------------------------------------------------------------

def _gpt_model_rank(rank, world, text, out_dir):
    import warnings
    warnings.simplefilter("ignore")
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    parallel_state.initialize_model_parallel(pipeline_model_parallel_size=world)
    config = transformer_config(text)
    model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=64,
                     max_sequence_length=8, pre_process=parallel_state.is_pipeline_first_stage(),
                     post_process=parallel_state.is_pipeline_last_stage())
    held = {"layers": [layer.layer_number - 1 for layer in model.decoder.layers],     # layer_number is 1-based
            "embedding": hasattr(model, "embedding"), "output": hasattr(model, "output_layer")}
    (out_dir / f"rank{rank}.json").write_text(json.dumps(held))


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("fmt", ["megatron", "megatron-uneven"])
def test_a_gpt_model_per_rank_holds_the_plan_s_layers(tmp_path, fmt):
    _megatron()
    plan = make_plan([str(i) for i in range(9)], [0, 2, 6])         # 2 | 4 | 3: both forms express it
    text = export_plan(plan, fmt)
    run_ranks(3, _gpt_model_rank, text, tmp_path)
    held = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    assert [h["layers"] for h in held] == [[0, 1], [2, 3, 4, 5], [6, 7, 8]]
    assert [(h["embedding"], h["output"]) for h in held] == [(True, False), (False, False), (False, True)]


@pytest.mark.filterwarnings("ignore")
def test_an_interleaved_plan_gives_megatron_its_virtual_stages(capsys, captured_gpt, tmp_path):
    """A plan solved with --schedule interleaved-1f1b, 2 chunks per device: megatron-core's own
    layout parser and TransformerConfig put chunk k = v * P + r on pipeline rank r as virtual
    stage v, exactly the plan's layers, and the plan's device of chunk k is r."""
    _megatron()
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    from stagesplit.plan import read_plan
    code, _, err = run(capsys, "solve", captured_gpt, "--devices", 2, "--schedule", "interleaved-1f1b",
                       "--chunks-per-rank", 2, "--micro-batches", 4, "--out", tmp_path / "p.json")
    assert code == 0, err
    plan = read_plan(tmp_path / "p.json")
    text = export_plan(plan, "megatron")
    args = _arguments(text)
    assert args["--num-virtual-stages-per-pipeline-rank"] == "2" and args["--pipeline-model-parallel-size"] == "2"
    size, layout = _layout_of(text)
    parsed = PipelineParallelLayerLayout(layout, size)
    parsed.validate_layer_layout(num_layers=len(plan.layer_names), mtp_num_layers=None)   # every layer a block
    assert parsed.virtual_pipeline_model_parallel_size == 2
    from megatron.core import parallel_state
    parallel_state.set_virtual_pipeline_model_parallel_world_size(2)      # as Megatron sets it for the run
    try:
        for k, stage in enumerate(plan.stages):
            rank, virtual = k % 2, k // 2
            assert stage.device == rank
            want = list(range(stage.first_layer, stage.last_layer + 1))
            assert parsed.get_layer_id_list(pp_rank=rank, vp_stage=virtual) == want
    finally:
        parallel_state.set_virtual_pipeline_model_parallel_world_size(None)
    config = transformer_config(text)
    assert config.virtual_pipeline_model_parallel_size == 2
    # a schedule Megatron does not run is refused, naming the schedules it does
    run(capsys, "solve", captured_gpt, "--devices", 2, "--schedule", "zbv", "--micro-batches", 4,
        "--out", tmp_path / "z.json")
    code, out, err = run(capsys, "export", tmp_path / "z.json", "--to", "megatron")
    assert code == 2 and out == "" and "megatron runs 1F1B, interleaved with virtual stages; this plan runs zbv" in err
