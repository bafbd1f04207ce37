"""Items (variables, programs) by the layers that use them.

An item belongs to every layer one of whose operations uses it; a stage holds an item when its
layer range meets that set. Items with the same exact layer set form a *group*, so everything
a group brings into a stage is summed once. Items no layered operation uses are *shared*.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["ItemGroups", "LayerItems", "sorted_unique"]


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """np.unique for large integer arrays (a sort, which beats hashing here)."""
    values = np.sort(values)
    if len(values) == 0:
        return values
    result: np.ndarray = values[np.concatenate([[True], values[1:] != values[:-1]])]
    return result


@dataclass
class ItemGroups:
    """Which layers use each item, and items grouped by their exact layer set."""

    #: distinct (item, layer) pairs, sorted by item then layer
    pair_item: np.ndarray
    pair_layer: np.ndarray
    #: items no layered operation uses
    shared: np.ndarray
    #: group of each item (-1: shared)
    group: np.ndarray
    #: sorted layers of each group
    group_layers: list[np.ndarray]

    @classmethod
    def of(cls, ragged_offsets: np.ndarray, ragged_values: np.ndarray, op_layer: np.ndarray, num_items: int,
           num_layers: int) -> ItemGroups:
        """From the operations' item lists (CSR) and each operation's layer (-1: none)."""
        layer = np.repeat(op_layer, np.diff(ragged_offsets))
        keep = layer >= 0
        # (item, layer) keys; 32-bit where they fit, which numpy sorts several times faster
        dtype = np.int32 if max(num_items, 1) * max(num_layers, 1) < 2**31 else np.int64
        key: np.ndarray = ragged_values[keep].astype(dtype)
        key *= num_layers
        key += layer[keep].astype(dtype)
        key = sorted_unique(key)
        pair_item, pair_layer = (key // num_layers).astype(np.int64), (key % num_layers).astype(np.int64)
        shared = np.bincount(pair_item, minlength=num_items) == 0
        group, group_layers = _layer_set_groups(pair_item, pair_layer, num_items, num_layers, shared)
        return cls(pair_item, pair_layer, shared, group, group_layers)

    def layer_items(self, num_layers: int) -> LayerItems:
        order = np.lexsort((self.pair_item, self.pair_layer))
        offsets = np.zeros(num_layers + 1, np.int64)
        np.cumsum(np.bincount(self.pair_layer, minlength=num_layers), out=offsets[1:])
        return LayerItems(offsets, self.pair_item[order])

    def in_range(self, first: int, last: int) -> np.ndarray:
        """The items some layer of ``first..last`` uses (with repeats)."""
        inside = (self.pair_layer >= first) & (self.pair_layer <= last)
        return self.pair_item[inside]


@dataclass
class LayerItems:
    """Per-layer CSR lists of items (including items shared with other layers)."""

    offsets: np.ndarray
    values: np.ndarray

    def of(self, layer: int) -> np.ndarray:
        return self.values[self.offsets[layer]:self.offsets[layer + 1]]


def _layer_set_groups(pair_item: np.ndarray, pair_layer: np.ndarray, n_items: int, num_layers: int,
                      shared: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Group items by their exact set of layers: (group of each item or -1, layers of each group)."""
    words = max(1, (num_layers + 63) // 64)
    masks = np.zeros((n_items, words), np.uint64)
    bits = np.left_shift(np.uint64(1), (pair_layer % 64).astype(np.uint64))
    # pairs are sorted by item then layer: OR each (item, word)'s bits over its run of pairs
    cell = pair_item * words + pair_layer // 64
    if len(cell):
        starts = np.flatnonzero(np.concatenate([[True], cell[1:] != cell[:-1]]))
        masks.reshape(-1)[cell[starts]] = np.bitwise_or.reduceat(bits, starts)
    layered = np.flatnonzero(~shared)
    first, inverse = _unique_rows(masks[layered])
    group = np.full(n_items, -1, np.int64)
    group[layered] = inverse
    lo = np.searchsorted(pair_item, layered[first])
    hi = np.searchsorted(pair_item, layered[first], side="right")
    return group, [pair_layer[a:b] for a, b in zip(lo, hi)]


def _unique_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(rows, axis=0, return_index=True, return_inverse=True)[1:]`` (distinct rows in
    lexicographic order, each one's first occurrence, each row's distinct row) without the
    structured-dtype sort that ``axis=0`` does: one integer sort for a single column, else a
    lexsort of the columns."""
    if rows.shape[1] == 1:
        _, first, inverse = np.unique(rows[:, 0], return_index=True, return_inverse=True)
        return first, inverse.reshape(-1)
    order = np.lexsort(rows.T[::-1])                  # stable: the first occurrence leads each run
    ordered = rows[order]
    new = np.ones(len(ordered), bool)
    new[1:] = (ordered[1:] != ordered[:-1]).any(axis=1)
    inverse = np.empty(len(ordered), np.int64)
    inverse[order] = np.cumsum(new) - 1
    return order[new], inverse
