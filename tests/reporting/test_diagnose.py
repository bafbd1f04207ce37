"""diagnose: a planted bottleneck is found exactly; ground truth and grouping health are reported."""

import numpy as np

from stagesplit.cli import main
from stagesplit.io import save_profile
from stagesplit.io.builder import ProfileBuilder
from stagesplit.io.profile import GroundTruth, Target
from stagesplit.model.analysis import Analysis
from stagesplit.reporting.diagnosis import diagnose, diagnosis_tables
from stagesplit.reporting.table import render


def planted(ground_truth_extra: int = 0):
    """4 tiles, 10 steps, two layers. Tile 2 at step 6 holds the planted peak:
    'layer1/big' (900 B, steps 5..7) + 'layer1/mid' (300 B, steps 6..8) + weights 'layer1.w' (100 B)
    + the unused stream buffer (50 B) + code 40 B."""
    b = ProfileBuilder(Target("t", tiles=4, bytes_per_tile=2000), 10)
    w0 = b.variable(200, 0, "always", name="layer0.w")
    w1 = b.variable(100, 2, "always", name="layer1.w")
    a0 = b.variable(400, 1, [(0, 4)], name="layer0/act")
    big = b.variable(900, 2, [(5, 8)], name="layer1/big")
    mid = b.variable(300, 2, [(6, 9)], name="layer1/mid")
    small = b.variable(10, 2, [(4, 10)], name="layer0/out")
    b.variable(50, 2, "always", name="host/stream_buffer")          # used by no operation
    p0 = b.program("layer0/compute", vertex_code=[(0, "A", 30), (1, "A", 30)])
    p1 = b.program("layer1/compute", vertex_code=[(2, "B", 40)])
    b.operation("layer0/matmul", 0, 4, vars=[w0, a0, small], programs=[p0])
    b.operation("layer1/matmul", 5, 9, vars=[w1, big, mid, small], programs=[p1])
    b.operation("", 9, 9)                                            # anonymous: no layer
    if ground_truth_extra:
        b.ground_truth = GroundTruth(always_live=np.array([200, 0, 150, 0]), not_always_live=np.array([0, 400, 1210, 0]),
                                     categories={"vertex_code": np.array([30, 30, 40, 0]),
                                                 "constant": np.array([0, 0, ground_truth_extra, 0])})
    return b.build()


def test_planted_bottleneck_found_exactly():
    model = Analysis.of(planted()).model
    d = diagnose(model)
    s = d.stages[0]
    assert (s.tile, s.step) == (2, 6)
    assert s.memory.not_always_live == 900 + 300 + 10
    assert s.memory.always_live == 100 + 50
    assert s.memory.vertex_code == 40
    assert s.total == 1400
    names = [(v.name, v.bytes) for v in s.top_variables]
    assert names[:4] == [("layer1/big", 900), ("layer1/mid", 300), ("layer1.w", 100), ("host/stream_buffer", 50)]
    big = s.top_variables[0]
    assert big.layers == ["1"] and big.operations == ["layer1/matmul"] and not big.always_live
    assert s.top_variables[3].operations == [] and s.top_variables[3].layers == []
    around = {step: nbytes for step, _, nbytes, _ in s.around}
    assert around[5] == 910 and around[6] == 1210 and around[8] == 310 and around[9] == 10


def test_unexplained_bytes_and_unattributed_variables():
    model = Analysis.of(planted(ground_truth_extra=333)).model
    g = diagnose(model).stages[0].ground_truth
    assert g is not None
    assert g.modelled == 1400
    assert g.measured == 150 + 1210 + 40 + 333
    assert g.unexplained == 333
    rows = {name: (ours, theirs) for name, ours, theirs in g.rows}
    assert rows["constant (not modelled)"] == (0, 333)
    assert rows["always-live variables"] == (150, 150)
    assert [v.name for v in g.unattributed] == ["host/stream_buffer"]
    text = render(diagnosis_tables(diagnose(model)))
    assert "unexplained: 333 bytes" in text


def test_layer_range_and_grouping_health():
    model = Analysis.of(planted()).model
    d = diagnose(model, [(0, 0, 1, None)])
    s = d.stages[0]
    assert s.layers == ["0"]
    assert (s.tile, s.memory.not_always_live) == (1, 400)
    assert s.ground_truth is None
    assert d.grouping.without_layer == ["op#2"]
    assert abs(d.grouping.share - 2 / 3) < 1e-9


def test_in_flight_copies_are_counted():
    model = Analysis.of(planted()).model
    s = diagnose(model, [(1, 1, 3, None)]).stages[0]
    assert s.memory.stashed_copies == 0          # nothing of layer 1 is live across other layers' steps


def test_cli_diagnose_plan_and_plot(tmp_path, capsys):
    profile = tmp_path / "p.stagesplit"
    save_profile(planted(ground_truth_extra=7), profile)
    plan = tmp_path / "plan.json"
    assert main(["solve", str(profile), "--devices", "2", "--exact", "--out", str(plan)]) == 0
    capsys.readouterr()
    png = tmp_path / "live.png"
    assert main(["diagnose", str(profile), "--plan", str(plan), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "Stage 0 (layers 0)" in out and "Stage 1 (layers 1)" in out
    assert "bottleneck tile 2 at step 6" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["diagnose", str(profile), "--layers", "1:1", "--format", "json"]) == 0
    assert '"title": "Layers 1: bottleneck tile 2 at step 6' in capsys.readouterr().out


def test_cli_diagnose_bad_input(tmp_path, capsys):
    profile = tmp_path / "p.stagesplit"
    save_profile(planted(), profile)
    assert main(["diagnose", str(profile), "--layers", "1:0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("stagesplit: error: --layers")
    bad = tmp_path / "plan.json"
    bad.write_text('{"format": "stagesplit-plan", "version": 9}')
    assert main(["diagnose", str(profile), "--plan", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "version" in err[0]


# ------------------------------------------------------------------------------------------------
# Ground truth read from PopVision, in either convention for alwaysLiveBytes (issue 9)

import pytest  # noqa: E402

from fake_pva.support import load_fake_pva  # noqa: E402
from stagesplit.io.popvision import read_popvision  # noqa: E402
from stagesplit.reporting.breakdown import Breakdown  # noqa: E402


def planted_fully_modelled():
    """planted() with a ground truth the model accounts for to the byte: per tile always-live
    variables 200, 0, 150 (layer1.w 100 + stream buffer 50), 0; peaks 0, 400, 1210, 0; vertex
    code 30, 30, 40, 0. Tile 2's total: 150 + 1210 + 40 = 1400."""
    p = planted()
    p.ground_truth = GroundTruth(always_live=np.array([200, 0, 150, 0]), not_always_live=np.array([0, 400, 1210, 0]),
                                 categories={"vertex_code": np.array([30, 30, 40, 0])})
    return p


@pytest.mark.parametrize("code_in_always_live", [False, True])
def test_popvision_profile_fully_modelled_shows_nothing_unexplained(monkeypatch, tmp_path, code_in_always_live):
    pva = load_fake_pva(monkeypatch)
    report = pva.report_from_profile(planted_fully_modelled(), code_in_always_live=code_in_always_live)
    tile2 = report.compilation.tiles[2].memory
    assert tile2.alwaysLiveBytes == (150 + 40 if code_in_always_live else 150)
    assert tile2.total.excludingGaps == 1400
    profile = read_popvision(pva.register(tmp_path / "profile.pop", report))
    model = Analysis.of(profile).model
    g = diagnose(model).stages[0].ground_truth
    assert (g.modelled, g.measured, g.unexplained) == (1400, 1400, 0)
    rows = {name: (ours, theirs) for name, ours, theirs in g.rows}
    assert rows["always-live variables"] == (150, 150)
    assert rows["not-always-live variables (peak)"] == (1210, 1210)
    assert rows["vertex code"] == (40, 40)
    assert "unexplained: 0 bytes (0.0% of the ground truth)" in render(diagnosis_tables(diagnose(model)))
    # breakdown: the profile's own total (summed over tiles and on the worst tile) is the modelled one
    note = Breakdown.of(model).totals_table().note
    assert "worst tile 1,400 bytes" in note
    whole = model.stage_memory(0, model.num_layers - 1).total()
    assert whole.tolist() == [230, 430, 1400, 0] == profile.ground_truth.tile_total().tolist()


@pytest.mark.parametrize("code_in_always_live", [False, True])
def test_popvision_memory_in_no_category_is_unexplained(monkeypatch, tmp_path, code_in_always_live):
    """333 bytes in tile 2's total.excludingGaps that no figure holds: exactly the unexplained."""
    pva = load_fake_pva(monkeypatch)
    report = pva.report_from_profile(planted_fully_modelled(), code_in_always_live=code_in_always_live,
                                     extra_total=[0, 0, 333, 0])
    model = Analysis.of(read_popvision(pva.register(tmp_path / "profile.pop", report))).model
    g = diagnose(model).stages[0].ground_truth
    assert (g.modelled, g.measured, g.unexplained) == (1400, 1733, 333)
    rows = {name: (ours, theirs) for name, ours, theirs in g.rows}
    assert rows["other (not modelled)"] == (0, 333)
    assert rows["always-live variables"] == (150, 150)
