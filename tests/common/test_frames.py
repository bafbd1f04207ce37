"""pandas DataFrames and notebook HTML of plans, breakdowns and sweeps: exact values against the
objects they describe, against the text tables (built by separate code) and against numbers
worked out by hand on the tiny profile."""

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

import stagesplit
from helpers import PROFILES, ROOT, tiny_profile
from indexed_inputs import indexed_inputs
from stagesplit.io.layerform import LayerSpec, build_layer_profile
from stagesplit.io.profile import ProfileInfo
from stagesplit.io.targets import load_target
from stagesplit.model.analysis import Analysis
from stagesplit.plan import read_plan, write_plan
from stagesplit.plan.records import MEMORY_KEYS
from stagesplit.plan.sweep import SweepResult, SweepRow, sweep
from stagesplit.reporting.breakdown import Breakdown
from stagesplit.reporting.summary import stages_table
from stagesplit.solver.problem import SolveOptions

TINY = str(PROFILES / "tiny.json")
BERT = str(PROFILES / "bert-base.stagesplit")


@pytest.fixture(scope="module")
def tiny_plan():
    return stagesplit.solve(TINY, 2, schedule="1f1b")


@pytest.fixture(scope="module")
def bert_plan():
    return stagesplit.solve(BERT, 4)


def evil_profile():
    """Layer and profile names that are HTML."""
    specs = [LayerSpec("<b>evil</b>", weights=10**9, compute=5e12), LayerSpec("a&b", weights=2 * 10**9, compute=1e12),
             LayerSpec("<script>x</script>", weights=10**9, compute=4e12)]
    return build_layer_profile(specs, load_target("a100-80gb"), training=False,
                               info=ProfileInfo(name="<i>prof</i>", source="layers"))


# -- Plan.stages_frame / layers_frame -----------------------------------------------------------

STAGE_DTYPES = {"device": "int64", "target": "object", "first_layer": "int64", "last_layer": "int64",
                "first_layer_name": "object", "last_layer_name": "object", "num_layers": "int64",
                "in_flight": "int64", "memory_bytes": "int64", "worst_tile": "int64", "capacity_bytes": "int64",
                "headroom_bytes": "int64", "headroom": "float64", "fits": "bool",
                **{f"{k}_bytes": "int64" for k in MEMORY_KEYS}, "total_bytes": "int64", "compute": "float64",
                "stage_time": "float64", "time_s": "float64", "bytes_received": "int64", "bytes_sent": "int64",
                "bottleneck": "bool"}


def test_stages_frame_hand_computed(tiny_plan):
    f = tiny_plan.stages_frame()
    assert {k: str(v) for k, v in f.dtypes.items()} == STAGE_DTYPES
    assert f.index.name == "stage" and f.index.tolist() == [0, 1] and f.index.dtype == np.int64
    # layer 0 alone on tile 0: always 110 + peak 70 + vertex code 80 + state 12 + exchange 12 + control 6
    # layer 1 alone on tile 1: 50 + 20 + 60 + 16 + 6 + 5 (test_breakdown's hand numbers)
    assert f["memory_bytes"].tolist() == [290, 157]
    assert f["worst_tile"].tolist() == [0, 1]
    assert f["capacity_bytes"].tolist() == [1000, 1000]
    assert f["headroom_bytes"].tolist() == [710, 843]
    assert f["headroom"].tolist() == [0.71, 0.843]
    assert f["fits"].tolist() == [True, True]
    assert f["always_live_bytes"].tolist() == [110, 50]
    assert f["not_always_live_bytes"].tolist() == [70, 20]
    assert f["vertex_code_bytes"].tolist() == [80, 60]
    assert f["total_bytes"].tolist() == [290 + 75, 112 + 157]        # summed over both tiles
    assert f["compute"].tolist() == [110.0, 200.0]                   # cycles: 100 + 10, 200
    assert f["time_s"].tolist() == pytest.approx([110e-9, 200e-9])  # at 1 GHz
    # layer0/b (40 bytes) is made in layer 0 and used in layer 1
    assert f["bytes_sent"].tolist() == [40, 0] and f["bytes_received"].tolist() == [0, 40]
    assert f["bottleneck"].tolist() == [False, True]
    assert f["in_flight"].tolist() == [2, 1]                          # 1F1B with 2 micro-batches
    assert f["target"].tolist() == ["tiny", "tiny"]
    assert f["first_layer_name"].tolist() == ["0", "1"] and f["num_layers"].tolist() == [1, 1]
    assert f.attrs == {"compute_unit": "cycles", "method": "cp-sat", "status": "optimal"}


def _assert_frame_matches_plan(plan, f):
    assert len(f) == len(plan.stages)
    for s in plan.stages:
        row = f.loc[s.stage]
        assert row["device"] == s.device and row["first_layer"] == s.first_layer and row["last_layer"] == s.last_layer
        assert row["first_layer_name"] == s.layers[0] and row["last_layer_name"] == s.layers[-1]
        assert row["num_layers"] == len(s.layers) and row["in_flight"] == s.in_flight
        assert row["memory_bytes"] == s.worst_tile_bytes and row["worst_tile"] == s.worst_tile
        assert row["capacity_bytes"] == s.capacity_bytes and row["headroom_bytes"] == s.headroom_bytes
        assert row["headroom"] == s.headroom and row["fits"] == s.fits
        for k in MEMORY_KEYS:
            assert row[f"{k}_bytes"] == getattr(s.memory_at_worst_tile, k), k
        assert row["total_bytes"] == s.memory_total.total
        assert row["compute"] == s.compute and row["stage_time"] == s.stage_time
        assert (np.isnan(row["time_s"]) if s.time_s is None else row["time_s"] == s.time_s)
        assert row["bytes_received"] == s.bytes_received and row["bytes_sent"] == s.bytes_sent
        assert row["bottleneck"] == (s is plan.bottleneck)


@pytest.mark.parametrize("which", ["tiny_plan", "bert_plan"])
def test_stages_frame_equals_stage_plans(request, which):
    plan = request.getfixturevalue(which)
    f = plan.stages_frame()
    _assert_frame_matches_plan(plan, f)
    assert f["num_layers"].sum() == len(plan.layer_names)
    assert f["bottleneck"].sum() == 1
    # the text table shows the same figures (report.py builds it from the stage plans)
    t = stages_table(plan)
    col = {c.name: j for j, c in enumerate(t.columns)}
    assert [r[col["worst tile bytes"]] for r in t.rows] == f["memory_bytes"].tolist()
    assert [r[col["received"]] for r in t.rows] == f["bytes_received"].tolist()


def test_bert_stages_and_layers(bert_plan):
    assert bert_plan.split_text == "[ 0 1 2 | 3 4 5 | 6 7 8 | 9 10 11 ]"
    f = bert_plan.stages_frame()
    assert f["first_layer_name"].tolist() == ["0", "3", "6", "9"]
    assert f["last_layer_name"].tolist() == ["2", "5", "8", "11"]
    assert f["first_layer"].tolist() == [0, 3, 6, 9] and f["num_layers"].tolist() == [3, 3, 3, 3]
    layers = bert_plan.layers_frame()
    assert layers.index.tolist() == list(range(12)) and layers.index.name == "layer"
    assert layers["name"].tolist() == [str(i) for i in range(12)]
    assert layers["stage"].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert layers["device"].tolist() == layers["stage"].tolist()
    assert str(layers["stage"].dtype) == "Int64"
    # layers per stage from the layer view equal the stage view's counts
    assert layers.groupby("stage").size().tolist() == f["num_layers"].tolist()
    assert layers["module_path"].tolist() == bert_plan.module_paths


def test_frames_survive_a_plan_file_round_trip(tmp_path, bert_plan):
    path = tmp_path / "plan.json"
    write_plan(bert_plan, path)
    back = read_plan(path)
    pd.testing.assert_frame_equal(back.stages_frame(), bert_plan.stages_frame())
    pd.testing.assert_frame_equal(back.layers_frame(), bert_plan.layers_frame())


def test_infeasible_plan_gives_empty_frames_of_the_same_types():
    plan = stagesplit.solve(TINY, 2, headroom=0.9)            # 100 bytes a tile: no layer fits
    assert not plan.feasible and not plan.stages
    f = plan.stages_frame()
    assert len(f) == 0 and list(f.columns) == list(STAGE_DTYPES)
    assert {k: str(v) for k, v in f.dtypes.items()} == STAGE_DTYPES
    layers = plan.layers_frame()
    assert layers["name"].tolist() == ["0", "1"] and layers["stage"].isna().all()
    html = plan._repr_html_()
    assert "status: infeasible" in html and "<table" not in html


# -- Breakdown frames ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_breakdown():
    return Breakdown.of(Analysis.of(tiny_profile(True)).model)


def test_breakdown_layers_frame_hand_computed(tiny_breakdown):
    f = tiny_breakdown.layers_frame()
    assert f.index.name == "layer" and f.index.tolist() == [0, 1]
    # per-tile values summed over the two tiles (as test_breakdown.test_layers_table)
    expected = {"name": ["0", "1"], "ops": [2, 1], "always_live_bytes": [110, 60], "not_always_live_bytes": [75, 60],
                "vertex_code_bytes": [140, 120], "vertex_state_bytes": [20, 16], "exchange_code_bytes": [12, 6],
                "control_code_bytes": [8, 7], "total_bytes": [365, 269], "worst_tile": [0, 1],
                "worst_tile_bytes": [290, 157], "stashed_bytes": [0, 0], "cut_before_bytes": [0, 40],
                "compute": [110.0, 200.0]}
    assert list(f.columns) == list(expected)
    assert {k: f[k].tolist() for k in f.columns} == expected
    assert all(f[k].dtype == np.int64 for k in expected if k.endswith("_bytes") or k in ("ops", "worst_tile"))
    assert f["compute"].dtype == np.float64
    assert f.attrs["compute_unit"] == "cycles"


def test_breakdown_other_frames_hand_computed(tiny_breakdown):
    b = tiny_breakdown
    g = b.grouping_frame()
    assert g.index.tolist() == ["name", "no layer"] and g["operations"].tolist() == [3, 1]
    assert g["share"].tolist() == [0.75, 0.25]
    ops = b.operations_frame()
    assert ops["name"].tolist() == ["layer0/matmul", "layer0/add", "layer1/matmul", "optimizer/step"]
    assert ops["layer"].tolist() == ["0", "0", "1", None] and ops["layer_index"].tolist() == [0, 0, 1, -1]
    assert ops["rule"].tolist() == ["name", "name", "name", "no layer"]
    assert ops["total_bytes"].tolist() == [270, 106, 255, 9] and ops["total_bytes"].dtype == np.int64
    assert ops["variables_bytes"].tolist() == [130, 70, 110, 5]
    assert (ops["variables_bytes"] == ops["always_live_bytes"] + ops["not_always_live_bytes"]).all()
    assert ops["compute"].tolist() == [100.0, 10.0, 200.0, 7.0]
    totals = b.totals_frame()
    assert totals.index.tolist() == ["always_live", "not_always_live", "vertex_code", "vertex_state",
                                     "exchange_code", "control_code", "total"]
    assert totals["modelled_bytes"].tolist() == [160, 90, 140, 36, 18, 11, 455]
    assert totals["shared_bytes"].tolist() == [10, 5, 0, 0, 0, 4, 19]
    assert totals["worst_tile_bytes"].tolist() == [110, 70, 80, 24, 12, 6, 290]
    assert totals["modelled_bytes"].iloc[:-1].sum() == totals.loc["total", "modelled_bytes"]
    tiles = b.tiles_frame()
    assert tiles.index.tolist() == [0, 1]
    assert tiles["total_bytes"].tolist() == [290, 165] and tiles["peak_step"].tolist() == [2, 3]
    assert tiles["of_capacity"].tolist() == [0.29, 0.165]
    assert b.tiles_frame(top=1).index.tolist() == [0] and len(b.tiles_frame(top=0)) == 0
    aff = b.affinity_frame()
    assert aff.values.tolist() == [[170, 40], [40, 110]] and aff.index.tolist() == ["0", "1"]
    comm = b.communication_frame()
    assert comm.values.tolist() == [[0, 40], [0, 0]] and comm.dtypes.tolist() == [np.int64, np.int64]
    assert (comm.index.name, comm.columns.name) == ("from", "to")


def _table_by_column(table):
    return {c.name: [r[j] for r in table.rows] for j, c in enumerate(table.columns)}


def _check_against_tables(b):
    """Each frame against its text table (different code paths over the same arrays)."""
    lt = _table_by_column(b.layers_table())
    lf = b.layers_frame()
    pairs = {"layer": "name", "ops": "ops", "always live": "always_live_bytes",
             "not always live": "not_always_live_bytes", "vertex code": "vertex_code_bytes",
             "vertex state": "vertex_state_bytes", "exchange code": "exchange_code_bytes",
             "control code": "control_code_bytes", "total": "total_bytes", "worst tile": "worst_tile",
             "worst tile bytes": "worst_tile_bytes", "stashed": "stashed_bytes", "bound": "bound"}
    for tcol, fcol in pairs.items():
        if tcol in lt:
            assert lt[tcol] == lf[fcol].tolist(), tcol
    compute = next(k for k in lt if k.startswith("compute ("))
    assert lt[compute] == lf["compute"].tolist()
    if "time (ms)" in lt:
        assert lf["time_s"].tolist() == pytest.approx([x / 1e3 for x in lt["time (ms)"]], rel=1e-12)
    ot = _table_by_column(b.operations_table())
    of = b.operations_frame()
    assert ot["#"] == of.index.tolist()
    assert ot["layer"] == [x if x is not None else "-" for x in of["layer"]]
    assert ot["variables"] == of["variables_bytes"].tolist() and ot["total"] == of["total_bytes"].tolist()
    tt = b.totals_table()
    assert [r[1:] for r in tt.rows] == b.totals_frame().values.tolist()
    top = b.tiles_table(5)
    tf = b.tiles_frame(5)
    assert [r[0] for r in top.rows] == tf.index.tolist()
    assert [r[1] for r in top.rows] == tf["total_bytes"].tolist()
    assert [r[4] for r in top.rows] == [None if pd.isna(x) else x for x in tf["peak_step"]]
    assert [r[1:] for r in b.affinity_table().rows] == b.affinity_frame().values.tolist()
    assert [r[1:-1] for r in b.communication_table().rows] == b.communication_frame().values.tolist()
    assert [r[-1] for r in b.communication_table().rows] == lf["cut_before_bytes"].tolist()
    assert [r[1] for r in b.grouping_table().rows] == b.grouping_frame()["operations"].tolist()
    # every whole-profile tile is in the full tiles frame, fullest first
    full = b.tiles_frame()
    assert len(full) == b.model.profile.target.tiles and full["total_bytes"].is_monotonic_decreasing
    assert full["total_bytes"].sum() == b.totals_frame().loc["total", "modelled_bytes"]


def test_breakdown_frames_match_tables_tiny(tiny_breakdown):
    _check_against_tables(tiny_breakdown)


def test_breakdown_frames_match_tables_on_samples():
    _check_against_tables(stagesplit.breakdown(BERT))
    llama = stagesplit.breakdown(str(PROFILES / "llama-7b-layers.json"))       # with roofline times
    assert {"time_s", "bound"} <= set(llama.layers_frame().columns)
    _check_against_tables(llama)


# -- sweeps ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_sweep():
    model = Analysis.load(TINY).model
    return sweep(model, indexed_inputs(model, SolveOptions(devices=3)), [1, 2, 3])


def test_sweep_result_is_a_sequence(tiny_sweep):
    r = tiny_sweep
    assert isinstance(r, SweepResult) and len(r) == 3
    assert [row.devices for row in r] == [1, 2, 3]
    assert isinstance(r[0], SweepRow) and r[0].devices == 1 and r[-1].devices == 3
    assert [row.devices for row in r[1:]] == [2, 3] and isinstance(r[1:], SweepResult)
    assert r.fewest_devices == 1
    assert repr(r) == "SweepResult(devices [1, 2, 3], fewest that fit: 1)"
    with pytest.raises(IndexError):
        r[3]


def test_sweep_frame_hand_computed(tiny_sweep):
    f = tiny_sweep.frame()
    assert f.index.name == "devices" and f.index.tolist() == [1, 2, 3]
    assert f["fits"].tolist() == [True, True, True]
    assert f["stages"].tolist() == [1, 2, 2]              # two layers: a third device is not used
    assert f["micro_batches"].tolist() == [1, 1, 1]
    assert f["bottleneck_compute"].tolist() == [310.0, 200.0, 200.0]
    assert f["bottleneck_stage"].tolist() == [0, 1, 1]
    # one micro-batch: bubble (P-1)/(M+P-1) = 1/2 on two stages; efficiency = 310/(2 x 200) x 1/2
    assert f["bubble"].tolist() == [0.0, 0.5, 0.5]
    assert f["efficiency"].tolist() == pytest.approx([1.0, 0.3875, 0.3875])
    assert f["worst_memory_bytes"].tolist() == [290, 290, 290] and f["worst_memory"].tolist() == [0.29] * 3
    assert f["split"].tolist() == ["[ 0 1 ]", "[ 0 | 1 ]", "[ 0 | 1 ]"]
    for row in tiny_sweep:                                   # against each row's plan
        assert f.loc[row.devices, "stages"] == len(row.plan.stages)
        assert f.loc[row.devices, "bottleneck_time"] == row.plan.bottleneck.stage_time
        assert f.loc[row.devices, "status"] == row.plan.status
    assert f.attrs["compute_unit"] == "cycles"


def test_sweep_frame_rows_without_a_split():
    r = stagesplit.sweep(TINY, [1, 2], headroom=0.9)
    f = r.frame()
    assert f["fits"].tolist() == [False, False] and f["stages"].tolist() == [0, 0]
    assert f["bottleneck_compute"].isna().all() and f["worst_memory_bytes"].isna().all()
    assert str(f["worst_memory_bytes"].dtype) == "Int64" and str(f["bottleneck_stage"].dtype) == "Int64"
    assert r.fewest_devices is None and "no device count in the sweep fits" in r._repr_html_()


def test_cli_sweep_still_prints(capsys):
    from stagesplit.cli import main
    assert main(["sweep", TINY, "--devices", "1..2"]) == 0
    out = capsys.readouterr().out
    assert "fewest devices that fit: 1" in out and "[ 0 | 1 ]" in out


def test_a_device_count_the_time_limit_stopped_is_unknown_and_the_summary_says_fewer_may_fit():
    """A count whose solve the time limit stopped before any split was found (status "unknown") may
    fit: its row says unknown, not no, and the summary (the command's last line, the notebook's first)
    gives the fewest found with the fewer left unknown, or that none was found to fit."""
    from dataclasses import replace

    from stagesplit.reporting.summary import sweep_table
    from stagesplit.reporting.table import render
    r = stagesplit.sweep(TINY, [1, 2])
    assert r.fewest_devices == 1 and r.summary() == "fewest devices that fit: 1"

    def stopped(row):
        return replace(row, plan=replace(row.plan, status="unknown", feasible=False, stages=[],
                                         message="the time limit came before any split was found"))
    one_stopped = type(r)([stopped(r[0]), r[1]])
    assert [row.unknown for row in one_stopped] == [True, False]
    assert one_stopped.summary() == "fewest devices that fit: 2 (the time limit left 1 unknown: fewer may fit)"
    assert one_stopped.summary() in one_stopped._repr_html_()
    text = render([sweep_table(one_stopped.rows)], "text", width=200)
    assert [line.split()[:2] for line in text.splitlines() if line.split()[:1] == ["1"]] == [["1", "unknown"]]
    both = type(r)([stopped(row) for row in r])
    assert both.summary() == "no device count in the sweep was found to fit: the time limit left 1, 2 unknown"
    refused = type(r)([replace(row, plan=replace(row.plan, status="infeasible", feasible=False, stages=[]))
                       for row in r])
    assert not any(row.unknown for row in refused) and refused.summary() == "no device count in the sweep fits"


# -- HTML ------------------------------------------------------------------------------------------

def _assert_escaped(html):
    assert "&lt;b&gt;evil&lt;/b&gt;" in html
    assert "<b>evil" not in html and "<script>" not in html and "<i>prof" not in html


def test_plan_html_escapes_names():
    plan = stagesplit.solve(evil_profile(), 2)
    assert plan.layer_names[0] == "<b>evil</b>" and plan.stages
    html = plan._repr_html_()
    _assert_escaped(html)
    assert "&lt;i&gt;prof&lt;/i&gt;" in html and "a&amp;b" in html
    assert html.count("<table") == 1 and "status: optimal" in html
    assert plan.stages_frame()["first_layer_name"].iloc[0] == "<b>evil</b>"      # the frame keeps raw names


def test_sweep_and_breakdown_html_escape_names():
    profile = evil_profile()
    r = stagesplit.sweep(profile, [1, 2])
    html = r._repr_html_()
    _assert_escaped(html)
    assert "fewest devices that fit: 1" in html and html.count("<table") == 1
    b = stagesplit.breakdown(profile)
    html = b._repr_html_()
    _assert_escaped(html)
    assert "&lt;script&gt;x&lt;/script&gt;" in html
    assert b.layers_frame()["name"].tolist() == ["<b>evil</b>", "a&b", "<script>x</script>"]


def test_light_commands_do_not_import_pandas():
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "stagesplit", "--help"], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    assert "stagesplit" in out.stdout and "pandas" not in out.stderr
