"""What no split of a pipeline gets under, recompute included: 1F1B and GPipe (one stage per rank),
interleaved 1F1B and looped BFS (chunks looped over the ranks), every schedule whose backward is whole.

The layout search (plan/layouts.py) settles most combinations without solving them, by floors. Its
first ones count what recompute *can* save but not what it *costs*, and no transient: on a 70B at
sequence 8192 a pipeline's combinations sit 30% under the best step found while every one of them
either does not fit (the last stage's logits alone pass the device) or must recompute most of its
layers. Each took a solve of seconds to settle, and most were left unsearched at the time limit.

This floor reads the engine's own memory accounting (solver/chunk_problem.py's ``chunk_memory``,
solver/schedule_memory.py's signatures) and bounds it from below for every recompute choice. A stage
``a..b`` at position ``r`` of the pipeline, with ``n`` micro-batches in flight at its first backward
(1F1B: ``min(M, pp - r)``, GPipe: ``M``; for every schedule, counted on its own actions), meets that
backward holding the other ``n - 1``
micro-batches' stash beside the running one's full backward, so its rank's peak is at least

    V(S) = R + (n - 1) max(Y - S, 0) + max(Z - U + max(H, U - S), 0)

for a recompute choice that saves ``S`` stash bytes per micro-batch (at most ``S_max``, the sum of
each layer's best option), where, as ``chunk_memory`` has them:

* ``R``: the layers' always-live bytes, sharded as ZeRO shards them (model/datasharding.py's
  ``always_live_by_layer``), and the runtime's receive buffers, one per micro-batch, for the input
  (``a > 0``) and the gradient sent back (``b`` not last);
* ``Y``: one micro-batch's stash with no recompute: the range's less the received input it holds
  as a receive buffer, plus what the runtime keeps beside it (the model's output on the last stage,
  an unstashed output on another);
* ``Z``: the full backward's transient with no recompute (less the received input, plus what 1F1B
  and GPipe hold through it), ``U`` the range's own stash (model/recompute.py), which recompute
  replaces by what the backward holds again: at least ``U - S``, and for each layer whatever its
  option at least ``H_i`` = the least of its own stash (none), its stash less what selective saves
  or what selective holds again, and what full holds again (``H`` the range's largest).

``V`` falls as ``S`` grows: a stage fits only where ``V(S_max)`` does, and then saves at least the
least ``S`` that each of three necessary conditions gives. Recompute costs each byte it saves at
least the cheapest seconds per byte of the range's layers' options, so the stage's work per
micro-batch is at least its layers' (``RankWork.layer_work``) plus that. The least over splits of
the fullest stage (bytes) and of the slowest (seconds) are dynamic programs over the stages' last
layers, as ``pipeline_memory_floor``'s.

Every figure comes from the rank's phase table at the combination's micro-batch size, unsharded:
ZeRO changes a layer's always-live bytes (counted by role in ``R``) and adds transients (DDP's
buckets, FSDP's gathers), never takes activations away (checked against every split and choice in
tests/plan/test_pipeline_floor.py). Where a rank holds several chunks (interleaved 1F1B, looped BFS),
each chunk is such a stage, bounded alone at its own first backward: the rank's other chunks' bytes
(resident, in flight, kept after a send) only add to it. And each rank at its own first backward holds
every one of its chunks' ``R`` and ``max(Y - S, 0)`` per micro-batch in flight, and the running chunk's
``Z`` term: summed over the ranks, a sum over the chunks whatever the split, whose least over splits
(``_least_sum``) over the ranks bounds the fullest rank, the mean. Each such rank fits only where its
chunks' recompute saves what it holds beyond the device, which forces recompute no chunk alone does:
``busy_floor`` bounds the ranks' busy time summed, that recompute included, by a Lagrange bound over the
recompute's knots. Schedules that split the backward (zero bubble) or place chunks in a V are not bounded
here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..io.profile import Target
from ..model.analysis import Analysis
from ..model.datasharding import zero_share
from ..solver.schedule_generation import BACKWARD_OPS, Op, ScheduleInstance, build_schedule
from ..solver.schedule_kinds import Placement, ScheduleKind, traits

__all__ = ["RangeFloors", "bounded", "busy_floor", "first_backward_in_flight", "pipeline_floors", "rank_first_backward"]


@dataclass(frozen=True)
class RangeFloors:
    """Per layer range ``a..b`` ((L, L) arrays, entries with ``b >= a``) of one rank's phase table at
    one micro-batch size, unsharded: the terms of the module docstring's ``V`` that do not depend on
    the position or the layout."""

    #: each layer's always-live bytes by role (``param``, ``grad``, ``state``, ``other``)
    roles: Mapping[str, np.ndarray]
    forward_cut: np.ndarray            #: (L + 1,) bytes crossing each cut forward
    backward_cut: np.ndarray           #: (L + 1,) and back
    unstashed: np.ndarray              #: (L + 1,) of ``forward_cut``, what no backward reads
    model_output: float
    stash: np.ndarray                  #: ``Y`` less what the last stage keeps (its position's)
    full_backward: np.ndarray          #: the full backward's transient less the received input
    own: np.ndarray                    #: ``U``
    held: np.ndarray                   #: ``H``
    saves: np.ndarray                  #: ``S_max``
    #: (K,) seconds per saved byte at which the recompute cost's supporting lines are taken (``recompute_cost``)
    knots: np.ndarray
    #: (K, L, L) per knot, the bytes and the seconds of the range's options' pieces cheaper than it
    knot_saved: np.ndarray
    knot_cost: np.ndarray

    @property
    def num_layers(self) -> int:
        return len(self.own)

    @classmethod
    def of(cls, analysis: Analysis, target: Target | None = None) -> RangeFloors | None:
        """From an unsharded rank's analysis at the combination's micro-batch size, its layers timed
        by the roofline on ``target`` as the engine times them (model/costmodel.py's ``on``); None
        where its profile records no phases (no phase table). The recompute's time is its table's
        where in seconds, else none (0)."""
        from ..model.datasharding import always_live_by_layer
        if analysis.model.phase_cols is None:
            return None
        table = (analysis.model.on(target) if target is not None else analysis.model).phase_table
        L = table.num_layers
        first, last = np.arange(L)[:, None], np.arange(L)[None, :]
        upper = last >= first
        cut = np.asarray(table.forward_cut, np.float64)
        unstashed = (np.zeros(L + 1) if table.forward_cut_unstashed is None
                     else np.asarray(table.forward_cut_unstashed, np.float64))
        received = np.where(first > 0, cut[:L][:, None], 0.0)
        received_stashed = received - np.where(first > 0, unstashed[:L][:, None], 0.0)
        stash = np.maximum(np.asarray(table.stash, np.float64) - received_stashed, 0.0)
        full = np.asarray(table.peaks["full_backward"], np.float64) - received
        rec = table.recompute
        if rec is None:
            zeros = np.zeros(L)
            own_layer, held_layer, best_saved = zeros, zeros, zeros
            pieces = (np.zeros(0, np.int64), np.zeros(0), np.zeros(0))
        else:
            saved = np.asarray(rec.saved, np.float64)
            rerun = np.asarray(rec.rerun, np.float64)
            own_layer = saved[2]
            # what the backward holds of each layer's own stash whatever its option (the module docstring)
            selective = np.where(saved[1] > 0, np.maximum(own_layer - saved[1], rerun[1]), own_layer)
            full_option = np.where(saved[2] > 0, rerun[2], own_layer)
            held_layer = np.minimum(own_layer, np.minimum(selective, full_option))
            best_saved = saved.max(axis=0)
            added = np.asarray(rec.added, np.float64) if rec.time_unit == "seconds" else np.zeros_like(saved)
            pieces = _pieces(saved, added)
        prefix = np.concatenate([[0.0], np.cumsum(own_layer)])
        saves_prefix = np.concatenate([[0.0], np.cumsum(best_saved)])
        own = np.where(upper, prefix[last + 1] - prefix[first], 0.0)
        saves = np.where(upper, saves_prefix[last + 1] - saves_prefix[first], 0.0)
        knots, knot_saved, knot_cost = _knot_tables(*pieces, L)
        return cls(always_live_by_layer(analysis.profile, analysis.layers), cut,
                   np.asarray(table.backward_cut, np.float64), unstashed, float(table.model_output),
                   np.where(upper, stash, 0.0), np.where(upper, full, 0.0), own, _range_max(held_layer, L), saves,
                   knots, knot_saved, knot_cost)

    def recompute_cost(self, saved: np.ndarray) -> np.ndarray:
        """(L, L): per range, seconds per micro-batch that saving ``saved`` bytes ((L, L)) of its
        stash costs at least, whatever the layers' options: the fractional knapsack over each layer's
        options (its lower convex hull: ``_pieces``) is convex in the bytes saved, so each of its
        supporting lines, ``cost(< k) + k (saved - saved(< k))`` at a knot ``k``, is below it."""
        if not len(self.knots):
            return np.zeros_like(saved)
        lines = self.knot_cost + self.knots[:, None, None] * (saved[None] - self.knot_saved)
        out: np.ndarray = np.maximum(lines.max(axis=0), 0.0)
        return out


#: the most knots ``recompute_cost`` takes lines at (each an (L, L) table per micro-batch size)
KNOTS = 12


def _pieces(saved: np.ndarray, added: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each layer's options (rows none, selective, full of ``saved`` bytes and ``added`` seconds) as
    the pieces of their lower convex hull from (0, 0): (layer, bytes, seconds) per piece, each piece
    no cheaper per byte than the one before it in its layer; taken cheapest first, the pieces give
    the least time for every saving, any mix of options included (the knapsack's relaxation)."""
    layer, size, cost = [], [], []
    for i in range(saved.shape[1]):
        s1, c1, s2, c2 = saved[1, i], added[1, i], saved[2, i], added[2, i]
        if s2 <= 0 and s1 <= 0:
            continue
        if s1 > 0 and s2 > s1 and c1 * (s2 - s1) <= (c2 - c1) * s1:      # selective, then the rest to full
            layer += [i, i]
            size += [s1, s2 - s1]
            cost += [c1, max(c2 - c1, 0.0)]
        else:          # one piece: full (selective lies above the line to it, or saves as much at most)
            layer.append(i)
            size.append(max(s1, s2))
            cost.append(c2 if s1 < s2 else min(c1, c2))
    return np.asarray(layer, np.int64), np.asarray(size, np.float64), np.asarray(cost, np.float64)


def _knot_tables(layer: np.ndarray, size: np.ndarray, cost: np.ndarray, L: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The knots (up to ``KNOTS`` of the pieces' seconds per byte, the least always) and, per knot and
    range, the bytes and seconds of its pieces cheaper per byte than the knot."""
    if not len(size):
        return np.zeros(0), np.zeros((0, L, L)), np.zeros((0, L, L))
    per_byte = cost / size
    distinct = np.unique(per_byte)
    knots = distinct if len(distinct) <= KNOTS else np.quantile(distinct, np.linspace(0, 1, KNOTS))
    first, last = np.arange(L)[:, None], np.arange(L)[None, :]
    upper = last >= first
    saved_tables, cost_tables = [], []
    for k in knots:
        cheaper = per_byte < k
        s = np.concatenate([[0.0], np.cumsum(np.bincount(layer[cheaper], weights=size[cheaper], minlength=L))])
        c = np.concatenate([[0.0], np.cumsum(np.bincount(layer[cheaper], weights=cost[cheaper], minlength=L))])
        saved_tables.append(np.where(upper, s[last + 1] - s[first], 0.0))
        cost_tables.append(np.where(upper, c[last + 1] - c[first], 0.0))
    return np.asarray(knots, np.float64), np.stack(saved_tables), np.stack(cost_tables)


def _range_max(values: np.ndarray, L: int) -> np.ndarray:
    """(L, L): the largest of ``values[a..b]`` (0 below the diagonal)."""
    out = np.zeros((L, L))
    for a in range(L):
        out[a, a:] = np.maximum.accumulate(values[a:])
    return out


def bounded(schedule: str) -> bool:
    """Whether ``pipeline_floors`` bounds ``schedule``: an unsplit backward, chunks looped over the ranks
    (1F1B, GPipe, interleaved 1F1B, looped BFS)."""
    if schedule == "auto":
        return False
    t = traits(schedule)
    return not t.splits_backward and t.placement is Placement.LOOP


def first_backward_in_flight(schedule: ScheduleInstance) -> np.ndarray:
    """Per chunk, the micro-batches it holds at its first backward: the forwards its rank ran on it
    before that backward, the running one's included (1F1B: ``min(M, pp - r)``; GPipe: ``M``)."""
    out = np.zeros(schedule.chunks, np.int64)
    for rank in range(schedule.devices):
        done: set[int] = set()
        for a in schedule.leaves[rank]:
            if a.op is Op.FORWARD and a.chunk not in done:
                out[a.chunk] += 1
            elif a.op in BACKWARD_OPS:
                done.add(a.chunk)
    return out


def rank_first_backward(schedule: ScheduleInstance) -> tuple[np.ndarray, np.ndarray]:
    """At each rank's first backward: per chunk, the micro-batches its rank holds of it (the forwards
    run on it so far, the running one's included), and whether it is that backward's chunk."""
    counts = np.zeros(schedule.chunks, np.int64)
    running = np.zeros(schedule.chunks, bool)
    for rank in range(schedule.devices):
        for a in schedule.leaves[rank]:
            if a.op in BACKWARD_OPS:
                running[a.chunk] = True
                break
            if a.op is Op.FORWARD:
                counts[a.chunk] += 1
    return counts, running


@lru_cache(maxsize=256)
def _schedule_counts(kind: ScheduleKind, stages: int, micro_batches: int, chunks_per_rank: int
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``first_backward_in_flight`` and ``rank_first_backward`` of the schedule, from one listing of its
    actions, kept: a search asks for one (stages, micro-batches, chunks) under many degrees and ZeRO
    stages, and a long schedule's actions take a tenth of a second."""
    schedule = build_schedule(kind, stages, micro_batches, chunks_per_rank)
    out = (first_backward_in_flight(schedule), *rank_first_backward(schedule))
    for a in out:
        a.setflags(write=False)
    return out


def pipeline_floors(rf: RangeFloors, *, schedule: str, stages: int, micro_batches: int, dp: int, zero: int,
                    capacity: float, layer_work: np.ndarray | None, chunks_per_rank: int = 1
                    ) -> tuple[float, float, float]:
    """(bytes, seconds, seconds) for ``stages`` ranks of ``chunks_per_rank`` chunks each under
    ``schedule`` (``bounded``) with ``micro_batches``, the always-live bytes sharded as ZeRO ``zero``
    shards them over ``dp`` ranks: the least, over every split into ``C = stages x chunks_per_rank``
    chunks, of the fullest chunk's ``V(S_max)`` (the module docstring); of the slowest chunk's work per
    micro-batch with the recompute its memory forces under ``capacity``; and of that recompute summed
    over the chunks (``layer_work``: each layer's work per micro-batch at least; None: neither time is
    bounded, 0). Both times are inf where no split fits. Where a rank holds several chunks, ``V``
    bounds it at each chunk's first backward alone: its other chunks' bytes (resident, in flight,
    kept after a send) only add to it."""
    L, M = rf.num_layers, micro_batches
    pp = stages * chunks_per_rank
    kind = _checked(schedule, pp, L)
    if kind is ScheduleKind.ONE_F_ONE_B and chunks_per_rank == 1:        # as its actions have it, any M
        in_flight = np.minimum(M, pp - np.arange(pp))
    elif kind is ScheduleKind.GPIPE and chunks_per_rank == 1:
        in_flight = np.full(pp, M)
    else:
        in_flight = _schedule_counts(kind, stages, M, chunks_per_rank)[0]
    first, last = np.arange(L)[:, None], np.arange(L)[None, :]
    upper = last >= first
    resident, stash, z = _stage_terms(rf, kind, pp, M, dp, zero)
    most = rf.saves
    work = None
    if layer_work is not None:
        prefix = np.concatenate([[0.0], np.cumsum(np.asarray(layer_work, np.float64))])
        work = prefix[last + 1] - prefix[first]
    peak_rows, time_rows, recompute_rows = [], [], []
    for position in range(pp):
        n = int(in_flight[position])
        others = n - 1
        peak = resident + others * np.maximum(stash - most, 0.0) + np.maximum(
            z - rf.own + np.maximum(rf.held, rf.own - most), 0.0)
        peak_rows.append(np.where(upper, peak, math.inf))
        if work is None:
            continue
        # three conditions V(S) <= capacity needs: V >= R + Z - S; >= that plus the others' Y - S; and
        # >= R + (n - 1)(Y - S) + max(Z - U + H, 0)
        need = np.maximum(0.0, resident + z - capacity)
        need = np.maximum(need, (resident + z + others * stash - capacity) / n)
        if others:
            need = np.maximum(need, stash - (capacity - resident - np.maximum(z - rf.own + rf.held, 0.0)) / others)
        fits = upper & (peak <= capacity) & (need <= most * (1 + 1e-12))
        recompute = np.where(fits, rf.recompute_cost(need), math.inf)
        time_rows.append(work + recompute)
        recompute_rows.append(recompute)
    fullest = _least_largest(peak_rows)
    if chunks_per_rank > 1:
        # every rank at its first backward holds its chunks' resident bytes, the stash of each micro-batch
        # in flight and the running chunk's full backward: summed over the ranks, a sum over the chunks
        # whatever the split, and the fullest rank holds at least the mean
        _, counts, running = _schedule_counts(kind, stages, M, chunks_per_rank)
        rank_rows = []
        for position in range(pp):
            held = int(counts[position]) - int(running[position])
            row = resident + held * np.maximum(stash - most, 0.0)
            if running[position]:
                row = row + np.maximum(z - rf.own + np.maximum(rf.held, rf.own - most), 0.0)
            rank_rows.append(np.where(upper, row, math.inf))
        fullest = max(fullest, _least_sum(rank_rows) / stages)
    if work is None:
        return fullest * (1 - 1e-9), 0.0, 0.0
    return fullest * (1 - 1e-9), _least_largest(time_rows) * (1 - 1e-9), _least_sum(recompute_rows) * (1 - 1e-9)


def _checked(schedule: str, chunks: int, layers: int) -> ScheduleKind:
    """The kind of a schedule the floors bound, over 1 to ``layers`` chunks; ValueError otherwise."""
    if not bounded(schedule):
        raise ValueError(f"no pipeline floor for {schedule}")
    if chunks < 1 or chunks > layers:
        raise ValueError("a pipeline floor needs 1 to L chunks")
    return traits(schedule).kind


def _stage_terms(rf: RangeFloors, kind: ScheduleKind, chunks: int, micro_batches: int, dp: int, zero: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(L, L) per range, as a chunk of a pipeline of ``chunks`` under ``kind``: ``R`` (its always-live
    bytes sharded as ZeRO ``zero`` shards them over ``dp`` ranks, and its receive buffers), ``Y`` (one
    micro-batch's stash with what the runtime keeps beside it) and ``Z`` (the module docstring's)."""
    L, M = rf.num_layers, micro_batches
    first, last = np.arange(L)[:, None], np.arange(L)[None, :]
    per_layer = zero_share(rf.roles, dp, zero) + rf.roles["other"]
    held_prefix = np.concatenate([[0.0], np.cumsum(per_layer)])
    is_last = last == L - 1
    received = np.where(first > 0, rf.forward_cut[:L][:, None], 0.0)
    sent_back = np.where(~is_last, rf.backward_cut[1:L + 1][None, :], 0.0)
    resident = held_prefix[last + 1] - held_prefix[first] + M * (received + sent_back)
    unstashed_out = np.where(is_last, 0.0, rf.unstashed[1:L + 1][None, :])
    stash = rf.stash + np.where(is_last, rf.model_output, unstashed_out)
    # what the schedule holds through a full backward where there are chunks to hold it for: 1F1B the
    # output it sent on (the last stage: the model's output and the gradient it sends back), the others
    # the last chunk's output; all an unstashed output handed back from the forward cache
    if chunks == 1:
        hold = np.zeros((L, L))
    elif kind is ScheduleKind.ONE_F_ONE_B:
        hold = np.where(is_last, rf.model_output + np.where(first > 0, rf.backward_cut[:L][:, None], 0.0),
                        rf.forward_cut[1:L + 1][None, :])
    else:
        hold = np.where(is_last, rf.model_output, 0.0)
    z = np.maximum(rf.full_backward + hold + unstashed_out, 0.0)
    return resident, stash, z


def busy_floor(rf: RangeFloors, *, schedule: str, stages: int, micro_batches: int, dp: int, zero: int,
               capacity: float, layer_work: np.ndarray, chunks_per_rank: int = 1) -> float:
    """Seconds: the least, over every split into ``stages x chunks_per_rank`` chunks, of the ranks'
    busy time summed (each rank runs every micro-batch on each of its chunks: ``M`` x their layers'
    work, ``layer_work``, and the recompute its memory forces under ``capacity``); the busiest rank
    is at least its mean. Where a rank holds several chunks, the recompute is forced by the rank's
    whole memory at its first backward, not a chunk's alone (``pipeline_floors``'s times).

    Rank ``r`` at its first backward holds ``sum over its chunks c of m_c - n_c S_c`` at least, where
    ``m_c = R_c + h_c Y_c`` (``h_c`` micro-batches held, ``n_c = h_c`` or ``h_c + 1`` for the
    running chunk, whose ``m_c`` adds ``Z_c``: its full backward term is at least ``Z - S``) and
    ``S_c`` the bytes its recompute saves per micro-batch; so it fits only where
    ``sum n_c S_c >= sum m_c - capacity``. The least recompute cost under that constraint is, for
    any multiplier ``t / n_r >= 0`` (``n_r`` the rank's largest ``n_c``: ``n_c / n_r <= 1``), at
    least ``sum over c of min over S of (cost_c(S) - t S)`` plus ``t / n_r (sum m_c - capacity)``
    (Lagrange); at ``t`` one of ``RangeFloors``' knots the minimum takes every piece cheaper per
    byte than ``t`` (the knapsack's relaxation, below each option mix's cost). Each knot's bound is
    a sum over the chunks of a table per position, whose least over splits ``_least_sum`` gives;
    the largest over the knots (and ``t = 0``, the work alone) is the floor. Both rank and chunk
    terms come from ``_stage_terms`` as ``pipeline_floors`` has them."""
    L, M = rf.num_layers, micro_batches
    pp = stages * chunks_per_rank
    kind = _checked(schedule, pp, L)
    first, last = np.arange(L)[:, None], np.arange(L)[None, :]
    upper = last >= first
    prefix = np.concatenate([[0.0], np.cumsum(np.asarray(layer_work, np.float64))])
    work = np.where(upper, prefix[last + 1] - prefix[first], math.inf)
    floor = _least_sum([work] * pp)
    if not len(rf.knots):
        return M * floor * (1 - 1e-9)
    resident, stash, z = _stage_terms(rf, kind, pp, M, dp, zero)
    _, counts, running = _schedule_counts(kind, stages, M, chunks_per_rank)
    rank_of = np.arange(pp) % stages
    most = np.zeros(stages, np.int64)
    np.maximum.at(most, rank_of, counts)
    if not most.all():
        return M * floor * (1 - 1e-9)
    held = [resident + float(counts[p] - running[p]) * stash + (z if running[p] else 0.0) for p in range(pp)]
    weight = 1.0 / most[rank_of]
    for k, t in enumerate(rf.knots):
        base = work + rf.knot_cost[k] - t * rf.knot_saved[k]
        rows = [np.where(upper, base + t * weight[p] * held[p], math.inf) for p in range(pp)]
        floor = max(floor, _least_sum(rows) - t * capacity * float((1.0 / most).sum()))
    return M * floor * (1 - 1e-9)


def _least_largest(rows: list[np.ndarray]) -> float:
    """The least, over splits of the L layers into ``len(rows)`` consecutive stages, of the largest
    ``rows[position][a, b]`` of its stages (dynamic programming over the stages' last layers)."""
    best = rows[0][0]                                        # stage 0 from layer 0 to each last layer
    for cost in rows[1:]:
        best = np.min(np.maximum(best[:-1, None], cost[1:]), axis=0)     # a stage from a after a split at a - 1
    return float(best[-1])


def _least_sum(rows: list[np.ndarray]) -> float:
    """The least, over splits of the L layers into ``len(rows)`` consecutive stages, of the sum of
    ``rows[position][a, b]`` over its stages."""
    best = rows[0][0]
    for cost in rows[1:]:
        best = np.min(best[:-1, None] + cost[1:], axis=0)
    return float(best[-1])
