"""A layer's measured compute (the ``layer_compute`` option), as one figure or as one per phase.

A profiler that times a layer's forward, backward and optimizer step apart gives more than their sum:
the model otherwise shares a layer's one figure out over its phases as the roofline times their
operations (model/phases.py), and where the device's own shares differ (a memory-bound Adam step on a
CPU that runs it faster than its bytes say) every step that repeats the forward and backward over
micro-batches but steps the optimizer once is mis-priced by the difference. A layer's figure is
therefore either a number (the total) or a mapping of exactly ``forward``, ``backward`` and
``optimizer`` (each a number in the same unit; the backward counts both its input and its weight
gradients, which the model shares out by their operations, and any recompute).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["PHASES", "LayerFigure", "figure_phases", "figure_record", "figure_total", "read_layer_figure"]

#: the phases a layer's figure may be given by, in order
PHASES = ("forward", "backward", "optimizer")

#: a layer's figure: its total, or its (forward, backward, optimizer) parts
LayerFigure = float | tuple[float, float, float]


def read_layer_figure(value: Any, field: str, number: Callable[[str, Any], float],
                      refuse: Callable[[str, str, Any], Any]) -> LayerFigure:
    """``value`` (a number, a mapping of the phases, or a (forward, backward, optimizer) tuple) checked
    as ``field``: ``number(name, v)`` checks one number (``name``: ``field``, or ``field.forward`` for
    a phase's) and returns it or raises the caller's error; ``refuse(name, expected, got)`` raises the
    caller's error for a mapping that is not exactly the three phases."""
    if isinstance(value, tuple) and len(value) == len(PHASES):      # the API's own form
        value = dict(zip(PHASES, value))
    if isinstance(value, Mapping):
        keys = [str(k) for k in value]
        missing = [p for p in PHASES if p not in keys]
        extra = [k for k in keys if k not in PHASES]
        if extra or missing:
            refuse(field, "a number, or a mapping of exactly forward, backward and optimizer",
                   f"unknown field {extra[0]!r}" if extra else f"no {missing[0]}")
        parts = {str(k): v for k, v in value.items()}
        forward, backward, optimizer = (float(number(f"{field}.{p}", parts[p])) for p in PHASES)
        return forward, backward, optimizer
    return float(number(field, value))


def figure_total(figure: LayerFigure) -> float:
    """The figure's total: the number, or its phases' sum."""
    return float(sum(figure)) if isinstance(figure, tuple) else float(figure)


def figure_phases(figure: LayerFigure) -> tuple[float, float, float] | None:
    """The (forward, backward, optimizer) parts, or None where only the total was given."""
    return figure if isinstance(figure, tuple) else None


def figure_record(figure: LayerFigure) -> float | dict[str, float]:
    """As a file or plan writes it: the number, or the mapping of phases."""
    return dict(zip(PHASES, figure)) if isinstance(figure, tuple) else figure
