"""One call from a profile file to a priced model: read, group layers, build the cost model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..io import load_profile
from ..io.profile import Profile
from ..layers import LayerAssignment, LayerOptions, group_layers
from .costmodel import StageCostModel

__all__ = ["Analysis"]


@dataclass
class Analysis:
    profile: Profile
    layers: LayerAssignment
    model: StageCostModel

    @classmethod
    def of(cls, profile: Profile, layer_options: LayerOptions | None = None, shared: str = "every") -> Analysis:
        layers = group_layers(profile, layer_options)
        return cls(profile, layers, StageCostModel(profile, layers, shared=shared))

    @classmethod
    def load(cls, path: str | Path, debug: str | Path | None = None, layer_options: LayerOptions | None = None,
             shared: str = "every", progress: Callable[[int, int], None] | None = None) -> Analysis:
        return cls.of(load_profile(path, debug, progress), layer_options, shared)
