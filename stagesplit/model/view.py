"""What pricing reads of a cost model: a narrow, structural view (``PricingView``), so the
pricing modules (``stagememory``, ``pricing``) depend on this description, not on the model
class that composes them."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ..io.profile import Profile
from .itemgroups import ItemGroups
from .timeline import Timeline

__all__ = ["PricingView"]


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
