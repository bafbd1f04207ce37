"""Plots are written (PNG and SVG), readable with many stages, and refuse unknown formats."""

import numpy as np
import pytest

from stagesplit.plan.advise import advise, sweep
from stagesplit.errors import StagesplitError
from stagesplit.reporting.plot import plot_liveness, plot_plan, plot_sweep
from stagesplit.solver.problem import SolveOptions

from helpers import layer_model


def twenty_stage_plan():
    rng = np.random.default_rng(3)
    model = layer_model(rng.integers(1, 10, 40).tolist(), rng.integers(1, 9, 40).tolist())
    plan = advise(model, SolveOptions(devices=20, capacities=(30_000,) * 20)).plan
    totals = [model.stage_memory(s.first_layer, s.last_layer).total(s.in_flight) for s in plan.stages]
    return model, plan, totals


@pytest.mark.parametrize("suffix, magic", [(".png", b"\x89PNG"), (".svg", b"<?xml")])
def test_plan_plot_with_many_stages(tmp_path, suffix, magic):
    _, plan, totals = twenty_stage_plan()
    assert len(plan.stages) == 20
    path = tmp_path / f"plan{suffix}"
    plot_plan(plan, totals, path)
    data = path.read_bytes()
    assert data.startswith(magic) and len(data) > 10_000
    if suffix == ".svg":
        text = data.decode()
        for label in ("worst tile memory (MB)", "capacity per tile", "stage (layers)", "Compute per stage"):
            assert label in text


def test_sweep_and_liveness_plots(tmp_path):
    model, _, _ = twenty_stage_plan()
    rows = sweep(model, SolveOptions(devices=1, capacities=(30_000,)), [1, 8, 20])
    assert [r.fits for r in rows] == [False, True, True]
    plot_sweep(rows, tmp_path / "sweep.svg")
    assert "no split fits" in (tmp_path / "sweep.svg").read_text()
    plot_liveness(np.array([1, 5, 3]), np.array([True, False, True]), 10, 4, 20, 1, tmp_path / "l.png", "t")
    assert (tmp_path / "l.png").read_bytes()[:4] == b"\x89PNG"


def test_unknown_format_and_empty_plan(tmp_path):
    _, plan, totals = twenty_stage_plan()
    with pytest.raises(StagesplitError, match="PNG or SVG"):
        plot_plan(plan, totals, tmp_path / "plan.jpg")
    assert not (tmp_path / "plan.jpg").exists()
    plan.stages = []
    with pytest.raises(StagesplitError, match="no stages"):
        plot_plan(plan, [], tmp_path / "plan.png")
