"""A pipeline schedule's action lists: for ``P`` ranks, ``M`` micro-batches and ``v`` chunks per
rank, the ordered compute actions each rank runs, generated without importing torch; the same
actions torch's schedule classes run (tests/solver/test_schedule_torch.py checks every valid
``P <= 8, M <= 32, v <= 4`` against torch's own runtime).

Vocabulary. The model is cut into ``C = v * P`` contiguous *chunks* (virtual stages), numbered in
model order; a rank runs the chunks the schedule places on it (``schedule_kinds.chunk_ranks``). An
action works on one chunk and one micro-batch: ``F`` (forward), ``B`` (backward for the input
gradient only), ``W`` (backward for the weight gradient only, after its ``B``), ``BW`` (the whole
backward, B and W not split) or, in DualPipeV, ``F+BW`` (a forward of one chunk and a full backward
of another, issued together; torch runs the two parts one after the other, and so does everything
here: a *leaf* action is an action or one part of an ``F+BW``).

The step's timing (``schedule_simulation``) and each rank's memory (``schedule_memory``) are read
from these lists; this module only lists them.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass
from enum import Enum
from functools import cached_property

import numpy as np

from ..common.deadline import check_deadline
from .schedule_kinds import ScheduleKind, ScheduleTraits, check_schedule, chunk_ranks, traits

__all__ = ["Action", "BACKWARD_OPS", "Op", "ScheduleInstance", "actions", "build_schedule"]


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


#: the ops that end a micro-batch's full stash on a chunk and wait for the next chunk's gradient
BACKWARD_OPS = (Op.BACKWARD_INPUT, Op.FULL_BACKWARD)

#: what the search was doing where its time limit stops it (``common/deadline.py``)
_GENERATING = "generating the schedule's actions"


@dataclass(frozen=True)
class Action:
    """One action of a rank: ``op`` on ``chunk`` for ``micro_batch``; an F+BW holds its two
    parts (the forward first, as torch runs them) and has no chunk or micro-batch of its own."""

    op: Op
    chunk: int = -1
    micro_batch: int = -1
    parts: tuple[Action, ...] = ()

    @property
    def leaves(self) -> tuple[Action, ...]:
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
class ScheduleInstance:
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
        return traits(self.kind)

    def rank_chunks(self, rank: int) -> tuple[int, ...]:
        """The chunks rank ``rank`` holds, ascending."""
        return tuple(c for c, r in enumerate(self.chunk_rank) if r == rank)

    @cached_property
    def leaves(self) -> tuple[tuple[Action, ...], ...]:
        """Per rank, the actions that run, with each F+BW replaced by its two parts."""
        return tuple(tuple(leaf for a in rank_actions for leaf in a.leaves) for rank_actions in self.actions)


def build_schedule(kind: ScheduleKind | str, devices: int, micro_batches: int,
                   chunks_per_rank: int | None = None) -> ScheduleInstance:
    """The schedule ``kind`` for ``devices`` ranks and ``micro_batches``; ``chunks_per_rank``
    defaults to what the schedule requires (2 for the V shapes), else 1."""
    kind = traits(kind).kind
    if chunks_per_rank is None:
        chunks_per_rank = traits(kind).fixed_chunks_per_rank or 1
    check_schedule(kind, devices, micro_batches, chunks_per_rank)
    P, M, v = int(devices), int(micro_batches), int(chunks_per_rank)
    ranks = chunk_ranks(kind, P, v)
    local = [tuple(int(c) for c in np.flatnonzero(ranks == r)) for r in range(P)]
    generate = _GENERATORS[kind]
    per_rank = []
    for r in range(P):
        check_deadline(_GENERATING)
        per_rank.append(tuple(generate(P, M, v, r, local[r])))
    return ScheduleInstance(kind, P, M, v, tuple(int(r) for r in ranks), tuple(per_rank))


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
