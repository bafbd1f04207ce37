"""DeepSpeed: a ``PipelineModule`` subclass that sets the plan's stage boundaries.

``PipelineModule`` has no argument for explicit boundaries (DeepSpeed issue 2974), so the
subclass overrides ``_partition_layers``, which ``PipelineModule.__init__`` calls with the
layer list already stored. Each plan layer is one entry of ``layers``; ``FIRST_BLOCK`` is the
entry of the plan's first layer (1 when the embedding is its own entry). A wrong
``FIRST_BLOCK`` would shift every stage by one without an error, so the subclass checks at
construction that the entries standing for the plan's transformer blocks are all of one
class, and says which ``FIRST_BLOCK`` would make them so.

The plan's activation recompute: ``activation_checkpoint_interval=1`` checkpoints every block
one at a time (DeepSpeed's checkpoint keeps a block's input and re-runs its forward before its
backward), with ``checkpointable_layers`` the blocks' class so that the embedding and head
entries run as they are. One interval applies to every stage and every block, and DeepSpeed
has no selective recompute: where the plan recomputes some blocks only, or selectively, a
comment line says so and every block is checkpointed (at least the plan's recompute).

The plan's precision, where its profile records one, as the ds_config keys that run it
(``PRECISION_CONFIG``): ``bf16`` (``fp16``) for low-precision parameters with float32 gradients
and master weights (DeepSpeed's pipeline engine then keeps float32 master weights and accumulates
the gradients in float32; under ZeRO 1 only with ``data_types.grad_accum_dtype`` fp32),
``torch_autocast`` for an autocast capture, none for float32. DeepSpeed's ``bf16`` always keeps
master weights: a plan priced in bfloat16 without them is refused in one line.
"""

from __future__ import annotations

import ast

from ._common import Decoded, ExportOptions, from_starts
from ._plan_view import PlanView
from .render import RenderCheckError, comment, literal_assignments, py_literal

__all__ = ["NAME", "DESCRIPTION", "DEEPSPEED_VERSION", "render", "read_back", "checkpoint_interval", "precision_config"]

NAME = "deepspeed"
DEEPSPEED_VERSION = "0.19"           # PipelineModule API the deepspeed export targets
DESCRIPTION = f"DeepSpeed (>= {DEEPSPEED_VERSION}) PipelineModule with explicit stage boundaries"

def checkpoint_interval(view: PlanView) -> tuple[int, str]:
    """``activation_checkpoint_interval`` for the plan (0: none) and, where it is not the plan's
    choice block by block, one line saying what DeepSpeed cannot take ('' where it is)."""
    blocks = view.decoder_recompute()
    if set(blocks) <= {"none"}:
        return 0, ""
    if set(blocks) == {"full"}:
        return 1, ""
    counts = ", ".join(f"{sum(1 for r in blocks if r == o)} {o}" for o in ("full", "selective", "none") if o in blocks)
    return 1, (f"DeepSpeed checkpoints every block or none, and has no selective recompute: it cannot take the plan's "
               f"per-layer choice ({counts}); every block is checkpointed below, at least the plan's recompute")


#: ds_config's key for low-precision parameters with float32 master weights, per parameter dtype
_PRECISION_KEYS = {"bfloat16": "bf16", "float16": "fp16"}


def precision_config(view: PlanView) -> dict | None:
    """The ds_config keys that run the plan's precision (None: the profile records none); a
    precision DeepSpeed has no mode for is refused."""
    if not view.parameter_dtype:
        return None
    if view.autocast_dtype:
        return {"torch_autocast": {"enabled": True, "dtype": view.autocast_dtype}}
    if view.master_weights:
        config: dict = {_PRECISION_KEYS[view.parameter_dtype]: {"enabled": True}}
        if view.zero == 1 and view.data_parallel > 1:
            config["data_types"] = {"grad_accum_dtype": "fp32"}
        return config
    if view.parameter_dtype != "float32":
        raise view.error(f"deepspeed: the plan was priced in {view.precision_text}, which DeepSpeed has no mode for (its "
                         "bf16 and fp16 keep float32 master weights): capture with `master_weights` to price them, or "
                         "in float32")
    return {}


_CLASS = [
    "def _entry_class(spec):",
    '    """The class an entry of `layers` builds: LayerSpec.typename, else the entry\'s own type."""',
    '    return getattr(spec, "typename", None) or type(spec)',
    "", "",
    "class StagesplitPipelineModule(PipelineModule):",
    '    """PipelineModule with stagesplit\'s stage boundaries: entries before the plan\'s first layer',
    '    join the first stage, entries after its last layer join the last stage."""',
    "",
    "    def _partition_layers(self, method=\"uniform\"):",
    "        n = len(self._layer_specs)",
    "        if self.num_stages != len(BOUNDARIES) - 1 or n < FIRST_BLOCK + BOUNDARIES[-1]:",
    "            raise ValueError(f\"the plan has {len(BOUNDARIES) - 1} stages and {BOUNDARIES[-1]} layers, \"",
    "                             f\"got num_stages={self.num_stages} and {n} layers from FIRST_BLOCK={FIRST_BLOCK}\")",
    "        first, stop = FIRST_BLOCK + BLOCKS[0], FIRST_BLOCK + BLOCKS[1]",
    "        classes = [_entry_class(spec) for spec in self._layer_specs]",
    "        if len(set(classes[first:stop])) > 1:",
    "            fits = [f for f in range(n - BOUNDARIES[-1] + 1)",
    "                    if len(set(classes[f + BLOCKS[0]:f + BLOCKS[1]])) == 1]",
    "            hint = f\"; FIRST_BLOCK = {fits[0]} would make them one\" if fits else \"\"",
    "            raise ValueError(f\"layers[{first}:{stop}] should be the plan's {stop - first} transformer blocks, \"",
    "                             f\"entries of one class, \"",
    "                             f\"but they are {sorted({c.__name__ for c in classes[first:stop]})} with \"",
    "                             f\"FIRST_BLOCK={FIRST_BLOCK}{hint}\")",
    "        if ACTIVATION_CHECKPOINT_INTERVAL and self.checkpointable_layers is None:",
    "            self.checkpointable_layers = [classes[first].__name__]   # the blocks, not the embedding or head",
    "        self.parts = [0] + [FIRST_BLOCK + b for b in BOUNDARIES[1:-1]] + [n]",
    "        stage_id = self._topo.get_coord(self.global_rank).pipe",
    "        self._set_bounds(start=self.parts[stage_id], stop=self.parts[stage_id + 1])",
]


def render(view: PlanView, options: ExportOptions) -> list[str]:
    view.one_stage_per_device(NAME)
    n = len(view.layer_names)
    bounds = [s.layers[0] for s in view.stages] + [n]
    blocks = [int(view.embedding), n - int(view.head)]
    if blocks[1] <= blocks[0]:
        raise view.error("deepspeed: the plan has no transformer block besides its embedding and head")
    roles = []
    if view.embedding:
        roles.append(f"'{comment(view.layer_names[0])}' (the embedding)")
    if view.head:
        roles.append(f"'{comment(view.layer_names[-1])}' (the head)")
    blocks_note = "the plan's layers " + (f"other than {' and '.join(roles)} " if roles else "") + \
        "are transformer blocks: entries of one class in `layers`, checked at construction"
    if view.tensor_parallel > 1:
        raise view.error("deepspeed: PipelineModule has no tensor parallelism of its own (Megatron-DeepSpeed adds "
                         "it); the plan was priced for one of several tensor-parallel ranks: export it for Megatron")
    if view.data_parallel > 1 and view.zero >= 2:
        raise view.error(f"deepspeed refuses ZeRO {view.zero} with pipeline parallelism (its pipeline engine takes ZeRO "
                         "0 or 1); solve with ZeRO 0 or 1 for DeepSpeed")
    zero_stage = view.zero if view.data_parallel > 1 else 0
    precision = precision_config(view)
    interval, cannot = checkpoint_interval(view)
    recompute = ([f"ACTIVATION_CHECKPOINT_INTERVAL = {interval}   # activation_checkpoint_interval: "
                  + ("0, the plan recomputes no block" if not interval else
                     "checkpoint every block, one at a time, as the plan recomputes them"
                     if not cannot else "checkpoint every block, one at a time")]
                 + ([f"# {comment(cannot)}"] if cannot else []))
    usage = (f"# model = StagesplitPipelineModule(layers=layers, num_stages={len(view.stages)}, loss_fn=loss_fn"
             + (", activation_checkpoint_interval=ACTIVATION_CHECKPOINT_INTERVAL)" if interval else ")"))
    return [f"# DeepSpeed >= {DEEPSPEED_VERSION}: PipelineModule has no argument for explicit stage boundaries "
            "(DeepSpeed issue 2974),",
            "# so this subclass sets them where PipelineModule.__init__ partitions its layers.",
            "from deepspeed.pipe import PipelineModule", "",
            f"BOUNDARIES = {py_literal(bounds)}   # the plan-layer index each stage starts at, then the layer count",
            "FIRST_BLOCK = 0   # the index in `layers` of the plan's first layer (1 if the embedding is its own entry)",
            f"BLOCKS = {py_literal(blocks)}   # {blocks_note}",
            f"GRADIENT_ACCUMULATION_STEPS = {view.micro_batches}   # ds_config \"gradient_accumulation_steps\": the "
            "micro-batches of one train_batch(), as the plan was solved",
            f"ZERO_STAGE = {zero_stage}   # ds_config \"zero_optimization\": {{\"stage\": ZERO_STAGE}}, as the plan was "
            f"priced ({view.data_parallel} data-parallel rank{'s' if view.data_parallel != 1 else ''})",
            *_batch_lines(view),
            *([f"PRECISION_CONFIG = {py_literal(precision)}   # merge into ds_config: the keys that run the plan's "
               f"precision, {view.precision_text}" + (" (DeepSpeed's default)" if not precision else "")]
              if precision is not None else []),
            *recompute,
            "", "", *_CLASS, "", "", usage]


def _batch_lines(view: PlanView) -> list[str]:
    """The batch a layout search chose, as ds_config's two batch keys (none where the plan has none)."""
    if view.micro_batch_size is None or view.global_batch is None:
        return []
    return [f"TRAIN_MICRO_BATCH_SIZE_PER_GPU = {view.micro_batch_size}   # ds_config "
            "\"train_micro_batch_size_per_gpu\": samples per micro-batch, as the layout search chose",
            f"TRAIN_BATCH_SIZE = {view.global_batch}   # ds_config \"train_batch_size\": micro-batch size x "
            "GRADIENT_ACCUMULATION_STEPS x data-parallel ranks"]


def read_back(tree: ast.Module, view: PlanView, options: ExportOptions) -> Decoded:
    data = literal_assignments(tree)
    if view.micro_batch_size is not None and (data.get("TRAIN_MICRO_BATCH_SIZE_PER_GPU"), data.get(
            "TRAIN_BATCH_SIZE")) != (view.micro_batch_size, view.global_batch):
        raise RenderCheckError("the batch sizes differ from the plan's")
    bounds, blocks = data.get("BOUNDARIES"), data.get("BLOCKS")
    n = len(view.layer_names)
    if not isinstance(bounds, list) or len(bounds) < 2 or bounds[-1] != n or bounds[0] != 0:
        raise RenderCheckError("BOUNDARIES must run from 0 to the plan's layer count")
    if blocks != [int(view.embedding), n - int(view.head)]:
        raise RenderCheckError("BLOCKS differs from the plan's transformer blocks")
    if data.get("ACTIVATION_CHECKPOINT_INTERVAL") != checkpoint_interval(view)[0]:
        raise RenderCheckError("ACTIVATION_CHECKPOINT_INTERVAL differs from the plan's recompute")
    if data.get("ZERO_STAGE") != (view.zero if view.data_parallel > 1 else 0):
        raise RenderCheckError("ZERO_STAGE differs from the plan's")
    if data.get("PRECISION_CONFIG") != precision_config(view):
        raise RenderCheckError("PRECISION_CONFIG differs from the plan's precision")
    return Decoded(from_starts(bounds[:-1], bounds[-1]))
