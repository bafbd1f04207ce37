"""Tied parameters that a split puts on different stages.

A parameter shared by several modules (GPT-2's ``transformer.wte.weight`` is also
``lm_head.weight``) stays one tensor only while its users are on one stage. When a plan puts
them on different stages, ``torch.distributed.pipelining`` gives every stage its own copy
(``pipeline()`` splits the traced graph; each stage module holds its own parameter), and so do
DeepSpeed's ``PipelineModule`` (unless the layers are ``TiedLayerSpec``) and Megatron (its
embedding group): the copies' gradients must be summed across those stages before every
optimizer step, or the first step unties them. torchtitan refuses such models outright.

``tied_users_across_stages`` says which tied parameters a split divides, and between which
stages; ``TiedSplit.message`` is the warning text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..common.text import show
from ..io.profile import Profile
from ..model.tied import SHARED_MARK, tied_parameters

__all__ = ["TiedSplit", "tied_users_across_stages", "shared_parameter_users", "SHARED_MARK"]


@dataclass(frozen=True)
class TiedSplit:
    """A tied parameter whose users sit on more than one stage."""

    parameter: str
    stages: tuple[int, ...]                    # the stages holding a user, ascending
    users: tuple[tuple[str, int], ...]         # (user, its stage), in the order given

    def message(self) -> str:
        where = ", ".join(f"{show(u)} on stage {k}" for u, k in self.users)
        return (f"parameter '{show(self.parameter)}' is tied between stages {', '.join(map(str, self.stages))} "
                f"({where}): pipeline frameworks keep one copy per stage, so sum the copies' gradients across "
                f"those stages before each optimizer step (the torch-pipelining export does), or they untie")


def _normal(path: str) -> str:
    return path.replace("/", ".")


def _layer_of(user: str | int, module_paths: Sequence[str | None], n: int) -> int:
    if isinstance(user, bool):
        raise TypeError("a tied parameter's user is a module path (str) or a plan layer index (int), not a bool")
    if isinstance(user, int):
        if not 0 <= user < n:
            raise ValueError(f"layer index {user} is outside the plan's {n} layers")
        return user
    if not isinstance(user, str):
        raise TypeError(f"a tied parameter's user is a module path (str) or a layer index (int), "
                        f"not {type(user).__name__}")
    target = _normal(user)
    best, best_len = -1, -1
    for i, path in enumerate(module_paths):
        if path is None:
            continue
        p = _normal(path)
        if (target == p or target.startswith(p + ".")) and len(p) > best_len:
            best, best_len = i, len(p)
    if best < 0:
        raise ValueError(f"module '{show(user)}' is under no layer's module path; give its plan layer index instead")
    return best


def tied_users_across_stages(stage_layers: Sequence[Sequence[int]], module_paths: Sequence[str | None],
                             tied: Mapping[str, Sequence[str | int]]) -> tuple[TiedSplit, ...]:
    """The tied parameters of ``tied`` (parameter name -> its users) whose users the split
    ``stage_layers`` (each stage's plan-layer indices, as a plan's stages hold them) puts on
    more than one stage. A user is a module path (``transformer.h.3.attn``, matched to the
    layer whose module path is it or its longest prefix) or a plan layer index (for modules
    outside every layer's path, such as an embedding folded into the first layer)."""
    stage_of: dict[int, int] = {}
    for k, layers in enumerate(stage_layers):
        for i in layers:
            stage_of[int(i)] = k
    n = len(stage_of)
    out = []
    for parameter, users in tied.items():
        placed = [(str(u), stage_of[_layer_of(u, module_paths, n)]) for u in users]
        stages = tuple(sorted({k for _, k in placed}))
        if len(stages) > 1:
            out.append(TiedSplit(parameter=str(parameter), stages=stages, users=tuple(placed)))
    return tuple(out)


def shared_parameter_users(profile: Profile, op_layer: np.ndarray) -> dict[str, tuple[int, ...]]:
    """Each tied parameter of a capture -> the layers whose operations use it (see
    ``model.tied.tied_parameters``)."""
    return {t.name: t.layers for t in tied_parameters(profile, op_layer)}
