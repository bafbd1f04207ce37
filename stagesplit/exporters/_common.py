"""What several export formats share: options, the decoded split, module paths, accumulation."""

from __future__ import annotations

from dataclasses import dataclass

from ..common.text import show
from ._plan_view import PlanView
from .render import module_fqn, path_tokens, python_path
from .tied import TiedSplit

__all__ = ["ExportOptions", "Decoded", "layer_paths", "layer_expressions", "layer_fqns", "fqn_index", "from_starts",
           "from_counts", "pipelined_accumulation", "POPLIBS_MEMORY_PROPORTION"]

#: PopLibs' default availableMemoryProportion for matmuls and convolutions (PopTorch and
#: TensorFlow for IPU inherit it); the poptorch export scales it by the plan's headroom
POPLIBS_MEMORY_PROPORTION = 0.6


@dataclass(frozen=True)
class ExportOptions:
    training: bool = True
    model: str = "model"                      # the model's Python name in snippets (validated)
    tied: tuple[TiedSplit, ...] = ()          # tied parameters whose users the plan splits


@dataclass(frozen=True)
class Decoded:
    """A split as read back from the written text: each stage's plan-layer indices, and each
    stage's device where the format names devices."""

    stages: tuple[tuple[int, ...], ...]
    devices: tuple[int, ...] | None = None
    #: each plan layer's recompute as the text applies it, where the format applies the plan's
    #: choice exactly (None: the format checks what it writes itself, or writes none)
    recompute: tuple[str, ...] | None = None


def layer_paths(view: PlanView, fmt: str, layers: list[int] | tuple[int, ...]) -> list[str]:
    """The module paths of ``layers``, each checked to be a dotted Python path; a missing or
    unusable path is a one-line ``ExportError`` naming the layer (paths are never guessed)."""
    out = []
    for i in layers:
        path = view.module_paths[i]
        if path is None:
            raise view.error(f"{fmt} needs the module path of layer '{view.layer(i)}', but the plan has only its "
                             f"layer name; solve again from a profile whose operation names carry module paths "
                             f"(e.g. from stagesplit capture)")
        try:
            path_tokens(path)
        except ValueError as exc:
            raise view.error(f"{fmt}: layer '{view.layer(i)}' has the module path '{show(path)}', which is not a "
                             f"dotted Python path: {exc}") from None
        out.append(path)
    return out


def layer_expressions(view: PlanView, fmt: str, model: str, layers: list[int]) -> list[str]:
    """``model.transformer.h[3]`` for each of ``layers`` (validated paths)."""
    return [python_path(model, p) for p in layer_paths(view, fmt, layers)]


def layer_fqns(view: PlanView, fmt: str, layers: list[int]) -> list[str]:
    """torch's fully qualified names (``transformer.h.3``) of ``layers`` (validated paths)."""
    return [module_fqn(p) for p in layer_paths(view, fmt, layers)]


def fqn_index(view: PlanView) -> dict[str, int]:
    """Each usable module path's fully qualified name -> its plan layer (-1 where several layers
    share it: a split point there would be ambiguous)."""
    out: dict[str, int] = {}
    for i, path in enumerate(view.module_paths):
        if path is None:
            continue
        try:
            fqn = module_fqn(path)
        except ValueError:
            continue
        out[fqn] = -1 if fqn in out else i
    return out


def from_starts(starts: list[int], n: int) -> tuple[tuple[int, ...], ...]:
    bounds = list(starts) + [n]
    return tuple(tuple(range(a, b)) for a, b in zip(bounds, bounds[1:]))


def from_counts(counts: list[int]) -> tuple[tuple[int, ...], ...]:
    out, start = [], 0
    for c in counts:
        out.append(tuple(range(start, start + c)))
        start += c
    return tuple(out)


def pipelined_accumulation(view: PlanView) -> int:
    """Micro-batches per step of a pipelined training run on IPUs: at least 2 x stages (PopART
    needs >= 2P - 1: P forward and P - 1 backward pipeline stages) and at least the
    micro-batches the plan was solved for."""
    return max(2 * len(view.stages), view.micro_batches)
