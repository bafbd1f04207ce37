"""Tied parameters: one parameter several layers use (GPT-2's ``wte`` is also ``lm_head``).

A capture names such a parameter once, with all its names (``first [shared with other]``);
its users are the layers whose operations touch it. While its users share a stage it stays one
tensor; a split that puts them on different stages leaves one copy per stage, whose gradients
must be summed (the plan records the users, the exports and ``solve``'s warnings say what to do).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..io.profile import Profile

__all__ = ["SHARED_MARK", "TiedParameter", "tied_parameters"]

#: how a capture names a parameter several modules use: "first.name [shared with other.name]"
SHARED_MARK = " [shared with "


@dataclass(frozen=True)
class TiedParameter:
    """A parameter used by several layers: its (first) name and those layers, ascending."""

    name: str
    layers: tuple[int, ...]


def tied_parameters(profile: Profile, op_layer: np.ndarray) -> tuple[TiedParameter, ...]:
    """Each tied parameter of a capture (a variable named ``first [shared with others]``) and
    the layers whose operations use it (``op_layer``: each operation's layer, -1 for none);
    only those used by two or more layers."""
    shared = np.array([i for i, name in enumerate(profile.names) if SHARED_MARK in name], dtype=np.int64)
    if not len(shared):
        return ()
    ops = profile.operations
    entry_op = np.repeat(np.arange(len(ops)), ops.vars.lengths())
    entry_name = profile.variables.name[ops.vars.values]
    entry_layer = np.asarray(op_layer)[entry_op]
    keep = np.isin(entry_name, shared) & (entry_layer >= 0)
    pairs = np.unique(np.stack([entry_name[keep], entry_layer[keep]]), axis=1)
    out: dict[str, list[int]] = {}
    for name, layer in pairs.T:
        out.setdefault(profile.names[int(name)].split(SHARED_MARK, 1)[0], []).append(int(layer))
    return tuple(TiedParameter(name, tuple(sorted(layers))) for name, layers in out.items() if len(layers) > 1)
