"""One call from a profile file to a priced model: read, group layers, build the cost model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..io import load_profile
from ..io.profile import Profile
from ..layers import LayerAssignment, LayerOptions, group_layers
from .costmodel import StageCostModel
from .datasharding import DataLayout, kept_unsharded, shard_profile

__all__ = ["Analysis"]


@dataclass
class Analysis:
    """``profile`` is what the cost model prices: with a data-parallel ``layout``, one rank's
    profile, made from ``source`` (the one-device profile read)."""

    profile: Profile
    layers: LayerAssignment
    model: StageCostModel
    layout: DataLayout | None = None
    source: Profile | None = None

    @classmethod
    def of(cls, profile: Profile, layer_options: LayerOptions | None = None, shared: str = "every",
           layout: DataLayout | None = None) -> Analysis:
        layers = group_layers(profile, layer_options)
        if layout is not None and layout.sharded:
            rank = shard_profile(profile, layers, layout)
            model = StageCostModel(rank, layers, shared=shared, kept_unsharded=kept_unsharded(profile, layers, layout))
            return cls(rank, layers, model, layout, profile)
        return cls(profile, layers, StageCostModel(profile, layers, shared=shared))

    @classmethod
    def load(cls, path: str | Path, debug: str | Path | None = None, layer_options: LayerOptions | None = None,
             shared: str = "every", progress: Callable[[int, int], None] | None = None) -> Analysis:
        return cls.of(load_profile(path, debug, progress), layer_options, shared)
