"""The data-parallel communication of a layout is each stage's own (plan/layouts.py's ``step_of``):
stages hold different parameter bytes, and the step waits for the stage that synchronises last. A
hand case: four Linear layers of different widths on 2 stages x 2 data-parallel ranks in one node."""

from __future__ import annotations

import pytest

from stagesplit import api
from stagesplit.io.topology import node_of
from stagesplit.model.communication import all_gather, all_reduce, reduce_scatter

torch = pytest.importorskip("torch")

H100 = node_of("h100-80gb")
WIDTHS = (64, 256, 64, 32, 32)          # Linear(64, 256), Linear(256, 64), Linear(64, 32), Linear(32, 32)


#: the oracles here simulate 1F1B (conftest.py's ``search_under_1f1b``)
pytestmark = pytest.mark.usefixtures("search_under_1f1b")


def _params(k: int) -> int:
    """Layer k's parameter bytes in float32: weight and bias."""
    return (WIDTHS[k] * WIDTHS[k + 1] + WIDTHS[k + 1]) * 4


@pytest.fixture(scope="module")
def stack():
    from stagesplit.capturing.pytorch import capture_model
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTHS[k], WIDTHS[k + 1]) for k in range(4)])
    return capture_model(model, torch.empty(8, 64, device="meta"), allocator_round=1, name="widths")


@pytest.mark.parametrize("zero", [0, 1])
def test_each_stage_synchronises_its_own_parameters_and_the_last_sets_the_step(stack, zero):
    lp = api.layouts(stack, gpus=4, global_batch=32, micro_batch_size=8, target="h100-80gb", tp=1, pp=2, dp=2,
                     zero=zero, time_limit=30)
    best = lp.best
    assert best is not None and best.layout == type(best.layout)(1, 2, 2, zero, 2, micro_batch_size=8)
    plan = lp.plan
    link = H100.intra                                    # 2 ranks 1 apart: inside the node
    per_stage = []
    for st in plan.stages:
        p = sum(_params(k) for k in range(st.first_layer, st.last_layer + 1))
        # every stage's bytes are under DDP's first bucket (1 MiB): the one bucket is the last, so nothing
        # is hidden under the backward, and DDP's reducer copies every gradient into it and back (4 x the
        # bytes at the H100's 3.35 TB/s); ZeRO 1 reduce-scatters it, then all-gathers the updated parameters
        if zero == 0:
            per_stage.append(all_reduce(p, 2, link.bytes_per_s, link.latency_s) + 4 * p / 3.35e12)
        else:
            per_stage.append(reduce_scatter(p, 2, link.bytes_per_s, link.latency_s)
                             + all_gather(p, 2, link.bytes_per_s, link.latency_s))
    stage_bytes = [sum(_params(k) for k in range(s.first_layer, s.last_layer + 1)) for s in plan.stages]
    assert stage_bytes[0] != stage_bytes[1]              # the stages hold different parameter bytes
    assert best.dp_comm_s == pytest.approx(max(per_stage))
    assert best.step_s == pytest.approx(best.pipeline_s + max(per_stage))
    # the sum of both stages' communication is not what is added: only the slower stage's
    assert best.dp_comm_s < sum(per_stage)


def test_more_data_parallel_ranks_than_a_pipeline_has_devices_are_laid_out(stack):
    """2,048 data-parallel ranks (twice the devices a pipeline takes): a rank's figures are shares, so
    the layout is solved, and ZeRO 1's reduce-scatter and all-gather of every parameter byte run on a
    ring of 2,048 ranks across nodes (the network's link)."""
    from stagesplit.common.limits import MAX_DEVICES
    dp = 2 * MAX_DEVICES
    lp = api.layouts(stack, gpus=dp, global_batch=dp, micro_batch_size=1, captured_batch=8, target="h100-80gb",
                     pp=1, zero=1, time_limit=30)
    best = lp.best
    assert best is not None and best.layout == type(best.layout)(1, 1, dp, 1, 1, micro_batch_size=1)
    total = sum(_params(k) for k in range(4))            # 144,896 bytes: under DDP's first bucket, nothing hidden
    link = H100.inter
    assert best.dp_comm_s == pytest.approx(reduce_scatter(total, dp, link.bytes_per_s, link.latency_s)
                                           + all_gather(total, dp, link.bytes_per_s, link.latency_s))
    half = api.layouts(stack, gpus=dp // 2, global_batch=dp // 2, micro_batch_size=1, captured_batch=8,
                       target="h100-80gb", pp=1, zero=1, time_limit=30).best
    assert half is not None and best.rank_peaks[0] < half.rank_peaks[0]     # the optimizer state halved again


def test_a_schedule_torch_refuses_is_refused_before_its_preparation_in_the_engines_words(stack):
    """4 stages of one micro-batch under 1F1B: refused unsolved, with the words solve itself uses."""
    from stagesplit.errors import StagesplitError
    lp = api.layouts(stack, gpus=4, global_batch=8, micro_batch_size=8, target="h100-80gb", pp=4, time_limit=30)
    (row,) = lp.rows
    assert row.status == "refused" and row.proven and row.layout.micro_batches == 1
    with pytest.raises(StagesplitError) as excinfo:
        api.solve(stack, devices=4, target="h100-80gb", schedule="1f1b", micro_batches=1)
    assert row.reason == str(excinfo.value)


def test_more_chunks_than_layers_is_refused_before_its_preparation_in_the_engines_words(stack, monkeypatch):
    """Interleaved 1F1B runs 2 chunks on each of 4 stages: 8 chunks for the 4 layers. Refused
    unsolved (the preparation of a combination takes seconds on a large model: the engine is not
    asked to resolve it), with the words solve itself uses."""
    from stagesplit.errors import StagesplitError
    from stagesplit.plan import engine

    def prepared(*args, **kwargs):
        raise AssertionError("the combination was prepared before it was refused")
    with monkeypatch.context() as patch:
        patch.setattr(engine, "resolve", prepared)
        lp = api.layouts(stack, gpus=4, global_batch=32, micro_batch_size=8, target="h100-80gb", pp=4,
                         schedule="interleaved-1f1b", time_limit=30)
    (row,) = lp.rows
    assert row.status == "refused" and row.proven and row.layout.micro_batches == 4
    with pytest.raises(StagesplitError) as excinfo:
        api.solve(stack, devices=4, target="h100-80gb", schedule="interleaved-1f1b", micro_batches=4)
    assert row.reason == str(excinfo.value)
    assert row.reason == ("interleaved-1f1b with 2 chunks on each of 4 devices needs 8 chunks, but the model has 4 "
                          "layers: use fewer devices or chunks")
