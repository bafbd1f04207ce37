"""The layout search with expert parallelism: expert-parallel ranks taken from the dp x cp ranks (as
Megatron carves its expert groups), inside a node unless fixed, under ZeRO 0; the all-to-alls priced
on every MoE layer's critical path; each by hand, and the bad inputs in one line."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from stagesplit import api
from stagesplit.errors import OptionError
from stagesplit.io.topology import node_of
from stagesplit.model.communication import all_reduce

torch = pytest.importorskip("torch")

from linear_stack import linear_stack  # noqa: E402

H100 = node_of("h100-80gb")


#: the oracles here simulate 1F1B (conftest.py's ``search_under_1f1b``)
pytestmark = pytest.mark.usefixtures("search_under_1f1b")


@pytest.fixture(scope="module")
def stack():
    return linear_stack()


def _ep_rank(profile, ep: int, collectives=()):
    from stagesplit.io.profile import ParallelLayout
    rank = replace(profile)
    rank.info = replace(profile.info, parallel_layout=ParallelLayout(collectives=tuple(collectives),
                                                                     expert_parallel=ep,
                                                                     experts=(("0.experts", 8),)))
    return rank


def test_the_combinations_by_hand():
    """8 GPUs of 8 per node, ranks at EP 1 and EP 2, global batch 32 in micro-batches of 2: EP 2 runs
    where it divides dp (no context parallelism here), so not with 8 stages (dp 1), under ZeRO 0 only;
    EP 8 of a node of 4 is left out unless fixed."""
    from stagesplit.io.targets import load_target
    from stagesplit.plan.layouts import Layout, LayoutRequest, enumerate_layouts, key_of
    req = LayoutRequest(gpus=8, global_batch=32, target=load_target("h100-80gb"), node=H100, micro_batch_size=2)
    got = [lay for lay in enumerate_layouts(req, [1, (1, 1, 2)], layers=8) if lay.ep > 1]
    assert got == [Layout(1, pp, 8 // pp, 0, 32 // (2 * (8 // pp)), 1, 2, micro_batch_size=2) for pp in (1, 2, 4)]
    assert key_of(got[0]) == (1, 1, 2)
    four = replace(req, node=replace(H100, gpus_per_node=4))
    assert [lay for lay in enumerate_layouts(four, [1, (1, 1, 8)], 8) if lay.ep > 1] == []
    assert {lay.ep for lay in enumerate_layouts(replace(four, ep=8), [1, (1, 1, 8)], 8)} == {8}
    assert Layout(1, 1, 4, 0, 4, 1, 2).describe() == "TP 1 x PP 1 x DP 4 (EP 2 of the DP x CP ranks), ZeRO 0, " \
                                                     "4 micro-batches of 1"


def test_an_ep_rank_in_the_search_by_hand(stack):
    """An EP 2 rank recording one 1 MB all-to-all per layer and pass on 2 GPUs, EP fixed: 2
    data-parallel ranks whose expert groups are the 2 of them (inside the node: 1 latency step, half
    the bytes over the link). Its step is the pipeline's plus the all-to-alls' share of the rank's
    compute (not overlapped), plus DDP's all-reduce of the gradients over the 2 ranks."""
    from stagesplit.io.profile import Collective, Phase
    ops = stack.operations
    steps = [int(i) for i in np.flatnonzero(ops.phase == Phase.FORWARD)][:4]
    steps += [int(i) for i in np.flatnonzero(ops.phase == Phase.BACKWARD_INPUT)][:4]
    coll = [Collective(i, "all_to_all_single", 10**6, 2, "forward" if k < 4 else "backward", "ep")
            for k, i in enumerate(steps)]
    rank = _ep_rank(stack, 2, coll)
    lp = api.layouts(stack, ep_profiles={2: rank}, target="h100-80gb", gpus=2, global_batch=16, micro_batch_size=8,
                     ep=2)
    b = lp.best
    assert (b.layout.ep, b.layout.dp, b.layout.pp, b.layout.zero) == (2, 2, 1, 0)
    assert lp.plan.profile.expert_parallel == 2
    from stagesplit.reporting.summary import layout_lines
    assert layout_lines(lp.plan)[0] == ("expert parallel: each rank holds 1/2 of the routed experts (composed from "
                                        "rules); the 2 expert-parallel ranks are taken from the data-parallel ones")
    one = api.solve(rank, devices=1, target="h100-80gb", schedule="1f1b", micro_batches=1)
    compute = sum(f + bb + w for f, bb, w in one.schedule.chunk_times)
    a = H100.intra
    per_mb = 8 * (a.latency_s + 10**6 / 2 / a.bytes_per_s)
    assert b.pipeline_s == pytest.approx(one.schedule.step_time)
    assert b.ep_comm_s == pytest.approx(one.schedule.step_time * per_mb / compute)
    grads = 4 * (64 * 64 + 64) * 4
    # DDP: the all-reduce, and its bucket copies (into the bucket and back: 4 x the bytes at 3.35 TB/s)
    assert b.dp_comm_s == pytest.approx(all_reduce(grads, 2, a.bytes_per_s, a.latency_s) + 4 * grads / 3.35e12,
                                        rel=1e-6)
    assert b.step_s == pytest.approx(b.pipeline_s + b.ep_comm_s + b.dp_comm_s)
    from stagesplit.plan.layouts import seconds
    from stagesplit.reporting.layouts import layouts_text
    text = layouts_text(lp)
    assert f"expert-parallel all-to-all {seconds(b.ep_comm_s)}, data-parallel" in text
    assert " tp  ep  pp   dp zero     M status" in text


@pytest.mark.parametrize("kw, option, text", [
    (dict(ep=3), "ep", "ep 3 does not divide 8 GPUs"),
    (dict(ep=4), "ep", "no profile of expert-parallel degree 4 was given (degrees: 1, 2: capture a rank at that "
                       "degree)"),
    (dict(ep=2, zero=3), "ep", "expert parallelism is laid out under ZeRO 0 only"),
])
def test_bad_input_is_one_line_naming_the_option(stack, kw, option, text):
    with pytest.raises(OptionError) as caught:
        api.layouts(stack, ep_profiles={2: _ep_rank(stack, 2)}, target="h100-80gb", gpus=8, global_batch=8, **kw)
    assert caught.value.parameter == option and text in str(caught.value) and "\n" not in str(caught.value)


def test_a_profile_of_another_degree_is_refused(stack):
    with pytest.raises(OptionError) as caught:
        api.layouts(stack, ep_profiles={4: _ep_rank(stack, 2)}, target="h100-80gb", gpus=8, global_batch=8)
    assert caught.value.parameter == "ep_profiles" and "is not one rank of expert-parallel degree 4" in str(caught.value)


def test_command_line(stack, tmp_path, capsys):
    from stagesplit.cli import main
    from stagesplit.io import save_profile
    one, two = tmp_path / "one.stagesplit", tmp_path / "two.stagesplit"
    save_profile(stack, one)
    save_profile(_ep_rank(stack, 2), two)
    assert main(["layouts", str(one), "--ep-profile", f"2={two}", "--gpus", "8", "--global-batch", "8",
                 "--target", "h100-80gb", "--ep", "3"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == "stagesplit: error: --ep: ep 3 does not divide 8 GPUs"
    assert main(["layouts", str(one), "--ep-profile", f"2={two}", "--gpus", "2", "--global-batch", "16",
                 "--micro-batch-size", "8", "--target", "h100-80gb", "--ep", "2"]) == 0
    assert "(EP 2 of the DP x CP ranks)" in capsys.readouterr().out
