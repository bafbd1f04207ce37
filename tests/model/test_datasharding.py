"""One data-parallel rank's memory under DDP and ZeRO 0-3 (model/datasharding.py).

Hand cases: a stack of four Linear(64, 64) layers, Adam, float32, captured with exact bytes; every
per-rank figure below is computed by hand from the layer sizes. Bad input: the options refused
with one line naming the option (exit 2 on the command line), a profile without roles refused
naming the profile. The decisive check, real processes measured per rank by torch's own trackers,
is tests/model/test_datasharding_real.py."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from helpers import PROFILES, refused_line, run_cli
from stagesplit.errors import OptionError, ProfileError
from stagesplit.model.analysis import Analysis
from stagesplit.model.datasharding import DataLayout, role_bytes, shard_profile
from stagesplit.solver.request import SolveRequest

torch = pytest.importorskip("torch")

W = 64 * 64 * 4                  # one layer's weight, bytes
B = 64 * 4                       # its bias
P = W + B                        # one layer's parameters: 16,640 bytes
LAYERS = 4
STEP = 4                         # Adam's step counter, one float32 per parameter tensor


@pytest.fixture(scope="module")
def linear_stack():
    from torch import nn

    from stagesplit.capturing.pytorch import capture_model
    with torch.device("meta"):
        model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(LAYERS)])
    profile = capture_model(model, torch.empty(8, 64, device="meta"), allocator_round=1, name="linear-stack")
    return profile, Analysis.of(profile)


def _named(profile, prefix: str) -> dict[str, int]:
    v = profile.variables
    return {profile.names[v.name[i]]: int(v.bytes[i]) for i in range(len(v))
            if v.name[i] >= 0 and profile.names[v.name[i]].startswith(prefix)}


def _shard(S: int, n: int) -> int:
    return -(-S // n)


def test_one_device_figures_by_hand(linear_stack):
    profile, analysis = linear_stack
    assert analysis.layers.names == ["0", "1", "2", "3"]
    roles = role_bytes(profile)
    assert (roles["param"], roles["grad"], roles["state"]) == (LAYERS * P, LAYERS * P, 2 * LAYERS * P + 2 * LAYERS * STEP)


@pytest.mark.parametrize("dp", [2, 4])
@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_per_rank_resident_bytes_by_hand(linear_stack, dp, zero):
    """Always-live bytes of one rank, by role, and the whole stage's resident figure."""
    profile, analysis = linear_stack
    rank = shard_profile(profile, analysis.layers, DataLayout(dp, zero))
    shard = (_shard(W, dp) + _shard(B, dp)) * LAYERS                    # every tensor's rank-0 share
    params = shard if zero == 3 else LAYERS * P
    grads = shard if zero >= 2 else LAYERS * P
    state = (2 * shard if zero >= 1 else 2 * LAYERS * P) + 2 * LAYERS * STEP   # step counters stay whole
    buckets = LAYERS * P if zero == 0 else 0                            # DDP's gradient buckets
    roles = role_bytes(rank)
    assert (roles["param"], roles["grad"], roles["state"], roles["other"]) == (params, grads, state, buckets)
    model = Analysis.of(profile, layout=DataLayout(dp, zero)).model
    assert model.stage_memory(0, LAYERS - 1).always_live[0] == params + grads + state + buckets
    # one layer alone: its own share
    layer_share = _shard(W, dp) + _shard(B, dp)
    one = (layer_share if zero == 3 else P) + (layer_share if zero >= 2 else P) + \
        (2 * layer_share if zero >= 1 else 2 * P) + 2 * STEP + (P if zero == 0 else 0)
    assert model.stage_memory(1, 1).always_live[0] == one


def test_zero3_buffers_by_hand(linear_stack):
    """FSDP2's buffers per layer: unsharded parameters, all-gather outputs, unsharded gradients and
    reduce-scatter inputs of a layer's full size, live where torch's source says."""
    profile, analysis = linear_stack
    rank = shard_profile(profile, analysis.layers, DataLayout(2, 3))
    for kind in ("unsharded parameters", "all-gather", "reduce-scatter"):
        sizes = _named(rank, f"fsdp/{kind}/")
        expected = {f"fsdp/{kind}/{k}": P for k in range(LAYERS)}
        if kind == "reduce-scatter":
            expected.pop(f"fsdp/{kind}/0")       # the first layer's backward is the last: nothing after it
        assert sizes == expected, kind
    grads = _named(rank, "unsharded gradients/")
    assert sorted(grads.values()) == sorted([W, B] * LAYERS)
    v = rank.variables
    unsharded = [i for i in range(len(v)) if rank.names[v.name[i]].startswith("fsdp/unsharded parameters/")]
    assert not np.any(v.always_live[unsharded])                   # resharded after the forward
    off = shard_profile(profile, analysis.layers, DataLayout(2, 3, reshard_after_forward=False))
    v = off.variables
    unsharded = [i for i in range(len(v)) if off.names[v.name[i]].startswith("fsdp/unsharded parameters/")]
    assert np.all(v.always_live[unsharded]) and int(v.bytes[unsharded].sum()) == LAYERS * P
    assert role_bytes(off)["other"] == LAYERS * P


def test_zero3_unsharded_parameters_live_in_their_layers_forward_and_backward(linear_stack):
    profile, analysis = linear_stack
    rank = shard_profile(profile, analysis.layers, DataLayout(2, 3))
    v = rank.variables
    ops = profile.operations
    # the group runs where its module does: the loss, grouped with the last layer, is outside it
    inside = np.array([name.split("/")[0] for name in ops.name])
    layer = np.where(inside == np.asarray(analysis.layers.op_layer).astype(str), np.asarray(analysis.layers.op_layer), -1)
    assert analysis.layers.module_paths == ["0", "1", "2", "3"]
    for k in range(LAYERS):
        i = int(np.flatnonzero(v.name == rank.names.index(f"fsdp/unsharded parameters/{k}"))[0])
        intervals = rank.liveness.intervals[int(v.live_class[i])].tolist()
        forward = np.flatnonzero((layer == k) & (ops.phase == 1))
        backward = np.flatnonzero((layer == k) & np.isin(ops.phase, (2, 3)))
        assert intervals == [[int(forward.min()), int(forward.max()) + 1],
                             [int(backward.min()), int(backward.max()) + 1]]


def test_one_rank_is_the_profile_itself(linear_stack):
    profile, analysis = linear_stack
    assert shard_profile(profile, analysis.layers, DataLayout(1, 0)) is profile


def test_layout_options_refused_naming_the_option():
    with pytest.raises(OptionError, match=r"^dp: expected an integer >= 1"):
        DataLayout(0)
    with pytest.raises(OptionError, match=r"^zero: expected one of 0, 1, 2, 3, got 4"):
        DataLayout(2, 4)
    with pytest.raises(OptionError, match=r"^zero: ZeRO 3 shards across data-parallel ranks"):
        DataLayout(1, 3)
    with pytest.raises(OptionError, match=r"^zero: ZeRO 3 shards"):
        SolveRequest(devices=2, zero=3)
    with pytest.raises(OptionError, match=r"^reshard_after_forward: expected true or false"):
        SolveRequest(devices=2, dp=2, zero=3, reshard_after_forward="yes")
    assert SolveRequest(devices=2, dp=2, zero=3, reshard_after_forward="off").reshard_after_forward is False


@pytest.mark.parametrize("flags, line", [
    (["--zero", "3"], "--zero: ZeRO 3 shards across data-parallel ranks: give dp >= 2 with it"),
    (["--dp", "0"], "--dp: expected an integer >= 1 and <= 1,048,576, got 0"),
    (["--dp", "2", "--zero", "4"], "--zero: expected an integer >= 0 and <= 3, got 4"),
    (["--dp", "2", "--reshard-after-forward", "maybe"],
     "solve: argument --reshard-after-forward: invalid choice: 'maybe' (choose from 'on', 'off')"),
])
def test_bad_options_one_line_exit_2(capsys, tmp_path, flags, line):
    out = tmp_path / "plan.json"
    assert refused_line(capsys, "solve", PROFILES / "gpt-captured.stagesplit", "--devices", 2, *flags,
                        "--out", out) == line
    assert not out.exists()


def test_a_profile_without_roles_is_refused_naming_it(capsys, tmp_path):
    path = PROFILES / "gpt-captured.stagesplit"          # captured before roles were recorded
    line = refused_line(capsys, "solve", path, "--devices", 2, "--dp", 2, "--out", tmp_path / "p.json")
    assert line.startswith(f"{path}: variables.role: expected the roles of its variables"), line
    from stagesplit.io import load_profile
    profile = load_profile(path)
    with pytest.raises(ProfileError, match="variables.role"):
        Analysis.of(profile, layout=DataLayout(2, 1))


def test_solve_text_names_the_layout_the_plan_records(capsys, tmp_path, linear_stack):
    from stagesplit.io import save_profile
    profile, _ = linear_stack
    path = tmp_path / "stack.stagesplit"
    save_profile(profile, path)
    plan_path = tmp_path / "plan.json"
    code, out, err = run_cli(capsys, "solve", path, "--devices", 2, "--dp", 4, "--zero", 3,
                             "--reshard-after-forward", "off", "--out", plan_path)
    assert code == 0, err
    from stagesplit.plan.files import read_plan
    plan = read_plan(plan_path)
    request = plan.inputs.request
    assert (request.dp, request.zero, request.reshard_after_forward) == (4, 3, False)
    line = next(line for line in out.splitlines() if line.startswith("data parallel: "))
    assert line == (f"data parallel: {request.dp} data-parallel ranks, ZeRO-{request.zero} (FSDP2, one group per "
                    "layer): parameters, gradients and optimizer state sharded, no reshard after forward; figures "
                    "per rank")
    # the plan's figures are one rank's: the stage memory the plan reports is the sharded model's
    layout = request.data_layout()
    model = Analysis.of(profile, layout=layout).model
    assert plan.stages
    for stage in plan.stages:
        assert stage.worst_tile_bytes == model.stage_memory(stage.first_layer, stage.last_layer).worst_bytes()
    # the HTML report says it too, as solve does
    from stagesplit.reporting.html import report_html
    assert f'<p class="sub">{line}</p>' in report_html(plan)
    code, out, err = run_cli(capsys, "solve", path, "--devices", 2, "--out", tmp_path / "plain.json")
    assert code == 0 and "data parallel" not in out
    # diagnose takes the plan's layout: its model is the rank's, as the plan's figures are
    from stagesplit import api
    diagnosed = api.diagnose(path, plan=plan_path)
    assert diagnosed.model.stage_memory(0, LAYERS - 1).worst_bytes() == \
        model.stage_memory(0, LAYERS - 1).worst_bytes()
    assert any(name.startswith("fsdp/") for name in diagnosed.model.profile.names)


def test_breakdown_shows_each_category_per_zero_stage_by_hand(linear_stack, capsys, tmp_path):
    from stagesplit import api
    from stagesplit.io import save_profile
    profile, _ = linear_stack
    result = api.breakdown(profile, dp=2)
    rows = result.data_parallel_rows(2)
    half = LAYERS * P // 2
    full = LAYERS * P
    steps = 2 * LAYERS * STEP
    assert [(name, r["param"], r["grad"], r["state"], r["other"]) for name, r, _ in rows] == [
        ("one device", full, full, 2 * full + steps, 0),
        ("ZeRO 0 (DDP)", full, full, 2 * full + steps, full),
        ("ZeRO 1", full, full, 2 * half + steps, 0),
        ("ZeRO 2", full, half, 2 * half + steps, 0),
        ("ZeRO 3", half, half, 2 * half + steps, 0),
        ("ZeRO 3, no reshard after forward", half, half, 2 * half + steps, full)]
    layouts = [DataLayout(), DataLayout(2, 0), DataLayout(2, 1), DataLayout(2, 2), DataLayout(2, 3),
               DataLayout(2, 3, reshard_after_forward=False)]
    for (_, _, peak), layout in zip(rows, layouts):
        model = Analysis.of(profile, layout=layout).model
        assert peak == model.stage_memory(0, LAYERS - 1).worst_bytes()
    # the command line prints the same rows, and refuses a degree below 2 and a profile without roles
    path = tmp_path / "stack.stagesplit"
    save_profile(profile, path)
    code, out, err = run_cli(capsys, "breakdown", path, "--dp", 2, "--ipu-columns")
    assert code == 0, err
    table = out[out.index("One rank of 2 data-parallel ranks"):].splitlines()
    assert "parameters (KiB)" in table[2]                       # bytes shown in KiB at this size

    def kib(x: int) -> str:
        return f"{x / 1024:,.2f}"
    assert table[4].split() == ["one", "device", kib(full), kib(full), kib(2 * full + steps), kib(0), kib(rows[0][2])]
    assert table[8].split()[:6] == ["ZeRO", "3", kib(half), kib(half), kib(2 * half + steps), kib(0)]
    assert refused_line(capsys, "breakdown", path, "--zero", 3) == \
        "--zero: ZeRO 3 shards across data-parallel ranks: give dp >= 2 with it"
    code, out, _ = run_cli(capsys, "breakdown", path, "--dp", 1)
    assert code == 0 and "data-parallel" not in out
    # with --zero, every other table is that rank's
    ranked = api.breakdown(profile, dp=2, zero=3)
    assert ranked.whole.worst_bytes() == rows[4][2]
    assert api.breakdown(profile, dp=2, zero=3, reshard_after_forward="off").whole.worst_bytes() == rows[5][2]
    assert refused_line(capsys, "breakdown", PROFILES / "gpt-captured.stagesplit", "--dp", 2).endswith(
        "gpt-captured.stagesplit: variables.role: expected the roles of its variables (parameter, gradient, "
        "optimizer state) to shard them across data-parallel ranks; capture it again with this version")


@pytest.mark.parametrize("layout, line", [
    (DataLayout(), "no data parallelism"),
    (DataLayout(2, 0), "2 data-parallel ranks, DDP: parameters, gradients and optimizer state replicated, gradient "
                       "buckets; figures per rank"),
    (DataLayout(8, 1), "8 data-parallel ranks, ZeRO-1: optimizer state sharded (rules composed from Megatron's and "
                       "DeepSpeed's documented behaviour, not measured); figures per rank"),
    (DataLayout(4, 2), "4 data-parallel ranks, ZeRO-2: optimizer state and gradients sharded (rules composed from "
                       "Megatron's and DeepSpeed's documented behaviour, not measured); figures per rank"),
    (DataLayout(2, 3), "2 data-parallel ranks, ZeRO-3 (FSDP2, one group per layer): parameters, gradients and "
                       "optimizer state sharded, reshard after forward; figures per rank"),
])
def test_the_layout_line_says_what_the_request_asks(layout, line):
    assert layout.describe() == line


def test_layouts_page_shows_the_line_solve_prints():
    from helpers import ROOT
    page = (ROOT / "docs" / "layouts.md").read_text()
    assert "data parallel: " + DataLayout(2, 3).describe() + "\n" in page


def test_shares_of_a_gpu_capture_are_rounded_as_the_allocator_rounds():
    """Captured with the CUDA allocator's 512-byte rounding, each shard is rounded up to 512 again:
    the bias (256 bytes, stored as 512) becomes 512 on each rank, the weight 16,384 / 4 = 4,096."""
    from torch import nn

    from stagesplit.capturing.pytorch import capture_model
    with torch.device("meta"):
        model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(LAYERS)])
    profile = capture_model(model, torch.empty(8, 64, device="meta"), allocator_round=512, name="rounded")
    rank = shard_profile(profile, Analysis.of(profile).layers, DataLayout(4, 3))
    roles = role_bytes(rank)
    assert roles["param"] == roles["grad"] == LAYERS * (W // 4 + 512)
    assert roles["state"] == LAYERS * 2 * (W // 4 + 512) + 2 * LAYERS * 512     # step counters: 4 bytes, stored as 512


@pytest.mark.parametrize("dp", [2, 4])
@pytest.mark.parametrize("zero", [2, 3])
def test_under_a_pipeline_schedule_the_whole_gradients_are_held_beside_their_shards(linear_stack, dp, zero):
    """torch's pipeline runtime keeps an FSDP stage's gradients whole and unsynchronised until the last
    micro-batch, then reduce-scatters them: a rank holds every layer's whole gradient (4 x 16,640 bytes)
    all step, and beside it the gradient shard the reduce-scatter writes (one per layer: the layer's
    bytes over dp, as one share); the parameters and optimizer state are sharded as without a pipeline
    (ZeRO 3's parameters per tensor, ZeRO 2's whole)."""
    profile, analysis = linear_stack
    rank = shard_profile(profile, analysis.layers, DataLayout(dp, zero, pipelined=True))
    shard = (_shard(W, dp) + _shard(B, dp)) * LAYERS
    roles = role_bytes(rank)
    assert roles["grad"] == LAYERS * P
    assert roles["param"] == (shard if zero == 3 else LAYERS * P)
    assert roles["state"] == 2 * shard + 2 * LAYERS * STEP
    shards = LAYERS * _shard(P, dp)
    model = Analysis.of(profile, layout=DataLayout(dp, zero, pipelined=True)).model
    assert model.stage_memory(0, LAYERS - 1).always_live[0] == \
        roles["param"] + LAYERS * P + roles["state"] + shards
    assert "accumulates the gradients whole until the last backward" in \
        DataLayout(dp, zero, pipelined=True).describe()
    assert SolveRequest(devices=2, dp=dp, zero=zero, schedule="1f1b").data_layout().pipelined
    assert not SolveRequest(devices=2, dp=dp, zero=zero).data_layout().pipelined


def _phase_arrays(table) -> dict[str, np.ndarray]:
    """Every array of a phase table, by name (the peaks by kind)."""
    out = {}
    for field in dataclasses.fields(table):
        value = getattr(table, field.name)
        if isinstance(value, dict):
            out.update({f"{field.name}.{k}": np.asarray(v) for k, v in value.items()})
        elif isinstance(value, np.ndarray):
            out[field.name] = value
    return out


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_a_rank_priced_after_another_degree_gets_the_figures_priced_alone(linear_stack, zero):
    """The layout search prices one rank under many data-parallel degrees; the liveness sweeps that
    do not change with the degree (every phase's but the optimizer step's, whose temporaries are
    sharded) are remembered by what they read (model/pricing.py ``_SweepMemo``). Priced after dp 2,
    the dp 4 rank's phase table equals the one priced with nothing remembered, and only its optimizer
    sweep was priced again."""
    from stagesplit.model import pricing
    profile, analysis = linear_stack

    def table(dp: int):
        return Analysis.of(profile, layout=DataLayout(dp, zero)).model.phase_table
    pricing._SWEEPS.clear()
    table(2)
    before = len(pricing._SWEEPS)
    warm = _phase_arrays(table(4))
    assert len(pricing._SWEEPS) - before == 1          # the optimizer step's sweep alone
    pricing._SWEEPS.clear()
    cold = _phase_arrays(table(4))
    assert warm.keys() == cold.keys() and len(cold) > 5
    for name in cold:
        assert np.array_equal(warm[name], cold[name]), name
    # the two degrees do differ where the shares are: the resident bytes
    assert not np.array_equal(_phase_arrays(table(2))["resident"], cold["resident"])
