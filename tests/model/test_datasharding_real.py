"""The decisive test of the data-parallel layouts: real processes, measured per rank.

The example GPT (examples/gpt.py, small) and a Hugging Face Llama from a config run for real on
two gloo processes on the CPU, under DDP and under FSDP2 (``fully_shard`` per layer, reshard after
forward on and off), one Adam step each (tests/dataparallel_harness.py). Each rank's peak, counted
by torch's own ``MemTracker`` (DDP) and ``FSDPMemTracker`` (FSDP2), is compared with stagesplit's
prediction for that rank: the model captured under fake tensors (exact bytes: the CPU allocator
does not round), sharded by model/datasharding.py, priced as one stage. Measured on torch 2.13:
every case within 4 bytes of the prediction (0.00%). The loss is the unparallelised model's.

The second oracle: the same trackers on one process under torch's fake process group (its
collectives return at once, every buffer is allocated as on a real rank), which is how
``FSDPMemTracker`` is meant to be run; it measures what the real ranks measure, byte for byte.
"""

from __future__ import annotations

import functools

import pytest

from dataparallel_harness import (
    DataParallelCase,
    run_data_parallel,
    run_fake_process_group,
    single_process_loss,
    tiny_gpt,
    tiny_llama,
)
from stagesplit.model.analysis import Analysis
from stagesplit.model.datasharding import DataLayout

pytest.importorskip("torch")

TOLERANCE = 0.03                 # the bound; the goal is 1%, measured 0.00%
CASES = [("ddp", 0, True), ("fsdp", 3, True), ("fsdp", 3, False)]


def _predicted(build, layout: DataLayout, **capture) -> tuple[int, tuple[str | None, ...]]:
    from stagesplit.capturing.pytorch import capture_model
    model, inputs, loss = build("meta")
    profile = capture_model(model, inputs, loss, allocator_round=1, name="dp", **capture)
    analysis = Analysis.of(profile, layout=layout)
    last = analysis.layers.num_layers - 1
    return analysis.model.stage_memory(0, last).worst_bytes(), tuple(analysis.layers.module_paths)


@pytest.mark.slow
@pytest.mark.parametrize("build", [tiny_gpt, tiny_llama], ids=["gpt", "llama"])
@pytest.mark.parametrize("mode, zero, reshard", CASES, ids=["ddp", "fsdp2-reshard", "fsdp2-no-reshard"])
def test_each_rank_peak_matches_the_prediction(build, mode, zero, reshard):
    predicted, groups = _predicted(build, DataLayout(2, zero, reshard))
    assert all(groups)                       # one FSDP group per layer, each a module of the model
    ranks = run_data_parallel(DataParallelCase(functools.partial(build, "cpu"), mode, reshard, groups), devices=2)
    reference = single_process_loss(functools.partial(build, "cpu"))
    for rank in ranks:
        measured = rank["peak"]
        error = (predicted - measured) / measured
        assert abs(error) <= TOLERANCE, (rank["categories"], predicted, measured, f"{error:+.2%}")
        # exact on an idle machine (0.00% on torch 2.13); on a loaded one a rank sometimes still holds a
        # collective's buffers that gloo's own thread has not yet let go of (-2.89% seen), never fewer bytes
        assert error <= 1e-4, f"measured {error:+.4%} (was 0.00% on torch 2.13)"
        assert rank["loss"] == pytest.approx(reference, rel=1e-6, abs=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("build", [tiny_gpt, tiny_llama], ids=["gpt", "llama"])
@pytest.mark.parametrize("mode, zero, reshard", CASES[1:], ids=["fsdp2-reshard", "fsdp2-no-reshard"])
def test_fake_process_group_oracle_matches_the_prediction(build, mode, zero, reshard):
    predicted, groups = _predicted(build, DataLayout(2, zero, reshard))
    rank = run_fake_process_group(DataParallelCase(functools.partial(build, "cpu"), mode, reshard, groups), 2)
    assert abs(predicted - rank["peak"]) <= 4, (rank["categories"], predicted)


@pytest.mark.slow
@pytest.mark.parametrize("build", [tiny_gpt, tiny_llama], ids=["gpt", "llama"])
@pytest.mark.parametrize("reshard", [True, False], ids=["reshard", "no-reshard"])
def test_fake_process_group_three_and_four_ranks(build, reshard):
    """Four ranks divide every first dimension: exact. Three do not (widths of 64): FSDP2 pads each
    parameter to ceil(rows / 3) rows per rank, the rule takes ceil(bytes / 3) (the profile has no
    shapes), and the prediction is short by the padding: -0.85% to -1.12% measured on torch 2.13."""
    for ranks, low, high in ((4, -1e-5, 1e-5), (3, -0.015, -0.005)):
        predicted, groups = _predicted(build, DataLayout(ranks, 3, reshard))
        rank = run_fake_process_group(DataParallelCase(functools.partial(build, "cpu"), "fsdp", reshard, groups), ranks)
        error = (predicted - rank["peak"]) / rank["peak"]
        assert low <= error <= high, (ranks, predicted, rank["peak"], f"{error:+.3%}")


def test_ddp_does_not_run_under_the_fake_process_group():
    """DDP's reducer wants the all-reduce's future to hold the bucket; the fake process group's
    holds None, and torch stops in the backward (so DDP is checked on real processes only)."""
    _, groups = _predicted(tiny_gpt, DataLayout(2, 0))
    case = DataParallelCase(functools.partial(tiny_gpt, "cpu"), "ddp", True, groups)
    with pytest.raises(RuntimeError, match="expected the hook result is either a Tensor or a TensorList found None"):
        run_fake_process_group(case, 2)


@pytest.mark.slow
def test_ddp_adds_one_gradient_copy_and_fsdp2_categories_agree():
    """What the agreement above is made of, by category: DDP's buckets are one more copy of the
    gradients; under FSDP2 each rank holds half the parameters, gradients and optimizer state."""
    from stagesplit.capturing.pytorch import capture_model
    from stagesplit.model.datasharding import role_bytes
    model, inputs, loss = tiny_gpt("meta")
    profile = capture_model(model, inputs, loss, allocator_round=1, name="gpt")
    one = Analysis.of(profile)
    single = one.model.stage_memory(0, one.layers.num_layers - 1).worst_bytes()
    roles = role_bytes(profile)
    ddp, _ = _predicted(tiny_gpt, DataLayout(2, 0))
    assert ddp == single + roles["grad"]
    groups = tuple(one.layers.module_paths)
    rank = run_data_parallel(DataParallelCase(functools.partial(tiny_gpt, "cpu"), "fsdp", True, groups), 2)[0]
    cats = rank["categories"]["cpu"]
    assert cats["Sharded Param"] == roles["param"] // 2
    assert cats["Sharded Grad"] == roles["grad"] // 2
    steps = 4 * sum(1 for name in profile.names if name.endswith(".step"))
    assert cats["OptState"] == (roles["state"] - steps) // 2 + steps


@pytest.mark.slow
@pytest.mark.parametrize("build, reshard, high", [(tiny_gpt, True, 1e-5), (tiny_gpt, False, 0.006),
                                                  (tiny_llama, True, 1e-5), (tiny_llama, False, 1e-5)],
                         ids=["gpt-reshard", "gpt-no-reshard", "llama-reshard", "llama-no-reshard"])
def test_fsdp2_mixed_precision_is_a_master_weights_capture_under_zero_3(build, reshard, high):
    """FSDP2's mixed precision (``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``,
    torchtitan's default) against a master-weights capture under ZeRO 3: its float32 shard is the
    master, so a parameter with a master keeps no bfloat16 shard, and a group's unsharded gradients
    are in the parameters' dtype, cast to float32 for the reduce-scatter (model/datasharding.py).
    Measured on torch 2.13 by FSDPMemTracker under the fake process group: GPT +0.00% and +0.52%,
    Llama 32 bytes under (-0.002%) both ways (reshard after forward on and off). With the bfloat16 shard
    counted it was +7.3% to +11.8%; with the gradients in float32 until the reduce-scatter, up to +4.9%."""
    predicted, groups = _predicted(build, DataLayout(2, 3, reshard), master_weights=True)
    rank = run_fake_process_group(DataParallelCase(functools.partial(build, "cpu"), "fsdp", reshard, groups,
                                                   mixed_precision=True), 2)
    error = (predicted - rank["peak"]) / rank["peak"]
    assert -1e-4 <= error <= high, (rank["categories"], predicted, rank["peak"], f"{error:+.3%}")
