"""What a pipeline schedule is, before any action is listed: the schedules of
``torch.distributed.pipelining`` (torch 2.13) by stagesplit's name for them (``ScheduleKind``),
their fixed traits (the torch class, chunk placement, whether the backward is split), the
configurations torch's constructors accept, and where each chunk lives.

It exists apart from the action lists (``schedule_generation``) because the request's checks
(``solver/request.py``) and the exporters need only these facts, not the generators.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np

from ..errors import OptionError

__all__ = ["Placement", "ScheduleKind", "ScheduleTraits", "check_chunks_per_rank", "check_schedule", "chunk_ranks",
           "is_valid", "traits"]


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


def _kind(kind: ScheduleKind | str) -> ScheduleKind:
    """``kind`` as a ``ScheduleKind``; a one-line OptionError naming the choices if it is none."""
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

