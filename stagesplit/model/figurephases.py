"""Which operations a layer figure's phases (common/layerfigures.py) stand for: its forward the
forward's, its backward the input and weight gradients' and any recompute (which runs inside the
backward), its optimizer the optimizer step's."""

from __future__ import annotations

import numpy as np

from ..io.profile import Phase

__all__ = ["FIGURE_PHASE_GROUPS", "figure_phase_of"]

#: per phase of a figure (forward, backward, optimizer), the operations' phases it covers
FIGURE_PHASE_GROUPS = ((Phase.FORWARD,), (Phase.BACKWARD_INPUT, Phase.BACKWARD_WEIGHT, Phase.RECOMPUTE),
                       (Phase.OPTIMIZER,))


def figure_phase_of(op_phase: np.ndarray) -> np.ndarray:
    """Each operation's figure phase (0 forward, 1 backward, 2 optimizer; -1: none of them)."""
    out = np.full(len(op_phase), -1, np.int64)
    for index, phases in enumerate(FIGURE_PHASE_GROUPS):
        out[np.isin(op_phase, phases)] = index
    return out
