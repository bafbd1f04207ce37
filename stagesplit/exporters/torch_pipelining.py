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
- The plan's activation recompute (``RECOMPUTE``, per module fully qualified name) is applied
  to the traced stage modules, after ``pipeline()``: its tracing (torch.export) refuses a model
  whose blocks are already wrapped (``Attribute 'mlp' not found in model``), and the traced
  stage keeps the model's module names (``transformer.h.3``). "full" wraps the block in
  ``checkpoint_wrapper`` (non-reentrant: keep its input, re-run its forward before its
  backward); "selective" adds torch's selective activation checkpointing with a policy that
  keeps the outputs of the operations ``model/recompute.py`` counts as kept
  (``EXPENSIVE_OPERATIONS``: matrix products, convolutions, attention) and re-runs the rest.
  torch refuses selective checkpointing under a split backward ("You are only allowed to
  backward once on any region computed under selective activation checkpoint"), so a
  zero-bubble plan with selective recompute is refused.
- The plan's precision, where its profile records one other than float32: ``PARAMETER_DTYPE``,
  which ``build_pipeline`` casts the model to; ``AUTOCAST_DTYPE``, torch's autocast around each
  stage's forward (``autocast_forwards``: each micro-batch keeps its own casts of the weights for its
  backward, as an amp capture priced them; one autocast around the whole step would share one cast
  per weight over its micro-batches, 7% less than priced on Qwen2's first rank); with ``MASTER_WEIGHTS``,
  ``master_weights`` gives each parameter a float32 gradient (``main_grad``) that every gradient
  autograd writes is added into and dropped, and a float32 master copy whose gradient it is: the
  optimizer is made over the masters, and ``copy_masters`` copies them back after its step and
  zeroes the gradients in place (Megatron's ``--bf16``, as a master-weights capture priced it); a
  split backward's W writes ``.grad`` itself, so each W adds it into ``main_grad`` as it ends.
"""

from __future__ import annotations

import ast
from pathlib import Path

from ..common.text import show
from ..io.profile import loss_parallel_of
from ..model.recompute import EXPENSIVE_OPERATIONS
from ..solver.schedule_kinds import traits
from ._common import Decoded, ExportOptions, fqn_index, from_starts, layer_fqns, module_fqn
from ._plan_view import PlanView
from .render import RenderCheckError, literal_assignments, py_literal

__all__ = ["NAME", "DESCRIPTION", "MULTI_STAGE", "SCHEDULE_CLASSES", "render", "read_back"]

NAME = "torch-pipelining"
DESCRIPTION = "torch.distributed.pipelining split points, pipeline(), build_stage, schedule and step"
#: the plan's schedule -> torch's schedule class (no schedule: GPipe, one micro-batch in flight per step)
SCHEDULE_CLASSES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "none": "ScheduleGPipe",
                    "interleaved-1f1b": "ScheduleInterleaved1F1B", "looped-bfs": "ScheduleLoopedBFS",
                    "zb-h1": "ScheduleInterleavedZeroBubble", "zbv": "ScheduleZBVZeroBubble",
                    "dualpipev": "ScheduleDualPipeV"}
#: the classes that take a list of stages (several chunks per rank)
MULTI_STAGE = {"ScheduleInterleaved1F1B", "ScheduleLoopedBFS", "ScheduleInterleavedZeroBubble",
               "ScheduleZBVZeroBubble", "ScheduleDualPipeV"}


#: the exported file's ``contiguous_boundaries`` (a traced pipeline's boundaries made contiguous)
CONTIGUOUS_BOUNDARIES: tuple[str, ...] = (
    "def contiguous_boundaries(pipe):",
    '    """Make every tensor that crosses a stage boundary contiguous in the split pipe: torch makes each',
    "    traced stage's receive buffers (and the gradients' ones of the stage before) with the strides the",
    "    tracing gave the tensor, and gloo and NCCL send and receive only contiguous tensors, so a boundary",
    "    after a transpose, a permute or an expand (torchvision's ViT, ConvNeXt, a Hugging Face encoder's",
    "    attention mask) failed at the first step (\"input tensor has to be contiguous\"). The stage that sends",
    "    such a tensor returns a contiguous copy of it (a copy only where it is not contiguous already), and",
    '    the stage that receives it is told so, before any stage is built from the pipe."""',
    "    def contiguous(value):",
    "        mode = getattr(value, \"fake_mode\", None)",
    "        if mode is None:",
    "            return torch.empty(value.shape, dtype=value.dtype, device=\"meta\")",
    "        with mode:",
    "            return torch.empty(value.shape, dtype=value.dtype, device=value.device)",
    "",
    "    def crossing(node):",
    "        value = node.meta.get(\"val\") if isinstance(node, torch.fx.Node) else None",
    "        return isinstance(value, torch.Tensor) and not value.is_contiguous()",
    "",
    "    def sent(graph, output, node):",
    "        if not crossing(node):",
    "            return node",
    "        with graph.inserting_before(output):",
    "            copy = graph.call_method(\"contiguous\", (node,))",
    "        copy.meta[\"val\"] = contiguous(node.meta[\"val\"])",
    "        return copy",
    "",
    "    def from_a_stage(node):",
    "        while node.op == \"call_function\" and node.args:     # one output of a stage that returns several",
    "            node = node.args[0]",
    "        return node.op == \"call_module\"",
    "",
    "    modules = dict(pipe.split_gm.named_children())",
    "    for call in pipe.split_gm.graph.nodes:",
    "        if call.op != \"call_module\":",
    "            continue",
    "        module = modules[call.target]",
    "        graph = module.graph",
    "        output = next(node for node in graph.nodes if node.op == \"output\")",
    "        before = output.args",
    "        output.args = torch.fx.node.map_arg(output.args, lambda node, g=graph, o=output: sent(g, o, node))",
    "        if output.args != before:",
    "            module.recompile()",
    "        # what another stage sends it (the model's own inputs keep their strides)",
    "        places = [node for node in graph.nodes if node.op == \"placeholder\"]",
    "        for place, given in zip(places, call.args):",
    "            if isinstance(given, torch.fx.Node) and from_a_stage(given) and crossing(place):",
    "                place.meta[\"val\"] = contiguous(place.meta[\"val\"])",
)


RELAY_SKIPS_SOURCE = """\
def relay_skips(pipe):
    \"\"\"Pass every tensor that skips a stage through the stages between, in the split pipe. A traced model
    computes some tensors once and uses them far downstream (an encoder's attention mask, read by every
    layer; a U-Net's skip connections): pipeline() sends such a tensor from the stage that makes it straight
    to each stage that reads it, and torch's runtimes pass tensors to the next stage only ("Backward of skip
    connections not supported yet"). Here each stage between takes it as one more input and returns it as one
    more output, unchanged, so that every tensor goes to the next stage alone; its gradient comes back the
    same way. Run after contiguous_boundaries, before any stage is built from the pipe.\"\"\"
    import operator

    root = pipe.split_gm
    graph = root.graph
    calls = [node for node in graph.nodes if node.op == "call_module"]
    stage_of = {node: k for k, node in enumerate(calls)}
    modules = dict(root.named_children())

    def producer(node):
        while node not in stage_of and node.op == "call_function" and node.args:
            node = node.args[0]   # one output of a stage that returns several
        return stage_of.get(node)

    def outputs(k):
        \"\"\"Stage k's outputs in the root graph, in order (the stage made to return a tuple).\"\"\"
        call, sub = calls[k], modules[calls[k].target].graph
        out = next(node for node in sub.nodes if node.op == "output")
        if not isinstance(out.args[0], (tuple, list)):
            out.args = ((out.args[0],),)
            users = list(call.users)
            with graph.inserting_after(call):
                first = graph.call_function(operator.getitem, (call, 0))
            for user in users:
                user.replace_input_with(call, first)
        return [user for user in call.users if user.op == "call_function" and user.target is operator.getitem]

    relayed = {}

    def through(node, k, value):
        \"\"\"The root node that carries ``node`` out of stage ``k`` (relayed from its producer on).\"\"\"
        j = producer(node)
        if k == j:
            return node
        if (node, k) in relayed:
            return relayed[node, k]
        incoming = through(node, k - 1, value)
        call, module = calls[k], modules[calls[k].target]
        sub = module.graph
        places = [place for place in sub.nodes if place.op == "placeholder"]
        place = next((p for p, given in zip(places, call.args) if given is incoming), None)
        if place is None:
            with sub.inserting_after(places[-1]):
                place = sub.placeholder(f"relayed_{len(relayed)}")
            place.meta["val"] = value
            call.args = (*call.args, incoming)
        out = next(node for node in sub.nodes if node.op == "output")
        last = outputs(k)
        out.args = ((*out.args[0], place),)
        module.recompile()
        with graph.inserting_after(last[-1] if last else call):
            carried = graph.call_function(operator.getitem, (call, len(out.args[0]) - 1))
        relayed[node, k] = carried
        return carried

    for k, call in enumerate(calls):
        places = [place for place in modules[call.target].graph.nodes if place.op == "placeholder"]
        for position, given in enumerate(call.args):
            j = producer(given) if isinstance(given, torch.fx.Node) else None
            if j is not None and j < k - 1:
                carried = through(given, k - 1, places[position].meta["val"])
                call.args = tuple(carried if i == position else arg for i, arg in enumerate(call.args))
    graph.lint()
    root.recompile()
"""


def contiguous_boundaries_source() -> str:
    """The source of the exported file's ``contiguous_boundaries`` (it reads ``torch``)."""
    return "\n".join(CONTIGUOUS_BOUNDARIES) + "\n"


def schedule_class(view: PlanView, training: bool, fmt: str = NAME) -> str:
    if not training:
        return "ScheduleGPipe"
    name = SCHEDULE_CLASSES.get(view.schedule)
    if name is None:
        raise view.error(f"{fmt}: the plan's schedule '{view.schedule}' has no torch.distributed.pipelining "
                         f"equivalent here (expected one of {', '.join(SCHEDULE_CLASSES)})")
    if name == "Schedule1F1B" and view.micro_batches < len(view.stages):
        raise view.error(f"{fmt}: torch's Schedule1F1B needs at least as many micro-batches as stages; the plan has "
                         f"{view.micro_batches} for {len(view.stages)} stages (solve with `micro_batches="
                         f"{len(view.stages)}` or more)")
    return name


#: the split-backward schedules, under which torch refuses selective activation checkpointing
_SPLIT_BACKWARD = {name for name in SCHEDULE_CLASSES if name != "none" and traits(name).splits_backward}


def recompute_map(view: PlanView, fmt: str = NAME) -> dict[str, str]:
    """Each recomputed plan layer's fully qualified module name -> "full" or "selective"."""
    chosen = [i for i, r in enumerate(view.recompute) if r != "none"]
    if any(view.recompute[i] == "selective" for i in chosen) and view.schedule in _SPLIT_BACKWARD:
        raise view.error(f"{fmt}: torch refuses selective activation checkpointing under {view.schedule}'s split "
                         "backward (it allows one backward per checkpointed region); solve with `recompute='full'` or "
                         "auto, or another schedule")
    return dict(zip(layer_fqns(view, fmt, chosen), (view.recompute[i] for i in chosen)))


def _recompute_lines(recompute: dict[str, str], from_modules: bool = False) -> list[str]:
    """The plan's recompute as code: the map, the selective policy, ``recompute_block`` (one block,
    for stages built from modules) and ``apply_recompute`` (a traced stage module)."""
    selective = "selective" in recompute.values()
    return [
        "# activation recompute as the plan chose it, per module (fully qualified names): \"full\" re-runs the whole",
        "# block before its backward (checkpoint_wrapper, non-reentrant); \"selective\" keeps the outputs of matrix",
        "# products, convolutions and attention and re-runs the rest (selective activation checkpointing)",
        f"RECOMPUTE = {py_literal(recompute)}",
        *([f"SELECTIVE_KEEPS = re.compile({py_literal(EXPENSIVE_OPERATIONS.pattern)})   # the aten operations "
           "whose outputs selective recompute keeps", "", "",
           "def keep_expensive(ctx, op, *args, **kwargs):",
           '    """The selective policy: keep what SELECTIVE_KEEPS names, re-run everything else."""',
           '    packet = getattr(op, "overloadpacket", None)',
           '    name = f"{op.namespace}.{packet.__name__}" if packet is not None else ""',
           "    return CheckpointPolicy.MUST_SAVE if SELECTIVE_KEEPS.fullmatch(name) else "
           "CheckpointPolicy.PREFER_RECOMPUTE"] if selective else []),
        "", "",
        "def recompute_block(fqn, block):",
        '    """`block` (the module named `fqn`) as RECOMPUTE says: checkpointed, or as it is."""',
        "    mode = RECOMPUTE.get(fqn)",
        "    if mode is None:",
        "        return block",
        *(["    context = {} if mode == \"full\" else {",
           "        \"context_fn\": functools.partial(create_selective_checkpoint_contexts, keep_expensive)}",
           "    return checkpoint_wrapper(block, **context)"] if selective else
          ["    return checkpoint_wrapper(block)"]),
        "", "",
        "def apply_recompute(stage_module):",
        '    """Wrap the blocks of RECOMPUTE that this traced stage module holds. After pipeline(): its tracing',
        '    refuses checkpoint wrappers, and the traced stage keeps the model\'s module names."""',
        "    for fqn in RECOMPUTE:",
        "        try:",
        "            block = stage_module.get_submodule(fqn)",
        "        except AttributeError:",
        "            continue   # on another stage",
        "        parent, _, name = fqn.rpartition(\".\")",
        "        setattr(stage_module.get_submodule(parent), name, recompute_block(fqn, block))",
        "", ""]


def block_stack(view: PlanView) -> str | None:
    """The fully qualified name of the stack whose blocks the plan's layers are, in order
    (``model.layers`` for layers ``model.layers.0`` ... ``model.layers.{L-1}``), else None."""
    paths = view.module_paths
    if not paths or any(p is None for p in paths):
        return None
    try:
        fqns = [module_fqn(p) for p in paths if p is not None]      # every one (checked above)
    except ValueError:
        return None
    stack = fqns[0].rpartition(".")[0]
    if not stack or fqns != [f"{stack}.{i}" for i in range(len(fqns))]:
        return None
    return stack


def _stage_modules_source() -> list[str]:
    """templates/stage_modules.py as lines, to inline: a file, not a module of the package (it imports
    torch); its own ``import torch`` and ``__all__`` are left out."""
    text = (Path(__file__).parent / "templates" / "stage_modules.py").read_text(encoding="utf-8")
    return [line for line in text.splitlines() if line != "import torch" and not line.startswith("__all__")]


#: the tensor-parallel styles an export writes (capturing/tensorparallel.py's): style -> the torch ParallelStyle
#: made for it (None: the module is left whole); ``setup_parallel`` adds the layouts sequence parallelism changes
_TP_STYLES = {"colwise": "ColwiseParallel", "colwise_gather_output": "ColwiseParallel",
              "colwise_loss_parallel": "ColwiseParallel",
              "rowwise": "RowwiseParallel", "embedding_rowwise": "RowwiseParallel",
              "rowwise_split_input": "RowwiseParallel", "sequence": None,
              "sequence_parallel": None, "replicate": None, "replicated_with_grad_allreduce": None}

#: what sequence parallelism adds to a plan, as a capture records it (``ParallelLayout.additions``): the
#: stream is split on the sequence at the first block, norms run under ``SequenceParallel``, a module left
#: whole inside a block gathers its input and splits its output, a final norm before a whole head gathers
_SP_ADDITIONS = ("input split on the sequence", "SequenceParallel", "input gathered, output split on the sequence",
                 "input gathered")


def _parallel_lines(view: PlanView, stack: str | None) -> list[str]:
    """Where the plan was priced for a tensor-parallel rank (the capture's plan, applied again by torch's
    ``parallelize_module``, with sequence parallelism's additions where it was captured with them) or a
    data-parallel one (FSDP2's ``fully_shard`` on each block and the rest of each stage): ``setup_parallel``
    makes the (pipeline, data, tensor) device mesh and applies the former; ``build_pipeline`` applies the
    latter to the stages it builds (``shard_stages``)."""
    tp, dp = view.tensor_parallel, view.data_parallel
    if tp <= 1 and dp <= 1:
        return []
    plan = []
    for path, style in view.tensor_parallel_styles:
        if style not in _TP_STYLES:
            raise view.error(f"{NAME}: tensor-parallel style '{show(style)}' of module '{show(path)}': expected one "
                             f"of {', '.join(_TP_STYLES)}")
        if _TP_STYLES[style] is not None:
            plan.append([path, style])
    # held whole on every rank but run on the rank's own heads (Qwen3's and Gemma 3's per-head norms): each rank
    # gets its heads' part of the gradient, which transformers' style sums over the group after the backward
    summed = [path for path, style in view.tensor_parallel_styles if style == "replicated_with_grad_allreduce"]
    added = [[path, what] for path, what in view.sequence_parallel_additions]
    for path, what in added:
        if what not in _SP_ADDITIONS:
            raise view.error(f"{NAME}: sequence parallelism's addition '{show(what)}' to module '{show(path)}': "
                             f"expected one of {', '.join(_SP_ADDITIONS)}")
    if view.sequence_parallel and not added:
        raise view.error(f"{NAME}: the plan was captured with sequence parallelism but records none of the layouts it "
                         "adds between the blocks (a plan from an older stagesplit): capture and solve it again")
    if dp > 1 and view.zero != 3:
        raise view.error(f"{NAME}: data parallelism is written as FSDP2 (ZeRO 3, fully_shard); the plan was priced "
                         f"under ZeRO {view.zero}: solve it with ZeRO 3 to export it")
    if stack is None:
        raise view.error(f"{NAME}: a tensor- or data-parallel plan is exported for stages built from one stack of "
                         "blocks (a Hugging Face causal language model); torch's tracer does not take parallel "
                         "modules")
    lines = [
        "# parallelism beside the pipeline: launch len(STAGES_OF_RANK) x DATA_PARALLEL x TENSOR_PARALLEL processes;",
        "# the device mesh is (pipeline, data, tensor), so global rank g is pipeline rank",
        "# g // (DATA_PARALLEL * TENSOR_PARALLEL). Call setup_parallel(model, device) before build_pipeline and give",
        "# build_pipeline the group it returns. Every process of a pipeline rank gets its own share of the batch.",
        f"TENSOR_PARALLEL = {tp}   # ranks sharing every layer (the capture's rank is one of them)",
        f"TP_PLAN = {py_literal(plan)}   # [module path, style], as the capture applied it",
        f"TP_GRADIENTS_SUMMED = {py_literal(summed)}   # held whole on each rank, run on its own heads: gradients summed",
        f"SEQUENCE_PARALLEL = {bool(view.sequence_parallel)}   # the stream between the blocks split on the sequence",
        f"SP_ADDED = {py_literal(added)}   # [module path, what sequence parallelism adds there]",
        f"DATA_PARALLEL = {dp}   # FSDP2 ranks (ZeRO 3): each block, and the rest of each stage, sharded",
        f"RESHARD_AFTER_FORWARD = {view.reshard_after_forward}",
        "_MESH = {}",
        "",
        "",
        "def tensor_parallel_styles(model):",
        '    """TP_PLAN and SP_ADDED as torch ParallelStyles, module path -> style, as the capture made them: with',
        "    sequence parallelism a colwise layer in a block gathers its input from the sequence split, a rowwise one",
        '    reduce-scatters its output to it; an embedding takes its token ids whole."""',
        "    from torch.distributed.tensor import Replicate, Shard",
        "    from torch.distributed.tensor.parallel import (ColwiseParallel, ParallelStyle, PrepareModuleInput,",
        "                                                   PrepareModuleOutput, RowwiseParallel, SequenceParallel)",
        "",
        "    class Gathered(ParallelStyle):",
        '        """A module left whole inside a sequence-parallel block: its input gathered, its output split."""',
        "        def _apply(self, module, device_mesh):",
        "            PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),",
        "                               use_local_output=True)._apply(module, device_mesh)",
        "            return PrepareModuleOutput(output_layouts=(Replicate(),), desired_output_layouts=(Shard(1),),",
        "                                       use_local_output=True)._apply(module, device_mesh)",
        "",
        "    styles = {}",
        "    for path, style in TP_PLAN:",
        "        in_blocks = SEQUENCE_PARALLEL and path.startswith(BLOCKS + '.')",
        "        kwargs = {}",
        "        if style.startswith('colwise'):",
        "            if style == 'colwise_gather_output':",
        "                kwargs['output_layouts'] = Replicate()",
        "            elif style == 'colwise_loss_parallel':   # the logits stay split on the vocabulary (loss_parallel)",
        "                kwargs['output_layouts'], kwargs['use_local_output'] = Shard(-1), False",
        "            if in_blocks or (SEQUENCE_PARALLEL and style != 'colwise'):",
        "                kwargs['input_layouts'] = Shard(1)",
        "            styles[path] = ColwiseParallel(**kwargs)",
        "        else:",
        "            if style == 'rowwise_split_input' or isinstance(model.get_submodule(path), torch.nn.Embedding):",
        "                kwargs['input_layouts'] = Replicate()   # token ids come whole",
        "            if in_blocks:",
        "                kwargs['output_layouts'] = Shard(1)",
        "            styles[path] = RowwiseParallel(**kwargs)",
        "    made = {",
        f"        {py_literal(_SP_ADDITIONS[0])}: lambda: PrepareModuleInput(",
        "            input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),), use_local_output=True),",
        f"        {py_literal(_SP_ADDITIONS[1])}: SequenceParallel,",
        f"        {py_literal(_SP_ADDITIONS[2])}: Gathered,",
        f"        {py_literal(_SP_ADDITIONS[3])}: lambda: PrepareModuleInput(",
        "            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True),",
        "    }",
        "    for path, what in SP_ADDED:",
        "        styles[path] = made[what]()",
        "    return styles",
        "",
        "",
        "def setup_parallel(model, device):",
        '    """Make the (pipeline, data, tensor) device mesh, apply TP_PLAN (and SP_ADDED) to `model` with torch\'s',
        '    own styles, and return the pipeline\'s process group (build_pipeline\'s `group`)."""',
        "    if not builds_from_modules(model):",
        "        raise ValueError('a tensor- or data-parallel plan runs on stages built from a Hugging Face causal '",
        "                         \"language model's modules (build_pipeline); torch's tracer does not take parallel \"",
        "                         'modules')",
        "    from torch.distributed.device_mesh import init_device_mesh",
        "    from torch.distributed.tensor.parallel import parallelize_module",
        "    mesh = init_device_mesh(device.type, (len(STAGES_OF_RANK), DATA_PARALLEL, TENSOR_PARALLEL),",
        "                            mesh_dim_names=('pp', 'dp', 'tp'))",
        "    _MESH['mesh'] = mesh",
        "    tied = {}",
        "    for name, parameter in model.named_parameters(remove_duplicate=False):",
        "        tied.setdefault(id(parameter), []).append(name)",
        "    _MESH['tied'] = [names for names in tied.values() if len(names) > 1]   # as the model ties them, by name",
        "    if TENSOR_PARALLEL > 1:",
        "        parallelize_module(model, mesh['tp'], tensor_parallel_styles(model))",
        "        tie_again(model, _MESH['tied'])",
        "    _MESH['summed'] = [p for path in TP_GRADIENTS_SUMMED for p in model.get_submodule(path).parameters()]",
        "    return mesh['pp'].get_group()",
        "",
        "",
        "def tie_again(model, groups):",
        '    """parallelize_module gives each module it lays out a parameter of its own: a tensor the model ties under',
        "    several names (Gemma's embedding and head) would become two, each trained on its own part of the gradient.",
        '    Each group of names is tied again to one parameter, which needs them laid out alike."""',
        "    for names in groups:",
        "        first = model.get_parameter(names[0])",
        "        for name in names[1:]:",
        "            other = model.get_parameter(name)",
        "            if other is first:",
        "                continue",
        "            if other.shape != first.shape or getattr(other, 'placements', None) != getattr(first, 'placements', None):",
        "                raise ValueError(f'tensor parallelism lays out the tied parameters {names[0]} and {name} '",
        "                                 'differently: they cannot stay one tensor')",
        "            path, _, attribute = name.rpartition('.')",
        "            setattr(model.get_submodule(path) if path else model, attribute, first)",
        "",
        "",
        "def shard_stages(modules, mine):",
        '    """FSDP2 over the data-parallel ranks: each block of this rank\'s stages, each other module holding',
        '    parameters (embeddings, final norm, head), then the stage itself (the root torch\'s pipeline runtime',
        '    drives: gradients synchronised once, after the last micro-batch)."""',
        "    if DATA_PARALLEL <= 1:",
        "        return",
        "    from torch.distributed.fsdp import fully_shard",
        "    mesh = _MESH['mesh']['dp']",
        "    for k in mine:",
        "        stage = modules[k]",
        "        parts = [*stage.blocks, *stage.decoder_parts.values(), *getattr(stage, 'head', {}).values()]",
        "        for part in parts:",
        "            if any(True for _ in part.parameters()):",
        "                fully_shard(part, mesh=mesh, reshard_after_forward=RESHARD_AFTER_FORWARD)",
        "        fully_shard(stage, mesh=mesh, reshard_after_forward=RESHARD_AFTER_FORWARD)",
        "",
        "",
    ]
    return lines


def precision_lines(view: PlanView) -> list[str]:
    """The constants that set the plan's precision (none for float32 or an unrecorded one)."""
    if view.parameter_dtype in ("", "float32") and not view.autocast_dtype:
        return []
    lines = [f"PARAMETER_DTYPE = torch.{view.parameter_dtype}   # the precision the plan was priced in, "
             f"{view.precision_text}: build_pipeline casts the model's parameters to it"]
    if view.autocast_dtype:
        lines.append(f"AUTOCAST_DTYPE = torch.{view.autocast_dtype}   # each stage's forward runs under "
                     "torch.autocast in it (autocast_forwards)")
    if view.master_weights:
        lines.append("MASTER_WEIGHTS = True   # float32 gradients and master weights: make the optimizer over "
                     "master_weights(stages)'s masters, and call copy_masters(pairs) after its step")
    return lines


#: the exported file's ``autocast_forwards`` (an amp plan's step)
AUTOCAST_LINES: tuple[str, ...] = (
    "def autocast_forwards(stage, device):",
    '    """torch.autocast around each of the stage\'s forwards, not its backwards (torch\'s advice), as the capture',
    "    ran it: each micro-batch's forward casts the weights it uses to AUTOCAST_DTYPE and its backward keeps",
    '    those casts; leaving the context after each forward drops autocast\'s cache of them."""',
    "    run = stage.forward_one_chunk",
    "",
    "    def forward_one_chunk(*args, **kwargs):",
    "        with torch.autocast(device_type=torch.device(device).type, dtype=AUTOCAST_DTYPE):",
    "            return run(*args, **kwargs)",
    "",
    "    stage.forward_one_chunk = forward_one_chunk",
    "", "",
)


#: the exported file's ``master_weights`` and ``copy_masters`` (a master-weights plan's step)
MASTER_WEIGHT_LINES: tuple[str, ...] = (
    "def master_weights(stages):",
    '    """(parameter, float32 master) pairs of this rank\'s stages, as the plan priced its step (Megatron\'s',
    "    --bf16): each parameter's float32 gradient, `main_grad`, is its master's `.grad`; every gradient",
    "    autograd writes into the parameter is added into it and dropped at once. Make the optimizer over the",
    '    masters."""',
    "    pairs = []",
    "    for p in {id(p): p for s in stages for p in s.submod.parameters()}.values():",
    "        if not p.requires_grad:",
    "            continue",
    "        master = p.detach().to(torch.float32, copy=True)",
    "        master.grad = p.main_grad = torch.zeros_like(master)",
    "",
    "        def accumulate(param):",
    "            if param.grad is not None:",
    "                param.main_grad.add_(param.grad)",
    "                param.grad = None",
    "",
    "        p.register_post_accumulate_grad_hook(accumulate)",
    "        pairs.append((p, master))",
    "    for stage in stages:",
    "        _fold_weight_gradients(stage)",
    "    return pairs",
    "", "",
    "def _fold_weight_gradients(stage):",
    '    """A split backward (the zero-bubble schedules\' W) writes the weights\' gradients into `.grad` itself, not',
    '    through autograd\'s accumulation, so no hook sees them: each W adds them into `main_grad` as it ends."""',
    "    run = stage.backward_weight_one_chunk",
    "",
    "    def backward_weight_one_chunk(*args, **kwargs):",
    "        result = run(*args, **kwargs)",
    "        for p in stage.submod.parameters():",
    "            if p.grad is not None and hasattr(p, 'main_grad'):",
    "                p.main_grad.add_(p.grad)",
    "                p.grad = None",
    "        return result",
    "",
    "    stage.backward_weight_one_chunk = backward_weight_one_chunk",
    "", "",
    "def copy_masters(pairs):",
    '    """After the optimizer\'s step: each master copied into its parameter, each float32 gradient zeroed in',
    '    place (it stays allocated, as the plan priced it)."""',
    "    with torch.no_grad():",
    "        for p, master in pairs:",
    "            p.copy_(master)",
    "            p.main_grad.zero_()",
    "", "",
)


def render(view: PlanView, options: ExportOptions) -> list[str]:
    p = len(view.stages)
    starts = [s.layers[0] for s in view.stages]
    points = layer_fqns(view, NAME, starts[1:])
    cls = schedule_class(view, options.training)
    multi = cls in MULTI_STAGE
    # a V-shaped placement: two neighbouring stages on one rank
    v_turn = any(a == b for a, b in zip(view.devices, view.devices[1:]))
    m = view.micro_batches
    why = ("the plan was solved without a schedule, one micro-batch in flight: GPipe" if view.schedule == "none"
           else f"as the plan was solved, with {cls}") if options.training else "inference: forward only, GPipe"
    plan_ranks = sorted(set(view.devices))
    stages_of_rank = [[k for k, d in enumerate(view.devices) if d == r] for r in plan_ranks]
    # one stage per rank keeps torch's own one-stage form (stage, stage.is_first); chunked
    # schedules take the list of a rank's stages
    stage = "stages" if multi else "stage"
    model = options.model
    recompute = recompute_map(view) if options.training and view.recomputes else {}
    selective = "selective" in recompute.values()
    # training a model whose layers are the blocks of one stack: stages built from its modules where it is a
    # Hugging Face causal language model (templates/stage_modules.py says why), else traced
    stack = block_stack(view) if options.training else None
    tensor_parallel = _parallel_lines(view, stack) if options.training else []
    precision = precision_lines(view) if options.training else []
    master = options.training and view.master_weights
    grad = "p.main_grad" if master else "p.grad"
    lines = [*(["import functools", "import re", ""] if selective else []),
             "import torch",
             "import torch.distributed as dist",
             *(["from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper"]
               if recompute else []),
             f"from torch.distributed.pipelining import {'PipelineStage, ' if stack else ''}{cls}, SplitPoint, "
             "pipeline",
             *(["from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts"]
               if selective else []), "",
             *([*_stage_modules_source(), "", "",
                "# the model's stack of blocks: the plan's layers are its blocks, in order",
                f"BLOCKS = {py_literal(stack)}",
                f"STAGE_STARTS = {py_literal(starts)}   # each stage's first block"] if stack else []),
             "# each stage after the first begins at one of these modules (fully qualified names)",
             f"SPLIT_POINTS = {py_literal(points)}",
             (f"NUM_STAGES = {p}   # the stages (chunks) in model order" if multi else
              f"NUM_STAGES = {p}   # one process per stage: rank k runs stage k (plan devices "
              + ", ".join(f"{k}->{d}" for k, d in enumerate(view.devices)) + ")"),
             f"STAGES_OF_RANK = {py_literal(stages_of_rank)}   # one process per device: rank r builds these stages",
             f"N_MICROBATCHES = {m}   # micro-batches per step: {why}",
             *([("# the runtime the plan was priced under, which train_step sets: the last stage does not keep the"
                 if not view.return_outputs else
                 "# the runtime the plan was priced under, which train_step sets: the last stage keeps the"),
                f"# micro-batches' outputs (schedule.step(return_outputs={view.return_outputs}))"
                + (", and the gradients stay allocated" if not view.gradients_set_to_none else
                   ", and the gradients are freed"),
                f"# between steps (zero the gradients with zero_grad(set_to_none={view.gradients_set_to_none}))",
                f"RETURN_OUTPUTS = {view.return_outputs}", f"GRADIENTS_SET_TO_NONE = {view.gradients_set_to_none}"]
               if options.training else []),
             *precision, "", "",
             *tensor_parallel,
             *(MASTER_WEIGHT_LINES if master else ()),
             *(AUTOCAST_LINES if options.training and view.autocast_dtype else ()),
             *(_recompute_lines(recompute, stack is not None) if recompute else []),
             *([
                 "def _no_links_to_self(stage):",
                 '    """torch\'s traced stages warm up their links with a send to and a receive from each neighbouring',
                 "    stage, also one on the same rank (the V's turn), which gloo refuses: leave those out (the",
                 '    schedule passes tensors between stages of one rank without communication)."""',
                 "    warm_up = stage._get_init_p2p_neighbors_ops",
                 "    stage._get_init_p2p_neighbors_ops = lambda: [op for op in warm_up() if op.group_peer != stage.group_rank]",
                 "", ""] if multi and v_turn else []),
             "def build_pipeline(model, example_microbatch, device, loss_fn=None, group=None):",
             '    """This rank\'s stage' + ('s' if multi else '') + ' of `model`, its schedule and its tied-parameter groups.',
             "",
             *(["    A Hugging Face causal language model is cut into stages built from its own modules (ModelStage:",
                "    only the hidden state crosses a stage boundary); `loss_fn` None: the model's own loss, with the",
                "    labels as train_step's `targets` (for a causal language model, the token ids themselves), else",
                "    loss_fn(logits, targets). Any other model is traced by pipeline(), and `loss_fn(output, targets)`",
                "    is the loss on the last stage's output.", ""] if stack else []),
             "    `example_microbatch` is ONE micro-batch (the batch's first dimension divided by N_MICROBATCHES),",
             "    not the whole batch: pipeline() traces it, and a whole batch fails at the first step with a shape",
             "    error. Hugging Face models: load them with attn_implementation=\"sdpa\" and use_cache=False.",
             "    Tied parameters (GPT-2's wte and lm_head) become one copy per rank that uses them: call",
             '    sum_tied_gradients(tied) after each backward, or the optimizer step unties them.'
             + ("" if recompute else '"""'),
             *(["    The blocks of RECOMPUTE are checkpointed as the plan chose (apply_recompute), once the tied groups",
                '    are read."""'] if recompute else []),
             "    rank = dist.get_rank(group)",
             "    mine = STAGES_OF_RANK[rank]",
             *(["    model.to(PARAMETER_DTYPE)   # the parameters in the precision the plan was priced in"]
               if precision else [])]
    if stack:
        wrap = ', wrap=lambda i, block: recompute_block(f"{BLOCKS}.{i}", block)' if recompute else ""
        shards = ", sequence_shards=TENSOR_PARALLEL" if tensor_parallel and view.sequence_parallel else ""
        lines += ["    if builds_from_modules(model):",
                  f"        modules = model_stages(model, BLOCKS, STAGE_STARTS, example_microbatch{wrap}{shards})",
                  *(["        shard_stages(modules, mine)"] if tensor_parallel and view.data_parallel > 1 else []),
                  "        stages = [PipelineStage(modules[k], k, NUM_STAGES, device, group=group) for k in mine]",
                  "        loss_fn = stage_loss(modules[-1], loss_fn)",
                  "    else:"]
    indent = "        " if stack else "    "
    lines += [indent + "split_spec = {fqn: SplitPoint.BEGINNING for fqn in SPLIT_POINTS}",
              indent + "pipe = pipeline(model, mb_args=(example_microbatch,), split_spec=split_spec)",
              indent + "contiguous_boundaries(pipe)",
              indent + "relay_skips(pipe)",
              indent + "modules = [pipe.get_stage_module(k) for k in range(NUM_STAGES)]",
              indent + "tie_within_stages(model, modules)",
              indent + "if pipe.num_stages != NUM_STAGES:",
              indent + '    raise ValueError(f"the split gave {pipe.num_stages} stages, the plan has {NUM_STAGES}")',
              indent + "adjacent_only(pipe)",
              indent + "stages = [pipe.build_stage(k, device, group) for k in mine]",
              *([indent + "for stage in stages:", indent + "    _no_links_to_self(stage)"] if multi and v_turn else []),
              *([indent + "for k in mine:", indent + "    apply_recompute(modules[k])"] if recompute else [])]
    if options.training and view.autocast_dtype:
        lines += ["    for stage in stages:", "        autocast_forwards(stage, device)"]
    if not multi:
        lines.append("    stage, = stages")
    if options.training:
        lines += ["    # scale_grads=False: train_step scales each gradient once (two stages on one rank may share a tied tensor)",
                  f"    schedule = {cls}({stage}, n_microbatches=N_MICROBATCHES, loss_fn=loss_fn, scale_grads=False)"]
    else:
        lines.append(f"    schedule = {cls}({stage}, n_microbatches=N_MICROBATCHES)")
    lines += ["    tied = tied_groups(model, modules, mine, group)",
              f"    return {stage}, schedule, tied", "", "",
              *(["def builds_from_modules(model):",
                 '    """Whether `model` is a Hugging Face causal language model whose stages model_stages builds: it has',
                 '    an output embedding and a config, and the module holding BLOCKS takes `inputs_embeds`."""',
                 "    import inspect",
                 '    if not hasattr(model, "get_output_embeddings") or not hasattr(model, "config"):',
                 "        return False",
                 "    try:",
                 '        decoder = model.get_submodule(BLOCKS.rpartition(".")[0])',
                 "    except AttributeError:",
                 "        return False",
                 '    return "inputs_embeds" in inspect.signature(decoder.forward).parameters', "", ""] if stack else []),
              *CONTIGUOUS_BOUNDARIES, "", "",
              *RELAY_SKIPS_SOURCE.rstrip("\n").splitlines(), "", "",
              "def tie_within_stages(model, modules):",
              '    """Make each traced stage hold a tied parameter once. pipeline() can give a stage a copy under each of',
              "    the model's names for it (BERT's first stage: its word embedding and, unused there, the tied head's",
              "    weight), each then with its own gradient and optimizer state; the copies one stage holds are made",
              '    one tensor again, as the model has them (the stages of other ranks keep theirs: sum_tied_gradients)."""',
              "    names = {}",
              "    for name, parameter in model.named_parameters(remove_duplicate=False):",
              "        names.setdefault(id(parameter), []).append(name)",
              "    for module in modules:",
              "        held = dict(module.named_parameters(remove_duplicate=False))",
              "        for group in names.values():",
              "            present = [name for name in group if name in held]",
              "            for name in present[1:]:",
              "                owner, _, attribute = name.rpartition(\".\")",
              "                setattr(module.get_submodule(owner), attribute, held[present[0]])", "", "",
              "def adjacent_only(pipe):",
              '    """torch\'s pipeline runtimes pass tensors from a stage to the next only: refuse, naming the tensor, a',
              "    traced split that sends one further (a skip connection: a traced decoder's rotary tables or mask),",
              '    which torch would refuse in the middle of the first step."""',
              "    graph = pipe.split_gm.graph",
              "    stage_of = {node: k for k, node in enumerate(n for n in graph.nodes if n.op == \"call_module\")}",
              "",
              "    def producer(node):",
              "        while node not in stage_of and node.op == \"call_function\" and node.args:",
              "            node = node.args[0]   # an output of a stage that returns several",
              "        return stage_of.get(node)",
              "",
              "    for node, k in stage_of.items():",
              "        for tensor in node.all_input_nodes:",
              "            j = producer(tensor)",
              "            if j is not None and j != k - 1:",
              "                raise ValueError(f\"the traced split sends {tensor.name!r} from stage {j} to stage {k}: torch's \"",
              "                                 \"pipelines pass tensors only to the next stage; choose split points that no \"",
              "                                 \"tensor skips, or build the stages from the model's modules\")", "", "",
              *(["def tied_groups(model, modules, mine, group=None):",
                 '    """Each parameter the model ties (one tensor under several names, as setup_parallel found them before',
                 "    fully_shard or parallelize_module gave the modules they lay out parameters of their own) that several",
                 "    stages hold: a process group of the ranks of this process's pipeline holding it, and this rank's",
                 '    copies, for sum_tied_gradients. Every process makes every pipeline\'s group, in the same order."""',
                 "    rank_of = {k: r for r, ks in enumerate(STAGES_OF_RANK) for k in ks}",
                 "    holding = [{id(p): p for p in m.parameters()} for m in modules]",
                 "    # one pipeline per (data, tensor) coordinate of the mesh",
                 "    grid = _MESH['mesh'].mesh.reshape(len(STAGES_OF_RANK), -1).T.tolist()",
                 "    tied = []",
                 "    for names in _MESH['tied']:",
                 "        ids = {id(model.get_parameter(name)) for name in names}",
                 "        holders = [k for k in range(NUM_STAGES) if ids & holding[k].keys()]",
                 "        if len(holders) < 2:",
                 "            continue",
                 "        ranks = sorted({rank_of[k] for k in holders})   # a rank may hold several copies",
                 "        copies = list({i: holding[k][i] for k in mine for i in ids & holding[k].keys()}.values())",
                 "        made = [dist.new_group([pipeline[r] for r in ranks]) if len(ranks) > 1 else None for pipeline in grid]",
                 "        tied.append((next(g for g, pipeline in zip(made, grid) if dist.get_rank() in pipeline), copies))",
                 "    return tied", "", ""] if tensor_parallel else
                ["def tied_groups(model, modules, mine, group=None):",
                 '    """Each parameter that several stages hold (one the model ties under several names, GPT-2\'s embedding',
                 "    and head; or one module's that layers on several stages read, DeBERTa's relative position",
                 "    embeddings): a process group of the ranks holding it and this rank's copies, for",
                 '    sum_tied_gradients. Every rank creates every group, in the same order."""',
                 "    rank_of = {k: r for r, ks in enumerate(STAGES_OF_RANK) for k in ks}",
                 "    tied_names = {}",
                 "    for name, parameter in model.named_parameters(remove_duplicate=False):",
                 "        tied_names.setdefault(id(parameter), []).append(name)",
                 "    # per stage: the model's parameter (by id) -> the stage's own tensors for it (a traced stage holds",
                 "    # copies under the model's names, maybe several; a stage built from modules holds the model's own)",
                 "    held = []",
                 "    for m in modules:",
                 "        named = dict(m.named_parameters(remove_duplicate=False))",
                 "        own = {key: [named[n] for n in names if n in named] for key, names in tied_names.items()}",
                 "        for p in m.parameters():",
                 "            own.setdefault(id(p), []).append(p)",
                 "        held.append({key: tensors for key, tensors in own.items() if tensors})",
                 "    tied = []",
                 "    for key in tied_names:",
                 "        holders = [k for k in range(NUM_STAGES) if key in held[k]]",
                 "        if len(holders) < 2:",
                 "            continue",
                 "        ranks = sorted({rank_of[k] for k in holders})   # a rank may hold several copies",
                 "        ranks = ranks if group is None else [dist.get_global_rank(group, r) for r in ranks]",
                 "        copies = list({id(p): p for k in mine for p in held[k].get(key, [])}.values())",
                 "        tied.append((dist.new_group(ranks) if len(ranks) > 1 else None, copies))",
                 "    return tied", "", ""])]
    first, last = (("any(s.is_first for s in stages)", "any(s.is_last for s in stages)") if multi
                   else ("stage.is_first", "stage.is_last"))
    if options.training:
        held = f"{{id(p): p for s in {'stages' if multi else '[stage]'} for p in s.submod.parameters()}}"
        lines += [f"def train_step({stage}, schedule, inputs=None, targets=None):",
                  '    """One forward and backward over a whole batch (N_MICROBATCHES micro-batches), as the plan was',
                  "    priced: the first stage passes `inputs`, the last stage `targets` and gets the micro-batch losses",
                  "    back; the outputs are not kept (RETURN_OUTPUTS). Then call sum_tied_gradients(tied),",
                  *(['    optimizer.step() and copy_masters(pairs)."""'] if master else
                    ['    optimizer.step() and optimizer.zero_grad(set_to_none=GRADIENTS_SET_TO_NONE)."""']),
                  "    losses = []",
                  f"    args = (inputs,) if {first} else ()",
                  f'    kwargs = {{"target": targets, "losses": losses}} if {last} else {{}}',
                  f"    held = {held}",
                  *(["    # the head's logits are split on the vocabulary (TP_PLAN's colwise_loss_parallel): the loss, forward",
                     "    # and backward, runs on the split under torch's loss_parallel, as the plan was captured",
                     "    from torch.distributed.tensor.parallel import loss_parallel",
                     "    with loss_parallel():",
                     "        schedule.step(*args, return_outputs=RETURN_OUTPUTS, **kwargs)"]
                    if view.tensor_parallel > 1 and loss_parallel_of(view.tensor_parallel_styles) else
                    ["    schedule.step(*args, return_outputs=RETURN_OUTPUTS, **kwargs)"]),
                  "    # the mean over the micro-batches of each one's mean loss: each gradient divided once",
                  "    for p in held.values():",
                  *(["        if hasattr(p, 'main_grad'):", f"            {grad}.div_(N_MICROBATCHES)"] if master else
                    [f"        if {grad} is not None:", f"            {grad}.div_(N_MICROBATCHES)"]),
                  *(["    # a module held whole on each tensor-parallel rank but run on its own heads: its parts summed",
                     "    for p in _MESH['summed']:",
                     f"        if id(p) in held and {grad} is not None:",
                     f"            dist.all_reduce({grad}, group=_MESH['mesh']['tp'].get_group())"]
                    if view.tensor_parallel > 1 else []),
                  "    return losses", "", "",
                  "def sum_tied_gradients(tied):",
                  '    """Sum the gradients of each tied parameter\'s per-rank copies, so that they stay equal."""',
                  "    for process_group, copies in tied:",
                  "        if not copies:",
                  "            continue",
                  f"        grads = [{grad} if {grad} is not None else torch.zeros_like(p) for p in copies]",
                  "        # tensor parallelism: a gradient laid out as its parameter is (an embedding's comes whole)",
                  "        grads = [g.redistribute(g.device_mesh, p.placements) if hasattr(p, 'placements') else g",
                  "                 for g, p in zip(grads, copies)]",
                  "        total = sum(grads)",
                  "        if process_group is not None:   # None: every copy is on this rank",
                  "            # a tensor-parallel parameter's gradient is a DTensor: its own shard summed over the pipeline",
                  "            dist.all_reduce(total.to_local() if hasattr(total, 'to_local') else total, group=process_group)",
                  "        for p in copies:",
                  *(["            p.main_grad.copy_(total)"] if master else ["            p.grad = total.clone()"]),
                  "", ""]
    else:
        lines += [f"def run_step({stage}, schedule, inputs=None):",
                  '    """One forward over a whole batch: the first stage passes `inputs`; the last gets the outputs."""',
                  f"    return schedule.step(inputs) if {first} else schedule.step()", "", ""]
    step = (f"losses = train_step({stage}, schedule, inputs, targets); sum_tied_gradients(tied); optimizer.step(); "
            + ("copy_masters(pairs)" if master else "optimizer.zero_grad(set_to_none=GRADIENTS_SET_TO_NONE)")
            if options.training else f"outputs = run_step({stage}, schedule, inputs)")
    procs = len(plan_ranks)
    stages_list = "stages" if multi else "[stage]"
    lines += [f"# on every rank (torchrun --nproc-per-node {procs} ...), with the whole model built on each:",
              f"#   {stage}, schedule, tied = build_pipeline({model}, example_microbatch, device"
              f"{', loss_fn' if options.training else ''})",
              *([f"#   pairs = master_weights({stages_list})",
                 "#   optimizer = torch.optim.AdamW([master for _, master in pairs])"] if master else
                ["#   optimizer = torch.optim.AdamW(list({id(p): p for s in " + stages_list
                 + " for p in s.submod.parameters()}.values()))" if options.training else "#"]),
              f"#   {step}"]
    return lines


def read_back(tree: ast.Module, view: PlanView, options: ExportOptions) -> Decoded:
    data = literal_assignments(tree)
    points, p = data.get("SPLIT_POINTS"), data.get("NUM_STAGES")
    if not isinstance(points, list) or p != len(points) + 1:
        raise RenderCheckError("SPLIT_POINTS and NUM_STAGES disagree")
    of_rank = data.get("STAGES_OF_RANK", [[k] for k in range(p)] if isinstance(p, int) else None)
    if (not isinstance(of_rank, list) or not all(isinstance(ks, list) for ks in of_rank)
            or sorted(k for ks in of_rank for k in ks) != list(range(p))):
        raise RenderCheckError("STAGES_OF_RANK does not place every stage once")
    devices = [0] * p
    for r, ks in enumerate(of_rank):
        for k in ks:
            devices[k] = r
    if data.get("N_MICROBATCHES") != view.micro_batches:
        raise RenderCheckError("N_MICROBATCHES differs from the plan's micro-batches")
    by_fqn = fqn_index(view)
    bounds = [0] + [by_fqn.get(f, -1) for f in points]
    if -1 in bounds:
        raise RenderCheckError("a split point names no single plan layer")
    plan_ranks = sorted(set(view.devices))
    recompute = ["none"] * len(view.layer_names)
    written = data.get("RECOMPUTE", {})
    if not isinstance(written, dict):
        raise RenderCheckError("RECOMPUTE is not a mapping")
    for fqn, mode in written.items():
        layer = by_fqn.get(fqn, -1)
        if layer < 0 or mode not in ("full", "selective"):
            raise RenderCheckError(f"RECOMPUTE names {fqn!r} ({mode!r}), which is no single plan layer's option")
        recompute[layer] = mode
    keeps = _assigned_calls(tree).get("SELECTIVE_KEEPS")
    if ("selective" in written.values()) != (keeps is not None) or keeps not in (None, EXPENSIVE_OPERATIONS.pattern):
        raise RenderCheckError("SELECTIVE_KEEPS differs from the operations the cost model keeps")
    return Decoded(from_starts(bounds, len(view.layer_names)), tuple(plan_ranks[d] for d in devices),
                   tuple(recompute) if options.training else None)


def _assigned_calls(tree: ast.Module) -> dict[str, str]:
    """Module-level ``NAME = re.compile(<literal>)`` assignments: name -> pattern."""
    out = {}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Call) and ast.unparse(node.value.func) == "re.compile"
                and len(node.value.args) == 1):
            out[node.targets[0].id] = ast.literal_eval(node.value.args[0])
    return out
