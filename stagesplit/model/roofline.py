"""Compute time on a target: the one place where compute (cycles, FLOPs, seconds) and bytes
accessed become seconds.

Each operation takes ``max(flops / (flops_per_s * efficiency), bytes_accessed / memory_bytes_per_s)``
on the target (the roofline): the slower of doing its arithmetic at the achieved FLOP rate and
moving its bytes at the memory bandwidth. Cycles convert with ``clock_hz``; seconds are used as
given. An operation whose bytes are unknown (NaN), or a target without a bandwidth, has only the
compute term. Layer and stage times are sums of operation times. The target is the one chosen
as ``target``; the profile's own device is only the default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..errors import StagesplitError
from ..io.profile import Profile, Target
from .view import ModelView

__all__ = ["Roofline", "apply_roofline", "compute_seconds_per_unit", "operation_times", "roofline"]


def compute_seconds_per_unit(target: Target, unit: str, efficiency: float = 1.0) -> float | None:
    """Seconds per unit of compute on ``target``; ``efficiency`` (achieved over peak) applies to
    FLOP rates only. None when the target cannot convert ``unit``."""
    if not 0 < efficiency <= 1:
        raise StagesplitError(f"`efficiency` must be in (0, 1], got {efficiency}")
    seconds = target.seconds_per_unit(unit)
    if seconds is None:
        return None
    return seconds / efficiency if unit == "flops" else seconds


@dataclass
class Roofline:
    """Per-operation and per-layer times on one target. ``op_memory_bound`` is True where moving
    the bytes takes longer than the arithmetic. ``layer_bound`` is "memory" where most of the
    layer's time is spent in memory-bound operations, "compute" otherwise ("" with no time)."""

    target: Target
    efficiency: float
    op_compute_s: np.ndarray
    op_memory_s: np.ndarray
    op_seconds: np.ndarray
    op_memory_bound: np.ndarray
    layer_seconds: np.ndarray
    layer_memory_bound_s: np.ndarray
    unlayered_seconds: float

    @property
    def layer_bound(self) -> list[str]:
        return ["" if t <= 0 else ("memory" if m > t / 2 else "compute")
                for t, m in zip(self.layer_seconds, self.layer_memory_bound_s)]

    def range_seconds(self, first: int, last: int) -> float:
        """Time of the stage holding layers first..last (inclusive)."""
        return float(self.layer_seconds[first:last + 1].sum())


def operation_times(profile: Profile, op_compute: np.ndarray, target: Target,
                    efficiency: float = 1.0) -> tuple[np.ndarray, np.ndarray] | None:
    """(compute seconds, memory seconds) per operation; memory seconds are 0 where unknown.
    None when the target cannot convert the profile's compute unit."""
    per_unit = compute_seconds_per_unit(target, profile.compute_unit, efficiency)
    if per_unit is None:
        return None
    compute_s = np.nan_to_num(np.asarray(op_compute, float), nan=0.0) * per_unit
    accessed = profile.operations.bytes_accessed
    memory_s = np.zeros(len(compute_s))
    if target.memory_bytes_per_s:
        memory_s = np.nan_to_num(np.asarray(accessed, float), nan=0.0) / float(target.memory_bytes_per_s)
    return compute_s, memory_s


def roofline(model: ModelView, target: Target | None = None, efficiency: float = 1.0) -> Roofline | None:
    """Roofline times of a StageCostModel's operations and layers on ``target`` (default: the
    profile's device). None when the target cannot convert the profile's compute."""
    p = model.profile
    target = target or p.target
    times = operation_times(p, model.op_compute, target, efficiency)
    if times is None:
        return None
    compute_s, memory_s = times
    seconds = np.maximum(compute_s, memory_s)
    memory_bound = memory_s > compute_s
    L = model.num_layers
    op_layer = model.layers.op_layer
    inside = op_layer >= 0
    layer_seconds = np.bincount(op_layer[inside], weights=seconds[inside], minlength=L)[:L].astype(float)
    mem_part = np.bincount(op_layer[inside], weights=(seconds * memory_bound)[inside], minlength=L)[:L].astype(float)
    # layers whose compute was replaced (--layer-compute) keep the given figure, at the FLOP rate
    op_sum = np.bincount(op_layer[inside], weights=np.nan_to_num(model.op_compute, nan=0.0)[inside], minlength=L)[:L]
    given = np.nan_to_num(np.asarray(model.layer_compute, float), nan=0.0)
    replaced = ~np.isclose(op_sum, given, rtol=1e-12, atol=0.0)
    if replaced.any():
        per_unit = compute_seconds_per_unit(target, p.compute_unit, efficiency)
        layer_seconds[replaced] = given[replaced] * per_unit
        mem_part[replaced] = 0.0
    return Roofline(target=target, efficiency=efficiency, op_compute_s=compute_s, op_memory_s=memory_s,
                    op_seconds=seconds, op_memory_bound=memory_bound, layer_seconds=layer_seconds,
                    layer_memory_bound_s=mem_part, unlayered_seconds=float(seconds[~inside].sum()))


class _Timed(ModelView, Protocol):
    """A cost model that keeps its roofline times."""

    roofline: Roofline | None


def apply_roofline(model: _Timed, target: Target | None = None, efficiency: float = 1.0) -> Roofline | None:
    """Attach roofline times to ``model`` (``model.roofline``), and, where they differ from the
    profile's compute at its own device's rate, the per-layer times the solver and plan use
    (``model.layer_time_s``, seconds). Profiles whose times do not change keep the plain path."""
    r = roofline(model, target, efficiency)
    model.roofline = r
    model.layer_time_s = None
    if r is None:      # the target cannot convert this unit: the profile's own figures stand
        return None
    plain = model.profile.target.seconds_per_unit(model.profile.compute_unit)
    layer_compute = np.nan_to_num(model.layer_compute, nan=0.0)
    if plain is None or not np.allclose(r.layer_seconds, layer_compute * plain, rtol=1e-12, atol=0.0):
        model.layer_time_s = r.layer_seconds
    return r
