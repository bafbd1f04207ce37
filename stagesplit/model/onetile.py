"""One-tile profiles (captured on a GPU, or any profile of one tile that is not per-layer):
the liveness peak of each range, priced on the band of ranges that can fit, not the L x L triangle.

A stage ``a..b`` holds the items of every set (a group's layers) that meets ``a..b``, i.e. whose
first layer at or after ``a`` is at most ``b``. So for a first layer ``a`` an item *joins* the
stage at the offset ``j = next(S, a) - a`` and stays for every longer stage. The band is filled
one offset ``j`` (column) at a time, for every first layer at once:

* additive bytes (always-live variables, program code, each vertex type's code once, stashed
  variables) grow by the items that join at ``j``;
* the live bytes per (first layer, program-step column) grow by the interval rows that join at
  ``j``, the stage's columns by those of layer ``a + j``, and the peak is the maximum over them.

It stops at the first offset where no stage fits ``capacity``. One tile, so the bytes with ``k``
micro-batches in flight are ``once + (k - 1) x stash`` (the linear ``RangeTable``). Work: about
width x L x columns; the first layers go in blocks that keep the live-byte grid under
``MEMORY_BUDGET``. ``stagememory.price_stage`` prices one range from scratch with no code in
common; tests/model/test_onetile.py checks one against the other and against the sweep.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from .itemgroups import sorted_unique
from .rangetable import OVER, RangeTable
from .timeline import Timeline, ramp
from .view import PricingView

__all__ = ["MEMORY_BUDGET", "price_one_tile_ranges"]

#: bytes of the (first layers x columns) live-byte grid per block of first layers
MEMORY_BUDGET = 64 * 2**20


class _Joins:
    """Items by the offset at which they join a stage: for a set S and a first layer a, the
    offset next(S, a) - a. ``pairs(j)`` gives the (first layer, item) pairs joining at j."""

    def __init__(self, sets: list[np.ndarray], item_set: np.ndarray, L: int):
        # per set: consecutive layers (prev, cur); first layers a in (prev, cur] join at cur - a
        lengths = np.array([len(s) for s in sets], np.int64)
        cur = np.concatenate(sets).astype(np.int64) if len(sets) else np.zeros(0, np.int64)
        set_of = np.repeat(np.arange(len(sets)), lengths)
        prev = np.concatenate([[-1], cur[:-1]]) if len(cur) else cur
        first = np.concatenate([[True], set_of[1:] != set_of[:-1]]) if len(cur) else np.zeros(0, bool)
        prev = np.where(first, -1, prev)
        span = cur - prev                                  # first layers prev+1..cur
        a = np.repeat(cur, span) - ramp(span)              # cur, cur-1, ..., prev+1
        offset = np.repeat(cur, span) - a
        pair_set = np.repeat(set_of, span)
        # items of each set (sorted by set), expanded per (first layer, set) pair
        order = np.argsort(item_set, kind="stable")
        order = order[item_set[order] >= 0]
        counts = np.bincount(item_set[order], minlength=len(sets)) if len(order) else np.zeros(len(sets), np.int64)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        per_pair = counts[pair_set]
        item = order[np.repeat(starts[pair_set], per_pair) + ramp(per_pair)] if len(order) else np.zeros(0, np.int64)
        a, offset = np.repeat(a, per_pair), np.repeat(offset, per_pair)
        by = np.argsort(offset, kind="stable")
        self.a, self.item, self.offset = a[by], item[by], offset[by]
        self.ptr = np.searchsorted(self.offset, np.arange(L + 1))

    def pairs(self, j: int) -> tuple[np.ndarray, np.ndarray]:
        part = slice(self.ptr[j], self.ptr[j + 1])
        return self.a[part], self.item[part]


def _item_sets(model: PricingView) -> tuple[list[np.ndarray], dict[str, np.ndarray], dict[str, int]]:
    """The additive items as one list of layer sets with a weight per set per kind ("once",
    "stash"), and the bytes every stage holds (the shared items when every stage holds them)."""
    v = model.profile.variables
    pr = model.profile.programs
    every = model.shared == "every"
    sets: list[np.ndarray] = []
    weights: dict[str, list[np.ndarray]] = {"once": [], "stash": []}
    base = {"once": 0, "stash": 0}

    def add(group_layers: list[np.ndarray], group: np.ndarray, once: np.ndarray, stash: np.ndarray | None) -> None:
        n = len(group_layers)
        inside = group >= 0
        for kind, w in (("once", once), ("stash", stash)):
            per_set = np.zeros(n, np.int64)
            if w is not None:
                per_set = np.rint(np.bincount(group[inside], weights=w[inside].astype(float), minlength=n)[:n]) \
                    .astype(np.int64)
                if every:
                    base[kind] += int(w[~inside].sum())
            weights[kind].append(per_set)
        sets.extend(group_layers)

    zero = np.zeros(len(v), np.int64)
    add(model.var_items.group_layers, model.var_items.group, np.where(v.always_live, v.bytes, zero),
        np.where(model.var_stashed, v.bytes, zero))
    # program code (vertex state, exchange and control code): summed per program
    code = np.zeros(len(pr), np.int64)
    for costs in pr.categories().values():
        code += np.bincount(costs.program, weights=costs.bytes.astype(float), minlength=len(pr))[:len(pr)] \
            .round().astype(np.int64)
    add(model.prog_items.group_layers, model.prog_items.group, code, None)
    # vertex code: each vertex type once, present with any program bringing it
    vc = pr.vertex_code
    if len(vc):
        ntypes = max(len(pr.vertex_types), 1)
        npg = len(model.prog_items.group_layers)
        group = model.prog_items.group[vc.program]
        key = sorted_unique(vc.vertex_type.astype(np.int64) * (npg + 1) + np.where(group < 0, npg, group))
        vtype, vgroup = key // (npg + 1), key % (npg + 1)
        size = model.vertex_code_size[0, :ntypes].astype(np.int64)
        in_base = np.zeros(ntypes, bool)
        if every:
            in_base[vtype[vgroup == npg]] = True
        base["once"] += int(size[in_base].sum())
        keep = (vgroup < npg) & ~in_base[vtype]
        type_sets: list[np.ndarray] = []
        type_ids = []
        for t in np.unique(vtype[keep]):
            groups = vgroup[keep & (vtype == t)]
            type_sets.append(sorted_unique(np.concatenate([model.prog_items.group_layers[g] for g in groups])))
            type_ids.append(int(t))
        sets.extend(type_sets)
        weights["once"].append(size[np.array(type_ids, np.int64)] if type_ids else np.zeros(0, np.int64))
        weights["stash"].append(np.zeros(len(type_ids), np.int64))
    return sets, {k: np.concatenate(w) if w else np.zeros(0, np.int64) for k, w in weights.items()}, base


def price_one_tile_ranges(model: PricingView, in_flight: Iterable[int], capacity: int | None,
                          memory_budget: int = MEMORY_BUDGET) -> RangeTable:
    """The linear range table of a one-tile model (see the module docstring)."""
    L, G = model.num_layers, model.num_columns
    ks = tuple(int(k) for k in in_flight)
    if L == 0:
        return RangeTable.linear(ks, np.zeros((0, 0), np.int64), np.zeros((0, 0), np.int64), capacity,
                                 model.compute_prefix)
    sets, weights, base = _item_sets(model)
    additive = _Joins(sets, np.arange(len(sets)), L)
    tl = model.timeline
    row_group = model.var_items.group[tl.row_var]
    var_sets = model.var_items.group_layers
    rows = _Joins(list(var_sets), row_group, L)
    every = model.shared == "every"
    base_cols = model.base_stage_cols if every else np.zeros(G, bool)
    base_live = np.zeros(G + 1, np.int64)
    if every:
        shared = np.flatnonzero(row_group < 0)
        np.add.at(base_live, tl.row_col_start[shared], tl.row_bytes[shared])
        np.add.at(base_live, tl.row_col_end[shared], -tl.row_bytes[shared])
    base_live = np.cumsum(base_live)[:G]
    cover = tl.cover
    block = max(1, min(L, memory_budget // max(8 * (G + 1) * 3, 1)))
    once_blocks, stash_blocks = [], []
    for a0 in range(0, L, block):
        a1 = min(L, a0 + block)
        once, stash = _block(a0, a1, L, G, capacity, additive, weights, base, rows, tl, base_live, base_cols, cover)
        once_blocks.append(once)
        stash_blocks.append(stash)
    width = max(b.shape[1] for b in once_blocks)
    once = np.full((L, width), OVER, np.int64)
    stash = np.zeros((L, width), np.int64)
    for a0, (o, s) in zip(range(0, L, block), zip(once_blocks, stash_blocks)):
        once[a0:a0 + o.shape[0], :o.shape[1]] = o
        stash[a0:a0 + s.shape[0], :s.shape[1]] = s
    # a block that stopped early holds nothing that fits in its later columns: OVER there is exact
    return RangeTable.linear(ks, once, stash, capacity, model.compute_prefix)


def _block(a0: int, a1: int, L: int, G: int, capacity: int | None, additive: _Joins, weights: dict[str, np.ndarray],
           base: dict[str, int], rows: _Joins, tl: Timeline, base_live: np.ndarray, base_cols: np.ndarray,
           cover: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Columns j = 0.. of the band for first layers a0..a1-1, until none fits ``capacity``."""
    n = a1 - a0
    first = np.arange(a0, a1)
    plain = np.full(n, base["once"], np.int64)
    stashed = np.full(n, base["stash"], np.int64)
    live = np.repeat(base_live[None, :], n, axis=0)
    in_stage = np.repeat(base_cols[None, :], n, axis=0) if G else np.zeros((n, 0), bool)
    once_columns, stash_columns = [], []
    for j in range(L - a0):
        # items joining at offset j for these first layers
        a, item = additive.pairs(j)
        inside = (a >= a0) & (a < a1)
        if inside.any():
            plain += np.bincount(a[inside] - a0, weights=weights["once"][item[inside]].astype(float),
                                 minlength=n).round().astype(np.int64)
            stashed += np.bincount(a[inside] - a0, weights=weights["stash"][item[inside]].astype(float),
                                   minlength=n).round().astype(np.int64)
        a, row = rows.pairs(j)
        inside = (a >= a0) & (a < a1)
        if inside.any() and G:
            a, row = a[inside] - a0, row[inside]
            diff = np.zeros(n * (G + 1), np.int64)
            np.add.at(diff, a * (G + 1) + tl.row_col_start[row], tl.row_bytes[row])
            np.add.at(diff, a * (G + 1) + tl.row_col_end[row], -tl.row_bytes[row])
            live += np.cumsum(diff.reshape(n, G + 1), axis=1)[:, :G]
        last = first + j
        real = last < L
        if G:
            in_stage[real] |= cover[last[real]]
            peak = np.where(in_stage, live, 0).max(axis=1) if G else np.zeros(n, np.int64)
        else:
            peak = np.zeros(n, np.int64)
        once = np.where(real, plain + np.maximum(peak, 0), OVER)
        if j and capacity is not None and not (once <= capacity).any():
            break
        once_columns.append(once)
        stash_columns.append(np.where(real, stashed, 0))
        if not real.any():
            break
    return np.stack(once_columns, axis=1), np.stack(stash_columns, axis=1)
