"""The comparison (the layout search's compare option): the layouts a user would otherwise take,
priced with the same model and cluster as the layout search's choice (docs/layouts.md, "Compared
layouts", cites each source):

* **NeMo auto-configurator's grid**: the tensor-parallel degrees, pipeline stages and micro-batch
  sizes its ``GPT3GridSearch`` (``nemo/collections/llm/tools/auto_configurator/core/training_config.py``)
  tries for a model of this size on 80 GB GPUs, with Megatron's distributed optimizer (ZeRO 1, NeMo's
  default); every grid point is priced and the fastest that fits is its row (the auto-configurator
  runs each and keeps the fastest).
* **torchtitan's Llama-3 preset** for the size (``torchtitan/models/llama3/config_registry.py``:
  ``llama3_8b``, ``llama3_70b``, ``llama3_405b``, torchtitan 0.3.0): FSDP2 over every GPU left (ZeRO
  3), its tensor-parallel degree, no pipeline, its local batch as the micro-batch size.
* **Megatron's published Llama configurations** for the size (``megatron_presets``): Megatron-LM's
  own Llama-3 8B example (``examples/llama/train_llama3_8b_h100_fp8.sh``) and NVIDIA's Megatron Core
  pre-training recipes in NeMo for Llama 3 8B and 70B and Llama 3.1 405B
  (``nemo/collections/llm/recipes/llama3_8b.py``, ``llama3_70b.py``, ``llama31_405b.py``): their
  tensor, context and pipeline parallel degrees, virtual pipeline stages (interleaved 1F1B with that
  many chunks per device), micro-batch size and distributed optimizer (ZeRO 1), data parallelism over
  the GPUs left; each source with the commit its numbers were read at.
* **pure pipeline**: the most stages the layers and GPUs allow, DDP across the rest, TP 1.
* **pure FSDP**: one stage, ZeRO 3 over every GPU, TP 1.

Each is the layout search with every degree fixed (plan/layouts.py's ``search``), so its step, its
ranks' peaks and its refusals are the search's own."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from ..common.deadline import Deadline
from ..common.events import Events
from ..errors import StagesplitError
from ..io.profile import ROLES, Profile, gathers_logits
from ..model.datasharding import DataLayout, role_bytes
from .layouts import Analyze, Degree, LayoutPlan, LayoutRequest, degrees_of, search

__all__ = ["Compared", "Comparison", "Reference", "compare", "gathered_note", "megatron_presets", "model_size_b",
           "nemo_grid", "references"]


@dataclass(frozen=True)
class Reference:
    """One layout to compare: its degrees (``dp`` the GPUs left), ZeRO stage and micro-batch size;
    ``cp`` its context-parallel degree, ``vp`` its virtual pipeline stages per device (None: one
    stage per device), ``sequence_parallel`` whether the configuration turns Megatron's sequence
    parallelism on (priced as the tensor-parallel rank's profile was captured: ``capture(tp=...,
    sequence_parallel=...)``)."""

    name: str
    source: str
    tp: int
    pp: int
    zero: int
    micro_batch_size: int
    cp: int = 1
    vp: int | None = None
    sequence_parallel: bool = False


@dataclass(frozen=True)
class Compared:
    """One compared layout's outcome: the search with its degrees fixed (``plan``), or why it could
    not be laid out on this cluster (``refused``). ``tried``: grid points priced (NeMo's row)."""

    name: str
    source: str
    plan: LayoutPlan | None
    refused: str = ""
    tried: int = 1

    @property
    def step_s(self) -> float | None:
        return self.plan.best.step_s if self.plan is not None and self.plan.best is not None else None


@dataclass(frozen=True)
class Comparison:
    """The layout search's answer (``chosen``) and each compared layout's row, in the order above;
    ``notes``: what the rows were priced under that their frameworks do otherwise (``gathered_note``)."""

    chosen: LayoutPlan
    rows: tuple[Compared, ...]
    notes: tuple[str, ...] = ()


#: the compared rows (by their names' start) whose frameworks compute the loss on logits split over the
#: vocabulary under tensor parallelism: torchtitan (its loss-parallel cross-entropy, always with TP) and
#: Megatron, NeMo's recipes and auto-configurator among its users (its vocabulary-parallel cross-entropy)
_SPLIT_LOSS = ("torchtitan", "Megatron", "NeMo")


def gathered_note(tried: Sequence[tuple[str, Sequence[int]]], gathered: Sequence[int]) -> str:
    """The note for the compared rows that priced a layout at a tensor-parallel degree whose profile
    gathers the head's logits (``gathered``: those degrees) though their framework keeps them split:
    priced holding every logit on each rank, more than the framework holds. ``tried``: each row's name
    and the tensor-parallel degrees it priced. Empty where no row did."""
    names = [name for name, tps in tried if name.startswith(_SPLIT_LOSS) and set(tps) & set(gathered)]
    if not names:
        return ""
    used = sorted({tp for name, tps in tried if name in names for tp in tps} & set(gathered))
    many = len(used) > 1
    return (f"{', '.join(names)}: priced with the head's logits gathered on every rank (the tensor-parallel "
            f"profile{'s' if many else ''} of degree{'s' if many else ''} {', '.join(map(str, used))} "
            f"{'were' if many else 'was'} captured so, as the model's plan declares); their frameworks keep the "
            "logits split over the vocabulary: capture with `loss_parallel` to price them as they run")


def model_size_b(analysis_profile: Profile) -> float:
    """The model's parameters in billions: its float32 master copies' bytes over 4 where the capture
    kept them (a capture with master weights: the parameters themselves are in a lower precision), else its
    parameters' bytes over 4 (float32 weights, as under autocast)."""
    v = analysis_profile.variables
    role = np.zeros(len(v), np.int8) if v.role is None else np.asarray(v.role)
    state = np.flatnonzero(v.always_live & (role == ROLES.index("state")))
    masters = sum(int(v.bytes[i]) for i in state if analysis_profile.variable_name(int(i)).endswith(".master"))
    return (masters or role_bytes(analysis_profile)["param"]) / 4 / 1e9


#: NeMo's GPT3GridSearch on 80 GB GPUs at sequence 2048 (its largest table), by model size in
#: billions: (size at most, TP degrees, PP range, micro-batch sizes)
_NEMO_80GB: tuple[tuple[float, tuple[int, ...], tuple[int, int], tuple[int, ...]], ...] = (
    (1.0, (1, 2), (1, 1), (1, 2, 4, 8)), (4.0, (1, 2, 4), (1, 1), (1, 2, 4, 8)),
    (8.0, (1, 2, 4), (1, 1), (1, 2, 4, 8)), (13.0, (1, 2, 4, 8), (1, 1), (1, 2, 4, 8)),
    (23.0, (1, 2, 4), (1, 4), (1, 2, 4)), (45.0, (2, 4, 8), (1, 4), (1, 2, 4)),
    (95.0, (2, 4, 8), (1, 8), (1, 2, 4, 8)), (130.0, (2, 4, 8), (1, 16), (1, 2, 4, 8)),
    (195.0, (8,), (4, 16), (1, 2, 4)),
    (395.0, (8,), (8, 32), (1, 2, 4)), (790.0, (8,), (8, 100), (1, 2, 4)), (1100.0, (8,), (16, 130), (1, 2, 4)))


def nemo_grid(size_b: float, gpus: int, layers: int) -> list[tuple[int, int, int]]:
    """NeMo's (TP, PP, micro-batch size) grid for a model of ``size_b`` billion parameters on
    ``gpus`` GPUs: PP among its range that divides the layers (NeMo's ``valid_pp``) and TP x PP
    dividing the GPUs."""
    row = next((r for r in _NEMO_80GB if size_b <= r[0]), _NEMO_80GB[-1])
    _, tps, (lo, hi), sizes = row
    return [(tp, pp, s) for tp in tps for pp in range(lo, hi + 1) if layers % pp == 0 and gpus % (tp * pp) == 0
            for s in sizes]


def references(size_b: float, gpus: int, layers: int, global_batch: int) -> list[Reference]:
    """torchtitan's preset for the size, pure pipeline and pure FSDP (NeMo's grid is apart)."""
    if size_b < 30:
        titan = Reference("torchtitan llama3_8b", "torchtitan/models/llama3/config_registry.py (llama3_8b)",
                          1, 1, 3, 1)
    elif size_b < 200:
        titan = Reference("torchtitan llama3_70b", "torchtitan/models/llama3/config_registry.py (llama3_70b)",
                          8, 1, 3, 8)
    else:
        titan = Reference("torchtitan llama3_405b", "torchtitan/models/llama3/config_registry.py (llama3_405b)",
                          8, 1, 3, 2)
    pp = max(d for d in range(1, min(gpus, layers) + 1) if gpus % d == 0)
    return [titan, Reference("pure pipeline", "every stage its own GPU, DDP across the rest", 1, pp, 0, 1),
            Reference("pure FSDP", "one stage, ZeRO 3 over every GPU", 1, 1, 3, 1)]


#: Megatron's published Llama pre-training configurations, by the model size in billions they are for
#: (the first whose bound the size is under): (name, source, TP, CP, PP, virtual stages, micro-batch size,
#: sequence parallel). Each runs Megatron's distributed optimizer (ZeRO 1: ``--use-distributed-optimizer``
#: in the example, NeMo's ``distributed_fused_adam_with_cosine_annealing`` in the recipes) and takes
#: the data-parallel ranks from the GPUs left; only the numbers are taken, from the files at these commits.
_MEGATRON: tuple[tuple[float, tuple[tuple[str, str, int, int, int, int | None, int, bool], ...]], ...] = (
    (30.0, (("Megatron-LM Llama-3 8B example",
             "NVIDIA/Megatron-LM examples/llama/train_llama3_8b_h100_fp8.sh @ 157006d6d9bf4f55c0d4d7dacbd2b65e7bd84dc9",
             1, 1, 1, None, 1, True),
            ("NeMo llama3_8b recipe (Megatron Core)",
             "NVIDIA/NeMo nemo/collections/llm/recipes/llama3_8b.py @ 00617962f84fb2b31562f6a23b59330747e1d4b6",
             1, 2, 1, None, 1, False))),
    (200.0, (("NeMo llama3_70b recipe (Megatron Core)",
              "NVIDIA/NeMo nemo/collections/llm/recipes/llama3_70b.py @ 0189a3b38dcfc89e916ca4396459433c8ba326d2",
              4, 2, 4, 5, 1, True),)),
    (math.inf, (("NeMo llama31_405b recipe (Megatron Core)",
                 "NVIDIA/NeMo nemo/collections/llm/recipes/llama31_405b.py @ 00aa2e12802f4f31b0eafc2421d5894b4d8fb988",
                 8, 4, 9, 2, 1, True),)),
)


def megatron_presets(size_b: float) -> list[Reference]:
    """Megatron's published Llama configurations for a model of ``size_b`` billion parameters (the
    8B ones under 30B, the 70B one under 200B, else the 405B one: the sizes torchtitan's presets
    are chosen by), each as a ``Reference`` of ZeRO 1."""
    presets = next(p for bound, p in _MEGATRON if size_b < bound)
    return [Reference(name, source, tp, pp, 1, mbs, cp, vp, sp) for name, source, tp, cp, pp, vp, mbs, sp in presets]


def _fixed(req: LayoutRequest, tp: int, pp: int, zero: int, size: int, time_limit: float, cp: int = 1,
           vp: int | None = None) -> LayoutRequest:
    """The request with every degree fixed: ``dp`` the GPUs left over ``tp x cp x pp``, ZeRO only
    where ranks share the gradients (``dp x cp``), ``vp`` virtual stages per device as interleaved
    1F1B with that many chunks (Megatron's interleaved schedule) where there is a pipeline, else the
    search's first schedule (1F1B by default: a layout's own schedule, not the best of a list)."""
    dp = req.gpus // (tp * cp * pp)
    looped = vp is not None and vp > 1 and pp > 1
    # (no compared layout uses expert parallelism)
    return replace(req, tp=tp, pp=pp, dp=dp, cp=cp, ep=1, zero=zero if dp * cp > 1 else 0, micro_batch_size=size,
                   time_limit=time_limit, schedule="interleaved-1f1b" if looped else req.schedules[0],
                   chunks_per_rank=vp if looped else None)


def _price(analyze: Analyze, degrees: Sequence[Degree], req: LayoutRequest, deadline: Deadline) -> LayoutPlan | str:
    """The search with every degree fixed, or why it cannot be laid out (one line)."""
    cp = req.cp or 1
    if cp == 1 and req.tp not in degrees:                # (a rank of CP or EP 1 is keyed by its TP degree alone)
        return f"no profile of tensor-parallel degree {req.tp} was given"
    if cp > 1 and (req.tp, cp) not in degrees:
        return (f"no profile of tensor-parallel degree {req.tp} and context-parallel degree {cp} was given (capture "
                f"one with `cp={cp}`)")
    ranks = (req.tp or 1) * cp * (req.pp or 1)
    if req.gpus % ranks:
        return f"TP {req.tp} x CP {cp} x PP {req.pp} = {ranks} does not divide {req.gpus:,} GPUs"
    if req.global_batch % ((req.dp or 1) * (req.micro_batch_size or 1)):
        return (f"the global batch {req.global_batch} is no multiple of micro-batches of {req.micro_batch_size} on "
                f"{req.dp} data-parallel ranks")
    try:
        return search(analyze, degrees, req, deadline, Events())
    except StagesplitError as exc:
        return str(exc)


def _faster(a: LayoutPlan, b: LayoutPlan) -> bool:
    """Whether ``a`` fits and steps faster than ``b`` (or ``b`` does not fit)."""
    if a.best is None or a.best.step_s is None:
        return False
    return b.best is None or b.best.step_s is None or a.best.step_s < b.best.step_s


def compare(analyze: Analyze, degrees: Sequence[Degree], req: LayoutRequest, chosen: LayoutPlan, deadline: Deadline,
            events: Events) -> Comparison:
    """Each compared layout priced as the search prices its own (module docstring)."""
    from fractions import Fraction
    base = analyze(min(degrees, key=degrees_of), DataLayout(), Fraction(1))
    size = model_size_b(base.profile)
    layers = base.layers.num_layers
    grid = nemo_grid(size, req.gpus, layers)
    titan, *others = references(size, req.gpus, layers, req.global_batch)
    refs = [titan, *megatron_presets(size), *others]
    jobs = len(grid) + len(refs)
    events.start("pricing the compared layouts", "layouts")
    done = 0
    # the named layouts first, with half the time (each an even share of what is left of it): each is one
    # layout a user would run, where the grid's points are many tries at one row; the grid then has the rest
    named = deadline.part(deadline.left() / 2) if grid else deadline
    priced: list[Compared] = []
    for k, ref in enumerate(refs):
        share = named.left() / (len(refs) - k)
        got = _price(analyze, degrees, _fixed(req, ref.tp, ref.pp, ref.zero, ref.micro_batch_size, share, ref.cp,
                                              ref.vp), named.part(share))
        done += 1
        events.update(done, jobs)
        priced.append(Compared(ref.name, ref.source, None, got) if isinstance(got, str) else
                      Compared(ref.name, ref.source, got))
    best: LayoutPlan | None = None
    reasons: list[str] = []
    for k, (tp, pp, s) in enumerate(grid):
        share = deadline.left() / (len(grid) - k)
        got = _price(analyze, degrees, _fixed(req, tp, pp, 1, s, share), deadline.part(share))
        done += 1
        events.update(done, jobs)
        if isinstance(got, str):
            reasons.append(got)
        elif best is None or _faster(got, best):
            best = got
    nemo = "nemo/collections/llm/tools/auto_configurator/core/training_config.py (GPT3GridSearch, 80 GB)"
    if best is None:
        rows = [Compared("NeMo auto-configurator grid", nemo, None,
                         reasons[0] if reasons else "no grid point for this model on this cluster", len(grid))]
    else:
        rows = [Compared("NeMo auto-configurator grid", nemo, best, tried=len(grid))]
    rows += priced
    events.done()
    gathered = sorted({degrees_of(d)[0] for d in degrees if degrees_of(d)[0] > 1 and _gathers_logits(
        analyze(d, DataLayout(), Fraction(1)).profile)})
    tried = [(rows[0].name, sorted({tp for tp, _, _ in grid})), *((ref.name, [ref.tp]) for ref in refs)]
    note = gathered_note(tried, gathered)
    return Comparison(chosen, tuple(rows), (note,) if note else ())


def _gathers_logits(profile: Profile) -> bool:
    """Whether a tensor-parallel rank's profile gathers a head's output (style ``colwise_gather_output``)."""
    layout = profile.info.parallel_layout
    return layout is not None and gathers_logits(layout.styles)
