"""A capture scaled to another micro-batch size (model/batchscale.py) against captures taken at that
size: a Llama from a config (4 blocks, hidden 64, sequence 32, bfloat16 autocast, Adam) captured
at 1, 2 and 4 sequences, and a float32 stack of linear layers. The FLOPs are exact; each pipeline
rank's peak is over by at most 0.5% (the rule overstates a few per-step constants: the loss, 512-byte
reductions), the step within 2%; the model's state is untouched."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from stagesplit import api
from stagesplit.errors import OptionError
from stagesplit.io.profile import ROLES, Phase
from stagesplit.model.batchscale import per_sample_variables, scale_batch

torch = pytest.importorskip("torch")
tf = pytest.importorskip("transformers")


def _llama(batch: int):
    from stagesplit.capturing.pytorch import capture_model
    cfg = tf.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    with torch.device("meta"):
        model = tf.LlamaForCausalLM(cfg)
    ids = torch.zeros(batch, 32, dtype=torch.long, device="meta")
    return capture_model(model, {"input_ids": ids, "labels": ids}, optimizer="adam", amp=True, dtype="float32",
                         name=f"llama-b{batch}")


@pytest.fixture(scope="module")
def captures():
    return {b: _llama(b) for b in (1, 2, 4)}


@pytest.mark.parametrize("size", [2, 4])
def test_scaled_capture_is_the_capture_at_that_size(captures, size):
    one, real = captures[1], captures[size]
    scaled = scale_batch(one, size)
    ops = real.operations
    assert scaled.operations.compute.sum() == pytest.approx(ops.compute.sum(), rel=1e-12)
    per_step = scaled.operations.phase != Phase.OPTIMIZER
    assert scaled.operations.compute[~per_step].sum() == one.operations.compute[~per_step].sum()
    for role in ("param", "grad", "state", "buffer"):
        k = ROLES.index(role)
        assert scaled.variables.bytes[scaled.variables.role == k].sum() == one.variables.bytes[
            one.variables.role == k].sum()
    for devices in (1, 2):
        want = api.solve(real, devices=devices, target="h100-80gb", schedule="1f1b", micro_batches=4)
        got = api.solve(scaled, devices=devices, target="h100-80gb", schedule="1f1b", micro_batches=4)
        assert got.split_text == want.split_text
        for g, w in zip(got.schedule.ranks, want.schedule.ranks):
            # over, never under, by 0.5% at most: measured +0.13% to +0.19% at 2 sequences, +0.33% to +0.39% at
            # 4 (before the weights' gradients in waiting stopped growing: up to +1.7%)
            assert w.peak_bytes <= g.peak_bytes <= w.peak_bytes * 1.005
        # the step within 2%: measured -1.0% at 2 sequences, -1.8% / -1.9% at 4 (the sums and divisions of the
        # norms' backward move more than the rule grows them). Before, the weights' gradients in waiting grew
        # with the batch and put it +2.1% to +4.7% over
        assert abs(got.schedule.step_time / want.schedule.step_time - 1) <= 0.02


def test_what_grows_with_the_batch_by_hand(captures):
    """The inputs grow; the bfloat16 copies of the weights (made from parameters alone), the
    weights' gradients before their accumulation and the optimizer's temporaries do not."""
    one = captures[1]
    grows = per_sample_variables(one)
    names = [one.names[i] if i >= 0 else "" for i in one.variables.name]
    assert all(grows[i] for i, n in enumerate(names) if n.startswith("input["))
    role = np.asarray(one.variables.role)
    assert not grows[role == ROLES.index("param")].any() and not grows[role == ROLES.index("state")].any()
    # parameters' bfloat16 casts: made by a _to_copy of a parameter, in the forward
    ops = one.operations
    casts = [int(x) for o in range(len(ops)) if ops.phase[o] == Phase.FORWARD and "_to_copy" in ops.name[o]
             for x in ops.vars[o] if role[x] == ROLES.index("other")
             and any(role[y] == ROLES.index("param") for y in ops.vars[o])]
    assert casts and not grows[casts].any()


def test_a_float32_linear_stack_scaled_is_its_capture_at_that_size():
    """Without autocast a linear layer's backward transposes its weight's gradient (a view) before
    adding it into ``.grad``: the view decides nothing, so the gradient in waiting keeps its bytes
    (it was doubled with the batch before). Four Linear(256, 256) captured at 16 rows, scaled to 32:
    each rank's peak on 1 and 2 devices is the capture at 32's, to the bytes of the scalar loss and
    its seed gradient that the rule grows with the rest."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from linear_stack import linear_stack
    sixteen, real = linear_stack(batch=16, width=256), linear_stack(batch=32, width=256)
    grows = per_sample_variables(sixteen)
    v = sixteen.variables
    weight_shaped = [i for i in range(len(v)) if v.role[i] == ROLES.index("other") and v.bytes[i] == 256 * 256 * 4
                     and "/backward/" in sixteen.variable_name(i)]
    assert len(weight_shaped) == 4 and not grows[weight_shaped].any()         # one gradient in waiting per layer
    assert grows[[i for i in range(len(v)) if sixteen.variable_name(i).startswith("input[")]].all()
    scaled = scale_batch(sixteen, 2)
    for devices in (1, 2):
        want = api.solve(real, devices=devices, target="h100-80gb", schedule="1f1b", micro_batches=4)
        got = api.solve(scaled, devices=devices, target="h100-80gb", schedule="1f1b", micro_batches=4)
        assert got.split_text == want.split_text
        for g, w in zip(got.schedule.ranks, want.schedule.ranks):
            assert w.peak_bytes <= g.peak_bytes <= w.peak_bytes + 16


def test_ratio_one_is_the_profile_and_a_profile_without_roles_is_refused(captures):
    one = captures[1]
    assert scale_batch(one, 1) is one
    half = scale_batch(captures[2], Fraction(1, 2))
    assert half.operations.compute.sum() == pytest.approx(one.operations.compute.sum(), rel=1e-12)
    from dataclasses import replace
    bare = replace(one, variables=replace(one.variables, role=None))
    with pytest.raises(OptionError) as excinfo:
        scale_batch(bare, 2)
    assert excinfo.value.parameter == "profile" and "roles" in str(excinfo.value)


def test_every_collective_keeps_its_mesh_dimension_and_grows_with_the_batch(captures):
    """Tensor parallelism's all-reduces, context parallelism's key/value exchange and expert
    parallelism's all-to-alls all move per-sample bytes: x r in the forward and backward, each
    still on its own mesh dimension (a context-parallel exchange must stay overlapped with the
    attention, not become a tensor-parallel collective on the critical path); the optimizer's stay."""
    from dataclasses import replace

    from stagesplit.io.profile import Collective, ParallelLayout
    one = captures[1]
    collectives = (Collective(0, "all_reduce", 1000, 2, "forward", "tp"),
                   Collective(1, "all_gather_into_tensor", 2048, 4, "backward", "cp"),
                   Collective(2, "all_to_all_single", 512, 2, "forward", "ep"),
                   Collective(3, "all_reduce", 4096, 2, "optimizer", "tp"))
    rank = replace(one, info=replace(one.info, parallel_layout=ParallelLayout(collectives=collectives)))
    scaled = scale_batch(rank, 3).info.parallel_layout.collectives
    assert [(c.step, c.kind, c.bytes, c.group_size, c.phase, c.group) for c in scaled] == [
        (0, "all_reduce", 3000, 2, "forward", "tp"), (1, "all_gather_into_tensor", 6144, 4, "backward", "cp"),
        (2, "all_to_all_single", 1536, 2, "forward", "ep"), (3, "all_reduce", 4096, 2, "optimizer", "tp")]
