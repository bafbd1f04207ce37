"""The breakdown tables: hand-computed numbers on tiny_profile, and on the shipped samples the
totals agree with the profile's own ground truth in every category the model covers."""

import numpy as np
import pytest

from helpers import SAMPLE_NAMES, load_sample, tiny_profile
from stagesplit.layers import LayerOptions
from stagesplit.model.analysis import Analysis
from stagesplit.reporting.breakdown import SECTIONS, Breakdown
from stagesplit.reporting.table import render


def breakdown(profile=None, shared="every", **options):
    a = Analysis.of(profile if profile is not None else tiny_profile(True), LayerOptions(**options), shared)
    return Breakdown.of(a.model)


def rows(table):
    return [list(r) for r in table.rows]


def by_first_column(table):
    return {r[0]: r[1:] for r in table.rows}


def test_sections_in_order():
    tables = breakdown().tables(SECTIONS)
    assert [t.title.split(" (")[0] for t in tables] == [
        "Summary of the profile", "Layer grouping", "Operations", "Layers", "Memory totals by category",
        "Most loaded tiles", "Memory affinity", "Inter-layer communication"]
    assert len(SECTIONS) == 8
    assert [t.title for t in breakdown().tables(("totals", "grouping"))] == [tables[4].title, tables[1].title]
    # a bare breakdown is short: the summary, then one row per layer
    assert [t.title for t in breakdown().tables()] == [tables[0].title, tables[3].title]


def test_summary_of_a_tiled_profile():
    """The tiny profile: 2 tiles of 1,000 bytes; the whole model's worst tile holds 290 bytes
    (test_totals_table), compute 310 in layers + 7 shared."""
    t = breakdown().summary_table()
    got = by_first_column(t)
    assert got["device"] == ["tiny: 2 tiles x 1,000 bytes"]
    assert got["whole model on one device"] == ["290 of 1,000 bytes on its worst tile (tile 0): 29%"]
    assert got["compute per step"] == ["317 cycles"]
    assert got["used by no layer"] == ["0.00 MiB summed over tiles, counted on every stage (`shared='every'`)"]
    assert t.note == "more: `sections=grouping,operations,totals,tiles,affinity,communication`"


def test_grouping_table():
    t = breakdown().grouping_table()
    assert rows(t) == [["name", 3, 0.75], ["no layer", 1, 0.25]]
    assert t.note.splitlines() == [
        "2 layers in steps order: 0, 1",
        "75% of operations have a layer; shared items are counted on every stage (`shared='every'`)"]


def test_grouping_table_shows_warnings():
    t = breakdown(layer_regex=r"layer(0)").grouping_table()        # only layer 0's ops match
    assert rows(t)[0] == ["name", 2, 0.5]
    t = breakdown(layer_regex=r"(matmul)").grouping_table()
    assert rows(t) == [["name", 2, 0.5], ["no layer", 2, 0.5]]
    t = breakdown(layer_regex=r"layer1/(matmul)").grouping_table()
    assert "warning: only 25% of operations got a layer" in t.note


def test_operations_table():
    t = breakdown().operations_table()
    # columns: #, operation, layer, rule, vertex code, vertex state, exchange, control, variables, total, compute
    assert rows(t) == [
        [0, "layer0/matmul", "0", "name", 120, 16, 0, 4, 130, 270, 100.0],
        [1, "layer0/add", "0", "name", 20, 4, 12, 0, 70, 106, 10.0],
        [2, "layer1/matmul", "1", "name", 120, 16, 6, 3, 110, 255, 200.0],
        [3, "optimizer/step", "-", "no layer", 0, 0, 0, 4, 5, 9, 7.0],
    ]


def test_layers_table():
    t = breakdown().layers_table()
    assert [c.name for c in t.columns] == [
        "layer", "ops", "always live", "not always live", "vertex code", "vertex state", "exchange code",
        "control code", "total", "worst tile", "worst tile bytes", "stashed", "compute (cycles)"]
    # per-tile values from test_costmodel, summed over the two tiles
    assert rows(t) == [
        ["0", 2, 110 + 0, 70 + 5, 80 + 60, 12 + 8, 12 + 0, 6 + 2, 290 + 75, 0, 290, 0, 110.0],
        ["1", 1, 10 + 50, 40 + 20, 60 + 60, 0 + 16, 0 + 6, 2 + 5, 112 + 157, 1, 157, 0, 200.0],
    ]
    assert t.note == "shared items (used by no layer) on every layer: 0.00 MiB summed over tiles"


def test_layers_table_without_shared_items():
    t = breakdown(shared="none").layers_table()
    assert rows(t)[0][:9] == ["0", 2, 100, 70, 140, 20, 12, 4, 278 + 68]
    assert t.note == "shared items are not counted (`shared='none'`)"


def test_totals_table():
    t = breakdown().totals_table()
    assert rows(t) == [
        # category, modelled (summed over tiles), shared part, worst tile
        ["always-live variables", 160, 10, 110],
        ["not-always-live variables (peak)", 90, 5, 70],
        ["vertex code", 140, 0, 80],
        ["vertex state", 36, 0, 24],
        ["exchange code", 18, 0, 12],
        ["control code", 11, 4, 6],
        ["total", 455, 19, 290],
    ]
    assert t.note.splitlines() == [
        "capacity: 2 tiles x 1,000 bytes (tiny); worst tile needs 29% of a tile",
        "compute: 310 cycles in layers, 7 in shared operations (source not stated)",
        # ground truth: always 110+50, peak 70+20, vertex code 80+60, constant 7: worst tile 0 = 267
        "profile ground truth: 0.00 MiB summed over tiles, worst tile 267 bytes; modelled 0.00 MiB"]


def test_totals_table_without_ground_truth():
    t = breakdown(tiny_profile(False)).totals_table()
    assert len(t.note.splitlines()) == 2 and "ground truth" not in t.note


def test_most_loaded_tiles():
    t = breakdown().tiles_table()
    assert t.title == "Most loaded tiles (whole profile as one stage, top 2)"
    assert rows(t) == [
        # tile, total, always, not always, peak step, vertex code, state, exchange, control, of capacity
        [0, 290, 110, 70, 2, 80, 12, 12, 6, 0.29],
        [1, 165, 50, 20, 3, 60, 24, 6, 5, 0.165],
    ]
    assert rows(breakdown().tiles_table(top=1)) == [rows(t)[0]]
    assert rows(breakdown().tiles_table(top=0)) == []
    assert rows(breakdown().tiles_table(top=-3)) == []          # never "all but the last three"


def test_affinity_and_communication_tables():
    b = breakdown()
    assert rows(b.affinity_table()) == [["0", 170, 40], ["1", 40, 110]]
    assert rows(b.communication_table()) == [["0", 0, 40, 0], ["1", 0, 0, 40]]
    assert [c.name for c in b.communication_table().columns] == ["from \\ to", "0", "1", "cut before"]


def test_every_section_renders_in_every_format():
    import csv
    import io
    import json
    tables = breakdown().tables(SECTIONS)
    doc = json.loads(render(tables, "json"))
    totals = next(d for d in doc if d["title"].startswith("Memory totals"))
    assert totals["rows"][-1] == {"category": "total", "modelled": 455, "shared part": 19, "worst tile": 290}
    text = render(tables, "csv")
    blocks = text.split("\n\n")
    assert len(blocks) == 8
    totals_csv = list(csv.reader(io.StringIO(blocks[4])))
    assert totals_csv[1] == ["category", "modelled_bytes", "shared part_bytes", "worst tile_bytes"]
    assert totals_csv[-1] == ["total", "455", "19", "290"]


# --------------------------------------------------------------------------------------------------
# Samples: the modelled totals against the profile's own ground truth

GT_NAMES = {"vertex code": "vertex_code", "vertex state": "vertex_instance_state",
            "exchange code": "internal_exchange_code", "control code": "control_code"}
UNMODELLED = ("constant", "vector_list_descriptor")


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_sample_totals_match_ground_truth(name):
    p = load_sample(name)
    b = breakdown(p)
    gt = p.ground_truth
    assert set(gt.categories) == set(GT_NAMES.values()) | set(UNMODELLED)
    # per tile: ground truth less the categories the model does not cover is the modelled total
    covered = gt.tile_total() - sum(gt.categories[k] for k in UNMODELLED)
    assert np.array_equal(covered, b.whole.total())
    totals = by_first_column(b.totals_table())
    assert totals["always-live variables"][0] == int(gt.always_live.sum())
    assert totals["not-always-live variables (peak)"][0] == int(gt.not_always_live.sum())
    for label, key in GT_NAMES.items():
        assert totals[label][0] == int(gt.categories[key].sum()), label
        assert totals[label][2] == int(gt.categories[key].max()), label
    assert totals["total"][0] == int(covered.sum())
    assert totals["total"][2] == int(covered.max())
    note = b.totals_table().note.splitlines()[-1]
    assert note == (f"profile ground truth: {gt.tile_total().sum() / 2**20:,.2f} MiB summed over tiles, worst tile "
                    f"{int(gt.tile_total().max()):,} bytes; modelled {covered.sum() / 2**20:,.2f} MiB")


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_sample_tables_are_consistent(name):
    b = breakdown(load_sample(name))
    m = b.model
    layers = rows(b.layers_table())
    assert [r[0] for r in layers] == m.layers.names
    assert sum(r[1] for r in layers) == int((m.layers.op_layer >= 0).sum())
    grouping = {r[0]: r[1] for r in rows(b.grouping_table())}
    assert sum(grouping.values()) == len(m.profile.operations)
    tiles = rows(b.tiles_table())
    assert len(tiles) == 10
    assert tiles[0][1] == by_first_column(b.totals_table())["total"][2]    # the worst tile heads the list
    assert [r[1] for r in tiles] == sorted((r[1] for r in tiles), reverse=True)
    for r in tiles:
        assert r[1] == r[2] + r[3] + sum(r[5:9])
    ops = rows(b.operations_table())
    assert len(ops) == len(m.profile.operations)
    assert sum(r[10] for r in ops) == pytest.approx(m.layer_compute.sum() + m.shared_compute)
