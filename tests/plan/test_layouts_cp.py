"""The layout search with context parallelism: tp x cp x pp x dp = G, the ring exchange priced
with its overlap, the gradients shared over dp x cp ranks, a rank's profile per CP degree; each
by hand, and the bad inputs in one line."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

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


def _cp_rank(profile, cp: int, collectives=()):
    """``profile`` as if captured at context-parallel degree ``cp`` with ``collectives``."""
    from stagesplit.io.profile import ParallelLayout
    rank = replace(profile)
    rank.info = replace(profile.info, parallel_layout=ParallelLayout(collectives=tuple(collectives),
                                                                     context_parallel=cp, cp_load_balanced=True))
    return rank


def test_the_combinations_by_hand():
    """8 GPUs, ranks at (TP 1, CP 1) and (TP 1, CP 2), global batch 32 in micro-batches of 2: tp x cp
    x pp x dp = 8; the micro-batches are B / (2 x dp) (context-parallel ranks share samples); ZeRO 1
    to 3 wherever dp x cp > 1, so CP 2 with one data-parallel rank may shard."""
    from stagesplit.io.targets import load_target
    from stagesplit.plan.layouts import Layout, LayoutRequest, enumerate_layouts
    req = LayoutRequest(gpus=8, global_batch=32, target=load_target("h100-80gb"), node=H100, micro_batch_size=2)
    got = enumerate_layouts(req, [1, (1, 2)], layers=8)
    want = [Layout(1, pp, 8 // pp, z, 32 // (2 * (8 // pp)), 1, micro_batch_size=2) for pp in (1, 2, 4, 8)
            for z in ((0, 1, 2, 3) if 8 // pp > 1 else (0,))]
    want += [Layout(1, pp, 4 // pp, z, 32 // (2 * (4 // pp)), 2, micro_batch_size=2)
             for pp in (1, 2, 4) for z in (0, 1, 2, 3)]
    assert sorted(got) == sorted(want)
    assert all(lay.tp * lay.cp * lay.pp * lay.dp == 8 for lay in got)
    assert {lay.cp for lay in enumerate_layouts(replace(req, cp=2), [1, (1, 2)], 8)} == {2}
    assert Layout(1, 4, 1, 3, 16, 2).sync == 2
    assert Layout(2, 1, 2, 0, 8, 2).describe() == "TP 2 x CP 2 x PP 1 x DP 2, ZeRO 0, 8 micro-batches of 1"
    assert Layout(2, 1, 2, 0, 8).describe() == "TP 2 x PP 1 x DP 2, ZeRO 0, 8 micro-batches of 1"


def test_the_ring_exchange_hides_under_the_attention_by_hand():
    """Two 1 MB all-gathers of K and V on a ring of 2 (inside a node: 1 latency step, half the
    bytes over the link) and attention kernels of A FLOPs at the H100's peak: exposed max(0, comm -
    A / peak). The optimizer's collectives and TP's are not CP's."""
    from stagesplit.io.profile import Phase
    from stagesplit.io.targets import load_target
    from stagesplit.plan.layouts import cp_seconds
    h100 = load_target("h100-80gb")
    a = H100.intra
    comm = 2 * (a.latency_s + 10**6 / 2 / a.bytes_per_s)
    coll = [SimpleNamespace(kind="all_gather_into_tensor", bytes=10**6, group_size=2, phase=p, group="cp")
            for p in ("forward", "backward")]
    coll += [SimpleNamespace(kind="all_reduce", bytes=10**9, group_size=2, phase="forward", group="tp")]
    for attention_s in (comm / 4, 2 * comm):
        flops = attention_s * h100.flops_per_s
        names = ["attn/aten._scaled_dot_product_flash_attention", "attn/backward/aten._scaled_dot_product_"
                 "flash_attention_backward", "mlp/aten.mm"]
        ops = SimpleNamespace(phase=np.array([Phase.FORWARD, Phase.BACKWARD_INPUT, Phase.FORWARD]),
                              compute=np.array([flops / 2, flops / 2, 1e12]), name=names)
        layout = SimpleNamespace(collectives=coll, context_parallel=2, tensor_parallel=1)
        profile = SimpleNamespace(info=SimpleNamespace(parallel_layout=layout), operations=ops,
                                  compute_unit="flops")
        got = cp_seconds(SimpleNamespace(profile=profile, source=None), H100, h100)
        assert got == pytest.approx((comm, attention_s, max(0.0, comm - attention_s)))


def test_a_cp_rank_in_the_search_by_hand(stack):
    """A CP 2 rank (here the stack itself, recording one 1 MB all-gather per layer and pass on the
    CP group, no attention to hide under) on 2 GPUs, fixed to CP 2: its step is the pipeline's plus
    the exchange's share of the rank's compute, plus the gradients' all-reduce over the 2 ranks that
    share them (DDP: its last bucket, the whole 4 layers' gradients, exposed after the backward)."""
    from stagesplit.io.profile import Collective, Phase
    ops = stack.operations
    steps = [int(i) for i in np.flatnonzero(ops.phase == Phase.FORWARD)][:4]
    steps += [int(i) for i in np.flatnonzero(ops.phase == Phase.BACKWARD_INPUT)][:4]
    coll = [Collective(i, "all_gather_into_tensor", 10**6, 2, "forward" if k < 4 else "backward", "cp")
            for k, i in enumerate(steps)]
    rank = _cp_rank(stack, 2, coll)
    lp = api.layouts(stack, cp_profiles={2: rank}, target="h100-80gb", gpus=2, global_batch=8, micro_batch_size=8,
                     cp=2, zero=0)
    b = lp.best
    assert (b.layout.cp, b.layout.dp, b.layout.pp) == (2, 1, 1)
    # the plan says its rank is one of 2 context-parallel ranks, its gradients shared over dp x cp = 2
    assert (lp.plan.profile.context_parallel, lp.plan.inputs.request.dp) == (2, 2)
    from stagesplit.reporting.summary import layout_lines
    assert layout_lines(lp.plan)[0] == (
        "context parallel: the profile is one of 2 context-parallel ranks (each holds 1/2 of every sequence, "
        "attention as torch's ring); the data-parallel ranks are data x context parallel (the gradients are shared "
        "over both)")
    assert layout_lines(lp.plan)[1].startswith("data parallel: 2 data-parallel ranks")
    one = api.solve(rank, devices=1, target="h100-80gb", schedule="1f1b", micro_batches=1)
    compute = sum(f + bb + w for f, bb, w in one.schedule.chunk_times)
    a = H100.intra
    per_mb = 8 * (a.latency_s + 10**6 / 2 / a.bytes_per_s)
    assert b.pipeline_s == pytest.approx(one.schedule.step_time)
    assert b.cp_comm_s == pytest.approx(one.schedule.step_time * per_mb / compute)
    assert b.tp_comm_s == 0.0
    grads = 4 * (64 * 64 + 64) * 4
    # DDP: the all-reduce, and its bucket copies (into the bucket and back: 4 x the bytes at 3.35 TB/s)
    assert b.dp_comm_s == pytest.approx(all_reduce(grads, 2, a.bytes_per_s, a.latency_s) + 4 * grads / 3.35e12,
                                        rel=1e-6)
    assert b.step_s == pytest.approx(b.pipeline_s + b.cp_comm_s + b.dp_comm_s)
    from stagesplit.plan.layouts import seconds
    from stagesplit.reporting.layouts import layouts_json, layouts_text
    text = layouts_text(lp)
    assert f"context-parallel exchange exposed {seconds(b.cp_comm_s)}, data-parallel" in text
    assert " tp  cp  pp   dp zero     M status" in text
    assert f"  1   2   1    1    0     1 best     {seconds(b.step_s):>10}    8  fastest that fits" in text
    rows = layouts_json(lp)["rows"]
    assert [(r["cp"], r["cp_comm_s"]) for r in rows if r["status"] == "best"] == [(2, b.cp_comm_s)]


@pytest.mark.parametrize("kw, option, text", [
    (dict(cp=3), "cp", "cp 3 does not divide 8 GPUs"),
    (dict(cp=4), "cp", "no profile of context-parallel degree 4 was given (degrees: 1, 2: capture a rank at "
                       "that degree)"),
    (dict(cp_profiles={4: "rank2"}), "cp_profiles", "is not one rank of context-parallel degree 4 (capture it "
                                                    "with cp=4)"),
])
def test_bad_input_is_one_line_naming_the_option(stack, kw, option, text):
    rank = _cp_rank(stack, 2)
    profiles = {4: rank} if "cp_profiles" in kw else {2: rank}
    kw = {k: v for k, v in kw.items() if k != "cp_profiles"}
    with pytest.raises(OptionError) as caught:
        api.layouts(stack, cp_profiles=profiles, target="h100-80gb", gpus=8, global_batch=8, **kw)
    assert caught.value.parameter == option and text in str(caught.value) and "\n" not in str(caught.value)


def test_a_cp_rank_given_as_a_tp_profile_is_refused(stack):
    with pytest.raises(OptionError) as caught:
        api.layouts(_cp_rank(stack, 2), target="h100-80gb", gpus=2, global_batch=8, micro_batch_size=8)
    assert caught.value.parameter == "profile" and "of context-parallel degree 2" in str(caught.value)


def test_command_line_refusals_exit_2(stack, tmp_path, capsys):
    from stagesplit.cli import main
    from stagesplit.io import save_profile
    one, two = tmp_path / "one.stagesplit", tmp_path / "two.stagesplit"
    save_profile(stack, one)
    save_profile(_cp_rank(stack, 2), two)
    assert main(["layouts", str(one), "--cp-profile", f"2={two}", "--gpus", "8", "--global-batch", "8",
                 "--target", "h100-80gb", "--cp", "3"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == "stagesplit: error: --cp: cp 3 does not divide 8 GPUs"
    assert main(["layouts", str(one), "--cp-profile", f"x={two}", "--gpus", "8", "--global-batch", "8",
                 "--target", "h100-80gb"]) == 2
    assert "--cp-profile: expected C=FILE" in capsys.readouterr().err
    assert main(["layouts", str(one), "--cp-profile", f"2={two}", "--gpus", "2", "--global-batch", "8",
                 "--micro-batch-size", "8", "--target", "h100-80gb", "--cp", "2", "--zero", "0"]) == 0
    out = capsys.readouterr().out
    assert "TP 1 x CP 2 x PP 1 x DP 1" in out


@pytest.mark.slow
def test_a_captured_cp_rank_end_to_end():
    """capture --cp 2 of the tests' Llama (2 blocks, batch 2 x 32) given to the search: its recorded ring
    collectives priced on the node's links against its flash attention's FLOPs (cp_seconds), the CP 2
    rows lengthened by that exposure (a row per combination of 2 GPUs, CP 1 and 2)."""
    pytest.importorskip("transformers", reason="the Llama case builds a Hugging Face model from a config")
    import tp_harness
    from stagesplit.capturing.pytorch import capture_model
    from stagesplit.io.targets import load_target
    from stagesplit.plan.layouts import cp_seconds

    def rank(cp):
        return capture_model(tp_harness.build("llama", "meta"), tp_harness.inputs("llama", "meta"), dtype="bfloat16",
                             allocator_round=1, kernels="cuda", cp=cp, target="h100-80gb")
    one, two = rank(1), rank(2)
    comm, attention, exposed = cp_seconds(api.analyze(two), H100, load_target("h100-80gb"))
    assert comm > 0 and attention > 0 and exposed == max(0.0, comm - attention)
    lp = api.layouts(one, cp_profiles={2: two}, target="h100-80gb", gpus=2, global_batch=2, micro_batch_size=2,
                     time_limit=60)
    assert {r.layout.cp for r in lp.rows} == {1, 2}
    rows = [r for r in lp.rows if r.layout.cp == 2 and r.step_s is not None]
    assert rows and all(r.cp_comm_s > 0 for r in rows)


def test_the_micro_batch_size_searched_with_cp_and_ep_by_hand():
    """4 GPUs, one layer (PP 1), batch 8, the micro-batch size searched: CP 1 leaves DP 4 (2 samples
    a replica: sizes 1 and 2), CP 2 leaves DP 2 (4 samples: sizes 1, 2 and 4; the context-parallel
    ranks share theirs), each with ZeRO 0 to 3; EP 2 (of the DP 4 ranks) sizes 1 and 2 under ZeRO 0
    alone. The micro-batches are 8 / (size x dp)."""
    from stagesplit.io.targets import load_target
    from stagesplit.plan.layouts import Layout, LayoutRequest, enumerate_layouts
    req = LayoutRequest(gpus=4, global_batch=8, target=load_target("h100-80gb"), node=H100, micro_batch_size=None)
    got = enumerate_layouts(req, [1, (1, 2), (1, 1, 2)], layers=1)
    want = [Layout(1, 1, 4, z, 8 // (s * 4), micro_batch_size=s) for s in (1, 2) for z in range(4)]
    want += [Layout(1, 1, 2, z, 8 // (s * 2), 2, micro_batch_size=s) for s in (1, 2, 4) for z in range(4)]
    want += [Layout(1, 1, 4, 0, 8 // (s * 4), 1, 2, micro_batch_size=s) for s in (1, 2)]
    assert sorted(got) == sorted(want) and len(got) == 8 + 12 + 2
    assert Layout(1, 1, 2, 0, 1, 2, micro_batch_size=4).describe() == \
        "TP 1 x CP 2 x PP 1 x DP 2, ZeRO 0, 1 micro-batches of 4"
