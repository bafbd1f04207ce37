"""Tables for people (aligned text with units) and for machines (CSV, TSV, JSON)."""

from __future__ import annotations

import csv
import io
import json
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..common.text import one_line

__all__ = ["BYTE_COUNT_COLUMNS", "Column", "FORMATS", "IPU_ONLY_COLUMNS", "Table", "gpu_view", "render",
           "render_text"]

FORMATS = ("text", "csv", "tsv", "json")


@dataclass(frozen=True)
class Column:
    """``kind``: text, int, id (an index: no thousands separator), bytes (shown in MB or KB),
    gib (bytes shown in GiB), float, compute (3 significant digits), percent (a fraction shown as %)."""

    name: str
    kind: str = "text"


@dataclass
class Table:
    title: str
    columns: list[Column]
    rows: list[list[Any]] = field(default_factory=list)
    note: str = ""

    def add(self, *values: Any) -> None:
        self.rows.append(list(values))


def _bytes_unit(values: Sequence[Any]) -> tuple[str, float]:
    biggest = max((abs(v) for v in values if isinstance(v, numbers.Real) and not _missing(v)), default=0)
    if biggest >= 1e10:                 # GB only from 10 GB, so MB-sized rows keep their digits
        return "GB", 1e9
    if biggest >= 1e6:
        return "MB", 1e6
    if biggest >= 1e4:
        return "KB", 1e3
    return "B", 1.0


#: columns that only mean something on a many-tile device (an IPU)
IPU_ONLY_COLUMNS = ("worst tile", "tile", "tiles", "vertex code", "vertex state", "exchange code", "control code",
                    "code+state")
#: integer columns that hold bytes (shown in GiB on GPUs)
BYTE_COUNT_COLUMNS = ("worst tile bytes", "variables", "stashed copies")


def gpu_view(table: Table) -> Table:
    """The table as a GPU user reads it: no per-tile or IPU code columns, bytes in GiB
    ("worst tile bytes" is simply the stage's memory on a one-tile device)."""
    keep = [j for j, c in enumerate(table.columns) if c.name not in IPU_ONLY_COLUMNS]
    columns = []
    for j in keep:
        c = table.columns[j]
        if c.kind == "bytes" or (c.kind == "int" and c.name in BYTE_COUNT_COLUMNS):
            c = Column("memory" if c.name == "worst tile bytes" else c.name, "gib")
        columns.append(c)
    title = table.title.replace(" (bytes summed over tiles)", "").replace("; bytes summed over tiles", "")
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


def render_text(table: Table) -> str:
    headers, cells = [], []
    for j, col in enumerate(table.columns):
        values = [row[j] for row in table.rows]
        unit, scale = _bytes_unit(values) if col.kind == "bytes" else ("GiB", 2.0**30) if col.kind == "gib" else ("", 1.0)
        headers.append(one_line(f"{col.name} ({unit})" if unit else col.name))
        cells.append([_format_cell(v, col.kind, scale) for v in values])
    widths = [max([len(h)] + [len(c) for c in col]) for h, col in zip(headers, cells)]
    right = [col.kind != "text" for col in table.columns]

    def line(items: Sequence[str]) -> str:
        return "  ".join(s.rjust(w) if r else s.ljust(w) for s, w, r in zip(items, widths, right)).rstrip()

    title = one_line(table.title)
    out = [title, "=" * len(title), line(headers), line(["-" * w for w in widths])]
    out += [line([col[i] for col in cells]) for i in range(len(table.rows))]
    if table.note:
        out.append(table.note)
    return "\n".join(out)


def _plain(value: Any) -> Any:
    if _missing(value):
        return None
    if hasattr(value, "item"):
        return value.item()
    return value


def render(tables: Sequence[Table], fmt: str = "text") -> str:
    """All tables in one of FORMATS. CSV/TSV put a ``# title`` line before each table."""
    if fmt == "text":
        return "\n\n".join(render_text(t) for t in tables) + "\n"
    if fmt == "json":
        doc = [{"title": t.title, "columns": [c.name for c in t.columns],
                "rows": [{c.name: _plain(v) for c, v in zip(t.columns, row)} for row in t.rows],
                **({"note": t.note} if t.note else {})} for t in tables]
        return json.dumps(doc, indent=1) + "\n"
    if fmt not in ("csv", "tsv"):
        raise ValueError(f"unknown format {fmt}")
    buffer = io.StringIO()
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
