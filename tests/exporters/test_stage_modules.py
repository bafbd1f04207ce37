"""The torch-pipelining export's stages of a Hugging Face decoder (exporters/templates/stage_modules.py),
run one after another in one process: the loss and every gradient equal the whole model's. Each family
of tests/decoder_families.py, the decoder variants among them: blocks that return tuples (Falcon and
GPT-Neo read ``outputs[0]``: a stage that handed back the bare hidden state gave them its first row), and
layers whose mask or rotary tables the decoder picks by the layer's position (Gemma 3's local and global
rotary bases, Qwen2's sliding window from layer 4: a stage that called its blocks as the stack's first
layer gave every block layer 0's, and trained another model). The exported program itself runs on real
processes in tests/exporters/test_export_hf_pipelines.py."""

from __future__ import annotations

import importlib.util

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import decoder_families as families  # noqa: E402

TEMPLATE = "stagesplit/exporters/templates/stage_modules.py"
#: the stack of blocks, by family
STACKS = {"gpt2": "transformer.h", "gpt_neox": "gpt_neox.layers", "opt": "model.decoder.layers",
          "falcon": "transformer.h", "gpt_neo": "transformer.h", "bloom": "transformer.h"}


def _stage_modules():
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / TEMPLATE
    spec = importlib.util.spec_from_file_location("stage_modules_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _whole(name):
    torch.manual_seed(0)
    model = families.model(name)
    ids, labels = families.batch(name, 1)
    loss = model(input_ids=ids, labels=labels).loss
    loss.backward()
    return float(loss.detach()), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", families.FAMILIES + families.DECODER_VARIANTS)
def test_stages_in_turn_compute_the_whole_models_loss_and_gradients(name):
    want_loss, want_grads = _whole(name)
    torch.manual_seed(0)
    model = families.model(name)
    ids, labels = families.batch(name, 1)
    stages = _stage_modules().model_stages(model, STACKS.get(name, "model.layers"), [0, 2, 4, 6], ids)
    assert [s.is_first for s in stages] == [True, False, False, False]
    assert [s.is_last for s in stages] == [False, False, False, True]
    hidden = ids
    for stage in stages[:-1]:
        hidden = stage(hidden)
        assert hidden.shape == (families.BATCH, families.SEQUENCE, model.config.hidden_size)
    loss = stages[-1].loss(stages[-1](hidden), labels)
    loss.backward()
    assert float(loss.detach()) == pytest.approx(want_loss, rel=1e-6)
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert grads.keys() == want_grads.keys()
    for n, grad in grads.items():
        assert torch.allclose(grad, want_grads[n], rtol=1e-4, atol=1e-6), n


def test_a_stage_holds_only_its_own_blocks_and_reads_the_layers_own_attributes():
    """Each stage registers its blocks alone (the stack's other positions are stand-ins the stage does not
    own), and an attribute the decoder reads off a layer (a layer's type) is the original layer's."""
    torch.manual_seed(0)
    model = families.model("qwen2_sliding")
    ids, _ = families.batch("qwen2_sliding", 1)
    stages = _stage_modules().model_stages(model, "model.layers", [0, 3, 6], ids)
    stack = model.model.layers
    for stage, (a, b) in zip(stages, [(0, 3), (3, 6), (6, 8)]):
        assert [id(block) for block in stage.blocks] == [id(stack[i]) for i in range(a, b)]
        own = {id(p) for p in stage.parameters()}
        for i in range(len(stack)):
            held = {id(p) for p in stack[i].parameters()}
            assert (held <= own) == (a <= i < b), (a, b, i)
        positions = stage._decoder.layers
        assert len(positions) == len(stack)
        assert [p.self_attn.layer_idx for p in positions] == list(range(len(stack)))
