"""Megatron-LM / megatron-core: ``--pipeline-model-parallel-layout`` (``megatron``) and the
``--decoder-first/last-pipeline-num-layers`` form (``megatron-uneven``), as argument files.

Each plan layer is one decoder layer (``t``) unless the plan's first layer is the embedding
(``E``) or its last the head and loss (``L``) by the plan's first-/last-layer regexes. What
megatron-core's ``TransformerConfig`` accepts decides what each form can express: the layout
takes any split; the first/last flags must be > 0 (``num_layers_in_first_pipeline_stage must
be larger than 0``) and the middle stages must hold equal, non-zero counts.

The plan's activation recompute: ``--recompute-granularity full --recompute-method block
--recompute-num-layers N`` recomputes the first N decoder layers of every (virtual) stage
(megatron-core's ``TransformerBlock``), one N for all stages. Where the plan's per-stage counts
differ, or it recomputes other layers than each stage's first ones, a comment line says what
Megatron cannot take and N is the largest count (every stage recomputes at least the plan's
count). Where the plan recomputes selectively only, ``--recompute-granularity selective``:
Megatron's selective recompute re-runs the modules of ``--recompute-modules`` (core attention by
default) in every layer, not the plan's per-operation choice, which a comment line says.

The plan's precision, where its profile records one: ``--bf16`` (``--fp16``) for low-precision
parameters with float32 gradients and master weights (a capture with ``master_weights``), nothing for
float32 (Megatron's default). Megatron has no autocast and always keeps master weights under
``--bf16``: a plan priced otherwise is refused in one line.
"""

from __future__ import annotations

import re

from ._common import Decoded, ExportOptions, from_counts
from ._plan_view import PlanView
from .render import RenderCheckError, comment, shell_word

__all__ = ["NAME", "UNEVEN_NAME", "DESCRIPTION", "UNEVEN_DESCRIPTION", "MEGATRON_VERSION", "render", "read_back",
           "render_uneven", "read_back_uneven", "megatron_layout", "parse_megatron_layout", "megatron_uneven",
           "uneven_counts", "recompute_words", "precision_words", "PRECISION_FLAGS"]

NAME = "megatron"
UNEVEN_NAME = "megatron-uneven"
MEGATRON_VERSION = "0.16"            # megatron-core version whose layout grammar the megatron export targets
DESCRIPTION = "Megatron --pipeline-model-parallel-layout (and the first/last form where it fits)"
UNEVEN_DESCRIPTION = "Megatron --decoder-first/last-pipeline-num-layers only (exit 2 if it cannot express the split)"


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
    """(first, last) for ``--decoder-first/last-pipeline-num-layers`` (None: flag not given),
    or why megatron-core's ``TransformerConfig`` would refuse every choice for ``counts``."""
    p = len(counts)
    if p == 1:
        return "one stage needs no pipeline split"
    zero = [k for k, c in enumerate(counts) if c == 0]
    if zero:
        return (f"stage {zero[0]} would hold no decoder layer, and Megatron's first/last-stage layer counts must be "
                f"larger than 0")
    if len(set(counts)) == 1:
        return None, None
    middle = counts[1:-1]
    if len(set(middle)) > 1:
        return (f"Megatron's --decoder-first/last-pipeline-num-layers need equal decoder layers in every stage but "
                f"the first and last; this plan's middle stages hold {', '.join(map(str, middle))}")
    if not middle:
        return counts[0], None
    m = middle[0]
    return (None if counts[0] == m else counts[0]), (None if counts[-1] == m else counts[-1])


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


def _roles_note(view: PlanView) -> str:
    roles = []
    if view.embedding:
        roles.append(f"the plan's layer '{comment(view.layer_names[0])}' is the embedding (E)")
    if view.head:
        roles.append(f"'{comment(view.layer_names[-1])}' is the output layer and loss (L)")
    if roles:
        return "; ".join(roles) + "; every other plan layer is one decoder layer (t)"
    return "every plan layer is one decoder layer (t); the embedding (E) runs on the first stage and the loss (L) on " \
           "the last"


def _counts(view: PlanView, fmt: str) -> list[int]:
    counts = view.decoder_counts()
    if sum(counts) < 1:
        raise view.error(f"{fmt}: the plan has no decoder layer besides the embedding and the head")
    return counts


def _uneven_words(counts: list[int], uneven: tuple[int | None, int | None]) -> list[str]:
    first, last = uneven
    words = ["--num-layers", str(sum(counts)), "--pipeline-model-parallel-size", str(len(counts))]
    if first is not None:
        words += ["--decoder-first-pipeline-num-layers", str(first)]
    if last is not None:
        words += ["--decoder-last-pipeline-num-layers", str(last)]
    return words


RECOMPUTE_FLAGS = {"--recompute-granularity", "--recompute-method", "--recompute-num-layers"}


def recompute_words(view: PlanView) -> tuple[list[str], str]:
    """Megatron's recompute arguments for the plan and, where they are not the plan's choice
    layer by layer, one line saying what Megatron cannot take ('' where they are)."""
    choices = view.decoder_recompute()
    stages, start = [], 0
    for count in view.decoder_counts():
        stages.append(choices[start:start + count])
        start += count
    chosen = set(choices) - {"none"}
    if not chosen:
        return [], ""
    if chosen == {"selective"}:
        every = set(choices) == {"selective"}
        return ["--recompute-granularity", "selective"], (
            "Megatron's selective recompute re-runs the modules of --recompute-modules (core attention by default) in "
            "every decoder layer, not the plan's choice of operations" + ("" if every else
                                                                         " and layers") + ": its memory differs")
    counts = [sum(1 for r in stage if r != "none") for stage in stages]
    n = max(counts)
    words = ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", str(n)]
    notes = []
    if len(set(counts)) > 1:
        notes.append(f"Megatron takes one --recompute-num-layers for every stage and cannot take the plan's per-stage "
                     f"counts ({', '.join(map(str, counts))}): {n} on every stage, at least the plan's recompute")
    if "selective" in chosen:
        notes.append("Megatron's full recompute stands for the plan's selective layers too")
    if any(any(r == "none" for r in stage[:c]) for stage, c in zip(stages, counts)):
        notes.append(f"Megatron recomputes the first {n} decoder layer{'s' if n > 1 else ''} of each stage, the plan "
                     "other layers of it")
    return words, "; ".join(notes)


#: the plan schedules Megatron runs: its pipeline is 1F1B, interleaved with virtual stages
MEGATRON_SCHEDULES = ("none", "gpipe", "1f1b", "interleaved-1f1b")


def parallel_words(view: PlanView) -> list[str]:
    """The degrees beside the pipeline the plan was priced under, as Megatron's arguments: the tensor-parallel
    size (with ``--sequence-parallel`` where the capture had it), and data parallelism (its size is the world
    size over TP x PP) as Megatron's distributed optimizer (ZeRO 1) or torch's FSDP2 (ZeRO 3); none for a
    pipeline alone. With context parallelism, ``--context-parallel-size``: the plan's data-parallel ranks
    are the ranks its gradients are shared over, data x context parallel, as Megatron's distributed
    optimizer and FSDP2 shard over its data-parallel-with-context group."""
    words: list[str] = []
    if view.tensor_parallel > 1:
        words += ["--tensor-model-parallel-size", str(view.tensor_parallel)]
        if view.sequence_parallel:
            words.append("--sequence-parallel")
    if view.context_parallel > 1:
        words += ["--context-parallel-size", str(view.context_parallel)]
    if view.expert_parallel > 1:                  # carved from the data x context ranks, not added to the world
        words += ["--expert-model-parallel-size", str(view.expert_parallel)]
    if view.data_parallel > 1 and view.zero == 1:
        words.append("--use-distributed-optimizer")
    if view.data_parallel > 1 and view.zero == 3:
        words.append("--use-torch-fsdp2")
    if view.micro_batch_size is not None and view.global_batch is not None:
        # the batch the layout search chose: Megatron derives the micro-batches per step from the two
        # (Megatron's argument names, its parser's dests written as flags: micro_batch_size, global_batch_size)
        for dest, value in (("micro_batch_size", view.micro_batch_size), ("global_batch_size", view.global_batch)):
            words += ["--" + dest.replace("_", "-"), str(value)]
    return words


#: the precision flag Megatron takes for low-precision parameters with float32 gradients and master weights
PRECISION_FLAGS = {"bfloat16": "--bf16", "float16": "--fp16"}


def precision_words(view: PlanView) -> list[str]:
    """The plan's precision as Megatron's flag: ``--bf16`` (``--fp16``) trains bfloat16 (float16)
    parameters with float32 gradients (``main_grad``) and master weights, a master-weights capture's
    step; float32, Megatron's default, takes none. A precision Megatron has no mode for is refused
    (``render``); a plan whose profile records none writes none."""
    return [PRECISION_FLAGS[view.parameter_dtype]] if view.master_weights else []


def check_precision(view: PlanView, fmt: str) -> None:
    """Refuse (one line) a precision Megatron cannot run: torch's autocast, or low-precision parameters
    without float32 master weights (Megatron's --bf16 and --fp16 keep them)."""
    if view.autocast_dtype or (view.parameter_dtype not in ("", "float32") and not view.master_weights):
        raise view.error(f"{fmt}: the plan was priced in {view.precision_text}, which Megatron has no mode for (its "
                         "--bf16 and --fp16 keep float32 gradients and master weights; it has no autocast): capture "
                         "with `master_weights` to price Megatron's --bf16, or in float32")


def _layout_words(counts: list[int], ranks: int, virtual: int) -> list[str]:
    words = ["--num-layers", str(sum(counts)), "--pipeline-model-parallel-size", str(ranks)]
    if virtual > 1:
        words += ["--num-virtual-stages-per-pipeline-rank", str(virtual)]
    return words + ["--pipeline-model-parallel-layout", megatron_layout(counts)]


def render(view: PlanView, options: ExportOptions) -> list[str]:
    if view.schedule not in MEGATRON_SCHEDULES:
        raise view.error(f"megatron runs 1F1B, interleaved with virtual stages; this plan runs {view.schedule}: "
                         "solve with `schedule='1f1b'` or interleaved-1f1b for Megatron")
    if view.data_parallel > 1 and view.zero == 2:
        raise view.error("megatron shards data parallelism as its distributed optimizer (ZeRO 1) or with torch's "
                         "FSDP2 (ZeRO 3); the plan was priced under ZeRO 2: solve it with ZeRO 1 or 3 for Megatron")
    check_precision(view, NAME)
    counts = _counts(view, NAME)
    virtual = view.chunks_per_rank
    parallel = parallel_words(view) + precision_words(view)
    lines = [f"# megatron-core >= {MEGATRON_VERSION} (Megatron-LM's pretrain_*.py arguments):",
             f"# {_roles_note(view)}"]
    if view.context_parallel > 1:
        dp = view.data_parallel // view.context_parallel
        lines.append(f"# launch {view.ranks} x {view.tensor_parallel} x {view.context_parallel} x {dp} = "
                     f"{view.ranks * view.tensor_parallel * view.data_parallel} processes (pipeline x tensor x context "
                     "x data parallel): Megatron's data-parallel size is the world size over TP x PP x CP")
    elif view.tensor_parallel > 1 or view.data_parallel > 1:
        lines.append(f"# launch {view.ranks} x {view.tensor_parallel} x {view.data_parallel} = "
                     f"{view.ranks * view.tensor_parallel * view.data_parallel} processes (pipeline x tensor x data "
                     "parallel): Megatron's data-parallel size is the world size over TP x PP")
    if virtual > 1:
        lines.append(f"# {len(counts)} virtual stages in the layout, {virtual} per pipeline rank: stage k runs on rank "
                     f"k mod {view.ranks}, as Megatron's interleaved schedule places them")
    recompute, cannot = recompute_words(view)
    if cannot:
        lines.append(f"# {cannot}")
    lines.append(" ".join(shell_word(w) for w in parallel + _layout_words(counts, view.ranks, virtual) + recompute))
    if virtual > 1:
        lines.append("# (the first/last-stage flags cannot express virtual stages)")
        return lines
    uneven = megatron_uneven(counts)
    if isinstance(uneven, tuple):
        even = " (an even split: no first/last flags)" if uneven == (None, None) else ""
        lines.append(f"# the same split for Megatron versions without --pipeline-model-parallel-layout{even}:")
        lines.append("# " + " ".join(shell_word(w) for w in parallel + _uneven_words(counts, uneven) + recompute))
    else:
        lines.append(f"# (not expressible without the layout flag: {uneven})")
    return lines


def render_uneven(view: PlanView, options: ExportOptions) -> list[str]:
    view.one_stage_per_device(UNEVEN_NAME)
    counts = _counts(view, UNEVEN_NAME)
    uneven = megatron_uneven(counts)
    if isinstance(uneven, str):
        raise view.error(f"megatron-uneven cannot express this plan: {uneven}; use `fmt='megatron'` (the layout flag)")
    if view.data_parallel > 1 and view.zero == 2:
        raise view.error("megatron shards data parallelism as its distributed optimizer (ZeRO 1) or with torch's "
                         "FSDP2 (ZeRO 3); the plan was priced under ZeRO 2: solve it with ZeRO 1 or 3 for Megatron")
    check_precision(view, UNEVEN_NAME)
    recompute, cannot = recompute_words(view)
    return ["# megatron-core (Megatron-LM's pretrain_*.py arguments), for versions without "
            "--pipeline-model-parallel-layout:",
            f"# {_roles_note(view)}",
            *([f"# {cannot}"] if cannot else []),
            " ".join(shell_word(w) for w in parallel_words(view) + precision_words(view)
                     + _uneven_words(counts, uneven) + recompute)]


def _flags(words: list[str], allowed: set[str]) -> dict[str, str]:
    if len(words) % 2:
        raise RenderCheckError(f"expected flag/value pairs, got {len(words)} words")
    flags = dict(zip(words[::2], words[1::2]))
    if set(flags) - allowed or len(flags) != len(words) // 2:
        raise RenderCheckError(f"unexpected or repeated flags {sorted(flags)}")
    return flags


def _check_recompute(flags: dict[str, str], view: PlanView) -> None:
    written = [w for flag in ("--recompute-granularity", "--recompute-method", "--recompute-num-layers")
               if flag in flags for w in (flag, flags[flag])]
    if written != recompute_words(view)[0]:
        raise RenderCheckError(f"the recompute arguments {written} differ from the plan's")


def _with_roles(view: PlanView, counts: list[int]) -> Decoded:
    counts = list(counts)
    counts[0] += view.embedding
    counts[-1] += view.head
    return Decoded(from_counts(counts))


def _without_parallel(words: list[str], view: PlanView) -> list[str]:
    parallel = parallel_words(view) + precision_words(view)
    if words[:len(parallel)] != parallel:
        raise RenderCheckError(f"the parallel and precision arguments differ from the plan's {parallel}")
    return words[len(parallel):]


def read_back(words: list[str], view: PlanView, options: ExportOptions) -> Decoded:
    words = _without_parallel(words, view)
    flags = _flags(words, {"--num-layers", "--pipeline-model-parallel-size", "--pipeline-model-parallel-layout",
                           "--num-virtual-stages-per-pipeline-rank"} | RECOMPUTE_FLAGS)
    _check_recompute(flags, view)
    stages = parse_megatron_layout(flags["--pipeline-model-parallel-layout"])
    ranks = int(flags["--pipeline-model-parallel-size"])
    virtual = int(flags.get("--num-virtual-stages-per-pipeline-rank", "1"))
    if len(stages) != ranks * virtual:
        raise RenderCheckError("the layout's stages differ from --pipeline-model-parallel-size x virtual stages")
    if stages[0][:1] != ["E"] or stages[-1][-1:] != ["L"] or sum(s.count("E") + s.count("L") for s in stages) != 2:
        raise RenderCheckError("the layout must start with E and end with L")
    counts = [s.count("t") for s in stages]
    if sum(counts) != int(flags["--num-layers"]):
        raise RenderCheckError("--num-layers differs from the layout's decoder layers")
    decoded = _with_roles(view, counts)
    if virtual == 1:
        return decoded
    return Decoded(decoded.stages, tuple(k % ranks for k in range(len(counts))))


def read_back_uneven(words: list[str], view: PlanView, options: ExportOptions) -> Decoded:
    words = _without_parallel(words, view)
    flags = _flags(words, {"--num-layers", "--pipeline-model-parallel-size", "--decoder-first-pipeline-num-layers",
                           "--decoder-last-pipeline-num-layers"} | RECOMPUTE_FLAGS)
    _check_recompute(flags, view)
    first, last = (int(flags[f]) if f in flags else None for f in ("--decoder-first-pipeline-num-layers",
                                                                   "--decoder-last-pipeline-num-layers"))
    counts = uneven_counts(int(flags["--num-layers"]), int(flags["--pipeline-model-parallel-size"]), first, last)
    if sum(counts) != int(flags["--num-layers"]):
        raise RenderCheckError("the flags do not divide --num-layers into whole stages")
    return _with_roles(view, counts)
