"""What pricing reads of a cost model: a narrow, structural view (``PricingView``), so the
pricing modules (``stagememory``, ``pricing``) depend on this description, not on the model
class that composes them; ``ModelView`` adds what the phase table, recompute and traffic read
(``phases``, ``recompute``, ``traffic``: the model imports them, so they cannot import it)."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ..io.profile import Phase, Profile
from ..layers import LayerAssignment
from .itemgroups import ItemGroups
from .timeline import Timeline

__all__ = ["ModelView", "PricingView"]


class PricingView(Protocol):
    """The parts of a ``StageCostModel`` a stage is priced from."""

    profile: Profile
    num_layers: int
    num_tiles: int
    shared: str                       # "every" or "none": items with no layer on every stage or none
    timeline: Timeline
    var_items: ItemGroups
    prog_items: ItemGroups
    var_stashed: np.ndarray           # which variables a schedule stashes per micro-batch in flight
    vertex_code_size: np.ndarray      # (tiles, vertex types) code bytes
    base_stage_cols: np.ndarray       # columns every stage holds (the shared operations')
    compute_prefix: np.ndarray        # (L+1,) prefix sums of layer compute

    @property
    def num_columns(self) -> int: ...

    def base_items(self) -> tuple[np.ndarray, np.ndarray]: ...


class ModelView(PricingView, Protocol):
    """The parts of a ``StageCostModel`` its phase table, recompute table and traffic are made from."""

    layers: LayerAssignment
    var_nal: np.ndarray               # variables not always live that have a live class
    phase_cols: dict[Phase, np.ndarray] | None   # each phase's columns (None: no phases)
    op_compute: np.ndarray            # each operation's compute
    layer_compute: np.ndarray         # each layer's compute
    layer_phase_share: np.ndarray     # (L, 3) forward, backward, optimizer shares of given figures (NaN: none)
    layer_time_s: np.ndarray | None   # each layer's roofline seconds (None: not timed on a target)
