"""A layer's measured compute given by phase (``--layer-compute`` values ``{forward, backward,
optimizer}``; common/layerfigures.py, issue #32): each phase of the layer takes its own figure, the
backward's shared between its input and weight gradients as their operations are; a step prices the
forward and backward once per micro-batch and the optimizer once, by hand; the plan records the
figures and reads them back; a layer given a phase it has no operations of, or a profile without
phases, is refused in one line, as are malformed figures."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stagesplit import api
from stagesplit.errors import StagesplitError
from stagesplit.io.profile import Phase
from tests.helpers import refused_line, run_cli

torch = pytest.importorskip("torch")

from linear_stack import linear_stack  # noqa: E402

PEAK = 989e12                  # h100-80gb's FLOP/s (configs/targets.yaml)
#: forward, backward and optimizer FLOPs of the stack's four layers (each unlike its capture)
PHASES = {"0": (2e9, 4e9, 1e9), "1": (3e9, 5e9, 2e9), "2": (1e9, 3e9, 5e8), "3": (4e9, 6e9, 3e9)}


def _mapping(figures: dict) -> dict:
    return {name: {"forward": f, "backward": b, "optimizer": o} for name, (f, b, o) in figures.items()}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from stagesplit.io import save_profile
    d = tmp_path_factory.mktemp("phases")
    save_profile(linear_stack(), d / "stack.json")
    (d / "phases.yaml").write_text(json.dumps(_mapping(PHASES)))
    return d


def _backward_split(analysis, layer: int) -> float:
    """The share of a layer's captured backward compute that is its input gradients' (B), from the
    profile's own operations."""
    ops = analysis.profile.operations
    mine = np.asarray(analysis.layers.op_layer) == layer
    compute = np.nan_to_num(np.asarray(ops.compute, float))
    b = compute[mine & (np.asarray(ops.phase) == Phase.BACKWARD_INPUT)].sum()
    w = compute[mine & (np.asarray(ops.phase) == Phase.BACKWARD_WEIGHT)].sum()
    return float(b / (b + w))


def test_each_phase_takes_its_figure(files):
    """In the profile's compute unit: forward, B + W and optimizer of each layer are its three
    figures, B and W in the proportion of their captured operations; the layer's total is their sum.
    A layer given a total keeps the model's own shares (of that total)."""
    analysis = api.analyze(str(files / "stack.json"))
    model = analysis.model.with_compute({"0": PHASES["0"], "1": PHASES["1"], "2": 9e9})
    times = model.phase_table.layer_times          # (L, 4): forward, B, W, optimizer
    for layer in (0, 1):
        f, b, o = PHASES[str(layer)]
        share = _backward_split(analysis, layer)
        assert share == 0 if layer == 0 else 0 < share < 1      # the first layer's input needs no gradient
        assert times[layer].tolist() == pytest.approx([f, b * share, b * (1 - share), o], rel=1e-12)
        assert model.layer_compute[layer] == pytest.approx(f + b + o, rel=1e-15)
    assert times[2].sum() == pytest.approx(9e9, rel=1e-12)
    plain = analysis.model.with_compute({"2": 9e9}).phase_table.layer_times
    assert times[2].tolist() == pytest.approx(plain[2].tolist(), rel=1e-12)
    # the analysis's own model is untouched
    assert np.isnan(analysis.model.layer_phase_share).all()


def test_on_a_target_each_phase_is_its_figure_at_the_flop_rate(files):
    analysis = api.analyze(str(files / "stack.json"))
    model = analysis.model.with_compute(PHASES).on(api.target("h100-80gb"))
    times = model.phase_table.layer_times
    assert model.phase_table.time_unit == "seconds"
    for layer, (f, b, o) in enumerate(PHASES.values()):
        assert [times[layer, 0], times[layer, 1] + times[layer, 2], times[layer, 3]] == \
            pytest.approx([f / PEAK, b / PEAK, o / PEAK], rel=1e-12)


def test_a_model_timed_on_a_target_is_made_once_per_target_and_efficiency(files):
    """``on`` gives the same timed model (and so one phase table, whose memo the schedules' searches
    share) for the same target and efficiency, another for another, and none to a model made from it."""
    model = api.analyze(str(files / "stack.json")).model
    h100, a100 = api.target("h100-80gb"), api.target("a100-80gb")
    timed = model.on(h100)
    assert model.on(h100) is timed and model.on(api.target("h100-80gb")) is timed
    assert model.on(h100, 0.5) is not timed and model.on(a100) is not timed
    assert timed.phase_table is model.on(h100).phase_table
    assert model.on(a100).phase_table.layer_times[0, 0] > timed.phase_table.layer_times[0, 0]   # the slower GPU
    assert "_timed" not in timed.__dict__ or timed.__dict__["_timed"] is not model.__dict__["_timed"]

@pytest.mark.parametrize("M", [1, 4])
def test_one_gpu_step_by_hand(files, capsys, M):
    """One GPU, one stage: the step is every layer's forward and backward M times and its optimizer
    once, each at the peak, whatever the roofline would have shared out; one layer's optimizer figure
    raised by 1e9 moves it by 1e9 FLOPs once, its forward by 1e9 FLOPs M times."""
    def step(figures: dict) -> float:
        path = files / f"figures-{M}.yaml"
        path.write_text(json.dumps(_mapping(figures)))
        code, out, err = run_cli(capsys, "layouts", files / "stack.json", "--target", "h100-80gb", "--format", "json",
                                 "--gpus", 1, "--global-batch", 8 * M, "--micro-batch-size", 8, "--layer-compute", path)
        assert code == 0, err
        return json.loads(out)["best"]["step_s"]
    base = step(PHASES)
    assert base == pytest.approx(sum(M * (f + b) + o for f, b, o in PHASES.values()) / PEAK, rel=1e-9)
    f, b, o = PHASES["2"]
    assert step(PHASES | {"2": (f, b, o + 1e9)}) - base == pytest.approx(1e9 / PEAK, rel=1e-6)
    assert step(PHASES | {"2": (f + 1e9, b, o)}) - base == pytest.approx(M * 1e9 / PEAK, rel=1e-6)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_a_pipelines_busy_time_by_hand(files, tmp_path, capsys, schedule):
    """Two stages (layers 0-1 | 2-3), four micro-batches: each rank is busy M x its layers' forward
    and backward and once their optimizer step; the plan records the figures by phase and reads them
    back (``--from-plan``: the same step)."""
    M = 4
    plan = tmp_path / "plan.json"
    code, _, err = run_cli(capsys, "solve", files / "stack.json", "--devices", 2, "--target", "h100-80gb",
                           "--layer-compute", files / "phases.yaml", "--schedule", schedule, "--micro-batches", M,
                           "--pin-split", 2, "--out", plan)
    assert code == 0, err
    doc = json.loads(plan.read_text())
    busy = [float(r["busy"]) for r in doc["schedule"]["ranks"]]
    want = [sum(M * (PHASES[k][0] + PHASES[k][1]) + PHASES[k][2] for k in stage) / PEAK for stage in (("0", "1"),
                                                                                                     ("2", "3"))]
    assert busy == pytest.approx(want, rel=1e-9)
    assert doc["request"]["layer_compute"] == _mapping(PHASES)
    again = tmp_path / "again.json"
    code, _, err = run_cli(capsys, "solve", "--from-plan", plan, files / "stack.json", "--out", again)
    assert code == 0, err
    assert json.loads(again.read_text())["schedule"]["step_time"] == doc["schedule"]["step_time"]


def test_the_api_takes_tuples_and_mappings(files):
    plan = api.solve(str(files / "stack.json"), devices=2, target="h100-80gb", pin_splits=["2"],
                     layer_compute={"0": PHASES["0"], "1": {"forward": 3e9, "backward": 5e9, "optimizer": 2e9}})
    assert dict(plan.inputs.request.layer_compute) == {"0": PHASES["0"], "1": PHASES["1"]}


def test_a_phase_with_no_operations_is_refused():
    """A layer with no parameters has no optimizer step: an optimizer figure above 0 for it names the
    layer and the phase; 0 is taken."""
    from stagesplit.capturing.pytorch import capture_model
    net = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16))
    from stagesplit.layers import LayerOptions
    analysis = api.analyze(capture_model(net, torch.empty(4, 16, device="meta"), name="relu"),
                           layering=LayerOptions(layer_regex=r"^(\d+)/"))
    relu = "1"
    with pytest.raises(StagesplitError, match=f"layer '{relu}' is given 1e\\+06 of optimizer, but it has no "
                                              "optimizer operations"):
        analysis.model.with_compute({relu: (1e6, 1e6, 1e6)})
    times = analysis.model.with_compute({relu: (1e6, 2e6, 0.0)}).phase_table.layer_times
    index = analysis.layers.names.index(relu)
    assert [times[index, 0], times[index, 1] + times[index, 2], times[index, 3]] == pytest.approx([1e6, 2e6, 0.0])


@pytest.mark.parametrize("value, field, expected", [
    ({"forward": 1, "backward": 2}, "0", "no optimizer"),
    ({"forward": 1, "backward": 2, "optimizer": 3, "weights": 4}, "0", "unknown field 'weights'"),
    ({"forward": 1, "backward": -2, "optimizer": 3}, "0.backward", "a number >= 0"),
    ({"forward": "fast", "backward": 2, "optimizer": 3}, "0.forward", "a number >= 0"),
])
def test_malformed_figures_are_refused_in_one_line(files, tmp_path, capsys, value, field, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(json.dumps({"0": value}))
    line = refused_line(capsys, "solve", files / "stack.json", "--devices", 2, "--layer-compute", path,
                        "--out", tmp_path / "plan.json")
    assert str(path) in line and field in line and expected in line, line
    assert not (tmp_path / "plan.json").exists()


def test_a_rank_of_another_degree_scales_each_phase_by_its_capture(files, tmp_path):
    """The layout search's rule (docs/layouts.md, "Measured per-layer compute"), phase by phase: a TP 2
    rank (the half-width stack) given degree 1's figures takes each phase's figure times its captured
    work over degree 1's, the forward and backward by their FLOPs (from each capture's operations) and
    the optimizer, whose step counts no FLOPs, by the bytes it moves: Adam's, per parameter, so about
    the ratio of the layers' parameters, (32 x 32 + 32) / (64 x 64 + 64) by hand (its step counter's
    few bytes apart)."""
    from stagesplit.io import save_profile
    save_profile(linear_stack(width=32), tmp_path / "half.json")
    full, half = api.analyze(str(files / "stack.json")), api.analyze(str(tmp_path / "half.json"))

    def flops(analysis, layer: int, phases) -> float:
        ops = analysis.profile.operations
        mine = (np.asarray(analysis.layers.op_layer) == layer) & np.isin(np.asarray(ops.phase), phases)
        return float(np.nan_to_num(np.asarray(ops.compute, float))[mine].sum())
    def moved(analysis, layer: int) -> float:
        ops = analysis.profile.operations
        mine = (np.asarray(analysis.layers.op_layer) == layer) & (np.asarray(ops.phase) == Phase.OPTIMIZER)
        return float(np.asarray(ops.bytes_accessed, float)[mine].sum())
    lp = api.layouts(str(files / "stack.json"), target="h100-80gb", gpus=2, global_batch=16, micro_batch_size=8,
                     tp=2, tp_profiles={2: str(tmp_path / "half.json")}, layer_compute=PHASES)
    given = dict(lp.plan.inputs.request.layer_compute)
    backward = (Phase.BACKWARD_INPUT, Phase.BACKWARD_WEIGHT)
    for layer, (name, (f, b, o)) in enumerate(PHASES.items()):
        forward_ratio = flops(half, layer, (Phase.FORWARD,)) / flops(full, layer, (Phase.FORWARD,))
        backward_ratio = flops(half, layer, backward) / flops(full, layer, backward)
        assert 0.2 < forward_ratio < 0.3 and 0.2 < backward_ratio < 0.3     # about a quarter
        optimizer_ratio = moved(half, layer) / moved(full, layer)
        assert optimizer_ratio == pytest.approx((32 * 32 + 32) / (64 * 64 + 64), rel=1e-3)   # and a step count's
        assert given[name] == pytest.approx((f * forward_ratio, b * backward_ratio, o * optimizer_ratio), rel=1e-12)


@pytest.mark.parametrize("value, subject", [({"forward": 1, "backward": -2, "optimizer": 3}, "['0'].backward"),
                                            ({"forward": 1}, "['0']"), (-1, "['0']")])
def test_the_api_names_the_parameter_the_layer_and_the_phase(files, value, subject):
    from stagesplit.errors import OptionError
    for call in (lambda: api.solve(str(files / "stack.json"), devices=2, layer_compute={"0": value}),
                 lambda: api.layouts(str(files / "stack.json"), target="h100-80gb", gpus=2, global_batch=16,
                                     micro_batch_size=8, layer_compute={"0": value})):
        with pytest.raises(OptionError) as excinfo:
            call()
        assert (excinfo.value.parameter, excinfo.value.subject) == ("layer_compute", subject)
        assert str(excinfo.value).startswith(f"layer_compute {subject}: expected ")
