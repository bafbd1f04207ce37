"""PopART: ``builder.virtualGraph`` and ``builder.pipelineStage`` scopes per layer name, and
pipelined ``SessionOptions`` (manual virtual graphs). Training accumulates at least 2 x stages
micro-batches (PopART needs >= 2P - 1); pipelined inference needs at least as many batches
per step (``popart.DataFlow``) as stages.

PopART sets the available memory proportion per operation, not per IPU
(``builder.setAvailableMemoryProportion(output, proportion)``, 0 < proportion <= 1, on a matmul's
or convolution's output, as PopTorch does for each operation of an IPU): for a plan solved on
profile variants the snippet lists each stage's proportion and ``set_memory_proportion`` applies
it to an operation of a layer."""

from __future__ import annotations

import ast

from ._common import Decoded, ExportOptions, pipelined_accumulation
from ._plan_view import PlanView
from .render import RenderCheckError, literal_assignments, py_literal

__all__ = ["NAME", "DESCRIPTION", "render", "read_back"]

NAME = "popart"
DESCRIPTION = "builder.virtualGraph / builder.pipelineStage per layer, pipelined SessionOptions"


def render(view: PlanView, options: ExportOptions) -> list[str]:
    view.one_stage_per_device(NAME)
    stage_of = {view.layer_names[i]: s.index for s in view.stages for i in s.layers}
    p = len(view.stages)
    lines = ["import contextlib", "", "import popart", "",
             "# the pipeline stage of each layer (the plan's layer names)",
             f"STAGE_OF_LAYER = {py_literal(stage_of)}",
             f"DEVICE_OF_STAGE = {py_literal(list(view.devices))}"]
    proportions = view.memory_proportions
    if proportions is not None:
        lines.append(f"MEMORY_PROPORTION_OF_STAGE = {py_literal([float(x) for x in proportions])}   # the profile "
                     "variant each stage was priced with")
    if not options.training:
        lines.append(f"BATCHES_PER_STEP = {max(p, view.micro_batches)}   # popart.DataFlow(BATCHES_PER_STEP, anchors): "
                     f"pipelined inference needs >= {p} batches per step")
    lines += ["", "",
              "def stage_scope(builder, layer):",
              '    """Build layer `layer` inside `with stage_scope(builder, layer):` to place its ops."""',
              "    stage = STAGE_OF_LAYER[layer]",
              "    scope = contextlib.ExitStack()",
              "    scope.enter_context(builder.virtualGraph(DEVICE_OF_STAGE[stage]))",
              "    scope.enter_context(builder.pipelineStage(stage))",
              "    return scope", "", ""]
    if proportions is not None:
        lines += ["def set_memory_proportion(builder, layer, output):",
                  '    """Call on the output of each matmul and convolution built in layer `layer`: its stage\'s '
                  'availableMemoryProportion."""',
                  "    builder.setAvailableMemoryProportion(output, MEMORY_PROPORTION_OF_STAGE[STAGE_OF_LAYER[layer]])",
                  "", ""]
    lines += ["opts = popart.SessionOptions()",
              "opts.virtualGraphMode = popart.VirtualGraphMode.Manual",
              "opts.enablePipelining = True"]
    if options.training:
        lines += ["opts.enableGradientAccumulation = True",
                  f"opts.accumulationFactor = {pipelined_accumulation(view)}   # pipelined training: >= 2 x {p} - 1"]
    return lines


def read_back(tree: ast.Module, view: PlanView, options: ExportOptions) -> Decoded:
    data = literal_assignments(tree)
    stage_of, devices = data.get("STAGE_OF_LAYER"), data.get("DEVICE_OF_STAGE")
    if not isinstance(stage_of, dict) or not isinstance(devices, list):
        raise RenderCheckError("STAGE_OF_LAYER or DEVICE_OF_STAGE is missing")
    if list(stage_of) != list(view.layer_names):
        raise RenderCheckError("STAGE_OF_LAYER does not list the plan's layers in order")
    values = list(stage_of.values())
    stages = tuple(tuple(i for i, k in enumerate(values) if k == stage) for stage in range(len(devices)))
    if sum(map(len, stages)) != len(values):
        raise RenderCheckError("STAGE_OF_LAYER names a stage with no device")
    want = None if view.memory_proportions is None else list(view.memory_proportions)
    if data.get("MEMORY_PROPORTION_OF_STAGE") != want:
        raise RenderCheckError(f"MEMORY_PROPORTION_OF_STAGE is {data.get('MEMORY_PROPORTION_OF_STAGE')}, the plan's "
                               f"stages say {want}")
    return Decoded(stages, tuple(devices))
