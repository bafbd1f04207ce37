"""TensorFlow for IPU: ``ipu.pipelining_ops.pipeline`` with one computational stage per plan
stage (its layers in order) and the plan's ``device_mapping``.

``pipeline()`` refuses fewer than two computational stages and requires
``gradient_accumulation_count`` for training and inference alike (the number of micro-batches
each stage runs per execution): at least 2 x stages for training, at least the stages for
inference. When the infeed yields a dict, the first stage receives its entries as keyword
arguments; a stage returning a dict passes keyword arguments to the next.

For a plan solved on profile variants, each stage's matmuls and convolutions get the memory
proportion of the variant it was priced with: one ``pipelining_ops.PipelineStageOptions``
(``matmul_options`` and ``convolution_options``, Poplar option values as strings) per stage, as
``forward_propagation_stages_poplar_options`` (and, training, the backward ones).
"""

from __future__ import annotations

import ast

from ._common import Decoded, ExportOptions, pipelined_accumulation
from ._plan_view import PlanView
from .render import RenderCheckError, literal_assignments, py_literal

__all__ = ["NAME", "DESCRIPTION", "render", "read_back"]

NAME = "tf-ipu"
DESCRIPTION = "TensorFlow IPU pipeline: computational_stages (layer groups), device_mapping, accumulation count"


def render(view: PlanView, options: ExportOptions) -> list[str]:
    view.one_stage_per_device(NAME)
    p = len(view.stages)
    if p < 2:
        raise view.error("tf-ipu: TensorFlow's pipelining_ops.pipeline() needs at least 2 computational stages and "
                         "this plan has 1; run the model without pipelining")
    groups = [[view.layer_names[i] for i in s.layers] for s in view.stages]
    if options.training:
        count = pipelined_accumulation(view)
        why = f"training: micro-batches per step, >= 2 x {p} stages and the plan's {view.micro_batches}"
    else:
        count = max(p, view.micro_batches)
        why = f"inference: pipeline() still requires it; >= {p} stages"
    proportions = view.memory_proportions
    options_lines, options_args = [], []
    if proportions is not None:
        options_lines = [
            f"MEMORY_PROPORTION_OF_STAGE = {py_literal([float(x) for x in proportions])}   # the profile variant each "
            "stage was priced with", "", "",
            "def _stage_options(proportion):",
            '    """Poplar options of a stage: its matmuls and convolutions at `proportion`."""',
            '    flags = {"availableMemoryProportion": str(proportion)}',
            "    return ipu.pipelining_ops.PipelineStageOptions(convolution_options=dict(flags), "
            "matmul_options=dict(flags))", "", "",
            "STAGE_OPTIONS = [_stage_options(p) for p in MEMORY_PROPORTION_OF_STAGE]", "", ""]
        options_args = ["                                       forward_propagation_stages_poplar_options="
                        "STAGE_OPTIONS,"]
        if options.training:
            options_args.append("                                       backward_propagation_stages_poplar_options="
                                "STAGE_OPTIONS,")
    return ["from tensorflow.python import ipu", "",
            "# the layers of each pipeline stage, in order (the plan's layer names)",
            f"STAGE_LAYERS = {py_literal(groups)}",
            f"DEVICE_MAPPING = {py_literal(list(view.devices))}",
            f"GRADIENT_ACCUMULATION_COUNT = {count}   # {why}", "", "", *options_lines,
            "def _stage(layers):",
            '    """A computational stage running `layers` in order. run_layer(name, *args, **kwargs) is yours: it',
            "    builds layer `name` (e.g. under tf.name_scope) and returns its outputs: a tensor, a tuple, or a dict",
            "    (passed on as keyword arguments). The first stage takes a dict infeed's entries as keyword",
            '    arguments."""',
            "    def stage(*args, **kwargs):",
            "        for name in layers:",
            "            outputs = run_layer(name, *args, **kwargs)",
            "            if isinstance(outputs, dict):",
            "                args, kwargs = (), outputs",
            "            else:",
            "                args, kwargs = (outputs if isinstance(outputs, tuple) else (outputs,)), {}",
            "        if kwargs:",
            "            return kwargs",
            "        return args if len(args) > 1 else args[0]",
            "    return stage", "", "",
            "computational_stages = [_stage(layers) for layers in STAGE_LAYERS]", "", "",
            "def build_pipeline(**kwargs):",
            '    """ipu.pipelining_ops.pipeline with the plan\'s stages; pass inputs, infeed_queue, outfeed_queue,',
            '    optimizer_function ... as usual."""',
            "    return ipu.pipelining_ops.pipeline(computational_stages=computational_stages,",
            "                                       gradient_accumulation_count=GRADIENT_ACCUMULATION_COUNT,",
            "                                       device_mapping=DEVICE_MAPPING,",
            *options_args,
            "                                       **kwargs)"]


def read_back(tree: ast.Module, view: PlanView, options: ExportOptions) -> Decoded:
    data = literal_assignments(tree)
    groups, devices = data.get("STAGE_LAYERS"), data.get("DEVICE_MAPPING")
    if not isinstance(groups, list) or not isinstance(devices, list):
        raise RenderCheckError("STAGE_LAYERS or DEVICE_MAPPING is missing")
    index = {n: i for i, n in enumerate(view.layer_names)}
    try:
        stages = tuple(tuple(index[n] for n in g) for g in groups)
    except KeyError as exc:
        raise RenderCheckError(f"STAGE_LAYERS names a layer the plan does not have: {exc}") from None
    want = None if view.memory_proportions is None else list(view.memory_proportions)
    if data.get("MEMORY_PROPORTION_OF_STAGE") != want:
        raise RenderCheckError(f"MEMORY_PROPORTION_OF_STAGE is {data.get('MEMORY_PROPORTION_OF_STAGE')}, the plan's "
                               f"stages say {want}")
    return Decoded(stages, tuple(devices))
