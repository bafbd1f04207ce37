"""Plots are written (PNG and SVG), readable with many stages, and refuse unknown formats."""

import numpy as np
import pytest

from helpers import layer_model
from indexed_inputs import indexed_inputs
from stagesplit.errors import StagesplitError
from stagesplit.plan.advise import advise
from stagesplit.plan.sweep import sweep
from stagesplit.reporting.plot import plan_figure, plot_liveness, plot_plan, plot_sweep
from stagesplit.solver.problem import SolveOptions


def twenty_stage_plan():
    rng = np.random.default_rng(3)
    model = layer_model(rng.integers(1, 10, 40).tolist(), rng.integers(1, 9, 40).tolist())
    plan = advise(model, indexed_inputs(model, SolveOptions(devices=20, capacities=(30_000,) * 20))).plan
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
        # a one-tile A100 profile: device memory in GiB, no tile wording
        for label in ("device memory (GiB)", "capacity", "stage: layers", "Time of each stage"):
            assert label in text
        assert "tile" not in text and "(MB)" not in text


def test_sweep_and_liveness_plots(tmp_path):
    model, _, _ = twenty_stage_plan()
    rows = sweep(model, indexed_inputs(model, SolveOptions(devices=1, capacities=(30_000,))), [1, 8, 20])
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


def _extents(fig):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def test_llama_plot_is_readable():
    """llama-7b-layers.json on 8 devices: every title inside the figure, no two stage labels of
    an axis overlapping, GiB on the memory axis."""
    import stagesplit
    from helpers import PROFILES
    plan = stagesplit.solve(PROFILES / "llama-7b-layers.json", 8, schedule="1f1b")
    fig = plan_figure(plan)
    renderer = _extents(fig)
    frame = fig.bbox
    texts = [fig._suptitle] + [ax.title for ax in fig.axes]
    for text in texts:
        box = text.get_window_extent(renderer)
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and box.y1 <= frame.y1, text.get_text()
    for ax in fig.axes:
        labels = [t for t in ax.get_xticklabels() if t.get_text()]
        assert len(labels) == 8
        for a, b in zip(labels, labels[1:]):
            angle = np.radians(a.get_rotation())
            if angle == 0:
                assert not a.get_window_extent(renderer).overlaps(b.get_window_extent(renderer))
            else:        # turned labels are parallel lines: their distance apart must exceed a line's height
                (xa, _), (xb, _) = a.get_transform().transform(a.get_position()), \
                    b.get_transform().transform(b.get_position())
                height = renderer.points_to_pixels(a.get_fontsize()) * 1.2
                assert (xb - xa) * np.sin(angle) > height
    assert fig.axes[0].get_ylabel() == "device memory (GiB)"
    assert len(fig.axes) == 2                      # one tile: no per-tile panel repeating the first


def test_an_ipu_plan_plots_its_tiles_in_binary_units(tmp_path):
    import stagesplit
    from helpers import PROFILES
    plan = stagesplit.solve(PROFILES / "bert-base.stagesplit", 4)
    totals = [plan.analysis.stage_memory(s.first_layer, s.last_layer).total(s.in_flight) for s in plan.stages]
    fig = plan_figure(plan, totals)
    assert [ax.get_ylabel() for ax in fig.axes] == ["worst tile memory (KiB)", "memory per tile (KiB)",
                                                    "stage time (ms)"]
    # the stacked bars of stage 0 add up to its worst tile's bytes, in KiB
    heights = sum(p.get_height() for p in fig.axes[0].patches if abs(p.get_x() + p.get_width() / 2) < 1e-9)
    assert heights == pytest.approx(plan.stages[0].worst_tile_bytes / 1024)


def test_a_capacity_far_above_every_stage_is_stated_not_drawn():
    """Stages of a few hundred bytes on devices of a terabyte: the bars are not squashed flat
    under the capacity line."""
    model = layer_model([4, 4, 4, 4], [1, 1, 1, 1])
    plan = advise(model, indexed_inputs(model, SolveOptions(devices=2, capacities=(2**40,) * 2))).plan
    fig = plan_figure(plan)
    ax = fig.axes[0]
    top = max(p.get_y() + p.get_height() for p in ax.patches)
    assert ax.get_ylim()[1] == pytest.approx(top * 1.2)
    assert "off the scale" in ax.get_title()
