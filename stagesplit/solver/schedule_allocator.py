"""Each rank's allocations and frees in the order its schedule runs them, replayed through torch's
caching allocator (``model/allocator.py``): the bytes each GPU reserves, not only those its tensors
hold.

The sequence is built from the profile's variables, chunk by chunk, as the chunk's stage is priced
(``model/stagememory.py``'s ``stage_items``: the chunk's variables on the chunk's own timeline
columns, in step order), and each column gets the phase of the operations in it (forward; backward
for inputs, with recompute; backward for weights; optimizer; a column of none takes the phase
before it). Then, per rank:

* the always-live variables of its chunks (parameters, their gradients where the profile holds them
  all step, optimizer state) are allocated once at the start, chunk by chunk, in variable order;
* each action (F, B, W or a full backward of chunk ``c`` for micro-batch ``m``) replays the chunk's
  columns of its phases: a variable is allocated at its first live column and freed at the column
  where it stops being live, as its own allocation per micro-batch, so what a micro-batch keeps from
  its F to its B (or W) stays allocated across the actions between;
* a variable held until the optimizer step or the step's end (a gradient accumulated across
  micro-batches) is allocated once, by the first action that reaches it, and freed in the optimizer
  step, which runs last, chunk by chunk;
* where a split backward (zero-bubble) runs W after B, a variable that the one-micro-batch profile
  makes in a W column and frees in a later B column is freed as its W action ends;
* a layer the plan recomputes lets go of the stash its option drops (``model/recompute.py``'s
  ``recomputed_variables``) as its forward ends, and allocates it again at its first backward column.

The allocated peak of this sequence is not the plan's priced peak
(``solver/schedule_memory.py``): the priced figures add what torch's pipelining runtime holds
beyond one stage's tensors (receive buffers for every micro-batch, sent outputs it keeps, the
split backward's rules), which no variable of the profile is. ``RankReplay`` gives both; a
rank's reserved estimate is the replay's reserved peak plus what the priced peak has beyond the
replay's allocated peak (those runtime buffers, counted as allocated without fragmentation).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np

from ..io.profile import Phase
from ..model.allocator import AllocatorOptions, Replay, replay
from ..model.phases import producers
from ..model.recompute import recomputed_variables
from ..model.stagememory import stage_items
from ..model.view import ModelView
from .schedule_generation import Op, ScheduleInstance

__all__ = ["RankReplay", "cublas_workspaces", "rank_events", "rank_replays"]

MiB = 1 << 20
#: cuBLAS workspaces per process: torch keeps one per (handle, stream), and a handle per thread that runs a
#: matrix product (the forward's and autograd's): the 65 MiB measured per process on an H200
#: (benchmarks/validate_gpu.py) are two of 32 MiB and one cuBLASLt workspace of 1 MiB
CUBLAS_STREAMS = 2


def cublas_workspaces(target_name: str) -> tuple[int, ...]:
    """The workspaces torch allocates for cuBLAS through the caching allocator on a device: one
    per (handle, stream) of ``getChosenWorkspaceSize`` (aten/src/ATen/cuda/CublasHandlePool.cpp,
    ``parseChosenWorkspaceSize``: ``:4096:8`` = 32 MiB on compute capability 9.0, the H100 and H200,
    else ``:4096:2:16:8`` = 8 MiB + 128 KiB, unless ``CUBLAS_WORKSPACE_CONFIG`` says otherwise), and
    one cuBLASLt workspace (``CUBLASLT_WORKSPACE_SIZE``, default 1,024 KiB)."""
    name = target_name.lower()
    hopper = any(tag in name for tag in ("h100", "h200", "h800", "gh200"))
    cublas = 4096 * 8 * 1024 if hopper else 4096 * 1024 * 2 + 16 * 1024 * 8
    return (cublas,) * CUBLAS_STREAMS + (1024 * 1024,)

_F, _B, _W, _O = 0, 1, 2, 3
_OP_LABELS = {Op.FORWARD: (_F,), Op.BACKWARD_INPUT: (_B,), Op.BACKWARD_WEIGHT: (_W,), Op.FULL_BACKWARD: (_B, _W)}


@dataclass(frozen=True)
class RankReplay:
    """One rank's replay: ``replay`` (peaks, segments), the number of events, and the rank's priced
    peak from the plan for comparison; ``reserved_bytes`` is the estimate a GPU needs for the rank's
    tensors (see the module docstring)."""

    rank: int
    events: int
    replay: Replay
    priced_peak: int
    #: where the reserved estimate passes the rank's capacity: the same sequence replayed within the
    #: capacity (less the bytes not replayed), as torch's allocator frees cached blocks and retries before
    #: it runs out (None: within the capacity, no capacity given, or expandable segments)
    capped: Replay | None = None

    @property
    def allocated_bytes(self) -> int:
        return self.replay.allocated_peak

    @property
    def unreplayed_bytes(self) -> int:
        """What the priced peak holds beyond the replay's allocated peak (0 when the replay's is larger)."""
        return max(self.priced_peak - self.replay.allocated_peak, 0)

    @property
    def reserved_bytes(self) -> int:
        return self.replay.reserved_peak + self.unreplayed_bytes

    @property
    def fits_after_retries(self) -> bool | None:
        """Over its capacity without retries: whether freeing cached blocks and retrying keeps the rank
        within it (None: not over, or not replayed so)."""
        return None if self.capped is None else self.capped.oom_event < 0


@dataclass
class _ChunkProgram:
    """One chunk's single-micro-batch program: its always-live variables' bytes, and per row
    (a variable's live interval on the chunk's columns) its bytes, the label of its first column
    and of the column where it is freed (-1: held to the step's end), and the positions."""

    resident: np.ndarray
    row_bytes: np.ndarray
    start: np.ndarray
    end: np.ndarray
    start_label: np.ndarray
    end_label: np.ndarray
    labels: np.ndarray
    #: per row, where a recomputed layer's forward makes it again in the backward (-1: not recomputed)
    rerun_at: np.ndarray
    _templates: dict[tuple[tuple[int, ...], tuple[int, ...], bool], tuple[np.ndarray, ...]] = field(
        default_factory=dict)

    @cached_property
    def scoped(self) -> np.ndarray:
        """Rows held to the optimizer step or the step's end: allocated once, not per micro-batch."""
        result: np.ndarray = (self.end_label == _O) | (self.end_label < 0)
        return result

    def template(self, labels: tuple[int, ...], fresh: tuple[int, ...], split: bool) -> tuple[np.ndarray, ...]:
        """An action's events on rows, the same for every micro-batch: (rows, whether each is an
        allocation, in column order with frees first at a column; rows freed as the action ends)."""
        key = (labels, fresh, split)
        cached = self._templates.get(key)
        if cached is not None:
            return cached
        scoped = self.scoped
        mallocs = _among(self.start_label, labels) & (~scoped | _among(self.start_label, fresh))
        frees = _among(self.end_label, labels) & ~scoped
        late = np.zeros(len(scoped), bool)
        if split:
            # made in W, freed in a later B of the one-micro-batch profile: freed as W ends
            late = (self.start_label == _W) & (self.end_label == _B)
            frees &= ~late
        # a recomputed layer's stash: let go as its forward ends, made again where its backward starts
        rerun = (self.rerun_at >= 0) & (self.start_label == _F) & _among(self.end_label, (_B, _W)) & ~scoped
        late |= rerun & (_F in labels)
        remade = rerun & (_B in labels)
        rows = np.concatenate([np.flatnonzero(frees), np.flatnonzero(mallocs), np.flatnonzero(remade)])
        where = np.concatenate([self.end[frees], self.start[mallocs], self.rerun_at[remade]])
        made = np.concatenate([np.zeros(frees.sum(), bool), np.ones(mallocs.sum() + remade.sum(), bool)])
        order = np.lexsort((made, where))                 # by column; frees first at one column
        out = (rows[order], made[order], np.flatnonzero(late & mallocs))
        self._templates[key] = out
        return out


def _among(values: np.ndarray, labels: tuple[int, ...]) -> np.ndarray:
    out = np.zeros(len(values), bool)
    for label in labels:
        out |= values == label
    return out


def _labels(model: ModelView, columns: np.ndarray) -> np.ndarray:
    phase_cols = model.phase_cols
    out = np.full(len(columns), -1, np.int64)
    if phase_cols is None:
        return np.zeros(len(columns), np.int64)
    # later assignments win: forward over backward where a column holds both is never needed (columns
    # split where operations start and end), so the order only settles a column of several phases
    for label, phases in ((_O, (Phase.OPTIMIZER,)), (_W, (Phase.BACKWARD_WEIGHT,)),
                          (_B, (Phase.BACKWARD_INPUT, Phase.RECOMPUTE)), (_F, (Phase.FORWARD,))):
        mask = np.logical_or.reduce([phase_cols[p][columns] for p in phases])
        out[mask] = label
    # a column of no phase takes the phase before it (the first: forward)
    known = np.flatnonzero(out >= 0)
    if not len(known):
        return np.zeros(len(columns), np.int64)
    idx = np.maximum.accumulate(np.where(out >= 0, np.arange(len(out)), -1))
    result: np.ndarray = np.where(idx >= 0, out[np.maximum(idx, 0)], _F)
    return result


def _chunk_program(model: ModelView, first: int, last: int, dropped: np.ndarray | None = None) -> _ChunkProgram:
    """``dropped``: per variable, the layer whose recompute (the plan's choice) drops it from the stash
    (-1: none)."""
    vars_, _, cols = stage_items(model, first, last)
    v = model.profile.variables
    resident = v.bytes[np.flatnonzero(vars_ & v.always_live)].astype(np.int64)
    stage_cols = np.flatnonzero(cols)
    labels = _labels(model, stage_cols)
    tl = model.timeline
    rows = np.flatnonzero(vars_[tl.row_var])
    start = np.searchsorted(stage_cols, tl.row_col_start[rows])
    end = np.searchsorted(stage_cols, tl.row_col_end[rows])
    keep = end > start
    rows, start, end = rows[keep], start[keep], end[keep]
    n = len(stage_cols)
    start_label = labels[np.minimum(start, max(n - 1, 0))] if n else np.zeros(0, np.int64)
    end_label = np.where(end < n, labels[np.minimum(end, max(n - 1, 0))], -1) if n else np.zeros(0, np.int64)
    rerun_at = np.full(len(rows), -1, np.int64)
    if dropped is not None and n:
        layer = dropped[tl.row_var[rows]]
        backward = labels == _B
        for o in np.unique(layer[(layer >= first) & (layer <= last)]):
            # the layer's first backward column: its forward runs again there
            at = np.flatnonzero(backward & model.timeline.cover[o][stage_cols])
            at = at if len(at) else np.flatnonzero(backward)
            if len(at):
                rerun_at[layer == o] = at[0]
        rerun_at[end <= rerun_at] = -1          # freed before its layer's backward: nothing to make again
    return _ChunkProgram(resident, tl.row_bytes[rows].astype(np.int64), start, end, start_label, end_label, labels,
                         rerun_at)


def _dropped_by(model: ModelView, choice: np.ndarray | Sequence[int] | None) -> np.ndarray | None:
    """Per variable, the layer whose recompute option drops it from the stash (-1: kept), as
    ``model/recompute.py`` counts what each option saves; None where nothing is recomputed."""
    if choice is None or not np.any(np.asarray(choice)):
        return None
    owner, full, selective = recomputed_variables(model, producers(model))
    option = np.asarray(choice, np.int64)[np.maximum(owner, 0)]
    drop = (owner >= 0) & (((option == 2) & full) | ((option == 1) & selective))
    result: np.ndarray = np.where(drop, owner, -1)
    return result


class _Ids:
    """Allocation numbers handed out in order, with each one's size."""

    def __init__(self) -> None:
        self.sizes: list[np.ndarray] = []
        self.next = 0

    def new(self, nbytes: np.ndarray) -> np.ndarray:
        ids = np.arange(self.next, self.next + len(nbytes), dtype=np.int64)
        self.next += len(nbytes)
        self.sizes.append(nbytes)
        return ids


def rank_events(model: ModelView, bounds: np.ndarray | Sequence[int], schedule: ScheduleInstance,
                workspaces: tuple[int, ...] = (), choice: np.ndarray | Sequence[int] | None = None
                ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per rank, ``(sizes, events)`` for ``model.allocator.replay`` (see the module docstring);
    ``workspaces``: bytes allocated first and held all step (cuBLAS's, ``cublas_workspaces``);
    ``choice``: each layer's recompute option (0 none, 1 selective, 2 full; None: none)."""
    b = np.asarray(bounds, np.int64)
    dropped = _dropped_by(model, choice)
    programs = [_chunk_program(model, int(b[c]), int(b[c + 1]) - 1, dropped) for c in range(len(b) - 1)]
    split = schedule.traits.splits_backward
    out = []
    for rank, leaves in enumerate(schedule.leaves):
        ids_of = _Ids()
        sizes, new_ids = ids_of.sizes, ids_of.new
        events: list[np.ndarray] = []
        chunks = schedule.rank_chunks(rank)
        events.append(new_ids(np.array(workspaces, np.int64)))
        for c in chunks:
            events.append(new_ids(programs[c].resident))
        # per chunk: the ids of its step-scoped rows (allocated once), and the labels already reached
        scoped_ids: dict[int, np.ndarray] = {}
        reached: dict[int, set[int]] = {c: set() for c in chunks}
        per_mb: dict[tuple[int, int], np.ndarray] = {}
        for a in leaves:
            p = programs[a.chunk]
            labels = _OP_LABELS[a.op]
            if a.chunk not in scoped_ids:
                scoped_ids[a.chunk] = new_ids(np.where(p.scoped, p.row_bytes, 0))
            key = (a.chunk, a.micro_batch)
            ids = per_mb.get(key)
            if ids is None:
                own = new_ids(np.where(p.scoped, 0, p.row_bytes))
                ids = per_mb[key] = np.where(p.scoped, scoped_ids[a.chunk], own)
            fresh = tuple(x for x in labels if x not in reached[a.chunk])
            reached[a.chunk].update(labels)
            rows, made, late = p.template(labels, fresh, split)
            picked = ids[rows]
            events.append(np.where(made, picked, ~picked))
            if len(late):
                events.append(~ids[late])
        for c in chunks:                                      # the optimizer step, chunk by chunk
            p = programs[c]
            if c not in scoped_ids:
                scoped_ids[c] = new_ids(np.where(p.scoped, p.row_bytes, 0))
            ids = scoped_ids[c]
            made = p.start_label == _O
            freed = (p.end_label == _O) & ((p.start_label == _O) | np.isin(p.start_label, list(reached[c])))
            where = np.concatenate([p.end[freed], p.start[made]])
            kind = np.concatenate([np.zeros(freed.sum(), np.int64), np.ones(made.sum(), np.int64)])
            who = np.concatenate([~ids[freed], ids[made]])
            order = np.lexsort((kind, where))
            events.append(who[order])
        out.append((np.concatenate(sizes) if sizes else np.zeros(0, np.int64),
                    np.concatenate(events) if events else np.zeros(0, np.int64)))
    return out


def rank_replays(model: ModelView, bounds: np.ndarray | Sequence[int], schedule: ScheduleInstance,
                 priced_peaks: np.ndarray | list[int] | tuple[int, ...], options: AllocatorOptions | None = None,
                 workspaces: tuple[int, ...] = (), choice: np.ndarray | Sequence[int] | None = None,
                 capacities: Sequence[int] | None = None) -> tuple[RankReplay, ...]:
    """Each rank's sequence replayed (``rank_events``, ``model/allocator.py``), beside its priced peak
    (to which the ``workspaces``, which the profile does not hold, are added for the comparison); with
    ``capacities``, a rank whose reserved estimate passes its capacity is replayed again within it
    (``RankReplay.capped``)."""
    out = []
    extra = sum(workspaces)
    for rank, (sizes, events) in enumerate(rank_events(model, bounds, schedule, workspaces, choice)):
        o = options or AllocatorOptions()
        rep = RankReplay(rank, len(events), replay(sizes, events, o), int(priced_peaks[rank]) + extra)
        if capacities is not None and rep.reserved_bytes > capacities[rank] and not o.expandable_segments:
            room = max(int(capacities[rank]) - rep.unreplayed_bytes, 0)
            rep = replace(rep, capped=replay(sizes, events, replace(o, capacity=room)))
        out.append(rep)
    return tuple(out)
