"""The timeline: program steps compressed into columns, variables' live intervals as rows on
those columns, and which layers run in each column.

A column is a run of consecutive steps in which no variable starts or stops being live and no
operation starts or ends, so every quantity that is constant per step is constant per column.
An operation with known steps runs on ``first_step..last_step``; one with unknown steps runs
exactly at the steps where one of its not-always-live variables is live (the union of their
intervals, not its hull), and at no step if it has none.
"""

from __future__ import annotations

import numpy as np

from ..io.profile import Phase, Profile
from ..layers import LayerAssignment
from .itemgroups import sorted_unique

__all__ = ["Timeline", "phase_columns", "ramp"]


def ramp(counts: np.ndarray) -> np.ndarray:
    """0..c-1 for each count c, concatenated: the offsets within each CSR row."""
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    result: np.ndarray = np.arange(total) - np.repeat(starts, counts)
    return result


class Timeline:
    """Columns, interval rows and per-layer column cover of one profile under one layer assignment."""

    def __init__(self, profile: Profile, layers: LayerAssignment, var_nal: np.ndarray):
        self.profile = profile
        self.num_layers = layers.num_layers
        self.num_tiles = profile.target.tiles
        self._build_columns()
        v = profile.variables
        nv = len(v)
        iv = profile.liveness.intervals.values.reshape(-1, 2)
        nal_vars = np.flatnonzero(var_nal)
        cls = v.live_class[nal_vars]
        reps = profile.liveness.intervals.lengths()[cls]
        interval = np.repeat(profile.liveness.intervals.offsets[cls], reps) + ramp(reps)
        row_var = np.repeat(nal_vars, reps)                      # one row per (variable, interval)
        step_start, step_end = iv[interval, 0], iv[interval, 1]
        nonempty = step_end > step_start
        #: interval rows of the not-always-live variables, sorted by variable
        self.row_var = row_var[nonempty]
        self.row_col_start = self.column_of(step_start[nonempty])
        self.row_col_end = self.column_of(step_end[nonempty])   # exclusive
        self.row_tile = v.tile[self.row_var]
        self.row_bytes = v.bytes[self.row_var]
        self.var_row_offsets = np.zeros(nv + 1, np.int64)
        np.cumsum(np.bincount(self.row_var, minlength=nv), out=self.var_row_offsets[1:])
        self._build_op_columns(layers, var_nal)

    def _build_columns(self) -> None:
        p = self.profile
        S = p.num_steps
        iv = p.liveness.intervals.values.reshape(-1, 2)
        ops = p.operations
        known = ops.first_step >= 0
        points = np.concatenate([[0, S], iv[:, 0], iv[:, 1], ops.first_step[known], ops.last_step[known] + 1])
        self.breaks = sorted_unique(np.clip(points, 0, S))     # (np.unique would import numpy.ma: 10 ms)
        if len(self.breaks) < 2:
            self.breaks = np.array([0, max(S, 0)], np.int64) if S > 0 else np.array([0], np.int64)
        self.num_columns = len(self.breaks) - 1

    def column_of(self, step: np.ndarray | int) -> np.ndarray:
        """Column holding ``step``; for a boundary step (an exclusive end) the column it starts."""
        return np.searchsorted(self.breaks, np.asarray(step), side="right") - 1

    def rows_of(self, variables: np.ndarray) -> np.ndarray:
        """The interval rows of the given variables."""
        counts = self.var_row_offsets[variables + 1] - self.var_row_offsets[variables]
        result: np.ndarray = np.repeat(self.var_row_offsets[variables], counts) + ramp(counts)
        return result

    def _build_op_columns(self, layers: LayerAssignment, var_nal: np.ndarray) -> None:
        """Each operation's column hull (``op_col_start``/``op_col_end``), the interval rows
        whose union an unknown-step operation runs on (``op_rows``), and ``cover[l, c]``: some
        operation of layer l runs in column c (``shared_cover``: one with no layer does)."""
        ops = self.profile.operations
        n = len(ops)
        c0 = np.zeros(n, np.int64)
        c1 = np.zeros(n, np.int64)
        known = ops.first_step >= 0
        c0[known] = self.column_of(ops.first_step[known])
        c1[known] = self.column_of(ops.last_step[known] + 1)
        L, G = self.num_layers, self.num_columns
        lay = layers.op_layer
        row = np.where(lay >= 0, lay, L)
        diff = np.zeros((L + 1, G + 1), np.int64)
        np.add.at(diff, (row[known], c0[known]), 1)
        np.add.at(diff, (row[known], c1[known]), -1)
        self.op_rows: dict[int, np.ndarray] = {}
        for i in np.flatnonzero(~known):
            vars_ = ops.vars[i]
            rows = self.rows_of(vars_[var_nal[vars_]])
            self.op_rows[int(i)] = rows
            if len(rows):
                c0[i], c1[i] = self.row_col_start[rows].min(), self.row_col_end[rows].max()
                np.add.at(diff[row[i]], self.row_col_start[rows], 1)
                np.add.at(diff[row[i]], self.row_col_end[rows], -1)
        self.op_col_start, self.op_col_end = c0, c1
        live = np.cumsum(diff, axis=1)[:, :G] > 0
        self.cover = live[:L]
        self.shared_cover = live[L]

    def op_columns(self, op: int) -> np.ndarray:
        """The columns operation ``op`` runs in (sorted)."""
        rows = self.op_rows.get(int(op))
        if rows is None:
            return np.arange(self.op_col_start[op], self.op_col_end[op])
        mask = np.zeros(self.num_columns + 1, np.int64)
        np.add.at(mask, self.row_col_start[rows], 1)
        np.add.at(mask, self.row_col_end[rows], -1)
        return np.flatnonzero(np.cumsum(mask)[:self.num_columns] > 0)

    def live_runs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Maximal runs of consecutive live columns per not-always-live variable: (variable,
        first column, end column exclusive). Touching intervals merge, so a variable's runs do
        not depend on how its liveness was written."""
        var, c0, c1 = self.row_var, self.row_col_start, self.row_col_end
        if not len(var):
            return var, c0, c1
        # rows are sorted by variable and, within one, by start, and do not overlap (validated)
        new = np.ones(len(var), bool)
        new[1:] = (var[1:] != var[:-1]) | (c0[1:] != c1[:-1])
        starts = np.flatnonzero(new)
        ends = np.concatenate([starts[1:], [len(var)]]) - 1
        return var[starts], c0[starts], c1[ends]

    def live_matrix(self, rows: np.ndarray, lo: int, hi: int) -> np.ndarray:
        """Live bytes per (tile, column) in columns lo..hi-1 of the given interval rows."""
        T = self.num_tiles
        width = hi - lo
        if width <= 0:
            return np.zeros((T, 0), np.int64)
        if not len(rows):
            return np.zeros((T, width), np.int64)
        tile = self.row_tile[rows]
        b = self.row_bytes[rows].astype(float)
        start = np.clip(self.row_col_start[rows], lo, hi) - lo
        end = np.clip(self.row_col_end[rows], lo, hi) - lo
        idx = np.concatenate([tile * (width + 1) + start, tile * (width + 1) + end])
        diff = np.bincount(idx, weights=np.concatenate([b, -b]), minlength=T * (width + 1))
        live = np.cumsum(diff.reshape(T, width + 1)[:, :width], axis=1)
        return np.rint(live).astype(np.int64)


def phase_columns(timeline: Timeline, phase: np.ndarray) -> dict[Phase, np.ndarray]:
    """For each phase, the columns an operation of that phase (``phase``: one per operation) runs in."""
    G = timeline.num_columns
    out = {}
    for p in Phase:
        mask = np.zeros(G + 1, np.int64)
        mine = np.flatnonzero(phase == p)
        np.add.at(mask, timeline.op_col_start[mine], 1)
        np.add.at(mask, timeline.op_col_end[mine], -1)
        out[p] = np.cumsum(mask)[:G] > 0
    return out
