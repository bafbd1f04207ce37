"""DeepSpeed: a ``PipelineModule`` subclass that sets the plan's stage boundaries.

``PipelineModule`` has no argument for explicit boundaries (DeepSpeed issue 2974), so the
subclass overrides ``_partition_layers``, which ``PipelineModule.__init__`` calls with the
layer list already stored. Each plan layer is one entry of ``layers``; ``FIRST_BLOCK`` is the
entry of the plan's first layer (1 when the embedding is its own entry). A wrong
``FIRST_BLOCK`` would shift every stage by one without an error, so the subclass checks at
construction that the entries standing for the plan's transformer blocks are all of one
class, and says which ``FIRST_BLOCK`` would make them so.
"""

from __future__ import annotations

import ast

from ._common import Decoded, ExportOptions, from_starts
from ._plan_view import PlanView
from .render import RenderCheckError, comment, literal_assignments, py_literal

__all__ = ["NAME", "DESCRIPTION", "DEEPSPEED_VERSION", "render", "read_back"]

NAME = "deepspeed"
DEEPSPEED_VERSION = "0.19"           # PipelineModule API the deepspeed export targets
DESCRIPTION = f"DeepSpeed (>= {DEEPSPEED_VERSION}) PipelineModule with explicit stage boundaries"

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
    return [f"# DeepSpeed >= {DEEPSPEED_VERSION}: PipelineModule has no argument for explicit stage boundaries "
            "(DeepSpeed issue 2974),",
            "# so this subclass sets them where PipelineModule.__init__ partitions its layers.",
            "from deepspeed.pipe import PipelineModule", "",
            f"BOUNDARIES = {py_literal(bounds)}   # the plan-layer index each stage starts at, then the layer count",
            "FIRST_BLOCK = 0   # the index in `layers` of the plan's first layer (1 if the embedding is its own entry)",
            f"BLOCKS = {py_literal(blocks)}   # {blocks_note}",
            f"GRADIENT_ACCUMULATION_STEPS = {view.micro_batches}   # ds_config \"gradient_accumulation_steps\": the "
            "micro-batches of one train_batch(), as the plan was solved",
            "", "", *_CLASS, "", "",
            f"# model = StagesplitPipelineModule(layers=layers, num_stages={len(view.stages)}, loss_fn=loss_fn)"]


def read_back(tree: ast.Module, view: PlanView, options: ExportOptions) -> Decoded:
    data = literal_assignments(tree)
    bounds, blocks = data.get("BOUNDARIES"), data.get("BLOCKS")
    n = len(view.layer_names)
    if not isinstance(bounds, list) or len(bounds) < 2 or bounds[-1] != n or bounds[0] != 0:
        raise RenderCheckError("BOUNDARIES must run from 0 to the plan's layer count")
    if blocks != [int(view.embedding), n - int(view.head)]:
        raise RenderCheckError("BLOCKS differs from the plan's transformer blocks")
    return Decoded(from_starts(bounds[:-1], bounds[-1]))
