"""torch.distributed.pipelining: split points, ``pipeline()``, ``build_stage``, the schedule
with the plan's micro-batches, a training step, and the tied-gradient sum.

What the snippet must get right (each from torch's own behaviour):

- ``pipeline(model, mb_args=...)`` traces ONE micro-batch: a whole batch as ``mb_args`` fails
  at the first step with a shape error.
- ``Schedule1F1B`` refuses fewer micro-batches than stages; GPipe holds every micro-batch.
- A parameter tied across stages (GPT-2's ``wte``/``lm_head``) becomes one copy per stage
  module; their gradients must be summed before the optimizer step (``sum_tied_gradients``).
- Hugging Face models need ``attn_implementation="sdpa"`` beyond 2 stages: eager GPT-2
  attention passes a float mask between stages and fails with ``PipeliningMetadataError:
  Backward of skip connections not supported yet``.
"""

from __future__ import annotations

import ast

from ._common import Decoded, ExportOptions, fqn_index, from_starts, layer_fqns
from ._plan_view import PlanView
from .render import RenderCheckError, literal_assignments, py_literal

__all__ = ["NAME", "DESCRIPTION", "SCHEDULE_CLASSES", "render", "read_back"]

NAME = "torch-pipelining"
DESCRIPTION = "torch.distributed.pipelining split points, pipeline(), build_stage, schedule and step"
#: the plan's schedule -> torch's schedule class (no schedule: GPipe, one micro-batch in flight per step)
SCHEDULE_CLASSES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "none": "ScheduleGPipe"}


def schedule_class(view: PlanView, training: bool, fmt: str = NAME) -> str:
    if not training:
        return "ScheduleGPipe"
    name = SCHEDULE_CLASSES.get(view.schedule)
    if name is None:
        raise view.error(f"{fmt}: the plan's schedule '{view.schedule}' has no torch.distributed.pipelining "
                         f"equivalent here (expected one of {', '.join(SCHEDULE_CLASSES)})")
    if name == "Schedule1F1B" and view.micro_batches < len(view.stages):
        raise view.error(f"{fmt}: torch's Schedule1F1B needs at least as many micro-batches as stages; the plan has "
                         f"{view.micro_batches} for {len(view.stages)} stages (solve with --micro-batches "
                         f"{len(view.stages)} or more)")
    return name


def render(view: PlanView, options: ExportOptions) -> list[str]:
    p = len(view.stages)
    points = layer_fqns(view, NAME, [s.layers[0] for s in view.stages[1:]])
    cls = schedule_class(view, options.training)
    devices = ", ".join(f"{k}->{d}" for k, d in enumerate(view.devices))
    m = view.micro_batches
    why = {"gpipe": "as the plan was solved, with GPipe", "1f1b": "as the plan was solved, with 1F1B",
           "none": "the plan was solved without a schedule, one micro-batch in flight: GPipe"}[view.schedule] \
        if options.training else "inference: forward only, GPipe"
    model = options.model
    lines = ["import torch",
             "import torch.distributed as dist",
             f"from torch.distributed.pipelining import {cls}, SplitPoint, pipeline", "",
             "# each stage after the first begins at one of these modules (fully qualified names)",
             f"SPLIT_POINTS = {py_literal(points)}",
             f"NUM_STAGES = {p}   # one process per stage: rank k runs stage k (plan devices {devices})",
             f"N_MICROBATCHES = {m}   # micro-batches per step: {why}", "", "",
             "def build_pipeline(model, example_microbatch, device, loss_fn=None, group=None):",
             '    """This rank\'s stage of `model`, its schedule and its tied-parameter groups.',
             "",
             "    `example_microbatch` is ONE micro-batch (the batch's first dimension divided by N_MICROBATCHES),",
             "    not the whole batch: pipeline() traces it, and a whole batch fails at the first step with a shape",
             "    error. Hugging Face models: load them with attn_implementation=\"sdpa\" (eager GPT-2 attention",
             "    passes a float mask between stages: PipeliningMetadataError beyond 2 stages) and use_cache=False.",
             "    Tied parameters (GPT-2's wte and lm_head) become one copy per stage that uses them: call",
             '    sum_tied_gradients(tied) after each backward, or the optimizer step unties them."""',
             "    rank = dist.get_rank(group)",
             "    tied_names = {}",
             "    for name, parameter in model.named_parameters(remove_duplicate=False):",
             "        tied_names.setdefault(id(parameter), []).append(name)",
             "    split_spec = {fqn: SplitPoint.BEGINNING for fqn in SPLIT_POINTS}",
             "    pipe = pipeline(model, mb_args=(example_microbatch,), split_spec=split_spec)",
             "    if pipe.num_stages != NUM_STAGES:",
             '        raise ValueError(f"the split gave {pipe.num_stages} stages, the plan has {NUM_STAGES}")',
             "    stage = pipe.build_stage(rank, device, group)"]
    if options.training:
        lines.append(f"    schedule = {cls}(stage, n_microbatches=N_MICROBATCHES, loss_fn=loss_fn)")
    else:
        lines.append(f"    schedule = {cls}(stage, n_microbatches=N_MICROBATCHES)")
    lines += ["    tied = []",
              "    for names in (names for names in tied_names.values() if len(names) > 1):",
              "        copies = [dict(pipe.get_stage_module(k).named_parameters(remove_duplicate=False))",
              "                  for k in range(NUM_STAGES)]",
              "        holders = [k for k in range(NUM_STAGES) if any(n in copies[k] for n in names)]",
              "        if len(holders) > 1:   # every rank creates every group, in the same order",
              "            ranks = holders if group is None else [dist.get_global_rank(group, k) for k in holders]",
              "            tied.append((dist.new_group(ranks), [copies[rank][n] for n in names if n in copies[rank]]))",
              "    return stage, schedule, tied", "", ""]
    if options.training:
        lines += ["def train_step(stage, schedule, inputs=None, targets=None):",
                  '    """One forward and backward over a whole batch (N_MICROBATCHES micro-batches): the first',
                  "    stage passes `inputs`, the last stage `targets` and gets the micro-batch losses back. Then call",
                  '    sum_tied_gradients(tied) and optimizer.step()."""',
                  "    losses = []",
                  "    args = (inputs,) if stage.is_first else ()",
                  '    kwargs = {"target": targets, "losses": losses} if stage.is_last else {}',
                  "    schedule.step(*args, **kwargs)",
                  "    return losses", "", "",
                  "def sum_tied_gradients(tied):",
                  '    """Sum the gradients of each tied parameter\'s per-stage copies, so that they stay equal."""',
                  "    for process_group, copies in tied:",
                  "        if not copies:",
                  "            continue",
                  "        total = sum(p.grad if p.grad is not None else torch.zeros_like(p) for p in copies)",
                  "        dist.all_reduce(total, group=process_group)",
                  "        for p in copies:",
                  "            p.grad = total.clone()", "", ""]
    else:
        lines += ["def run_step(stage, schedule, inputs=None):",
                  '    """One forward over a whole batch: the first stage passes `inputs`; the last gets the outputs."""',
                  "    return schedule.step(inputs) if stage.is_first else schedule.step()", "", ""]
    step = ("losses = train_step(stage, schedule, inputs, targets); sum_tied_gradients(tied); optimizer.step()"
            if options.training else "outputs = run_step(stage, schedule, inputs)")
    lines += ["# on every rank (torchrun --nproc-per-node NUM_STAGES ...), with the whole model built on each:",
              f"#   stage, schedule, tied = build_pipeline({model}, example_microbatch, device"
              f"{', loss_fn' if options.training else ''})",
              f"#   {step}"]
    return lines


def read_back(tree: ast.Module, view: PlanView, options: ExportOptions) -> Decoded:
    data = literal_assignments(tree)
    points, p = data.get("SPLIT_POINTS"), data.get("NUM_STAGES")
    if not isinstance(points, list) or p != len(points) + 1:
        raise RenderCheckError("SPLIT_POINTS and NUM_STAGES disagree")
    if data.get("N_MICROBATCHES") != view.micro_batches:
        raise RenderCheckError("N_MICROBATCHES differs from the plan's micro-batches")
    by_fqn = fqn_index(view)
    bounds = [0] + [by_fqn.get(f, -1) for f in points]
    if -1 in bounds:
        raise RenderCheckError("a split point names no single plan layer")
    return Decoded(from_starts(bounds, len(view.layer_names)))
