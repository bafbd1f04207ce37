"""Closed-form range costs of per-layer profiles (``io/layerform.py``): prefix sums and a
running maximum instead of the per-tile sweep, on the band of ranges the search reads.

``build_layer_profile`` lays out a training step as forward steps ``0..L-1`` then backward steps
in reverse, one tile. For the stage ``a..b`` the cost model (``stagememory``) then gives:

* held once: the weights and ``other`` bytes of layers ``a..b`` (always live), the shared bytes
  when every stage holds them, and the peak over the stage's steps of its live bytes. The peak is
  at a forward step ``s`` (a backward step holds the same activations and workspace and no more
  boundary bytes): the activations of layers ``a..s`` (live from their forward to their backward
  step), the workspace of ``s``, the output of ``s`` and the output of ``s - 1`` (the stage's
  input when ``s = a``). Activations of layers before ``a`` are live then but belong to another
  stage.
* stashed (held once more per extra micro-batch in flight): the activations of layers ``a..b``,
  but the last layer's, whose backward step follows its forward step at once.

In inference each layer has one step holding its own activations, workspace, output and input,
and nothing is stashed. ``tests/model/test_layercosts.py`` checks these against the sweep on
random per-layer profiles.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ..io.layerform import LayerForm
from .rangetable import OVER, RangeTable

__all__ = ["LayerCosts", "price_layer_ranges"]


@dataclass(frozen=True)
class LayerCosts:
    """Per-layer byte figures as the closed form reads them."""

    fixed: np.ndarray            # weights + other: always live
    activations: np.ndarray
    output: np.ndarray
    workspace: np.ndarray
    training: bool
    shared: int                  # bytes every stage holds (the shared weights and other, or 0)

    @classmethod
    def of(cls, form: LayerForm, shared_on_every_stage: bool) -> LayerCosts:
        def column(*names: str) -> np.ndarray:
            return np.array([sum(getattr(layer, n) for n in names) for layer in form.layers], np.int64)
        shared = form.shared_weights + form.shared_other if shared_on_every_stage else 0
        return cls(column("weights", "other"), column("activations"), column("output"), column("workspace"),
                   form.training, int(shared))

    @property
    def num_layers(self) -> int:
        return len(self.fixed)


def price_layer_ranges(costs: LayerCosts, in_flight: Iterable[int], capacity: int | None,
                       compute_prefix: np.ndarray | None = None) -> RangeTable:
    """The linear range table of the ranges up to the longest that fits ``capacity`` bytes (every
    range for None): one column of the band at a time, each a few vector operations on L."""
    L = costs.num_layers
    act, out = costs.activations, costs.output
    fixed = np.concatenate([[0], np.cumsum(costs.fixed)])
    out_before = np.concatenate([[0], out[:-1]])
    if costs.training:
        acts = np.concatenate([[0], np.cumsum(act)])
        stashed = np.concatenate([[0], np.cumsum(np.where(np.arange(L) < L - 1, act, 0))])
        step_peak = acts[1:] + costs.workspace + out + out_before      # less acts[a] for a stage from a
        before = acts[:-1]
    else:
        stashed = np.zeros(L + 1, np.int64)
        step_peak = act + costs.workspace + out + out_before
        before = np.zeros(L, np.int64)
    first = np.arange(L)
    once_columns, stash_columns = [], []
    peak = np.zeros(L, np.int64)
    for j in range(L):
        last = np.minimum(first + j, L - 1)
        real = first + j < L
        np.maximum(peak, step_peak[last], out=peak)
        once = np.where(real, fixed[last + 1] - fixed[first] + peak - before + costs.shared, OVER)
        if j and capacity is not None and not (once <= capacity).any():
            break                                       # no longer range fits: the band ends
        once_columns.append(once)
        stash_columns.append(np.where(real, stashed[last + 1] - stashed[first], 0))
    if not once_columns:
        return RangeTable.linear(in_flight, np.zeros((0, 0), np.int64), np.zeros((0, 0), np.int64), capacity,
                                 compute_prefix)
    return RangeTable.linear(in_flight, np.stack(once_columns, axis=1), np.stack(stash_columns, axis=1), capacity,
                             compute_prefix)
