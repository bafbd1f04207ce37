"""The torch-pipelining export, run for real: torch.distributed.pipelining across 2 and 4
processes (gloo, torch.multiprocessing) on the example GPT (examples/gpt.py, captured by
stagesplit) and on a Hugging Face GPT-2 built from a config, with GPipe and 1F1B. Every stage
holds exactly the plan's layers; the loss and every gradient equal the unpipelined model's
(1e-5 relative), tied weights summed by the snippet's own ``sum_tied_gradients``."""

from __future__ import annotations

import ast
import json

import pytest
from exporthelpers import GPT_CONFIG, make_plan, run, run_ranks

from stagesplit.exporters import export_plan
from stagesplit.exporters.render import literal_assignments
from stagesplit.plan import read_plan, write_plan

MICRO_BATCHES = 4
MICRO_BATCH = 2                                   # the captured batch: one micro-batch


def _constants(text: str) -> dict:
    return literal_assignments(ast.parse(text))


@pytest.mark.parametrize("schedule, cls", [("gpipe", "ScheduleGPipe"), ("1f1b", "Schedule1F1B"),
                                           ("none", "ScheduleGPipe")])
def test_the_schedule_class_follows_the_plan(schedule, cls):
    plan = make_plan([str(i) for i in range(4)], [0, 2], paths=[f"h.{i}" for i in range(4)], schedule=schedule,
                     micro_batches=4)
    text = export_plan(plan, "torch-pipelining")
    # the layers are the blocks of one stack (h.0 .. h.3): stages built from modules where the model allows
    assert f"from torch.distributed.pipelining import PipelineStage, {cls}, SplitPoint, pipeline" in text
    assert (f"    schedule = {cls}(stage, n_microbatches=N_MICROBATCHES, loss_fn=loss_fn, scale_grads=False)"
            in text)
    assert _constants(text) == {"SPLIT_POINTS": ["h.2"], "NUM_STAGES": 2, "N_MICROBATCHES": 4, "BLOCKS": "h",
                                "STAGE_STARTS": [0, 2], "STAGES_OF_RANK": [[0], [1]], "RETURN_OUTPUTS": False,
                                "GRADIENTS_SET_TO_NONE": False}
    assert "class ModelStage(torch.nn.Module):" in text and "    if builds_from_modules(model):" in text
    assert "`example_microbatch` is ONE micro-batch" in text and 'attn_implementation="sdpa"' in text
    inference = export_plan(plan, "torch-pipelining", training=False)
    assert "    schedule = ScheduleGPipe(stage, n_microbatches=N_MICROBATCHES)" in inference
    assert "def run_step(" in inference and "def train_step(" not in inference


def test_1f1b_with_fewer_micro_batches_than_stages_is_refused(capsys, tmp_path):
    """torch's Schedule1F1B raises at construction with fewer micro-batches than stages."""
    write_plan(make_plan([str(i) for i in range(6)], [0, 2, 4], paths=[f"h.{i}" for i in range(6)], schedule="1f1b",
                         micro_batches=2), tmp_path / "p.json")
    code, out, err = run(capsys, "export", tmp_path / "p.json", "--to", "torch-pipelining")
    assert (code, out) == (2, "")
    assert err.strip().splitlines() == [
        f"stagesplit: error: {tmp_path / 'p.json'}: torch-pipelining: torch's Schedule1F1B needs at least as many "
        "micro-batches as stages; the plan has 2 for 3 stages (solve with --micro-batches 3 or more)"]


# -- real runs ------------------------------------------------------------------------------------------

def _cross_entropy(out, target):
    from torch.nn import functional as F
    logits = out.logits if hasattr(out, "logits") else (out[0] if isinstance(out, tuple) else out)
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())


def _hf_gpt2(layers: int):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    config = GPT2Config(n_layer=layers, n_embd=16, n_head=2, vocab_size=64, n_positions=16, use_cache=False,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
                        attn_implementation="sdpa")                 # the snippet's note: eager fails beyond 2 stages
    return GPT2LMHeadModel(config)


def _example_gpt():
    from examples.gpt import GPTConfig, build_real
    model, _ = build_real(GPTConfig(**{**GPT_CONFIG, "batch": MICRO_BATCH}))
    return model


def _check_one_run(rank, text, make_model, expected_params, out):
    """Run the exported snippet on this rank and compare with the unpipelined model."""
    import torch
    model = make_model()
    vocab, context = 64, GPT_CONFIG["context"]
    g = torch.Generator().manual_seed(11)
    ids = torch.randint(0, vocab, (MICRO_BATCH * MICRO_BATCHES, context), generator=g)
    targets = torch.randint(0, vocab, ids.shape, generator=g)
    canonical: dict = {}                                             # tied parameters: one name per tensor
    for name, p in model.named_parameters(remove_duplicate=False):
        canonical.setdefault(id(p), name)
    alias = {name: canonical[id(p)] for name, p in model.named_parameters(remove_duplicate=False)}
    by_id = {id(p): canonical[id(p)] for p in model.parameters()}

    def model_name(name, p):
        """A traced stage's parameter is named as in the model; a stage built from modules holds the model's own."""
        return alias[name] if name in alias else by_id[id(p)]

    reference = make_model()                                         # the unpipelined model, same weights
    loss = sum(_cross_entropy(reference(ids[i:i + MICRO_BATCH]), targets[i:i + MICRO_BATCH])
               for i in range(0, len(ids), MICRO_BATCH)) / MICRO_BATCHES
    loss.backward()
    ref_grads = {alias[n]: p.grad for n, p in reference.named_parameters(remove_duplicate=False)}

    ns: dict = {}
    exec(compile(text, "pipe.py", "exec"), ns)
    stage, schedule, tied = ns["build_pipeline"](model, ids[:MICRO_BATCH], torch.device("cpu"), _cross_entropy)
    held = {model_name(n, p): p.numel() * p.element_size() for n, p in stage.submod.named_parameters()}
    assert held == expected_params[rank], (rank, sorted(held), sorted(expected_params[rank]))
    losses = ns["train_step"](stage, schedule, ids if stage.is_first else None, targets if stage.is_last else None)
    ns["sum_tied_gradients"](tied)
    for name, p in stage.submod.named_parameters(remove_duplicate=False):
        want = ref_grads[model_name(name, p)]
        got = p.grad if p.grad is not None else torch.zeros_like(p)
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max())), (rank, name)
    if stage.is_last:
        got_loss = sum(float(x.detach()) for x in losses) / len(losses)
        want_loss = float(loss.detach())
        assert len(losses) == MICRO_BATCHES and abs(got_loss - want_loss) <= 1e-5 * abs(want_loss)
        out["loss"] = [got_loss, want_loss]
    out.setdefault("held", []).append(sorted(held))


def _pipelined_rank(rank, world, runs, out_dir):
    results = {}
    for key, (text, model_name, expected) in runs.items():
        make_model = _example_gpt if model_name == "example" else (lambda: _hf_gpt2(4))
        results[key] = {}
        _check_one_run(rank, text, make_model, expected, results[key])
    (out_dir / f"rank{rank}.json").write_text(json.dumps(results))


def _expected_from_capture(profile, plan, parameters: set[str]):
    """Per stage, the parameters (name -> bytes) that its layers' operations use, from the
    captured profile and the plan alone (a tied parameter is one variable, named by its first
    name, shared with the others: 'transformer.wte.weight [shared with lm_head.weight]')."""
    from stagesplit.layers import group_layers
    layers = group_layers(profile)
    names = profile.names
    stage_of_layer = {i: s.stage for s in plan.stages for i in range(s.first_layer, s.last_layer + 1)}
    out = [dict() for _ in plan.stages]
    for op in range(len(profile.operations)):
        layer = int(layers.op_layer[op])
        assert layer >= 0
        for v in profile.operations.vars[op]:
            name = names[profile.variables.name[v]].split(" [shared with ", 1)[0]
            if name in parameters:
                out[stage_of_layer[layer]][name] = int(profile.variables.bytes[v])
    return out


def _expected_by_path(model, starts: list[int], layers: int):
    """Per stage of the HF model: the blocks' parameters by module path, the embeddings on the
    first stage, the final norm and the (tied) head on the last."""
    canonical: dict = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        canonical.setdefault(id(p), name)
    bounds = list(starts) + [layers]
    out = []
    for k, (a, b) in enumerate(zip(bounds, bounds[1:])):
        prefixes = tuple(f"transformer.h.{i}." for i in range(a, b))
        if k == 0:
            prefixes += ("transformer.wte.", "transformer.wpe.")
        if k == len(starts) - 1:
            prefixes += ("transformer.ln_f.", "lm_head.")
        out.append({canonical[id(p)]: p.numel() * p.element_size()
                    for n, p in model.named_parameters(remove_duplicate=False) if n.startswith(prefixes)})
    return out


@pytest.mark.slow
@pytest.mark.parametrize("world, pins", [(2, ["3"]), (4, ["1", "3", "5"])])
def test_pipelined_runs_match_the_unpipelined_model(capsys, captured_gpt, tmp_path, world, pins):
    pytest.importorskip("transformers")
    import transformers  # noqa: F401 - imported once here, before the ranks fork

    from stagesplit.io import load_profile
    profile = load_profile(captured_gpt)
    runs = {}
    for schedule in ("gpipe", "1f1b"):
        argv = ["solve", captured_gpt, "--devices", world, "--exact", "--schedule", schedule, "--micro-batches",
                MICRO_BATCHES, "--out", tmp_path / f"{schedule}.json"]
        for pin in pins:
            argv += ["--pin-split", pin]
        code, _, err = run(capsys, *argv)
        assert code == 0, err
        plan = read_plan(tmp_path / f"{schedule}.json")
        assert [s.first_layer for s in plan.stages[1:]] == [int(p) for p in pins]
        assert plan.module_paths == [f"transformer.h.{i}" for i in range(GPT_CONFIG["layers"])]
        code, _, err = run(capsys, "export", tmp_path / f"{schedule}.json", "--to", "torch-pipelining",
                           "-o", tmp_path / f"{schedule}.py")
        assert code == 0, err
        model = _example_gpt()
        parameters = {n for n, _ in model.named_parameters()}
        expected = _expected_from_capture(profile, plan, parameters)
        assert sum(map(len, expected)) >= len(parameters)           # every parameter is in some stage
        runs[f"example-{schedule}"] = ((tmp_path / f"{schedule}.py").read_text(), "example", expected)

        starts = [0, *range(1, 4)][:world] if world == 4 else [0, 2]
        hf = make_plan([str(i) for i in range(4)], starts, paths=[f"transformer.h.{i}" for i in range(4)],
                       schedule=schedule, micro_batches=MICRO_BATCHES)
        runs[f"hf-{schedule}"] = (export_plan(hf, "torch-pipelining"), "hf", _expected_by_path(_hf_gpt2(4), starts, 4))
    run_ranks(world, _pipelined_rank, runs, tmp_path)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    for key in runs:
        got, want = results[-1][key]["loss"]
        assert abs(got - want) <= 1e-5 * abs(want)
        assert [r[key]["held"][0] for r in results] == [sorted(e) for e in runs[key][2]]


class _SkipModel:
    """Three linear blocks whose first block's output also feeds the last (a skip connection)."""

    @staticmethod
    def build():
        import torch

        class Skip(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.h = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))

            def forward(self, x):
                a = self.h[0](x)
                return self.h[2](self.h[1](a)) + a
        return Skip()


def test_a_traced_split_with_a_skip_connection_relays_the_skipped_tensor_through_the_stage_between(no_thread_left):
    """A model that is not a Hugging Face decoder is traced; block 0's output, read again by block 2, would go
    from stage 0 past stage 1 to stage 2, which torch's runtimes refuse ("Backward of skip connections not
    supported yet"). ``relay_skips`` makes stage 1 take it as one more input and return it unchanged, so that
    every tensor goes to the next stage only (``adjacent_only`` passes), and the split pipe still computes the
    model's output and the same gradients."""
    torch = pytest.importorskip("torch")
    plan = make_plan([str(i) for i in range(3)], [0, 1, 2], paths=[f"h.{i}" for i in range(3)], schedule="gpipe",
                     micro_batches=2)
    ns: dict = {}
    exec(compile(export_plan(plan, "torch-pipelining"), "pipe.py", "exec"), ns)
    torch.manual_seed(0)
    model, x = _SkipModel.build(), torch.randn(2, 4)
    split = {fqn: ns["SplitPoint"].BEGINNING for fqn in ns["SPLIT_POINTS"]}
    pipe = ns["pipeline"](model, mb_args=(x,), split_spec=split)
    with pytest.raises(ValueError, match=r"the traced split sends '\w+' from stage 0 to stage 2: torch's "
                                         "pipelines pass tensors only to the next stage"):
        ns["adjacent_only"](pipe)                      # as pipeline() split it
    ns["contiguous_boundaries"](pipe)
    ns["relay_skips"](pipe)
    ns["adjacent_only"](pipe)                          # relayed: every tensor to the next stage only
    middle = pipe.get_stage_module(1).graph
    places = [n for n in middle.nodes if n.op == "placeholder"]
    out = next(n for n in middle.nodes if n.op == "output").args[0]
    assert len(places) == 1 and list(out) == [out[0], places[0]]   # block 0's output: read, and passed on as it is
    want = model(x)
    stages = [pipe.get_stage_module(k) for k in range(3)]
    got = stages[2](*stages[1](stages[0](x)))          # what each stage sends, to the next one
    assert torch.allclose(got, want)
    got.sum().backward()
    grads = {n: p.grad.clone() for s in stages for n, p in s.named_parameters()}
    model.zero_grad()
    model(x).sum().backward()
    assert len(grads) == len(dict(model.named_parameters()))
    for name, param in model.named_parameters():
        held = [g for n, g in grads.items() if n.endswith(name)]
        assert len(held) == 1 and torch.allclose(held[0], param.grad), name


_SKIP_MODEL = '''
import torch


class Skip(torch.nn.Module):
    """Four blocks as separate attributes (no stack of them: a traced export); block 0's output also
    feeds block 2 (a skip connection over block 1)."""

    def __init__(self):
        super().__init__()
        self.block0, self.block1, self.block2, self.block3 = (torch.nn.Linear(8, 8) for _ in range(4))

    def forward(self, x):
        a = torch.relu(self.block0(x))
        return self.block3(self.block2(torch.relu(self.block1(a))) + a).sum()


def build():
    return Skip(), (torch.randn(4, 8),)
'''


def test_a_traced_split_with_a_skip_connection_exports_and_records_the_skipped_tensor(tmp_path, capsys):
    """Captured, solved on 4 devices (one layer per stage): block 0's output is read by block 2, so the
    traced pipeline would send it from stage 0 past stage 1; the plan records that tensor (layers 0 to 2),
    and the export writes the program that relays it through stage 1 (``relay_skips``, run by
    ``build_pipeline`` before the stages are built). On 2 devices the same model exports too."""
    pytest.importorskip("torch")
    from helpers import run_cli
    (tmp_path / "skipmodel.py").write_text(_SKIP_MODEL)
    profile = tmp_path / "skip.stagesplit"
    assert run_cli(capsys, "capture", f"{tmp_path / 'skipmodel.py'}:build", "-o", profile)[0] == 0
    for devices in (4, 2):
        assert run_cli(capsys, "solve", profile, "--devices", devices, "--schedule", "gpipe", "--micro-batches", 4,
                       "--out", tmp_path / f"plan{devices}.json")[0] == 0
    doc = json.loads((tmp_path / "plan4.json").read_text())
    assert doc["split"] == "[ 0 | 1 | 2 | 3 ]"
    wide = [w for w in doc["wide_tensors"] if (w["first_layer"], w["last_layer"]) == (0, 2)]
    assert len(wide) == 1 and "relu" in wide[0]["name"]
    assert read_plan(tmp_path / "plan4.json").wide_tensors[0].name == doc["wide_tensors"][0]["name"]
    assert run_cli(capsys, "export", tmp_path / "plan4.json", "--to", "torch-pipelining", "-o",
                   tmp_path / "pipe4.py")[0] == 0
    code = (tmp_path / "pipe4.py").read_text()
    assert code.count("\n    relay_skips(pipe)\n") == 1 and code.index("\n    contiguous_boundaries(pipe)\n") < \
        code.index("\n    relay_skips(pipe)\n") < code.index("\n    adjacent_only(pipe)\n")
    assert json.loads((tmp_path / "plan2.json").read_text())["split"] in ("[ 0 1 | 2 3 ]", "[ 0 | 1 2 3 ]",
                                                                          "[ 0 1 2 | 3 ]")
    assert run_cli(capsys, "export", tmp_path / "plan2.json", "--to", "torch-pipelining", "-o",
                   tmp_path / "pipe2.py")[0] == 0
