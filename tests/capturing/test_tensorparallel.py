"""stagesplit capture --tp: one tensor-parallel rank captured under torch's fake process group.

A two-Linear stack whose rank's bytes are written out by arithmetic; a Hugging Face Llama from a
config (its declared plan: the heads a rank holds, the degrees refused); the parallel layout's
round trip through both file formats; bad plans on the command line; and, slow, the decisive
check: the same models run for real on 2 gloo processes, each rank measured by torch's
MemTracker against the capture's prediction, and the loss against the unparallelised model's."""

from __future__ import annotations

import textwrap

import pytest

torch = pytest.importorskip("torch")

import tp_harness  # noqa: E402
from stagesplit.capturing.profilebuild import peak_bytes  # noqa: E402
from stagesplit.capturing.pytorch import capture_model  # noqa: E402
from stagesplit.cli import main  # noqa: E402
from stagesplit.errors import OptionError  # noqa: E402
from stagesplit.io import load_profile, save_profile  # noqa: E402
from stagesplit.io.profile import Collective, ParallelLayout  # noqa: E402
from stagesplit.model.analysis import Analysis  # noqa: E402
from stagesplit.reporting.layout import tensor_parallel_line  # noqa: E402

F32 = 4


class TwoLinear(torch.nn.Module):
    """hidden 64 -> 128 (colwise) -> relu -> 64 (rowwise)."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(64, 128)
        self.down = torch.nn.Linear(128, 64)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


@pytest.fixture
def mlp_plan(tmp_path):
    path = tmp_path / "plan.yaml"
    path.write_text("up: colwise\ndown: rowwise\n")
    return path


def _bytes_by_name(profile) -> dict[str, int]:
    v = profile.variables
    return {profile.variable_name(i): int(v.bytes[i]) for i in range(len(v))}


def test_two_linear_rank_bytes_by_hand(mlp_plan):
    """At TP 2 rank 0 holds half of up's weight rows and bias (colwise), half of down's weight
    columns and all of down's bias (rowwise: the bias is added once, after the reduction); the
    gradients and both Adam moments are the same shards. The intermediate (8 x 128) is 8 x 64 on
    the rank, before and after the relu; down's partial sums (8 x 64) are all-reduced once, in
    the forward (the input needs no gradient, so the backward communicates nothing)."""
    batch = 8
    profile = capture_model(TwoLinear(), torch.zeros(batch, 64), tp=2, tp_plan=mlp_plan, allocator_round=1)
    got = _bytes_by_name(profile)
    shards = {"up.weight": 64 * 64 * F32, "up.bias": 64 * F32, "down.weight": 64 * 64 * F32, "down.bias": 64 * F32}
    for name, nbytes in shards.items():
        assert got[name] == nbytes, name
        assert got[name + ".grad"] == nbytes, name
        assert got[name + ".exp_avg"] == nbytes, name
        assert got[name + ".exp_avg_sq"] == nbytes, name
        assert got[name + ".step"] == F32, name
    v = profile.variables
    always = int(v.bytes[v.always_live].sum())
    assert always == 4 * sum(shards.values()) + 4 * F32
    assert got["up/aten.addmm:out0"] == batch * 64 * F32          # the rank's half of the intermediate
    assert got["<root>/aten.relu:out0"] == batch * 64 * F32
    layout = profile.info.parallel_layout
    assert layout.tensor_parallel == 2 and not layout.sequence_parallel
    assert layout.styles == (("up", "colwise"), ("down", "rowwise"))
    assert [(c.kind, c.bytes, c.group_size, c.phase) for c in layout.collectives] == [
        ("all_reduce", batch * 64 * F32, 2, "forward")]
    assert profile.operations.name[layout.collectives[0].step] == "down/_c10d_functional.all_reduce"
    assert "rank 0 of 2 tensor-parallel ranks" in profile.info.description


def test_model_left_as_it_came_and_group_torn_down(mlp_plan):
    """The caller's parameters come back plain, torch's hooks and marks are gone, the fake
    process group is destroyed: a second capture (at another degree) in the process works."""
    import sys

    import torch.distributed as dist
    model = TwoLinear()
    hook = sys.excepthook
    before = {n: p for n, p in model.named_parameters()}
    first = capture_model(model, torch.zeros(8, 64), tp=2, tp_plan=mlp_plan, allocator_round=1)
    assert not dist.is_initialized()
    assert sys.excepthook is hook                       # torch's [rank0] traceback prefix is gone too
    assert {n: p for n, p in model.named_parameters()} == before
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert all("_distribute_module_applied" not in vars(m) for m in model.modules())
    second = capture_model(model, torch.zeros(8, 64), tp=4, tp_plan=mlp_plan, allocator_round=1)
    assert _bytes_by_name(second)["up.weight"] * 2 == _bytes_by_name(first)["up.weight"]
    again = capture_model(model, torch.zeros(8, 64), tp=2, tp_plan=mlp_plan, allocator_round=1)
    assert peak_bytes(again) == peak_bytes(first) and again.operations.name == first.operations.name
    assert again.info.parallel_layout == first.info.parallel_layout
    plain = capture_model(model, torch.zeros(8, 64), allocator_round=1)
    assert plain.info.parallel_layout is None
    assert _bytes_by_name(plain)["up.weight"] == 2 * _bytes_by_name(first)["up.weight"]


def _llama(device="meta"):
    pytest.importorskip("transformers", reason="the Llama cases build a Hugging Face model from a config")
    return tp_harness.build("llama", device), tp_harness.inputs("llama", device)


def test_llama_declared_plan_heads_per_rank():
    """LlamaForCausalLM declares its plan (``_tp_plan``): at TP 2 each attention's 4 heads and
    2 KV heads become 2 and 1 on the rank (its q_proj and k_proj shards over the head size)."""
    profile = capture_model(*_llama(), tp=2, allocator_round=1)
    layout = profile.info.parallel_layout
    assert layout.plan == "the model's declared plan (LlamaForCausalLM._tp_plan)"
    assert layout.heads == (("model.layers.0.self_attn", 2, 1), ("model.layers.1.self_attn", 2, 1))
    styles = dict(layout.styles)
    assert styles["lm_head"] == "colwise_gather_output" and styles["model.embed_tokens"] == "embedding_rowwise"
    assert styles["model.layers.1.mlp.down_proj"] == "rowwise"
    got = _bytes_by_name(profile)
    assert got["model.layers.0.self_attn.q_proj.weight"] == 32 * 64 * F32
    assert got["model.layers.0.self_attn.k_proj.weight"] == 16 * 64 * F32
    assert got["model.embed_tokens.weight"] == 128 * 64 * F32
    assert got["model.embed_tokens.weight.exp_avg"] == 128 * 64 * F32
    # the vocabulary-split embedding's gradient, as autograd makes it, is a partial sum over the
    # whole vocabulary (the real ranks below hold it so too); the head's is its shard
    assert got["model.embed_tokens.weight.grad"] == 256 * 64 * F32
    assert got["lm_head.weight.grad"] == 128 * 64 * F32
    line = tensor_parallel_line(layout)
    kinds = {}
    for c in layout.collectives:
        kinds[c.kind] = kinds.get(c.kind, 0) + 1
    assert line.startswith("rank 0 of 2 tensor-parallel ranks; plan: the model's declared plan "
                           f"(LlamaForCausalLM._tp_plan), {len(layout.styles)} modules planned; per rank 2 "
                           "attention heads and 1 KV head; ")
    assert f"{len(layout.collectives)} collectives per step (" in line
    assert ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) in line


def test_llama_loss_parallel_keeps_the_logits_split():
    """``loss_parallel``: the declared plan's gathered head (``colwise_gather_output``) becomes
    ``colwise_loss_parallel``: its logits stay the rank's half of the vocabulary (2 x 32 tokens x 128
    classes x 4 bytes, where the gathered ones are 256 classes) and the cross-entropy runs on them under
    torch's ``loss_parallel``: the head's all-gather is gone and the loss's three reductions over the
    vocabulary (the maximum, the sum of exponentials, the target's logit) come in its place, and nothing
    the head or the loss makes is larger than the split logits."""
    gathered = capture_model(*_llama(), tp=2, allocator_round=1)
    split = capture_model(*_llama(), tp=2, allocator_round=1, loss_parallel=True)
    styles = dict(split.info.parallel_layout.styles)
    assert styles["lm_head"] == "colwise_loss_parallel"
    assert {k: v for k, v in styles.items() if k != "lm_head"} == \
        {k: v for k, v in dict(gathered.info.parallel_layout.styles).items() if k != "lm_head"}
    before, after = _bytes_by_name(gathered), _bytes_by_name(split)
    assert before["lm_head/_c10d_functional.all_gather_into_tensor:out0"] == 2 * 32 * 256 * F32
    assert after["lm_head/aten.mm:out0"] == 2 * 32 * 128 * F32
    made = {n: b for n, b in after.items() if n.startswith(("lm_head/", "loss/", "<root>/"))}
    assert made and max(made.values()) == 2 * 32 * 128 * F32, sorted(made.items(), key=lambda kv: -kv[1])[:3]

    def kinds(profile):
        found: dict[str, int] = {}
        for c in profile.info.parallel_layout.collectives:
            found[c.kind] = found.get(c.kind, 0) + 1
        return found
    assert kinds(gathered)["all_gather_into_tensor"] == 1
    assert "all_gather_into_tensor" not in kinds(split)
    assert kinds(split)["all_reduce"] == kinds(gathered)["all_reduce"] + 3
    assert peak_bytes(split) < peak_bytes(gathered)
    assert tensor_parallel_line(split.info.parallel_layout).startswith(
        "rank 0 of 2 tensor-parallel ranks, the loss on logits split over the vocabulary (loss_parallel); plan: ")


def test_llama_sequence_parallel_layout():
    """With sequence parallelism the norms run under SequenceParallel, the first block takes
    its input split, and the communication becomes all-gathers and reduce-scatters."""
    profile = capture_model(*_llama(), tp=2, sequence_parallel=True, allocator_round=1)
    layout = profile.info.parallel_layout
    additions = dict(layout.additions)
    assert additions["model.layers.0"] == "input split on the sequence"
    assert additions["model.layers.1.post_attention_layernorm"] == "SequenceParallel"
    assert additions["model.norm"] == "SequenceParallel"
    kinds = {c.kind for c in layout.collectives}
    assert {"all_gather_into_tensor", "reduce_scatter_tensor"} <= kinds
    # the five norms' weights are whole on every rank; their gradients, summed over the rank's part
    # of the sequence, are all-reduced in the backward
    norm_reductions = [c for c in layout.collectives if c.kind == "all_reduce" and c.bytes == 64 * F32]
    assert len(norm_reductions) == 5 and {c.phase for c in norm_reductions} == {"backward"}


@pytest.mark.parametrize("degree, message", [
    (3, "--tp: model.layers.0.self_attn has 4 attention heads, not divisible by 3 ranks"),
    (4, "--tp: model.layers.0.self_attn has 2 key/value heads, not divisible by 4 ranks"),
])
def test_llama_degree_refused(tmp_path, capsys, degree, message):
    pytest.importorskip("transformers", reason="the Llama cases build a Hugging Face model from a config")
    factory = tmp_path / "tiny_llama.py"
    factory.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(tp_harness.ROOT / "tests")!r})
        import tp_harness

        def build():
            return tp_harness.build("llama", "meta"), tp_harness.inputs("llama", "meta")
    """))
    out = tmp_path / "out.stagesplit"
    assert main(["capture", f"{factory}:build", "--tp", str(degree), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"stagesplit: error: {message}"
    assert not out.exists()


def test_bad_plans_refused(tmp_path, capsys):
    factory = tmp_path / "two_linear.py"
    factory.write_text(textwrap.dedent("""
        import torch

        class TwoLinear(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.up = torch.nn.Linear(64, 128)
                self.down = torch.nn.Linear(128, 64)

            def forward(self, x):
                return self.down(torch.relu(self.up(x)))

        def build():
            return TwoLinear(), torch.zeros(8, 64)
    """))
    out = tmp_path / "out.stagesplit"
    cases = {
        "none.yaml": ("nothing.here: colwise\n", "pattern 'nothing.here' matches no module of TwoLinear"),
        "empty.yaml": ("{}\n", "it names no module"),
        "style.yaml": ("up: packed_colwise\n", "up: expected one of colwise"),
    }
    for name, (text, expected) in cases.items():
        plan = tmp_path / name
        plan.write_text(text)
        assert main(["capture", f"{factory}:build", "--tp", "2", "--tp-plan", str(plan), "-o", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"stagesplit: error: --tp-plan {plan}: ") and expected in err, err
        assert "\n" not in err
    plan = tmp_path / "odd.yaml"
    plan.write_text("up: colwise\ndown: rowwise\n")
    assert main(["capture", f"{factory}:build", "--tp", "3", "--tp-plan", str(plan), "-o", str(out)]) == 2
    assert capsys.readouterr().err.strip() == ("stagesplit: error: --tp: up has 128 output features (colwise), "
                                               "not divisible by 3 ranks")
    assert main(["capture", f"{factory}:build", "--tp", "2", "--sp", "--tp-plan", str(plan), "-o", str(out)]) == 2
    assert capsys.readouterr().err.strip() == ("stagesplit: error: --sp: the plan names no module inside a repeated "
                                               "stack of blocks (model.layers.N...); sequence parallelism shards the "
                                               "stream between blocks")
    assert main(["capture", f"{factory}:build", "--sp", "-o", str(out)]) == 2
    assert "--sp: applies to a tensor-parallel capture" in capsys.readouterr().err
    assert main(["capture", f"{factory}:build", "--tp", "2", "-o", str(out)]) == 2
    assert "TwoLinear declares no tensor-parallel plan" in capsys.readouterr().err
    assert main(["capture", f"{factory}:build", "--loss-parallel", "-o", str(out)]) == 2
    assert capsys.readouterr().err.strip() == ("stagesplit: error: --loss-parallel: applies to a tensor-parallel "
                                               "capture (tp of 2 or more)")
    assert main(["capture", f"{factory}:build", "--tp", "2", "--loss-parallel", "--tp-plan", str(plan), "-o",
                 str(out)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"stagesplit: error: --loss-parallel {plan}: the plan gathers no head's output (no module of style "
        "colwise_gather_output): there are no logits split on the vocabulary for the loss to take")
    assert not out.exists()


def test_cli_writes_the_rank_and_names_the_plan(tmp_path, capsys):
    pytest.importorskip("transformers", reason="the Llama cases build a Hugging Face model from a config")
    factory = tmp_path / "tiny_llama2.py"
    factory.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(tp_harness.ROOT / "tests")!r})
        import tp_harness

        def build():
            return tp_harness.build("llama", "meta"), tp_harness.inputs("llama", "meta")
    """))
    out = tmp_path / "llama.stagesplit"
    assert main(["capture", f"{factory}:build", "--tp", "2", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    profile = load_profile(out)
    assert tensor_parallel_line(profile.info.parallel_layout) in err
    assert "plan: the model's declared plan (LlamaForCausalLM._tp_plan)" in err


@pytest.mark.parametrize("suffix", [".stagesplit", ".json"])
def test_parallel_layout_round_trip(tmp_path, suffix, mlp_plan):
    profile = capture_model(TwoLinear(), torch.zeros(8, 64), tp=2, tp_plan=mlp_plan, allocator_round=1)
    path = tmp_path / f"rank{suffix}"
    save_profile(profile, path)
    back = load_profile(path)
    assert back.info.parallel_layout == profile.info.parallel_layout
    assert back.info.parallel_layout.collectives[0] == Collective(profile.info.parallel_layout.collectives[0].step,
                                                                  "all_reduce", 2048, 2, "forward")


def test_parallel_layout_line_by_hand():
    layout = ParallelLayout(2, True, "the plan in p.yaml", (("a", "colwise"),), (), (("attn", 2, 1),),
                            (Collective(0, "all_reduce", 1024, 2, "forward"),
                             Collective(1, "all_gather_into_tensor", 2048, 2, "backward")))
    assert tensor_parallel_line(layout) == (
        "rank 0 of 2 tensor-parallel ranks, sequence parallel; plan: the plan in p.yaml, 1 module planned; per rank 2 "
        "attention heads and 1 KV head; 2 collectives per step (1 all_gather_into_tensor, 1 all_reduce), 3.0 KiB")


def test_degree_option_checked():
    with pytest.raises(OptionError, match="tp: expected a whole number of ranks in 1..4096, got 0"):
        capture_model(TwoLinear(), torch.zeros(8, 64), tp=0)


# ---- the decisive check: real ranks on gloo, measured by torch's MemTracker ---------------------------


@pytest.mark.slow
@pytest.mark.parametrize("model, loss_parallel", [("llama", False), ("gpt", False), ("llama", True)],
                         ids=["llama", "gpt", "llama-loss-parallel"])
@pytest.mark.parametrize("sequence_parallel", [False, True], ids=["tp2", "tp2-sp"])
def test_rank_peak_matches_memtracker_on_gloo(model, loss_parallel, sequence_parallel):
    if model == "llama":
        pytest.importorskip("transformers", reason="the Llama cases build a Hugging Face model from a config")
    """Both ranks of a real TP 2 run (gloo, CPU): each rank's MemTracker peak over one step
    (forward, loss, backward, Adam step; gradients and Adam state already there, as the warm-up
    step left them) against the capture's prediction for one stage holding the whole model:
    the issue asks for 3% with 1% as the goal; measured on an idle machine they are equal to the byte.
    On a loaded one a rank sometimes holds a few more of the blocks' all-reduce outputs (6 x 16,384
    bytes seen), whose buffers gloo's own thread has not yet let go of when the step allocates again: a
    timing of the runtime, not of the model. So the peak is asserted from the prediction (1% below) to
    the prediction plus 8 of the step's most frequent collective (1% above, at least). The loss equals
    the unparallelised model's. With ``loss_parallel`` (Llama) the head's logits stay split and the
    cross-entropy runs on the split under torch's ``loss_parallel``, in the capture and the real ranks."""
    case = tp_harness.TPCase(model, 2, sequence_parallel, loss_parallel)
    ranks = tp_harness.run_tp(case)
    profile = capture_model(tp_harness.build(model, "meta"), tp_harness.inputs(model, "meta"), tp=2,
                            sequence_parallel=sequence_parallel, tp_plan=case.plan_file, allocator_round=1,
                            loss_parallel=loss_parallel)
    analysis = Analysis.of(profile)
    predicted = analysis.model.stage_memory(0, analysis.model.num_layers - 1).worst_bytes()
    assert predicted == peak_bytes(profile)
    reference = tp_harness.reference_loss(model)
    from collections import Counter
    sizes = Counter(c.bytes for c in profile.info.parallel_layout.collectives)
    in_flight = 8 * sizes.most_common(1)[0][0]
    for rank in ranks:
        assert predicted - 0.01 * rank.peak_bytes <= rank.peak_bytes, (rank, predicted)
        assert rank.peak_bytes <= predicted + max(in_flight, 0.01 * rank.peak_bytes), (rank, predicted, in_flight)
        assert rank.loss == pytest.approx(reference, rel=1e-5)


def test_parallel_layout_read_strictly(tmp_path, mlp_plan):
    """A bad field of the layout is refused in one line naming it; a profile without one (every
    file written before it existed) reads with none."""
    import json

    from stagesplit.errors import ProfileError
    profile = capture_model(TwoLinear(), torch.zeros(8, 64), tp=2, tp_plan=mlp_plan, allocator_round=1)
    path = tmp_path / "rank.json"
    save_profile(profile, path)
    doc = json.loads(path.read_text())
    doc["parallel_layout"]["collectives"][0]["kind"] = "gossip"
    path.write_text(json.dumps(doc))
    with pytest.raises(ProfileError, match=r"parallel_layout\.collectives\[0\]\.kind") as caught:
        load_profile(path)
    assert "\n" not in str(caught.value)
    doc["parallel_layout"]["collectives"][0]["kind"] = "all_reduce"
    doc["parallel_layout"]["collectives"][0]["step"] = 10**6
    path.write_text(json.dumps(doc))
    with pytest.raises(ProfileError, match=r"parallel_layout\.collectives\[0\]\.step"):
        load_profile(path)
    assert load_profile(tp_harness.ROOT / "profiles" / "tiny.json").info.parallel_layout is None


def test_a_plan_of_a_tensor_parallel_rank_says_what_a_device_is(tmp_path, capsys, mlp_plan):
    """A plan solved from one TP 2 rank's profile records the degree (and writes it in its file only
    then); solve prints what a pipeline device is, and the GPUs in all: 2 pipeline devices x 2 TP x 2 DP."""
    from stagesplit.reporting.summary import tensor_parallel_text

    class Stack(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList(TwoLinear() for _ in range(2))

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return x

    plan_file = tmp_path / "stack.yaml"
    plan_file.write_text("blocks.*.up: colwise\nblocks.*.down: rowwise\n")
    profile = capture_model(Stack(), torch.zeros(8, 64), tp=2, tp_plan=plan_file, sequence_parallel=False)
    path = tmp_path / "rank.stagesplit"
    save_profile(profile, path)
    out = tmp_path / "plan.json"
    assert main(["solve", str(path), "--devices", "2", "--dp", "2", "--out", str(out)]) == 0
    import json
    document = json.loads(out.read_text())
    assert document["profile"]["tensor_parallel"] == 2 and document["profile"]["sequence_parallel"] is False
    assert main(["solve", "--from-plan", str(out)]) == 0
    text = capsys.readouterr().out
    line = ("tensor parallel: every pipeline device is 2 GPUs (the profile is one of them); figures are one GPU's; "
            "2 pipeline x 2 tensor-parallel x 2 data-parallel = 8 GPUs in all")
    assert tensor_parallel_text(2, False, 2, 2) == line
    assert line in text
    assert tensor_parallel_text(4, True, 3, 1) == (
        "tensor parallel: every pipeline device is 4 GPUs with sequence parallelism (the profile is one of them); "
        "figures are one GPU's; 3 pipeline x 4 tensor-parallel = 12 GPUs in all")


def _deep(model: str, layers: int = 5):
    """The harness's models with ``layers`` blocks (the gradient layouts' cut applies from 4 on)."""
    import dataclasses
    torch.manual_seed(0)
    with torch.device("meta"):
        if model == "llama":
            transformers = pytest.importorskip("transformers", reason="the Llama case builds a Hugging Face model")
            config = tp_harness.llama_config()
            config.num_hidden_layers = layers
            return transformers.LlamaForCausalLM(config), tp_harness.inputs("llama", "meta")
        gpt = tp_harness._gpt_module()
        return gpt.GPT(dataclasses.replace(tp_harness.gpt_config(), layers=layers)), tp_harness.inputs("gpt", "meta")


@pytest.mark.parametrize("model, sequence_parallel", [
    pytest.param("llama", True, id="llama-tp2-sp"),     # the embedding's masked partial, the norms' partial sums
    pytest.param("llama", False, id="llama-tp2", marks=pytest.mark.slow),
    pytest.param("gpt", False, id="gpt-tp2", marks=pytest.mark.slow),
    pytest.param("gpt", True, id="gpt-tp2-sp", marks=pytest.mark.slow)])
def test_gradient_layouts_from_the_cut_stack_equal_the_whole_step(monkeypatch, model, sequence_parallel):
    """The gradients' layouts learnt from the model with its stack cut to three blocks give the
    profile the whole model's unrecorded step gives, byte for byte (the JSON form), and each
    parameter's gradient layout (placements, local shape, strides, dtype) is the whole step's."""
    from stagesplit.capturing import pytorch as capturing
    from stagesplit.io.jsonprofile import dumps_profile
    plan = tp_harness.TPCase(model, 2, sequence_parallel).plan_file
    layouts: dict[str, dict] = {}
    original = capturing._gradient_layouts

    def spy(torch_, net, inputs, loss_fn, autocast_dtype, stacks=()):
        found = original(torch_, net, inputs, loss_fn, autocast_dtype, stacks)
        layouts[mode] = {n: capturing._layout_key(found.get(id(p))) for n, p in net.named_parameters()}
        return found

    cut_calls = []
    cut = capturing._cut_gradient_layouts

    def counted(*args):
        found = cut(*args)
        cut_calls.append(found is not None)          # the cut step ran and its layout had settled
        return found

    monkeypatch.setattr(capturing, "_gradient_layouts", spy)
    monkeypatch.setattr(capturing, "_cut_gradient_layouts", counted)
    mode = "cut"
    fast = capture_model(*_deep(model), tp=2, sequence_parallel=sequence_parallel, tp_plan=plan, allocator_round=1)
    assert cut_calls == [True]
    monkeypatch.setattr(capturing, "_cut_gradient_layouts", lambda *a: None)     # the whole model's step
    mode = "whole"
    whole = capture_model(*_deep(model), tp=2, sequence_parallel=sequence_parallel, tp_plan=plan, allocator_round=1)
    assert layouts["cut"] == layouts["whole"]
    assert len(layouts["whole"]) > 5 * 4 and all(layouts["whole"].values())
    assert dumps_profile(fast) == dumps_profile(whole)
