"""Measured per-layer compute in the layout search (``layouts --layer-compute``, issue #32): the command
line's answer equals the functions the search calls for one combination given the same figures (the
path tests/steptime_harness.py took before it asked the command line), one layer's figure doubled
moves the step by what that layer's share of the step computes to by hand, the rule a rank of another
tensor-parallel degree or micro-batch size takes the figures by (docs/layouts.md, "Measured per-layer
compute"), the search's compute floor still a lower bound with figures given, the figures through
``solve --layout auto``, ``sweep --gpus`` and ``--compare``, and bad input in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stagesplit import api
from stagesplit.errors import OptionError
from tests.helpers import refused_line, run_cli

torch = pytest.importorskip("torch")

from linear_stack import linear_stack  # noqa: E402

#: the figures given for the stack's four layers, FLOPs (every one unlike the captured figure, so
#: that each is a replaced layer: timed at the FLOP rate, not by the roofline)
FIGURES = {"0": 3e9, "1": 5e9, "2": 7e9, "3": 4e9}
HALF = {"0": 1e9, "1": 2e9, "2": 2.5e9, "3": 1.5e9}
PEAK = 989e12                  # h100-80gb's FLOP/s (configs/targets.yaml)


#: the oracles here simulate 1F1B (conftest.py's ``search_under_1f1b``)
pytestmark = pytest.mark.usefixtures("search_under_1f1b")


def _stack(width: int, batch: int = 8):
    """Four Linear(width, width) layers captured on a micro-batch of ``batch`` (tests/linear_stack.py)."""
    return linear_stack(width=width, batch=batch)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The stack at TP 1, a rank of half its width given as TP 2, and the measured figures of each;
    the two captured again at the harness's micro-batch size in ``harness/`` (the profiles it solves
    as they are)."""
    import steptime_harness as harness
    from stagesplit.io import save_profile
    d = tmp_path_factory.mktemp("measured")
    save_profile(_stack(64), d / "stack.json")
    save_profile(_stack(32), d / "half.json")
    (d / "harness").mkdir()
    save_profile(_stack(64, harness.BATCH), d / "harness" / "stack.json")
    save_profile(_stack(32, harness.BATCH), d / "harness" / "half.json")
    (d / "layers.yaml").write_text(json.dumps(FIGURES))
    (d / "layers-tp2.yaml").write_text(json.dumps(HALF))
    return d


def _layouts(files, capsys, *flags, stack: str = "stack.json"):
    code, out, err = run_cli(capsys, "layouts", files / stack, "--target", "h100-80gb", "--format", "json",
                             *flags)
    assert code == 0, err
    return json.loads(out)


@pytest.mark.parametrize("tp, pp, dp", [(1, 2, 1), (1, 1, 2), (2, 1, 1), (1, 4, 1)])
def test_the_command_line_gives_the_functions_figures(files, capsys, tp, pp, dp):
    """``layouts --layer-compute`` with every degree fixed answers what the search's own calls for
    that combination answer (tests/steptime_harness.py's ``layout_step``: ``solve_request``, the
    engine's solve with the figures as ``solve --layer-compute`` gives them, ``step_of``): the same
    step, pipeline step, communication and split."""
    import steptime_harness as harness
    M = 4
    at = files / "harness"
    degree = ["--tp-profile", f"2={at / 'half.json'}", "--tp-layer-compute", f"2={files / 'layers-tp2.yaml'}"] \
        if tp > 1 else []
    doc = _layouts(files, capsys, *degree, "--gpus", tp * pp * dp, "--tp", tp, "--pp", pp, "--dp", dp, "--zero", 0,
                   "--global-batch", harness.BATCH * M, "--micro-batch-size", harness.BATCH,
                   "--layer-compute", files / "layers.yaml", stack="harness/stack.json")
    assert (doc["captured_batch"], doc["captured_from"]) == (harness.BATCH, "recorded")
    profile, layers = (at / "half.json", files / "layers-tp2.yaml") if tp > 1 else \
        (at / "stack.json", files / "layers.yaml")
    step, pipeline, tp_s, dp_s, plan = harness.layout_step(profile, "h100-80gb", layers, tp, pp, dp, M)
    best = doc["best"]
    assert (best["tp"], best["pp"], best["dp"], best["micro_batches"]) == (tp, pp, dp, M // dp)
    assert best["step_s"] == pytest.approx(step, rel=1e-12)
    assert best["pipeline_s"] == pytest.approx(pipeline, rel=1e-12)
    assert (best["tp_comm_s"], best["dp_comm_s"]) == (pytest.approx(tp_s, rel=1e-12), pytest.approx(dp_s, rel=1e-12))
    assert doc["split"] == plan.split_text
    assert doc["stages"] == [[s.first_layer, s.last_layer] for s in plan.stages]
    if dp > 1:
        assert best["dp_comm_s"] > 0


def _phase_share(profile, layer: str) -> float:
    """The share of a replaced layer's time the model gives its forward and backward (model/phases.py:
    in proportion to its operations' roofline seconds on the target), from the roofline's own times."""
    from stagesplit.io.profile import Phase
    from stagesplit.model.roofline import operation_times
    a = api.analyze(profile)
    compute, memory = operation_times(a.profile, a.model.op_compute, api.target("h100-80gb"))
    seconds = np.maximum(compute, memory)
    ops = a.profile.operations
    mine = np.asarray(a.layers.op_layer) == a.layers.names.index(layer)
    phase = np.asarray(ops.phase)
    fb = mine & np.isin(phase, (Phase.FORWARD, Phase.BACKWARD_INPUT, Phase.BACKWARD_WEIGHT))
    opt = mine & (phase == Phase.OPTIMIZER)
    return float(seconds[fb].sum() / (seconds[fb].sum() + seconds[opt].sum()))


@pytest.mark.parametrize("M", [1, 4])
def test_one_layers_figure_doubled_moves_the_step_by_hand(files, tmp_path, capsys, M):
    """One GPU, one stage, DDP of none: the step is every layer's forward and backward M times and
    its optimizer step once. Layer 2's figure doubled (7e9 -> 14e9 FLOPs) adds 7e9 FLOPs at the peak,
    of which the forward-and-backward share runs M times and the rest once."""
    doubled = tmp_path / "doubled.yaml"
    doubled.write_text(json.dumps(FIGURES | {"2": 2 * FIGURES["2"]}))
    flags = ("--gpus", 1, "--global-batch", 8 * M, "--micro-batch-size", 8)
    before = _layouts(files, capsys, *flags, "--layer-compute", files / "layers.yaml")["best"]["step_s"]
    after = _layouts(files, capsys, *flags, "--layer-compute", doubled)["best"]["step_s"]
    s = _phase_share(files / "stack.json", "2")
    assert 0 < s < 1                           # Adam's step on the layer's weights takes its part
    assert after - before == pytest.approx(FIGURES["2"] / PEAK * (M * s + (1 - s)), rel=1e-9)
    if M == 1:                                 # the whole figure once
        assert after - before == pytest.approx(7e9 / PEAK, rel=1e-9)


def test_a_rank_of_another_degree_or_size_takes_the_figures_scaled_by_its_capture(files):
    """The rule: a TP 2 rank given no figures of its own takes degree 1's times its captured compute
    over degree 1's, layer by layer (here the half-width stack: a quarter of every matrix product,
    so a quarter of each figure); given its own (``tp_layer_compute``), it takes them as they are;
    at half the captured micro-batch the forward and backward halve (the stack's Adam counts no
    FLOPs: the whole figure halves)."""
    stack, half = str(files / "stack.json"), str(files / "half.json")
    full, quarter = api.analyze(stack).model.layer_compute, api.analyze(half).model.layer_compute
    assert np.allclose(quarter / full, 0.25)
    kw = dict(target="h100-80gb", gpus=2, global_batch=16, micro_batch_size=8, tp=2, tp_profiles={2: half})
    lp = api.layouts(stack, layer_compute=FIGURES, **kw)
    assert dict(lp.plan.inputs.request.layer_compute) == pytest.approx({k: v / 4 for k, v in FIGURES.items()})
    lp = api.layouts(stack, layer_compute=str(files / "layers.yaml"), tp_layer_compute={2: HALF}, **kw)
    assert dict(lp.plan.inputs.request.layer_compute) == HALF
    lp = api.layouts(stack, gpus=1, global_batch=8, micro_batch_size=4, captured_batch=8, target="h100-80gb",
                     layer_compute=str(files / "layers.yaml"))
    request = lp.plan.inputs.request
    assert dict(request.layer_compute) == pytest.approx({k: v / 2 for k, v in FIGURES.items()})
    assert request.layer_compute_source == str(files / "layers.yaml")        # the plan records the file
    assert lp.plan.inputs.layer_compute_sha256 is not None


def test_the_search_is_the_best_of_every_layout_alone_with_figures(files):
    """With measured figures (and every micro-batch size searched, so that the figures are scaled),
    the search's best is the fastest of every combination searched on its own (every degree and the
    size fixed: nothing to cut off), and each combination's compute floor with the figures
    (``_measured_work`` x micro-batches / stages) is at most its step: a lower bound."""
    from fractions import Fraction

    from stagesplit.plan.layouts import _measured_work
    stack = str(files / "stack.json")
    kw = dict(target="h100-80gb", global_batch=16, layer_compute=FIGURES, time_limit=60, captured_batch=8)
    lp = api.layouts(stack, gpus=4, **kw)
    assert lp.best is not None and lp.proven
    base = {1: api.analyze(stack)}
    alone = {}
    for r in lp.rows:
        lay = r.layout
        one = api.layouts(stack, gpus=4, tp=lay.tp, pp=lay.pp, dp=lay.dp, zero=lay.zero,
                          micro_batch_size=lay.micro_batch_size, **kw)
        if one.best is None:
            assert r.status in ("refused", "memory")
            continue
        alone[lay] = one.best.step_s
        ratio = Fraction(lay.micro_batch_size, 8)
        floor = _measured_work(lp.request, 1, base, ratio, 1 / PEAK) * lay.micro_batches / lay.pp
        assert 0 < floor <= one.best.pipeline_s * (1 + 1e-12)
        if r.status == "best":
            assert r.step_s == pytest.approx(one.best.step_s, rel=1e-12)
    assert lp.best.step_s == pytest.approx(min(alone.values()), rel=1e-12)


def test_solve_layout_auto_sweep_and_compare_take_the_figures(files, tmp_path, capsys):
    """``solve --layout auto --layer-compute`` writes the best layout's plan with its figures (as
    ``solve --layer-compute`` records them), and its step is ``layouts``'; ``sweep --gpus`` and
    ``layouts --compare`` price with the same figures."""
    from stagesplit.plan.files import read_plan
    figures = ("--layer-compute", files / "layers.yaml")
    base = ("--global-batch", 16, "--micro-batch-size", 8, "--target", "h100-80gb")
    doc = _layouts(files, capsys, "--gpus", 2, "--global-batch", 16, "--micro-batch-size", 8, *figures)
    plain = _layouts(files, capsys, "--gpus", 2, "--global-batch", 16, "--micro-batch-size", 8)
    assert doc["best"]["step_s"] > 10 * plain["best"]["step_s"]       # 19e9 FLOPs a micro-batch, not 0.7e6
    out = tmp_path / "plan.json"
    code, text, err = run_cli(capsys, "solve", files / "stack.json", "--layout", "auto", "--gpus", 2, *base, *figures,
                              "--out", out, "--format", "json")
    assert code == 0, err
    assert json.loads(text)["layouts"]["best"]["step_s"] == pytest.approx(doc["best"]["step_s"], rel=1e-12)
    plan = read_plan(out)
    assert dict(plan.inputs.request.layer_compute) == FIGURES
    # a TP 2 rank's plan records the figures it took (a quarter of degree 1's), and solves again the same
    out2 = tmp_path / "plan-tp2.json"
    code, _, err = run_cli(capsys, "solve", files / "stack.json", "--layout", "auto", "--gpus", 2, "--tp", 2,
                           "--tp-profile", f"2={files / 'half.json'}", *base, *figures, "--out", out2)
    assert code == 0, err
    assert dict(read_plan(out2).inputs.request.layer_compute) == pytest.approx({k: v / 4 for k, v in FIGURES.items()})
    code, text, err = run_cli(capsys, "solve", "--from-plan", out2, files / "half.json")
    assert code == 0 and "reproduced: the split is identical" in text, err
    code, text, err = run_cli(capsys, "sweep", files / "stack.json", "--gpus", "2", *base, *figures,
                              "--format", "json")
    assert code == 0, err
    row = json.loads(text)["rows"][0]["layouts"]
    assert row["best"]["step_s"] == pytest.approx(doc["best"]["step_s"], rel=1e-12)
    code, text, err = run_cli(capsys, "layouts", files / "stack.json", "--gpus", 2, *base, *figures, "--compare",
                              "--format", "json")
    assert code == 0, err
    compared = json.loads(text)
    fsdp = api.layouts(str(files / "stack.json"), gpus=2, global_batch=16, micro_batch_size=1, captured_batch=8,
                       tp=1, pp=1, dp=2, zero=3, target="h100-80gb", layer_compute=FIGURES)
    row = next(r for r in compared["compared"] if r["name"] == "pure FSDP")
    assert row["step_s"] == pytest.approx(fsdp.best.step_s, rel=1e-12)


@pytest.mark.parametrize("flags, line", [
    (["--layer-compute", "{bad}"], "{bad}: expected a mapping of layer names to compute figures"),
    (["--tp-layer-compute", "2"], "--tp-layer-compute: expected T=FILE"),
    (["--tp-layer-compute", "2={tp2}"], "--tp-layer-compute: measured compute is given for tensor-parallel degree 2, "
                                        "but no rank of that degree was given (degrees: 1)"),
    (["--tp-layer-compute", "1={tp2}"], "--tp-layer-compute: degree 1's measured compute is --layer-compute (the "
                                        "figures every other degree's ranks are scaled from)"),
    (["--tp-layer-compute", "2000={tp2}"], "--tp-layer-compute: expected an integer >= 2 and <= 1,024, got 2000"),
    (["--tp-profile", "2={half}", "--tp-layer-compute", "2={tp2}"],
     "--layer-compute: measured compute is given for tensor-parallel degree(s) 2 only: a rank of degree 1 takes"),
    (["--layer-compute", "{unknown}"], "no layer named 'ffn' in the rank of tensor-parallel degree 1 (layers: 0, 1, "
                                       "2, 3)"),
])
def test_bad_figures_one_line_exit_2(files, tmp_path, capsys, flags, line):
    bad, unknown = tmp_path / "bad.yaml", tmp_path / "unknown.yaml"
    bad.write_text("- 1\n- 2\n")
    unknown.write_text(json.dumps({"ffn": 1e9}))
    names = dict(bad=bad, unknown=unknown, tp2=files / "layers-tp2.yaml", half=files / "half.json")
    words = [w.format(**names) for w in flags]
    got = refused_line(capsys, "layouts", files / "stack.json", "--gpus", 2, "--global-batch", 16,
                       "--micro-batch-size", 8, "--target", "h100-80gb", *words)
    assert line.format(**names) in got, got


def test_the_api_refuses_bad_figures_naming_the_parameter(files):
    kw = dict(target="h100-80gb", gpus=2, global_batch=16, micro_batch_size=8)
    for value, parameter in (([1, 2], "layer_compute"), ({"0": -1}, "layer_compute")):
        with pytest.raises(OptionError) as excinfo:
            api.layouts(str(files / "stack.json"), layer_compute=value, **kw)
        assert excinfo.value.parameter == parameter
    with pytest.raises(OptionError) as excinfo:
        api.layouts(str(files / "stack.json"), tp_layer_compute=[HALF], **kw)
    assert excinfo.value.parameter == "tp_layer_compute"
