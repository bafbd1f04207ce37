"""Plans into training frameworks' own forms: ``export_plan(plan, "poptorch")`` returns a
ready-to-paste snippet (or config) that applies the plan's split in that framework.

Every export starts with a comment header (the profile, its hash, the objective, and each
stage's layers and memory). Before anything is written, the plan is checked (every layer in
exactly one stage, no empty stage, stages in the plan's order), and each format's own
representation of the split is decoded back and compared with the plan: this catches the
silent drop of layers that uneven layouts cause in hand-written configs. A plan a format
cannot express raises a one-line ``StagesplitError``.

Frameworks address layers by module path (``transformer.h.3``); the plan records the paths
the profile's operation names give (see ``layers.module_path``). Where a format needs a path
and the plan has none, the error says so; paths are never guessed.
"""

from __future__ import annotations

import json
import keyword
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from .errors import StagesplitError

if TYPE_CHECKING:                    # the plan module loads the solver; --help must not
    from .plan import Plan

DEEPSPEED_VERSION = "0.19"           # PipelineModule API the deepspeed export targets
DEFAULT_MEMORY_PROPORTION = 0.6      # PopTorch's and optimum-graphcore's default availableMemoryProportion
MEGATRON_VERSION = "0.16"            # megatron-core version whose layout grammar the megatron export targets


@dataclass(frozen=True)
class ExportFormat:
    name: str
    description: str
    needs_module_paths: bool
    render: Callable[["_Context"], tuple[str, list[list[int]]]]
    comment: str = "#"


@dataclass
class _Context:
    plan: Plan
    stages: list[list[int]]          # layer indices of each stage, in the plan's order
    devices: list[int]               # the device of each stage
    training: bool
    model: str                       # the Python name of the user's model in snippets


# -- validation -----------------------------------------------------------------------------------

def plan_stage_layers(plan: Plan) -> list[list[int]]:
    """Each stage's layers as indices into ``plan.layer_names``, after checking that every layer
    is in exactly one stage, no stage is empty, and stages hold consecutive layers in the
    plan's order. Raises a one-line ``StagesplitError`` naming what is wrong."""
    names = plan.layer_names
    if not plan.stages:
        raise StagesplitError("the plan has no stages (no split fitted); nothing to export")
    if len(set(names)) != len(names):
        dup = next(n for i, n in enumerate(names) if n in names[:i])
        raise StagesplitError(f"the plan's layer list names layer '{dup}' twice")
    index = {n: i for i, n in enumerate(names)}
    where: dict[str, list[int]] = {}
    for k, s in enumerate(plan.stages):
        if s.stage != k:
            raise StagesplitError(f"stages[{k}] is numbered {s.stage}: stages must be listed in order 0, 1, 2, ...")
        if not s.layers:
            raise StagesplitError(f"stage {k} holds no layer (an empty stage); remove it or give it layers")
        for name in s.layers:
            if name not in index:
                raise StagesplitError(f"stage {k} holds layer '{name}', which is not in the plan's layer list")
            where.setdefault(name, []).append(k)
    for name, ks in where.items():
        if len(ks) > 1:
            raise StagesplitError(f"layer '{name}' is in more than one stage (stages {', '.join(map(str, ks))})")
    missing = [n for n in names if n not in where]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise StagesplitError(f"layer '{missing[0]}'{more} is in no stage: the plan would drop it")
    stages = []
    expected = 0
    for k, s in enumerate(plan.stages):
        idx = [index[n] for n in s.layers]
        if idx != list(range(expected, expected + len(idx))):
            raise StagesplitError(f"stage {k} holds layers {', '.join(s.layers)}: expected consecutive layers "
                                  f"from '{names[expected]}' in the plan's order")
        if (s.first_layer, s.last_layer) != (idx[0], idx[-1]):
            raise StagesplitError(f"stage {k}: first_layer..last_layer ({s.first_layer}..{s.last_layer}) disagree "
                                  f"with its layers ({idx[0]}..{idx[-1]})")
        stages.append(idx)
        expected += len(idx)
    devices = [s.device for s in plan.stages]
    if devices != sorted(set(devices)):
        raise StagesplitError(f"stage devices {devices} are not increasing: each stage needs its own device, in order")
    return stages


def _check_decoded(fmt: str, plan: Plan, stages: list[list[int]], decoded: list[list[int]]) -> None:
    """The format's own representation, decoded back, must give the plan's stages exactly."""
    if decoded == stages:
        return
    names = plan.layer_names
    for k in range(max(len(decoded), len(stages))):
        got = decoded[k] if k < len(decoded) else []
        want = stages[k] if k < len(stages) else []
        if got != want:
            def show(xs):
                return ", ".join(names[i] for i in xs) if xs else "nothing"
            raise StagesplitError(f"{fmt}: internal check failed: stage {k} would hold {show(got)}, "
                                  f"the plan says {show(want)}")


# -- the header -------------------------------------------------------------------------------------

def _bytes(n: float) -> str:
    if n >= 2**30:
        return f"{n / 2**30:,.2f} GiB"
    return f"{n / 2**20:,.2f} MiB" if n >= 2**20 else f"{int(n):,} bytes"


def header_lines(plan: Plan, fmt: str) -> list[str]:
    """The comment header: the profile, its hash, the objective, each stage's layers and memory."""
    p, i = plan.profile, plan.inputs
    name = p.get("name") or "?"
    source = f" from {p['path']}" if p.get("path") else ""
    lines = [f"stagesplit export --to {fmt}",
             f"profile: {name}{' (synthetic)' if p.get('synthetic') else ''}{source}, target {p.get('target', '?')}",
             f"profile sha256: {p.get('sha256') or 'not recorded'}"]
    objective = i.get("objective", "?")
    schedule = i.get("schedule", "none")
    sched = f", schedule {schedule} with {i.get('micro_batches', 1)} micro-batches" if schedule not in (None, "none") else ""
    head = f", {i['headroom']:.0%} headroom" if i.get("headroom") else ""
    lines.append(f"objective: {objective}{sched}{head}; status: {plan.status}; split: {plan.split_text}")
    paths = plan.module_paths or [None] * len(plan.layer_names)
    tile_note = "" if p.get("tiles") == 1 else " at the worst tile"
    for s in plan.stages:
        first, last = s.first_layer, s.last_layer
        names = " ".join(s.layers) if len(s.layers) <= 8 else f"{s.layers[0]}..{s.layers[-1]} ({len(s.layers)} layers)"
        where = ""
        if 0 <= first < len(paths) and paths[first]:
            where = f" [{paths[first]}{' .. ' + paths[last] if last != first and paths[last] else ''}]"
        share = f" ({s.worst_tile_bytes / s.capacity_bytes:.1%})" if s.capacity_bytes else ""
        flight = f"; {s.in_flight} micro-batches in flight" if s.in_flight > 1 else ""
        lines.append(f"stage {s.stage} on device {s.device}: layer{'s' if len(s.layers) > 1 else ''} {names}{where}; "
                     f"memory {_bytes(s.worst_tile_bytes)} of {_bytes(s.capacity_bytes)}{share}{tile_note}"
                     f"{flight}")
    return lines


# -- module paths -----------------------------------------------------------------------------------

def _paths(ctx: _Context, fmt: str, layers: list[int]) -> list[str]:
    paths = ctx.plan.module_paths or [None] * len(ctx.plan.layer_names)
    missing = [ctx.plan.layer_names[i] for i in layers if paths[i] is None]
    if missing:
        raise StagesplitError(
            f"{fmt} needs the module path of layer '{missing[0]}', but the plan has only its layer name; "
            f"solve again from a profile whose operation names carry module paths (e.g. from stagesplit capture)")
    return [paths[i] for i in layers]


def python_path(root: str, path: str) -> str:
    """``transformer.h.3`` -> ``model.transformer.h[3]``: a module path as a Python expression
    (slashed name scopes are read as dotted module names)."""
    out = root
    for token in re.split(r"[./]", path):
        if token.isdigit():
            out += f"[{token}]"
        elif token.isidentifier() and not keyword.iskeyword(token):
            out += f".{token}"
        else:
            raise StagesplitError(f"module path '{path}': '{token}' is neither an attribute name nor an index")
    return out


def _dotted(path: str) -> str:
    return path.replace("/", ".")


def _literal(value) -> str:
    return json.dumps(value)


# -- formats ----------------------------------------------------------------------------------------

def _accumulation(ctx: _Context) -> int:
    """Gradient accumulation for a pipelined training step: at least 2 x stages, and at least
    the micro-batches the plan was solved for."""
    return max(2 * len(ctx.stages), int(ctx.plan.inputs.get("micro_batches") or 1))


def _memory_proportions(ctx: _Context) -> dict[int, float] | None:
    """Per device, when the plan was solved with a headroom h: the default availableMemoryProportion
    scaled by the share of memory the plan budgets, 0.6 x (1 - h), so that matmul and convolution
    temporaries shrink with the budget instead of eating the headroom."""
    h = float(ctx.plan.inputs.get("headroom") or 0.0)
    if h <= 0:
        return None
    return {d: round(DEFAULT_MEMORY_PROPORTION * (1.0 - h), 2) for d in ctx.devices}


def _render_poptorch(ctx: _Context):
    starts = [layers[0] for layers in ctx.stages]
    paths = _paths(ctx, "poptorch", starts)
    decoded_starts = []
    lines = ["import poptorch", "", "# one BeginBlock per stage start: the stage runs from this module to the next "
             "BeginBlock"]
    for k, (layer, path) in enumerate(zip(starts, paths)):
        expr = python_path(ctx.model, path)
        lines.append(f'{expr} = poptorch.BeginBlock({expr}, "stage{k}", ipu_id={ctx.devices[k]})')
        decoded_starts.append(ctx.plan.module_paths.index(path))
    lines += ["", "opts = poptorch.Options()",
              "opts.setExecutionStrategy(poptorch.PipelinedExecution(poptorch.AutoStage.AutoIncrement))"]
    if ctx.training:
        lines.append(f"opts.Training.gradientAccumulation({_accumulation(ctx)})   # >= 2 x {len(ctx.stages)} stages")
    proportions = _memory_proportions(ctx)
    if proportions:
        lines.append(f"# the plan keeps {ctx.plan.inputs['headroom']:.0%} of every IPU free: matmul/convolution "
                     f"temporaries get {DEFAULT_MEMORY_PROPORTION} x (1 - headroom)")
        lines.append("opts.setAvailableMemoryProportion({" +
                     ", ".join(f'"IPU{d}": {p}' for d, p in proportions.items()) + "})")
    return "\n".join(lines) + "\n", _from_starts(decoded_starts, len(ctx.plan.layer_names))


def _from_starts(starts: list[int], n: int) -> list[list[int]]:
    bounds = list(starts) + [n]
    return [list(range(a, b)) for a, b in zip(bounds, bounds[1:])]


def _render_popart(ctx: _Context):
    names = ctx.plan.layer_names
    stage_of = {names[i]: k for k, layers in enumerate(ctx.stages) for i in layers}
    lines = ["import contextlib", "", "import popart", "",
             "# the pipeline stage of each layer (the plan's layer names)",
             "STAGE_OF_LAYER = {" + ", ".join(f"{_literal(n)}: {k}" for n, k in stage_of.items()) + "}",
             f"DEVICE_OF_STAGE = {ctx.devices}", "",
             "",
             "def stage_scope(builder, layer):",
             '    """Build layer `layer` inside `with stage_scope(builder, layer):` to place its ops."""',
             "    stage = STAGE_OF_LAYER[layer]",
             "    scope = contextlib.ExitStack()",
             "    scope.enter_context(builder.virtualGraph(DEVICE_OF_STAGE[stage]))",
             "    scope.enter_context(builder.pipelineStage(stage))",
             "    return scope", "", "",
             "opts = popart.SessionOptions()",
             "opts.virtualGraphMode = popart.VirtualGraphMode.Manual",
             "opts.enablePipelining = True"]
    if ctx.training:
        lines += ["opts.enableGradientAccumulation = True",
                  f"opts.accumulationFactor = {_accumulation(ctx)}   # >= 2 x {len(ctx.stages)} stages"]
    decoded = [[i for i, n in enumerate(names) if stage_of[n] == k] for k in range(len(ctx.stages))]
    return "\n".join(lines) + "\n", decoded


def _layer_group_names(ctx: _Context) -> list[list[str]]:
    return [[ctx.plan.layer_names[i] for i in layers] for layers in ctx.stages]


def _render_tf_ipu(ctx: _Context):
    groups = _layer_group_names(ctx)
    lines = ["from tensorflow.python import ipu", "",
             "# the layers of each pipeline stage, in order (the plan's layer names)",
             "STAGE_LAYERS = " + _literal(groups),
             f"device_mapping = {ctx.devices}", "", "",
             "def _stage(layers):",
             '    """A computational stage running `layers` in order; run_layer(name, *args) is yours:',
             '    it builds layer `name` (e.g. under tf.name_scope) and returns its outputs."""',
             "    def stage(*args):",
             "        for name in layers:",
             "            args = run_layer(name, *args)",
             "            args = args if isinstance(args, tuple) else (args,)",
             "        return args if len(args) > 1 else args[0]",
             "    return stage", "", "",
             "computational_stages = [_stage(layers) for layers in STAGE_LAYERS]", "", "",
             "def build_pipeline(**kwargs):",
             '    """ipu.pipelining_ops.pipeline with the plan\'s stages; pass inputs, infeed_queue, ... as usual."""',
             "    return ipu.pipelining_ops.pipeline(computational_stages=computational_stages,",
             "                                       device_mapping=device_mapping,"]
    if ctx.training:
        lines.append(f"                                       gradient_accumulation_count={_accumulation(ctx)},")
    lines.append("                                       **kwargs)")
    index = {n: i for i, n in enumerate(ctx.plan.layer_names)}
    return "\n".join(lines) + "\n", [[index[n] for n in g] for g in groups]


def _render_optimum(ctx: _Context):
    counts = [len(layers) for layers in ctx.stages]
    lines = ["from optimum.graphcore import IPUConfig", "",
             "# layers_per_ipu counts the model's transformer layers per IPU: the embeddings run on the first "
             "and the head on the last",
             "ipu_config = IPUConfig(",
             f"    ipus_per_replica={len(ctx.stages)},",
             f"    layers_per_ipu={counts},"]
    proportions = _memory_proportions(ctx)
    if proportions:
        lines.append(f"    matmul_proportion={list(proportions.values())},   # {DEFAULT_MEMORY_PROPORTION} x (1 - the plan's "
                     f"headroom {ctx.plan.inputs['headroom']:.0%})")
    if ctx.training:
        lines.append(f"    gradient_accumulation_steps={_accumulation(ctx)},")
    lines.append(")")
    return "\n".join(lines) + "\n", _from_counts(counts)


def _from_counts(counts: list[int]) -> list[list[int]]:
    out, start = [], 0
    for c in counts:
        out.append(list(range(start, start + c)))
        start += c
    return out


def _render_torch(ctx: _Context):
    starts = [layers[0] for layers in ctx.stages[1:]]
    paths = [_dotted(p) for p in _paths(ctx, "torch-pipelining", starts)]
    spec = ", ".join(f'"{p}": SplitPoint.BEGINNING' for p in paths)
    lines = ["from torch.distributed.pipelining import SplitPoint, pipeline", "",
             "# each stage after the first begins at one of these modules (fully qualified names)",
             "split_spec = {" + spec + "}",
             f"pipe = pipeline({ctx.model}, mb_args=(example_input,), split_spec=split_spec)",
             f"# pipe.num_stages == {len(ctx.stages)}; stage k runs on rank k: "
             "pipe.build_stage(rank, device), devices " + ", ".join(f"{k}->{d}" for k, d in enumerate(ctx.devices))]
    dotted = [_dotted(p) if p else None for p in ctx.plan.module_paths]
    decoded = _from_starts([0] + [dotted.index(p) for p in paths], len(ctx.plan.layer_names))
    return "\n".join(lines) + "\n", decoded


def _render_deepspeed(ctx: _Context):
    bounds = [layers[0] for layers in ctx.stages] + [len(ctx.plan.layer_names)]
    lines = [f"# DeepSpeed >= {DEEPSPEED_VERSION}: PipelineModule has no argument for explicit stage boundaries "
             "(DeepSpeed issue 2974),",
             "# so this subclass sets them where PipelineModule.__init__ partitions its layers.",
             "from deepspeed.pipe import PipelineModule", "",
             f"BOUNDARIES = {bounds}   # the plan-layer index each stage starts at, then the layer count",
             "FIRST_BLOCK = 0   # the index in `layers` of the plan's first layer (1 if the embedding is its own entry)",
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
             "        self.parts = [0] + [FIRST_BLOCK + b for b in BOUNDARIES[1:-1]] + [n]",
             "        stage_id = self._topo.get_coord(self.global_rank).pipe",
             "        self._set_bounds(start=self.parts[stage_id], stop=self.parts[stage_id + 1])",
             "", "",
             f"# model = StagesplitPipelineModule(layers=layers, num_stages={len(ctx.stages)}, loss_fn=loss_fn)"]
    return "\n".join(lines) + "\n", _from_starts(bounds[:-1], bounds[-1])


def megatron_layout(counts: list[int]) -> str:
    """``--pipeline-model-parallel-layout`` for decoder-layer counts per stage: the embedding
    (E) starts the first stage, the loss (L) ends the last, stages are separated by ``|``."""
    parts = []
    for k, c in enumerate(counts):
        body = "" if c == 0 else ("t" if c == 1 else f"t*{c}")
        parts.append(("E" if k == 0 else "") + body + ("L" if k == len(counts) - 1 else ""))
    return "|".join(parts)


def parse_megatron_layout(text: str) -> list[list[str]]:
    """The layout grammar as Megatron documents it: ``(x)*n`` and ``x*n`` repeat, ``,`` is
    cosmetic, ``|`` separates stages; layer letters E, t, m, L."""
    text = text.replace(",", "")
    text = re.sub(r"\(([^()]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    text = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    stages = [list(s) for s in text.split("|")]
    bad = {c for s in stages for c in s} - set("EtmL")
    if bad:
        raise ValueError(f"unknown layer letters {sorted(bad)} in layout {text!r}")
    return stages


def megatron_uneven(counts: list[int]) -> tuple[int | None, int | None] | str:
    """(first, last) for ``--decoder-first/last-pipeline-num-layers``, or why they cannot express
    ``counts``: every middle stage must hold the same number of layers."""
    p = len(counts)
    if p == 1:
        return "one stage needs no pipeline split"
    middle = counts[1:-1]
    if len(set(middle)) > 1:
        return (f"Megatron's --decoder-first/last-pipeline-num-layers need equal decoder layers in every stage but "
                f"the first and last; this plan's middle stages hold {', '.join(map(str, middle))}")
    if not middle:
        return counts[0], counts[-1]
    m = middle[0]
    return (None if counts[0] == m else counts[0]), (None if counts[-1] == m else counts[-1])


def _megatron_roles(ctx: _Context) -> tuple[list[int], bool, bool, str]:
    """Decoder layers per stage, whether the plan's first layer is the embedding and its last the
    head/loss (their names match the plan's first-/last-layer regex, e.g. ``embed_tokens`` and
    ``lm_head`` in a per-layer profile), and a comment saying how the layers were read."""
    from .layers import DEFAULT_FIRST_LAYER_REGEX, DEFAULT_LAST_LAYER_REGEX, LayerOptions
    names = ctx.plan.layer_names
    grouping = ctx.plan.inputs.get("layer_grouping") or {}
    options = LayerOptions(first_layer_regex=grouping.get("first_layer_regex") or DEFAULT_FIRST_LAYER_REGEX,
                           last_layer_regex=grouping.get("last_layer_regex") or DEFAULT_LAST_LAYER_REGEX)
    _, first_re, last_re, _ = options.compiled()      # the plan's patterns, compiled as layer grouping does
    embedding = len(names) > 1 and bool(first_re.search(names[0]))
    head = len(names) > 1 and bool(last_re.search(names[-1]))
    counts = [len(layers) for layers in ctx.stages]
    counts[0] -= embedding
    counts[-1] -= head
    roles = []
    if embedding:
        roles.append(f"the plan's layer '{names[0]}' is the embedding (E)")
    if head:
        roles.append(f"'{names[-1]}' is the output layer and loss (L)")
    note = "; ".join(roles) + "; every other plan layer is one decoder layer (t)" if roles else \
        "every plan layer is one decoder layer (t); the embedding (E) runs on the first stage and the loss (L) on the last"
    return counts, embedding, head, note


def _render_megatron(ctx: _Context):
    counts, embedding, head, note = _megatron_roles(ctx)
    layout = megatron_layout(counts)
    p = len(counts)
    lines = [f"# megatron-core >= {MEGATRON_VERSION} (Megatron-LM's pretrain_*.py arguments):",
             f"# {note}",
             f"--num-layers {sum(counts)} --pipeline-model-parallel-size {p} "
             f"--pipeline-model-parallel-layout \"{layout}\""]
    uneven = megatron_uneven(counts)
    if isinstance(uneven, tuple):
        even = " (an even split: no first/last flags)" if uneven == (None, None) else ""
        lines.append(f"# the same split for Megatron versions without --pipeline-model-parallel-layout{even}:")
        lines.append("# " + _uneven_flags(counts, uneven))
    else:
        lines.append(f"# (not expressible without the layout flag: {uneven})")
    decoded_counts = [s.count("t") for s in parse_megatron_layout(layout)]
    decoded_counts[0] += embedding
    decoded_counts[-1] += head
    return "\n".join(lines) + "\n", _from_counts(decoded_counts)


def _uneven_flags(counts: list[int], uneven: tuple[int | None, int | None]) -> str:
    first, last = uneven
    flags = f"--num-layers {sum(counts)} --pipeline-model-parallel-size {len(counts)}"
    if first is not None:
        flags += f" --decoder-first-pipeline-num-layers {first}"
    if last is not None:
        flags += f" --decoder-last-pipeline-num-layers {last}"
    return flags


def uneven_counts(n: int, p: int, first: int | None, last: int | None) -> list[int]:
    """Decoder layers per stage as Megatron derives them from the first/last flags."""
    rest, left = n, p
    if first is not None:
        rest, left = rest - first, left - 1
    if last is not None:
        rest, left = rest - last, left - 1
    each = rest // left if left > 0 else 0
    counts = [each] * p
    if first is not None:
        counts[0] = first
    if last is not None:
        counts[-1] = last
    return counts


def _render_megatron_uneven(ctx: _Context):
    counts, embedding, head, note = _megatron_roles(ctx)
    uneven = megatron_uneven(counts)
    if isinstance(uneven, str):
        raise StagesplitError(f"megatron-uneven cannot express this plan: {uneven}; use --to megatron (the layout flag)")
    lines = ["# megatron-core (Megatron-LM's pretrain_*.py arguments), for versions without "
             "--pipeline-model-parallel-layout:",
             f"# {note}",
             _uneven_flags(counts, uneven)]
    decoded_counts = uneven_counts(sum(counts), len(counts), *uneven)
    decoded_counts[0] += embedding
    decoded_counts[-1] += head
    return "\n".join(lines) + "\n", _from_counts(decoded_counts)


def _render_json(ctx: _Context):
    plan = ctx.plan
    paths = plan.module_paths or [None] * len(plan.layer_names)
    doc = {"format": "stagesplit-export", "header": header_lines(plan, "json"),
           "profile": plan.profile.get("name"), "sha256": plan.profile.get("sha256"),
           "objective": plan.inputs.get("objective"),
           "stages": [{"stage": k, "device": ctx.devices[k], "layers": [plan.layer_names[i] for i in layers],
                       "module_paths": [paths[i] for i in layers],
                       "worst_tile_bytes": plan.stages[k].worst_tile_bytes,
                       "capacity_bytes": plan.stages[k].capacity_bytes}
                      for k, layers in enumerate(ctx.stages)]}
    index = {n: i for i, n in enumerate(plan.layer_names)}
    decoded = [[index[n] for n in s["layers"]] for s in doc["stages"]]
    return _json_text(doc), decoded


def _json_text(doc: dict) -> str:
    """JSON with one line per header line and per stage (diff- and eye-friendly)."""
    parts = []
    for key, value in doc.items():
        if isinstance(value, list) and value:
            items = ",\n".join(f"  {json.dumps(v)}" for v in value)
            parts.append(f" {json.dumps(key)}: [\n{items}\n ]")
        else:
            parts.append(f" {json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


FORMATS: dict[str, ExportFormat] = {f.name: f for f in (
    ExportFormat("poptorch", "poptorch.BeginBlock per stage start and pipelined poptorch.Options", True,
                 _render_poptorch),
    ExportFormat("popart", "builder.virtualGraph / builder.pipelineStage per layer, pipelined SessionOptions", False,
                 _render_popart),
    ExportFormat("tf-ipu", "TensorFlow IPU pipeline: computational_stages (layer groups) and device_mapping", False,
                 _render_tf_ipu),
    ExportFormat("optimum-ipu", "optimum-graphcore IPUConfig: layers_per_ipu, ipus_per_replica, matmul_proportion",
                 False, _render_optimum),
    ExportFormat("torch-pipelining", "torch.distributed.pipelining split_spec and pipeline() call", True,
                 _render_torch),
    ExportFormat("deepspeed", f"DeepSpeed (>= {DEEPSPEED_VERSION}) PipelineModule with explicit stage boundaries",
                 False, _render_deepspeed),
    ExportFormat("megatron", "Megatron --pipeline-model-parallel-layout (and the first/last form where it fits)",
                 False, _render_megatron),
    ExportFormat("megatron-uneven", "Megatron --decoder-first/last-pipeline-num-layers only (exit 2 if it cannot "
                 "express the split)", False, _render_megatron_uneven),
    ExportFormat("json", "plain stage -> layer-name lists (with module paths and memory)", False, _render_json,
                 comment=""),
)}


def export_plan(plan: Plan, fmt: str, *, training: bool = True, model: str = "model") -> str:
    """The plan's split as ``fmt`` (a key of ``FORMATS``): a snippet or config with a comment
    header. Raises ``StagesplitError`` (one line) when the plan is malformed or the format
    cannot express it."""
    if fmt not in FORMATS:
        raise StagesplitError(f"unknown export format '{fmt}': expected one of {', '.join(FORMATS)}")
    if not model.isidentifier():
        raise StagesplitError(f"--model: expected a Python name, got '{model}'")
    if plan.module_paths and len(plan.module_paths) != len(plan.layer_names):
        raise StagesplitError(f"the plan has {len(plan.module_paths)} module paths for {len(plan.layer_names)} layers")
    stages = plan_stage_layers(plan)
    spec = FORMATS[fmt]
    ctx = _Context(plan=plan, stages=stages, devices=[s.device for s in plan.stages], training=training, model=model)
    body, decoded = spec.render(ctx)
    _check_decoded(fmt, plan, stages, decoded)
    if not spec.comment:
        return body
    head = "\n".join(f"{spec.comment} {line}" for line in header_lines(plan, fmt))
    return head + "\n\n" + body
