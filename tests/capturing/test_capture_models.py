"""stagesplit capture on real model code that nobody here wrote: Hugging Face transformers'
GPT-2, Llama (grouped-query attention), BERT, T5, BART, ViT, Mixtral and Qwen2-MoE (bfloat16)
and ResNet-50, and ResNet-50 from torchvision and from timm where those are installed, built
from configs with random weights (examples/real_models.py; nothing is downloaded).

For each: the layers found are the model's real blocks in forward order (with their module
paths), the embeddings go with the first and the head and loss with the last, a 4-device 1F1B
solve and ``export --to torch-pipelining`` succeed, and the whole step's captured peak is within
1% of the peak torch's MemTracker (not capture's code) measures on one real training step of
the same model on CPU tensors.

torchvision and timm are installed by the README's test command without their dependencies, into
``.venv/vision``, outside site-packages: PyPI's torchvision wheels are built against CUDA torch,
and beside the CPU torch the package's ``__init__`` fails registering fake kernels for its C++
operators ("operator torchvision::nms does not exist"), which also breaks ``transformers`` in
every process that sees torchvision (its image utilities import it). tests/conftest.py puts that
folder on the test process's path and imports their model code without the ``__init__`` (the
model definitions use none of those operators), before transformers is.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


HAVE_TORCHVISION = "torchvision" in sys.modules or importlib.util.find_spec("torchvision") is not None   # conftest
HAVE_TIMM = importlib.util.find_spec("timm") is not None and HAVE_TORCHVISION

from stagesplit.capturing.profilebuild import peak_bytes  # noqa: E402
from stagesplit.capturing.pytorch import capture_model  # noqa: E402
from stagesplit.cli import main  # noqa: E402
from stagesplit.errors import StagesplitError  # noqa: E402
from stagesplit.io.profile import Phase  # noqa: E402
from stagesplit.model.analysis import Analysis  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _load_examples():
    spec = importlib.util.spec_from_file_location("stagesplit_example_real_models", ROOT / "examples" / "real_models.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


zoo = _load_examples()

DECODER = [str(i) for i in range(4)]
RESNET = [f"layer{s}.{b}" for s, n in ((1, 3), (2, 4), (3, 6), (4, 3)) for b in range(n)]
ENCODER_DECODER = {side: [f"{side}.block.{i}" for i in range(4)] for side in ("encoder", "decoder")}
#: model -> (layer names, module paths, modules that run before the first block, after the last)
EXPECTED = {
    "gpt2": (DECODER, [f"transformer.h.{i}" for i in range(4)], {"transformer.wte", "transformer.wpe"},
             {"transformer.ln_f", "lm_head"}),
    "llama": (DECODER, [f"model.layers.{i}" for i in range(4)], {"model.embed_tokens"}, {"model.norm", "lm_head"}),
    "bert": (DECODER, [f"bert.encoder.layer.{i}" for i in range(4)], {"bert.embeddings.word_embeddings"},
             {"cls.predictions.decoder"}),
    "t5": (ENCODER_DECODER["encoder"] + ENCODER_DECODER["decoder"], ENCODER_DECODER["encoder"] + ENCODER_DECODER["decoder"],
           {"encoder.embed_tokens"}, {"decoder.final_layer_norm", "lm_head"}),
    "bart": ([f"{side}.layers.{i}" for side in ("encoder", "decoder") for i in range(3)],
             [f"model.{side}.layers.{i}" for side in ("encoder", "decoder") for i in range(3)],
             {"model.encoder.embed_tokens", "model.encoder.embed_positions"}, {"lm_head"}),
    "vit": (DECODER, None, {"vit.embeddings.patch_embeddings.projection"}, {"vit.layernorm", "classifier"}),
    "mixtral": (DECODER, [f"model.layers.{i}" for i in range(4)], {"model.embed_tokens"}, {"model.norm", "lm_head"}),
    "qwen2_moe": (DECODER, [f"model.layers.{i}" for i in range(4)], {"model.embed_tokens"}, {"model.norm", "lm_head"}),
    "hf_resnet50": ([f"{s}.layers.{b}" for s, n in enumerate((3, 4, 6, 3)) for b in range(n)],
                    [f"resnet.encoder.stages.{s}.layers.{b}" for s, n in enumerate((3, 4, 6, 3)) for b in range(n)],
                    {"resnet.embedder.embedder.convolution", "resnet.embedder.pooler"}, {"resnet.pooler", "classifier.1"}),
    "resnet50": (RESNET, RESNET, {"conv1", "bn1", "maxpool"}, {"avgpool", "fc", "loss"}),
    "timm_resnet50": (RESNET, RESNET, {"conv1", "bn1", "maxpool"}, {"global_pool.pool", "fc", "loss"}),
}
#: encoder-decoder models: traced for training on 4 stages, the encoder's output skips stages
TRACED_SKIPS = ("t5", "bart")
#: models whose layers are one stack's blocks but whose torch-pipelining stages are traced
TRACED_STACKS = ("bert", "vit")

MODELS = [pytest.param(name, marks=pytest.mark.skipif(
    name == "resnet50" and not HAVE_TORCHVISION or name == "timm_resnet50" and not HAVE_TIMM,
    reason="needs torchvision / timm")) for name in EXPECTED]


def _dtype(name: str) -> str:
    return "bfloat16" if name in zoo.BFLOAT16 else "float32"


_captured: dict[str, object] = {}


def _capture(name: str):
    """Capture model ``name``'s small configuration once per session (exact bytes: CPU tensors
    are not rounded by an allocator)."""
    if name not in _captured:
        _captured[name] = capture_model(*zoo.build(name), allocator_round=1, dtype=_dtype(name), name=name)
    return _captured[name]


def _memtracker_peak(model, inputs) -> int:
    """One real training step measured by torch's MemTracker, after a warm-up step that creates
    the Adam state; zero_grad(set_to_none=False) keeps the gradients, as gradient accumulation
    does (capture counts both as always live). The model's output is dropped before the
    backward, as a training loop does (only the loss is kept)."""
    from torch.distributed._tools.mem_tracker import MemTracker
    opt = torch.optim.Adam(model.parameters(), foreach=False)

    def loss():
        out = model(**inputs) if isinstance(inputs, dict) else model(inputs)
        if getattr(out, "loss", None) is not None:
            return out.loss
        return (out if isinstance(out, torch.Tensor) else out.logits).sum()

    def step():
        loss().backward()
        opt.step()

    step()
    opt.zero_grad(set_to_none=False)
    tracker = MemTracker()
    tracker.track_external(model, opt, *(inputs.values() if isinstance(inputs, dict) else [inputs]))
    with warnings.catch_warnings():
        # MemTracker's module tracker warns when a module it saw has been freed ("Module is None")
        warnings.filterwarnings("ignore", message="Module is None", category=UserWarning)
        with tracker:
            step()
    return tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


@pytest.mark.parametrize("name", MODELS)
def test_layers_are_the_real_blocks_in_forward_order(name):
    profile = _capture(name)
    analysis = Analysis.of(profile)
    layers = analysis.layers
    names, paths, first, last = EXPECTED[name]
    assert layers.names == names
    if paths is not None:
        assert layers.module_paths == paths
    else:                                                   # ViT's stack name differs between versions
        assert len(set(layers.module_paths)) == len(names) and all(p.endswith(f".{i}") for i, p in
                                                                    enumerate(layers.module_paths))
    assert (layers.op_layer >= 0).all()                      # nothing shared
    assert profile.info.layer_grouping is not None and profile.info.layer_grouping.method == "module-tree"
    assert list(profile.info.layer_grouping.layers) == names
    # one stack's blocks whose export is traced (not a Hugging Face causal language model: its stages are not
    # built from its modules): every tensor the layers share crosses the stages between (model/phases.py)
    assert profile.info.layer_grouping.traced_stages is (name in TRACED_STACKS), name
    # the embeddings (everything before the first block) go with the first block, the head (and
    # the loss: HF models compute it in their own forward) with the last
    ops = profile.operations
    forward = [i for i in range(len(ops)) if ops.phase[i] == Phase.FORWARD]
    in_block = [i for i in forward if _module(ops.name[i]) is not None
                and any(_module(ops.name[i]) == p or _module(ops.name[i]).startswith(p + ".") for p in layers.module_paths)]
    before = [i for i in forward if i < in_block[0]]
    after = [i for i in forward if i > in_block[-1]]
    assert {int(layers.op_layer[i]) for i in before} == {0}
    assert {int(layers.op_layer[i]) for i in after} == {len(names) - 1}
    assert first <= {_module(ops.name[i]) for i in before}
    assert last <= {_module(ops.name[i]) for i in after}
    assert not profile.info.warnings
    # every factory of examples/real_models.py builds two samples (token ids, images, with labels of
    # their own or the ids again): the capture records the batch the layout search scales from
    assert profile.info.batch_size == 2


def _module(op_name: str) -> str:
    return op_name.split("/")[0]


@pytest.mark.parametrize("name", MODELS)
def test_solve_four_devices_1f1b_and_export_torch_pipelining(name, tmp_path, capsys):
    from stagesplit.io import save_profile
    profile = _capture(name)
    path = tmp_path / f"{name}.stagesplit"
    save_profile(profile, path)
    plan = tmp_path / "plan.json"
    assert main(["solve", str(path), "--devices", "4", "--schedule", "1f1b", "--micro-batches", "8",
                 "--out", str(plan)]) == 0
    out = capsys.readouterr().out
    assert "4 of 4 devices used" in out, out
    script = tmp_path / "pipe.py"
    if name in TRACED_SKIPS:
        # two stacks (an encoder whose output every decoder block reads): traced, that output goes from the
        # encoder's last stage past the next one to later decoder stages; the plan records it, and the export
        # relays it through the stages between (relay_skips, tests/exporters/test_export_traced_pipelines.py)
        doc = json.loads(plan.read_text())
        stage_of = {layer: k for k, s in enumerate(doc["stages"]) for layer in range(s["first_layer"], s["last_layer"] + 1)}
        assert any(stage_of[w["last_layer"]] - stage_of[w["first_layer"]] >= 2 for w in doc["wide_tensors"]), doc["split"]
    assert main(["export", str(plan), "--to", "torch-pipelining", "-o", str(script)]) == 0
    text = script.read_text()
    assert text.count("relay_skips(pipe)\n") == 1, text       # a traced pipeline relays what skips a stage
    assign = next(node for node in ast.parse(text).body if isinstance(node, ast.Assign)
                  and getattr(node.targets[0], "id", None) == "SPLIT_POINTS")
    starts = ast.literal_eval(assign.value)
    paths = Analysis.of(profile).layers.module_paths
    assert len(starts) == 3 and set(starts) <= set(paths[1:]), text     # each later stage begins at a block
    capsys.readouterr()


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_whole_step_peak_within_one_percent_of_memtracker(name):
    predicted = peak_bytes(_capture(name))
    measured = _memtracker_peak(*zoo.build(name, real=True))
    assert abs(predicted - measured) <= 0.01 * measured, (predicted, measured)


def test_mixture_of_experts_flops_count_every_expert_product():
    """Mixtral's small configuration, FLOPs written out: per layer the q/k/v/o projections
    (grouped-query: k and v have 2 heads of 16), attention (4 heads), the router and the
    experts' grouped products (every token meets top-2 experts: gate+up 64 -> 256, down 128 ->
    64); the LM head. The backward doubles every product (input and weight gradients) and counts
    fused attention's five products against the forward's two."""
    profile = _capture("mixtral")
    tokens, d, ffn, kv, experts, layers, vocab = 2 * 32, 64, 128, 32, 4, 4, 256
    mm = lambda m, k, n: 2 * m * k * n                                  # noqa: E731
    attention = 2 * mm(2 * 4 * 32, 16, 32)                              # scores and output
    projections = mm(tokens, d, d) + 2 * mm(tokens, d, kv) + mm(tokens, d, d)
    moe = mm(tokens, d, experts) + mm(2 * tokens, d, 2 * ffn) + mm(2 * tokens, ffn, d)
    head = mm(tokens, d, vocab)
    forward_products = layers * (projections + moe) + head
    expected = 3 * forward_products + layers * (attention + attention * 5 // 2)
    assert profile.operations.compute.sum() == expected == 108_396_544
    grouped = [i for i, n in enumerate(profile.operations.name) if n.endswith("aten._grouped_mm")]
    assert grouped and all(profile.operations.compute[i] > 0 for i in grouped)


def test_mixture_of_experts_in_float32_is_one_line_suggesting_bfloat16(tmp_path, capsys):
    factory = tmp_path / "moe.py"
    factory.write_text(f"import importlib.util, sys\n"
                       f"spec = importlib.util.spec_from_file_location('zoo_moe', {str(ROOT / 'examples' / 'real_models.py')!r})\n"
                       "zoo = importlib.util.module_from_spec(spec); spec.loader.exec_module(zoo)\n"
                       "def build():\n    return zoo.build('mixtral')\n")
    assert main(["capture", f"{factory}:build", "-o", str(tmp_path / "moe.stagesplit")]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "aten._grouped_mm in model.layers.0.mlp.experts" in lines[0]
    assert "--dtype bfloat16" in lines[0]
    assert not (tmp_path / "moe.stagesplit").exists()
    with pytest.raises(StagesplitError, match="capture with `dtype='bfloat16'`"):
        capture_model(*zoo.build("qwen2_moe"))


def test_labels_that_are_the_input_ids_are_counted_once():
    profile = _capture("gpt2")
    names = [profile.variable_name(v) for v in range(len(profile.variables))]
    inputs = [n for n in names if n.startswith("input[")]
    assert inputs == ["input[input_ids]"]
    assert profile.variables.bytes[names.index("input[input_ids]")] == 2 * 32 * 8


@pytest.mark.parametrize("regex,layers,collide", [
    (r"((?:en|de)coder)\.block\.(\d+)", [f"{s}coder{i}" for s in ("en", "de") for i in range(4)], False),
    (r"block\.(\d+)", [str(i) for i in range(4)], True),
])
def test_user_regex_on_an_encoder_decoder_is_recorded_and_collisions_warn(regex, layers, collide, tmp_path, capsys):
    profile = capture_model(*zoo.build("t5"), allocator_round=1, layer_regex=regex)
    grouping = profile.info.layer_grouping
    assert grouping.method == "regex" and grouping.layer_regex == regex
    assert list(grouping.layers) == layers
    warned = [w for w in profile.info.warnings if "same layer name" in w]
    assert bool(warned) == collide
    if collide:
        assert "encoder.block.0 and decoder.block.0 are both layer '0' (4 such name(s))" in warned[0]
        return
    assert grouping.module_paths == tuple(f"{s}coder.block.{i}" for s in ("en", "de") for i in range(4))
    from stagesplit.io import load_profile, save_profile
    path = tmp_path / "t5.stagesplit"
    save_profile(profile, path)
    plan = tmp_path / "plan.json"
    assert main(["solve", str(path), "--devices", "4", "--out", str(plan)]) == 0    # no --layer-regex
    # traced for training, the encoder's output would skip stages (refused: test above); inference runs
    assert main(["export", str(plan), "--to", "torch-pipelining", "--inference"]) == 0
    out = capsys.readouterr().out
    assert '"decoder.block.' in out or '"encoder.block.' in out
    assert Analysis.of(load_profile(path)).layers.module_paths == list(grouping.module_paths)


@pytest.mark.parametrize("name,regex,prefix", [
    ("hf_resnet50", r"stages\.(\d+)\.layers\.(\d+)", "resnet.encoder.stages.{s}.layers.{b}"),
    pytest.param("resnet50", r"layer(\d+)\.(\d+)", "layer{t}.{b}",
                 marks=pytest.mark.skipif(not HAVE_TORCHVISION, reason="needs torchvision")),
])
def test_resnet_user_regex_gives_sixteen_blocks_recorded(name, regex, prefix):
    profile = capture_model(*zoo.build(name), allocator_round=1, layer_regex=regex)
    grouping = profile.info.layer_grouping
    blocks = [(s, b) for s, n in enumerate((3, 4, 6, 3)) for b in range(n)]
    first = 0 if name == "hf_resnet50" else 1
    assert list(grouping.layers) == [f"{s + first}{b}" for s, b in blocks]
    assert list(grouping.module_paths) == [prefix.format(s=s, t=s + 1, b=b) for s, b in blocks]
    assert not profile.info.warnings
    assert Analysis.of(profile).layers.module_paths == list(grouping.module_paths)


@pytest.mark.slow
@pytest.mark.parametrize("name,layers", [("t5", 12), ("bart", 12), ("gpt2", 12)])
def test_full_size_shapes_group_into_their_blocks(name, layers):
    profile = capture_model(*zoo.build(name, size="full"))
    analysis = Analysis.of(profile)
    assert analysis.layers.num_layers == layers
    assert (analysis.layers.op_layer >= 0).all()
    assert profile.operations.compute.sum() > 0
    assert np.all(np.isin(profile.operations.phase, [p.value for p in Phase if p != Phase.UNKNOWN]))


@pytest.mark.slow
def test_transformers_gradient_checkpointing_within_one_percent_of_memtracker():
    """Llama with transformers' own non-reentrant gradient checkpointing: each decoder layer's
    forward runs again in the backward (RECOMPUTE, in its layer) and the whole step's peak stays
    within 1% of MemTracker's real step (measured here: +0.8%; the plain model is exact)."""
    def build(real):
        model, inputs = zoo.build("llama", real=real)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning)     # renamed in transformers 5
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return model, inputs

    profile = capture_model(*build(False), allocator_round=1)
    analysis = Analysis.of(profile)
    ops = profile.operations
    recompute = np.flatnonzero(ops.phase == Phase.RECOMPUTE)
    assert len(recompute) > 0 and not (ops.phase == Phase.UNKNOWN).any()
    for i in recompute:
        block = ops.name[i].split("/")[0].split(".")[2]
        assert analysis.layers.names[analysis.layers.op_layer[i]] == block, ops.name[i]
    predicted = peak_bytes(profile)
    measured = _memtracker_peak(*build(True))
    assert abs(predicted - measured) <= 0.01 * measured, (predicted, measured)
    assert predicted < peak_bytes(_capture("llama"))
