"""The layout search: every way to lay a model out on ``G`` GPUs (tensor-parallel degree ``tp``
from the profiles given, pipeline stages ``pp``, data-parallel ranks ``dp``, ZeRO stage), each
one's split solved by the engine (plan/engine.py: the split proven by the schedule's CP-SAT, as
``solve`` does), its communication added on the node's links (model/communication.py), and the
fastest layout that fits every rank kept.

Whole combinations are discarded before they are solved by two lower bounds: the step floor
(``step_floor``: one micro-batch's work at the roofline and its collectives, times the schedule's
bubble factor, the optimizer and the least data-parallel communication: no split of ``pp`` stages
runs faster) against the fastest step found so far, and the memory floor (a rank's always-live
bytes over ``pp``: some stage holds at least that) against the capacity. The combinations are
solved in order of their step floor, so that the first solved is the likeliest best and the floor
cuts off most of the rest.

Measured per-layer compute (``layer_compute``, as ``solve`` takes it) reaches each combination's
solve as ``solve``'s own option, each rank's figures scaled from those of the rank they were
measured on by its capture (``rank_layer_compute``); the step floor counts them too
(``_measured_work``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction

import numpy as np

from ..common.deadline import Deadline, TimeLimitReached
from ..common.events import Events
from ..common.layerfigures import LayerFigure, figure_phases, figure_total
from ..errors import OptionError, StagesplitError
from ..io.profile import ParallelLayout, Phase, Target
from ..io.topology import NodeTopology
from ..model.analysis import Analysis
from ..model.communication import DDP_FIRST_BUCKET_BYTES, dp_exposed, ring_time
from ..model.datasharding import DataLayout, parameter_bytes_by_layer, role_bytes, zero_share
from ..solver.request import Schedule, SolveRequest
from ..solver.schedule_kinds import check_schedule, traits
from .pipeline_floor import RangeFloors, bounded, busy_floor, pipeline_floors
from .records import Plan
from .text import fewest_text

__all__ = ["Degree", "GpuSweep", "GpuSweepRow", "Layout", "LayoutPlan", "LayoutRequest", "LayoutRow", "Measured",
           "RankWork", "bubble_factor", "check_request", "cp_seconds", "cp_share", "ep_share", "degrees_of",
           "dp_floor", "enumerate_layouts", "search_deadline", "key_of", "measured_for", "memory_floor", "order_estimate", "rank_layer_compute", "search", "seconds",
           "slowest_stage", "StageBytes", "DEFAULT_SCHEDULES", "search_order", "pipeline_memory_floor",
           "solve_request", "step_floor", "step_of", "sweep_gpus"]


#: the schedules the layout search tries unless told: 1F1B, and interleaved 1F1B at each chunk count the
#: layers allow (2 to 4), each combination's own item, 1F1B's searched first (``search_order``); the
#: interleaved schedule is how the largest models train (Megatron's virtual pipeline, the Llama 3 405B)
DEFAULT_SCHEDULES = "1f1b,interleaved-1f1b"

#: the end of the time limit kept for the pipeline floors of the combinations no solve reached: this
#: share of the limit at most, and this many seconds per combination (the floors of one take
#: milliseconds where its micro-batch size's phase table is made)
TAIL_SHARE = 0.1
TAIL_PER_ITEM_S = 0.005

#: the very end of the time limit kept for what follows the search (the chosen plan assembled, and what
#: a solve runs past its share: CP-SAT stops at its deadline within tens of milliseconds), so that the
#: command returns inside its limit: this share of it, and no more than this many seconds
FINISH_SHARE = 0.01
FINISH_MAX_S = 0.5


def search_deadline(time_limit: float) -> Deadline:
    """The deadline of a layout search given ``time_limit`` seconds from now (its messages name the
    limit): that limit less the end kept for finishing (``FINISH_SHARE``, at most ``FINISH_MAX_S``)."""
    limit = float(time_limit)
    return Deadline.after(limit - min(FINISH_SHARE * limit, FINISH_MAX_S), limit)


@dataclass(frozen=True, order=True)
class Layout:
    """One degree combination: ``tp * cp * pp * dp`` GPUs, ZeRO ``zero``, ``micro_batches`` per step.

    ``cp`` context-parallel ranks share each sample's sequence; as in Megatron and torchtitan they
    share its gradients with the data-parallel ranks: gradients are reduced, and ZeRO shards,
    over the ``dp x cp`` ranks of one tensor-parallel position and stage (``sync``)."""

    tp: int
    pp: int
    dp: int
    zero: int
    micro_batches: int
    cp: int = 1
    #: expert-parallel ranks: as in Megatron, taken from the dp x cp ranks (``ep`` divides ``sync``),
    #: not multiplied into the GPUs; each holds 1/ep of the routed experts
    ep: int = 1
    #: samples per micro-batch (``micro_batches x micro_batch_size x dp`` is the global batch;
    #: context-parallel ranks share their samples)
    micro_batch_size: int = 1
    #: where the request searches several schedules (``LayoutRequest.schedules``): the one this
    #: combination is solved under and its chunks per device; empty: the request's one schedule
    schedule: str = ""
    chunks_per_rank: int = 0

    @property
    def schedule_text(self) -> str:
        """Its own schedule as the rows name it, ``x V`` where it runs V chunks per device."""
        return self.schedule + (f" x{self.chunks_per_rank}" if self.chunks_per_rank > 1 else "")

    @property
    def sync(self) -> int:
        """The ranks gradients are reduced (and ZeRO shards) across: data x context parallel."""
        return self.dp * self.cp

    def describe(self) -> str:
        cp = f" x CP {self.cp}" if self.cp > 1 else ""
        ep = f" (EP {self.ep} of the DP x CP ranks)" if self.ep > 1 else ""
        schedule = f", {self.schedule_text}" if self.schedule and self.pp > 1 else ""
        return (f"TP {self.tp}{cp} x PP {self.pp} x DP {self.dp}{ep}, ZeRO {self.zero}, "
                f"{self.micro_batches} micro-batches of {self.micro_batch_size}{schedule}")


#: measured per-layer compute (``solve``'s ``layer_compute``) given for the ranks of one tensor-parallel
#: degree: (the degree, ((layer name, compute), ...), the file it was read from or None)
Measured = tuple[int, tuple[tuple[str, LayerFigure], ...], str | None]


#: a rank's profile key: a tensor-parallel degree, or (tensor-parallel, context-parallel) degrees, or
#: (tensor-parallel, context-parallel, expert-parallel) degrees
Degree = int | tuple[int, int] | tuple[int, int, int]


def degrees_of(key: Degree) -> tuple[int, int, int]:
    """(tp, cp, ep) of a rank's key (the degrees it leaves out are 1)."""
    if isinstance(key, int):
        return key, 1, 1
    return int(key[0]), int(key[1]), int(key[2]) if len(key) > 2 else 1


def key_of(lay: Layout) -> Degree:
    """The key of the rank's profile a combination runs (the shortest that says its degrees)."""
    if lay.ep > 1:
        return lay.tp, lay.cp, lay.ep
    return lay.tp if lay.cp == 1 else (lay.tp, lay.cp)


@dataclass(frozen=True)
class LayoutRequest:
    """What the search is asked: the cluster, the batch, the degrees fixed (None: searched)."""

    gpus: int
    global_batch: int
    target: Target
    node: NodeTopology
    #: samples per micro-batch; None: searched (every divisor of the batch per data-parallel rank
    #: that fits), the profiles scaled from ``captured_batch`` (model/batchscale.py)
    micro_batch_size: int | None = 1
    sequence_length: int | None = None
    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    zero: int | None = None
    reshard_after_forward: bool = True
    #: the context-parallel degree fixed (None: every degree a profile was given for)
    cp: int | None = None
    #: the expert-parallel degree fixed (None: every degree a profile was given for, inside a node)
    ep: int | None = None
    schedule: str = "1f1b"
    time_limit: float = 60.0
    #: what each solve keeps back on a device outside the profile (solve's ``runtime_reserve``)
    runtime_reserve: str | int = "auto"
    #: the micro-batch size the profiles were captured at (their activations and work are scaled
    #: from it to each size searched)
    captured_batch: int = 1
    #: where ``captured_batch`` comes from: "recorded" (by the profiles' capture), "given", or
    #: "assumed" (the profiles record none: the fixed micro-batch size, else 1)
    captured_from: str = "assumed"
    #: the batch the profiles' capture recorded (None: none recorded), beside a ``captured_batch`` given
    recorded_batch: int | None = None
    #: measured per-layer compute, one entry per tensor-parallel degree it was measured at (degree 1:
    #: the ``layer_compute`` option; the others ``tp_layer_compute``); each combination's rank takes it
    #: as ``rank_layer_compute`` says (docs/layouts.md, "Measured per-layer compute")
    layer_compute: tuple[Measured, ...] = ()
    #: chunks (virtual stages) per device under a looped schedule (solve's ``chunks_per_rank``;
    #: None: the schedule's own), as a published configuration's virtual pipeline size fixes it
    chunks_per_rank: int | None = None

    @property
    def schedules(self) -> tuple[str, ...]:
        """The schedules searched: ``schedule`` names one, ``auto`` (the engine's own search of every
        schedule per combination), or several separated by commas, each a combination's own item."""
        return tuple(self.schedule.split(","))

    def for_layout(self, lay: Layout) -> LayoutRequest:
        """The request one item is solved and bounded under: its own schedule and chunks per device
        where the request searches several, else the request itself."""
        if not lay.schedule:
            return self
        looped = traits(lay.schedule).fixed_chunks_per_rank is None
        return replace(self, schedule=lay.schedule, chunks_per_rank=lay.chunks_per_rank if looped else None)

    def micro_batch_sizes(self, dp: int) -> list[int]:
        """The sizes a layout of ``dp`` data-parallel ranks may take: the one fixed, or every
        divisor of the batch per rank."""
        if self.global_batch % dp:
            return []
        if self.micro_batch_size is not None:
            return [self.micro_batch_size] if (self.global_batch // dp) % self.micro_batch_size == 0 else []
        return _divisors(self.global_batch // dp)


@dataclass(frozen=True)
class LayoutRow:
    """One combination's outcome. ``status``: best, slower, memory (a rank does not fit),
    cut off (a lower bound proves it cannot beat the best), unknown (the time limit stopped its
    search), refused (the engine refused it: ``reason`` says why)."""

    layout: Layout
    status: str
    reason: str
    step_s: float | None = None
    pipeline_s: float | None = None
    tp_comm_s: float = 0.0
    dp_comm_s: float = 0.0
    bubble: float | None = None
    rank_peaks: tuple[int, ...] = ()
    capacity: int = 0
    proven: bool = False
    #: the schedule the split was solved under, and its chunks per device (the request's, or the
    #: one ``auto`` chose); empty where nothing was solved
    schedule: str = ""
    chunks_per_rank: int = 0
    #: context parallelism's ring exchange left exposed after the attention it overlaps
    cp_comm_s: float = 0.0
    #: expert parallelism's all-to-alls (not overlapped)
    ep_comm_s: float = 0.0
    #: how much faster another split of this combination could be at most: its split's exposed
    #: data-parallel communication over the least any split exposes (``dp_floor``); the split is
    #: proven for its pipeline step, which every other step term follows
    dp_gap_s: float = 0.0


@dataclass(frozen=True)
class LayoutPlan:
    """The search's answer: the best row and its pipeline plan, every row, the figures derived."""

    request: LayoutRequest
    rows: tuple[LayoutRow, ...]
    best: LayoutRow | None = None
    plan: Plan | None = field(default=None, repr=False, compare=False)
    tokens_per_s_per_gpu: float | None = None
    samples_per_s: float | None = None
    mfu: float | None = None
    proven: bool = False
    tp_collectives_recorded: bool = False
    notes: tuple[str, ...] = ()
    #: where ``proven``: how much faster than the best any layout and split could be at most (the
    #: solved combinations' ``dp_gap_s`` below the best's step); 0: the best is the optimum
    within_s: float = 0.0


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def enumerate_layouts(req: LayoutRequest, tp_degrees: Sequence[Degree], layers: int) -> list[Layout]:
    """Every combination the request allows: ``tp`` and ``cp`` from the profiles given (``tp`` at
    most one node), ``pp`` at most the layers, ``dp`` the rest (``tp x cp x pp x dp = G``),
    micro-batches ``global_batch / (micro_batch_size * dp)`` whole (context-parallel ranks share
    their samples), ZeRO 0 to 3 where two or more ranks share the gradients (``dp x cp``; 0 with
    one). An expert-parallel rank (``ep > 1``) runs where ``ep`` divides ``dp x cp`` (Megatron's
    expert groups are carved from those ranks), inside a node unless ``ep`` is fixed (``tp x ep`` at
    most the node's GPUs), under ZeRO 0 only (the distributed optimizer shards experts over the
    expert-data-parallel ranks, which the rank's sharding does not yet tell apart)."""
    out = []
    for tp, cp, ep in sorted({degrees_of(d) for d in tp_degrees}):
        if (req.tp is not None and tp != req.tp) or (req.cp is not None and cp != req.cp):
            continue
        if (req.ep is not None and ep != req.ep) or (req.ep is None and tp * ep > req.node.gpus_per_node):
            continue
        if tp > req.node.gpus_per_node or req.gpus % (tp * cp):
            continue
        for pp in _divisors(req.gpus // (tp * cp)):
            dp = req.gpus // (tp * cp * pp)
            if (req.pp is not None and pp != req.pp) or (req.dp is not None and dp != req.dp) or pp > layers:
                continue
            if (dp * cp) % ep:
                continue
            zeros = [req.zero] if req.zero is not None else ([0, 1, 2, 3] if dp * cp > 1 and ep == 1 else [0])
            for mbs in req.micro_batch_sizes(dp):
                M = req.global_batch // (mbs * dp)
                for z in zeros:
                    if z > 0 and (dp * cp == 1 or ep > 1):
                        continue
                    out.extend(schedule_items(req, Layout(tp, pp, dp, z, M, cp, ep, mbs), layers))
    return out


def schedule_items(req: LayoutRequest, lay: Layout, layers: int) -> list[Layout]:
    """The items a combination is searched as: itself under the request's one schedule; where the
    request names several, one per schedule and chunk count (each looped schedule at 2 to
    ``AUTO_MAX_CHUNKS_PER_RANK`` chunks per device as far as the layers go, or the count asked
    for), each with its own floors and row (a combination none of whose schedules fits its chunks in
    the layers: one row, refused); one stage is one item, under 1F1B (``solve_request``)."""
    names = req.schedules
    if len(names) == 1:
        return [lay]
    if lay.pp == 1:
        return [replace(lay, schedule="1f1b", chunks_per_rank=1)]
    from .engine import AUTO_MAX_CHUNKS_PER_RANK
    out: list[Layout] = []
    for name in names:
        fixed = traits(name).fixed_chunks_per_rank
        counts = [fixed] if fixed else [req.chunks_per_rank] if req.chunks_per_rank else \
            [v for v in range(2, AUTO_MAX_CHUNKS_PER_RANK + 1) if lay.pp * v <= layers]
        out.extend(replace(lay, schedule=name, chunks_per_rank=v) for v in counts)
    if not out:            # no looped schedule's chunks fit the layers: the first, refused with the reason
        out.append(replace(lay, schedule=names[0], chunks_per_rank=2))
    return out


def check_request(req: LayoutRequest, tp_degrees: Sequence[Degree], layers: int) -> list[Layout]:
    """The combinations, or one line naming the option that leaves none."""
    if req.gpus % req.node.gpus_per_node and req.gpus > req.node.gpus_per_node:
        raise OptionError("gpus_per_node", f"{req.node.gpus_per_node} GPUs per node does not divide {req.gpus} GPUs")
    fixed = [(n, v) for n, v in (("tp", req.tp), ("cp", req.cp), ("pp", req.pp), ("dp", req.dp)) if v is not None]
    if req.ep is not None and req.gpus % req.ep:
        raise OptionError("ep", f"ep {req.ep} does not divide {req.gpus} GPUs")
    product = math.prod(v for _, v in fixed)
    if fixed and req.gpus % product:
        degrees = " x ".join(f"{n} {v}" for n, v in fixed) + (f" = {product}" if len(fixed) > 1 else "")
        raise OptionError(fixed[0][0], f"{degrees} does not divide {req.gpus} GPUs")
    pairs = sorted({degrees_of(d) for d in tp_degrees})
    if req.tp is not None and req.tp not in {t for t, _, _ in pairs}:
        raise OptionError("tp", f"no profile of tensor-parallel degree {req.tp} was given (degrees: "
                          f"{', '.join(map(str, sorted({t for t, _, _ in pairs})))})")
    if req.cp is not None and req.cp not in {c for t, c, _ in pairs if req.tp is None or t == req.tp}:
        raise OptionError("cp", f"no profile of context-parallel degree {req.cp} was given (degrees: "
                          f"{', '.join(map(str, sorted({c for _, c, _ in pairs})))}: capture a rank at that degree)")
    if req.ep is not None and req.ep not in {e for _, _, e in pairs}:
        raise OptionError("ep", f"no profile of expert-parallel degree {req.ep} was given (degrees: "
                          f"{', '.join(map(str, sorted({e for _, _, e in pairs})))}: capture a rank at that degree)")
    if req.ep is not None and req.ep > 1 and req.zero not in (None, 0):
        raise OptionError("ep", f"expert parallelism is laid out under ZeRO 0 only (the experts' optimizer state is "
                          f"sharded over other ranks than the rest's), not ZeRO {req.zero}")
    layouts = enumerate_layouts(req, tp_degrees, layers)
    if not layouts:
        size = f"micro-batches of {req.micro_batch_size}" if req.micro_batch_size is not None else "micro-batches"
        raise OptionError("global_batch", f"no layout of {req.gpus} GPUs forms a global batch of {req.global_batch} "
                          f"from {size} (it must be micro-batch size x micro-batches x data-parallel ranks)")
    return layouts


# -- pricing one solved combination ----------------------------------------------------------------

def _recorded_layout(analysis: Analysis) -> ParallelLayout | None:
    layout = getattr(analysis.profile.info, "parallel_layout", None)
    if layout is None and analysis.source is not None:
        layout = getattr(analysis.source.info, "parallel_layout", None)
    return layout


def _tp_seconds(analysis: Analysis, node: NodeTopology, group: str = "tp") -> tuple[float, float]:
    """A rank's tensor-parallel collectives from its profile's recorded layout (none recorded:
    none priced): seconds per micro-batch, and seconds once per step (the optimizer's). With
    ``group="ep"`` its expert-parallel all-to-alls, on the links of ranks ``tp x cp`` apart (Megatron
    orders the ranks tp, cp, ep, dp, pp)."""
    layout = _recorded_layout(analysis)
    if layout is None:
        return 0.0, 0.0
    stride = 1 if group == "tp" else max(1, getattr(layout, "tensor_parallel", 1)) * \
        max(1, getattr(layout, "context_parallel", 1))
    per_mb = once = 0.0
    for c in layout.collectives:
        if getattr(c, "group", "tp") != group:      # (a record without groups: every collective TP's)
            continue
        kind = "all_reduce" if c.kind.startswith("all_reduce") else c.kind
        link = node.link(c.group_size, stride)
        t = ring_time(kind, c.bytes, c.group_size, link.bytes_per_s, link.latency_s)
        if c.phase == "optimizer":
            once += t
        else:
            per_mb += t
    return per_mb, once


def cp_seconds(analysis: Analysis, node: NodeTopology, target: Target) -> tuple[float, float, float]:
    """A rank's context-parallel ring exchange per micro-batch (its recorded ``cp`` collectives on
    the ring's link), the attention it overlaps (the attention kernels' forward and backward
    FLOPs at the target's peak: a lower bound on their time, so the exposure is not under-stated),
    and what is left exposed: ``max(0, exchange - attention)``. torch and Megatron start each key/
    value exchange before the attention of the blocks already held and wait for it only at the
    next block, so the exchange hides under the attention up to its length (docs/layouts.md); all of it
    on a node whose collectives take the compute's cores (``overlaps_compute``)."""
    layout = _recorded_layout(analysis)
    if layout is None or getattr(layout, "context_parallel", 1) <= 1:
        return 0.0, 0.0, 0.0
    comm = 0.0
    for c in layout.collectives:
        if c.group == "cp" and c.phase != "optimizer":
            link = node.link(c.group_size, max(1, layout.tensor_parallel))
            comm += ring_time(c.kind, c.bytes, c.group_size, link.bytes_per_s, link.latency_s)
    ops = analysis.profile.operations
    unit = target.seconds_per_unit(analysis.profile.compute_unit) or 0.0
    phase = np.asarray(ops.phase)
    names = ops.name
    attention = sum(float(ops.compute[i]) for i in range(len(phase)) if phase[i] != Phase.OPTIMIZER
                    and "scaled_dot_product" in names[i] and "attention" in names[i])
    attention *= unit
    # on a node whose collectives take the compute's own cores, nothing hides under the attention
    return comm, attention, max(0.0, comm - attention) if node.overlaps_compute else comm


def step_of(layout: Layout, plan: Plan, analysis: Analysis, req: LayoutRequest,
            params: Sequence[int] | np.ndarray) -> tuple[float, float, float, float]:
    """(step, pipeline step, tensor-parallel seconds, data-parallel seconds) of a solved plan:
    the pipeline's step lengthened by the tensor-parallel collectives and context parallelism's
    exposed ring exchange in proportion (each layer's work grows by the rank's collective time
    over its compute: exact for a stack of identical blocks), then the slowest stage's exposed
    data-parallel communication added (``step`` includes the context-parallel share,
    ``cp_share`` gives it alone)."""
    s = plan.schedule
    assert s is not None                       # a schedule solve's plan records its schedule
    compute = sum(f + b + w for f, b, w in s.chunk_times)
    tp_mb, tp_once = _tp_seconds(analysis, req.node)
    ep_mb = _tp_seconds(analysis, req.node, "ep")[0]
    cp_s = cp_share(plan, analysis, req)
    ratio = (tp_mb + ep_mb + cp_seconds(analysis, req.node, req.target)[2]) / compute if compute > 0 else 0.0
    pipeline = s.step_time
    tp_s = pipeline * (tp_mb / compute if compute > 0 else 0.0) + tp_once
    ep_s = pipeline * (ep_mb / compute if compute > 0 else 0.0)
    # the gradients' group: the dp x cp ranks tp apart (tp fastest, then cp, then dp, then pp, as
    # Megatron orders them)
    link = req.node.link(layout.sync, layout.tp)
    ranks = s.chunk_ranks
    worst = 0.0
    for r in range(layout.pp):
        chunks = [c for c, rank in enumerate(ranks) if rank == r]
        layer_params: list[int] = []
        for c in chunks:
            st = plan.stages[c]
            layer_params.extend(int(params[k]) for k in range(st.first_layer, st.last_layer + 1))
        fwd = sum(s.chunk_times[c][0] for c in chunks) * (1 + ratio)
        bwd = sum(s.chunk_times[c][1] + s.chunk_times[c][2] for c in chunks) * (1 + ratio)
        e = dp_exposed(layout.zero, layout.sync, layer_params, fwd, bwd, layout.micro_batches, link.bytes_per_s,
                       link.latency_s, req.reshard_after_forward, memory_bytes_per_s=req.target.memory_bytes_per_s or 0.0,
                       overlaps_compute=req.node.overlaps_compute)
        worst = max(worst, e.total)
    return pipeline + tp_s + cp_s + ep_s + worst, pipeline, tp_s, worst


def ep_share(plan: Plan, analysis: Analysis, req: LayoutRequest) -> float:
    """Expert parallelism's all-to-alls over the step: on every MoE layer's critical path (the
    experts wait for their tokens), the pipeline's step times their seconds per micro-batch over a
    micro-batch's compute, as the TP collectives."""
    s = plan.schedule
    assert s is not None
    compute = sum(f + b + w for f, b, w in s.chunk_times)
    return s.step_time * _tp_seconds(analysis, req.node, "ep")[0] / compute if compute > 0 else 0.0


def cp_share(plan: Plan, analysis: Analysis, req: LayoutRequest) -> float:
    """Context parallelism's exposed ring exchange over the step: the pipeline's step times the
    exposed seconds per micro-batch over a micro-batch's compute (as the TP collectives)."""
    s = plan.schedule
    assert s is not None
    compute = sum(f + b + w for f, b, w in s.chunk_times)
    exposed = cp_seconds(analysis, req.node, req.target)[2]
    return s.step_time * exposed / compute if compute > 0 else 0.0


def memory_floor(roles: Mapping[str, float], lay: Layout) -> float:
    """Bytes some rank holds all step at least: the profile's always-live bytes with parameters,
    gradients and optimizer state divided as ZeRO ``zero`` divides them across ``dp`` ranks
    (exactly: the real shares round up, and DDP adds its buckets), the rest whole, over ``pp``
    stages (the fullest holds at least the mean)."""
    sharded = float(zero_share(roles, lay.sync, lay.zero))
    rest = sum(v for k, v in roles.items() if k not in ("param", "grad", "state", "transient"))
    return (sharded + rest) / lay.pp


@dataclass(frozen=True)
class StageBytes:
    """What ``pipeline_memory_floor`` is made from, per layer of one rank's profile (unsharded): the
    always-live bytes only that layer uses, by role (model/datasharding.py's ``always_live_by_layer``);
    from its phase table at the captured micro-batch size (model/phases.py), one micro-batch's stash
    of every range and the most stash each layer's recompute can save (model/recompute.py, the best
    of its options), less the input it receives (the cut's bytes at that size); and the bytes
    crossing each cut forward and back at the combination's micro-batch size."""

    roles: Mapping[str, np.ndarray]
    #: (L, L) per range at the captured size: its stash less its received input and the most recompute saves
    stash: np.ndarray
    forward_cut: np.ndarray
    backward_cut: np.ndarray

    @classmethod
    def of(cls, analysis: Analysis, scaled: Analysis | None = None) -> StageBytes | None:
        """From the rank's analysis as captured, the cuts from ``scaled`` (the same rank at another
        micro-batch size) where given; None where the profile records no phases (no phase table:
        the floor is the mean's alone)."""
        from ..model.datasharding import always_live_by_layer
        from ..model.phases import cut_bytes
        if analysis.model.phase_cols is None:
            return None
        table = analysis.model.phase_table
        L = table.num_layers
        saved = table.recompute.saved.max(axis=0) if table.recompute is not None else np.zeros(L)
        saves = np.concatenate([[0.0], np.cumsum(np.asarray(saved, float))])
        first, last = np.arange(L)[:, None], np.arange(L)[None, :]
        received = np.where(first > 0, np.asarray(table.forward_cut, float)[:L][:, None], 0.0)
        stash = np.maximum(np.asarray(table.stash, float) - received - (saves[last + 1] - saves[first]), 0.0)
        forward, backward = (table.forward_cut, table.backward_cut) if scaled is None else cut_bytes(scaled.model)
        return cls(always_live_by_layer(analysis.profile, analysis.layers), np.where(last >= first, stash, 0.0),
                   np.asarray(forward, float), np.asarray(backward, float))


def pipeline_memory_floor(sb: StageBytes, lay: Layout, req: LayoutRequest) -> float:
    """Bytes the fullest rank holds at least under every split of ``lay``'s pipeline (one stage per
    rank: 1F1B, GPipe, ZB-H1; 0 otherwise): the least, over splits into ``pp`` stages, of the largest
    stage's floor. A stage ``a..b`` at position ``r`` holds its layers' always-live bytes (ZeRO's
    shares of parameters, gradients and optimizer state over the ``dp x cp`` ranks), torch's receive
    buffers, one per micro-batch, of the input it takes (``a > 0``) and of the gradient it is sent
    back (``b`` not last) (solver/chunk_problem.py's ``chunk_memory``), and, at its first backward,
    the stash of the micro-batches in flight besides the one running (``min(M, pp - r) - 1`` under
    1F1B, ``M - 1`` under GPipe, none counted under ZB-H1), each at least the range's stash less its
    received input and the most
    recompute saves. The receive buffers are the cuts at the combination's micro-batch size; the stash
    at another size is at least ``min(1, ratio)`` times the captured one (model/batchscale.py scales
    every activation by the ratio, rounding up). By dynamic programming over the stages' last layers."""
    schedule = req.schedule
    if lay.pp <= 1 or schedule == "auto" or traits(schedule).fixed_chunks_per_rank != 1:
        return 0.0
    L, M, d = len(sb.stash), lay.micro_batches, lay.sync
    if lay.pp > L:
        return 0.0
    r = min(1.0, float(Fraction(lay.micro_batch_size, req.captured_batch)))
    per_layer = zero_share(sb.roles, d, lay.zero) + sb.roles["other"]
    held = np.concatenate([[0.0], np.cumsum(per_layer)])
    first = np.arange(L)[:, None]
    last = np.arange(L)[None, :]
    received = np.where(first > 0, sb.forward_cut[:L][:, None], 0.0)
    sent_back = np.where(last < L - 1, sb.backward_cut[1:L + 1][None, :], 0.0)
    fixed = np.where(last >= first, held[last + 1] - held[first] + M * (received + sent_back), np.inf)
    stash = r * sb.stash

    def in_flight(position: int) -> int:
        return M if schedule == "gpipe" else min(M, lay.pp - position) if schedule == "1f1b" else 1
    best = fixed[0] + (in_flight(0) - 1) * stash[0]          # stage 0 from layer 0 to each last layer
    for position in range(1, lay.pp):
        cost = fixed[1:] + (in_flight(position) - 1) * stash[1:]          # (first layer a >= 1, last layer)
        best = np.min(np.maximum(best[:-1, None], cost), axis=0)     # a stage from a after a split to a - 1
    return float(best[L - 1]) * (1 - 1e-9)


def solve_request(lay: Layout, req: LayoutRequest, time_limit: float,
                  layer_compute: tuple[tuple[str, LayerFigure], ...] = (), layer_compute_source: str | None = None
                  ) -> SolveRequest:
    """The solve of one combination's split: ``pp`` stages on the target under the schedule, its
    micro-batches, one data-parallel rank's figures, the activations sent between stages over
    the link the pipeline's neighbours share (ranks ``tp * dp`` apart: inside a node only where
    the whole pipeline is); ``layer_compute``: the rank's measured per-layer compute
    (``rank_layer_compute``), applied as ``solve``'s own ``layer_compute`` is (plan/engine.py). One
    stage under ``auto`` is solved under 1F1B: on one device every schedule runs each micro-batch's
    forward and backward in turn in the same time, and 1F1B holds the fewest micro-batches in flight
    (one), so no other schedule is faster or fits where it does not."""
    schedule = Schedule.ONE_F_ONE_B if req.schedule == "auto" and lay.pp == 1 else Schedule(req.schedule)
    return SolveRequest(devices=lay.pp, targets=(req.target,), schedule=schedule,
                        micro_batches=lay.micro_batches, dp=lay.sync, zero=lay.zero,
                        reshard_after_forward=req.reshard_after_forward, exact=True, communication=lay.pp > 1,
                        link_bandwidth=req.node.link(lay.pp, lay.tp * lay.cp * lay.dp).bytes_per_s,
                        time_limit=max(time_limit, 1e-3), runtime_reserve=req.runtime_reserve,
                        layer_compute=layer_compute, layer_compute_source=layer_compute_source,
                        chunks_per_rank=req.chunks_per_rank if lay.pp > 1 else None)


# -- measured per-layer compute --------------------------------------------------------------------

def measured_for(req: LayoutRequest, key: Degree) -> Measured | None:
    """The measured figures a rank of ``key`` takes its layers' compute from: those given for its
    tensor-parallel degree, else degree 1's (None: none given, or none that apply)."""
    given = {m[0]: m for m in req.layer_compute}
    return given.get(degrees_of(key)[0]) or given.get(1)


def _layer_figures(analysis: Analysis) -> dict[str, float]:
    return dict(zip(analysis.layers.names, np.nan_to_num(np.asarray(analysis.model.layer_compute, float)).tolist()))


def rank_layer_compute(measured: Measured, rank: Analysis, reference: Analysis) -> tuple[tuple[str, LayerFigure], ...]:
    """One combination's rank's per-layer compute from figures measured on another rank (docs/layouts.md,
    "Measured per-layer compute"): each layer's measured figure times the rank's captured compute of
    that layer over the captured compute of the rank the figures were measured on (``reference``:
    the profile of that tensor-parallel degree, at the captured micro-batch size, unsharded). So a
    tensor-parallel rank takes its share of the layer as its capture divides the work (replicated
    norms whole, sharded matrix products a ``1/tp`` part), a context-parallel rank its share of the
    sequence, another micro-batch size its scaled forward and backward (the optimizer's step kept:
    model/batchscale.py); the rank the figures were measured on takes them unchanged. Data-parallel
    sharding does not change an operation's compute (model/datasharding.py), so a ZeRO rank takes
    them as ``solve`` with ``dp`` and ``zero`` does. A layer its reference captured with no compute keeps the
    figure. A figure given by phase scales phase by phase: its forward by the captured forwards' ratio, and so
    on (the optimizer's part kept at another micro-batch size, as its operations are)."""
    own, ref = _layer_figures(rank), _layer_figures(reference)
    own_phases, ref_phases = _phase_figures(rank), _phase_figures(reference)

    def scaled(name: str, value: LayerFigure) -> LayerFigure:
        parts = figure_phases(value)
        if parts is None:
            return figure_total(value) * (own[name] / ref[name]) if ref[name] > 0 else value
        index = rank.layers.names.index(name), reference.layers.names.index(name)
        f, b, o = (part * _ratio(own_phases[:, index[0], k], ref_phases[:, index[1], k]) for k, part in enumerate(parts))
        return f, b, o
    return tuple((name, scaled(name, value)) for name, value in measured[1])


def _ratio(own: np.ndarray, ref: np.ndarray) -> float:
    """A phase's work on one rank over another's: by compute where the reference counts any, else by
    the bytes its operations move (an optimizer step counts no FLOPs), else 1."""
    for mine, theirs in zip(own, ref):
        if theirs > 0:
            return float(mine / theirs)
    return 1.0


def _phase_figures(analysis: Analysis) -> np.ndarray:
    """(2, L, 3): each layer's captured compute, then bytes accessed, by a figure's phases (forward,
    backward, optimizer)."""
    from ..model.figurephases import figure_phase_of
    ops = analysis.profile.operations
    layer = np.asarray(analysis.layers.op_layer)
    phase = figure_phase_of(np.asarray(ops.phase))
    keep = (layer >= 0) & (phase >= 0)
    table = np.zeros((2, analysis.layers.num_layers, 3))
    for row, values in enumerate((analysis.model.op_compute, ops.bytes_accessed)):
        np.add.at(table[row], (layer[keep], phase[keep]), np.nan_to_num(np.asarray(values, float))[keep])
    return table


def _check_measured(req: LayoutRequest, base: Mapping[Degree, Analysis], layouts: Sequence[Layout]) -> None:
    """Measured figures that no rank can take, refused in one line before anything is solved: a
    degree given no profile, a rank of a degree with no figures of its own and none of degree 1,
    a layer name a rank does not have."""
    if not req.layer_compute:
        return
    for degree, _, _ in req.layer_compute:
        if degree not in base:
            name = "layer_compute" if degree == 1 else "tp_layer_compute"
            raise OptionError(name, f"measured compute is given for tensor-parallel degree {degree}, but no rank of "
                              f"that degree was given (degrees: {', '.join(str(d) for d in base if isinstance(d, int))})")
    for key in sorted({key_of(lay) for lay in layouts}, key=degrees_of):
        measured = measured_for(req, key)
        if measured is None:
            raise OptionError("layer_compute", f"measured compute is given for tensor-parallel degree(s) "
                              f"{', '.join(str(m[0]) for m in req.layer_compute)} only: a rank of degree "
                              f"{degrees_of(key)[0]} takes its own degree's figures or degree 1's, scaled by its "
                              "capture (give degree 1's, or fix `tp`)")
        for analysis in (base[measured[0]], base[key]):
            names = set(analysis.layers.names)
            unknown = next((name for name, _ in measured[1] if name not in names), None)
            if unknown is not None:
                known = analysis.layers.names
                shown = ", ".join(known[:6]) + (f", ... ({len(known)} layers)" if len(known) > 6 else "")
                where = measured[2] or ("layer_compute" if measured[0] == 1 else f"tp_layer_compute[{measured[0]}]")
                tp, cp, ep = degrees_of(key if analysis is base[key] else measured[0])
                rank = f"tensor-parallel degree {tp}" + (f", context-parallel {cp}" if cp > 1 else "") + \
                    (f", expert-parallel {ep}" if ep > 1 else "")
                raise OptionError("layer_compute" if measured[0] == 1 else "tp_layer_compute",
                                  f"{where}: no layer named '{unknown}' in the rank of {rank} (layers: {shown})")


def _measured_work(req: LayoutRequest, key: Degree, base: Mapping[Degree, Analysis], ratio: Fraction,
                   unit: float) -> float:
    """A lower bound on a rank's forward and backward seconds per micro-batch at ``ratio`` x the
    captured size where measured figures replace some layers' compute: the other layers' captured
    compute at the peak, as without figures, and each replaced layer's figure (``rank_layer_compute``
    at that size) times the share of it the model gives the forward and backward (phases are given
    a layer's time in proportion to their operations' roofline seconds: model/phases.py), the share
    bounded below at another size (every operation's forward and backward seconds grow at least
    ``min(1, ratio)`` times, the optimizer's stay)."""
    from ..model.roofline import operation_times
    measured = measured_for(req, key)
    a = base[key]
    ops = a.profile.operations
    layer = np.asarray(a.layers.op_layer)
    phase = np.asarray(ops.phase)
    compute = np.nan_to_num(np.asarray(ops.compute, float))
    L = a.layers.num_layers
    names = a.layers.names
    r = float(ratio)
    inside = layer >= 0
    step = inside & (phase != Phase.OPTIMIZER)
    per_layer_step = np.bincount(layer[step], weights=compute[step], minlength=L)[:L]
    per_layer_opt = np.bincount(layer[inside & ~step], weights=compute[inside & ~step], minlength=L)[:L]
    if measured is None:
        return float(per_layer_step.sum()) * r * unit
    ref = _layer_figures(base[measured[0]])
    times = operation_times(a.profile, a.model.op_compute, req.target, 1.0)
    seconds = np.maximum(*times) if times is not None else compute * unit
    fb = inside & np.isin(phase, (Phase.FORWARD, Phase.BACKWARD_INPUT, Phase.BACKWARD_WEIGHT, Phase.RECOMPUTE))
    s_fb = np.bincount(layer[fb], weights=seconds[fb], minlength=L)[:L]
    opt = inside & (phase == Phase.OPTIMIZER)
    s_opt = np.bincount(layer[opt], weights=seconds[opt], minlength=L)[:L]
    given = dict(measured[1])
    rank_figures = dict(rank_layer_compute(measured, a, base[measured[0]]))
    total = 0.0
    for i, name in enumerate(names):
        if name not in given:
            total += per_layer_step[i] * r * unit
            continue
        parts = figure_phases(given[name])
        if parts is not None:             # its forward and backward, as the rank takes them (at least min(1, r) x)
            f, b, _ = figure_phases(rank_figures[name]) or parts
            total += (f + b) * min(1.0, r) * unit
            continue
        own = per_layer_step[i] * r + per_layer_opt[i]
        figure = figure_total(given[name]) * (own / ref[name]) if ref[name] > 0 else figure_total(given[name])
        low = min(1.0, r) * s_fb[i]
        share = low / (low + s_opt[i]) if low + s_opt[i] > 0 else 0.0
        total += figure * unit * share
    return total


# -- the step floor: what no split of a combination runs faster than ------------------------------

@dataclass(frozen=True)
class RankWork:
    """What one rank's step floor is made from, at the captured micro-batch size: each layered
    operation's compute and memory seconds on the target (the roofline's two terms) for those that
    run once per micro-batch (forward, backward, recompute), the optimizer's seconds (once per step),
    the tensor- and expert-parallel collectives per micro-batch and once per step, context
    parallelism's ring exchange and the attention it hides under, and each layer's parameter bytes."""

    compute_s: np.ndarray
    memory_s: np.ndarray
    optimizer_s: float
    collectives_s: float
    collectives_once_s: float
    cp_exchange_s: float
    cp_attention_s: float
    params: np.ndarray
    #: the layer of each operation of ``compute_s`` and ``memory_s`` (``layer_work`` sums them by it)
    op_layer: np.ndarray | None = None

    @classmethod
    def of(cls, analysis: Analysis, req: LayoutRequest) -> RankWork:
        from ..model.roofline import operation_times
        a, target = analysis, req.target
        times = operation_times(a.profile, a.model.op_compute, target)
        if times is None or target.seconds_per_unit(a.profile.compute_unit) is None:
            raise OptionError("target", f"{target.name} cannot time compute in {a.profile.compute_unit}: "
                              "give a GPU target with flops_per_s and a profile whose compute is in FLOPs")
        compute, memory = times
        phase = np.asarray(a.profile.operations.phase)
        layered = np.asarray(a.layers.op_layer) >= 0
        per_mb = layered & np.isin(phase, (Phase.FORWARD, Phase.BACKWARD_INPUT, Phase.BACKWARD_WEIGHT,
                                           Phase.RECOMPUTE))
        optimizer = layered & (phase == Phase.OPTIMIZER)
        tp_mb, tp_once = _tp_seconds(a, req.node)
        exchange, attention, _ = cp_seconds(a, req.node, target)
        return cls(compute[per_mb], memory[per_mb], float(np.maximum(compute, memory)[optimizer].sum()),
                   tp_mb + _tp_seconds(a, req.node, "ep")[0], tp_once, exchange, attention,
                   parameter_bytes_by_layer(a.profile, a.layers)[0], np.asarray(a.layers.op_layer)[per_mb])

    def _op_seconds(self, ratio: float) -> np.ndarray:
        """Each operation's seconds of one micro-batch at ``ratio`` times the captured size, at least
        (``per_micro_batch`` says why)."""
        r = float(ratio)
        seconds: np.ndarray = np.maximum(r * self.compute_s, self.memory_s) if r >= 1 else \
            r * np.maximum(self.compute_s, self.memory_s)
        return seconds

    def layer_work(self, ratio: float) -> np.ndarray:
        """Each layer's work of one micro-batch at ``ratio`` times the captured size, as
        ``per_micro_batch`` bounds it (its work is their sum)."""
        seconds = self._op_seconds(ratio)
        if self.op_layer is None or not len(seconds):
            return np.array([float(seconds.sum())])
        return np.bincount(self.op_layer, weights=seconds, minlength=len(self.params))

    def per_micro_batch(self, ratio: float) -> tuple[float, float]:
        """(work, communication) of one micro-batch at ``ratio`` times the captured size, each at most
        what the rank's profile scaled to that size (model/batchscale.py) gives: an operation's FLOPs
        scale by the ratio and the bytes it moves never grow less than the ratio below the captured
        size, nor shrink above it; a collective's bytes scale as the FLOPs, and a ring's time is
        affine in them; the ring exchange's exposed part is what the attention (x the ratio) leaves."""
        r = float(ratio)
        if r >= 1:
            comm = self.collectives_s + max(0.0, self.cp_exchange_s - r * self.cp_attention_s)
        else:
            comm = r * (self.collectives_s + max(0.0, self.cp_exchange_s - self.cp_attention_s))
        return float(self._op_seconds(r).sum()), comm


def bubble_factor(schedule: str, stages: int, micro_batches: int) -> float:
    """What the pipeline step is at least, over one micro-batch's work on all stages, by the
    schedule's dependencies alone: ``M / pp`` for any schedule (the stages share M x the work);
    for one stage per rank with an unsplit backward (1F1B, GPipe) ``1 / (1 - (1 - 1/M)^pp)``: rank
    ``r`` starts once the first micro-batch's forward has crossed the stages before it and, after its
    last backward, the last micro-batch's backward crosses them again, so the step is at least
    ``M w_r + (w_0 + ... + w_{r-1})`` for every ``r``; the stage works ``w`` that make these equal
    (the fastest any split can be) give that factor (``M + pp - 1`` over ``pp`` for equal stages)."""
    mean = micro_batches / stages
    if schedule == "auto" or stages <= 1:
        return mean
    t = traits(schedule)
    if t.fixed_chunks_per_rank != 1 or t.splits_backward:
        return mean
    if micro_batches <= 1:                     # one micro-batch crosses every stage in turn
        return 1.0
    return max(mean, 1.0 / -math.expm1(stages * math.log1p(-1.0 / micro_batches)))


def step_floor(work: RankWork, lay: Layout, req: LayoutRequest, measured: float | None = None
               ) -> tuple[float, float]:
    """(floor, added): no split of ``lay`` has a step under ``floor``, and the step adds at least
    ``added`` to its pipeline step (the engine's cutoff: ``best - added``). The step is the pipeline
    step ``T`` lengthened by the collectives in proportion to compute (``T x (1 + X / K)``, ``K`` one
    micro-batch's work on all stages, recompute included), plus those once per step and the slowest
    stage's exposed data-parallel communication (``step_of``); ``T`` is at least ``bubble_factor x K``
    and ``(M K + optimizer) / pp``, so the step is at least the larger of ``bubble_factor x (K + X)``
    and ``(M (K + X) + optimizer) / pp``, ``K`` and ``X`` at least ``RankWork.per_micro_batch``'s; with
    one stage per rank (1F1B, GPipe, ZB-H1), ``T`` is also at least ``M`` times the slowest stage's work,
    which no split into ``pp`` stages brings under ``slowest_stage`` of the layers' (most binding where
    the layers do not divide evenly: 80 layers on 64 stages leave some stage two). The
    data-parallel floor: ZeRO 1 and 2 gather the stage's parameters after the optimizer step (some
    stage holds ``1/pp`` of them), ZeRO 3 gathers each micro-batch's first layer in the forward (and
    in the backward where it reshards) in full (model/communication.py's ``dp_exposed``). ``measured``:
    where measured per-layer compute replaces the roofline's, a lower bound on the forward and
    backward per micro-batch from it (``_measured_work``; the optimizer's time then counts nothing)."""
    ratio = float(Fraction(lay.micro_batch_size, req.captured_batch))
    k, x = work.per_micro_batch(ratio)
    optimizer = work.optimizer_s
    if measured is not None:
        k, optimizer = measured, 0.0
    factor = bubble_factor(req.schedule, lay.pp, lay.micro_batches)
    floor = max(factor * (k + x), (lay.micro_batches * (k + x) + optimizer) / lay.pp)
    if measured is None and k > 0 and req.schedule != "auto" and traits(req.schedule).fixed_chunks_per_rank == 1:
        # one stage per rank: the rank of the slowest stage runs its layers for every micro-batch, and no
        # split into pp stages has a slowest stage under ``slowest_stage``'s (the collectives in proportion)
        floor = max(floor, lay.micro_batches * slowest_stage(work.layer_work(ratio), lay.pp) * (k + x) / k)
    dp = dp_floor(work, lay, req)
    added = factor * x + work.collectives_once_s + dp
    return floor + work.collectives_once_s + dp, added


def search_order(layouts: Sequence[Layout], estimates: Mapping[Layout, float], schedules: Sequence[str]
                 ) -> list[Layout]:
    """The order the layout search takes ``layouts`` up in: the likeliest best first (the lowest
    ``estimates``, ``order_estimate``'s), so that the best step found early cuts off the rest and the time
    limit leaves the hopeless ones unsearched. Each schedule of the list in turn (one stage counts as
    the first's), so that a list never finds less than its first schedule would alone in the time
    that schedule takes: a looped schedule's combinations cost seconds each to solve and, searched
    among the first's, left the 70B at 512 GPUs at 15.0 s where 1F1B alone reaches 14.7 s. Within a
    schedule, each family of degrees and ZeRO stage by its lowest estimate (a larger micro-batch's,
    whose work runs nearer the peak), its sizes smallest first (the one likeliest to fit: a
    micro-batch's activations grow with its size), then by estimate (a looped schedule's chunk counts)."""
    def turn(lay: Layout) -> int:
        return schedules.index(lay.schedule) if lay.schedule in schedules else 0

    def family(lay: Layout) -> tuple[int, ...]:
        return turn(lay), lay.tp, lay.cp, lay.ep, lay.pp, lay.dp, lay.zero
    lead: dict[tuple[int, ...], float] = {}
    for lay in layouts:
        lead[family(lay)] = min(lead.get(family(lay), math.inf), estimates[lay])
    return sorted(layouts, key=lambda lay: (turn(lay), lead[family(lay)], family(lay), lay.micro_batch_size,
                                            estimates[lay], lay))


def order_estimate(lay: Layout, floor: float, k: float, x: float, stash: float, saved: float, always: float,
                   capacity: float) -> float:
    """Where the layout search takes ``lay`` up, the likeliest fastest first: an estimate of its step,
    not a bound. ``floor`` is its step floor (``step_floor``); ``k`` and ``x`` one micro-batch's work
    and collectives on all stages; ``stash`` one micro-batch's activations kept for the backward (all
    layers) and ``saved`` the most recompute can save of them; ``always`` the mean always-live bytes
    of a stage (``memory_floor``), ``capacity`` the device's. Two terms the floor leaves out:

    * the bubble of a schedule of ``v`` chunks per device (whose floor counts none): with as many
      micro-batches as stages, ``(pp - 1) / v`` chunks' work of one micro-batch on each rank,
      ``(pp - 1) / (v pp) (k + x)`` (Megatron's interleaved schedule's); with fewer, each loop's ranks
      wait as one pass does, 1F1B's ``(pp - 1) / pp (k + x)``;
    * the recompute memory forces: a stage holds ``stash / pp`` for each micro-batch in flight
      (``min(M, pp)``, times ``1 + (pp - 1) / (pp v)`` with ``v`` chunks, Megatron's interleaved
      count) beside ``always``; what exceeds ``capacity`` is recomputed, a share of what recompute
      can save at most 1, and that share of the stage's forwards (a third of its work) runs again:
      ``share x M k / (3 pp)``."""
    pp, M = lay.pp, lay.micro_batches
    v = lay.chunks_per_rank if lay.schedule and pp > 1 else 1
    estimate = floor
    if v > 1:
        estimate += (pp - 1) / (v * pp if M >= pp else pp) * (k + x)
    in_flight = min(M, pp) * (1 + (pp - 1) / (pp * v) if v > 1 else 1)
    need = stash / pp * in_flight - (capacity - always)
    if need > 0:
        share = min(1.0, need / (saved / pp * in_flight)) if saved > 0 else 1.0
        estimate += share * M * k / 3 / pp
    return estimate


def slowest_stage(work: np.ndarray, stages: int) -> float:
    """The least work of the slowest stage over every split of the layers (``work``, in order) into
    at most ``stages`` contiguous stages, a little under (a lower bound, safe from rounding): the
    smallest sum of consecutive layers such that splits at most that heavy need at most ``stages``
    stages, by bisection over those sums (each tried greedily, every stage as long as it fits)."""
    w = np.asarray(work, float)
    L = len(w)
    if L == 0 or stages <= 0:
        return 0.0
    if stages >= L:
        return float(w.max()) * (1 - 1e-9)
    prefix = np.concatenate([[0.0], np.cumsum(w)])

    def stages_needed(cap: float) -> int:
        count, start = 0, 0
        while start < L and count <= stages:
            end = int(np.searchsorted(prefix, prefix[start] + cap * (1 + 1e-12), side="right")) - 1
            start, count = max(end, start + 1), count + 1
        return count
    sums = prefix[None, :] - prefix[:, None]
    candidates = np.unique(sums[np.triu_indices(L + 1, 1)])
    candidates = candidates[candidates >= w.max()]
    lo, hi = 0, len(candidates) - 1                 # the whole stack in one stage always fits
    while lo < hi:
        mid = (lo + hi) // 2
        if stages_needed(float(candidates[mid])) <= stages:
            hi = mid
        else:
            lo = mid + 1
    return float(candidates[lo]) * (1 - 1e-9)


def dp_floor(work: RankWork, lay: Layout, req: LayoutRequest) -> float:
    """Seconds of data-parallel communication no split of ``lay`` exposes less than (``step_of``'s
    slowest stage's, model/communication.py's ``dp_exposed``): some rank holds at least ``P``, ``1/pp``
    of the parameter bytes, and what grows with a rank's bytes is counted at ``P``. ZeRO 0 and 1-2:
    DDP's bucket copies (``4 P`` at the device's memory rate, ZeRO 0) and the all-gather of ``P`` after
    the optimizer step (1-2); the gradients' all-reduce or reduce-scatter whole where the node's
    collectives hide under nothing, else at least its last bucket's, of at least one byte (a bucket's
    size does not grow with the rank's bytes, unless every byte fits DDP's first). ZeRO 3: each micro-batch's first layer gathered in full
    in the forward (and in the backward where it reshards), at the fewest bytes a layer holds."""
    from ..model.communication import all_gather
    if lay.sync <= 1 or not len(work.params):
        return 0.0
    link = req.node.link(lay.sync, lay.tp)
    share = float(work.params.sum()) / lay.pp
    if lay.zero == 3:
        gathers = 2 if req.reshard_after_forward else 1
        return lay.micro_batches * gathers * all_gather(float(work.params.min()), lay.sync, link.bytes_per_s,
                                                        link.latency_s)
    kind = "all_reduce" if lay.zero == 0 else "reduce_scatter"
    # the last bucket: a rank's whole bytes while they fit DDP's first bucket, else as little as a byte
    last = share if float(work.params.sum()) <= DDP_FIRST_BUCKET_BYTES else min(share, 1.0)
    synced = ring_time(kind, share if not req.node.overlaps_compute else last, lay.sync, link.bytes_per_s,
                       link.latency_s)
    if lay.zero == 0:
        rate = req.target.memory_bytes_per_s or 0.0
        return synced + (4 * share / rate if rate > 0 else 0.0)
    return synced + all_gather(share, lay.sync, link.bytes_per_s, link.latency_s)


# -- the search ------------------------------------------------------------------------------------

#: builds a rank's analysis for a rank's degrees (tp, or (tp, cp), or (tp, cp, ep)), a data layout
#: and a micro-batch size (as a ratio to the captured one: model/batchscale.py); the API reads,
#: scales and shards
Analyze = Callable[[Degree, DataLayout, Fraction], Analysis]


def search(analyze: Analyze, tp_degrees: Sequence[Degree], req: LayoutRequest, deadline: Deadline,
           events: Events) -> LayoutPlan:
    """The fastest layout that fits every rank (module docstring), every combination's row."""
    from . import engine
    from .scheduled import advise_schedule, check_chunk_count
    base = {tp: analyze(tp, DataLayout(), Fraction(1)) for tp in tp_degrees}
    layers = min(a.layers.num_layers for a in base.values())
    layouts = check_request(req, tp_degrees, layers)

    def ratio(lay: Layout) -> Fraction:
        return Fraction(lay.micro_batch_size, req.captured_batch)
    params = {tp: parameter_bytes_by_layer(a.profile, a.layers) for tp, a in base.items()}
    flops = req.target.flops_per_s
    _check_measured(req, base, layouts)
    work = {tp: RankWork.of(a, req) for tp, a in base.items()}
    measured_work: dict[tuple[Degree, Fraction], float] = {}

    def measured(lay: Layout) -> float | None:
        """With measured per-layer compute, a rank's forward and backward per micro-batch from those
        figures (``_measured_work``), else None (the roofline's)."""
        key, r = key_of(lay), ratio(lay)
        if not req.layer_compute:
            return None
        if (key, r) not in measured_work:
            unit = req.target.seconds_per_unit(base[key].profile.compute_unit) or 0.0
            measured_work[key, r] = _measured_work(req, key, base, r, unit)
        return measured_work[key, r]
    item_requests: dict[tuple[str, int], LayoutRequest] = {}

    def request_of(lay: Layout) -> LayoutRequest:
        """The request ``lay`` is bounded and solved under (its own schedule where it has one)."""
        key = (lay.schedule, lay.chunks_per_rank)
        if key not in item_requests:
            item_requests[key] = req.for_layout(lay)
        return item_requests[key]
    floors = {lay: step_floor(work[key_of(lay)], lay, request_of(lay), measured(lay)) for lay in layouts}

    def floor(lay: Layout) -> float:
        """No split of ``lay`` steps faster (``step_floor``)."""
        return floors[lay][0]

    roles = {tp: role_bytes(a.profile) for tp, a in base.items()}
    capacity = req.target.device_bytes
    activations: dict[Degree, tuple[float, float] | None] = {}

    def estimate(lay: Layout) -> float:
        """The order the items are searched in (``order_estimate``), not a bound."""
        key = key_of(lay)
        if key not in activations:           # one micro-batch's stash, and the most recompute saves
            model = base[key].model
            if model.phase_cols is None:
                activations[key] = None
            else:
                table = model.phase_table
                saved = float(table.recompute.saved.max(axis=0).sum()) if table.recompute is not None else 0.0
                activations[key] = (float(np.asarray(table.stash)[0, table.num_layers - 1]), saved)
        r = float(ratio(lay))
        k, x = work[key].per_micro_batch(r)
        found = activations[key]
        always = memory_floor(dict(roles[key], other=roles[key]["other"] * min(1.0, r)), lay)
        return order_estimate(lay, floor(lay), k, x, found[0] * r if found else 0.0, found[1] * r if found else 0.0,
                              always, capacity)
    order = search_order(layouts, {lay: estimate(lay) for lay in layouts}, req.schedules)
    rows: dict[Layout, LayoutRow] = {}
    stage_bytes: dict[tuple[Degree, Fraction], StageBytes | None] = {}
    for lay in order:                    # the memory floor: refuted before anything is solved
        # at another micro-batch size only the activations (role other) change: at most x the
        # ratio smaller (model/batchscale.py), never smaller when the size grows
        key = key_of(lay)
        at = dict(roles[key], other=roles[key]["other"] * min(1.0, float(ratio(lay))))
        need = memory_floor(at, lay)
        if need > capacity:
            rows[lay] = LayoutRow(lay, "memory", f"memory floor: {need / 2**30:.1f} GiB always live per rank > "
                                  f"{capacity / 2**30:.1f} GiB", capacity=capacity, proven=True)
            continue
        # torch's rules for the schedule (1F1B: micro-batches >= stages...), as the engine would refuse
        # it after the combination's preparation: refused before it, in the engine's words
        item = request_of(lay)
        fixed = traits(item.schedule).fixed_chunks_per_rank if item.schedule != "auto" else None
        if item.schedule != "auto" and lay.pp > 1:
            chunks = solve_request(lay, item, 1.0).resolved_chunks()
            try:
                check_schedule(item.schedule, lay.pp, lay.micro_batches, chunks)
                check_chunk_count(item.schedule, chunks, lay.pp, base[key].layers.num_layers)
            except StagesplitError as exc:
                rows[lay] = LayoutRow(lay, "refused", str(exc), capacity=capacity, proven=True)
                continue
        if lay.pp > 1 and fixed == 1:        # the fullest stage of any split, activations in flight included
            if (key, ratio(lay)) not in stage_bytes:      # the receive buffers at the combination's size
                scaled = analyze(key, DataLayout(), ratio(lay)) if ratio(lay) != 1 else None
                stage_bytes[key, ratio(lay)] = StageBytes.of(base[key], scaled)
            found = stage_bytes[key, ratio(lay)]
            need = pipeline_memory_floor(found, lay, item) if found is not None else 0.0
            if need > capacity:
                rows[lay] = LayoutRow(lay, "memory", f"memory floor: {need / 2**30:.1f} GiB on some rank of every "
                                      f"split (always live, receive buffers, micro-batches in flight) > "
                                      f"{capacity / 2**30:.1f} GiB", capacity=capacity, proven=True)
    range_floors: dict[tuple[Degree, Fraction], RangeFloors | None] = {}
    tables = {"longest": 0.0}          # the longest a table took to make (seconds)

    def item_floors(lay: Layout, build: bool = True) -> tuple[float, float] | None:
        """(bytes, step) no split of ``lay`` gets under, recompute included (plan/pipeline_floor.py): a
        schedule whose backward is whole, its chunks looped over the ranks (1F1B, GPipe, interleaved 1F1B,
        looped BFS), the step where the roofline times the layers (else 0); from the rank's phase table at
        the combination's micro-batch size, made once per size."""
        item = request_of(lay)
        if not bounded(item.schedule) or lay.pp == 1 and item.schedule not in ("1f1b", "gpipe"):
            return None
        chunks = solve_request(lay, item, 1.0).resolved_chunks() if lay.pp > 1 else 1
        if lay.pp * chunks > layers:
            return None
        key, r = key_of(lay), ratio(lay)
        if (key, r) not in range_floors and not build and deadline.left() <= 2 * tables["longest"]:
            return None
        if (key, r) not in range_floors:
            started = time.monotonic()
            range_floors[key, r] = RangeFloors.of(base[key] if r == 1 else analyze(key, DataLayout(), r), req.target)
            tables["longest"] = max(tables["longest"], time.monotonic() - started)
        found = range_floors[key, r]
        if found is None:
            return None
        timed = measured(lay) is None
        rank = work[key]
        need, slowest, recompute = pipeline_floors(found, schedule=item.schedule, stages=lay.pp,
                                                   micro_batches=lay.micro_batches, dp=lay.sync, zero=lay.zero,
                                                   capacity=capacity, layer_work=rank.layer_work(float(r)) if timed
                                                   else None, chunks_per_rank=chunks)
        if not timed or not math.isfinite(slowest) or not slowest:
            return need, 0.0
        # as ``step_floor``'s three bounds, one micro-batch's work grown by the least recompute its
        # stages' memory forces (the slowest stage's, or all stages' together), the collectives in
        # proportion (at least M x / pp of them where the slowest stage bounds the step); where a rank
        # holds several chunks, the slowest chunk's work M times (its rank's other chunks only add)
        k, x = rank.per_micro_batch(float(r))
        M = lay.micro_batches
        if chunks > 1:
            # the recompute the ranks' whole memory forces, summed over them (``busy_floor``): where a rank
            # holds several chunks, more than each chunk's alone
            busy = busy_floor(found, schedule=item.schedule, stages=lay.pp, micro_batches=M, dp=lay.sync,
                              zero=lay.zero, capacity=capacity, layer_work=rank.layer_work(float(r)),
                              chunks_per_rank=chunks)
            recompute = max(recompute, busy / M - k)
        share = x / lay.pp if chunks == 1 else 0.0
        pipeline = max(M * (slowest + share), bubble_factor(item.schedule, lay.pp, M) * (k + recompute + x),
                       (M * (k + recompute + x) + rank.optimizer_s) / lay.pp)
        return need, pipeline + rank.collectives_once_s + dp_floor(rank, lay, item)
    plans: dict[Layout, tuple[Plan, Analysis]] = {}
    last_rank: tuple[tuple[Degree, DataLayout, Fraction], Analysis] | None = None
    best: float = math.inf
    prep = 0.0                         # the longest preparation of a combination so far (seconds)
    # the end of the time limit is kept for the pipeline floors of the combinations no solve reached (a
    # looped schedule's, searched last: milliseconds each where their micro-batch size's table is made)
    tail = min(TAIL_SHARE * req.time_limit, TAIL_PER_ITEM_S * len(order))
    events.start("searching the layouts", "combinations")
    for i, lay in enumerate(order):
        events.update(i, len(order))
        if lay in rows:
            continue
        f = floor(lay)
        if f >= best:
            # the best so far, not the search's answer: a later combination may be faster still
            rows[lay] = LayoutRow(lay, "cut off", f"step floor {seconds(f)} >= {seconds(best)}, the best step found "
                                  "before it", capacity=capacity, proven=True)
            continue
        # the pipeline floors next (a phase table per micro-batch size, then arrays: far less than a solve);
        # in the time kept for them, a table is made only where twice the longest so far is left
        solving = deadline.left() > prep + tail
        settled = _pipeline_floor_row(lay, item_floors(lay, build=solving), f, best, capacity) \
            if deadline.left() > 0 else None
        if settled is not None:
            rows[lay] = settled
            continue
        # a combination is started only where the time left, less the floors' tail, covers its
        # preparation (the rank's profile sharded, its phase table: seconds on a 70B profile, outside
        # CP-SAT's deadline) as long as the longest so far took
        if not solving:
            rows[lay] = LayoutRow(lay, "unknown", "the time limit was reached before it was searched",
                                  capacity=capacity)
            continue
        started = time.monotonic()
        # the time left shared by the combinations left at this micro-batch size, each larger size
        # counting as one more (the smallest size, searched first, is the one that must be settled)
        left = [x for x in order[i:] if x not in rows]
        same = sum(1 for x in left if x.micro_batch_size == lay.micro_batch_size)
        later = len({x.micro_batch_size for x in left if x.micro_batch_size > lay.micro_batch_size})
        available = deadline.left() - tail
        share = max(available / max(1, same + later), min(available, 1.0))
        if not math.isfinite(best):        # until a layout is found (no cutoff yet), a quarter of what is left
            share = max(share, available / 4)
        # the items of one combination (its schedules) share its rank, made once
        made = (key_of(lay), DataLayout(lay.sync, lay.zero, req.reshard_after_forward), ratio(lay))
        if last_rank is None or last_rank[0] != made:
            last_rank = None                   # (the one before freed first: a 405B rank is large)
            last_rank = (made, analyze(*made))
        analysis = last_rank[1]
        measured_compute = measured_for(req, key_of(lay))
        request = solve_request(lay, request_of(lay), share) if measured_compute is None else \
            solve_request(lay, request_of(lay), share,
                          rank_layer_compute(measured_compute, analysis, base[measured_compute[0]]),
                          measured_compute[2])
        # a split whose pipeline step reaches best - (what the step adds to it at least: step_floor's
        # "added") cannot win; the engine proves that no split is faster than the cutoff
        cutoff = best - floors[lay][1] if math.isfinite(best) else None
        try:
            resolved = engine.resolve(request, analysis)
            if request.schedule is not Schedule.AUTO and not engine.scheduled(request, resolved.model):
                raise OptionError("profile", "the layout search needs a profile of one GPU that records each "
                                  "operation's phase (as stagesplit capture writes)")
            table = resolved.model.phase_table
            prep = max(prep, time.monotonic() - started)
            available = deadline.left() - tail
            share = max(share - (time.monotonic() - started), min(available, 1.0))
            if not math.isfinite(best):    # the preparation does not eat the first layout's quarter
                share = max(share, available / 4)
            if request.schedule is Schedule.AUTO:     # every schedule and chunk count, the engine's own search
                plan = engine.solve(analysis, request, deadline.part(share), Events(), cutoff=cutoff)
                open_ = [c for c in plan.candidates if c.status not in ("optimal", "slower", "infeasible", "refused")]
                # every schedule settled and none with a split under the cutoff: refuted whole
                slower = cutoff is not None and not open_ and any(c.status == "slower" for c in plan.candidates) \
                    and all(c.step_time is None or c.step_time >= cutoff for c in plan.candidates
                            if c.status in ("optimal", "slower"))
                proven = plan.status == "optimal" and not open_
            else:
                advice = advise_schedule(resolved.model, resolved.inputs, table=table, cutoff=cutoff,
                                         deadline=deadline.part(share))
                plan, slower, proven = advice.plan, advice.slower, advice.plan.status == "optimal"
        except TimeLimitReached:
            rows[lay] = LayoutRow(lay, "unknown", "the time limit stopped its search before a split was found",
                                  capacity=capacity)
            continue
        except StagesplitError as exc:
            # the engine's rules refuse it whatever the time (1F1B's micro-batches per stage...): settled
            rows[lay] = LayoutRow(lay, "refused", str(exc), capacity=capacity, proven=True)
            continue
        if slower:
            assert cutoff is not None
            rows[lay] = LayoutRow(lay, "slower", f"refuted: no split's pipeline step is under {seconds(cutoff)}, "
                                  f"so no step under {seconds(best)}, the best found before it", capacity=capacity,
                                  proven=True)
            continue
        s = plan.schedule
        if s is None or not plan.stages:         # the time limit stopped it before a split was found
            rows[lay] = LayoutRow(lay, "unknown" if plan.status == "unknown" else "refused", plan.message,
                                  capacity=capacity, proven=plan.status in ("infeasible", "refused"))
            continue
        peaks = tuple(r.peak_bytes for r in s.ranks)
        if not plan.feasible:
            worst = max(range(len(peaks)), key=lambda r: peaks[r] / s.ranks[r].capacity_bytes)
            rows[lay] = LayoutRow(lay, "memory", f"memory: rank {worst} needs {peaks[worst] / 2**30:.1f} GiB of "
                                  f"{s.ranks[worst].capacity_bytes / 2**30:.1f} GiB", rank_peaks=peaks,
                                  capacity=capacity, proven=plan.status == "infeasible")
            continue
        step, pipeline, tp_s, dp_s = step_of(lay, plan, analysis, req, params[key_of(lay)][0])
        rows[lay] = LayoutRow(lay, "solved", "", step, pipeline, tp_s, dp_s, s.bubble, peaks, capacity,
                              proven=proven, schedule=s.kind, chunks_per_rank=s.chunks_per_rank,
                              cp_comm_s=cp_share(plan, analysis, req), ep_comm_s=ep_share(plan, analysis, req),
                              # one stage: its one split (its chunks' bytes and compute are the rank's whole)
                              dp_gap_s=0.0 if lay.pp == 1 else max(0.0, dp_s - dp_floor(work[key_of(lay)], lay, req)))
        # only the plans that can be the answer are kept (those of the best step: the tie goes to the
        # emptiest below); each holds its rank's analysis, large at scale
        if step <= best:
            best = step
            plans[lay] = (plan, analysis)
            for other in [k for k in plans if (rows[k].step_s or 0.0) > best]:
                del plans[other]
    events.done()
    solved = [r for r in rows.values() if r.status == "solved"]
    # on a tie (ZeRO 1 moves what DDP moves), the layout whose fullest rank holds least
    top = min(solved, key=lambda r: (r.step_s, max(r.rank_peaks, default=0), r.layout)) if solved else None
    out: list[LayoutRow] = []
    chosen: LayoutRow | None = None
    for lay in sorted(rows):
        r = rows[lay]
        if r.status == "solved":
            assert top is not None and r.step_s is not None
            if r is top:
                r = chosen = replace(r, status="best", reason="fastest that fits")
            else:
                r = replace(r, status="slower", reason=_why_slower(r, top))
        out.append(r)
    if top is None:
        unknown = sum(1 for r in out if r.status == "unknown")
        note = (f"no layout found: the time limit stopped {unknown} combination(s), the others do not fit or were "
                "refused" if unknown else "no layout fits every rank")
        return LayoutPlan(req, tuple(out), notes=(note,), proven=all(r.proven for r in out))
    plan, analysis = plans[top.layout]
    if (plan.profile.tensor_parallel, plan.profile.context_parallel, plan.profile.expert_parallel) != \
            (top.layout.tp, top.layout.cp, top.layout.ep):
        # a rank's profile given for a degree without recording it (no capture --tp): the plan
        # still says which degree its rank is of, so that its exports lay the model out so
        plan = replace(plan, profile=replace(plan.profile, tensor_parallel=top.layout.tp,
                                             context_parallel=top.layout.cp, expert_parallel=top.layout.ep))
    # the plan records the batch, so that the exports give each framework its micro-batch size
    plan = replace(plan, inputs=replace(plan.inputs, micro_batch_size=top.layout.micro_batch_size,
                                        global_batch=req.global_batch))
    assert top.step_s is not None
    samples = req.global_batch / top.step_s
    tokens = samples * req.sequence_length / req.gpus if req.sequence_length else None
    mfu = None
    rank = base[key_of(top.layout)].profile
    # model FLOPs: the forward and backward (recompute and the optimizer's step are not counted)
    ops = rank.operations
    fwd_bwd = np.isin(np.asarray(ops.phase), (Phase.FORWARD, Phase.BACKWARD_INPUT, Phase.BACKWARD_WEIGHT))
    total = float(np.asarray(ops.compute)[fwd_bwd].sum()) if rank.compute_unit == "flops" else None
    if total is not None and flops:
        # a rank's FLOPs per captured micro-batch, times tp x cp ranks, times every captured batch
        mfu = (total * top.layout.tp * top.layout.cp * req.global_batch / req.captured_batch / top.step_s
               / (req.gpus * flops))
    proven = all(r.proven for r in out)
    # no split of a solved combination is faster than its step less its gap (``dp_gap_s``)
    lowest = min(r.step_s - r.dp_gap_s for r in out if r.step_s is not None and r.status in ("best", "slower"))
    return LayoutPlan(req, tuple(out), chosen, plan, tokens, samples, mfu, proven,
                      tp_collectives_recorded=any(_tp_seconds(a, req.node) != (0.0, 0.0) for a in base.values()),
                      within_s=max(0.0, top.step_s - lowest))


def _pipeline_floor_row(lay: Layout, found: tuple[float, float] | None, floor: float, best: float,
                        capacity: int) -> LayoutRow | None:
    """The row of a combination its pipeline floors settle (``item_floors``): no split fits even with
    the most recompute, or none steps under the best found with the recompute its memory forces;
    None where they leave it open."""
    if found is None:
        return None
    need, step = found
    if need > capacity:
        return LayoutRow(lay, "memory", f"memory floor: {need / 2**30:.1f} GiB on some rank of every split with the "
                         f"most recompute (always live, receive buffers, micro-batches in flight, the full "
                         f"backward) > {capacity / 2**30:.1f} GiB", capacity=capacity, proven=True)
    if step > floor and step >= best:
        return LayoutRow(lay, "cut off", f"step floor {seconds(step)} with the recompute its memory forces >= "
                         f"{seconds(best)}, the best step found before it", capacity=capacity, proven=True)
    return None


def seconds(x: float) -> str:
    """A time as the rows say it, three significant figures: seconds from one second up, else
    milliseconds."""
    return f"{x:.3g} s" if x >= 1 else f"{x * 1e3:.3g} ms"


def _why_slower(r: LayoutRow, top: LayoutRow) -> str:
    """Which part of its step makes a fitting combination lose to the best: bubble or communication."""
    assert r.step_s is not None and top.step_s is not None and r.pipeline_s is not None and top.pipeline_s is not None
    comm = r.tp_comm_s + r.cp_comm_s + r.ep_comm_s + r.dp_comm_s
    top_comm = top.tp_comm_s + top.cp_comm_s + top.ep_comm_s + top.dp_comm_s
    if r.step_s <= top.step_s * (1 + 1e-9):
        if max(r.rank_peaks, default=0) > max(top.rank_peaks, default=0):
            return (f"memory: as fast as the best ({seconds(r.step_s)}), its fullest rank holds "
                    f"{max(r.rank_peaks):,} bytes, the best's {max(top.rank_peaks):,}")
        return f"ties with the best ({seconds(r.step_s)}); the best is the first in (tp, pp, dp, zero) order"
    what = "communication" if comm - top_comm >= r.pipeline_s - top.pipeline_s else "bubble"
    return (f"{what}: step {seconds(r.step_s)} vs {seconds(top.step_s)} (pipeline {seconds(r.pipeline_s)}, bubble "
            f"{(r.bubble or 0):.0%}, communication {seconds(comm)})")



# -- the GPU-count sweep ---------------------------------------------------------------------------

@dataclass(frozen=True)
class GpuSweepRow:
    """One GPU count's layout search (``plan``), or why no layout of that many GPUs was searched
    (``refused``: the batch or the node cannot be laid out on it)."""

    gpus: int
    plan: LayoutPlan | None
    refused: str = ""

    @property
    def fits(self) -> bool:
        return self.plan is not None and self.plan.best is not None

    @property
    def unknown(self) -> bool:
        """No layout found, but the time limit stopped some combination before a split was found:
        one of them may fit."""
        return not self.fits and self.plan is not None and any(r.status == "unknown" for r in self.plan.rows)


@dataclass(frozen=True)
class GpuSweep:
    """The layout search for each GPU count, in the order asked."""

    rows: tuple[GpuSweepRow, ...]

    @property
    def fewest(self) -> int | None:
        """The fewest GPUs with a layout found that fits every rank (None: none found); fewer may fit
        where their search is ``unknown`` (``unsettled``)."""
        fits = [r.gpus for r in self.rows if r.fits]
        return min(fits) if fits else None

    def unsettled(self, below: int | None = None) -> list[int]:
        """The counts (under ``below``, where given) whose search the time limit left unknown."""
        return [r.gpus for r in self.rows if r.unknown and (below is None or r.gpus < below)]

    def summary(self) -> str:
        """The sweep's last line (``fewest_text``): the fewest GPUs found to fit, and any fewer the
        time limit left unknown."""
        return fewest_text("GPUs", "range", [r.gpus for r in self.rows if r.fits], self.unsettled())


def sweep_gpus(analyze: Analyze, tp_degrees: Sequence[Degree], req: LayoutRequest, counts: Sequence[int],
               deadline: Deadline, events: Events) -> GpuSweep:
    """``search`` for each GPU count in ``counts`` (``req`` with its ``gpus`` replaced), the one
    deadline split across them: each count gets the time left over the counts left. A count on
    which no layout forms the batch (or the node does not divide it) is a row saying so; where
    every count is refused, the first refusal is raised (the request itself is bad)."""
    layers = min(analyze(tp, DataLayout(), Fraction(1)).layers.num_layers for tp in tp_degrees)
    rows: list[GpuSweepRow] = []
    first: OptionError | None = None
    for i, g in enumerate(counts):
        one = replace(req, gpus=g)
        try:
            check_request(one, tp_degrees, layers)
        except OptionError as exc:
            if exc.parameter not in ("global_batch", "gpus_per_node", "tp", "cp", "ep", "pp", "dp"):
                raise
            first = first or exc
            rows.append(GpuSweepRow(g, None, exc.detail))
            continue
        share = deadline.left() / max(1, len(counts) - i)
        rows.append(GpuSweepRow(g, search(analyze, tp_degrees, one, deadline.part(share), events)))
    if first is not None and all(r.plan is None for r in rows):
        raise first
    return GpuSweep(tuple(rows))
