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


def stashed_variables(timeline: Timeline, layer_vars: LayerItems, var_nal: np.ndarray) -> np.ndarray:
    """Which variables are stashed. Columns are uniform in liveness and in which layers run,
    so the rule is evaluated on columns exactly."""
    L, G = timeline.num_layers, timeline.num_columns
    nv = len(var_nal)
    stashed = np.zeros(nv, bool)
    run_var, run_c0, run_c1 = timeline.live_runs()
    if G == 0 or not len(run_var):
        return stashed
    cover = timeline.cover
    layers_covering = cover.sum(axis=0)
    run_offsets = np.zeros(nv + 1, np.int64)
    np.cumsum(np.bincount(run_var, minlength=nv), out=run_offsets[1:])
    for l in range(L):
        own = cover[l]
        if not own.any():
            continue
        gap = (layers_covering - own > 0) & ~own       # another layer runs, l does not
        if not gap.any():
            continue
        own_prefix = np.concatenate([[0], np.cumsum(own)])
        gap_prefix = np.concatenate([[0], np.cumsum(gap)])
        own_cols = np.flatnonzero(own)
        vars_l = layer_vars.of(l)
        vars_l = vars_l[var_nal[vars_l] & ~stashed[vars_l]]
        if not len(vars_l):
            continue
        counts = run_offsets[vars_l + 1] - run_offsets[vars_l]
        runs = np.repeat(run_offsets[vars_l], counts) + ramp(counts)
        c0, c1 = run_c0[runs], run_c1[runs]
        has_two = own_prefix[c1] - own_prefix[c0] >= 2
        first = own_cols[np.minimum(own_prefix[c0], len(own_cols) - 1)]
        last = own_cols[np.maximum(own_prefix[c1] - 1, 0)]
        hit = has_two & (gap_prefix[last] - gap_prefix[np.minimum(first + 1, last)] > 0)
        stashed[run_var[runs[hit]]] = True
    return stashed
