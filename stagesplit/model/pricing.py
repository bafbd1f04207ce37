"""All-range pricing: the worst-tile bytes of every contiguous layer range, in one sweep.

A stage ``a..b`` holds the items (variables, programs) of every *group* whose layer set meets
``a..b`` (see ``itemgroups``). Its not-always-live peak on a tile is the maximum, over the stage's
program-step columns, of the live bytes of those groups. Pricing each of the L(L+1)/2 ranges
separately costs layers² x tiles x columns; this module does it in one pass over the timeline:

* **Sweep.** The live bytes of each group on each tile are kept as a running state, updated at
  the columns where a variable's interval starts or ends. A column run by layer ``m`` belongs to
  every stage ``a <= m <= b``. For such a stage a group counts when ``m`` is in its layer set, or
  its nearest layer below ``m`` is ``>= a``, or its nearest above ``m`` is ``<= b``: at most three
  signed cells of an (a, b) grid, so the live bytes of *every* stage holding the column are two
  cumulative sums of a small grid. Only the tiles that changed since the previous column of the
  same layer are re-evaluated, and the per-layer maximum over columns ``Q_m[a, b]`` is kept.
  The ``b`` extent grows only as far as a live group's layer set reaches beyond ``m`` (usually
  not at all: activations of earlier layers do not depend on ``b``).
* **Merge.** For each last layer ``b``: the peak of ``a..b`` is the peak of ``a..b-1`` and the
  ``Q_m[a, b]`` of the layers ``m`` whose columns depend on ``b`` (live bytes only grow with the
  range). Always-live bytes, code and stashed bytes are additive over groups; a group's "meets
  ``a..b``" indicator is a signed sum of interval atoms (one per layer, minus one per pair of
  consecutive layers), added as ``b`` grows. The final reduction over tiles is the only
  layers² x tiles step.

* **One tile** (a GPU's profile), where no column is held by every stage: the sweep needs no
  column-by-column state. Each group's live bytes after every column are a running sum of its
  events, and a layer's columns are graded together, standing where the loop has tiles, ``Q_m``
  their maximum (``_one_tile_peaks``). The maxima depend only on the events, the groups' layer sets
  and which layer holds each column, so they are remembered by a digest of those (``_SweepMemo``):
  the layout search prices one rank under many data-parallel degrees, and under ZeRO only the
  always-live shares and the optimizer step's temporaries change with the degree
  (model/datasharding.py), so the sweeps of the phases before the optimizer's are the same.

Tiles are independent, so the whole computation runs over blocks of tiles when the per-layer
grids would not fit the memory budget. ``costmodel.StageCostModel.stage_memory`` prices one range
from scratch with no shared code; the tests check one against the other.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from ..common.chunks import CHUNK
from .itemgroups import sorted_unique
from .rangetable import RangeTable
from .timeline import ramp as _ramp
from .view import PricingView

__all__ = ["LayerSets", "MEMORY_BUDGET", "RangeTable", "price_all_ranges"]


# bytes of int64 grids per tile block (per-layer maxima, merge rows and the sweep state)
MEMORY_BUDGET = 384 * 2**20


@dataclass(frozen=True)
class LayerSets:
    """Sorted layer sets in CSR form: set ``s`` is ``values[offsets[s]:offsets[s + 1]]``."""

    offsets: np.ndarray
    values: np.ndarray

    @classmethod
    def of(cls, sets: Sequence[np.ndarray]) -> LayerSets:
        lengths = np.array([len(s) for s in sets], np.int64)
        offsets = np.zeros(len(sets) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        values = np.concatenate([np.asarray(s, np.int64) for s in sets]) if len(sets) else np.zeros(0, np.int64)
        return cls(offsets, values)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def atoms(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Interval atoms: (set, lo, hi, sign) such that, for every range a..b (a <= b), the
        number of atoms of a set with ``a <= lo`` and ``hi <= b``, signed, is 1 if the set meets
        a..b and 0 otherwise. One atom (last, first) per run of consecutive layers first..last
        (a..b meets the run when a <= last and first <= b), minus one (last of a run, first of
        the next) per gap between runs (a..b meets both runs when it spans the gap); the runs a
        range meets are consecutive, so k of them count k - (k - 1) = 1."""
        values = self.values
        n = len(values)
        if n == 0:
            empty = np.zeros(0, np.int64)
            return empty, empty.copy(), empty.copy(), empty.copy()
        set_of = np.repeat(np.arange(len(self)), np.diff(self.offsets))
        first_of_set = np.zeros(n, bool)
        first_of_set[self.offsets[:-1][np.diff(self.offsets) > 0]] = True
        starts = np.flatnonzero(first_of_set | np.concatenate([[True], values[1:] != values[:-1] + 1]))
        ends = np.append(starts[1:], n) - 1
        run_set = set_of[starts]
        gap = np.flatnonzero(run_set[1:] == run_set[:-1])     # run i and run i + 1 of the same set
        return (np.concatenate([run_set, run_set[gap]]), np.concatenate([values[ends], values[ends[gap]]]),
                np.concatenate([values[starts], values[starts[gap + 1]]]),
                np.concatenate([np.ones(len(starts), np.int64), -np.ones(len(gap), np.int64)]))

    def around(self, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For each set: whether it holds layer ``m``, its largest layer below ``m`` (-1 if
        none) and its smallest above ``m`` (a large number if none)."""
        n = len(self)
        counts = np.diff(self.offsets)
        key = np.repeat(np.arange(n, dtype=np.int64), counts) * (1 << 32) + self.values
        target = np.arange(n, dtype=np.int64) * (1 << 32) + m
        pos = np.searchsorted(key, target)                # first element >= m within the set
        inside = pos < self.offsets[1:]
        holds = inside & (self.values[np.minimum(pos, len(self.values) - 1)] == m) if len(self.values) else \
            np.zeros(n, bool)
        below = np.where(pos > self.offsets[:-1], self.values[np.maximum(pos - 1, 0)] if len(self.values) else 0, -1)
        above_pos = pos + holds
        above = np.where(above_pos < self.offsets[1:],
                         self.values[np.minimum(above_pos, len(self.values) - 1)] if len(self.values) else 0,
                         np.iinfo(np.int64).max // 4)
        return holds, below.astype(np.int64), above.astype(np.int64)


@dataclass
class _Cells:
    """Signed (row, column) cells of a grid per group, sorted by cell, for one kind of column."""

    group: np.ndarray
    sign: np.ndarray
    row: np.ndarray
    col: np.ndarray
    starts: np.ndarray          # first entry of each distinct cell
    cell_row: np.ndarray
    cell_col: np.ndarray

    @classmethod
    def of(cls, group: np.ndarray, sign: np.ndarray, row: np.ndarray, col: np.ndarray) -> _Cells:
        order = np.lexsort((col, row))
        group, sign, row, col = group[order], sign[order], row[order], col[order]
        new = np.ones(len(row), bool)
        new[1:] = (row[1:] != row[:-1]) | (col[1:] != col[:-1])
        starts = np.flatnonzero(new)
        return cls(group, sign, row, col, starts, row[starts], col[starts])


def _owner_cells(sets: LayerSets, m: int, base: int | None) -> _Cells:
    """Cells of the grid over stages a <= m <= b (row a in 0..m, column b - m) for a column run
    by layer ``m``: a set holding m counts everywhere; otherwise it counts when a <= below or
    b >= above (inclusion-exclusion: three cells)."""
    holds, below, above = sets.around(m)
    groups = np.arange(len(sets))
    has_below, has_above = ~holds & (below >= 0), ~holds & (above < 2**40)
    both = has_below & has_above
    parts = [
        (groups[holds], np.ones(holds.sum(), np.int64), np.full(holds.sum(), m), np.zeros(holds.sum(), np.int64)),
        (groups[has_below], np.ones(has_below.sum(), np.int64), below[has_below], np.zeros(has_below.sum(), np.int64)),
        (groups[has_above], np.ones(has_above.sum(), np.int64), np.full(has_above.sum(), m), above[has_above] - m),
        (groups[both], -np.ones(both.sum(), np.int64), below[both], above[both] - m),
    ]
    if base is not None:
        parts.append((np.array([base]), np.array([1]), np.array([m]), np.array([0])))
    return _Cells.of(*(np.concatenate([p[i] for p in parts]).astype(np.int64) for i in range(4)))


def _local(cells: _Cells, groups: np.ndarray, num_groups: int) -> _Cells:
    """The cells of the given groups only, renumbered 0..len(groups)-1 (groups are sorted)."""
    keep = np.isin(cells.group, groups)
    local = np.full(num_groups, -1, np.int64)
    local[groups] = np.arange(len(groups))
    return _Cells.of(local[cells.group[keep]], cells.sign[keep], cells.row[keep], cells.col[keep])


def _groups_by_owner(model: PricingView, row_group: np.ndarray, num_groups: int,
                     limit: int = 1 << 26) -> dict[int, np.ndarray] | None:
    """For each layer m, the groups with a live interval in one of m's columns (the only
    ones whose state can be non-zero where m runs); None when the group x column table would
    exceed ``limit`` cells (then every group is read)."""
    G, L = model.num_columns, model.num_layers
    if num_groups * (G + 1) > limit or G == 0:
        return None
    keep = row_group >= 0
    at = row_group[keep].astype(np.int64) * (G + 1)
    starts, ends = at + model.timeline.row_col_start[keep], at + model.timeline.row_col_end[keep]
    # +1 where a live interval starts, -1 where it ends, per (group, column): one bincount
    # (float64: exact for any count of rows, and one table instead of two)
    steps = np.ones(2 * len(at))
    steps[len(at):] = -1
    diff = np.bincount(np.concatenate([starts, ends]), weights=steps, minlength=num_groups * (G + 1))
    diff = diff.reshape(num_groups, G + 1)
    live = np.cumsum(diff, axis=1, out=diff)[:, :G] > 0.5
    return {m: np.flatnonzero(live[:, model.timeline.cover[m]].any(axis=1)) for m in range(L)}


def _every_cells(sets: LayerSets, num_layers: int, base: int | None) -> _Cells:
    """Cells of the full grid (row a, column b) for a column every stage holds."""
    group, lo, hi, sign = sets.atoms()
    if base is not None:
        group, lo, hi, sign = (np.append(group, base), np.append(lo, num_layers - 1), np.append(hi, 0),
                               np.append(sign, 1))
    return _Cells.of(group.astype(np.int64), sign.astype(np.int64), lo.astype(np.int64), hi.astype(np.int64))


class _Run:
    """A run of consecutive columns of one layer: per tile, the (a, b) grid at its last full
    evaluation, and since then the total shift and the largest shift of that grid."""

    def __init__(self, tiles: int):
        self.base: np.ndarray | None = None
        self.shift = np.zeros(tiles, np.int64)
        self.top = np.zeros(tiles, np.int64)


def _widen(grid: np.ndarray, extent: int) -> np.ndarray:
    """``grid`` with its b axis extended to ``extent`` columns, repeating the last (a stage's
    bytes stop depending on b beyond the groups seen)."""
    out = np.empty((grid.shape[0], extent, grid.shape[2]), np.int64)
    out[:, :grid.shape[1]] = grid
    out[:, grid.shape[1]:] = grid[:, -1:]
    return out


def _grid_values(cells: _Cells, state: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Live bytes of every (a, b) cell of the grid for the tiles in ``state`` (groups x tiles):
    the signed sum of the cells with row >= a and column <= b."""
    n = state.shape[1]
    if not state.any():                                # nothing live: every cell is 0
        return np.zeros((rows, cols, n), np.int64)
    keep = cells.cell_col < cols
    vals = state[cells.group] * cells.sign[:, None]
    sums = np.add.reduceat(vals, cells.starts, axis=0) if len(vals) else np.zeros((0, n), np.int64)
    grid: np.ndarray = np.zeros((rows * cols, n), np.int64)
    grid[cells.cell_row[keep] * cols + cells.cell_col[keep]] = sums[keep]
    grid = grid.reshape(rows, cols, n)
    grid = np.cumsum(grid[::-1], axis=0)[::-1]
    return np.cumsum(grid, axis=1) if cols > 1 else grid


def _grid_peak(cells: _Cells, state: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """``_grid_values(cells, state, rows, cols).max(axis=2)``, computed on the cells' own rows and
    columns: a cell (r, c) counts in every (a, b) with a <= r and b >= c, so the grid only changes at
    the cells' rows and columns, and its values there (a grid of the distinct rows by the distinct
    columns, a third of the full one's cells on the 405B shape's sweep) give every other (a, b): row
    a takes the first distinct row at or below it (none: 0), column b the last distinct column at or
    before it (none: 0)."""
    n = state.shape[1]
    keep = cells.cell_col < cols
    if not state.any() or not keep.any():
        return np.zeros((rows, cols), np.int64)
    vals = state[cells.group] * cells.sign[:, None]
    sums = np.add.reduceat(vals, cells.starts, axis=0)[keep]
    row, col = cells.cell_row[keep], cells.cell_col[keep]
    rows_at, cols_at = np.unique(row), np.unique(col)
    small = np.zeros((len(rows_at) + 1, len(cols_at) + 1, n), np.int64)       # a zero row below, a zero column before
    small[np.searchsorted(rows_at, row), np.searchsorted(cols_at, col) + 1] = sums
    np.cumsum(small[::-1], axis=0, out=small[::-1])
    np.cumsum(small, axis=1, out=small)
    peak = small.max(axis=2)
    row_of = np.searchsorted(rows_at, np.arange(rows))                          # len(rows_at): the zero row
    col_of = np.searchsorted(cols_at, np.arange(cols), side="right")           # 0: the zero column
    spread: np.ndarray = peak[row_of[:, None], col_of[None, :]]
    return spread


class _Events:
    """Changes of each group's live bytes per (column, tile), aggregated and sorted by column."""

    def __init__(self, model: PricingView, row_group: np.ndarray, num_groups: int):
        G, T = model.num_columns, model.num_tiles
        keep = row_group >= 0
        col = np.concatenate([model.timeline.row_col_start[keep], model.timeline.row_col_end[keep]])
        group = np.concatenate([row_group[keep], row_group[keep]])
        tile = np.concatenate([model.timeline.row_tile[keep], model.timeline.row_tile[keep]])
        nbytes = model.timeline.row_bytes[keep].astype(np.int64)
        delta = np.concatenate([nbytes, -nbytes])
        inside = col < G
        key = (col[inside] * num_groups + group[inside]) * T + tile[inside]
        delta = delta[inside]
        order = np.argsort(key, kind="stable")
        key, delta = key[order], delta[order]
        new = np.ones(len(key), bool)
        new[1:] = key[1:] != key[:-1]
        starts = np.flatnonzero(new)
        delta = np.add.reduceat(delta, starts) if len(starts) else delta
        key = key[starts]
        nonzero = delta != 0
        key, delta = key[nonzero], delta[nonzero]
        self.tile = key % T
        self.group = (key // T) % num_groups
        self.delta = delta
        self.column_ptr = np.searchsorted(key // (T * num_groups), np.arange(G + 1))


def _set_tile_sums(item_set: np.ndarray, tile: np.ndarray, weight: np.ndarray, num_sets: int,
                   T: int, set_of: np.ndarray | None = None,
                   chunk: int = CHUNK) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(set, tile, summed weight) of the items with a set, one row per nonzero pair, and the
    per-tile sum of the items with none (set -1). With ``set_of``, an item's set is
    ``set_of[item_set]``. Done in chunks: the per-program code arrays run to tens of millions."""
    if (num_sets + 1) * T <= 2**26:
        sums = np.zeros((num_sets + 1) * T)
        # set -1 (none) goes to the extra set num_sets, and the tile is folded into the key
        if set_of is not None:
            shifted = np.where(set_of < 0, num_sets, set_of).astype(np.int64) * T
        for start in range(0, len(tile), chunk):
            part = slice(start, start + chunk)
            if set_of is not None:
                where = shifted[item_set[part]]
            else:
                where = np.where(item_set[part] < 0, num_sets, item_set[part]).astype(np.int64) * T
            where += tile[part]
            sums += np.bincount(where, weights=weight[part], minlength=(num_sets + 1) * T)
        key = np.flatnonzero(sums[:num_sets * T])
        values: np.ndarray = sums[key]
    else:
        where = item_set if set_of is None else set_of[item_set]
        where = np.where(where < 0, num_sets, where).astype(np.int64) * T + tile
        key, inverse = np.unique(where, return_inverse=True)
        values = np.bincount(inverse.reshape(-1), weights=weight, minlength=len(key))
        sums = np.zeros((num_sets + 1) * T)
        shared = key >= num_sets * T
        sums[key[shared]] = values[shared]
        key, values = key[~shared], values[~shared]
    return key // T, key % T, np.rint(values).astype(np.int64), np.rint(sums[num_sets * T:]).astype(np.int64)


class _AtomTable:
    """Per-tile bytes summed by interval atom (lo, hi): the additive part of a stage's memory,
    in two kinds: ``plain`` (held once) and ``stash`` (held once per micro-batch in flight)."""

    KINDS = ("plain", "stash")

    def __init__(self, num_layers: int, num_tiles: int):
        self.L, self.T = max(num_layers, 1), num_tiles
        self.parts: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {k: [] for k in self.KINDS}

    def add(self, sets: LayerSets, set_id: np.ndarray | None, tile: np.ndarray, weight: np.ndarray, kind: str) -> None:
        """Add (set, tile, bytes) rows of one kind through each set's atoms. ``set_id`` None:
        row i is set i, each set once (no sort or repeat needed)."""
        s_of, lo, hi, sign = sets.atoms()
        if set_id is None:                                  # one row per set: every atom once
            self.parts[kind].append((lo * self.L + hi, tile[s_of], weight[s_of] * sign))
            return
        order = np.argsort(s_of, kind="stable")
        offsets = np.searchsorted(s_of[order], np.arange(len(sets) + 1))
        counts = offsets[1:][set_id] - offsets[:-1][set_id]
        atom = order[np.repeat(offsets[:-1][set_id], counts) + _ramp(counts)]
        self.parts[kind].append((lo[atom] * self.L + hi[atom], np.repeat(tile, counts),
                                 np.repeat(weight, counts) * sign[atom]))

    def finish(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(lo, hi, plain bytes per tile, stashed bytes per tile), one row per distinct atom."""
        T = self.T
        # atoms are (lo, hi) pairs of layers: a dense map of L x L numbers them without sorting
        present = np.zeros(self.L * self.L, bool)
        for kind in self.KINDS:
            for key, _, _ in self.parts[kind]:
                present[key] = True
        keys = np.flatnonzero(present)
        number = np.zeros(self.L * self.L, np.int64)
        number[keys] = np.arange(len(keys))
        out = []
        for kind in self.KINDS:
            total = np.zeros(len(keys) * T)
            for key, tile, weight in self.parts[kind]:
                at = number[key] * T + tile
                total += np.bincount(at, weights=weight.astype(float), minlength=len(keys) * T)
            out.append(np.rint(total).astype(np.int64).reshape(len(keys), T))
        return keys // self.L, keys % self.L, out[0], out[1]


def _additive_atoms(model: PricingView, T: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                                               np.ndarray, np.ndarray]:
    """Per-tile bytes that are added, not peaked: always-live variables and code (``plain``)
    and stashed variables (``stash``), as interval atoms (lo, hi) plus a base every stage holds."""
    v = model.profile.variables
    pr = model.profile.programs
    L = model.num_layers
    every = model.shared == "every"
    table = _AtomTable(L, T)
    base_plain = np.zeros(T, np.int64)
    base_stash = np.zeros(T, np.int64)

    def add(sets: LayerSets, item_set: np.ndarray, tile: np.ndarray, plain: np.ndarray,
            stash: np.ndarray | None, set_of: np.ndarray | None = None) -> None:
        for weight, is_plain in ((plain, True), (stash, False)):
            if weight is None:
                continue
            s, t, w, shared = _set_tile_sums(item_set, tile, weight, len(sets), T, set_of)
            table.add(sets, s, t, w, "plain" if is_plain else "stash")
            if every:
                (base_plain if is_plain else base_stash)[:] += shared

    # variables: always-live bytes, and stashed bytes (held once per micro-batch in flight)
    zero = np.zeros(len(v), np.int64)
    items = model.var_items
    add(LayerSets.of(items.group_layers), items.group, v.tile, np.where(v.always_live, v.bytes, zero),
        np.where(model.var_stashed, v.bytes, zero))
    # additive program code
    prog_sets = LayerSets.of(model.prog_items.group_layers)
    for costs in pr.categories().values():
        add(prog_sets, costs.program, costs.tile, costs.bytes, None, set_of=model.prog_items.group)
    # vertex code: one size per (tile, vertex type), present when any program bringing it is
    vc = pr.vertex_code
    ntypes = max(len(pr.vertex_types), 1)
    num_cells = T * ntypes
    npg = len(prog_sets)
    if num_cells * (npg + 1) <= 2**26:               # (cell, group) presence without sorting, in chunks
        present: np.ndarray = np.zeros(num_cells * (npg + 1), bool)
        column = np.where(model.prog_items.group < 0, npg, model.prog_items.group).astype(np.int64)
        for start in range(0, len(vc), CHUNK):
            part = slice(start, start + CHUNK)
            key = vc.tile[part].astype(np.int64) * (ntypes * (npg + 1))
            key += vc.vertex_type[part].astype(np.int64) * (npg + 1)   # stored as narrow as int8
            key += column[vc.program[part]]
            present[key] = True
        present = present.reshape(num_cells, npg + 1)
        in_base = present[:, npg] if every else np.zeros(num_cells, bool)
        pair_cell, pair_group = np.nonzero(present[:, :npg] & ~in_base[:, None])
    else:
        group = model.prog_items.group[vc.program]
        cell = vc.tile.astype(np.int64) * ntypes + vc.vertex_type
        key = np.unique(cell * (npg + 1) + np.where(group < 0, npg, group))
        kc, kg = key // (npg + 1), key % (npg + 1)
        in_base = np.zeros(num_cells, bool)
        if every:
            in_base[kc[kg == npg]] = True
        keep = (kg < npg) & ~in_base[kc]
        pair_cell, pair_group = kc[keep], kg[keep]
    base_cells = np.flatnonzero(in_base)
    if len(base_cells):
        sizes = model.vertex_code_size[base_cells // ntypes, base_cells % ntypes].astype(float)
        base_plain += np.rint(np.bincount(base_cells // ntypes, weights=sizes, minlength=T)).astype(np.int64)
    counts = np.diff(prog_sets.offsets)[pair_group]
    idx = np.repeat(prog_sets.offsets[:-1][pair_group], counts) + _ramp(counts)
    pair = sorted_unique(np.repeat(pair_cell.astype(np.int64), counts) * max(L, 1) + prog_sets.values[idx])
    pair_cell, pair_layer = pair // max(L, 1), pair % max(L, 1)
    first = np.flatnonzero(np.concatenate([[True], pair_cell[1:] != pair_cell[:-1]])) if len(pair_cell) else \
        np.zeros(0, np.int64)
    cells = pair_cell[first]
    cell_sets = LayerSets(np.append(first, len(pair_cell)).astype(np.int64), pair_layer.astype(np.int64))
    size = model.vertex_code_size[cells // ntypes, cells % ntypes].astype(np.int64)
    table.add(cell_sets, None, (cells // ntypes).astype(np.int64), size, "plain")
    lo, hi, plain, stash = table.finish()
    return lo, hi, plain, stash, base_plain, base_stash


def _merge_rows(lo: np.ndarray, hi: np.ndarray, plain: np.ndarray, stash: np.ndarray,
                L: int) -> tuple[np.ndarray, ...]:
    """The additive atoms (``plain``/``stash``: one row of per-tile bytes each) as the merge adds
    them. An atom (lo, hi) counts for a range a..b when a <= lo and hi <= b: it joins at b = hi,
    for the first layers a <= min(lo, hi) (one row per distinct (min(lo, hi), hi), summed); a run
    atom (lo > hi) also counts for the first layers hi < a <= lo, whose rows start after b = hi:
    ``start_*[a]`` gives them it then. Returns (row, hi, plain, stash, start_plain, start_stash)."""
    T = plain.shape[1]
    starts = []
    late = np.flatnonzero(lo > hi)
    for weights in (plain, stash):
        diff = np.zeros((L + 1, T), np.int64)
        if len(late):
            np.add.at(diff, hi[late] + 1, weights[late])
            np.add.at(diff, lo[late] + 1, -weights[late])
        starts.append(np.cumsum(diff, axis=0)[:L])
    row = np.minimum(lo, hi)
    key, inverse = np.unique(row * max(L, 1) + hi, return_inverse=True)
    inverse = inverse.reshape(-1)
    merged = []
    for weights in (plain, stash):
        out = np.zeros((len(key), T), np.int64)
        np.add.at(out, inverse, weights)
        merged.append(out)
    return key // max(L, 1), key % max(L, 1), merged[0], merged[1], starts[0], starts[1]


def _one_tile_peaks(sets: LayerSets, events: _Events, owner_col: np.ndarray, owner_layer: np.ndarray,
                    num_groups: int, G: int, base: int | None, memory_budget: int) -> dict[int, np.ndarray]:
    """The sweep's per-layer maxima ``Q_m[a, b]`` (layer m -> (m + 1, b extent, 1)) on one tile, where
    no column is held by every stage: what the column loop of ``price_all_ranges`` folds column by
    column, here for all of a layer's columns at once. The live bytes of each group after every
    column are the running sum of its events (in blocks of columns that keep that table under
    ``memory_budget``); a layer's columns then stand where the loop has tiles: ``_grid_values`` gives
    the (a, b) grid of each from the groups with bytes in one of them, and ``Q_m`` is their maximum.
    The extent in ``b`` is as the loop makes it: as far as a live group's nearest layer above reaches."""
    event_col = np.repeat(np.arange(G), np.diff(events.column_ptr))
    peaks: dict[int, np.ndarray] = {}
    owner_cells: dict[int, _Cells] = {}
    carry = np.zeros(num_groups, np.int64)
    step = max(1, memory_budget // (8 * max(num_groups, 1)))
    for c0 in range(0, G, step):
        c1 = min(G, c0 + step)
        e0, e1 = events.column_ptr[c0], events.column_ptr[c1]
        live = np.zeros((c1 - c0, num_groups), np.int64)
        live[event_col[e0:e1] - c0, events.group[e0:e1]] = events.delta[e0:e1]     # one event per (column, group)
        np.cumsum(live, axis=0, out=live)
        live += carry
        carry = live[-1].copy()
        p0, p1 = np.searchsorted(owner_col, (c0, c1))
        order = np.argsort(owner_layer[p0:p1], kind="stable")
        layers, cols = owner_layer[p0:p1][order], owner_col[p0:p1][order] - c0
        if not len(layers):
            continue
        bounds = np.flatnonzero(np.diff(layers)) + 1
        for first, last in zip(np.concatenate([[0], bounds]), np.concatenate([bounds, [len(layers)]])):
            m = int(layers[first])
            state = live[cols[first:last]]
            groups = np.flatnonzero(state.any(axis=0))
            if not len(groups):                      # nothing live in these columns: the grid is 0
                peaks.setdefault(m, np.zeros((m + 1, 1, 1), np.int64))
                continue
            if m not in owner_cells:
                owner_cells[m] = _owner_cells(sets, m, base)
            cells = _local(owner_cells[m], groups, num_groups)
            extent = int(cells.col.max(initial=0)) + 1
            sub = np.ascontiguousarray(state[:, groups].T)       # groups x columns, as the loop's groups x tiles
            peak = np.zeros((m + 1, extent, 1), np.int64)
            width = max(1, memory_budget // (8 * (m + 1) * extent))
            for w0 in range(0, sub.shape[1], width):
                np.maximum(peak[:, :, 0], _grid_peak(cells, sub[:, w0:w0 + width], m + 1, extent), out=peak[:, :, 0])
            old = peaks.get(m)
            if old is not None:
                wide = max(old.shape[1], extent)
                old, peak = (_widen(x, wide) if x.shape[1] < wide else x for x in (old, peak))
                peak = np.maximum(old, peak)
            peaks[m] = peak
    return peaks


class _SweepMemo:
    """The one-tile sweeps' per-layer maxima, by a digest of everything they are computed from
    (``_one_tile_peaks``'s arguments but the memory budget, which only blocks the work), the least
    recently used dropped beyond ``budget`` bytes (a 126-layer rank's sweep holds about 64 KB). The
    maxima are made read-only: the merge only reads them."""

    def __init__(self, budget: int = 64 * 2**20):
        self.budget = budget
        self._kept: OrderedDict[bytes, dict[int, np.ndarray]] = OrderedDict()
        self._bytes = 0

    @staticmethod
    def key(sets: LayerSets, events: _Events, owner_col: np.ndarray, owner_layer: np.ndarray, num_groups: int,
            G: int, base: int | None) -> bytes:
        # the events after the last column a layer holds change no maximum (the optimizer step's
        # temporaries, sized by the data-parallel degree, for every phase before it)
        last = int(owner_col.max()) if len(owner_col) else -1
        end = int(events.column_ptr[last + 1])
        h = hashlib.blake2b(digest_size=20)
        h.update(f"{num_groups}|{G}|{base}|{last}".encode())
        for array in (sets.offsets, sets.values, events.tile[:end], events.group[:end], events.delta[:end],
                      events.column_ptr[:last + 2], owner_col, owner_layer):
            h.update(b"|")
            h.update(np.ascontiguousarray(array, np.int64).tobytes())
        return h.digest()

    def get(self, key: bytes) -> dict[int, np.ndarray] | None:
        found = self._kept.get(key)
        if found is not None:
            self._kept.move_to_end(key)
        return found

    def put(self, key: bytes, peaks: dict[int, np.ndarray]) -> None:
        for grid in peaks.values():
            grid.flags.writeable = False
        self._kept[key] = peaks
        self._bytes += self._size(peaks)
        while self._bytes > self.budget and len(self._kept) > 1:
            self._bytes -= self._size(self._kept.popitem(last=False)[1])

    def clear(self) -> None:
        self._kept.clear()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._kept)

    @staticmethod
    def _size(peaks: dict[int, np.ndarray]) -> int:
        return sum(grid.nbytes for grid in peaks.values())


_SWEEPS = _SweepMemo()


def price_all_ranges(model: PricingView, in_flight: Sequence[int] = (1,),
                     progress: Callable[[int, int], None] | None = None,
                     memory_budget: int = MEMORY_BUDGET, capacity: int | None = None) -> RangeTable:
    """Worst-tile bytes (for each in-flight count) of every range a..b of ``model``, kept on the
    band of the ranges that fit ``capacity`` bytes per tile (all of them for None)."""
    L, T, G = model.num_layers, model.num_tiles, model.num_columns
    ks = tuple(sorted(set(int(k) for k in in_flight)))
    k_minus_one = np.array(ks, np.int64) - 1
    worst = np.zeros((len(ks), L, L), np.int64)
    worst_tile = np.zeros((len(ks), L, L), np.int64)
    prefix = model.compute_prefix
    if L == 0 or T == 0:
        return RangeTable.dense(ks, worst, worst_tile, capacity, prefix)

    every = model.shared == "every"
    sets = LayerSets.of(model.var_items.group_layers)
    base = len(sets) if every else None
    num_groups = len(sets) + 1
    row_group = model.var_items.group[model.timeline.row_var]
    if every:
        row_group = np.where(row_group < 0, len(sets), row_group)
    events = _Events(model, row_group, num_groups)
    add_lo, add_hi, add_plain, add_stash, base_plain, base_stash = _additive_atoms(model, T)
    add_row, add_hi, add_plain, add_stash, start_plain, start_stash = _merge_rows(add_lo, add_hi, add_plain,
                                                                                 add_stash, L)
    by_hi = np.argsort(add_hi, kind="stable")
    hi_ptr = np.searchsorted(add_hi[by_hi], np.arange(L + 1))

    cover = model.timeline.cover
    every_cols = model.base_stage_cols if every else np.zeros(G, bool)
    owner_col, owner_layer = np.nonzero(cover.T)
    owner_ptr = np.searchsorted(owner_col, np.arange(G + 1))
    owner_cells: dict[int, tuple[_Cells, np.ndarray | None]] = {}
    one_tile = T == 1 and not every_cols.any()      # the sweep of _one_tile_peaks, which needs no owner groups
    owner_groups = None if one_tile else _groups_by_owner(model, row_group, num_groups)
    holding: dict[int, np.ndarray] = {}

    def holds_m(m: int) -> np.ndarray:
        """Which groups (the base one included) hold layer m."""
        if m not in holding:
            holding[m] = np.append(sets.around(m)[0], True)
        return holding[m]
    every_cells = _every_cells(sets, L, base) if every_cols.any() else None

    # tile blocks: per-layer maxima grow to about L²/2 x (a few columns) x tiles int64
    per_tile = 8 * (L * L * (2 + int(every_cols.any())) + 4 * L + 2 * num_groups)
    block = int(max(1, min(T, memory_budget // max(per_tile, 1))))
    total_work = G * ((T + block - 1) // block) + L * ((T + block - 1) // block)
    done = 0
    best = np.full((len(ks), L, L), -1, np.int64)
    for t0 in range(0, T, block):
        t1 = min(T, t0 + block)
        tb = t1 - t0
        in_block = (events.tile >= t0) & (events.tile < t1)
        ev_ptr = np.concatenate([[0], np.cumsum(in_block)])[events.column_ptr]
        ev_tile, ev_group, ev_delta = events.tile[in_block] - t0, events.group[in_block], events.delta[in_block]
        state = np.zeros((num_groups, tb), np.int64)
        peaks: dict[int, np.ndarray] = {}                    # layer m -> (m + 1, b extent, tiles)
        every_peak: np.ndarray | None = None               # (L, L, tiles), made at the first live bytes
        all_tiles = np.arange(tb)
        touched = np.zeros(tb, bool)
        runs: dict[int, _Run] = {}

        def cells_of(m: int) -> tuple[_Cells, np.ndarray | None]:
            if m not in owner_cells:
                cells, groups = _owner_cells(sets, m, base), None
                if owner_groups is not None:
                    groups = owner_groups[m]
                    cells = _local(cells, groups, num_groups)
                owner_cells[m] = cells, groups
            return owner_cells[m]

        # peak_of, fold and evaluate are called only within this block's iteration: its peaks, tb
        # and state are the ones meant
        def peak_of(m: int, extent: int, run: _Run) -> np.ndarray:
            """Layer m's maxima (and the run's grids) with at least ``extent`` b columns."""
            peak = peaks.get(m)  # noqa: B023
            if peak is None:
                peak = peaks[m] = np.zeros((m + 1, extent, tb), np.int64)  # noqa: B023
            elif extent > peak.shape[1]:                 # b now matters further: extend with the last column
                peak = peaks[m] = _widen(peak, extent)  # noqa: B023
            if run.base is None:
                run.base = np.zeros_like(peak)
            elif run.base.shape[1] < peak.shape[1]:
                run.base = _widen(run.base, peak.shape[1])
            return peak

        def fold(m: int, run: _Run, tiles: np.ndarray) -> None:
            """peak = max(peak, grid at the last evaluation + the largest shift since)."""
            peak = peaks[m]  # noqa: B023
            assert run.base is not None                  # made at the run's first evaluation
            peak[:, :, tiles] = np.maximum(peak[:, :, tiles], run.base[:, :, tiles] + run.top[tiles])

        def evaluate(m: int, run: _Run, tiles: np.ndarray) -> None:
            """The (a, b) grid of the given tiles from the current state, after folding the old."""
            cells, groups = cells_of(m)
            sub = state[:, tiles] if groups is None else state[np.ix_(groups, tiles)]  # noqa: B023
            live = cast(np.ndarray, sub.any(axis=1))[cells.group]
            peak = peak_of(m, int(cells.col[live].max(initial=0)) + 1, run)
            fold(m, run, tiles)
            assert run.base is not None                  # peak_of makes it
            run.base[:, :, tiles] = _grid_values(cells, sub, m + 1, peak.shape[1])
            run.shift[tiles] = 0
            run.top[tiles] = 0
        if one_tile:                  # a GPU: every layer's columns at once (the same sweep once)
            key = _SweepMemo.key(sets, events, owner_col, owner_layer, num_groups, G, base)
            remembered = _SWEEPS.get(key)
            if remembered is None:
                remembered = _one_tile_peaks(sets, events, owner_col, owner_layer, num_groups, G, base, memory_budget)
                _SWEEPS.put(key, remembered)
            peaks = dict(remembered)
            done += G
        else:
            for c in range(G):
                lo, hi = ev_ptr[c], ev_ptr[c + 1]
                if hi > lo:
                    state[ev_group[lo:hi], ev_tile[lo:hi]] += ev_delta[lo:hi]
                    touched[ev_tile[lo:hi]] = True
                    changed = np.flatnonzero(touched)
                    touched[changed] = False
                else:
                    changed = ev_tile[lo:hi]
                here = ev_group[lo:hi]
                for m in owner_layer[owner_ptr[c]:owner_ptr[c + 1]]:
                    m = int(m)
                    if not (c > 0 and cover[m, c - 1]):                   # a run of m's columns starts
                        run = runs[m] = _Run(tb)
                        evaluate(m, run, all_tiles)
                    elif len(changed):
                        run = runs[m]
                        if holds_m(m)[here].all():
                            # every change is to a group holding m: the same bytes for every stage
                            # a <= m <= b, so the (a, b) grid of each changed tile just shifts
                            np.add.at(run.shift, ev_tile[lo:hi], ev_delta[lo:hi])
                            run.top[changed] = np.maximum(run.top[changed], run.shift[changed])
                        else:
                            evaluate(m, run, changed)
                    if c + 1 == G or not cover[m, c + 1]:                 # the run ends: fold it
                        run = runs.pop(m)
                        fold(m, run, all_tiles)
                if every_cells is not None and every_cols[c]:
                    tiles = changed if (c > 0 and every_cols[c - 1]) else all_tiles
                    if len(tiles) and state[:, tiles].any():        # no live bytes: the grid is 0, the peak stays
                        grid = _grid_values(every_cells, state[:, tiles], L, L)
                        if every_peak is None:
                            every_peak = np.zeros((L, L, tb), np.int64)
                        every_peak[:, :, tiles] = np.maximum(every_peak[:, :, tiles], grid)
                done += 1
                if progress is not None and c % 256 == 0:
                    progress(done, total_work)

        # merge: grow b, keeping each first layer's peak, additive bytes and stash
        by_end: dict[int, list[int]] = {}
        for m, p in peaks.items():
            for b in range(m, m + p.shape[1]):
                by_end.setdefault(b, []).append(m)
        cur = np.zeros((L, tb), np.int64)
        plain = np.zeros((L, tb), np.int64)
        stash = np.zeros((L, tb), np.int64)
        add_plain_b, add_stash_b = add_plain[:, t0:t1], add_stash[:, t0:t1]
        for b in range(L):
            plain[b] = base_plain[t0:t1] + start_plain[b, t0:t1]
            stash[b] = base_stash[t0:t1] + start_stash[b, t0:t1]
            for m in by_end.get(b, ()):
                np.maximum(cur[:m + 1], peaks[m][:, b - m], out=cur[:m + 1])
            if every_peak is not None:
                np.maximum(cur[:b + 1], every_peak[:b + 1, b], out=cur[:b + 1])
            atoms = by_hi[hi_ptr[b]:hi_ptr[b + 1]]
            if len(atoms):
                rows = add_row[atoms]
                for src, dst in ((add_plain_b, plain), (add_stash_b, stash)):
                    z = np.zeros((b + 1, tb), np.int64)
                    z[rows] = src[atoms]
                    dst[:b + 1] += np.cumsum(z[::-1], axis=0)[::-1]
            total = cur[:b + 1] + plain[:b + 1]
            for i, k1 in enumerate(k_minus_one):
                with_stash = total + k1 * stash[:b + 1] if k1 else total
                tile = with_stash.argmax(axis=1)
                value = with_stash[np.arange(b + 1), tile]
                better = value > best[i, :b + 1, b]
                best[i, :b + 1, b] = np.where(better, value, best[i, :b + 1, b])
                worst_tile[i, :b + 1, b] = np.where(better, tile + t0, worst_tile[i, :b + 1, b])
            done += 1
            if progress is not None:
                progress(done, total_work)
    worst = np.triu(np.maximum(best, 0))
    worst_tile = np.triu(worst_tile)
    if progress is not None:
        progress(total_work, total_work)
    return RangeTable.dense(ks, worst, worst_tile, capacity, prefix)

