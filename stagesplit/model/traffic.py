"""Data shared between layers: memory affinity and inter-layer communication.

* Affinity: bytes of the variables that two layers both use (the diagonal: all of a layer's
  variables). Splitting between layers with high affinity duplicates those bytes.
* Communication: bytes of not-always-live variables created in one layer (the layer whose
  operation runs when the variable goes live) and used by another. A cut between layers ``j-1``
  and ``j`` moves every such variable used on both sides of it, once, whichever direction
  (activations forward, gradients backward).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..common.chunks import CHUNK
from .timeline import ramp
from .view import ModelView

# the cost model keeps its phase table, whose making reads this module: the model is read here
# through its structural view (model/view.py), not its class (no import circle)

__all__ = ["Traffic", "WideTensor", "layer_traffic", "wide_tensors"]


@dataclass
class Traffic:
    """What the layers exchange: bytes both use (affinity), bytes one makes and another reads
    (communication), and the bytes crossing each cut, from the variables several layers share."""

    affinity: np.ndarray          # (L, L) bytes of variables used by both layers
    communication: np.ndarray     # (L, L) bytes created in the row layer, used in the column layer
    cut_bytes: np.ndarray         # (L + 1,) bytes crossing the cut before layer j (0 at both ends)
    var_index: np.ndarray         # the multi-layer not-always-live variables
    var_producer: np.ndarray      # their producing layer
    var_min_layer: np.ndarray
    var_max_layer: np.ndarray
    var_bytes: np.ndarray
    var_layers: list[np.ndarray]  # their layer sets (one array per group, indexed by var_group)
    var_group: np.ndarray

    def stage_io(self, first: int, last: int) -> tuple[int, int]:
        """Bytes a stage holding layers ``first..last`` receives and sends per step: exactly the
        bytes its time is charged for, ``cut_bytes[first] + cut_bytes[last + 1]``. A variable
        crosses the cut before layer ``j`` when its layers span it (min < j <= max); it goes from
        its producer's side to the other. So a tensor relayed through a middle stage (used before
        and after it, not in it) is received and sent again, as the time charges it."""
        lo, hi, prod = self.var_min_layer, self.var_max_layer, self.var_producer
        left = (lo < first) & (first <= hi)              # crosses the cut before ``first``
        right = (lo <= last) & (last < hi)               # crosses the cut after ``last``
        received = self.var_bytes[left & (prod < first)].sum() + self.var_bytes[right & (prod > last)].sum()
        sent = self.var_bytes[left & (prod >= first)].sum() + self.var_bytes[right & (prod <= last)].sum()
        return int(received), int(sent)


@dataclass(frozen=True)
class WideTensor:
    """A tensor (not a parameter, not a model input) that layers more than one apart use, from
    ``first`` to ``last``: a traced pipeline would send it from the stage of ``first`` straight to the
    stage of ``last``, past every stage between (a skip connection, which torch's runtimes cannot run),
    so the torch-pipelining export relays it through those stages; stages built from a stack's modules
    compute it again instead."""

    name: str
    first: int
    last: int


#: at most this many wide tensors are recorded, the largest first (a U-Net has a few; a
#: transformer's root-made tables and masks are a few per model)
MAX_WIDE_TENSORS = 64


def wide_tensors(model: ModelView, traffic: Traffic) -> tuple[WideTensor, ...]:
    """The model's wide tensors (``WideTensor``), in layer order; model inputs (the labels a last
    layer reads) are left out: a pipeline hands them to the stage that reads them."""
    p = model.profile
    wide = np.flatnonzero(traffic.var_max_layer - traffic.var_min_layer >= 2)
    wide = wide[np.argsort(-traffic.var_bytes[wide], kind="stable")]
    out = []
    for i in wide:
        name = p.names[int(p.variables.name[traffic.var_index[i]])]
        if name.startswith("input["):
            continue
        out.append(WideTensor(name, int(traffic.var_min_layer[i]), int(traffic.var_max_layer[i])))
        if len(out) == MAX_WIDE_TENSORS:
            break
    return tuple(sorted(out, key=lambda w: (w.first, w.last, w.name)))


def _affinity(groups: list[np.ndarray], group_bytes: np.ndarray, L: int) -> np.ndarray:
    """Bytes each pair of layers shares: every group's bytes on each (layer, layer) of its set, the
    groups' pairs counted together in chunks of about ``CHUNK`` (a byte total is at most 1 PiB, so
    the float sums are exact)."""
    sizes = np.array([len(g) for g in groups], np.int64)
    flat = np.concatenate([np.asarray(g, np.int64) for g in groups]) if len(groups) else np.zeros(0, np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    squares = sizes * sizes
    ends = np.cumsum(squares)
    total = np.zeros(L * L)
    first = 0
    while first < len(groups):
        last = max(first + 1, int(np.searchsorted(ends, ends[first] - squares[first] + CHUNK, side="right")))
        owner = np.repeat(np.arange(first, last), squares[first:last])
        pair = ramp(squares[first:last])
        size, start = sizes[owner], offsets[owner]
        cell = flat[start + pair // size] * L + flat[start + pair % size]
        total += np.bincount(cell, weights=group_bytes[owner], minlength=L * L)
        first = last
    return np.rint(total).astype(np.int64).reshape(L, L)


def layer_traffic(model: ModelView) -> Traffic:
    """Affinity, communication and cut bytes for the model's layers."""
    L = model.num_layers
    v = model.profile.variables
    groups = model.var_items.group_layers
    ng = len(groups)
    group = model.var_items.group
    group_bytes = np.bincount(group[group >= 0], weights=v.bytes[group >= 0], minlength=ng)
    affinity = _affinity(groups, group_bytes, L)

    multi_group = np.array([len(g) > 1 for g in groups], bool)
    is_multi = (model.var_items.group >= 0) & model.var_nal
    is_multi[is_multi] = multi_group[model.var_items.group[is_multi]]
    idx = np.flatnonzero(is_multi & (model.timeline.var_row_offsets[1:] > model.timeline.var_row_offsets[:-1]))
    first_col = np.full(len(v), model.num_columns, np.int64)
    np.minimum.at(first_col, model.timeline.row_var, model.timeline.row_col_start)
    start_col = first_col[idx]
    # producer: the first layer of the variable whose operations run where it goes live
    pair_lo = np.searchsorted(model.var_items.pair_item, idx)
    pair_hi = np.searchsorted(model.var_items.pair_item, idx, side="right")
    counts = pair_hi - pair_lo
    pair_idx = np.repeat(pair_lo, counts) + np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    pair_layer = model.var_items.pair_layer[pair_idx]
    owner = np.repeat(np.arange(len(idx)), counts)
    covering = model.timeline.cover[pair_layer, np.repeat(start_col, counts)] if model.num_columns else \
        np.zeros(len(pair_layer), bool)
    producer = np.full(len(idx), -1, np.int64)
    hit = np.flatnonzero(covering)
    first_hit = np.unique(owner[hit], return_index=True)
    producer[first_hit[0]] = pair_layer[hit[first_hit[1]]]
    min_layer = np.full(len(idx), L, np.int64)
    max_layer = np.full(len(idx), -1, np.int64)
    np.minimum.at(min_layer, owner, pair_layer)
    np.maximum.at(max_layer, owner, pair_layer)
    producer = np.where(producer >= 0, producer, min_layer)
    nbytes = v.bytes[idx]

    communication = np.zeros((L, L), np.int64)
    consumer = pair_layer != producer[owner]
    np.add.at(communication, (producer[owner][consumer], pair_layer[consumer]), nbytes[owner][consumer])
    diff = np.zeros(L + 2, np.int64)
    np.add.at(diff, min_layer + 1, nbytes)
    np.add.at(diff, max_layer + 1, -nbytes)
    cut = np.cumsum(diff)[: L + 1]
    cut[0] = 0
    cut[L] = 0
    return Traffic(affinity=affinity, communication=communication, cut_bytes=cut, var_index=idx,
                   var_producer=producer, var_min_layer=min_layer, var_max_layer=max_layer, var_bytes=nbytes,
                   var_layers=groups, var_group=model.var_items.group[idx])
