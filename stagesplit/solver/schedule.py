"""Pipeline schedules as plain data: the order of actions each rank runs, a step-time simulator
and each rank's memory, derived from the schedule itself.

The schedules are the ones ``torch.distributed.pipelining`` ships (torch 2.13): GPipe, 1F1B,
Interleaved 1F1B, Looped BFS, Interleaved Zero Bubble (ZB-H1), ZBV Zero Bubble and DualPipeV.
``build_schedule`` generates, for ``P`` ranks, ``M`` micro-batches and ``v`` chunks per rank, the
same ordered compute actions torch's schedule classes run (tests/test_schedule_torch.py checks
every valid ``P <= 8, M <= 32, v <= 4`` against torch's own runtime), with no torch import here.

Vocabulary. The model is cut into ``C = v * P`` contiguous *chunks* (virtual stages), numbered in
model order; a rank runs the chunks the schedule places on it. An action works on one chunk and
one micro-batch: ``F`` (forward), ``B`` (backward for the input gradient only), ``W`` (backward
for the weight gradient only, after its ``B``), ``BW`` (the whole backward, B and W not split) or,
in DualPipeV, ``F+BW`` (a forward of one chunk and a full backward of another, issued together;
torch runs the two parts one after the other, and so does everything here: a *leaf* action is an
action or one part of an ``F+BW``).

Memory. Per chunk: resident bytes (weights, gradients, optimizer state), the stash ``S_c`` one
micro-batch holds from its F to its B, the part ``S^W_c`` it still holds from its B to its W,
and the transient peak of one F, B, W (or full backward) above the state before it (the
micro-batch's own stash included). A rank's peak is the maximum over its leaf actions of
resident + the stashes of the *other* (micro-batch, chunk) pairs in flight + the action's own
transient, and the optimizer step at the end, with nothing in flight. ``memory_signatures`` gives
the same numbers as a max over a few linear forms, for a solver.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from typing import Sequence

import numpy as np

from ..common.deadline import check_deadline
from ..errors import OptionError

__all__ = [
    "Action", "ChunkMemory", "CriticalPath", "MemorySignature", "Op", "Placement", "RankMemory", "RankSignatures",
    "Schedule", "critical_path", "ScheduleKind", "ScheduleTraits", "Simulation", "actions", "build_schedule",
    "check_chunks_per_rank", "check_schedule", "chunk_ranks", "chunks_in_flight", "is_valid", "memory_signatures",
    "rank_memory", "simulate", "timeline_text", "traits",
]


class ScheduleKind(str, Enum):
    """A pipeline schedule of torch.distributed.pipelining, by stagesplit's name for it."""

    GPIPE = "gpipe"                        #: ScheduleGPipe: all forwards, then all backwards
    ONE_F_ONE_B = "1f1b"                   #: Schedule1F1B: warm-up forwards, then one F one B
    INTERLEAVED_1F1B = "interleaved-1f1b"  #: ScheduleInterleaved1F1B: 1F1B over v looped chunks
    LOOPED_BFS = "looped-bfs"              #: ScheduleLoopedBFS: chunk by chunk, all micro-batches
    ZB_H1 = "zb-h1"                        #: ScheduleInterleavedZeroBubble: interleaved, B and W split
    ZBV = "zbv"                            #: ScheduleZBVZeroBubble: V-shaped chunks, B and W split
    DUALPIPEV = "dualpipev"                #: ScheduleDualPipeV: V-shaped, overlapped F+BW pairs


class Placement(str, Enum):
    """Where chunk ``c`` of ``C = v * P`` lives."""

    LOOP = "loop"  #: on rank ``c mod P`` (one chunk per rank when v = 1)
    V = "v"        #: the V shape: rank ``r`` holds chunks ``r`` and ``2P - 1 - r``


class Op(str, Enum):
    """What an action computes."""

    FORWARD = "F"
    BACKWARD_INPUT = "B"    #: the input gradient only (zero-bubble schedules)
    BACKWARD_WEIGHT = "W"   #: the weight gradient only, after the micro-batch's B
    FULL_BACKWARD = "BW"    #: both gradients in one pass
    OVERLAP_F_B = "F+BW"    #: DualPipeV: a forward and a full backward issued as one action

    @property
    def torch_code(self) -> str:
        """torch's letter for it (``_ComputationType``): its "B" is our full backward, its "I" our B."""
        return _TORCH_CODES[self]


_TORCH_CODES = {Op.FORWARD: "F", Op.BACKWARD_INPUT: "I", Op.BACKWARD_WEIGHT: "W",
                Op.FULL_BACKWARD: "B", Op.OVERLAP_F_B: "OVERLAP_F_B"}


@dataclass(frozen=True)
class ScheduleTraits:
    """What a schedule is, independent of P and M."""

    kind: ScheduleKind
    torch_class: str                   #: the class in torch.distributed.pipelining.schedules
    multi_stage: bool                  #: a PipelineScheduleMulti (a list of stages per rank)
    splits_backward: bool              #: some backwards run as B and W separately
    placement: Placement
    fixed_chunks_per_rank: int | None  #: v the schedule requires (None: any v >= 1)

    @property
    def keeps_sent(self) -> bool:
        """Whether torch's runtime keeps what a chunk sends on (its output, its input gradient,
        also when handed to a chunk on the same rank) until the step ends: the send handles of
        ScheduleGPipe and of the multi-stage runtime are only waited on (and dropped) then.
        Schedule1F1B waits on each send at its next one, so it keeps at most one of each."""
        return self.kind is not ScheduleKind.ONE_F_ONE_B


_TRAITS = {
    ScheduleKind.GPIPE: ScheduleTraits(ScheduleKind.GPIPE, "ScheduleGPipe", False, False, Placement.LOOP, 1),
    ScheduleKind.ONE_F_ONE_B: ScheduleTraits(ScheduleKind.ONE_F_ONE_B, "Schedule1F1B", False, False,
                                             Placement.LOOP, 1),
    ScheduleKind.INTERLEAVED_1F1B: ScheduleTraits(ScheduleKind.INTERLEAVED_1F1B, "ScheduleInterleaved1F1B",
                                                  True, False, Placement.LOOP, None),
    ScheduleKind.LOOPED_BFS: ScheduleTraits(ScheduleKind.LOOPED_BFS, "ScheduleLoopedBFS", True, False,
                                            Placement.LOOP, None),
    ScheduleKind.ZB_H1: ScheduleTraits(ScheduleKind.ZB_H1, "ScheduleInterleavedZeroBubble", True, True,
                                       Placement.LOOP, None),
    ScheduleKind.ZBV: ScheduleTraits(ScheduleKind.ZBV, "ScheduleZBVZeroBubble", True, True, Placement.V, 2),
    ScheduleKind.DUALPIPEV: ScheduleTraits(ScheduleKind.DUALPIPEV, "ScheduleDualPipeV", True, True,
                                           Placement.V, 2),
}

_KIND_NAMES = ", ".join(k.value for k in ScheduleKind)


#: how often the loops over a step's actions look at the search's deadline (``common/deadline.py``):
#: every 65,536 actions (a few tens of milliseconds), every 1,024 where each action costs a tuple per chunk
_EVERY = 0xFFFF
_EVERY_SIGNATURE = 0x3FF
_GENERATING = "generating the schedule's actions"
_SIMULATING = "simulating the schedule's step"
_MEMORY = "following each device's memory through the step"
_SIGNATURES = "listing each device's memory signatures for CP-SAT"


def _kind(kind: ScheduleKind | str) -> ScheduleKind:
    try:
        return ScheduleKind(kind)
    except ValueError:
        raise OptionError("schedule", f"expected one of {_KIND_NAMES}, got {str(kind)[:40]!r}") from None


def traits(kind: ScheduleKind | str) -> ScheduleTraits:
    """The fixed properties of ``kind``."""
    return _TRAITS[_kind(kind)]


def _positive(parameter: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise OptionError(parameter, f"expected an integer >= 1, got {value!r}")


def check_chunks_per_rank(kind: ScheduleKind | str, chunks_per_rank: int) -> None:
    """Raise a one-line OptionError unless ``kind`` runs ``chunks_per_rank`` chunks per rank
    (GPipe and 1F1B one, the V-shaped schedules exactly two, the looped ones any)."""
    t = traits(kind)
    if t.fixed_chunks_per_rank is not None and chunks_per_rank != t.fixed_chunks_per_rank:
        why = "one stage per rank" if t.fixed_chunks_per_rank == 1 else "exactly 2 chunks per rank (the V shape)"
        raise OptionError("chunks_per_rank", f"{t.kind.value} runs {why} (torch's {t.torch_class}): "
                          f"expected {t.fixed_chunks_per_rank}, got {chunks_per_rank}")


def check_schedule(kind: ScheduleKind | str, devices: int, micro_batches: int, chunks_per_rank: int) -> None:
    """Raise a one-line OptionError unless torch's schedule class accepts ``devices`` ranks,
    ``micro_batches`` and ``chunks_per_rank`` (these are the checks its constructors make)."""
    kind = _kind(kind)
    for parameter, value in (("devices", devices), ("micro_batches", micro_batches),
                             ("chunks_per_rank", chunks_per_rank)):
        _positive(parameter, value)
    t = _TRAITS[kind]
    P, M, v = int(devices), int(micro_batches), int(chunks_per_rank)
    check_chunks_per_rank(kind, v)
    if kind is ScheduleKind.ONE_F_ONE_B and M < P:
        raise OptionError("micro_batches", f"1f1b needs at least as many micro-batches as ranks "
                          f"(torch's Schedule1F1B): expected >= {P}, got {M}")
    if kind in (ScheduleKind.INTERLEAVED_1F1B, ScheduleKind.ZB_H1):
        rounds = max(1, M // P)
        if M % rounds:
            raise OptionError("micro_batches", f"{kind.value} needs the micro-batches to be a multiple of its "
                              f"rounds max(1, M // P) = {rounds} with {P} ranks (torch's {t.torch_class}): "
                              f"got {M}")
    if kind is ScheduleKind.DUALPIPEV and M < 2 * P:
        raise OptionError("micro_batches", f"dualpipev needs at least as many micro-batches as chunks, "
                          f"2 x {P} ranks (torch's ScheduleDualPipeV): expected >= {2 * P}, got {M}")


def is_valid(kind: ScheduleKind | str, devices: int, micro_batches: int, chunks_per_rank: int) -> bool:
    """Whether torch's schedule class accepts this configuration (``check_schedule`` without the error)."""
    try:
        check_schedule(kind, devices, micro_batches, chunks_per_rank)
    except OptionError:
        return False
    return True


def chunk_ranks(kind: ScheduleKind | str, devices: int, chunks_per_rank: int) -> np.ndarray:
    """The rank of each of the ``chunks_per_rank * devices`` chunks, in model order."""
    kind = _kind(kind)
    P, v = int(devices), int(chunks_per_rank)
    chunks = np.arange(P * v)
    if _TRAITS[kind].placement is Placement.LOOP:
        return chunks % P
    # the V: down the ranks on even passes, back up on odd ones
    offset = chunks % P
    return np.where((chunks // P) % 2 == 0, offset, P - 1 - offset)


@dataclass(frozen=True)
class Action:
    """One action of a rank: ``op`` on ``chunk`` for ``micro_batch``; an F+BW holds its two
    parts (the forward first, as torch runs them) and has no chunk or micro-batch of its own."""

    op: Op
    chunk: int = -1
    micro_batch: int = -1
    parts: tuple["Action", ...] = ()

    @property
    def leaves(self) -> tuple["Action", ...]:
        """The actions that run: the parts of an F+BW, else the action itself."""
        return self.parts or (self,)

    def torch_repr(self) -> str:
        """torch's own notation (``repr`` of its ``_Action``), e.g. ``3I2`` or ``(0F3;3B1)OVERLAP_F_B``."""
        if self.parts:
            return f"({';'.join(p.torch_repr() for p in self.parts)}){self.op.torch_code}"
        return f"{self.chunk}{self.op.torch_code}{self.micro_batch}"

    def __str__(self) -> str:
        if self.parts:
            return "+".join(str(p) for p in self.parts)
        return f"{self.op.value}{self.micro_batch}@{self.chunk}"


def _f(chunk: int, mb: int) -> Action:
    return Action(Op.FORWARD, chunk, mb)


@dataclass(frozen=True)
class Schedule:
    """A schedule instantiated for ``devices`` ranks, ``micro_batches`` and ``chunks_per_rank``."""

    kind: ScheduleKind
    devices: int
    micro_batches: int
    chunks_per_rank: int
    chunk_rank: tuple[int, ...]               #: rank of each chunk, model order
    actions: tuple[tuple[Action, ...], ...]   #: per rank, in the order torch runs them

    @property
    def chunks(self) -> int:
        return len(self.chunk_rank)

    @property
    def traits(self) -> ScheduleTraits:
        return _TRAITS[self.kind]

    def rank_chunks(self, rank: int) -> tuple[int, ...]:
        """The chunks rank ``rank`` holds, ascending."""
        return tuple(c for c, r in enumerate(self.chunk_rank) if r == rank)

    @cached_property
    def leaves(self) -> tuple[tuple[Action, ...], ...]:
        """Per rank, the actions that run, with each F+BW replaced by its two parts."""
        return tuple(tuple(leaf for a in rank_actions for leaf in a.leaves) for rank_actions in self.actions)


def build_schedule(kind: ScheduleKind | str, devices: int, micro_batches: int,
                   chunks_per_rank: int | None = None) -> Schedule:
    """The schedule ``kind`` for ``devices`` ranks and ``micro_batches``; ``chunks_per_rank``
    defaults to what the schedule requires (2 for the V shapes), else 1."""
    kind = _kind(kind)
    if chunks_per_rank is None:
        chunks_per_rank = _TRAITS[kind].fixed_chunks_per_rank or 1
    check_schedule(kind, devices, micro_batches, chunks_per_rank)
    P, M, v = int(devices), int(micro_batches), int(chunks_per_rank)
    ranks = chunk_ranks(kind, P, v)
    local = [tuple(int(c) for c in np.flatnonzero(ranks == r)) for r in range(P)]
    generate = _GENERATORS[kind]
    per_rank = []
    for r in range(P):
        check_deadline(_GENERATING)
        per_rank.append(tuple(generate(P, M, v, r, local[r])))
    per_rank = tuple(per_rank)
    return Schedule(kind, P, M, v, tuple(int(r) for r in ranks), per_rank)


def actions(kind: ScheduleKind | str, devices: int, micro_batches: int,
            chunks_per_rank: int | None = None) -> tuple[tuple[Action, ...], ...]:
    """Each rank's ordered actions under ``kind`` (see ``build_schedule``)."""
    return build_schedule(kind, devices, micro_batches, chunks_per_rank).actions


# --- the generators: one per schedule, each rank's actions in torch's order --------------------

def _gpipe(P: int, M: int, v: int, rank: int, chunks: tuple[int, ...]) -> list[Action]:
    (c,) = chunks
    return [_f(c, m) for m in range(M)] + [Action(Op.FULL_BACKWARD, c, m) for m in range(M)]


def _one_f_one_b(P: int, M: int, v: int, rank: int, chunks: tuple[int, ...]) -> list[Action]:
    # warm-up: one forward more than the ranks after this one hold; then backward, forward
    # alternate until the forwards run out; the last backwards drain
    (c,) = chunks
    warmup = min(M, P - rank)
    out = [_f(c, m) for m in range(warmup)]
    for k in range(M - warmup):
        out += [Action(Op.FULL_BACKWARD, c, k), _f(c, warmup + k)]
    out += [Action(Op.FULL_BACKWARD, c, m) for m in range(M - warmup, M)]
    return out


def _looped_bfs(P: int, M: int, v: int, rank: int, chunks: tuple[int, ...]) -> list[Action]:
    # breadth first: every micro-batch through one chunk before the next chunk; backwards in
    # reverse chunk order and reverse micro-batch order
    out = [_f(c, m) for c in chunks for m in range(M)]
    out += [Action(Op.FULL_BACKWARD, c, m) for c in reversed(chunks) for m in reversed(range(M))]
    return out


def _depth_first(P: int, M: int, v: int, rank: int, chunks: tuple[int, ...], zero_bubble: bool) -> list[Action]:
    """Interleaved 1F1B and its zero-bubble form (ZB-H1): micro-batches go through the rank's
    chunks in rounds of ``M // rounds``; warm-up forwards, then one forward and one backward
    each step, then the remaining backwards. With zero bubble the backward is B only, and the
    W of the k-th backward follows backward number ``rank + k`` (FIFO), the rest at the end."""
    rounds = max(1, M // P)
    per_round = M // rounds
    per_hop = 1 if zero_bubble else 2
    total = v * M
    warmup = min((v - 1) * per_round + per_hop * (P - 1 - rank), total)
    backward_op = Op.BACKWARD_INPUT if zero_bubble else Op.FULL_BACKWARD

    def forward_chunk(k: int) -> int:      # the k-th forward of this rank
        return chunks[(k // per_round) % v]

    def backward_chunk(k: int) -> int:     # the k-th backward: the chunks in reverse
        return chunks[v - 1 - (k // per_round) % v]

    next_forward: dict[int, int] = defaultdict(int)
    next_backward: dict[int, int] = defaultdict(int)
    weights_due: deque[tuple[int, int]] = deque()
    out: list[Action] = []

    def forward(k: int) -> None:
        c = forward_chunk(k)
        out.append(_f(c, next_forward[c]))
        next_forward[c] += 1

    def backward(k: int) -> None:
        c = backward_chunk(k)
        m = next_backward[c]
        next_backward[c] += 1
        out.append(Action(backward_op, c, m))
        if zero_bubble:
            weights_due.append((c, m))
            if k >= rank:
                wc, wm = weights_due.popleft()
                out.append(Action(Op.BACKWARD_WEIGHT, wc, wm))

    for k in range(warmup):
        forward(k)
    for k in range(warmup, total):
        forward(k)
        backward(k - warmup)
    for k in range(total - warmup, total):
        backward(k)
    out += [Action(Op.BACKWARD_WEIGHT, c, m) for c, m in weights_due]
    return out


def _interleaved(P: int, M: int, v: int, rank: int, chunks: tuple[int, ...]) -> list[Action]:
    return _depth_first(P, M, v, rank, chunks, zero_bubble=False)


def _zb_h1(P: int, M: int, v: int, rank: int, chunks: tuple[int, ...]) -> list[Action]:
    return _depth_first(P, M, v, rank, chunks, zero_bubble=True)


def _zbv(P: int, M: int, v: int, rank: int, chunks: tuple[int, ...]) -> list[Action]:
    """ZB-V: generated for at least 2P - 1 micro-batches (the V fills only then), after which
    the actions of micro-batches >= M are dropped."""
    down, up = chunks                      # chunk r (on the way down) and 2P-1-r (on the way up)
    n = max(2 * P - 1, M)
    count = {(down, Op.FORWARD): 0, (up, Op.FORWARD): 0, (down, Op.BACKWARD_INPUT): 0,
             (up, Op.BACKWARD_INPUT): 0, (down, Op.BACKWARD_WEIGHT): 0, (up, Op.BACKWARD_WEIGHT): 0}
    out: list[Action] = []

    def run(c: int, op: Op, mb: int | None = None) -> None:
        m = count[c, op] if mb is None else mb
        count[c, op] = m + 1
        out.append(Action(op, c, m))

    def b_and_w(c: int) -> None:           # a B and its W right after
        m = count[c, Op.BACKWARD_INPUT]
        run(c, Op.BACKWARD_INPUT)
        run(c, Op.BACKWARD_WEIGHT, m)

    for _ in range(2 * (P - rank) - 1):
        run(down, Op.FORWARD)
    for _ in range(rank):
        run(up, Op.FORWARD)
        run(down, Op.FORWARD)
    for _ in range(P - rank):
        run(up, Op.FORWARD)
        b_and_w(up)
    while count[up, Op.FORWARD] < count[down, Op.FORWARD] or count[down, Op.FORWARD] < n:
        if count[down, Op.FORWARD] < n:
            run(down, Op.FORWARD)
        b_and_w(down)
        run(up, Op.FORWARD)
        b_and_w(up)
    # cool-down: the W counters restart where the B's stand now
    count[down, Op.BACKWARD_WEIGHT] = count[down, Op.BACKWARD_INPUT]
    count[up, Op.BACKWARD_WEIGHT] = count[up, Op.BACKWARD_INPUT]
    for _ in range(rank):
        run(down, Op.BACKWARD_INPUT)
        run(up, Op.BACKWARD_INPUT)
    for _ in range(P - rank):
        run(down, Op.BACKWARD_INPUT)
        run(down, Op.BACKWARD_WEIGHT)
    while count[up, Op.BACKWARD_WEIGHT] < count[up, Op.BACKWARD_INPUT]:
        run(up, Op.BACKWARD_WEIGHT)
    while count[down, Op.BACKWARD_WEIGHT] < count[down, Op.BACKWARD_INPUT]:
        run(down, Op.BACKWARD_WEIGHT)
    return [a for a in out if a.micro_batch < M]


def _dualpipev(P: int, M: int, v: int, rank: int, chunks: tuple[int, ...]) -> list[Action]:
    """DualPipeV (DeepSeek's DualPipe folded into a V): warm-up forwards, then pairs of a
    forward of one chunk with the full backward of the other (F+BW); the last backwards of
    the second half split into B and W, whose W's fill the drain (FIFO)."""
    down, up = chunks
    next_mb = {(down, Op.FORWARD): 0, (up, Op.FORWARD): 0, (down, Op.BACKWARD_INPUT): 0,
               (up, Op.BACKWARD_INPUT): 0}
    weights_due: deque[tuple[int, int]] = deque()
    out: list[Action] = []

    def forward(c: int) -> Action:
        m = next_mb[c, Op.FORWARD]
        next_mb[c, Op.FORWARD] = m + 1
        return _f(c, m)

    def backward(c: int, split: bool) -> Action:   # B and full backward share one counter
        m = next_mb[c, Op.BACKWARD_INPUT]
        next_mb[c, Op.BACKWARD_INPUT] = m + 1
        if split:
            weights_due.append((c, m))
            return Action(Op.BACKWARD_INPUT, c, m)
        return Action(Op.FULL_BACKWARD, c, m)

    def overlap(forward_chunk: int, backward_chunk: int) -> None:
        f = forward(forward_chunk)
        out.append(Action(Op.OVERLAP_F_B, parts=(f, backward(backward_chunk, split=False))))

    def weight_if_due() -> None:
        if weights_due:
            c, m = weights_due.popleft()
            out.append(Action(Op.BACKWARD_WEIGHT, c, m))

    for _ in range(2 * (P - rank - 1)):
        out.append(forward(down))
    for _ in range(rank + 1):
        out.append(forward(down))
        out.append(forward(up))
    for _ in range(P - rank - 1):
        out.append(backward(up, split=True))
        weight_if_due()
        out.append(forward(up))
    for i in range(M - 2 * P + rank + 1):
        if i == 0 and rank == P - 1:       # the bottom of the V: no overlap on the first pair
            out.append(forward(down))
            out.append(backward(up, split=False))
        else:
            overlap(down, up)
        overlap(up, down)
    for _ in range(P - rank - 1):
        out.append(backward(up, split=False))
        overlap(up, down)
    # the drain: the second half of these backwards is split (B now, W later); odd ranks switch
    # one backward earlier than even ranks
    split = False
    steps = rank + 1
    for i in range(steps):
        if i == steps // 2 and rank % 2 == 1:
            split = True
        out.append(backward(up, split))
        if i == steps // 2 and rank % 2 == 0:
            split = True
        out.append(backward(down, split))
    for _ in range(P - rank - 1):
        weight_if_due()
        out.append(backward(down, split))
    for _ in range(rank + 1):
        weight_if_due()
    return out


_GENERATORS = {
    ScheduleKind.GPIPE: _gpipe,
    ScheduleKind.ONE_F_ONE_B: _one_f_one_b,
    ScheduleKind.INTERLEAVED_1F1B: _interleaved,
    ScheduleKind.LOOPED_BFS: _looped_bfs,
    ScheduleKind.ZB_H1: _zb_h1,
    ScheduleKind.ZBV: _zbv,
    ScheduleKind.DUALPIPEV: _dualpipev,
}


# --- the simulator ------------------------------------------------------------------------------

_BACKWARDS = (Op.BACKWARD_INPUT, Op.FULL_BACKWARD)


@dataclass(frozen=True)
class _Graph:
    """The leaf actions of all ranks as one dependency graph, in an order that respects it."""

    order: np.ndarray         # leaf ids (rank-major numbering), dependencies first
    rank_of: np.ndarray       # per leaf id
    op_of: list[Op]
    chunk_of: np.ndarray
    previous: np.ndarray      # the same rank's previous leaf, -1 for the first
    deps: list[tuple[tuple[int, int], ...]]   # per leaf: (leaf it waits for, boundary crossed or -1)
    rank_offsets: np.ndarray  # leaf ids of rank r: rank_offsets[r] .. rank_offsets[r+1]-1


def chunks_in_flight(schedule: Schedule) -> np.ndarray:
    """Per chunk, the most micro-batches between their forward and their backward at once on
    its rank (at least 1)."""
    cached = schedule.__dict__.get("_in_flight_cache")
    if cached is not None:
        return cached
    out = np.ones(schedule.chunks, np.int64)
    for rank in range(schedule.devices):
        check_deadline(_SIMULATING)
        live: dict[int, int] = {}
        for a in schedule.leaves[rank]:
            if a.op is Op.FORWARD:
                live[a.chunk] = live.get(a.chunk, 0) + 1
                out[a.chunk] = max(out[a.chunk], live[a.chunk])
            elif a.op in (Op.BACKWARD_INPUT, Op.FULL_BACKWARD):
                live[a.chunk] = live.get(a.chunk, 0) - 1
    object.__setattr__(schedule, "_in_flight_cache", out)
    return out


def _graph(schedule: Schedule) -> _Graph:
    """The schedule's dependency graph, built once per schedule (kept on the frozen record)."""
    cached = schedule.__dict__.get("_graph_cache")
    if cached is None:
        cached = _build_graph(schedule)
        object.__setattr__(schedule, "_graph_cache", cached)
    return cached


def _build_graph(schedule: Schedule) -> _Graph:
    leaves = schedule.leaves
    sizes = np.array([len(x) for x in leaves])
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    where: dict[tuple[str, int, int], int] = {}
    op_of: list[Op] = []
    chunk_of, rank_of, previous = [], [], []
    for r, rank_leaves in enumerate(leaves):
        check_deadline(_SIMULATING)
        for i, a in enumerate(rank_leaves):
            lid = int(offsets[r]) + i
            key = "B" if a.op in _BACKWARDS else a.op.value
            where[key, a.chunk, a.micro_batch] = lid
            op_of.append(a.op)
            chunk_of.append(a.chunk)
            rank_of.append(r)
            previous.append(lid - 1 if i else -1)
    last = schedule.chunks - 1
    deps: list[tuple[tuple[int, int], ...]] = []
    for r, rank_leaves in enumerate(leaves):
        check_deadline(_SIMULATING)
        for a in rank_leaves:
            c, m = a.chunk, a.micro_batch
            if a.op is Op.FORWARD:
                d = ((where["F", c - 1, m], c - 1),) if c > 0 else ()
            elif a.op in _BACKWARDS:
                d = ((where["F", c, m], -1),)
                if c < last:
                    d += ((where["B", c + 1, m], c),)
            else:
                d = ((where["B", c, m], -1),)
            deps.append(d)
    # a list schedule in rounds over the ranks: each rank runs what it can; no progress = deadlock
    n = int(offsets[-1])
    done = np.zeros(n, bool)
    cursor = offsets[:-1].copy()
    order: list[int] = []
    while len(order) < n:
        progress = False
        for r in range(schedule.devices):
            check_deadline(_SIMULATING)
            while cursor[r] < offsets[r + 1] and all(done[d] for d, _ in deps[cursor[r]]):
                done[cursor[r]] = True
                order.append(int(cursor[r]))
                cursor[r] += 1
                progress = True
        if not progress:
            stuck = [str(leaves[r][cursor[r] - offsets[r]]) for r in range(schedule.devices)
                     if cursor[r] < offsets[r + 1]]
            raise ValueError(f"schedule deadlocks: every rank waits ({', '.join(stuck)})")
    return _Graph(np.array(order), np.array(rank_of), op_of, np.array(chunk_of), np.array(previous),
                  deps, offsets)


@dataclass(frozen=True)
class Simulation:
    """The timeline of one step: per rank, the start and end of each leaf action
    (``schedule.leaves[r]``), the step time, each rank's busy time and the bubble."""

    start: tuple[np.ndarray, ...]
    end: tuple[np.ndarray, ...]
    step_time: float
    busy: np.ndarray
    bubble_fraction: float     #: idle share of all ranks over the step: 1 - sum(busy) / (P x step)


def _per_chunk(name: str, values: Sequence[float] | np.ndarray, size: int) -> np.ndarray:
    a = np.asarray(values, dtype=np.float64)
    if a.shape != (size,):
        raise OptionError(name, f"expected {size} values (one per chunk or boundary), got shape {a.shape}")
    if not np.all(np.isfinite(a)) or np.any(a < 0):
        raise OptionError(name, "expected finite values >= 0")
    return a


def simulate(schedule: Schedule, forward: Sequence[float] | np.ndarray, backward_input: Sequence[float] | np.ndarray,
             backward_weight: Sequence[float] | np.ndarray | None = None,
             transfer: Sequence[float] | np.ndarray | None = None) -> Simulation:
    """Simulate one step of ``schedule`` from per-chunk durations of F, B (input gradient) and W
    (weight gradient; a full backward takes B + W) and per-boundary transfer times (boundary
    ``c`` lies between chunks ``c`` and ``c + 1``; taken as 0 where both are on one rank).

    Each rank runs its leaf actions one at a time in list order, each starting when the rank is
    free and its inputs are there: F(m,c) after F(m,c-1) + transfer; B(m,c) after F(m,c) and
    after B(m,c+1) + transfer; W(m,c) after B(m,c). Every rank starts at time 0."""
    C = schedule.chunks
    f = _per_chunk("forward", forward, C)
    b = _per_chunk("backward_input", backward_input, C)
    w = np.zeros(C) if backward_weight is None else _per_chunk("backward_weight", backward_weight, C)
    t = np.zeros(max(C - 1, 0)) if transfer is None else _per_chunk("transfer", transfer, max(C - 1, 0))
    ranks = np.asarray(schedule.chunk_rank)
    t = np.where(ranks[:-1] == ranks[1:], 0.0, t)
    duration = {Op.FORWARD: f, Op.BACKWARD_INPUT: b, Op.BACKWARD_WEIGHT: w, Op.FULL_BACKWARD: b + w}
    g = _graph(schedule)
    n = len(g.op_of)
    start = np.zeros(n)
    end = np.zeros(n)
    for i, lid in enumerate(g.order):
        if not i & _EVERY:
            check_deadline(_SIMULATING)
        ready = end[g.previous[lid]] if g.previous[lid] >= 0 else 0.0
        for d, boundary in g.deps[lid]:
            arrival = end[d] + (t[boundary] if boundary >= 0 else 0.0)
            if arrival > ready:
                ready = arrival
        start[lid] = ready
        end[lid] = ready + duration[g.op_of[lid]][g.chunk_of[lid]]
    o = g.rank_offsets
    starts = tuple(start[o[r]:o[r + 1]] for r in range(schedule.devices))
    ends = tuple(end[o[r]:o[r + 1]] for r in range(schedule.devices))
    busy = np.array([float(np.sum(e - s)) for s, e in zip(starts, ends)])
    step = float(end.max()) if n else 0.0
    bubble = 1.0 - float(busy.sum()) / (schedule.devices * step) if step > 0 else 0.0
    return Simulation(starts, ends, step, busy, bubble)


# --- memory -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ChunkMemory:
    """Per-chunk byte counts (arrays of one integer per chunk, model order).

    ``forward_peak``, ``backward_peak`` (B, the input gradient), ``weight_peak`` (W) and
    ``full_backward_peak`` are transient peaks above the rank's state before the action, the
    micro-batch's own stash included (a backward's figure counts the stash it starts with). A full
    backward defaults to the larger of the B and W peaks. The rank's optimizer step needs the
    sum of its chunks' ``optimizer_peak`` on top of the resident bytes. ``retained`` (default
    0) is what a micro-batch's backward on the chunk leaves allocated until the step ends where
    the runtime keeps sent tensors: the chunk's output it sent on (unless it is the last chunk)
    and the input gradient it sent back (unless it is the first); docs/schedules.md has what
    torch's runtime was measured to keep."""

    resident: np.ndarray
    stash: np.ndarray
    weight_stash: np.ndarray
    forward_peak: np.ndarray
    backward_peak: np.ndarray
    weight_peak: np.ndarray
    optimizer_peak: np.ndarray
    full_backward_peak: np.ndarray = field(default=None)  # type: ignore[assignment]
    retained: np.ndarray = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        names = ("resident", "stash", "weight_stash", "forward_peak", "backward_peak", "weight_peak",
                 "optimizer_peak")
        size = len(np.atleast_1d(self.resident))
        for name in names + ("full_backward_peak", "retained"):
            value = getattr(self, name)
            if value is None and name == "full_backward_peak":
                value = np.maximum(self.backward_peak, self.weight_peak)
            elif value is None:
                value = np.zeros(size, np.int64)
            a = np.asarray(value)
            if a.shape != (size,) or not (np.issubdtype(a.dtype, np.integer) or a.size == 0):
                raise OptionError(name, f"expected {size} integer byte counts (one per chunk), got "
                                  f"shape {a.shape} of {a.dtype}")
            if np.any(a < 0):
                raise OptionError(name, "expected byte counts >= 0")
            object.__setattr__(self, name, a.astype(np.int64))

    @property
    def chunks(self) -> int:
        return len(self.resident)

    def transient(self, op: Op | None) -> np.ndarray:
        """The per-chunk transient of ``op`` (None: the optimizer step)."""
        return {Op.FORWARD: self.forward_peak, Op.BACKWARD_INPUT: self.backward_peak,
                Op.BACKWARD_WEIGHT: self.weight_peak, Op.FULL_BACKWARD: self.full_backward_peak,
                None: self.optimizer_peak}[op]


@dataclass(frozen=True)
class RankMemory:
    """One rank's memory over a step: ``during[i]`` is the peak while leaf action
    ``schedule.leaves[rank][i]`` runs and ``after[i]`` what stays allocated after it;
    ``optimizer`` the optimizer step's peak; ``peak`` the largest of all, at ``peak_action``
    (an index into the leaves, or -1 for the optimizer step)."""

    rank: int
    resident: int
    during: np.ndarray
    after: np.ndarray
    optimizer: int
    peak: int
    peak_action: int


def _check_memory(schedule: Schedule, memory: ChunkMemory) -> None:
    if memory.chunks != schedule.chunks:
        raise OptionError("memory", f"expected figures for {schedule.chunks} chunks, got {memory.chunks}")


def rank_memory(schedule: Schedule, memory: ChunkMemory) -> tuple[RankMemory, ...]:
    """Each rank's memory, action by action, from the schedule (see the module docstring)."""
    _check_memory(schedule, memory)
    keeps = schedule.traits.keeps_sent
    out = []
    for r, leaves in enumerate(schedule.leaves):
        local = list(schedule.rank_chunks(r))
        resident = int(memory.resident[local].sum())
        held = 0                                   # in-flight stash bytes after the last action
        holding: dict[tuple[int, int], int] = {}   # (chunk, micro-batch) -> bytes it holds now
        during = np.zeros(len(leaves), np.int64)
        after = np.zeros(len(leaves), np.int64)
        for i, a in enumerate(leaves):
            if not i & _EVERY:
                check_deadline(_MEMORY)
            c, key = a.chunk, (a.chunk, a.micro_batch)
            own = holding.get(key, 0)
            during[i] = resident + held - own + int(memory.transient(a.op)[c])
            if a.op is Op.FORWARD:
                new = int(memory.stash[c])
            elif a.op is Op.BACKWARD_INPUT:
                new = int(memory.weight_stash[c])
            else:
                new = 0
            held += new - own
            if keeps and a.op in _BACKWARDS:
                held += int(memory.retained[c])
            if new:
                holding[key] = new
            else:
                holding.pop(key, None)
            after[i] = resident + held
        optimizer = resident + int(memory.optimizer_peak[local].sum())
        candidates = np.append(during, optimizer)
        at = int(np.argmax(candidates))
        out.append(RankMemory(r, resident, during, after, optimizer, int(candidates[at]),
                              at if at < len(leaves) else -1))
    return tuple(out)


@dataclass(frozen=True)
class MemorySignature:
    """A linear form of a rank's memory at some action: resident + sum_c stashes[c] x S_c +
    sum_c weight_stashes[c] x S^W_c + sum_c retained[c] x retained_c + the transient of ``op``
    on ``chunk`` (``op`` None: the optimizer step, whose transient is the rank's summed
    optimizer peaks; chunk -1)."""

    op: Op | None
    chunk: int
    stashes: tuple[int, ...]         #: other micro-batches' full stashes in flight, per chunk
    weight_stashes: tuple[int, ...]  #: other micro-batches' W-pending stashes, per chunk
    retained: tuple[int, ...]        #: backwards done in this step whose sends are kept, per chunk

    def dominates(self, other: "MemorySignature") -> bool:
        """Whether this one is >= ``other`` for every choice of non-negative quantities."""
        return (self.op is other.op and self.chunk == other.chunk
                and all(a >= b for a, b in zip(self.stashes, other.stashes))
                and all(a >= b for a, b in zip(self.weight_stashes, other.weight_stashes))
                and all(a >= b for a, b in zip(self.retained, other.retained)))


@dataclass(frozen=True)
class RankSignatures:
    """A rank's memory as resident + the max over ``signatures`` (none dominates another),
    with the same forms as matrices for a solver."""

    rank: int
    chunks: tuple[int, ...]                  #: the rank's chunks
    signatures: tuple[MemorySignature, ...]

    @cached_property
    def stash_counts(self) -> np.ndarray:
        """(signatures x chunks) coefficients of S."""
        return np.array([s.stashes for s in self.signatures], np.int64).reshape(len(self.signatures), -1)

    @cached_property
    def weight_stash_counts(self) -> np.ndarray:
        """(signatures x chunks) coefficients of S^W."""
        return np.array([s.weight_stashes for s in self.signatures], np.int64).reshape(len(self.signatures), -1)

    @cached_property
    def retained_counts(self) -> np.ndarray:
        """(signatures x chunks) coefficients of ``retained``."""
        return np.array([s.retained for s in self.signatures], np.int64).reshape(len(self.signatures), -1)

    def values(self, memory: ChunkMemory) -> np.ndarray:
        """Each signature's bytes (resident included)."""
        resident = int(memory.resident[list(self.chunks)].sum())
        transient = np.array([int(memory.optimizer_peak[list(self.chunks)].sum()) if s.op is None
                              else int(memory.transient(s.op)[s.chunk]) for s in self.signatures], np.int64)
        return (resident + self.stash_counts @ memory.stash + self.weight_stash_counts @ memory.weight_stash
                + self.retained_counts @ memory.retained + transient)

    def peak(self, memory: ChunkMemory) -> int:
        """The rank's peak: the largest signature."""
        return int(self.values(memory).max())


def memory_signatures(schedule: Schedule) -> tuple[RankSignatures, ...]:
    """Per rank, the distinct memory signatures of its actions and its optimizer step, with
    dominated ones removed: ``rank_memory(...)[r].peak == memory_signatures(...)[r].peak(memory)``
    for every ``ChunkMemory``. Kept on the schedule (each search of it reads them)."""
    cached = schedule.__dict__.get("_signatures_cache")
    if cached is not None:
        return cached
    C = schedule.chunks
    keeps = schedule.traits.keeps_sent
    out = []
    for r, leaves in enumerate(schedule.leaves):
        full = np.zeros(C, np.int64)       # in-flight counts after the last action
        pending = np.zeros(C, np.int64)
        kept = np.zeros(C, np.int64)
        state: dict[tuple[int, int], str] = {}
        seen: set[MemorySignature] = {MemorySignature(None, -1, (0,) * C, (0,) * C, (0,) * C)}
        for i, a in enumerate(leaves):
            if not i & _EVERY_SIGNATURE:
                check_deadline(_SIGNATURES)
            c, key = a.chunk, (a.chunk, a.micro_batch)
            own = state.get(key)
            n, w = full.copy(), pending.copy()
            if own == "S":
                n[c] -= 1
            elif own == "W":
                w[c] -= 1
            seen.add(MemorySignature(a.op, c, tuple(int(x) for x in n), tuple(int(x) for x in w),
                                     tuple(int(x) for x in kept)))
            if own == "S":
                full[c] -= 1
            elif own == "W":
                pending[c] -= 1
            if a.op is Op.FORWARD:
                full[c] += 1
                state[key] = "S"
            elif a.op is Op.BACKWARD_INPUT:
                pending[c] += 1
                state[key] = "W"
            else:
                state.pop(key, None)
            if keeps and a.op in _BACKWARDS:
                kept[c] += 1
        # one signature dominates another only at the same action (op and chunk): compare within those
        same_action: dict[tuple, list[MemorySignature]] = defaultdict(list)
        for sig in seen:
            same_action[sig.op, sig.chunk].append(sig)
        best = []
        for group in same_action.values():
            for sig in group:
                check_deadline(_SIGNATURES)
                if not any(o != sig and o.dominates(sig) for o in group):
                    best.append(sig)
        best.sort(key=lambda s: (s.op is not None, s.op.value if s.op else "", s.chunk, s.stashes,
                                 s.weight_stashes, s.retained))
        out.append(RankSignatures(r, schedule.rank_chunks(r), tuple(best)))
    object.__setattr__(schedule, "_signatures_cache", tuple(out))
    return tuple(out)


# --- a text picture -----------------------------------------------------------------------------

def timeline_text(schedule: Schedule, simulation: Simulation, unit: float = 1.0) -> str:
    """The step as text, one row per rank and one column per ``unit`` of time: each column shows
    the leaf action running (``F3`` is micro-batch 3's forward; where the rank holds more than
    one chunk, the chunk follows after a dot, e.g. ``B3.5``); ``.`` marks idle time."""
    columns = int(round(simulation.step_time / unit))
    rows = []
    for r, leaves in enumerate(schedule.leaves):
        cells = ["."] * columns
        multi = len(schedule.rank_chunks(r)) > 1
        for a, s, e in zip(leaves, simulation.start[r], simulation.end[r]):
            label = f"{a.op.value}{a.micro_batch}" + (f".{a.chunk}" if multi else "")
            for k in range(int(round(s / unit)), int(round(e / unit))):
                cells[k] = label
        rows.append(cells)
    width = 1 + max((len(cell) for cells in rows for cell in cells), default=1)
    return "\n".join(f"rank {r} | " + "".join(cell.ljust(width) for cell in cells).rstrip()
                     for r, cells in enumerate(rows))


# --- the critical path ----------------------------------------------------------------------------

@dataclass(frozen=True)
class CriticalPath:
    """The longest chain of one step (one rank's optimizer step at its end): how many forwards,
    B's and W's of each chunk it runs, which boundaries it crosses, and whose optimizer step ends
    it. Its length, sum(counts x durations) + transfers + that optimizer time, is the step time;
    for any other durations it is a lower bound on the step time (the chain still exists)."""

    length: float
    forward: np.ndarray        # (C,) forwards of each chunk on the path
    backward_input: np.ndarray
    backward_weight: np.ndarray
    transfers: np.ndarray      # (C-1,) crossings of each boundary
    optimizer_rank: int        # the rank whose optimizer step ends it


def critical_path(schedule: Schedule, forward, backward_input, backward_weight=None, transfer=None,
                  optimizer=None) -> CriticalPath:
    """The step time of ``schedule`` with each rank's optimizer step (``optimizer``: seconds per
    rank, default 0) after its last action, and the chain of actions that makes it (see
    ``simulate`` for the rules)."""
    C = schedule.chunks
    f = _per_chunk("forward", forward, C)
    b = _per_chunk("backward_input", backward_input, C)
    w = np.zeros(C) if backward_weight is None else _per_chunk("backward_weight", backward_weight, C)
    t = np.zeros(max(C - 1, 0)) if transfer is None else _per_chunk("transfer", transfer, max(C - 1, 0))
    opt = np.zeros(schedule.devices) if optimizer is None else np.asarray(optimizer, float)
    ranks = np.asarray(schedule.chunk_rank)
    t = np.where(ranks[:-1] == ranks[1:], 0.0, t)
    duration = {Op.FORWARD: f, Op.BACKWARD_INPUT: b, Op.BACKWARD_WEIGHT: w, Op.FULL_BACKWARD: b + w}
    g = _graph(schedule)
    n = len(g.op_of)
    end = np.zeros(n)
    came_from = np.full(n, -1, np.int64)          # the predecessor that set the start
    crossed = np.full(n, -1, np.int64)            # the boundary crossed from it (-1: none)
    for i, lid in enumerate(g.order):
        if not i & _EVERY:
            check_deadline(_SIMULATING)
        ready = end[g.previous[lid]] if g.previous[lid] >= 0 else 0.0
        came_from[lid] = g.previous[lid]
        for d, boundary in g.deps[lid]:
            arrival = end[d] + (t[boundary] if boundary >= 0 else 0.0)
            if arrival > ready:
                ready, came_from[lid], crossed[lid] = arrival, d, boundary
        end[lid] = ready + duration[g.op_of[lid]][g.chunk_of[lid]]
    o = g.rank_offsets
    finish = np.array([end[o[r + 1] - 1] if o[r + 1] > o[r] else 0.0 for r in range(schedule.devices)]) + opt
    r = int(np.argmax(finish))
    counts = {op: np.zeros(C, np.int64) for op in (Op.FORWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT)}
    transfers = np.zeros(max(C - 1, 0), np.int64)
    lid = int(o[r + 1] - 1) if o[r + 1] > o[r] else -1
    while lid >= 0:
        op, c = g.op_of[lid], int(g.chunk_of[lid])
        if op is Op.FULL_BACKWARD:
            counts[Op.BACKWARD_INPUT][c] += 1
            counts[Op.BACKWARD_WEIGHT][c] += 1
        else:
            counts[op][c] += 1
        if crossed[lid] >= 0 and t[crossed[lid]] > 0:
            transfers[crossed[lid]] += 1
        lid = int(came_from[lid])
    return CriticalPath(float(finish[r]), counts[Op.FORWARD], counts[Op.BACKWARD_INPUT], counts[Op.BACKWARD_WEIGHT],
                        transfers, r)
