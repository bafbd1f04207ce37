"""Tables: aligned text with units for people, CSV/TSV/JSON that parse back to the same values."""

import csv
import io
import json
import math
import re

import numpy as np
import pytest

from stagesplit.reporting.table import Column, Table, render, render_text


def sample_table():
    t = Table("Stages", [Column("stage"), Column("layers", "int"), Column("memory", "bytes"),
                         Column("load", "percent"), Column("compute", "compute"), Column("ratio", "float")])
    t.add("first", 3, 2_500_000, 0.5, 1234567.0, 1.5)
    t.add("second, with comma", 12, 750_000, 0.125, 3.0, float("nan"))
    t.add('quoted "name"', 1000, None, 1.0, 0.000123, 2.0)
    t.note = "a note\nover two lines"
    return t


def test_text_layout():
    text = render_text(sample_table())
    assert text.splitlines() == [
        "Stages",
        "======",
        "stage               layers  memory (MiB)    load   compute  ratio",
        "------------------  ------  ------------  ------  --------  -----",
        "first                    3          2.38   50.0%  1.23e+06  1.500",
        "second, with comma      12          0.72   12.5%         3      -",
        'quoted "name"        1,000             -  100.0%  0.000123  2.000',
        "a note",
        "over two lines",
    ]


def test_text_columns_are_aligned():
    lines = render_text(sample_table()).splitlines()[2:7]
    # text columns are left-aligned, numbers right-aligned: each column ends at the same place
    ends = {len(line.rstrip()) for line in lines}
    assert ends == {len(lines[0])}


@pytest.mark.parametrize("values, unit, shown", [
    # binary units, one rule everywhere: KiB from 10 KiB, MiB from 1 MiB, GiB from 10 GiB
    ([12, 10_239], "B", ["12", "10,239"]),
    ([12, 10_240], "KiB", ["0.01", "10.00"]),                      # 12 / 1024 = 0.0117
    ([1_048_575, 5], "KiB", ["1,024.00", "0.00"]),                 # 1023.999; 5 / 1024 = 0.0049
    ([1_048_576, 5], "MiB", ["1.00", "0.00"]),
    ([2_500_000_000, 1], "MiB", ["2,384.19", "0.00"]),             # under 10 GiB (10,737,418,240)
    ([25_000_000_000, 1], "GiB", ["23.28", "0.00"]),               # 25e9 / 2**30 = 23.283
    ([-3_000_000, 1], "MiB", ["-2.86", "0.00"]),
    ([None, float("nan")], "B", ["-", "-"]),
    ([np.int64(5_000_000), np.int32(7)], "MiB", ["4.77", "0.00"]),
    ([np.float64(2e10), np.uint8(1)], "GiB", ["18.63", "0.00"]),
])
def test_byte_units(values, unit, shown):
    t = Table("T", [Column("b", "bytes")])
    for v in values:
        t.add(v)
    lines = render_text(t).splitlines()
    assert lines[2].strip() == f"b ({unit})"
    assert [line.strip() for line in lines[4:]] == shown


def test_other_kinds_format():
    t = Table("T", [Column("i", "int"), Column("f", "float"), Column("c", "compute"), Column("p", "percent"),
                    Column("s")])
    t.add(np.int64(1234567), 2.0 / 3, 987654321.0, 0.0005, 42)
    t.add(None, None, None, None, None)
    lines = render_text(t).splitlines()
    assert lines[4].split() == ["1,234,567", "0.667", "9.88e+08", "0.1%", "42"]
    assert lines[5].split() == ["-", "-", "-", "-", "-"]


def test_empty_table():
    t = Table("Nothing", [Column("a"), Column("b", "bytes")])
    assert render_text(t).splitlines() == ["Nothing", "=======", "a  b (B)", "-  -----"]


EXPECTED_ROWS = [
    ["first", 3, 2_500_000, 0.5, 1234567.0, 1.5],
    ["second, with comma", 12, 750_000, 0.125, 3.0, None],
    ['quoted "name"', 1000, None, 1.0, 0.000123, 2.0],
]


def _typed(cell: str):
    if cell == "":
        return None
    for kind in (int, float):
        try:
            return kind(cell)
        except ValueError:
            pass
    return cell


@pytest.mark.parametrize("fmt, delimiter", [("csv", ","), ("tsv", "\t")])
def test_csv_and_tsv_parse_back(fmt, delimiter):
    out = render([sample_table()], fmt)
    rows = list(csv.reader(io.StringIO(out), delimiter=delimiter))
    assert rows[0] == ["stage", "layers", "memory_bytes", "load", "compute", "ratio"]
    assert [[_typed(c) for c in r] for r in rows[1:]] == EXPECTED_ROWS


def test_several_tables_in_csv_carry_titles():
    second = Table("Other", [Column("x", "int")])
    second.add(np.int64(7))
    out = render([sample_table(), second], "csv")
    blocks = out.split("\n\n")
    assert len(blocks) == 2
    assert blocks[0].startswith("# Stages\nstage,layers,memory_bytes")
    assert blocks[1] == "# Other\nx\n7\n"


def test_single_table_csv_has_no_title_line():
    assert not render([sample_table()], "csv").startswith("#")


def test_json_parses_back():
    second = Table("Other", [Column("x", "int"), Column("y", "float")])
    second.add(np.int64(7), np.float64(0.25))
    doc = json.loads(render([sample_table(), second], "json"))
    assert [d["title"] for d in doc] == ["Stages", "Other"]
    assert doc[0]["columns"] == ["stage", "layers", "memory", "load", "compute", "ratio"]
    assert [[row[c] for c in doc[0]["columns"]] for row in doc[0]["rows"]] == EXPECTED_ROWS
    assert doc[0]["note"] == "a note\nover two lines"
    assert doc[1] == {"title": "Other", "columns": ["x", "y"], "rows": [{"x": 7, "y": 0.25}]}
    assert isinstance(doc[1]["rows"][0]["x"], int)


def test_json_never_writes_nan():
    t = Table("T", [Column("v", "float")])
    t.add(float("nan"))
    t.add(np.float64("nan"))
    t.add(np.float32("nan"))
    out = render([t], "json")
    assert "NaN" not in out
    assert json.loads(out)[0]["rows"] == [{"v": None}] * 3
    assert list(csv.reader(io.StringIO(render([t], "csv")))) == [["v"], [""], [""], [""]]
    assert [line.strip() for line in render_text(t).splitlines()[4:]] == ["-"] * 3


def test_text_output_ends_with_newline_and_separates_tables():
    out = render([sample_table(), sample_table()], "text")
    assert out.endswith("\n") and out.count("Stages\n======") == 2
    assert "\n\nStages\n" in out


def test_unknown_format():
    with pytest.raises(ValueError):
        render([sample_table()], "xml")


def test_floats_round_trip_exactly_in_csv():
    t = Table("T", [Column("v", "compute")])
    values = [1 / 3, 1e-300, 123456789.123456789, math.pi * 1e20]
    for v in values:
        t.add(v)
    rows = list(csv.reader(io.StringIO(render([t], "csv"))))
    assert [float(r[0]) for r in rows[1:]] == values


def fitting_table():
    t = Table("Fit", [Column("name"), Column("keep", "int"), Column("spare", "int", 1), Column("spare first", "int", 2),
                      Column("split")])
    t.add("stage-zero", 1, 22, 333, "[ a b c d e f g h i j k l m n o p ]")
    t.add("one", 4444, 5, 6, "[ q | r ]")
    return t


def test_a_wide_table_is_unchanged_without_a_width():
    lines = render_text(fitting_table()).splitlines()
    assert re.split(r"\s{2,}", lines[2].strip()) == ["name", "keep", "spare", "spare first", "split"]
    assert max(len(line) for line in lines) == 10 + 2 + 5 + 2 + 5 + 2 + 11 + 2 + 35        # "4,444" is 5 wide


@pytest.mark.parametrize("width, shown, hidden", [
    (100, ["name", "keep", "spare", "spare first", "split"], []),
    (61, ["name", "keep", "spare", "split"], ["spare first"]),       # 10+2+5+2+5+2+35 = 61
    (60, ["name", "keep", "split"], ["spare first", "spare"]),       # 54 without both
    (40, ["name", "keep", "split"], ["spare first", "spare"]),       # then the split is cut to 21
])
def test_a_narrow_width_leaves_out_columns_by_drop_order_then_cuts_text(width, shown, hidden):
    lines = render_text(fitting_table(), width).splitlines()
    assert [h for h in re.split(r"\s{2,}", lines[2].strip())] == shown
    assert all(len(line) <= width for line in lines if not line.startswith("("))
    if hidden:
        assert lines[-1] == (f"({len(hidden)} column{'s' if len(hidden) > 1 else ''} left out to fit {width} "
                             f"characters: {', '.join(hidden)}; `wide` shows them)")
    else:
        assert not lines[-1].startswith("(")
    if width == 40:
        assert lines[4].endswith("  [ a b c d e f g h ...")         # 21 characters: 18 kept and "..."
        assert lines[5].endswith("[ q | r ]")


def test_columns_without_drop_are_never_left_out():
    lines = render_text(fitting_table(), 10).splitlines()
    assert re.split(r"\s{2,}", lines[2].strip()) == ["name", "keep", "split"]
