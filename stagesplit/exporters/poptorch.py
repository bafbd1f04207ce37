"""PopTorch: a ``poptorch.BeginBlock`` at every stage start, and pipelined ``poptorch.Options``.

``poptorch.BeginBlock(layer_to_call, user_id=None, ipu_id=None)`` wraps the module where a
stage starts; every module after it runs on that IPU until the next BeginBlock. Pipelined
training needs gradient accumulation of at least 2 x IPUs - 1 micro-batches (the forward and
backward pipeline stages); pipelined inference needs at least as many device iterations as
stages. With a headroom, PopLibs' default available memory proportion (0.6) is scaled down.

The plan's activation recompute: PopART's pipeline recomputation (``autoRecomputation`` 3,
``RecomputationType::Pipeline``) re-runs each forward stage before its backward except at
``poptorch.recomputationCheckpoint`` tensors; a forward hook checkpoints every block's output, so
each block is recomputed from its stored input, as full recompute does. PopART applies it to
every stage and every block: where the plan recomputes some blocks only, or selectively, a
comment line says so (every block is recomputed, at least the plan's recompute).
"""

from __future__ import annotations

import ast

from ._common import (
    POPLIBS_MEMORY_PROPORTION,
    Decoded,
    ExportOptions,
    fqn_index,
    from_starts,
    layer_expressions,
    pipelined_accumulation,
)
from ._plan_view import PlanView
from .render import RenderCheckError, expression_path, py_literal, py_str

__all__ = ["NAME", "DESCRIPTION", "render", "read_back", "memory_proportions", "RECOMPUTATION_PIPELINE"]

#: PopART's RecomputationType::Pipeline, as ``opts._Popart.set("autoRecomputation", ...)`` takes it
RECOMPUTATION_PIPELINE = 3
_HOOK = "checkpoint_outputs"

NAME = "poptorch"
DESCRIPTION = "poptorch.BeginBlock per stage start and pipelined poptorch.Options"


def memory_proportions(view: PlanView, default: float = POPLIBS_MEMORY_PROPORTION) -> dict[int, float] | None:
    """Per device: the memory proportion of the profile variant its stage takes, when the plan
    was solved on variants (the plan's memory holds with it only); else, when the plan was
    solved with a headroom h, ``default`` x (1 - h), so that matmul and convolution temporaries
    shrink with the budget instead of eating the headroom; else None."""
    chosen = view.memory_proportions
    if chosen is not None:
        return dict(zip(view.devices, chosen))
    if view.headroom <= 0:
        return None
    return {d: round(default * (1.0 - view.headroom), 3) for d in view.devices}


def render(view: PlanView, options: ExportOptions) -> list[str]:
    view.one_stage_per_device(NAME)
    starts = [s.layers[0] for s in view.stages]
    exprs = layer_expressions(view, NAME, options.model, starts)
    lines = ["import poptorch", "",
             "# one BeginBlock per stage start (BeginBlock(layer_to_call, user_id, ipu_id)): the stage runs from this "
             "module to the next BeginBlock"]
    for k, expr in enumerate(exprs):
        lines.append(f"{expr} = poptorch.BeginBlock({expr}, {py_str(f'stage{k}')}, ipu_id={view.devices[k]})")
    p = len(view.stages)
    lines += ["", "opts = poptorch.Options()",
              "opts.setExecutionStrategy(poptorch.PipelinedExecution(poptorch.AutoStage.AutoIncrement))"]
    if options.training:
        lines.append(f"opts.Training.gradientAccumulation({pipelined_accumulation(view)})   # pipelined training: "
                     f">= 2 x {p} - 1 micro-batches (and the plan's {view.micro_batches})")
    else:
        lines.append(f"opts.deviceIterations({max(p, view.micro_batches)})   # pipelined inference: >= {p} device "
                     f"iterations (one per stage)")
    if options.training and view.recomputes:
        lines += _recompute_lines(view, options)
    proportions = memory_proportions(view)
    if proportions and view.memory_proportions is not None:
        lines.append("# each IPU's availableMemoryProportion: that of the profile variant its stage was priced with "
                     "(the plan's memory holds only with it)")
    elif proportions:
        lines.append(f"# the plan keeps {view.headroom:.0%} of every IPU free: matmul/convolution temporaries get "
                     f"PopLibs' default {POPLIBS_MEMORY_PROPORTION} x (1 - headroom)")
    if proportions:
        lines.append("opts.setAvailableMemoryProportion({" +
                     ", ".join(f"{py_str(f'IPU{d}')}: {py_literal(float(v))}" for d, v in proportions.items()) + "})")
    return lines


def _recompute_lines(view: PlanView, options: ExportOptions) -> list[str]:
    blocks = view.decoder_recompute()
    first = int(view.embedding)
    exprs = layer_expressions(view, NAME, options.model, list(range(first, first + len(blocks))))
    lines = ["", "",
             f"def {_HOOK}(module, inputs, output):",
             '    """Keep a block\'s output for the backward: PopART re-runs the forward between checkpoints."""',
             "    if isinstance(output, tuple):",
             "        return tuple(poptorch.recomputationCheckpoint(y) for y in output)",
             "    return poptorch.recomputationCheckpoint(output)", "", ""]
    if set(blocks) != {"full"}:
        counts = ", ".join(f"{sum(1 for r in blocks if r == o)} {o}" for o in ("full", "selective", "none")
                           if o in blocks)
        lines.append(f"# PopART recomputes every block of every pipeline stage and cannot take the plan's per-layer "
                     f"choice ({counts}): every block below, at least the plan's recompute")
    lines.append("# activation recompute: every block's output is a checkpoint, the rest of the forward re-runs "
                 "before the backward")
    lines += [f"{expr}.register_forward_hook({_HOOK})" for expr in exprs]
    lines.append(f"opts._Popart.set(\"autoRecomputation\", {RECOMPUTATION_PIPELINE})   # RecomputationType::Pipeline")
    return lines


def _is_begin_block(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "BeginBlock"
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "poptorch")


def read_back(tree: ast.Module, view: PlanView, options: ExportOptions) -> Decoded:
    """The BeginBlock assignments as written: their modules (mapped to plan layers by module
    path), user ids (``stageK`` in order) and IPUs."""
    by_path = {f"{options.model}.{fqn}": i for fqn, i in fqn_index(view).items()}
    starts: list[int] = []
    devices: list[int] = []
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and _is_begin_block(node.value)):
            continue
        call = node.value
        assert isinstance(call, ast.Call)              # _is_begin_block checked
        target = expression_path(node.targets[0])
        if len(node.targets) != 1 or len(call.args) != 2 or expression_path(call.args[0]) != target:
            raise RenderCheckError(f"BeginBlock for {target} does not wrap the module it replaces")
        if ast.literal_eval(call.args[1]) != f"stage{len(starts)}":
            raise RenderCheckError(f"BeginBlock for {target} has user id {ast.literal_eval(call.args[1])!r}")
        ipu = [kw for kw in call.keywords if kw.arg == "ipu_id"]
        if len(ipu) != 1 or len(call.keywords) != 1:
            raise RenderCheckError(f"BeginBlock for {target} needs exactly ipu_id=")
        if by_path.get(target, -1) < 0:
            raise RenderCheckError(f"BeginBlock for {target}, which names no single plan layer")
        starts.append(by_path[target])
        devices.append(ast.literal_eval(ipu[0].value))
    if starts != sorted(starts) or not starts or starts[0] != 0:
        raise RenderCheckError(f"BeginBlocks at plan layers {starts}: expected increasing from 0")
    hooked = [by_path.get(expression_path(node.value.func.value), -1) for node in tree.body
              if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
              and isinstance(node.value.func, ast.Attribute) and node.value.func.attr == "register_forward_hook"]
    first = int(view.embedding)
    want = list(range(first, first + len(view.decoder_recompute()))) if options.training and view.recomputes else []
    if hooked != want:
        raise RenderCheckError(f"recompute checkpoints at plan layers {hooked}, expected {want}")
    if view.memory_proportions is not None:
        written = [ast.literal_eval(n.value.args[0]) for n in tree.body if isinstance(n, ast.Expr)
                   and isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Attribute)
                   and n.value.func.attr == "setAvailableMemoryProportion"]
        proportions = {f"IPU{d}": p for d, p in zip(view.devices, view.memory_proportions)}
        if written != [proportions]:
            raise RenderCheckError(f"setAvailableMemoryProportion writes {written}, the plan's stages say {proportions}")
    return Decoded(from_starts(starts, len(view.layer_names)), tuple(devices))
