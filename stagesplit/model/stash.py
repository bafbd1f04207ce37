"""Stashed activations: the only place the pipeline schedule's stash rule lives.

The rule of docs/profile-format.md, per step: a not-always-live variable is *stashed* when, for
a layer ``l`` that uses it, it stays live (without a break, however its intervals are written)
from a step where ``l`` runs, through a step where another layer runs and ``l`` does not, to a
later step where ``l`` runs: it is written in the forward pass and read back in the backward
pass, so a pipeline keeps one copy per micro-batch in flight. Always-live variables (weights,
optimizer state) are never duplicated. A stage with ``k`` micro-batches in flight holds
``k - 1`` extra copies of its stashed bytes (``StageMemory.total``).
"""

from __future__ import annotations

import numpy as np

from .itemgroups import LayerItems
from .timeline import Timeline, ramp

__all__ = ["stashed_variables"]

#: (layer, variable) pairs judged together by ``_between_other_layers``
PAIRS_AT_ONCE = 1024


def stashed_variables(timeline: Timeline, layer_vars: LayerItems, var_nal: np.ndarray,
                      forward: np.ndarray | None = None, backward: np.ndarray | None = None) -> np.ndarray:
    """Which variables are stashed. Columns are uniform in liveness and in which layers run,
    so the rule is evaluated on columns exactly. Where the profile says which columns are
    forward and which backward (``forward``/``backward`` column masks), a variable is also
    stashed for layer ``l`` when it stays live from a forward step of ``l`` to a later backward
    step of ``l``: the last layer's activations are held so even though no other layer runs
    between its forward and its backward in a one-micro-batch step (in a pipeline, the stage's
    next micro-batches run there)."""
    stashed = _between_other_layers(timeline, layer_vars, var_nal)
    if forward is not None and backward is not None:
        stashed |= _forward_to_backward(timeline, layer_vars, var_nal, forward, backward)
    return stashed


def _forward_to_backward(timeline: Timeline, layer_vars: LayerItems, var_nal: np.ndarray, forward: np.ndarray,
                         backward: np.ndarray) -> np.ndarray:
    """Variables live, in one run of columns, from a forward column of a layer that uses them to
    a later backward column of that layer."""
    nv = len(var_nal)
    stashed = np.zeros(nv, bool)
    run_var, run_c0, run_c1 = timeline.live_runs()
    if timeline.num_columns == 0 or not len(run_var):
        return stashed
    run_offsets = np.zeros(nv + 1, np.int64)
    np.cumsum(np.bincount(run_var, minlength=nv), out=run_offsets[1:])
    for l in range(timeline.num_layers):
        f, b = timeline.cover[l] & forward, timeline.cover[l] & backward
        if not f.any() or not b.any():
            continue
        f_prefix = np.concatenate([[0], np.cumsum(f)])
        b_prefix = np.concatenate([[0], np.cumsum(b)])
        f_cols, b_cols = np.flatnonzero(f), np.flatnonzero(b)
        vars_l = layer_vars.of(l)
        vars_l = vars_l[var_nal[vars_l] & ~stashed[vars_l]]
        if not len(vars_l):
            continue
        counts = run_offsets[vars_l + 1] - run_offsets[vars_l]
        runs = np.repeat(run_offsets[vars_l], counts) + ramp(counts)
        c0, c1 = run_c0[runs], run_c1[runs]
        has_f = f_prefix[c1] > f_prefix[c0]
        has_b = b_prefix[c1] > b_prefix[c0]
        first_f = f_cols[np.minimum(f_prefix[c0], len(f_cols) - 1)]
        last_b = b_cols[np.maximum(b_prefix[c1] - 1, 0)]
        hit = has_f & has_b & (first_f < last_b)
        stashed[run_var[runs[hit]]] = True
    return stashed


def _between_other_layers(timeline: Timeline, layer_vars: LayerItems, var_nal: np.ndarray) -> np.ndarray:
    """The rule for any profile: live from a step of ``l`` through a step of another layer to a
    later step of ``l``."""
    L, G = timeline.num_layers, timeline.num_columns
    nv = len(var_nal)
    stashed = np.zeros(nv, bool)
    run_var, run_c0, run_c1 = timeline.live_runs()
    if G == 0 or not len(run_var):
        return stashed
    cover = timeline.cover
    # a column of the gap (another layer runs, l does not) is one some layer covers but l does not:
    # counted as (columns any layer covers) - (l's own columns), each from a prefix, l's by a search
    # of its own columns. Layer l's own columns are the keys l (G + 1) + column of one sorted array,
    # so that one search serves many layers: the layers are taken in blocks of at most PAIRS_AT_ONCE
    # (layer, variable) pairs (one layer at least), a variable found stashed not looked at again
    any_prefix = np.concatenate([[0], np.cumsum(cover.any(axis=0))])
    rows, cols = np.nonzero(cover)
    own_key = rows * (G + 1) + cols                     # sorted: by layer, then column
    own_start = np.searchsorted(rows, np.arange(L + 1))
    own_count = np.diff(own_start)
    run_offsets = np.zeros(nv + 1, np.int64)
    np.cumsum(np.bincount(run_var, minlength=nv), out=run_offsets[1:])
    pair_start = np.asarray(layer_vars.offsets, np.int64)
    values = np.asarray(layer_vars.values, np.int64)
    first_layer = 0
    while first_layer < L:
        # the block: layers first_layer..end-1
        end = int(np.searchsorted(pair_start, pair_start[first_layer] + PAIRS_AT_ONCE, side="right")) - 1
        end = min(L, max(end, first_layer + 1))
        pair_layer = np.repeat(np.arange(first_layer, end), np.diff(pair_start[first_layer:end + 1]))
        pair_var = values[pair_start[first_layer]:pair_start[end]]
        block_key = own_key[own_start[first_layer]:own_start[end]]     # the block's own columns
        shift = own_start[first_layer]
        first_layer = end
        # a layer that runs somewhere, beside some other layer; a not-always-live variable not yet stashed
        keep = (own_count[pair_layer] > 0) & (any_prefix[-1] - own_count[pair_layer] > 0) & var_nal[pair_var] & \
            ~stashed[pair_var]
        pair_layer, pair_var = pair_layer[keep], pair_var[keep]
        counts = run_offsets[pair_var + 1] - run_offsets[pair_var]
        runs = np.repeat(run_offsets[pair_var], counts) + ramp(counts)
        layer = np.repeat(pair_layer, counts)
        c0, c1 = run_c0[runs], run_c1[runs]
        base = layer * (G + 1)
        lo, last_own = own_start[layer], own_start[layer + 1] - 1
        own0 = np.searchsorted(block_key, base + c0) + shift       # the layer's own columns before c0, c1
        own1 = np.searchsorted(block_key, base + c1) + shift
        has_two = own1 - own0 >= 2
        first = cols[np.clip(own0, lo, last_own)]
        last = cols[np.clip(own1 - 1, lo, last_own)]
        after = np.minimum(first + 1, last)
        own_between = np.searchsorted(block_key, base + last) - np.searchsorted(block_key, base + after)
        hit = has_two & (any_prefix[last] - any_prefix[after] - own_between > 0)
        stashed[run_var[runs[hit]]] = True
    return stashed
