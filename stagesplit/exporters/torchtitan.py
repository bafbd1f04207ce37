"""torchtitan 0.3: command-line overrides its ``ConfigManager`` parses (tyro), as an argument
file to append after the trainer's own module and config arguments.

- ``--parallelism.pipeline_parallel_degree P`` and ``--parallelism.pipeline_parallel_schedule``
  (``GPipe``/``1F1B``: single-stage-per-rank schedules, one plan stage per rank);
- ``--parallelism.module_fqns_per_model_part``: one comma-joined group per stage, torchtitan's
  own module names (``tok_embeddings`` first, ``layers.K`` for decoder layer K, ``norm`` and
  ``lm_head`` last; as ``_generate_llm_fqn_per_model_part`` writes them);
- ``--training.local_batch_size M --parallelism.pipeline_parallel_microbatch_size 1``: torchtitan
  runs local_batch_size / microbatch_size micro-batches, M as the plan was solved;
- ``--training.disable_cuda_graphs``: ``Trainer.Config`` refuses CUDA graphs with pipelining.

- ``activation-checkpoint:full`` / ``activation-checkpoint:selective`` (a tyro subcommand, so the
  last word: torchtitan's parser takes no flag of the trainer after it) where the plan
  recomputes: torchtitan applies one mode to every transformer block (``layers.K``). Where the
  plan's choice differs between blocks, the export says so in one line and writes ``full`` (every
  block recomputes at least what the plan recomputes: slower than the plan, not larger), or
  ``selective`` where no block is recomputed fully. torchtitan's selective policy keeps the
  outputs of its compute-intensive operations but re-runs every second matrix product: it keeps
  less than the plan counted. Without recompute in the plan the word is not written: torchtitan's
  default (``selective``) then applies, which one comment line says.

The plan's precision, where its profile records one (``precision_words``): float32 as
``--training.dtype float32 --training.mixed_precision_param float32`` (torchtitan's default
casts the parameters to bfloat16 under FSDP2); bfloat16 parameters, gradients and optimizer state
as ``--training.dtype bfloat16``; bfloat16 compute on float32 weights (master weights, or
autocast) as FSDP2's mixed precision, ``--training.mixed_precision_param bfloat16
--training.mixed_precision_reduce float32``, the only way torchtitan runs it beside a pipeline (a
master-weights plan under ZeRO 3 is priced as it: model/datasharding.py):
without FSDP2 it trains such a plan in float32, so that is refused in one line, as float16 is.

torchtitan refuses pipeline parallelism for models with tied weights (``enable_weight_tying``:
"Weight tying is not supported with Pipeline Parallel."); so does this export when it is told
of tied parameters.
"""

from __future__ import annotations

from ..common.text import show
from ._common import Decoded, ExportOptions, from_counts
from ._plan_view import PlanView
from .render import RenderCheckError, comment, shell_word
from .torch_pipelining import schedule_class

__all__ = ["NAME", "DESCRIPTION", "TORCHTITAN_VERSION", "SCHEDULES", "render", "read_back", "module_groups", "layout_words",
           "activation_checkpoint"]

NAME = "torchtitan"
TORCHTITAN_VERSION = "0.3"
DESCRIPTION = f"torchtitan (>= {TORCHTITAN_VERSION}) command-line overrides: pipeline degree, schedule, module FQNs"
#: torch's schedule class -> torchtitan's --parallelism.pipeline_parallel_schedule name (torch's
#: get_schedule_class names, which torchtitan passes through)
SCHEDULES = {"ScheduleGPipe": "GPipe", "Schedule1F1B": "1F1B", "ScheduleInterleaved1F1B": "Interleaved1F1B",
             "ScheduleLoopedBFS": "LoopedBFS", "ScheduleInterleavedZeroBubble": "InterleavedZeroBubble",
             "ScheduleZBVZeroBubble": "ZBVZeroBubble", "ScheduleDualPipeV": "DualPipeV"}
EMBEDDING_FQN = "tok_embeddings"
HEAD_FQNS = ("norm", "lm_head")
#: torchtitan's activation checkpointing subcommand (``Trainer.Config.activation_checkpoint``)
AC_SUBCOMMAND = "activation-checkpoint"
#: torchtitan's precision flags (``Trainer.Config.training``)
DTYPE, MIXED_PARAM, MIXED_REDUCE = "--training.dtype", "--training.mixed_precision_param", \
    "--training.mixed_precision_reduce"
#: torchtitan's batch flags: samples per data-parallel rank and step, and per step in all
LOCAL_BATCH = "--training.local_batch_size"
GLOBAL_BATCH = "--training.global_batch_size"


def activation_checkpoint(view: PlanView) -> tuple[str | None, str]:
    """The mode torchtitan gets for the plan's recompute ("full", "selective", None: the plan
    recomputes nothing) and, where that is not the plan's choice block by block, why."""
    blocks = view.decoder_recompute()
    chosen = set(blocks) - {"none"}
    if not chosen:
        return None, ""
    mode = "full" if "full" in chosen else "selective"
    counts = ", ".join(f"{sum(1 for r in blocks if r == o)} {o}" for o in ("full", "selective", "none")
                       if o in blocks)
    if set(blocks) == {mode}:
        return mode, ""
    return mode, (f"torchtitan applies one activation checkpointing mode to every block and cannot take the plan's "
                  f"per-layer choice ({counts}): {mode} on every block below, slower than the plan, not larger")


def module_groups(view: PlanView) -> list[list[str]]:
    """Each stage's torchtitan module FQNs: decoder layer K (counting from the first plan layer
    that is not the embedding) is ``layers.K``; the embedding joins the first group and the
    final norm and head the last."""
    groups, k = [], 0
    for counts_index, count in enumerate(view.decoder_counts()):
        group = [f"layers.{k + j}" for j in range(count)]
        k += count
        if counts_index == 0:
            group.insert(0, EMBEDDING_FQN)
        if counts_index == len(view.stages) - 1:
            group += HEAD_FQNS
        groups.append(group)
    return groups


#: the flags ``layout_words`` writes (their last dotted part)
_LAYOUT_FIELDS = ("tensor_parallel_degree", "no-enable-sequence-parallel", "data_parallel_shard_degree",
                  "fsdp_reshard_after_forward", "data_parallel_replicate_degree", "context_parallel_degree",
                  "expert_parallel_degree")


def layout_words(view: PlanView) -> list[str]:
    """The degrees beside the pipeline the plan was priced under: tensor parallelism (with or without
    sequence parallelism: torchtitan's default is with), and data parallelism as FSDP2 shards (ZeRO 3,
    with the plan's resharding after forward) or DDP replicas (ZeRO 0); none for a pipeline alone. With
    context parallelism, ``context_parallel_degree``: torchtitan shards with FSDP2 over the data x
    context-parallel ranks (``dp_shard x cp``), the plan's data-parallel ranks, so the shard degree is
    those over the context-parallel ones."""
    words: list[str] = []
    if view.tensor_parallel > 1:
        words += ["--parallelism.tensor_parallel_degree", str(view.tensor_parallel)]
        if not view.sequence_parallel:
            words += ["--parallelism.no-enable-sequence-parallel"]
    if view.context_parallel > 1:
        words += ["--parallelism.context_parallel_degree", str(view.context_parallel),
                  "--parallelism.data_parallel_shard_degree", str(view.data_parallel // view.context_parallel),
                  "--parallelism.fsdp_reshard_after_forward", "always" if view.reshard_after_forward else "never"]
    elif view.data_parallel > 1:
        if view.zero == 3:
            words += ["--parallelism.data_parallel_shard_degree", str(view.data_parallel),
                      "--parallelism.fsdp_reshard_after_forward", "always" if view.reshard_after_forward else "never"]
        else:
            words += ["--parallelism.data_parallel_replicate_degree", str(view.data_parallel),
                      "--parallelism.data_parallel_shard_degree", "1"]
    if view.expert_parallel > 1:              # borrowed from dp_shard x cp x tp: torchtitan's own rule
        words += ["--parallelism.expert_parallel_degree", str(view.expert_parallel)]
    return words


def _fsdp(view: PlanView) -> bool:
    """Whether torchtitan shards the plan's parameters with FSDP2 (which is what applies its mixed precision)."""
    return view.context_parallel > 1 or (view.data_parallel > 1 and view.zero == 3)


def precision_words(view: PlanView) -> tuple[list[str], str]:
    """The flags that run the plan's precision (none where its profile records none) and, where
    torchtitan runs it with other memory than priced, one line saying how; a precision torchtitan
    cannot run beside a pipeline is refused."""
    if not view.parameter_dtype:
        return [], ""
    if view.parameter_dtype == "float16" or view.autocast_dtype == "float16":
        raise view.error(f"torchtitan trains in bfloat16 or float32, and the plan was priced in {view.precision_text}: "
                         "capture it in bfloat16 or float32 for torchtitan")
    if not view.master_weights and not view.autocast_dtype:
        if view.parameter_dtype == "bfloat16":
            return [DTYPE, "bfloat16"], ""
        return [DTYPE, "float32", MIXED_PARAM, "float32"], ""
    if not _fsdp(view):
        raise view.error(f"torchtitan applies mixed precision through FSDP2 only beside a pipeline (its autocast runs "
                         f"without other parallelism), and the plan was priced in {view.precision_text} without FSDP2: "
                         "it would train in float32. Solve it with ZeRO 3 for torchtitan, or capture in bfloat16 "
                         "(torchtitan's --training.dtype bfloat16) or float32")
    # a master-weights plan under ZeRO 3 was priced as FSDP2's mixed precision (model/datasharding.py)
    note = ("" if view.master_weights else
            "FSDP2 gathers each layer's parameters in bfloat16 for its compute and frees them after it: the plan "
            "counted autocast's bfloat16 weight copies kept for the backward, more than runs")
    return [DTYPE, "float32", MIXED_PARAM, "bfloat16", MIXED_REDUCE, "float32"], note


def _words(view: PlanView, options: ExportOptions) -> list[str]:
    schedule = SCHEDULES[schedule_class(view, True, NAME)]
    mode, _ = activation_checkpoint(view)
    return [*layout_words(view), *precision_words(view)[0], "--parallelism.pipeline_parallel_degree", str(view.ranks),
            "--parallelism.pipeline_parallel_schedule", schedule,
            "--parallelism.module_fqns_per_model_part", *(",".join(g) for g in module_groups(view)),
            "--parallelism.pipeline_parallel_microbatch_size", str(view.samples_per_micro_batch),
            LOCAL_BATCH, str(view.samples_per_micro_batch * view.micro_batches),
            *([GLOBAL_BATCH, str(view.global_batch)] if view.global_batch is not None else []),
            "--training.disable_cuda_graphs", *([f"{AC_SUBCOMMAND}:{mode}"] if mode else [])]


def render(view: PlanView, options: ExportOptions) -> list[str]:
    if view.ranks < 2:
        raise view.error("torchtitan: one stage needs no pipeline parallelism")
    if options.tied:
        raise view.error(f"torchtitan refuses pipeline parallelism for models with tied weights (\"Weight tying is "
                         f"not supported with Pipeline Parallel\"), and this model ties "
                         f"'{show(options.tied[0].parameter)}' across stages "
                         f"{', '.join(map(str, options.tied[0].stages))}; untie it or do not pipeline")
    if sum(view.decoder_counts()) < 1:
        raise view.error("torchtitan: the plan has no decoder layer besides the embedding and the head")
    if view.expert_parallel > 1 and view.zero != 3:
        raise view.error(f"torchtitan takes its expert-parallel ranks from its FSDP2 shards (dp_shard x cp x tp); "
                         f"the plan was priced under ZeRO {view.zero}: export it to Megatron, or price it under ZeRO 3")
    if view.context_parallel > 1 and view.zero != 3:
        raise view.error(f"torchtitan shards the parameters over the context-parallel ranks (FSDP2 over data x "
                         f"context parallel); the plan was priced under ZeRO {view.zero}: solve it with ZeRO 3 for "
                         "torchtitan")
    if view.data_parallel > 1 and view.zero in (1, 2):
        raise view.error(f"torchtitan shards data parallelism with FSDP2 (ZeRO 3) or replicates it (DDP, ZeRO 0); "
                         f"the plan was priced under ZeRO {view.zero}: solve it with ZeRO 3 or 0 for torchtitan")
    roles = []
    if view.embedding:
        roles.append(f"'{comment(view.layer_names[0])}' is tok_embeddings")
    if view.head:
        roles.append(f"'{comment(view.layer_names[-1])}' is norm and lm_head")
    note = ("the plan's " + "; ".join(roles) + "; " if roles else
            "tok_embeddings joins the first stage and norm, lm_head the last; ") + \
        "the other plan layers are torchtitan's layers.0, layers.1, ... in order"
    _, precision = precision_words(view)
    mode, cannot = activation_checkpoint(view)
    if mode is None:
        checkpointing = ("# the plan recomputes no activation; torchtitan's default activation checkpointing is "
                         f"selective: append {AC_SUBCOMMAND}:none (as the last word) to run as planned")
    elif cannot:
        checkpointing = f"# {cannot}"
    else:
        checkpointing = (f"# {AC_SUBCOMMAND}:{mode} (the last word: a subcommand): {mode} recompute on every block, "
                         "as the plan chose" + (" (torchtitan's selective policy also re-runs every second matrix "
                                                "product: it keeps less than the plan counted)"
                                                if mode == "selective" else ""))
    return [f"# torchtitan >= {TORCHTITAN_VERSION} (torchtitan/train.py, after --module ... --config ...):",
            f"# {note}",
            f"# local_batch_size / pipeline_parallel_microbatch_size = {view.micro_batches} micro-batches per step, as "
            "the plan was solved: scale both together",
            "# torchtitan refuses pipeline parallelism for models with tied embeddings (enable_weight_tying)",
            checkpointing,
            *([f"# {precision}"] if precision else []),
            " ".join(shell_word(w) for w in _words(view, options))]


def read_back(words: list[str], view: PlanView, options: ExportOptions) -> Decoded:
    mode, _ = activation_checkpoint(view)
    written = None
    if words and words[-1].startswith(f"{AC_SUBCOMMAND}:"):
        written = words[-1].split(":", 1)[1]
        words = words[:-1]
    if written != mode:
        raise RenderCheckError(f"activation checkpointing {written!r} differs from the plan's {mode!r}")
    flags: dict[str, list[str]] = {}
    current = None
    for w in words:
        if w.startswith("--"):
            if w in flags:
                raise RenderCheckError(f"{w} is given twice")
            current = flags.setdefault(w, [])
        elif current is None:
            raise RenderCheckError(f"a value {w!r} before any flag")
        else:
            current.append(w)
    layout = [w for flag, values in flags.items() if flag.startswith("--parallelism.") and
              flag.rpartition(".")[2] in _LAYOUT_FIELDS for w in (flag, *values)]
    if layout != layout_words(view):
        raise RenderCheckError(f"the parallel degrees {layout} differ from the plan's {layout_words(view)}")
    precision = [w for flag, values in flags.items() if flag in (DTYPE, MIXED_PARAM, MIXED_REDUCE)
                 for w in (flag, *values)]
    if precision != precision_words(view)[0]:
        raise RenderCheckError(f"the precision flags {precision} differ from the plan's {precision_words(view)[0]}")
    groups = [g.split(",") for g in flags.get("--parallelism.module_fqns_per_model_part", [])]
    degree = [int(x) for x in flags.get("--parallelism.pipeline_parallel_degree", ["0"])]
    if degree != [view.ranks] or len(groups) != view.ranks * view.chunks_per_rank:
        raise RenderCheckError("the module groups differ from the pipeline degree x chunks per device")
    names = {v: k for k, v in SCHEDULES.items()}
    if names.get(flags.get("--parallelism.pipeline_parallel_schedule", [""])[0]) != schedule_class(view, True, NAME):
        raise RenderCheckError("the schedule differs from the plan's")
    micro = int(flags[LOCAL_BATCH][0]) // int(flags["--parallelism.pipeline_parallel_microbatch_size"][0])
    if micro != view.micro_batches:
        raise RenderCheckError("local_batch_size / microbatch_size differs from the plan's micro-batches")
    if int(flags["--parallelism.pipeline_parallel_microbatch_size"][0]) != view.samples_per_micro_batch or \
            [int(x) for x in flags.get(GLOBAL_BATCH, [])] != \
            ([view.global_batch] if view.global_batch is not None else []):
        raise RenderCheckError("the micro-batch size or the global batch differs from the plan's")
    counts, expected = [], 0
    for k, group in enumerate(groups):
        body = [f for f in group if f not in (EMBEDDING_FQN, *HEAD_FQNS)]
        if (EMBEDDING_FQN in group) != (k == 0) or any((f in group) != (k == len(groups) - 1) for f in HEAD_FQNS):
            raise RenderCheckError(f"group {k} places the embedding or head on the wrong stage")
        if body != [f"layers.{expected + j}" for j in range(len(body))]:
            raise RenderCheckError(f"group {k} does not hold consecutive decoder layers from layers.{expected}")
        expected += len(body)
        counts.append(len(body))
    if not counts:
        raise RenderCheckError("no module groups")
    counts[0] += view.embedding
    counts[-1] += view.head
    return Decoded(from_counts(counts))
