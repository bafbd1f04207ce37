"""Tables for people (aligned text with units) and for machines (CSV, TSV, JSON)."""

from __future__ import annotations

import io
import json
import math
import numbers
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..common.text import one_line

__all__ = ["BYTE_COUNT_COLUMNS", "Column", "FORMATS", "IPU_ONLY_COLUMNS", "Table", "formatted", "gpu_view", "render",
           "render_text", "worded"]

FORMATS = ("text", "csv", "tsv", "json")


@dataclass(frozen=True)
class Column:
    """``kind``: text, int, id (an index: no thousands separator), bytes (shown in KiB, MiB or
    GiB: binary units, 1 GiB = 2**30 bytes, as everywhere), gib (bytes shown in GiB), float,
    compute (3 significant digits), percent (a fraction shown as %). ``drop``: 0 for a column
    every reader needs; columns with higher numbers are left out first when the table must fit
    a narrow terminal (``render_text(width=...)``)."""

    name: str
    kind: str = "text"
    drop: int = 0


@dataclass
class Table:
    """A titled table of typed columns, rendered as text, Markdown, JSON, CSV or TSV."""

    title: str
    columns: list[Column]
    rows: list[list[Any]] = field(default_factory=list)
    note: str = ""

    def add(self, *values: Any) -> None:
        self.rows.append(list(values))


def _bytes_unit(values: Sequence[Any]) -> tuple[str, float]:
    biggest = max((abs(float(v)) for v in values if isinstance(v, numbers.Real) and not _missing(v)), default=0.0)
    if biggest >= 10 * 2**30:           # GiB only from 10 GiB, so MiB-sized rows keep their digits
        return "GiB", 2.0**30
    if biggest >= 2**20:
        return "MiB", 2.0**20
    if biggest >= 10 * 2**10:
        return "KiB", 2.0**10
    return "B", 1.0


#: columns that only mean something on a many-tile device (an IPU)
IPU_ONLY_COLUMNS = ("worst tile", "tile", "tiles", "vertex code", "vertex state", "exchange code", "control code",
                    "code+state")
#: integer columns that hold bytes (shown in GiB on GPUs)
BYTE_COUNT_COLUMNS = ("worst tile bytes", "variables", "stashed copies")


def gpu_view(table: Table) -> Table:
    """The table as a GPU user reads it: no per-tile or IPU code columns, bytes in GiB
    ("worst tile bytes" is simply the stage's memory on a one-tile device)."""
    names = {c.name for c in table.columns}
    keep = [j for j, c in enumerate(table.columns) if c.name not in IPU_ONLY_COLUMNS
            and not (c.name == "worst tile bytes" and "total" in names)]    # one tile: the same figure
    columns = []
    for j in keep:
        c = table.columns[j]
        if c.kind == "bytes" or (c.kind == "int" and c.name in BYTE_COUNT_COLUMNS):
            c = Column("memory" if c.name == "worst tile bytes" else c.name, "gib", c.drop)
        columns.append(c)
    title = re.sub(r" \((bytes )?summed over tiles\)|;? (bytes )?summed over tiles", "", table.title)
    rows = [[row[j] for j in keep] for row in table.rows
            if not (row and isinstance(row[0], str) and row[0] in IPU_ONLY_COLUMNS)]
    return Table(title, columns, rows, table.note)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral)
                             and math.isnan(value))


def _format_cell(value: Any, kind: str, scale: float) -> str:
    if _missing(value):
        return "-"
    if kind == "bytes":
        return f"{value:,.0f}" if scale == 1.0 else f"{value / scale:,.2f}"
    if kind == "gib":
        return f"{value / 2**30:,.2f}"
    if kind == "int":
        return f"{int(value):,}"
    if kind == "id":
        return str(int(value))
    if kind == "float":
        return f"{value:,.3f}"
    if kind == "compute":
        return f"{value:.3g}"
    if kind == "percent":
        return f"{100 * value:.1f}%"
    return one_line(str(value))                        # a name with a line break must not break the table


#: the narrowest a text column is cut to when a table must fit (longer cells end in "...")
MIN_TEXT_WIDTH = 12


def formatted(table: Table) -> tuple[list[str], list[list[str]]]:
    """Each column's header (with its unit) and its cells as text, column by column."""
    headers, cells = [], []
    for j, col in enumerate(table.columns):
        values = [row[j] for row in table.rows]
        unit, scale = _bytes_unit(values) if col.kind == "bytes" else ("GiB", 2.0**30) if col.kind == "gib" else ("", 1.0)
        headers.append(one_line(f"{col.name} ({unit})" if unit else col.name))
        cells.append([_format_cell(v, col.kind, scale) for v in values])
    return headers, cells


def worded(table: Table, naming: Callable[[str], str] | None) -> Table:
    """The table with ``naming`` applied to its title, note and text cells: how a caller that
    names things differently (the command line names parameters by their flags) has them laid
    out in its own words, before the columns are measured."""
    if naming is None:
        return table
    rows = [[naming(v) if isinstance(v, str) else v for v in row] for row in table.rows]
    return Table(naming(table.title), table.columns, rows, naming(table.note))


def render_text(table: Table, width: int | None = None, naming: Callable[[str], str] | None = None) -> str:
    """The table as aligned text. With ``width`` (a terminal's columns), columns are left out,
    those with the highest ``drop`` first (never those with ``drop`` 0), then the widest text
    column's cells are cut, until every line fits; a last line names what was left out.
    ``naming``: see ``worded``."""
    table = worded(table, naming)
    headers, cells = formatted(table)
    shown = list(range(len(table.columns)))
    widths = [max([len(h)] + [len(c) for c in col]) for h, col in zip(headers, cells)]

    def total() -> int:
        return sum(widths[j] for j in shown) + 2 * max(len(shown) - 1, 0)

    hidden: list[str] = []
    if width is not None:
        for j in sorted((j for j, c in enumerate(table.columns) if c.drop), key=lambda j: -table.columns[j].drop):
            if total() <= width:
                break
            shown.remove(j)
            hidden.append(table.columns[j].name)
        while total() > width:                       # still too wide: cut the widest text column
            texts = [j for j in shown if table.columns[j].kind == "text"
                     and widths[j] > max(MIN_TEXT_WIDTH, len(headers[j]))]
            if not texts:
                break
            j = max(texts, key=lambda k: widths[k])
            widths[j] = max(MIN_TEXT_WIDTH, len(headers[j]), widths[j] - (total() - width))
            cells[j] = [c if len(c) <= widths[j] else c[:widths[j] - 3] + "..." for c in cells[j]]
    right = [col.kind != "text" for col in table.columns]

    def line(items: Sequence[str]) -> str:
        return "  ".join(items[k].rjust(widths[j]) if right[j] else items[k].ljust(widths[j])
                         for k, j in enumerate(shown)).rstrip()

    title = one_line(table.title)
    out = [title, "=" * len(title), line([headers[j] for j in shown]), line(["-" * widths[j] for j in shown])]
    out += [line([cells[j][i] for j in shown]) for i in range(len(table.rows))]
    if table.note:
        out.append(table.note)
    if hidden:
        left_out = (f"({len(hidden)} column{'s' if len(hidden) > 1 else ''} left out to fit {width} characters: "
                    f"{', '.join(hidden)}; `wide` shows them)")
        out.append(naming(left_out) if naming is not None else left_out)
    return "\n".join(out)


def _plain(value: Any) -> Any:
    if _missing(value):
        return None
    if hasattr(value, "item"):
        return value.item()
    return value


def render(tables: Sequence[Table], fmt: str = "text", width: int | None = None,
           naming: Callable[[str], str] | None = None) -> str:
    """All tables in one of FORMATS (text fitted to ``width`` characters when given). CSV/TSV
    put a ``# title`` line before each table. ``naming``: see ``worded``."""
    if fmt == "text":
        return "\n\n".join(render_text(t, width, naming) for t in tables) + "\n"
    tables = [worded(t, naming) for t in tables]
    if fmt == "json":
        doc = [{"title": t.title, "columns": [c.name for c in t.columns],
                "rows": [{c.name: _plain(v) for c, v in zip(t.columns, row)} for row in t.rows],
                **({"note": t.note} if t.note else {})} for t in tables]
        return json.dumps(doc, indent=1) + "\n"
    if fmt not in ("csv", "tsv"):
        raise ValueError(f"unknown format {fmt}")
    buffer = io.StringIO()
    import csv  # the csv and tsv formats' alone
    writer = csv.writer(buffer, delimiter="," if fmt == "csv" else "\t", lineterminator="\n")
    for n, t in enumerate(tables):
        if n:
            buffer.write("\n")
        if len(tables) > 1:
            buffer.write(f"# {t.title}\n")
        writer.writerow([c.name + ("_bytes" if c.kind in ("bytes", "gib") else "") for c in t.columns])
        for row in t.rows:
            writer.writerow(["" if _missing(v) else _plain(v) for v in row])
    return buffer.getvalue()
