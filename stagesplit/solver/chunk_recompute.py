"""Activation recompute in a chunk split as *recompute prefixes*: in each chunk, its first layers
take full recompute, the next selective, the rest none (``prefix_choice``; recomputing a chunk's
first layers costs least, model/recompute.py). Which options each layer may take under the
schedule (``recompute_options``), their per-layer figures, and the per-layer choice of given
prefixes and back. Choosing the prefixes is ``chunk_evaluation.fitting_choice`` (quick) and the
CP-SAT model's recompute variables (proven, ``chunk_cpsat_model``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .chunk_problem import Bounds, ChunkProblem

__all__ = ["prefix_choice", "prefix_counts", "recompute_option_figures", "recompute_options"]


def recompute_options(problem: ChunkProblem) -> list[tuple[int, ...]]:
    """Each layer's options worth trying: none, and those that save bytes. None but none where
    the schedule splits the backward: torch refuses selective checkpointing there, and re-runs a
    fully checkpointed block again for the weight gradients, far above what B re-materialises
    (measured: tests/solver/test_chunks_recompute.py)."""
    table = problem.table.recompute
    if table is None or problem.schedule.traits.splits_backward:
        return [(0,)] * problem.num_layers
    return [(0, *[o for o in (1, 2) if table.saved[o, i] > 0]) for i in range(problem.num_layers)]


def recompute_option_figures(problem: ChunkProblem) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per option row (none, selective, full) and layer: bytes saved, rerun and time added where
    the option is open to the layer (``recompute_options``); where it is not, the layer keeps none's
    figures (a recompute prefix passes over it)."""
    table = problem.table.recompute
    L = problem.num_layers
    saved, rerun, added = (np.zeros((3, L), np.int64), np.zeros((3, L), np.int64), np.zeros((3, L)))
    for i, opts in enumerate(recompute_options(problem)):
        for o in opts[1:]:
            assert table is not None     # an option beyond none is open only where there is a table
            saved[o, i], rerun[o, i], added[o, i] = table.saved[o, i], table.rerun[o, i], table.added[o, i]
    return saved, rerun, added


def prefix_choice(problem: ChunkProblem, bounds: Bounds, full: Sequence[int], selective: Sequence[int]) -> np.ndarray:
    """Per-layer options of the recompute prefixes: in chunk ``c``, its first ``full[c]`` layers
    take full, the next ``selective[c]`` selective, the rest none (a layer an option is not open
    to keeps none)."""
    options = recompute_options(problem)
    choice = np.zeros(problem.num_layers, np.int64)
    for c in range(len(bounds) - 1):
        a = bounds[c]
        for i in range(a, min(a + int(full[c]), bounds[c + 1])):
            choice[i] = 2 if 2 in options[i] else 0
        for i in range(a + int(full[c]), min(a + int(full[c]) + int(selective[c]), bounds[c + 1])):
            choice[i] = 1 if 1 in options[i] else 0
    return choice


def prefix_counts(bounds: Bounds, choice: Sequence[int] | np.ndarray) -> tuple[list[int], list[int]] | None:
    """``(full, selective)`` per chunk where ``choice`` is recompute prefixes (full layers, then
    selective, then none, in each chunk), else None."""
    full, selective = [], []
    for c in range(len(bounds) - 1):
        run = [int(o) for o in choice[bounds[c]:bounds[c + 1]]]
        f = next((j for j, o in enumerate(run) if o != 2), len(run))
        s = next((j for j, o in enumerate(run[f:]) if o != 1), len(run) - f)
        if any(run[f + s:]):
            return None
        full.append(f)
        selective.append(s)
    return full, selective
