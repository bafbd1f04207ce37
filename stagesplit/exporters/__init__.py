"""Plans into training frameworks' own forms: ``export_plan(plan, "poptorch")`` returns a
snippet, config or argument file that applies the plan's split in that framework.

Every export starts with a comment header (the profile, its hash, the objective, and each
stage's layers and memory). Before anything is returned, the plan is checked (every layer in
exactly one stage, no empty stage, stages in the plan's order; see ``_plan_view``), and the
written text itself is checked (``render``): a Python export must parse with no code outside
its statements, a shell/argument export must split into the intended words, and each format's
literal data (split points, stage maps, layer lists, layouts) is read back from the text and
compared with the plan. A plan a format cannot express, or any difference, raises a one-line
``ExportError`` naming the plan file; nothing is written.

Names from the plan (layer names, module paths, profile name and path) are untrusted: they
reach the text only through ``render`` (escaped comments, ``repr`` literals, ``shlex`` words,
validated dotted module paths), so no name can become code.
"""

from __future__ import annotations

import json as _json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..common.text import show
from ..errors import ExportError, OptionError
from ..plan.records import Plan
from . import (
    deepspeed,
    json as json_format,
    megatron,
    optimum_ipu,
    popart,
    poptorch,
    tf_ipu,
    torch_pipelining,
    torchtitan,
)
from ._common import Decoded, ExportOptions
from ._plan_view import PlanView, view_of
from .header import header_lines
from .render import RenderCheckError, check_python, check_shell, dotted_name, join_lines
from .tied import TiedSplit, tied_users_across_stages

__all__ = ["export_plan", "FORMATS", "ExportFormat", "TiedSplit", "tied_users_across_stages", "plan_tied_splits"]


@dataclass(frozen=True)
class ExportFormat:
    """One export format: how it renders a plan and reads its own text back."""

    name: str
    description: str
    needs_module_paths: bool
    language: str                    # "python", "args" (shell words) or "json"
    render: Callable[[PlanView, ExportOptions], list[str]]
    read_back: Callable[[Any, PlanView, ExportOptions], Decoded]


FORMATS: dict[str, ExportFormat] = {f.name: f for f in (
    ExportFormat(poptorch.NAME, poptorch.DESCRIPTION, True, "python", poptorch.render, poptorch.read_back),
    ExportFormat(popart.NAME, popart.DESCRIPTION, False, "python", popart.render, popart.read_back),
    ExportFormat(tf_ipu.NAME, tf_ipu.DESCRIPTION, False, "python", tf_ipu.render, tf_ipu.read_back),
    ExportFormat(optimum_ipu.NAME, optimum_ipu.DESCRIPTION, False, "python", optimum_ipu.render,
                 optimum_ipu.read_back),
    ExportFormat(torch_pipelining.NAME, torch_pipelining.DESCRIPTION, True, "python", torch_pipelining.render,
                 torch_pipelining.read_back),
    ExportFormat(deepspeed.NAME, deepspeed.DESCRIPTION, False, "python", deepspeed.render, deepspeed.read_back),
    ExportFormat(megatron.NAME, megatron.DESCRIPTION, False, "args", megatron.render, megatron.read_back),
    ExportFormat(megatron.UNEVEN_NAME, megatron.UNEVEN_DESCRIPTION, False, "args", megatron.render_uneven,
                 megatron.read_back_uneven),
    ExportFormat(torchtitan.NAME, torchtitan.DESCRIPTION, False, "args", torchtitan.render, torchtitan.read_back),
    ExportFormat(json_format.NAME, json_format.DESCRIPTION, False, "json", json_format.render,
                 json_format.read_back),
)}


def plan_tied_splits(plan: Plan, tied: Mapping[str, Sequence[str | int]] | None = None) -> tuple[TiedSplit, ...]:
    """``tied_users_across_stages`` for a plan: which of ``tied`` (parameter -> its users, module
    paths or plan layer indices; default: the tied parameters the plan records) its stages divide."""
    if tied is None:
        tied = {t.name: t.layers for t in plan.tied}
    return tied_users_across_stages([range(s.first_layer, s.last_layer + 1) for s in plan.stages],
                                    plan.module_paths or [None] * len(plan.layer_names), tied)


def _parse(spec: ExportFormat, text: str) -> Any:
    if spec.language == "python":
        return check_python(text)
    if spec.language == "args":
        return check_shell(text)
    try:
        return _json.loads(text)
    except ValueError as exc:
        raise RenderCheckError(f"the JSON does not parse: {exc}") from None


def _compare(view: PlanView, fmt: str, decoded: Decoded) -> None:
    """The split read back from the text must be the plan's, stage by stage."""
    want = view.stage_layers
    if decoded.stages != want:
        for k in range(max(len(decoded.stages), len(want))):
            got = decoded.stages[k] if k < len(decoded.stages) else ()
            plan = want[k] if k < len(want) else ()
            if got != plan:
                def names(xs: Sequence[int]) -> str:
                    return ", ".join(view.layer(i) for i in xs[:8]) + (", ..." if len(xs) > 8 else "") \
                        if xs else "nothing"
                raise view.error(f"{fmt}: internal check failed: stage {k} would hold {names(got)}, the plan says "
                                 f"{names(plan)}; nothing written")
    if decoded.recompute is not None and decoded.recompute != view.recompute:
        differ = next(i for i, (a, b) in enumerate(zip(decoded.recompute + ("?",) * len(view.recompute),
                                                           view.recompute)) if a != b)
        written = decoded.recompute[differ] if differ < len(decoded.recompute) else "nothing"
        raise view.error(f"{fmt}: internal check failed: layer '{view.layer(differ)}' would be recomputed "
                         f"'{written}', the plan says '{view.recompute[differ]}'; nothing written")
    if decoded.devices is not None and decoded.devices != view.devices:
        raise view.error(f"{fmt}: internal check failed: the stages would run on devices {list(decoded.devices)}, "
                         f"the plan says {list(view.devices)}; nothing written")


def export_plan(plan: Plan, fmt: str, *, source: str | Path | None = None, training: bool = True,
                model: str = "model", tied: Sequence[TiedSplit] | None = None) -> str:
    """The plan's split as ``fmt`` (a key of ``FORMATS``), with its comment header.

    ``source`` is the plan's file, named in every error (None for a plan in memory);
    ``training`` False writes inference options; ``model`` is the model's dotted Python name in
    snippets; ``tied`` lists tied parameters the plan divides (``plan_tied_splits``; default:
    those the plan records), which formats that cannot pipeline them refuse. Raises ``ExportError`` (one line) when the plan is
    malformed or the format cannot express it, ``OptionError`` for a bad argument."""
    if not isinstance(fmt, str) or fmt not in FORMATS:
        raise OptionError("fmt", f"unknown export format '{show(str(fmt))}': expected one of {', '.join(FORMATS)}")
    if not isinstance(training, bool):
        raise OptionError("training", f"expected True or False, got {type(training).__name__}")
    try:
        model = dotted_name(model)
    except ValueError as exc:
        raise OptionError("model", str(exc)) from None
    if tied is None:
        tied = plan_tied_splits(plan) if isinstance(plan, Plan) else ()
    tied = tuple(tied) if not isinstance(tied, (str, bytes)) else (tied,)
    if not all(isinstance(t, TiedSplit) for t in tied):
        raise OptionError("tied", "expected TiedSplit records (from plan_tied_splits)")
    view = view_of(plan, source)
    spec = FORMATS[fmt]
    options = ExportOptions(training=training, model=model, tied=tied)
    body = spec.render(view, options)
    try:
        if spec.language == "json":
            text = join_lines(body)
        else:
            text = join_lines([f"# {line}" for line in header_lines(view, fmt)] + [""] + body)
        decoded = spec.read_back(_parse(spec, text), view, options)
    except (RenderCheckError, ValueError, TypeError, KeyError, IndexError, SyntaxError) as exc:
        raise ExportError(view.source, f"{fmt}: internal check failed: {show(str(exc))}; nothing written") from None
    _compare(view, fmt, decoded)
    return text
