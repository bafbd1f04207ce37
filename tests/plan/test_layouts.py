"""The layout search (plan/layouts.py) and the communication model (model/communication.py):
collective times by hand, two layouts' communication and step by hand, the search against every
layout solved one by one, and bad input refused in one line naming the option."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from stagesplit import api
from stagesplit.errors import OptionError
from stagesplit.io.topology import known_nodes, node_of
from stagesplit.model.communication import DDP_BUCKET_BYTES, all_gather, all_reduce, dp_exposed, p2p, reduce_scatter

torch = pytest.importorskip("torch")

from linear_stack import linear_stack  # noqa: E402

H100 = node_of("h100-80gb")
LINEAR = 64 * 64 * 4 + 64 * 4          # one Linear(64, 64)'s parameters in float32


_stack = linear_stack


#: the oracles here simulate 1F1B (conftest.py's ``search_under_1f1b``)
pytestmark = pytest.mark.usefixtures("search_under_1f1b")


@pytest.fixture(scope="module")
def stack():
    return _stack()


def test_ring_collectives_by_hand():
    bw, a = 100e9, 2e-6
    assert all_reduce(8e9, 8, bw, a) == pytest.approx(2 * 7 * a + 2 * 8e9 * 7 / 8 / bw)
    assert reduce_scatter(8e9, 8, bw, a) == pytest.approx(7 * a + 8e9 * 7 / 8 / bw)
    assert all_gather(8e9, 4, bw, a) == pytest.approx(3 * a + 8e9 * 3 / 4 / bw)
    assert p2p(1e6, bw, a) == pytest.approx(a + 1e6 / bw)
    assert all_reduce(8e9, 1, bw, a) == 0.0 and p2p(0, bw, a) == 0.0


def test_groups_inside_a_node_use_its_links():
    assert H100.link(8) is H100.intra and H100.link(9) is H100.inter
    assert H100.link(2, stride=4) is H100.intra and H100.link(2, stride=8) is H100.inter
    nodes = known_nodes()
    for name in ("a100-80gb", "h100-80gb", "h200-141gb", "b200-180gb", "mi300x-192gb"):
        assert nodes[name].gpus_per_node == 8 and nodes[name].intra.bytes_per_s > nodes[name].inter.bytes_per_s


def test_ddp_exposes_the_last_bucket_and_what_the_backward_did_not_hide():
    from stagesplit.model.communication import DDP_FIRST_BUCKET_BYTES, last_bucket
    bw, a = 50e9, 5e-6
    MiB = 2**20
    # a first bucket of 1 MiB, then 25 MiB each, the last what is left
    assert last_bucket(0.5 * MiB) == 0.5 * MiB and last_bucket(1 * MiB + 25 * MiB) == 25 * MiB
    assert last_bucket(1 * MiB + 25 * MiB + 3 * MiB) == 3 * MiB and DDP_FIRST_BUCKET_BYTES == MiB
    big = 1 * MiB + 2 * DDP_BUCKET_BYTES + 4 * MiB
    whole = all_reduce(big, 4, bw, a)
    # a long backward hides all but the last bucket
    assert dp_exposed(0, 4, [big], 0.0, 10.0, 1, bw, a).total == pytest.approx(all_reduce(4 * MiB, 4, bw, a))
    # no backward to hide under: all of it
    assert dp_exposed(0, 4, [big], 0.0, 0.0, 1, bw, a).total == pytest.approx(whole)
    # ZeRO 1: the reduce-scatter as DDP's all-reduce, then the parameters' all-gather in full
    e = dp_exposed(1, 4, [big], 0.0, 0.0, 1, bw, a)
    assert e.gradients == pytest.approx(reduce_scatter(big, 4, bw, a)) and e.parameters == pytest.approx(
        all_gather(big, 4, bw, a))
    # ZeRO 3, 2 micro-batches, no compute to hide under: each pass gathers its first group, then
    # the others; the gradients' reduce-scatter once
    e = dp_exposed(3, 4, [10, 20, 30], 0.0, 0.0, 2, bw, a)
    per_mb = all_gather(10, 4, bw, a) + all_gather(50, 4, bw, a) + all_gather(30, 4, bw, a) + all_gather(30, 4, bw, a)
    assert e.gathers == pytest.approx(2 * per_mb)
    assert e.gradients == pytest.approx(reduce_scatter(60, 4, bw, a))
    # compute long enough: only each pass's first gather, and the first group's reduce-scatter
    e = dp_exposed(3, 4, [10, 20, 30], 1.0, 1.0, 2, bw, a)
    assert e.gathers == pytest.approx(2 * (all_gather(10, 4, bw, a) + all_gather(30, 4, bw, a)))
    assert e.gradients == pytest.approx(reduce_scatter(10, 4, bw, a))
    assert dp_exposed(3, 4, [10, 20, 30], 1.0, 1.0, 2, bw, a, reshard_after_forward=False).gathers == \
        pytest.approx(2 * all_gather(10, 4, bw, a))
    # DDP's bucket copies (gradient_as_bucket_view off): into the bucket and back, each a read and a
    # write of every gradient byte, at the device's memory bandwidth; ZeRO 1-3 make none
    e = dp_exposed(0, 4, [big], 0.0, 10.0, 1, bw, a, memory_bytes_per_s=2e12)
    assert e.copies == pytest.approx(4 * big / 2e12)
    assert e.total == pytest.approx(all_reduce(4 * MiB, 4, bw, a) + 4 * big / 2e12)
    assert dp_exposed(1, 4, [big], 0.0, 10.0, 1, bw, a, memory_bytes_per_s=2e12).copies == 0.0
    # collectives on the compute's own cores (a CPU rank on one core): nothing hides, however long the compute
    assert dp_exposed(0, 4, [big], 0.0, 10.0, 1, bw, a, overlaps_compute=False).total == pytest.approx(whole)
    e = dp_exposed(3, 4, [10, 20, 30], 1.0, 1.0, 2, bw, a, overlaps_compute=False)
    assert e.gathers == pytest.approx(2 * per_mb) and e.gradients == pytest.approx(reduce_scatter(60, 4, bw, a))


def test_a_node_says_whether_its_collectives_overlap_the_compute(tmp_path):
    """``overlaps_compute`` may be left out (true: every shipped GPU node); false, or anything but a
    boolean, read strictly."""
    from stagesplit.errors import ProfileError
    from stagesplit.io.topology import node_from_mapping
    base = {"gpus_per_node": 2, "intra_bytes_per_s": 1e9, "intra_latency_s": 1e-4, "inter_bytes_per_s": 1e9,
            "inter_latency_s": 1e-4}
    assert node_from_mapping(base, "t.yaml", "node").overlaps_compute is True
    assert all(n.overlaps_compute for n in known_nodes().values())
    assert node_from_mapping(base | {"overlaps_compute": False}, "t.yaml", "node").overlaps_compute is False
    with pytest.raises(ProfileError, match=r"t.yaml.*node.overlaps_compute.*true or false"):
        node_from_mapping(base | {"overlaps_compute": "no"}, "t.yaml", "node")


def _solve(stack, **kw):
    return api.layouts(stack, target="h100-80gb", **({"time_limit": 30} | kw))


def test_two_layouts_by_hand(stack):
    """DDP on 8 ranks in one node, one stage: the step is the rank's pipeline step plus the whole
    all-reduce of its 4 x 16,640 bytes (one bucket: nothing hides it) and the reducer's copies of
    them into the bucket and back (4 x the bytes at the device's memory bandwidth); each rank holds the whole
    model. Then 4 stages of one layer each x 2 ranks, ZeRO 0: each stage all-reduces its 16,640
    bytes across 2 ranks 4 apart (inside the node)."""
    a = H100.intra
    lp = _solve(stack, gpus=8, global_batch=64, micro_batch_size=8, tp=1, pp=1, zero=0)
    best = lp.best
    assert best is not None and best.layout.dp == 8 and best.layout.micro_batches == 1
    ar = 2 * 7 * a.latency_s + 2 * (4 * LINEAR) * 7 / 8 / a.bytes_per_s
    # and DDP's bucket copies: every gradient into its bucket and back, read and written, at the H100's 3.35 TB/s
    copies = 4 * (4 * LINEAR) / 3.35e12
    assert api.target("h100-80gb").memory_bytes_per_s == 3.35e12
    assert best.dp_comm_s == pytest.approx(ar + copies)
    assert best.step_s == pytest.approx(best.pipeline_s + ar + copies)
    one = api.solve(stack, devices=1, target="h100-80gb", schedule="1f1b", micro_batches=1)
    # DDP's reducer holds one more copy of every gradient in its buckets, all step
    assert best.rank_peaks == tuple(r.peak_bytes + 4 * LINEAR for r in one.schedule.ranks)
    assert best.pipeline_s == pytest.approx(one.schedule.step_time)

    lp = _solve(stack, gpus=8, global_batch=64, micro_batch_size=8, tp=1, pp=4, zero=0)
    best = lp.best
    assert best.layout.dp == 2 and best.layout.micro_batches == 4
    four = api.solve(stack, devices=4, target="h100-80gb", schedule="1f1b", micro_batches=4, dp=2, exact=True,
                     communication=True, link_bandwidth=H100.intra.bytes_per_s)
    s = four.schedule
    assert [st.first_layer for st in four.stages] == [0, 1, 2, 3]
    ar2 = 2 * 1 * a.latency_s + 2 * LINEAR * 1 / 2 / a.bytes_per_s
    # 16,640 bytes: under DDP's first bucket (1 MiB), so the one bucket is the last: nothing hidden
    assert best.dp_comm_s == pytest.approx(ar2 + 4 * LINEAR / 3.35e12)
    assert best.step_s == pytest.approx(s.step_time + best.dp_comm_s)
    assert best.rank_peaks == tuple(r.peak_bytes for r in s.ranks)


def test_the_search_is_the_best_of_every_layout_solved_alone(stack):
    """The search's best equals the fastest of every combination solved on its own (no floor, no
    cutoff), and every row it cut off or found slower is no faster."""
    from stagesplit.model.datasharding import parameter_bytes_by_layer
    from stagesplit.plan.layouts import enumerate_layouts, step_of
    named = 0
    for gpus, batch in ((4, 32), (8, 64)):
        lp = _solve(stack, gpus=gpus, global_batch=batch, micro_batch_size=8)
        req = lp.request
        read = api.analyze(stack)
        params, _ = parameter_bytes_by_layer(read.profile, read.layers)
        steps = {}
        for lay in enumerate_layouts(req, [1], 4):
            plan = api.solve(stack, devices=lay.pp, target="h100-80gb", schedule="1f1b", micro_batches=lay.micro_batches,
                             dp=lay.dp, zero=lay.zero, exact=True, communication=lay.pp > 1,
                             link_bandwidth=H100.link(lay.pp, lay.tp * lay.dp).bytes_per_s)
            if plan.feasible:       # (the analysis gives step_of only the tensor-parallel collectives: none here)
                steps[lay] = step_of(lay, plan, read, req, params)[0]
        fastest = min(steps.values())
        assert lp.best.step_s == pytest.approx(fastest)
        for row in lp.rows:
            if row.layout in steps:
                assert steps[row.layout] >= fastest * (1 - 1e-9)
            if row.status == "cut off":
                assert steps[row.layout] >= lp.best.step_s * (1 - 1e-9)
            # a row's words are its own numbers: the best found before it (which a later combination may
            # beat) is no faster than the answer, and the row itself is no faster than that best
            said = _best_before(row.reason)
            if said is not None:
                named += 1
                assert said >= lp.best.step_s * (1 - 5e-3)
                if row.layout in steps:
                    assert steps[row.layout] >= said * (1 - 5e-3)
        assert lp.proven
    assert named >= 2           # rows cut off or refuted against a best found before them were read


def _best_before(reason: str) -> float | None:
    """The best step a cut-off or refuted row names (seconds, from its three significant figures)."""
    import re
    found = re.fullmatch(r"step floor \S+ m?s >= (\S+) (m?s), the best step found before it", reason) or \
        re.fullmatch(r"refuted: no split's pipeline step is under \S+ m?s, so no step under (\S+) (m?s), the best "
                     r"found before it", reason)
    if found is None:
        return None
    return float(found.group(1)) * (1e-3 if found.group(2) == "ms" else 1.0)


@pytest.mark.parametrize("kw, option, text", [
    (dict(gpus=8, tp=1, pp=3), "tp", "tp 1 x pp 3 = 3 does not divide 8 GPUs"),
    (dict(gpus=8, global_batch=12), "global_batch", "no layout of 8 GPUs forms a global batch of 12"),
    (dict(gpus=12, gpus_per_node=8), "gpus_per_node", "8 GPUs per node does not divide 12 GPUs"),
    (dict(gpus=8, tp=2), "tp", "no profile of tensor-parallel degree 2 was given"),
])
def test_bad_input_is_one_line_naming_the_option(stack, kw, option, text):
    args = dict(global_batch=64, micro_batch_size=8) | kw
    with pytest.raises(OptionError) as excinfo:
        _solve(stack, **args)
    assert excinfo.value.parameter == option and text in str(excinfo.value) and "\n" not in str(excinfo.value)


def test_mfu_and_tokens_from_the_plans_numbers(stack):
    lp = _solve(stack, gpus=4, global_batch=32, micro_batch_size=8, sequence_length=1)
    best = lp.best
    from stagesplit.io.profile import Phase
    ops = stack.operations                  # model FLOPs: forward and backward, not the optimizer's step
    flops = float(ops.compute[(ops.phase == Phase.FORWARD) | (ops.phase == Phase.BACKWARD_INPUT)
                              | (ops.phase == Phase.BACKWARD_WEIGHT)].sum())
    # by hand: 2 x 8 x 64 x 64 per matmul; 4 forward, 4 weight gradients, 3 input gradients (the
    # first layer's input needs none)
    assert flops == 11 * 2 * 8 * 64 * 64
    assert lp.samples_per_s == pytest.approx(32 / best.step_s)
    assert lp.tokens_per_s_per_gpu == pytest.approx(32 / best.step_s / 4)
    assert lp.mfu == pytest.approx(flops * 4 / best.step_s / (4 * 989e12))
    assert math.isfinite(lp.mfu) and np.isfinite(best.step_s)


def test_command_line_text_and_json_are_the_plans_numbers(stack, tmp_path, capsys):
    import json

    from stagesplit.io import save_profile
    from tests.helpers import run_cli
    path = tmp_path / "stack.json"
    save_profile(stack, path)
    code, out, _ = run_cli(capsys, "layouts", path, "--gpus", 4, "--global-batch", 32, "--micro-batch-size", 8,
                           "--seq-len", 1, "--target", "h100-80gb", "--format", "json")
    assert code == 0
    doc = json.loads(out)
    lp = _solve(stack, gpus=4, global_batch=32, micro_batch_size=8, sequence_length=1)
    assert doc["best"]["step_s"] == pytest.approx(lp.best.step_s)
    assert (doc["best"]["tp"], doc["best"]["pp"], doc["best"]["dp"], doc["best"]["zero"]) == (
        lp.best.layout.tp, lp.best.layout.pp, lp.best.layout.dp, lp.best.layout.zero)
    assert [r["status"] for r in doc["rows"]] == [r.status for r in lp.rows]
    code, out, _ = run_cli(capsys, "layouts", path, "--gpus", 4, "--global-batch", 32, "--micro-batch-size", 8,
                           "--seq-len", 1, "--target", "h100-80gb")
    lines = out.splitlines()
    b = lp.best
    assert lines[1] == f"best: {b.layout.describe()}; 1f1b with 1 chunk(s) per device"
    assert (b.schedule, b.chunks_per_rank) == ("1f1b", 1)
    def t(x):          # three figures: seconds from 1 s up, else milliseconds
        return f"{x:.3g} s" if x >= 1 else f"{x * 1e3:.3g} ms"
    assert lines[2] == (f"step: {t(b.step_s)} (pipeline {t(b.pipeline_s)}, tensor-parallel communication "
                        f"{t(b.tp_comm_s)}, data-parallel communication exposed {t(b.dp_comm_s)})")
    assert lines[3] == (f"throughput: {32 / b.step_s:,.1f} samples/s, {32 / b.step_s / 4:,.0f} tokens/s per GPU, "
                        f"MFU {lp.mfu:.1%}")
    assert lines[4] == "rank peaks: " + ", ".join(f"rank {r}: {p / 2**30:.2f} GiB" for r, p in enumerate(b.rank_peaks)) \
        + " of 80.00 GiB"
    assert lines[5] == "note: no profile records tensor-parallel collectives: none priced"
    assert lines[6] == "proven: every other combination is slower, refuted by a lower bound or does not fit"
    assert lp.proven
    rows = lines[9:]
    assert len(rows) == len(lp.rows)
    for line, r in zip(rows, lp.rows):
        assert line.split()[:6] == [str(r.layout.tp), str(r.layout.pp), str(r.layout.dp), str(r.layout.zero),
                                    str(r.layout.micro_batches), r.status.split()[0]]
        assert line.endswith(r.reason)


@pytest.mark.parametrize("flags, line", [
    (["--gpus", 8, "--tp", 1, "--pp", 3], "--tp: tp 1 x pp 3 = 3 does not divide 8 GPUs"),
    (["--gpus", 8, "--global-batch", 12], "--global-batch: no layout of 8 GPUs forms a global batch of 12"),
    (["--gpus", 12, "--gpus-per-node", 8], "--gpus-per-node: 8 GPUs per node does not divide 12 GPUs"),
    (["--gpus", 8, "--tp-profile", "2"], "--tp-profile: expected T=FILE (a tensor-parallel degree and a profile)"),
    (["--gpus", 8, "--tp", 2], "--tp: no profile of tensor-parallel degree 2 was given (degrees: 1)"),
    (["--gpus", 8, "--schedule", "none"], "--schedule: the layout search solves a pipeline schedule"),
])
def test_bad_input_one_line_exit_2(stack, tmp_path, capsys, flags, line):
    from stagesplit.io import save_profile
    from tests.helpers import refused_line
    path = tmp_path / "stack.json"
    save_profile(stack, path)
    args = ["--global-batch", 64, "--micro-batch-size", 8, "--target", "h100-80gb"]
    if "--global-batch" in flags:
        args = args[2:]
    got = refused_line(capsys, "layouts", path, *args, *flags)
    assert line in got


def _random_stack(seed: int):
    from stagesplit.capturing.pytorch import capture_model
    rng = np.random.default_rng(seed)
    layers = int(rng.integers(3, 6))
    widths = [int(w) for w in rng.integers(8, 96, layers + 1)]
    torch.manual_seed(seed)
    model = torch.nn.Sequential(*[torch.nn.Linear(widths[i], widths[i + 1]) for i in range(layers)])
    return capture_model(model, torch.empty(8, widths[0], device="meta"), allocator_round=1, name=f"random{seed}"), \
        layers


def _random_search(seed: int):
    """A random stack (``_random_stack``), the layout search's answer on 2 or 4 GPUs, the stack read and
    its parameter bytes per layer."""
    from stagesplit.model.datasharding import parameter_bytes_by_layer
    profile, layers = _random_stack(seed)
    gpus = (2, 4)[seed % 2]
    lp = api.layouts(profile, target="h100-80gb", gpus=gpus, global_batch=8 * gpus * (1 + seed % 3),
                     micro_batch_size=8, time_limit=60)
    read = api.analyze(profile)
    return profile, layers, lp, read, parameter_bytes_by_layer(read.profile, read.layers)[0]


@pytest.mark.parametrize("seed", range(4))
def test_small_random_problems_the_search_is_every_layout_x_every_split(seed):
    """On small random stacks: for every layout, the split the search solves has the pipeline step
    of the best of every split tried one by one (solver/chunk_search.py's exhaustive oracle), and
    the search's best is the fastest of every layout's step."""
    from stagesplit.model.datasharding import DataLayout
    from stagesplit.plan.engine import resolve
    from stagesplit.plan.layouts import enumerate_layouts, solve_request, step_of
    from stagesplit.plan.scheduled import schedule_problem
    from stagesplit.solver.chunk_search import exhaustive
    profile, layers, lp, read, params = _random_search(seed)
    totals = {}
    for lay in enumerate_layouts(lp.request, [1], layers):
        analysis = api.analyze(profile, layout=DataLayout(lay.dp, lay.zero))
        request = solve_request(lay, lp.request, 60)
        resolved = resolve(request, analysis)
        oracle = exhaustive(schedule_problem(resolved.model, resolved.inputs, resolved.model.phase_table))
        plan = api.solve(profile, devices=lay.pp, target="h100-80gb", schedule="1f1b",
                         micro_batches=lay.micro_batches, dp=lay.dp, zero=lay.zero, exact=True,
                         communication=lay.pp > 1, link_bandwidth=request.link_bandwidth)
        assert (oracle is not None) == plan.feasible
        if oracle is None:
            continue
        assert plan.schedule.step_time == pytest.approx(oracle.step_time)
        totals[lay] = step_of(lay, plan, read, lp.request, params)[0]
        row = next(r for r in lp.rows if r.layout == lay)
        if row.step_s is not None:
            assert row.step_s == pytest.approx(totals[lay])
    assert lp.best.step_s == pytest.approx(min(totals.values()))
    # the compute floor the search cuts off with is below every layout's step: the layers' forward
    # and backward operations at the peak, times the micro-batches, over the stages
    from stagesplit.io.profile import Phase
    ops = read.profile.operations
    work = float(ops.compute[(np.asarray(read.layers.op_layer) >= 0) & (ops.phase != Phase.OPTIMIZER)].sum()) / 989e12
    for lay, total in totals.items():
        assert work * lay.micro_batches / lay.pp <= total


def test_the_data_parallel_floor_and_gap_by_hand(stack):
    """DDP over 2 ranks of 3 stages of the four equal layers: the solved split puts 2 layers on one
    stage, whose all-reduce of 2 x 16,640 bytes (one bucket: nothing hides it) and bucket copies are
    the step's exposure; no split exposes less than a rank holding a third of the 66,560 bytes does
    (``dp_floor``), so another split could be faster by at most the difference, which the search
    reports (``dp_gap_s``, and the plan's ``within_s``: the only combination asked for). One stage
    (pp 1) has one split: no gap."""
    from stagesplit.plan.layouts import dp_floor
    a = H100.intra
    lp = _solve(stack, gpus=6, global_batch=64, micro_batch_size=8, tp=1, pp=3, zero=0)
    best = lp.best
    assert (best.layout.pp, best.layout.dp) == (3, 2)

    def exposed(nbytes: float) -> float:   # the all-reduce over 2 ranks and DDP's copies at 3.35 TB/s
        return 2 * a.latency_s + 2 * nbytes / 2 / a.bytes_per_s + 4 * nbytes / 3.35e12
    assert best.dp_comm_s == pytest.approx(exposed(2 * LINEAR))
    assert best.dp_gap_s == pytest.approx(exposed(2 * LINEAR) - exposed(4 * LINEAR / 3))
    assert lp.within_s == pytest.approx(best.dp_gap_s) and lp.proven
    from stagesplit.plan.layouts import RankWork
    work = RankWork.of(api.analyze(stack), lp.request)
    assert dp_floor(work, best.layout, lp.request) == pytest.approx(exposed(4 * LINEAR / 3))
    one = _solve(stack, gpus=2, global_batch=16, micro_batch_size=8, tp=1, pp=1, zero=0).best
    assert one.dp_comm_s > 0 and one.dp_gap_s == 0.0


def test_the_command_line_says_the_gap_the_plan_has(stack, tmp_path, capsys):
    """``proven within X`` is the plan's ``within_s``, and ``--format json`` gives it and each row's gap."""
    import json

    from stagesplit.io import save_profile
    from stagesplit.plan.layouts import seconds
    from tests.helpers import run_cli
    path = tmp_path / "stack.json"
    save_profile(stack, path)
    flags = ("layouts", path, "--gpus", 6, "--global-batch", 64, "--micro-batch-size", 8, "--tp", 1, "--pp", 3,
             "--zero", 0, "--target", "h100-80gb")
    lp = _solve(stack, gpus=6, global_batch=64, micro_batch_size=8, tp=1, pp=3, zero=0)
    assert lp.within_s > 0
    code, out, _ = run_cli(capsys, *flags)
    assert code == 0
    assert f"proven within {seconds(lp.within_s)}: every other combination is slower, refuted by a lower bound or " \
        "does not fit; another split could expose less data-parallel communication, by at most that" in out.splitlines()
    code, out, _ = run_cli(capsys, *flags, "--format", "json")
    doc = json.loads(out)
    assert doc["within_s"] == pytest.approx(lp.within_s) and doc["proven"] is True
    assert [r["dp_gap_s"] for r in doc["rows"]] == pytest.approx([r.dp_gap_s for r in lp.rows])


@pytest.mark.parametrize("seed", range(4))
def test_no_split_of_any_layout_beats_the_best_by_more_than_the_reported_gap(seed):
    """On small random stacks, every layout x every split that fits, its whole step (the data-parallel
    exposure included, which the split's proof does not minimise): no split of a combination is faster
    than its row's step less its ``dp_gap_s``, and none of any is faster than the best less ``within_s``."""
    import itertools

    from stagesplit.plan.layouts import enumerate_layouts, step_of
    profile, layers, lp, read, params = _random_search(seed)
    fastest = math.inf
    for lay in enumerate_layouts(lp.request, [1], layers):
        row = next(r for r in lp.rows if r.layout == lay)
        for cuts in itertools.combinations(range(1, layers), lay.pp - 1):
            plan = api.solve(profile, devices=lay.pp, target="h100-80gb", schedule="1f1b",
                             micro_batches=lay.micro_batches, dp=lay.dp, zero=lay.zero, exact=True,
                             communication=lay.pp > 1, link_bandwidth=H100.intra.bytes_per_s,
                             pin_splits=[read.layers.names[c] for c in cuts])
            if not plan.feasible:
                continue
            total = step_of(lay, plan, read, lp.request, params)[0]
            fastest = min(fastest, total)
            if row.step_s is not None:
                assert total >= row.step_s - row.dp_gap_s - 1e-12, (lay, cuts)
    assert lp.proven
    assert fastest >= lp.best.step_s - lp.within_s - 1e-12
    assert fastest <= lp.best.step_s + 1e-12


def test_tensor_parallel_collectives_priced_from_the_recorded_layout():
    """A TP rank's recorded collectives (h-tp's ParallelLayout: kind, bytes, group size, phase)
    priced on the node's links: per micro-batch all but the optimizer's, which run once."""
    from types import SimpleNamespace

    from stagesplit.plan.layouts import _tp_seconds
    c = [SimpleNamespace(kind="all_reduce", bytes=4_000_000, group_size=4, phase="forward"),
         SimpleNamespace(kind="reduce_scatter_tensor", bytes=2_000_000, group_size=4, phase="backward"),
         SimpleNamespace(kind="all_reduce", bytes=1000, group_size=4, phase="optimizer")]
    info = SimpleNamespace(parallel_layout=SimpleNamespace(collectives=c))
    analysis = SimpleNamespace(profile=SimpleNamespace(info=info), source=None)
    a = H100.intra
    per_mb, once = _tp_seconds(analysis, H100)
    assert per_mb == pytest.approx(2 * 3 * a.latency_s + 2 * 4e6 * 3 / 4 / a.bytes_per_s
                                   + 3 * a.latency_s + 2e6 * 3 / 4 / a.bytes_per_s)
    assert once == pytest.approx(2 * 3 * a.latency_s + 2 * 1000 * 3 / 4 / a.bytes_per_s)
    none = SimpleNamespace(profile=SimpleNamespace(info=SimpleNamespace()), source=None)
    assert _tp_seconds(none, H100) == (0.0, 0.0)


def test_one_profile_per_tensor_parallel_degree(stack):
    """A degree-2 rank's profile (here a stack of half the width: half the compute and bytes)
    enters the search as TP 2: its rows lay out the other half of the GPUs; with both degrees
    fixed to one GPU group, TP 2 alone is its profile's own one-device step."""
    half = _stack(width=32)
    lp = api.layouts(stack, tp_profiles={2: half}, target="h100-80gb", gpus=4, global_batch=32,
                     micro_batch_size=8, time_limit=60)
    tps = {r.layout.tp for r in lp.rows}
    assert tps == {1, 2}
    assert all(r.layout.tp * r.layout.pp * r.layout.dp == 4 for r in lp.rows)
    lp = api.layouts(stack, tp_profiles={2: half}, target="h100-80gb", gpus=2, global_batch=8,
                     micro_batch_size=8, tp=2, time_limit=60)
    one = api.solve(half, devices=1, target="h100-80gb", schedule="1f1b", micro_batches=1)
    assert lp.best.layout == type(lp.best.layout)(2, 1, 1, 0, 1, micro_batch_size=8)
    assert lp.best.step_s == pytest.approx(one.schedule.step_time)
    assert "tp_profiles" == _refused(stack, tp_profiles={1: half})


def _refused(stack, **kw):
    with pytest.raises(OptionError) as excinfo:
        api.layouts(stack, target="h100-80gb", gpus=2, global_batch=8, micro_batch_size=8, **kw)
    return excinfo.value.parameter


@pytest.mark.parametrize("dp, zero", [(1, 0), (2, 0), (2, 1), (4, 2), (4, 3)])
def test_the_memory_floor_is_at_most_what_a_rank_holds_all_step(stack, dp, zero):
    """The floor divides parameters, gradients and state exactly where the rank's shares round up
    and DDP adds its buckets: never above the sharded rank's always-live bytes (one stage), and
    over pp stages never above the fullest stage's."""
    from stagesplit.model.datasharding import DataLayout, role_bytes
    from stagesplit.plan.layouts import Layout, memory_floor
    rank = api.analyze(stack, layout=DataLayout(dp, zero)).profile
    v = rank.variables
    floor = memory_floor(role_bytes(stack), Layout(1, 1, dp, zero, 1))
    assert floor <= int(v.bytes[v.always_live].sum())
    assert floor >= 0.9 * int(v.bytes[v.always_live].sum()) - 4 * LINEAR      # and close: the buckets aside


def test_a_search_the_time_limit_stops_says_how_many_are_open(stack):
    """With almost no time, rows are unknown and the text counts them (the plan's own rows)."""
    from stagesplit.reporting.layouts import layouts_text
    lp = _solve(stack, gpus=8, global_batch=64, micro_batch_size=8, time_limit=1e-6)
    unknown = sum(1 for r in lp.rows if r.status == "unknown")
    open_ = sum(1 for r in lp.rows if r.status != "unknown" and not r.proven)
    assert unknown >= 1 and not lp.proven
    line = f"not proven: the time limit stopped {unknown} combination(s) before a split was found and {open_} " \
        "before their split was proven optimal"
    assert line in layouts_text(lp).splitlines()
    if lp.best is None:
        said = f"no layout found: the time limit stopped {unknown} combination(s), the others do not fit or were refused"
        assert layouts_text(lp).splitlines()[1] == said
        assert lp.notes == (said,)            # the plan's own note: not "no layout fits" while rows are open


def test_the_search_keeps_the_end_of_its_limit_for_finishing(monkeypatch):
    """The search's deadline is its limit less a hundredth of it, half a second at most (kept for the
    plan's assembly and what a solve runs past its share), while its messages still name the limit the
    user gave: 60 s ends at 59.5 s, 10 s at 9.9 s, 1e-6 s at 0.99e-6 s."""
    import stagesplit.common.deadline as deadline_module
    from stagesplit.plan.layouts import search_deadline
    monkeypatch.setattr(deadline_module.time, "monotonic", lambda: 1000.0)
    for limit, ends in ((60, 59.5), (10, 9.9), (1e-6, 0.99e-6)):
        d = search_deadline(limit)
        assert d.at == pytest.approx(1000.0 + ends, abs=1e-12) and d.limit == limit


def test_nothing_fits_is_said_and_exits_1(stack, tmp_path, capsys):
    from stagesplit.io import save_profile
    from tests.helpers import run_cli
    path = tmp_path / "stack.json"
    save_profile(stack, path)
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text("kind: gpu\ntiles: 1\nbytes_per_tile: 100000\nflops_per_s: 1e14\nlink_bytes_per_s: 1e11\n"
                    "node: {gpus_per_node: 8, intra_bytes_per_s: 1e11, intra_latency_s: 0.000003, "
                    "inter_bytes_per_s: 1e10, inter_latency_s: 0.000005}\n")
    code, out, _ = run_cli(capsys, "layouts", path, "--gpus", 2, "--global-batch", 16, "--micro-batch-size", 8,
                           "--target", tiny)
    lines = out.splitlines()
    assert code == 1 and lines[1] == "no layout fits every rank"
    assert all(r.split()[5] == "memory" for r in lines[6:])
    lp = api.layouts(stack, gpus=2, global_batch=16, micro_batch_size=8, target=str(tiny), time_limit=30)
    assert lp.best is None and lp.notes == ("no layout fits every rank",) and lp.proven


def test_the_combinations_by_hand():
    """8 GPUs of 8 per node, profiles at TP 1 and 2, global batch 32 of micro-batches of 2: tp x pp
    x dp = 8, dp dividing 16 micro-batch slots, ZeRO 0 alone with one data-parallel rank; fixing
    a degree keeps only its combinations."""
    from stagesplit.io.targets import load_target
    from stagesplit.plan.layouts import Layout, LayoutRequest, enumerate_layouts
    req = LayoutRequest(gpus=8, global_batch=32, target=load_target("h100-80gb"), node=H100, micro_batch_size=2)
    got = enumerate_layouts(req, [1, 2], layers=8)
    want = [Layout(tp, pp, 8 // (tp * pp), z, 32 // (2 * (8 // (tp * pp))), micro_batch_size=2)
            for tp in (1, 2) for pp in (1, 2, 4, 8) if 8 % (tp * pp) == 0
            for z in ((0, 1, 2, 3) if 8 // (tp * pp) > 1 else (0,))]
    assert got == want and len(got) == 4 * 3 + 1 + 4 * 2 + 1
    from dataclasses import replace
    assert {lay.pp for lay in enumerate_layouts(replace(req, tp=2, zero=3), [1, 2], 8)} == {1, 2}
    assert enumerate_layouts(replace(req, dp=8), [1, 2], 8) == [Layout(1, 1, 8, z, 2, micro_batch_size=2)
                                                                for z in range(4)]
    # only 3 layers: no more than 3 stages; a batch of 6: dp must divide 3 micro-batch slots
    assert {lay.pp for lay in enumerate_layouts(req, [1], 3)} == {1, 2}
    assert {lay.dp for lay in enumerate_layouts(replace(req, global_batch=6), [1, 2], 8)} == {1}


def test_a_profile_recording_another_degree_is_refused(stack):
    """A rank captured at TP 2 (its ParallelLayout) given as degree 1 or 4: one line naming it."""
    from dataclasses import replace as copy_with

    from stagesplit.io.profile import ParallelLayout
    two = copy_with(stack)
    two.info = copy_with(stack.info, parallel_layout=ParallelLayout(tensor_parallel=2))
    with pytest.raises(OptionError) as excinfo:
        api.layouts(two, target="h100-80gb", gpus=2, global_batch=8, micro_batch_size=8)
    assert excinfo.value.parameter == "profile" and "tensor-parallel degree 2, given as degree 1" in str(excinfo.value)
    with pytest.raises(OptionError) as excinfo:
        api.layouts(stack, tp_profiles={4: two}, target="h100-80gb", gpus=4, global_batch=8, micro_batch_size=8)
    assert excinfo.value.parameter == "tp_profiles" and "given as degree 4" in str(excinfo.value)


def test_recorded_tensor_parallel_collectives_lengthen_the_step_by_hand(stack):
    """A TP 2 rank recording one 1 MB all-reduce per layer in the forward and one in the backward,
    and a 1 kB one in the optimizer step: the step is the pipeline's lengthened by the collectives'
    share of the rank's compute, plus the optimizer's once (TP 2 x PP 1 x DP 1: no data-parallel
    communication)."""
    from dataclasses import replace as copy_with

    from stagesplit.io.profile import Collective, ParallelLayout, Phase
    ops = stack.operations
    fwd = [int(i) for i in np.flatnonzero(ops.phase == Phase.FORWARD)][:4]
    bwd = [int(i) for i in np.flatnonzero(ops.phase == Phase.BACKWARD_INPUT)][:4]
    opt = int(np.flatnonzero(ops.phase == Phase.OPTIMIZER)[0])
    coll = tuple(Collective(step=i, kind="all_reduce", bytes=10**6, group_size=2, phase="forward") for i in fwd) + \
        tuple(Collective(step=i, kind="all_reduce", bytes=10**6, group_size=2, phase="backward") for i in bwd) + \
        (Collective(step=opt, kind="all_reduce", bytes=1000, group_size=2, phase="optimizer"),)
    two = copy_with(stack)
    two.info = copy_with(stack.info, parallel_layout=ParallelLayout(tensor_parallel=2, collectives=coll))
    lp = api.layouts(stack, tp_profiles={2: two}, target="h100-80gb", gpus=2, global_batch=8, micro_batch_size=8,
                     tp=2)
    b = lp.best
    a = H100.intra
    per_mb = 8 * (2 * 1 * a.latency_s + 2 * 10**6 / 2 / a.bytes_per_s)
    once = 2 * 1 * a.latency_s + 2 * 1000 / 2 / a.bytes_per_s
    one = api.solve(two, devices=1, target="h100-80gb", schedule="1f1b", micro_batches=1)
    compute = sum(f + bb + w for f, bb, w in one.schedule.chunk_times)
    assert b.layout.tp == 2 and b.pipeline_s == pytest.approx(one.schedule.step_time)
    assert b.tp_comm_s == pytest.approx(one.schedule.step_time * per_mb / compute + once)
    assert b.step_s == pytest.approx(b.pipeline_s + b.tp_comm_s)
    assert lp.tp_collectives_recorded


def _auto_against_each_alone(profile, layers: int, gpus: int, global_batch: int) -> list:
    """``schedule='auto'`` with the cutoff across combinations (each combination's every schedule asked
    only for a split whose step beats the best found before it) against every layout solved alone
    under ``auto`` without a cutoff: the best is the fastest of those, a combination the cutoff refuted
    is no faster alone, a solved one has its own step. Returns the layouts the cutoff refuted."""
    from dataclasses import replace

    from stagesplit.common.deadline import Deadline
    from stagesplit.common.events import Events
    from stagesplit.model.datasharding import DataLayout, parameter_bytes_by_layer
    from stagesplit.plan import engine
    from stagesplit.plan.layouts import enumerate_layouts, solve_request, step_of
    from stagesplit.solver.request import Schedule
    lp = api.layouts(profile, target="h100-80gb", gpus=gpus, global_batch=global_batch, micro_batch_size=8,
                     schedule="auto", time_limit=60)
    read = api.analyze(profile)
    params = parameter_bytes_by_layer(read.profile, read.layers)[0]
    alone = {}
    for lay in enumerate_layouts(lp.request, [1], layers):
        analysis = api.analyze(profile, layout=DataLayout(lay.dp, lay.zero))
        # every schedule, one stage too (the search solves one stage under 1F1B alone)
        request = replace(solve_request(lay, lp.request, 60), schedule=Schedule.AUTO)
        plan = engine.solve(analysis, request, Deadline.after(60), Events())
        if plan.feasible:
            alone[lay] = step_of(lay, plan, read, lp.request, params)[0]
            if lay.pp == 1:
                assert plan.schedule.step_time == pytest.approx(engine.solve(
                    analysis, solve_request(lay, lp.request, 60), Deadline.after(60), Events()).schedule.step_time)
    assert lp.best is not None and lp.best.step_s == pytest.approx(min(alone.values()))
    refuted = []
    for row in lp.rows:
        if row.reason.startswith("refuted"):
            refuted.append(row.layout)
            assert row.proven and alone[row.layout] >= lp.best.step_s * (1 - 1e-9), row
        elif row.step_s is not None:
            assert row.step_s == pytest.approx(alone[row.layout]), row
    assert lp.proven == all(r.proven for r in lp.rows)
    return refuted


@pytest.mark.parametrize("seed", range(4))
def test_the_auto_schedules_cutoff_keeps_every_layouts_own_answer(seed):
    profile, layers = _random_stack(seed)
    gpus = (2, 4)[seed % 2]
    _auto_against_each_alone(profile, layers, gpus, 8 * gpus * (1 + seed % 3))


def test_the_auto_schedules_cutoff_refutes_a_combination(stack):
    """Four equal layers on 8 GPUs: TP 1 x PP 4 x DP 2 under ZeRO 0 (DDP, whose bucket copies make it
    slower than ZeRO 1) is refuted, every schedule of it asked only for a split under the best step
    found before it."""
    refuted = _auto_against_each_alone(stack, 4, 8, 64)
    assert [(lay.pp, lay.dp, lay.zero) for lay in refuted] == [(4, 2, 0)]


def test_the_engines_auto_schedule_with_a_cutoff(stack):
    """plan/engine.solve's ``cutoff`` under ``auto``: below the optimum every schedule is refuted
    ("slower") or cannot run; above it the plan is the one found without a cutoff."""
    from stagesplit.common.deadline import Deadline
    from stagesplit.common.events import Events
    from stagesplit.plan import engine
    analysis = api.analyze(stack)
    request = api.solve_request(None, 4, schedule="auto", micro_batches=8)
    free = engine.solve(analysis, request, Deadline.after(60), Events())
    assert free.feasible and free.status == "optimal"
    optimum = free.schedule.step_time
    above = engine.solve(analysis, request, Deadline.after(60), Events(), cutoff=optimum * 1.5)
    assert above.feasible and above.schedule.step_time == pytest.approx(optimum)
    below = engine.solve(analysis, request, Deadline.after(60), Events(), cutoff=optimum * 0.999)
    statuses = {c.status for c in below.candidates}
    assert "slower" in statuses and statuses <= {"slower", "infeasible", "refused"}
    assert all(c.step_time is None or c.step_time >= optimum * 0.999 for c in below.candidates)


def test_chunks_per_rank_fixes_a_looped_schedules_virtual_stages(stack, tmp_path, capsys):
    """``chunks_per_rank`` (``--chunks-per-rank``): every pipeline of the search runs that many chunks per
    device, as a published configuration's virtual pipeline size fixes it; 2 is interleaved 1F1B's own, 4
    on four layers leaves no pipeline (each would need more chunks than layers), and a schedule that runs
    another count refuses it in one line."""
    from stagesplit.io import save_profile
    from tests.helpers import run_cli
    kw = dict(gpus=8, global_batch=64, micro_batch_size=8, schedule="interleaved-1f1b")
    own, two, four = (_solve(stack, chunks_per_rank=v, **kw) for v in (None, 2, 4))
    assert [(r.layout, r.status, r.step_s) for r in two.rows] == [(r.layout, r.status, r.step_s) for r in own.rows]
    assert any(r.layout.pp > 1 and r.status in ("best", "slower") and r.chunks_per_rank == 2 for r in two.rows)
    piped = [r for r in four.rows if r.layout.pp > 1]
    assert piped and all(r.status == "refused" and f"with 4 chunks on each of {r.layout.pp} devices needs "
                         f"{4 * r.layout.pp} chunks, but the model has 4 layers" in r.reason for r in piped)
    assert four.best.layout.pp == 1
    path = tmp_path / "stack.json"
    save_profile(stack, path)
    base = ("layouts", path, "--gpus", 8, "--global-batch", 64, "--micro-batch-size", 8, "--target", "h100-80gb")
    code, out, _ = run_cli(capsys, *base, "--schedule", "interleaved-1f1b", "--chunks-per-rank", 4, "--format", "json")
    assert code == 0
    assert [r["status"] for r in json.loads(out)["rows"]] == [r.status for r in four.rows]
    code, out, err = run_cli(capsys, *base, "--schedule", "1f1b", "--chunks-per-rank", 2)
    assert code == 2 and out == ""
    assert err == ("stagesplit: error: --chunks-per-rank: 1f1b runs one stage per rank (torch's Schedule1F1B): "
                   "expected 1, got 2\n")


@pytest.mark.parametrize("seed", range(3))
def test_several_schedules_are_each_combinations_own_items(seed, tmp_path, capsys):
    """``schedule='1f1b,interleaved-1f1b'``: every combination of a pipeline searched under 1F1B and
    under interleaved 1F1B at each chunk count the layers allow (2 to 4), each a row of its own, one
    stage once (under 1F1B); each row's step is the one its schedule's search alone finds for it (the
    searches of one schedule, and of interleaved 1F1B at one fixed chunk count), and the best is the
    fastest of them all. On the command line the rows name their schedule."""
    from stagesplit.io import save_profile
    from tests.helpers import run_cli
    profile, layers = _random_stack(seed)
    gpus = (2, 4, 4)[seed]
    kw = dict(gpus=gpus, global_batch=8 * gpus, micro_batch_size=4)
    both = _solve(profile, schedule="1f1b,interleaved-1f1b", **kw)
    alone = {"1f1b": _solve(profile, schedule="1f1b", **kw)}
    for v in range(2, 5):
        alone[f"interleaved-1f1b x{v}"] = _solve(profile, schedule="interleaved-1f1b", chunks_per_rank=v, **kw)
    steps = {}
    for name, lp in alone.items():
        for r in lp.rows:
            if r.step_s is not None and r.status in ("best", "slower"):
                schedule = "1f1b" if r.layout.pp == 1 else name
                steps[(r.layout.tp, r.layout.pp, r.layout.dp, r.layout.zero, r.layout.micro_batches, schedule)] = r.step_s
    items = {}
    for r in both.rows:
        lay = r.layout
        assert lay.schedule == "1f1b" if lay.pp == 1 else lay.schedule in ("1f1b", "interleaved-1f1b")
        name = lay.schedule + (f" x{lay.chunks_per_rank}" if lay.chunks_per_rank > 1 else "")
        key = (lay.tp, lay.pp, lay.dp, lay.zero, lay.micro_batches, name)
        assert key not in items
        items[key] = r
        if lay.pp > 1 and lay.schedule == "interleaved-1f1b":
            assert 2 <= lay.chunks_per_rank <= 4 and lay.pp * lay.chunks_per_rank <= layers
        if r.step_s is not None and r.status in ("best", "slower"):
            assert r.step_s == pytest.approx(steps[key]), r
            assert r.schedule == lay.schedule and r.chunks_per_rank == lay.chunks_per_rank
    piped = {k[:5] for k in items if k[1] > 1}
    assert piped and all(k + ("1f1b",) in items for k in piped)
    assert all(k + (f"interleaved-1f1b x{v}",) in items for k in piped for v in range(2, 5) if k[1] * v <= layers)
    assert both.best is not None and both.best.step_s == pytest.approx(min(steps.values()))
    assert both.proven
    path = tmp_path / "stack.json"
    save_profile(profile, path)
    base = ("layouts", path, "--gpus", gpus, "--global-batch", 8 * gpus, "--micro-batch-size", 4,
            "--target", "h100-80gb")
    code, out, _ = run_cli(capsys, *base, "--schedule", "1f1b,interleaved-1f1b", "--format", "json")
    assert code == 0
    rows = json.loads(out)["rows"]
    assert [(r["schedule"], r["chunks_per_rank"], r["status"]) for r in rows] == \
        [(r.layout.schedule, r.layout.chunks_per_rank, r.status) for r in both.rows]
    code, out, _ = run_cli(capsys, *base, "--schedule", "1f1b,interleaved-1f1b")
    assert code == 0 and " schedule " in out
    best = both.best.layout
    assert f"best: {best.describe()}\n" in out
    if best.pp > 1:
        assert best.describe().endswith(", " + best.schedule + (f" x{best.chunks_per_rank}"
                                                               if best.chunks_per_rank > 1 else ""))
    # solve --layout auto and sweep --gpus take the list too: the plan is the best item's, under its schedule
    plan = tmp_path / "plan.json"
    code, out, _ = run_cli(capsys, "solve", path, "--layout", "auto", *base[2:], "--schedule", "1f1b,interleaved-1f1b",
                           "--out", plan)
    assert code == 0 and f"best: {best.describe()}\n" in out
    written = json.loads(plan.read_text())["schedule"]
    assert (written["kind"], written["chunks_per_rank"], written["micro_batches"]) == \
        (best.schedule if best.pp > 1 else "1f1b", max(best.chunks_per_rank, 1), best.micro_batches)
    code, out, _ = run_cli(capsys, "sweep", path, "--gpus", f"{gpus}..{gpus}", *base[4:], "--schedule",
                           "1f1b,interleaved-1f1b", "--format", "json")
    swept = json.loads(out)["rows"][0]["layouts"]
    assert code == 0 and swept["schedule"] == "1f1b,interleaved-1f1b"
    assert swept["best"]["step_s"] == pytest.approx(both.best.step_s)


def test_a_schedule_list_with_auto_or_an_unknown_name_is_refused(stack, tmp_path, capsys):
    from stagesplit.io import save_profile
    from tests.helpers import run_cli
    with pytest.raises(OptionError, match="auto searches every schedule itself"):
        _solve(stack, gpus=4, global_batch=32, schedule="1f1b,auto")
    with pytest.raises(OptionError, match="schedule: expected one of"):
        _solve(stack, gpus=4, global_batch=32, schedule=["1f1b", "zigzag"])
    path = tmp_path / "stack.json"
    save_profile(stack, path)
    code, out, err = run_cli(capsys, "layouts", path, "--gpus", 4, "--global-batch", 32, "--target", "h100-80gb",
                             "--schedule", "1f1b,zigzag")
    assert code == 2 and out == "" and err.count("\n") == 1 and "--schedule" in err and "zigzag" in err
    # solve and sweep without the layout search take one schedule: a list is refused there, saying whose it is
    for command in (("solve", path, "--devices", 2), ("sweep", path, "--devices", "2..4")):
        code, out, err = run_cli(capsys, *command, "--schedule", "1f1b,zbv")
        assert code == 2 and out == "" and err.count("\n") == 1, err
        assert "several schedules are the layout search's" in err and "give one" in err
    code, out, err = run_cli(capsys, "solve", path, "--layout", "auto", "--gpus", 4, "--global-batch", 32,
                             "--target", "h100-80gb", "--schedule", "1f1b,auto")
    assert code == 2 and "auto searches every schedule itself" in err, err
