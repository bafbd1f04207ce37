"""stagesplit capture: a PyTorch training step recorded under fake tensors.

The captured memory is checked against torch's own accounting (MemTracker, which is not
capture's code) for the whole step and for every stage of 4-stage plans, against a 2-layer MLP
whose bytes are written out by arithmetic, and on bad input."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from stagesplit.model.analysis import Analysis  # noqa: E402
from stagesplit.io.capture import capture, capture_model, peak_bytes  # noqa: E402
from stagesplit.cli import main  # noqa: E402
from stagesplit.errors import StagesplitError  # noqa: E402
from stagesplit.layers import Rule  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
GPT_FILE = ROOT / "examples" / "gpt.py"


def _load_gpt():
    spec = importlib.util.spec_from_file_location("stagesplit_example_gpt", GPT_FILE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


gpt = _load_gpt()
#: the example's 8-block GPT, narrower than its default so the real runs stay quick
CFG = gpt.GPTConfig(vocab_size=4096, context=128, d_model=128, heads=4, layers=8, batch=4)


@pytest.fixture(scope="module")
def gpt_capture():
    """The README's example (8 blocks), exact bytes (no allocator rounding: CPU tensors have none)."""
    profile = capture_model(*gpt.build(CFG), allocator_round=1)
    return profile, Analysis.of(profile)


def _memtracker_peak(run, *tracked) -> int:
    from torch.distributed._tools.mem_tracker import MemTracker
    tracker = MemTracker()
    tracker.track_external(*tracked)
    with tracker:
        run(tracker)
    return tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


# ---- against torch's own accounting ------------------------------------------------------------


@pytest.mark.slow
def test_whole_step_peak_matches_memtracker(gpt_capture):
    """One real training step of the same GPT on CPU, measured by MemTracker. A warm-up step
    creates the Adam state and zero_grad(set_to_none=False) keeps the gradients, as gradient
    accumulation over micro-batches does: capture counts both as always live."""
    profile, analysis = gpt_capture
    model, idx = gpt.build_real(CFG)
    opt = torch.optim.Adam(model.parameters(), foreach=False)
    model(idx).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=False)

    def step(_tracker):
        loss = model(idx).sum()
        loss.backward()
        opt.step()

    measured = _memtracker_peak(step, model, opt, idx)
    predicted = analysis.model.stage_memory(0, analysis.model.num_layers - 1).worst_bytes()
    assert predicted == peak_bytes(profile)            # nothing is left out of the layers
    assert abs(predicted - measured) <= 0.05 * measured, (predicted, measured)


def _run_stage(first: int, last: int, in_flight: int) -> int:
    """Run layers first..last of a fresh real GPT as a pipeline stage alone and return
    MemTracker's peak: the stage's parameters (the first and last stages each hold the tied
    embedding, as pipelines replicate it), their gradients and Adam state, and ``in_flight``
    micro-batches: all their forwards, then all their backwards, then the optimizer step. The
    input activation of a middle stage and the gradient it receives are allocated inside the
    tracker, as the receive does."""
    model, _ = gpt.build_real(CFG)
    stage = gpt.PipelineStage(model, first, last)
    opt = torch.optim.Adam(stage.params, foreach=False)
    stage.backward(stage.forward(stage.make_input()))
    opt.step()
    opt.zero_grad(set_to_none=False)

    def step(tracker):
        xs = [stage.make_input() for _ in range(in_flight)]
        outs = []
        for x in xs:
            tracker.reset_mod_stats()              # MemTracker's per-module stats allow one call per module
            outs.append(stage.forward(x))
        for out in outs:
            stage.backward(out)
        del outs, xs
        opt.step()

    return _memtracker_peak(step, *stage.params, *stage.buffers, opt)


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["none", "1f1b"])
def test_every_stage_of_a_4_stage_plan_matches_memtracker(gpt_capture, schedule):
    """Each stage of a 4-stage plan, predicted from the capture, against the stage's layers run
    alone for real. With 1F1B the stage holds ``in_flight`` = min(M, P - s) micro-batches: the
    prediction is the one-micro-batch peak plus in_flight - 1 copies of the stashed activations,
    and the measurement runs in_flight forwards before the first backward, so it holds that many
    micro-batches' saved activations, inputs and outputs at once."""
    from stagesplit.plan.advise import advise
    from stagesplit.solver.problem import SolveOptions
    _, analysis = gpt_capture
    plan = advise(analysis.model, SolveOptions(devices=4, exact=True, schedule=schedule, micro_batches=8)).plan
    assert len(plan.stages) == 4
    if schedule == "1f1b":
        assert [s.in_flight for s in plan.stages] == [4, 3, 2, 1]
    for stage in plan.stages:
        measured = _run_stage(stage.first_layer, stage.last_layer, stage.in_flight)
        predicted = analysis.model.stage_memory(stage.first_layer, stage.last_layer).worst_bytes(stage.in_flight)
        assert predicted == stage.worst_tile_bytes
        assert abs(predicted - measured) <= 0.05 * measured, (stage.layers, predicted, measured)


# ---- grouping ------------------------------------------------------------------------------------


def test_gpt_blocks_embeddings_and_head_become_eight_layers(gpt_capture):
    profile, analysis = gpt_capture
    layers = analysis.layers
    assert layers.names == [str(i) for i in range(8)]
    assert layers.module_paths == [f"transformer.h.{i}" for i in range(8)]
    assert (layers.op_layer >= 0).all()                 # nothing shared
    assert not analysis.model.var_items.shared.any()
    names = profile.operations.name
    by = {name: set() for name in ("transformer.wte", "transformer.wpe", "transformer.ln_f", "lm_head", "loss",
                                   "transformer/")}
    for i, name in enumerate(names):
        for prefix in by:
            if name.startswith(prefix + ("" if prefix.endswith("/") else "/")):
                by[prefix].add(int(layers.op_layer[i]))
    assert by["transformer.wte"] == by["transformer.wpe"] == {0}         # the first-layer regex
    assert by["lm_head"] == by["loss"] == {7}                            # the last-layer regex
    assert by["transformer.ln_f"] == {7}                                 # explicit: after block 7
    assert by["transformer/"] == {0}                                     # positions: before block 0
    wte = [i for i, n in enumerate(names) if n.startswith("transformer.wte/")]
    assert {Rule(layers.op_rule[i]) for i in wte} == {Rule.FIRST_LAYER}
    # backward ops land in the layer whose forward made them
    for i, name in enumerate(names):
        if name.startswith("transformer.h.3.") and "/backward/" in name:
            assert layers.op_layer[i] == 3


def test_tied_embedding_is_one_variable_on_the_first_and_last_stages(gpt_capture):
    profile, analysis = gpt_capture
    tied = [v for v in range(len(profile.variables)) if "shared with lm_head.weight" in profile.variable_name(v)]
    assert len(tied) == 1
    model = analysis.model
    cfg = CFG
    wte = cfg.vocab_size * cfg.d_model * 4
    assert profile.variables.bytes[tied[0]] == wte and profile.variables.always_live[tied[0]]
    # weight, gradient and two Adam moments on both stages that use it, never in the middle
    first, middle, last = (model.stage_memory(a, b).always_live[0] for a, b in ((0, 0), (3, 3), (7, 7)))
    block = 12 * cfg.d_model ** 2 + 13 * cfg.d_model        # one block's parameters
    steps = 4 * 12                                             # Adam's step counters, float32
    mask = cfg.context ** 2                                    # the block's causal mask buffer (bool)
    assert middle == 4 * block * 4 + steps + mask
    assert last - middle == 4 * (wte + 2 * cfg.d_model * 4) + 4 * 3   # + ln_f, + 3 step counters
    assert first - middle == 4 * (wte + cfg.context * cfg.d_model * 4) + 4 * 2   # + wpe


# ---- a 2-layer MLP written out by hand -------------------------------------------------------------


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)])

    def forward(self, x):
        return self.layers[1](torch.relu(self.layers[0](x)))


def test_two_layer_mlp_bytes_and_flops_by_hand():
    with torch.device("meta"):
        model = MLP()
    x = torch.empty(32, 8, device="meta")
    profile = capture_model(model, x, allocator_round=1, name="mlp")
    analysis = Analysis.of(profile)
    m = analysis.model
    assert analysis.layers.names == ["0", "1"]
    f = 4                                                   # float32 bytes
    params0 = (16 * 8 + 16) * f                             # 576
    params1 = (4 * 16 + 4) * f                              # 272
    step = 4                                                # Adam's step counter per parameter tensor
    # parameters + gradients + exp_avg + exp_avg_sq, and two step counters per layer
    assert m.stage_memory(0, 0).always_live[0] == 4 * params0 + 2 * step == 2312
    assert m.stage_memory(1, 1).always_live[0] == 4 * params1 + 2 * step == 1096
    always = 4 * (params0 + params1) + 4 * step             # 3408
    v = profile.variables
    assert int(v.bytes[v.always_live].sum()) == always
    # activations: input x (32x8, live all step), h = addmm (32x16, dies at relu), r = relu (32x16,
    # saved for backward), y (32x4), the loss and its seed gradient (one float each). The peak is
    # at threshold_backward: x + r + grad_r (32x16) + grad_h (32x16) + loss + seed gradient
    x_b, r_b, loss_b = 32 * 8 * f, 32 * 16 * f, f
    peak = always + x_b + r_b + 32 * 16 * f + 32 * 16 * f + loss_b + f
    assert peak == 10584
    assert peak_bytes(profile) == peak
    assert m.stage_memory(0, 1).worst_bytes() == peak
    # FLOPs: forward addmm 2*32*8*16 and, backward, the weight gradient (input needs none);
    # layer 1: forward 2*32*16*4, input gradient and weight gradient of the same size
    assert list(m.layer_compute) == [2 * (2 * 32 * 8 * 16), 3 * (2 * 32 * 16 * 4)]
    assert profile.info.source == "pytorch" and profile.compute_unit == "flops"
    assert profile.target.tiles == 1 and profile.target.name == "a100-80gb"


def test_mlp_peak_matches_memtracker():
    """The same MLP run for real (a second check of the hand arithmetic above)."""
    torch.manual_seed(0)
    model = MLP()
    x = torch.randn(32, 8)
    opt = torch.optim.Adam(model.parameters(), foreach=False)
    model(x).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=False)

    def step(_tracker):
        loss = model(x).sum()
        loss.backward()
        opt.step()

    assert _memtracker_peak(step, model, opt, x) == 10584


def test_dtype_amp_optimizer_and_rounding_change_the_always_live_bytes():
    def always(**kw):
        with torch.device("meta"):
            model = MLP()
        p = capture_model(model, torch.empty(32, 8, device="meta"), **kw)
        return int(p.variables.bytes[p.variables.always_live].sum()), p
    n = 16 * 8 + 16 + 4 * 16 + 4                              # 212 parameters in 4 tensors
    assert always(allocator_round=1)[0] == 16 * n + 16
    assert always(allocator_round=1, dtype="bfloat16")[0] == 8 * n + 16     # bf16 weights, grads, moments
    assert always(allocator_round=1, amp=True)[0] == 16 * n + 16            # amp: float32 master state
    assert always(allocator_round=1, optimizer="sgd")[0] == 12 * n          # one momentum buffer
    assert always(allocator_round=1, optimizer="none")[0] == 8 * n
    rounded, p = always()                                                   # 512-byte blocks
    assert rounded == (4 * 4 + 4) * 512           # 4 x (weight, grad, 2 moments) <= 512 B each, + 4 steps
    assert (p.variables.bytes % 512 == 0).all()
    _, amp = always(allocator_round=1, amp=True)
    names = [amp.variable_name(v) for v in range(len(amp.variables))]
    assert amp.variables.bytes[names.index("layers.0/aten.addmm:out0")] == 32 * 16 * 2   # a bfloat16 activation
    assert "bfloat16 autocast" in amp.info.description


# ---- LLaMA-style names -----------------------------------------------------------------------------


class TinyLlama(torch.nn.Module):
    def __init__(self, layers=3, d=16, vocab=64):
        super().__init__()
        self.model = torch.nn.Module()
        self.model.embed_tokens = torch.nn.Embedding(vocab, d)
        self.model.layers = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(d, 2 * d), torch.nn.SiLU(), torch.nn.Linear(2 * d, d))
            for _ in range(layers))
        self.model.norm = torch.nn.LayerNorm(d)
        self.lm_head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, input_ids):
        x = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            x = x + layer(x)
        return self.lm_head(self.model.norm(x))


def test_llama_style_names_group_into_blocks_with_embedding_first_and_norm_head_last():
    with torch.device("meta"):
        model = TinyLlama()
    profile = capture_model(model, {"input_ids": torch.zeros(2, 8, dtype=torch.long, device="meta")},
                            loss_fn=lambda logits: logits.float().pow(2).mean())
    analysis = Analysis.of(profile)
    layers = analysis.layers
    assert layers.names == ["0", "1", "2"]
    assert layers.module_paths == ["model.layers.0", "model.layers.1", "model.layers.2"]
    assert (layers.op_layer >= 0).all()
    for i, name in enumerate(profile.operations.name):
        if name.startswith("model.embed_tokens/"):
            assert layers.op_layer[i] == 0, name
        if name.startswith(("model.norm/", "lm_head/", "loss/")):
            assert layers.op_layer[i] == 2, name


# ---- the command line --------------------------------------------------------------------------------


TINY_FACTORY = f"""
import importlib.util, sys
spec = importlib.util.spec_from_file_location("_gpt_example", {str(GPT_FILE)!r})
gpt = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = gpt
spec.loader.exec_module(gpt)

def build():
    return gpt.build(gpt.GPTConfig(vocab_size=512, context=32, d_model=32, heads=2, layers=4, batch=2))
"""


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_cli_capture_then_every_command_runs(tmp_path, capsys):
    factory = _write(tmp_path, "tiny.py", TINY_FACTORY)
    out = tmp_path / "tiny.stagesplit"
    assert main(["capture", f"{factory}:build", "-o", str(out), "--name", "tiny-gpt"]) == 0
    assert "wrote" in capsys.readouterr().err
    from stagesplit.io import load_profile
    profile = load_profile(out)
    assert profile.info.source == "pytorch" and profile.info.name == "tiny-gpt"
    assert profile.compute_unit == "flops" and profile.target.tiles == 1
    plan = tmp_path / "plan.json"
    assert main(["solve", str(out), "--devices", "2", "--schedule", "1f1b", "--micro-batches", "4",
                 "--out", str(plan)]) == 0
    assert "split: [ 0 1 | 2 3 ]" in capsys.readouterr().out
    assert main(["breakdown", str(out)]) == 0
    assert main(["sweep", str(out), "--devices", "1..3"]) == 0
    assert main(["diagnose", str(out), "--plan", str(plan)]) == 0
    capsys.readouterr()


def test_cli_capture_help_documents_every_option(capsys):
    with pytest.raises(SystemExit):
        main(["capture", "--help"])
    text = capsys.readouterr().out
    for option in ("MODEL", "--output", "--optimizer", "--dtype", "--amp", "--target", "--layer-regex",
                   "--allocator-round", "--name", "meta", "stagesplit[torch]"):
        assert option in text, option


def test_layer_regex_stores_explicit_layers(tmp_path):
    class Staged(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.stages = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))

        def forward(self, x):
            for s in self.stages:
                x = s(x)
            return x

    with torch.device("meta"):
        model = Staged()
    profile = capture_model(model, torch.empty(2, 4, device="meta"), layer_regex=r"stages\.(\d+)")
    assert set(profile.operations.layer) == {"0", "1", "2"}
    assert Analysis.of(profile).layers.names == ["0", "1", "2"]       # with the default regex


BAD = {
    "returns_model_only": """
        import torch
        def build():
            return torch.nn.Linear(2, 2)
        """,
    "forward_raises": """
        import torch
        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.layers = torch.nn.ModuleList([torch.nn.Linear(2, 2)])
            def forward(self, x):
                raise ValueError("boom in forward\\nsecond line")
        def build():
            return M(), torch.zeros(1, 2)
        """,
    "data_dependent": """
        import torch
        class Block(torch.nn.Module):
            def forward(self, x):
                return x[torch.nonzero(x > 0)[:, 0]]
        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(2, 2)
                self.blocks = torch.nn.ModuleList([Block()])
            def forward(self, x):
                return self.blocks[0](self.lin(x))
        def build():
            return M(), torch.zeros(3, 2)
        """,
    "syntax_error": """
        def build(:
            pass
        """,
}


@pytest.mark.parametrize("case,spec,expected", [
    ("missing_file", "{tmp}/nope.py:build", "cannot import"),
    ("missing_module", "no_such_package_for_stagesplit.models:build", "cannot import no_such_package_for_stagesplit"),
    ("syntax_error", "{tmp}/syntax_error.py:build", "SyntaxError"),
    ("no_function", "{gpt}:no_such_function", "no function 'no_such_function'"),
    ("no_colon", "{gpt}", "expected MODEL as path/to/file.py:function"),
    ("returns_model_only", "{tmp}/returns_model_only.py:build", "expected (model, inputs) or (model, inputs, loss_fn)"),
    ("forward_raises", "{tmp}/forward_raises.py:build", "ValueError: boom in forward"),
    ("data_dependent", "{tmp}/data_dependent.py:build", "aten.nonzero in blocks.0 cannot run under fake tensors"),
])
def test_bad_model_one_line_exit_2_no_output(tmp_path, capsys, case, spec, expected):
    for name, text in BAD.items():
        _write(tmp_path, f"{name}.py", text)
    out = tmp_path / "out.stagesplit"
    kept = tmp_path / "kept.stagesplit"
    kept.write_bytes(b"old")
    spec = spec.format(tmp=tmp_path, gpt=GPT_FILE)
    assert main(["capture", spec, "-o", str(out)]) == 2
    assert main(["capture", spec, "-o", str(kept)]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("stagesplit: error: ") for line in lines), err
    assert expected in lines[0], lines[0]
    assert "second line" not in err and "Traceback" not in err
    assert not out.exists() and kept.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []   # no temporary left


def test_without_torch_one_line_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(StagesplitError, match=r"pip install 'stagesplit\[torch\]'"):
        capture(f"{GPT_FILE}:build")


def test_nothing_but_capture_imports_torch():
    code = textwrap.dedent("""
        import importlib, pkgutil, sys
        import stagesplit
        for m in pkgutil.walk_packages(stagesplit.__path__, "stagesplit."):
            if m.name not in ("stagesplit.io.capture", "stagesplit.__main__"):
                importlib.import_module(m.name)
        from stagesplit.cli.parser import build_parser
        build_parser().parse_args(["capture", "x.py:f", "-o", "y.stagesplit"])
        print("torch" in sys.modules)
        """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_real_model_and_tuple_output_accepted():
    torch.manual_seed(0)
    model = MLP()
    p_real = capture_model(model, (torch.randn(32, 8),), loss_fn=lambda y: y.square().mean(), allocator_round=1)
    with torch.device("meta"):
        meta = MLP()
    p_meta = capture_model(meta, torch.empty(32, 8, device="meta"), loss_fn=lambda y: y.square().mean(),
                           allocator_round=1)
    assert peak_bytes(p_real) == peak_bytes(p_meta)
    assert np.array_equal(np.sort(p_real.variables.bytes), np.sort(p_meta.variables.bytes))
    before = [p.detach().clone() for p in model.parameters()]
    capture_model(model, torch.randn(32, 8))
    from torch._subclasses.fake_tensor import FakeTensor
    after = list(model.parameters())
    assert not any(isinstance(p, FakeTensor) for p in after)          # the caller's model is restored
    assert all(torch.equal(a, b) for a, b in zip(before, after))


# ---- --reserve and GPU-facing output -----------------------------------------------------------------


def test_reserve_is_subtracted_from_every_device_and_gpu_tables_show_gib(tmp_path, capsys):
    import json
    profile = ROOT / "profiles" / "llama-7b-layers.json"
    plan_path = tmp_path / "plan.json"
    assert main(["solve", str(profile), "--devices", "8", "--target", "a100-80gb", "--reserve", "2GiB",
                 "--out", str(plan_path)]) == 0
    out = capsys.readouterr().out
    assert "(80.00 GiB each, 2.00 GiB reserved)" in out
    header = next(line for line in out.splitlines() if line.startswith("stage  device"))
    assert "memory (GiB)" in header and "worst tile" not in header and "code+state" not in header
    plan = json.loads(plan_path.read_text())
    assert {s["capacity_bytes"] for s in plan["stages"]} == {80 * 2**30 - 2 * 2**30}
    assert main(["solve", str(profile), "--devices", "8", "--target", "a100-80gb", "--ipu-columns"]) == 0
    out = capsys.readouterr().out
    assert "worst tile bytes" in out and "tiles x 85,899,345,920 bytes" in out
    assert main(["solve", str(profile), "--devices", "8", "--target", "a100-80gb", "--reserve", "81GiB"]) == 2
    assert "--reserve" in capsys.readouterr().err
    assert main(["solve", str(profile), "--devices", "8", "--reserve", "lots"]) == 2
    capsys.readouterr()
    assert main(["breakdown", str(profile), "--target", "a100-80gb", "--sections", "layers,totals"]) == 0
    out = capsys.readouterr().out
    assert "(GiB)" in out and "vertex code" not in out and "exchange code" not in out
