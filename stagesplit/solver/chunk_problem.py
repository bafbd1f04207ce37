"""The chunk-split problem of a pipeline schedule: what a split of the layers into the ``C = v x P``
chunks of a schedule must satisfy and minimise (``ChunkProblem``), each chunk's memory as
torch.distributed.pipelining's runtime holds it (``chunk_memory``), the durations a split's step is
simulated from (``step_durations``), and the record of a split evaluated (``ChunkResult``).

A split is ``C + 1`` boundaries from 0 to L (chunk ``c`` runs on rank ``schedule.chunk_rank[c]``).
Evaluating one is ``chunk_evaluation``; the searches over splits are ``chunk_search`` (quick, and
every split for small problems) and ``chunk_cpsat`` (proven optimal).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol

import numpy as np
from numpy.typing import ArrayLike

from ..model.phases import PhaseTable
from .request import Objective, RecomputeMode
from .schedule_generation import ScheduleInstance
from .schedule_kinds import ScheduleKind, ScheduleTraits
from .schedule_memory import ChunkMemory, RankMemory, rank_memory
from .schedule_simulation import CriticalPath

__all__ = ["ChunkProblem", "ChunkResult", "chunk_memory", "remote_links", "step_durations"]


@dataclass(frozen=True)
class ChunkProblem:
    """What a chunk split must satisfy and minimise."""

    table: PhaseTable
    schedule: ScheduleInstance
    capacities: np.ndarray                  # (P,) bytes each rank may use
    seconds_per_byte: float = 0.0           # transfer time of a byte crossing a boundary between ranks
    objective: Objective = Objective.COMPUTE
    min_layers: int = 1
    max_layers: int | None = None
    pinned_splits: tuple[int, ...] = ()     # a chunk starts at each of these layers
    time_limit: float = 60.0
    workers: int = 1
    #: activation recompute: one option on every layer, or AUTO (chosen per layer)
    recompute: RecomputeMode = RecomputeMode.NONE
    #: only splits faster than this step time are sought (``--schedule auto``: the fastest plan of
    #: another schedule); where there is none, the search ends "slower" instead of proving its own optimum
    cutoff: float | None = None

    def fixed_choice(self) -> np.ndarray | None:
        """Every layer's option where the mode fixes it (None for AUTO)."""
        L = self.num_layers
        if self.recompute is RecomputeMode.AUTO:
            return None
        index = {RecomputeMode.NONE: 0, RecomputeMode.SELECTIVE: 1, RecomputeMode.FULL: 2}[self.recompute]
        return np.full(L, index, np.int64)

    @property
    def chunks(self) -> int:
        return self.schedule.chunks

    @property
    def num_layers(self) -> int:
        return self.table.num_layers


#: a split's C + 1 chunk boundaries, from 0 to L
Bounds = Sequence[int] | np.ndarray


class ScheduleView(Protocol):
    """What ``chunk_memory`` reads of a schedule: a ``ScheduleInstance``, or the stand-in of one
    range that ``chunk_cpsat_tables`` prices."""

    @property
    def micro_batches(self) -> int: ...
    @property
    def traits(self) -> ScheduleTraits: ...
    @property
    def kind(self) -> ScheduleKind: ...


def chunk_memory(table: PhaseTable, bounds: Bounds, schedule: ScheduleView,
                 choice: np.ndarray | None = None) -> ChunkMemory:
    """The chunks' figures as torch.distributed.pipelining's runtime holds them (each rule
    measured on real pipelines, tests/solver/test_chunks_torch.py):

    * every stage keeps one receive buffer per micro-batch for its input (all but the first
      chunk) and for its output's gradient (all but the last): resident;
    * a chunk's received input is that buffer, so the stash does not count it again;
    * the last chunk keeps each micro-batch's output (the loss's input) until its backward;
    * where the backward is split (zero-bubble), B keeps the whole stash and the output
      gradients W reads (``weight_stash``) and holds them through B and W; the first chunk's
      B does nothing (the model's input needs no gradient) and its W runs the whole backward;
    * runtimes that wait on sends only at the step's end keep each output and input gradient sent
      to another rank (``retained``; a V's turn hands them to the chunk on the same rank without a
      send); Schedule1F1B keeps one of the last chunk's outputs and its input gradient between
      micro-batches, and every other chunk's last sent output;
    * where the backward is not split: a chunk's transient figures (taken from the whole
      model) count its input, which is the receive buffer already resident, so it is taken off
      them; the last of several chunks holds its output (the loss's input, which a whole-model
      step frees after the loss) through its backward;
    * FSDP2 under a schedule (ZeRO 3, resharding after the forward): a backward leaves the chunk's
      parameters unsharded until its next forward reshards them (``unsharded``).

    ``choice``: each layer's recompute option (model/recompute.py; None: none)."""
    split = schedule.traits.splits_backward
    cc = table.chunks(bounds, split_backward=split)
    b = np.asarray(bounds, np.int64)
    C = len(b) - 1
    M = schedule.micro_batches
    first, last = np.arange(C) == 0, np.arange(C) == C - 1
    received = np.where(first, 0, table.forward_cut[b[:-1]]).astype(np.int64)
    grad_received = np.where(last, 0, table.backward_cut[b[1:]]).astype(np.int64)
    resident = cc.resident + M * (received + grad_received)
    kept_output = np.where(last, cc.output, 0)
    saved = change = forward_change = np.zeros(C, np.int64)
    if choice is not None and table.recompute is not None:
        saved, forward_change, change, _ = table.recompute.chunk_changes(b, np.asarray(choice, np.int64))
    # the stash counts a crossing tensor only where a backward reads it (model/phases.py); the runtime
    # keeps every chunk's output until its backward (PipelineStage's forward cache) whether or not one does
    unstashed = (np.zeros(len(table.forward_cut), np.int64) if table.forward_cut_unstashed is None
                 else np.asarray(table.forward_cut_unstashed, np.int64))
    received_stashed = received - np.where(first, 0, unstashed[b[:-1]])
    output_unstashed = np.where(last, 0, unstashed[b[1:]]).astype(np.int64)
    stash = np.maximum(np.maximum(cc.stash - received_stashed, 0) + kept_output + output_unstashed - saved, 0)
    # what B re-materialises for a recomputed layer stays for W: the weight stash keeps it all (B has
    # let go of the output)
    # (under a split backward the last chunk's output goes as B ends: the runtime pops it from its forward
    # cache; B holds it to its end)
    weight_stash = np.maximum(cc.weight_stash - received_stashed, 0) + (0 if split else kept_output)
    # a V's turn: the chunk hands its output to the next chunk on its rank, which takes it as that
    # micro-batch's receive slot (torch's set_local_fwd_input), letting go of the tensor the slot held;
    # the output is then counted once, in the receive buffers
    handed = handed_outputs(schedule, cc.sent_forward)
    stash = np.maximum(stash - handed, 0)
    weight_stash = np.maximum(weight_stash - np.maximum(handed - output_unstashed, 0), 0)
    # B frees the loss side of its graph only as it ends: held at its peak, gone before W
    freed = cc.input_backward_frees if split else 0
    hold = np.zeros(C, np.int64)
    one_f_one_b = schedule.kind is ScheduleKind.ONE_F_ONE_B and C > 1
    if one_f_one_b:
        hold[:-1] = cc.sent_forward[:-1]
        hold[-1] = cc.output[-1] + cc.sent_backward[-1]
    # measured on real pipelines where the backward is not split (tests/model/test_recompute_torch.py,
    # tests/exporters/test_export_recompute_torch.py)
    input_again = 0 if split else received
    output_held = np.where(last & (not split) & (not one_f_one_b) & (C > 1), cc.output, 0)
    # clipped before the recompute's change, as the CP-SAT model has it
    # (chunk_cpsat_model._recompute_variables)
    forward = np.maximum(np.maximum(cc.forward_peak - input_again + hold, 0) + forward_change, 0)
    # a backward holds the output it was handed from the forward cache until it ends
    held_output = np.maximum(output_unstashed - handed, 0)
    full = np.maximum(np.maximum(cc.full_backward_peak - input_again + hold + output_held + held_output, 0) + change,
                      0)
    # a split backward's phase peaks are priced with the stash and the gradients W reads held through B
    # (model/phases.py ``_held_through_backward``); W runs after B let go of what it frees
    backward = np.maximum(cc.backward_input_peak + held_output + (kept_output if split else 0) + change, 0)
    weight = np.maximum(cc.backward_weight_peak - freed - received_stashed, 0)
    if split:
        # the model's input needs no gradient: the first chunk's B has nothing to do and its W
        # runs the whole backward (and any recompute) from the stash
        backward[0] = stash[0]
        weight_stash[0] = stash[0]
        weight[0] = full[0]
    # what the runtime keeps until the step ends is what it sent to another rank: a V's turn hands the
    # output (and its gradient back) to the chunk on the same rank without a send
    sends_on, sends_back = remote_links(schedule, C)
    retained = np.where(sends_on, cc.sent_forward, 0) + np.where(sends_back, cc.sent_backward, 0)
    if split:
        # from B the output it sent is held once: torch keeps it (backward_state) until W and its send
        # to the step's end (``retained``), so the weight stash does not count the stashed output again
        stashed_output = np.where(last, 0, table.forward_cut[b[1:]] - unstashed[b[1:]]).astype(np.int64)
        weight_stash = np.maximum(weight_stash - np.where(sends_on, stashed_output, 0), 0)
    if C > 1 and _ends_share_rank(schedule) and table.tied_with_first is not None:
        # one rank holds the first and the last chunk (a V): a tied embedding is one tensor there
        resident[-1] -= table.tied_with_first[b[-2]]
    return ChunkMemory(resident=resident, stash=stash, weight_stash=weight_stash, forward_peak=forward,
                       backward_peak=backward, weight_peak=weight, full_backward_peak=full,
                       optimizer_peak=cc.optimizer_peak, retained=retained.astype(np.int64),
                       unsharded=cc.unsharded_after_backward)


def _ends_share_rank(schedule: object) -> bool:
    """Whether the first and the last chunk are on one rank (a V placement); a stand-in schedule
    (CP-SAT's per-range tables) says so itself."""
    given = getattr(schedule, "ends_share_rank", None)
    if given is not None:
        return bool(given)
    placement = getattr(schedule, "chunk_rank", None)
    return placement is not None and len(placement) > 1 and placement[0] == placement[-1]


def handing_chunks(schedule: object, chunks: int) -> np.ndarray:
    """Per chunk, whether it hands its output to the next chunk on its own rank (a V's turn; never the
    last chunk, nor any chunk of a stand-in schedule without a placement)."""
    sends_on, _ = remote_links(schedule, chunks)
    local: np.ndarray = ~sends_on
    local[-1] = False
    return local


def handed_outputs(schedule: object, sent_forward: np.ndarray) -> np.ndarray:
    """Per chunk, the output bytes it hands to the next chunk on its own rank (``handing_chunks``)."""
    out: np.ndarray = np.where(handing_chunks(schedule, len(sent_forward)), sent_forward, 0).astype(np.int64)
    return out


def remote_links(schedule: object, chunks: int) -> tuple[np.ndarray, np.ndarray]:
    """Per chunk: whether it sends its output on to another rank, and its input gradient back to
    another rank (a V's turn keeps both on one rank; a stand-in schedule without a placement: every
    link is remote)."""
    placement = getattr(schedule, "chunk_rank", None)
    if placement is None:
        return np.arange(chunks) < chunks - 1, np.arange(chunks) > 0
    ranks = np.asarray(placement, np.int64)
    remote = ranks[1:] != ranks[:-1]
    return np.append(remote, False), np.insert(remote, 0, False)


@dataclass(frozen=True)
class ChunkResult:
    """A split and what it gives: ``feasible`` when every rank fits (and the layer-count and
    pin rules hold), the step time and its bubble, and each rank's memory."""

    bounds: tuple[int, ...]
    feasible: bool
    reason: str
    step_time: float
    bubble: float
    #: each rank's peak (``schedule_memory.rank_peaks``)
    rank_peaks: tuple[int, ...]
    memory: ChunkMemory
    #: every layer's recompute option (0 none, 1 selective, 2 full: model/recompute.py)
    choice: tuple[int, ...] = ()
    #: the chain of actions that makes the step time (a valid lower bound for every split)
    path: CriticalPath | None = field(default=None, compare=False, repr=False)
    #: the schedule the split was judged under (``ranks`` follows its actions)
    schedule: ScheduleInstance | None = field(default=None, compare=False, repr=False)

    @property
    def peaks(self) -> np.ndarray:
        return np.array(self.rank_peaks, np.int64)

    @cached_property
    def ranks(self) -> tuple[RankMemory, ...]:
        """Each rank's memory action by action (where its peak is, for the plan): followed only
        for the splits a plan is built from, not for every split a search judges."""
        assert self.schedule is not None, "a split judged without its schedule"
        return rank_memory(self.schedule, self.memory)

    def key(self, problem: ChunkProblem) -> tuple[float, ...]:
        """What the objective orders splits by: feasible ones first; among splits that do not
        fit, the one closest to fitting (the fullest rank's share of its capacity)."""
        shares = self.peaks / problem.capacities
        fraction = float(np.max(shares))
        if not self.feasible:
            return (1, float(np.maximum(shares - 1, 0).sum()), fraction, self.step_time)
        if problem.objective is Objective.MEMORY:
            return (0, fraction, self.step_time)
        return (0, self.step_time, fraction)


def _times(problem: ChunkProblem, bounds: Bounds, choice: np.ndarray | None = None
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    cc = problem.table.chunks(bounds, split_backward=False)        # (its times alone)
    b = np.asarray(bounds, np.int64)
    backward_input = cc.backward_input_time
    if choice is not None and problem.table.recompute is not None:
        backward_input = backward_input + problem.table.recompute.chunk_effect(b, choice)[2]
    crossing = problem.table.forward_cut[b[1:-1]] + problem.table.backward_cut[b[1:-1]]
    transfer = crossing / 2 * problem.seconds_per_byte      # each direction once per micro-batch
    ranks = np.asarray(problem.schedule.chunk_rank)
    optimizer = np.bincount(ranks, weights=cc.optimizer_time, minlength=problem.schedule.devices)
    return cc.forward_time, backward_input, cc.backward_weight_time, transfer, optimizer


def step_durations(problem: ChunkProblem, bounds: Bounds, choice: ArrayLike | None = None) -> tuple[np.ndarray, ...]:
    """What the step time of the split ``bounds`` is simulated from (``evaluate_chunk_split``): per chunk the
    forward, input-gradient (recompute included) and weight-gradient times, per boundary the
    transfer time, per rank the optimizer step. A plan records them so that its schedule can be
    drawn from the very durations it was solved with."""
    return _times(problem, bounds, None if choice is None else np.asarray(choice, np.int64))
