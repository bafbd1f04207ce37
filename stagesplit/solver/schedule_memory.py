"""Each rank's memory over a pipeline schedule's step, derived from the schedule's own actions
(``schedule_generation``).

Per chunk: resident bytes (weights, gradients, optimizer state), the stash ``S_c`` one
micro-batch holds from its F to its B, the part ``S^W_c`` it still holds from its B to its W,
and the transient peak of one F, B, W (or full backward) above the state before it (the
micro-batch's own stash included). A rank's peak is the maximum over its leaf actions of
resident + the stashes of the *other* (micro-batch, chunk) pairs in flight + the action's own
transient, and the optimizer step at the end, with nothing in flight. ``memory_signatures`` gives
the same numbers as a max over a few linear forms, for a solver (``chunk_cpsat_model``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from ..common.deadline import check_deadline
from ..errors import OptionError
from .schedule_generation import BACKWARD_OPS, Op, ScheduleInstance

__all__ = ["ChunkMemory", "MemorySignature", "RankMemory", "RankSignatures", "chunks_in_flight", "memory_signatures",
           "rank_memory", "rank_peaks"]

#: how often the loops over a step's actions look at the search's deadline (``common/deadline.py``):
#: every 65,536 actions (a few tens of milliseconds), every 1,024 where each action costs a tuple per chunk
_EVERY = 0xFFFF
_EVERY_SIGNATURE = 0x3FF
_SIMULATING = "simulating the schedule's step"
_MEMORY = "following each device's memory through the step"
_SIGNATURES = "listing each device's memory signatures for CP-SAT"


@dataclass(frozen=True)
class ChunkMemory:
    """Per-chunk byte counts (arrays of one integer per chunk, model order).

    ``forward_peak``, ``backward_peak`` (B, the input gradient), ``weight_peak`` (W) and
    ``full_backward_peak`` are transient peaks above the rank's state before the action, the
    micro-batch's own stash included (a backward's figure counts the stash it starts with). A full
    backward defaults to the larger of the B and W peaks. The rank's optimizer step needs the
    largest of its chunks' ``optimizer_peak`` on top of the resident bytes: the step runs one
    parameter's kernels at a time (single-tensor, as the capture records it), so its temporaries
    are one parameter's, whichever chunk holds it (measured: a rank of two chunks of linear blocks
    under interleaved 1F1B, +11% with their sum). ``retained`` (default
    0) is what a micro-batch's backward on the chunk leaves allocated until the step ends where
    the runtime keeps sent tensors: the chunk's output it sent on (unless it is the last chunk)
    and the input gradient it sent back (unless it is the first); docs/schedules.md has what
    torch's runtime was measured to keep. ``unsharded`` (default 0) is what each backward on the
    chunk leaves allocated until the chunk's next forward starts, or the step ends: FSDP2's
    parameters, which torch's pipeline runtime does not reshard after a backward (the forward's
    end reshards them; its peak, at the end, holds them no longer)."""

    resident: np.ndarray
    stash: np.ndarray
    weight_stash: np.ndarray
    forward_peak: np.ndarray
    backward_peak: np.ndarray
    weight_peak: np.ndarray
    optimizer_peak: np.ndarray
    # None given: __post_init__ fills them in (always arrays after construction)
    full_backward_peak: np.ndarray = field(default=None)  # type: ignore[arg-type]
    retained: np.ndarray = field(default=None)  # type: ignore[arg-type]
    unsharded: np.ndarray = field(default=None)  # type: ignore[arg-type]

    def __post_init__(self) -> None:
        names = ("resident", "stash", "weight_stash", "forward_peak", "backward_peak", "weight_peak",
                 "optimizer_peak")
        size = len(np.atleast_1d(self.resident))
        for name in names + ("full_backward_peak", "retained", "unsharded"):
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


def _check_memory(schedule: ScheduleInstance, memory: ChunkMemory) -> None:
    if memory.chunks != schedule.chunks:
        raise OptionError("memory", f"expected figures for {schedule.chunks} chunks, got {memory.chunks}")


def rank_memory(schedule: ScheduleInstance, memory: ChunkMemory) -> tuple[RankMemory, ...]:
    """Each rank's memory, action by action, from the schedule (see the module docstring)."""
    _check_memory(schedule, memory)
    keeps = schedule.traits.keeps_sent
    out = []
    for r, leaves in enumerate(schedule.leaves):
        local = list(schedule.rank_chunks(r))
        resident = int(memory.resident[local].sum())
        held = 0                                   # in-flight stash bytes after the last action
        holding: dict[tuple[int, int], int] = {}   # (chunk, micro-batch) -> bytes it holds now
        whole: set[int] = set()                    # chunks whose parameters a backward left unsharded
        during = np.zeros(len(leaves), np.int64)
        after = np.zeros(len(leaves), np.int64)
        for i, a in enumerate(leaves):
            if not i & _EVERY:
                check_deadline(_MEMORY)
            c, key = a.chunk, (a.chunk, a.micro_batch)
            own = holding.get(key, 0)
            if a.op is Op.FORWARD and c in whole:
                whole.discard(c)
                held -= int(memory.unsharded[c])
            during[i] = resident + held - own + int(memory.transient(a.op)[c])
            if a.op is Op.FORWARD:
                new = int(memory.stash[c])
            elif a.op is Op.BACKWARD_INPUT:
                new = int(memory.weight_stash[c])
            else:
                new = 0
            held += new - own
            if keeps and a.op in BACKWARD_OPS:
                held += int(memory.retained[c])
            if a.op in (Op.BACKWARD_INPUT, Op.FULL_BACKWARD) and c not in whole:
                whole.add(c)
                held += int(memory.unsharded[c])
            if new:
                holding[key] = new
            else:
                holding.pop(key, None)
            after[i] = resident + held
        # the last backward's post-backward reshards every chunk before the optimizer step
        optimizer = resident + int(memory.optimizer_peak[local].max())
        candidates = np.append(during, optimizer)
        at = int(np.argmax(candidates))
        out.append(RankMemory(r, resident, during, after, optimizer, int(candidates[at]),
                              at if at < len(leaves) else -1))
    return tuple(out)


@dataclass(frozen=True)
class MemorySignature:
    """A linear form of a rank's memory at some action: resident + sum_c stashes[c] x S_c +
    sum_c weight_stashes[c] x S^W_c + sum_c retained[c] x retained_c + sum_c unsharded[c] x
    unsharded_c + the transient of ``op``
    on ``chunk`` (``op`` None: the optimizer step, whose transient is the largest of the rank's
    chunks' optimizer peaks; chunk -1)."""

    op: Op | None
    chunk: int
    stashes: tuple[int, ...]         #: other micro-batches' full stashes in flight, per chunk
    weight_stashes: tuple[int, ...]  #: other micro-batches' W-pending stashes, per chunk
    retained: tuple[int, ...]        #: backwards done in this step whose sends are kept, per chunk
    unsharded: tuple[int, ...] = ()  #: 1 where a backward left the chunk's parameters unsharded

    def dominates(self, other: MemorySignature) -> bool:
        """Whether this one is >= ``other`` for every choice of non-negative quantities."""
        return (self.op is other.op and self.chunk == other.chunk
                and all(a >= b for a, b in zip(self.stashes, other.stashes))
                and all(a >= b for a, b in zip(self.weight_stashes, other.weight_stashes))
                and all(a >= b for a, b in zip(self.retained, other.retained))
                and all(a >= b for a, b in zip(self.unsharded, other.unsharded)))


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

    @cached_property
    def unsharded_counts(self) -> np.ndarray:
        """(signatures x chunks) coefficients of ``unsharded`` (0 or 1)."""
        return np.array([s.unsharded for s in self.signatures], np.int64).reshape(len(self.signatures), -1)

    def values(self, memory: ChunkMemory) -> np.ndarray:
        """Each signature's bytes (resident included)."""
        resident = int(memory.resident[list(self.chunks)].sum())
        transient = np.array([int(memory.optimizer_peak[list(self.chunks)].max()) if s.op is None
                              else int(memory.transient(s.op)[s.chunk]) for s in self.signatures], np.int64)
        out: np.ndarray = (resident + self.stash_counts @ memory.stash + self.weight_stash_counts @ memory.weight_stash
                           + self.retained_counts @ memory.retained + self.unsharded_counts @ memory.unsharded
                           + transient)
        return out

    def peak(self, memory: ChunkMemory) -> int:
        """The rank's peak: the largest signature."""
        return int(self.values(memory).max())


def memory_signatures(schedule: ScheduleInstance, unsharded: bool = False) -> tuple[RankSignatures, ...]:
    """Per rank, the distinct memory signatures of its actions and its optimizer step, with
    dominated ones removed: ``rank_memory(...)[r].peak == memory_signatures(...)[r].peak(memory)``
    for every ``ChunkMemory`` (whose ``unsharded`` is zero unless ``unsharded``: tracking the
    parameters backwards leave unsharded makes more forms, so only where some are). Kept on the
    schedule (each search of it reads them)."""
    cache = "_signatures_cache_unsharded" if unsharded else "_signatures_cache"
    cached: tuple[RankSignatures, ...] | None = schedule.__dict__.get(cache)
    if cached is not None:
        return cached
    C = schedule.chunks
    keeps = schedule.traits.keeps_sent
    out = []
    for r, leaves in enumerate(schedule.leaves):
        full = np.zeros(C, np.int64)       # in-flight counts after the last action
        pending = np.zeros(C, np.int64)
        kept = np.zeros(C, np.int64)
        whole = np.zeros(C, np.int64)
        state: dict[tuple[int, int], str] = {}
        seen: set[MemorySignature] = {MemorySignature(None, -1, (0,) * C, (0,) * C, (0,) * C, (0,) * C)}
        for i, a in enumerate(leaves):
            if not i & _EVERY_SIGNATURE:
                check_deadline(_SIGNATURES)
            c, key = a.chunk, (a.chunk, a.micro_batch)
            own = state.get(key)
            if a.op is Op.FORWARD:
                whole[c] = 0
            n, w = full.copy(), pending.copy()
            if own == "S":
                n[c] -= 1
            elif own == "W":
                w[c] -= 1
            seen.add(MemorySignature(a.op, c, tuple(int(x) for x in n), tuple(int(x) for x in w),
                                     tuple(int(x) for x in kept), tuple(int(x) for x in whole)))
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
            if keeps and a.op in BACKWARD_OPS:
                kept[c] += 1
            if unsharded and a.op in (Op.BACKWARD_INPUT, Op.FULL_BACKWARD):
                whole[c] = 1
        # one signature dominates another only at the same action (op and chunk): compare within those
        same_action: dict[tuple[Op | None, int], list[MemorySignature]] = defaultdict(list)
        for sig in seen:
            same_action[sig.op, sig.chunk].append(sig)
        best = []
        for group in same_action.values():
            for sig in group:
                check_deadline(_SIGNATURES)
                if not any(o != sig and o.dominates(sig) for o in group):
                    best.append(sig)
        best.sort(key=lambda s: (s.op is not None, s.op.value if s.op else "", s.chunk, s.stashes,
                                 s.weight_stashes, s.retained, s.unsharded))
        out.append(RankSignatures(r, schedule.rank_chunks(r), tuple(best)))
    object.__setattr__(schedule, cache, tuple(out))
    return tuple(out)


@dataclass(frozen=True)
class _PeakForms:
    """Every rank's signatures stacked into one set of matrices (``rank_peaks``): row i is a
    signature of rank ``rank[i]``; ``op[i]`` indexes the transients (0 F, 1 B, 2 W, 3 full
    backward, 4 the optimizer step: the largest of the rank's chunks') at chunk ``chunk[i]``."""

    rank: np.ndarray
    op: np.ndarray
    chunk: np.ndarray
    counts: np.ndarray          #: (signatures x 4 chunks): S, S^W, retained, unsharded side by side


_OP_INDEX = {Op.FORWARD: 0, Op.BACKWARD_INPUT: 1, Op.BACKWARD_WEIGHT: 2, Op.FULL_BACKWARD: 3, None: 4}


def _peak_forms(schedule: ScheduleInstance, unsharded: bool) -> _PeakForms:
    cache = "_peak_forms_unsharded" if unsharded else "_peak_forms"
    cached: _PeakForms | None = schedule.__dict__.get(cache)
    if cached is not None:
        return cached
    rank, op, chunk, rows = [], [], [], []
    for sigs in memory_signatures(schedule, unsharded=unsharded):
        for sig in sigs.signatures:
            rank.append(sigs.rank)
            op.append(_OP_INDEX[sig.op])
            chunk.append(0 if sig.op is None else sig.chunk)
            rows.append((*sig.stashes, *sig.weight_stashes, *sig.retained,
                         *(sig.unsharded or (0,) * schedule.chunks)))
    forms = _PeakForms(np.asarray(rank, np.int64), np.asarray(op, np.int64), np.asarray(chunk, np.int64),
                       np.asarray(rows, np.int64).reshape(len(rows), 4 * schedule.chunks))
    object.__setattr__(schedule, cache, forms)
    return forms


def rank_peaks(schedule: ScheduleInstance, memory: ChunkMemory) -> np.ndarray:
    """Each rank's peak, ``rank_memory(schedule, memory)[r].peak`` for every r, from the schedule's
    memory signatures (kept on the schedule): a few array operations where ``rank_memory`` follows
    every action, so that a search judging thousands of splits of one schedule pays for its
    actions once."""
    _check_memory(schedule, memory)
    forms = _peak_forms(schedule, unsharded=bool(np.any(memory.unsharded)))
    ranks = np.asarray(schedule.chunk_rank, np.int64)
    devices = schedule.devices
    resident = np.zeros(devices, np.int64)
    np.add.at(resident, ranks, memory.resident)
    optimizer = np.zeros(devices, np.int64)
    np.maximum.at(optimizer, ranks, memory.optimizer_peak)
    transients = np.stack([memory.forward_peak, memory.backward_peak, memory.weight_peak, memory.full_backward_peak])
    quantities = np.concatenate([memory.stash, memory.weight_stash, memory.retained, memory.unsharded])
    own = np.where(forms.op == 4, optimizer[forms.rank], transients[np.minimum(forms.op, 3), forms.chunk])
    values = resident[forms.rank] + forms.counts @ quantities + own
    peaks = np.full(devices, np.iinfo(np.int64).min, np.int64)
    np.maximum.at(peaks, forms.rank, values)
    return peaks


def chunks_in_flight(schedule: ScheduleInstance) -> np.ndarray:
    """Per chunk, the most micro-batches between their forward and their backward at once on
    its rank (at least 1)."""
    cached: np.ndarray | None = schedule.__dict__.get("_in_flight_cache")
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
