"""Helpers for notebooks: pandas DataFrames and rich HTML display of plans, sweeps and
breakdowns. pandas is imported only when a frame is asked for, so the command line's light
commands never load it."""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

__all__ = ["frame", "html_summary", "pandas"]


def pandas():
    """The pandas module, imported on first use."""
    import pandas as pd
    return pd


def frame(columns: Mapping[str, tuple[Iterable[Any], Any]], index: tuple[str, Iterable[Any], Any] | None = None,
          attrs: Mapping[str, Any] | None = None):
    """A DataFrame from ``{name: (values, dtype)}`` in order, each column cast to its dtype (so
    an empty frame keeps its column types); ``index`` is ``(name, values, dtype)``."""
    pd = pandas()
    arrays = {name: (_array(values, dtype), dtype) for name, (values, dtype) in columns.items()}
    if index is not None:
        name, values, dtype = index
        idx = pd.Index(_array(values, dtype), dtype=dtype, name=name)
    else:
        idx = pd.RangeIndex(len(next(iter(arrays.values()))[0]) if arrays else 0)
    df = pd.DataFrame({name: pd.Series(values, dtype=dtype, index=idx) for name, (values, dtype) in arrays.items()},
                      index=idx)
    df.attrs.update(attrs or {})
    return df


def _array(values: Iterable[Any], dtype: Any) -> Any:
    """Numeric values as a numpy array of ``dtype`` (None becomes NaN in a float column); a
    list for object and pandas' nullable dtypes."""
    if dtype in (object, "object", "string", "Int64", "boolean"):
        return list(values)
    return np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=dtype)


def html_summary(title: str, lines: Iterable[str], frame_html: str = "") -> str:
    """A compact HTML block: a bold title, the summary lines (escaped: layer and profile names
    come from untrusted files), then a table already rendered (and escaped) by ``to_html``."""
    body = "<br>\n".join(html.escape(line) for line in lines)
    return (f'<div class="stagesplit">\n<p><b>{html.escape(title)}</b><br>\n{body}</p>\n'
            f"{frame_html}\n</div>")
