"""capture --master-weights: bfloat16 parameters, float32 gradients and float32 master copies, no
autocast (Megatron's --bf16, FSDP2's mixed precision). Checked by hand on a two-layer MLP, against a
real step of a Hugging Face Llama written as Megatron runs it and measured by torch's MemTracker,
sharded by ZeRO 1 as the distributed optimizer shards it, and on bad input."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from stagesplit.capturing.profilebuild import peak_bytes  # noqa: E402
from stagesplit.capturing.pytorch import capture_model  # noqa: E402
from stagesplit.cli import main  # noqa: E402
from stagesplit.errors import OptionError  # noqa: E402
from stagesplit.model.analysis import Analysis  # noqa: E402
from stagesplit.model.datasharding import DataLayout, role_bytes, shard_profile  # noqa: E402
from stagesplit.plan.layout_compare import model_size_b  # noqa: E402
from tests.capturing.test_capture import MLP  # noqa: E402  (the two-layer MLP its hand cases price)


def _mlp(**options):
    with torch.device("meta"):
        model = MLP()
    return capture_model(model, torch.empty(32, 8, device="meta"), allocator_round=1, **options)


N0, N1 = 16 * 8 + 16, 4 * 16 + 4          # each layer's parameters (weight and bias)


def test_each_parameter_holds_bf16_weight_fp32_gradient_master_and_adam_state():
    profile = _mlp(master_weights=True)
    step = 4                                               # Adam's step counter, one per parameter tensor
    # bf16 parameter 2 + float32 gradient 4 + float32 master 4 + exp_avg and exp_avg_sq 8
    assert role_bytes(profile) | {"transient": 0} == {
        "unknown": 0, "param": 2 * (N0 + N1), "grad": 4 * (N0 + N1), "state": 12 * (N0 + N1) + 4 * step,
        "buffer": 0, "other": 0, "transient": 0}
    m = Analysis.of(profile).model
    assert m.stage_memory(0, 0).always_live[0] == 18 * N0 + 2 * step          # each layer keeps its own
    assert m.stage_memory(1, 1).always_live[0] == 18 * N1 + 2 * step
    names = [profile.variable_name(v) for v in range(len(profile.variables))]
    assert {n for n in names if n.endswith(".master")} == {f"layers.{i}.{w}.master" for i in (0, 1)
                                                           for w in ("weight", "bias")}
    assert profile.variables.bytes[names.index("layers.0.weight.master")] == 16 * 8 * 4
    assert profile.variables.bytes[names.index("layers.0/aten.addmm:out0")] == 32 * 16 * 2   # bf16 activation
    assert "bfloat16 parameters with float32 gradients and master weights" in profile.info.description
    # SGD keeps one momentum buffer of the master; none keeps the master alone
    for optimizer, per_parameter in (("sgd", 14), ("none", 10)):
        always = _mlp(master_weights=True, optimizer=optimizer)
        v = always.variables
        assert int(v.bytes[v.always_live].sum()) == per_parameter * (N0 + N1)


def test_no_weight_is_cast_per_micro_batch_as_autocast_casts_it():
    """Under autocast every forward casts each float32 weight to bfloat16 and saves the copy for the
    backward: a pipeline stage holds one per micro-batch in flight. With bfloat16 parameters there
    is none."""
    def casts(profile):
        names = [profile.variable_name(v) for v in range(len(profile.variables))]
        return sorted(int(profile.variables.bytes[i]) for i, n in enumerate(names) if "aten._to_copy" in n
                      and n.startswith("layers.") and "/backward/" not in n)
    # each layer's bias and weight, and the first layer's float32 input
    assert casts(_mlp(amp=True)) == sorted([16 * 2, 16 * 8 * 2, 32 * 8 * 2, 4 * 2, 4 * 16 * 2])
    assert casts(_mlp(master_weights=True)) == []


def test_the_distributed_optimizer_shards_the_masters_with_the_state():
    """ZeRO 1 on 2 ranks: the masters and Adam's moments halve, the bf16 parameters and the float32
    gradients stay whole (Megatron's distributed optimizer)."""
    profile = _mlp(master_weights=True)
    rank = shard_profile(profile, Analysis.of(profile).layers, DataLayout(2, 1))
    by_role = role_bytes(rank)
    assert by_role["param"] == 2 * (N0 + N1) and by_role["grad"] == 4 * (N0 + N1)
    assert by_role["state"] == 12 * (N0 + N1) // 2 + 4 * 4            # the step counters stay whole
    assert model_size_b(profile) * 1e9 == pytest.approx(N0 + N1)      # counted from the masters
    assert model_size_b(_mlp(amp=True)) * 1e9 == pytest.approx(N0 + N1)


def _llama():
    import transformers as tf
    config = tf.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    return tf.LlamaForCausalLM(config)


@pytest.mark.filterwarnings("ignore:Expected a tensor or a traceable wrapper-subclass:UserWarning")
def test_a_megatron_style_step_of_a_llama_matches_memtracker_byte_for_byte():
    """The step run for real as Megatron runs it under --bf16 (written here from its documented
    behaviour, not from the capture): the model in bfloat16, a float32 main_grad per parameter that a
    post-accumulate hook adds each gradient into and then drops it, Adam on float32 masters, the
    masters copied back. Measured by MemTracker after a warm-up step; the capture's peak is the
    same number of bytes."""
    pytest.importorskip("transformers")
    model = _llama()
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    predicted = peak_bytes(capture_model(model, {"input_ids": ids, "labels": ids}, master_weights=True,
                                         allocator_round=1))
    from torch.distributed._tools.mem_tracker import MemTracker
    model = model.to(torch.bfloat16)
    params = list(model.parameters())
    main_grads = [torch.zeros_like(p, dtype=torch.float32) for p in params]
    masters = [p.detach().float() for p in params]
    for master, grad in zip(masters, main_grads):
        master.grad = grad

    def accumulate(p, grad):
        grad.add_(p.grad)
        p.grad = None

    for p, grad in zip(params, main_grads):
        p.register_post_accumulate_grad_hook(lambda p, grad=grad: accumulate(p, grad))
    opt = torch.optim.Adam(masters, foreach=False)

    def step():
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        with torch.no_grad():
            for p, master in zip(params, masters):
                p.copy_(master)

    step()
    for grad in main_grads:
        grad.zero_()
    tracker = MemTracker()
    tracker.track_external(model, opt, ids, *main_grads, *masters)     # (it warns of each parameter's None .grad)
    with tracker:
        step()
    measured = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    assert predicted == measured
    assert all(p.dtype == torch.bfloat16 for p in params) and np.isfinite(float(masters[0].sum()))


def test_master_weights_with_amp_is_refused(tmp_path, capsys):
    with pytest.raises(OptionError, match="master_weights: is a precision of its own"):
        _mlp(master_weights=True, amp=True)
    out = tmp_path / "p.stagesplit"
    assert main(["capture", "examples/gpt.py:build", "--master-weights", "--amp", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "master_weights" in err and "without amp" in err and not out.exists()


def test_the_capture_s_precision_reaches_the_exports(capsys, tmp_path):
    """The user's path: a master-weights capture records its precision, the plan carries it, and the
    Megatron export trains it with --bf16 (an amp capture's plan is refused there: Megatron has no autocast)."""
    from stagesplit.io import load_profile
    for option, flags in (("--master-weights", ["--bf16"]), ("--amp", None)):
        profile, plan = tmp_path / "p.stagesplit", tmp_path / "plan.json"
        assert main(["capture", "examples/gpt.py:build", option, "-o", str(profile)]) == 0
        recorded = load_profile(profile).info.precision
        assert (recorded.parameters, recorded.autocast, recorded.master_weights) == \
            (("bfloat16", "", True) if flags else ("float32", "bfloat16", False))
        assert main(["solve", str(profile), "--devices", "2", "--schedule", "1f1b", "--micro-batches", "4",
                     "--out", str(plan)]) == 0
        capsys.readouterr()
        code = main(["export", str(plan), "--to", "megatron"])
        out, err = capsys.readouterr()
        if flags:
            assert code == 0 and "--bf16" in out.split(), err
        else:
            assert code == 2 and "amp (bfloat16 autocast, float32 parameters), which Megatron has no mode for" in err
