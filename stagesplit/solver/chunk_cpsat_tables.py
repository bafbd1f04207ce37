"""The tables a chunk split's CP-SAT model is built from, computed once per search with numpy:
every range of layers' chunk figures under the runtime's rules for each chunk position
(``memory_tables``), which ranges fit a chunk's device on their own (``fits_alone``: no other can be
in a split that fits, which makes the model much smaller), and the busy time a range alone gives
its device (``range_busy``, a lower bound on the step).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..common.deadline import check_deadline
from .chunk_problem import ChunkProblem, chunk_memory, handing_chunks, remote_links
from .chunk_recompute import recompute_option_figures
from .schedule_generation import Op, ScheduleInstance
from .schedule_kinds import ScheduleKind, ScheduleTraits
from .schedule_memory import RankSignatures

__all__ = ["TRANSIENT_FIGURE", "fits_alone", "memory_tables", "range_busy", "reachable"]

#: what the search was doing where the time limit stops it (common/deadline.py)
_BUILDING = "building CP-SAT's model"

#: the chunk figure (a key of ``memory_tables``) that is each op's transient
TRANSIENT_FIGURE = {Op.FORWARD: "forward", Op.BACKWARD_INPUT: "backward", Op.BACKWARD_WEIGHT: "weight",
                    Op.FULL_BACKWARD: "full_backward"}


def fits_alone(problem: ChunkProblem, mem: dict[str, np.ndarray], sig: tuple[RankSignatures, ...]) -> np.ndarray:
    """(C, L, L) booleans: whether chunk ``c`` may hold layers ``a..b``, by the bytes that range
    alone puts on its device (the other chunks' terms are never negative): its resident bytes and,
    at each of the device's memory signatures, its own stashes and transient. With AUTO recompute
    those are the least any recompute prefixes leave (``_least_with_recompute``)."""
    C = problem.chunks
    L = problem.num_layers
    if problem.fixed_choice() is None and problem.table.recompute is not None:
        mem = _least_with_recompute(problem, mem)
    out = np.zeros((C, L, L), bool)
    upper = reachable(C, L)             # (the others are not priced: memory_tables)
    on, back = remote_links(problem.schedule, C)
    retained = [int(on[c]) * mem["retained_on"] + int(back[c]) * mem["retained_back"] for c in range(C)]
    local = handing_chunks(problem.schedule, C)
    stash = [mem["stash_handed" if local[c] else "stash"] for c in range(C)]
    weight_stash = [mem["weight_stash_handed" if local[c] else "weight_stash"] for c in range(C)]
    for rs in sig:
        cap = int(problem.capacities[rs.rank])
        for c in rs.chunks:
            worst = np.zeros((L, L), np.int64)
            for k, signature in enumerate(rs.signatures):
                check_deadline(_BUILDING)
                term = (int(rs.stash_counts[k, c]) * stash[c] + int(rs.weight_stash_counts[k, c])
                        * weight_stash[c] + int(rs.retained_counts[k, c]) * retained[c]
                        + int(rs.unsharded_counts[k, c]) * mem.get("unsharded", 0))
                if signature.op is None:
                    term = term + mem["optimizer"]
                elif signature.chunk == c:
                    term = term + mem[TRANSIENT_FIGURE[signature.op]]
                np.maximum(worst, term, out=worst)
            out[c] = upper & (mem["resident"] + worst <= cap)
    return out


def _least_with_recompute(problem: ChunkProblem, mem: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The figures ``mem`` less, where recompute changes them, the most bytes a range's recompute
    prefixes can save (the CP-SAT model's rule, ``chunk_cpsat_model._recompute_variables``: the
    stash drops by the bytes saved, and each transient by its whole own bytes less what the chunk
    still keeps, never more than the saving): no prefixes leave less. Full on the first ``p - a``
    layers and selective on the rest saves ``S2[p] - S2[a] + S1[e] - S1[p]``, largest at some p.
    Under a split backward no option beyond none is open (``recompute_options``): nothing drops."""
    saved, _, _ = recompute_option_figures(problem)
    L = problem.num_layers
    S2, S1 = (np.concatenate([[0], np.cumsum(v)]).astype(np.int64) for v in (saved[2], saved[1]))
    D = S2 - S1
    most = np.zeros((L, L), np.int64)           # [a, b]: the most layers a..b can save
    for a in range(L):
        best_p = np.maximum.accumulate(D[a:])   # [e - a]: max over a <= p <= e of S2[p] - S1[p]
        most[a, a:] = S1[a + 1:] - S2[a] + best_p[1:]
    out = dict(mem)
    for name in ("stash", "stash_handed", "forward", "backward", "full_backward"):
        out[name] = np.maximum(mem[name] - most, 0)
    return out


def range_busy(problem: ChunkProblem) -> np.ndarray:
    """(L, L) seconds: what a chunk holding layers ``a..b`` keeps its device busy for (every
    micro-batch's F, B and W and its optimizer step; no recompute; infinite below the diagonal):
    a lower bound on the step of any split with that chunk."""
    prefix = np.concatenate([np.zeros((1, 4)), np.cumsum(problem.table.layer_times[:, :4], axis=0)])
    span = prefix[1:][None, :, :] - prefix[:-1][:, None, :]          # [a, b]: layers a..b
    busy = problem.schedule.micro_batches * span[:, :, :3].sum(axis=2) + span[:, :, 3]
    return np.where(np.triu(np.ones(busy.shape, bool)), busy, np.inf)


def memory_tables(problem: ChunkProblem) -> dict[str, np.ndarray]:
    """Every range's chunk figures under the runtime's rules, for each chunk position's kind
    (first, middle, last: the receive buffers and kept outputs differ), as (L, L) arrays. The
    figure a chunk gets is the one for its position: ``chunk_memory`` on that range alone. Only the
    ranges some chunk of the split can hold are priced (``reachable``: the others stay 0, and no
    boundary reaches them); the tables are kept on the phase table for the next search of the same
    schedule (a search without recompute, its relaxation without memory limits and the search with
    recompute chosen per layer read the same figures: the tables are the ones without recompute)."""
    table = problem.table
    sched = problem.schedule
    fixed = problem.fixed_choice()      # AUTO: the tables without recompute, the model adds it
    # the recompute option "none" everywhere changes no figure where it saves nothing (as it does)
    if fixed is not None and not fixed.any() and (table.recompute is None or not table.recompute.saved[0].any()):
        fixed = None
    # a range's figures depend on the schedule only through what ``_stand_in`` keeps of it (not on
    # the chunk count: splits into 2, 3 or 4 chunks per device read the same figures), so one table
    # serves each count, priced for the ranges the counts so far could reach and extended for a new one
    placement: tuple[int, ...] = tuple(getattr(sched, "chunk_rank", ()))
    ends = len(placement) > 1 and placement[0] == placement[-1]
    key = ("memory_tables", sched.micro_batches, sched.kind, sched.traits, ends,
           None if fixed is None else fixed.tobytes())
    wanted = reachable(sched.chunks, table.num_layers)
    kept = table.memo.get(key)
    if kept is None:
        kept = table.memo[key] = _memory_tables(problem, fixed, wanted)
    else:
        assert isinstance(kept, dict)   # (the memo holds what this function put there)
        missing = wanted & ~kept["priced"]
        if missing.any():
            more = _memory_tables(problem, fixed, missing)
            for name, values in more.items():
                if name == "priced":
                    continue
                if name not in kept:                     # ("unsharded" is left out where all zero)
                    kept[name] = np.zeros_like(values)
                kept[name][missing] = values[missing]
            kept["priced"] = kept["priced"] | missing
    # each range's figures where this split's chunks can hold it, 0 elsewhere (as priced alone)
    return {name: np.where(wanted, values, 0) for name, values in kept.items() if name != "priced"}


def reachable(chunks: int, num_layers: int) -> np.ndarray:
    """(L, L) booleans: the ranges ``a..b`` some chunk of a ``chunks``-chunk split of ``num_layers``
    layers can hold (every chunk has a layer; the first starts at 0, the last ends at L - 1): the
    first chunk's ``0..b`` with ``b <= L - C``, the last's ``a..L-1`` with ``a >= C - 1``, and a
    middle chunk ``c``'s ``a..b`` with ``a >= c`` and ``b <= L - 1 - (C - 1 - c)``."""
    C, L = chunks, num_layers
    a = np.arange(L)[:, None]
    b = np.arange(L)[None, :]
    first = (a == 0) & ((b == L - 1) if C == 1 else (b <= L - C))
    last = (C >= 2) & (a >= C - 1) & (b == L - 1)
    middle = (C >= 3) & (a >= 1) & (b <= L - 2) & (b <= L - C + np.minimum(a, C - 2))
    out: np.ndarray = (first | last | middle) & (b >= a)
    return out


def _memory_tables(problem: ChunkProblem, fixed: np.ndarray | None, priced: np.ndarray) -> dict[str, np.ndarray]:
    """The figures of the ranges ``priced`` says ((L, L) booleans), 0 elsewhere, and ``priced``."""
    table = problem.table
    L = table.num_layers
    sched = problem.schedule
    # what a backward leaves until the step's end, by link: the real placement says which are remote
    names = ("resident", "stash", "weight_stash", "retained_on", "retained_back", "forward", "backward", "weight",
             "full_backward", "optimizer", "stash_handed", "weight_stash_handed", "unsharded")
    out = {n: np.zeros((L, L), np.int64) for n in names}
    # chunk position matters only through "first" (a == 0) and "last" (b == L - 1); a range's
    # figures as the only chunk of a one-chunk split would mix both, so build each from a split
    # of the right shape: the range, with the rest of the layers around it as other chunks
    for a in range(L):
        check_deadline(_BUILDING)
        for b in range(a, L):
            if not priced[a, b]:
                continue
            bounds = [0] if a > 0 else []
            bounds += [a, b + 1]
            if b + 1 < L:
                bounds.append(L)
            cm = chunk_memory(table, bounds, _stand_in(sched, len(bounds) - 1, a == 0, b == L - 1), fixed)
            cc = table.chunks(bounds, split_backward=sched.traits.splits_backward)
            i = 1 if a > 0 else 0
            # the same range handing its output to the next chunk on its rank (a V's turn: chunk_memory)
            out["stash_handed"][a, b] = max(int(cm.stash[i]) - int(cc.sent_forward[i]), 0)
            # under a split backward the weight stash of a range that sends on already leaves its output
            # out (held once, by the send or, handed, by the next chunk's receive slot: chunk_memory)
            splits = sched.traits.splits_backward and b + 1 < L
            out["weight_stash_handed"][a, b] = (int(cm.weight_stash[i]) if splits
                                                else max(int(cm.weight_stash[i]) - int(cc.sent_forward[i]), 0))
            for n, arr in (("resident", cm.resident), ("stash", cm.stash), ("weight_stash", cm.weight_stash),
                           ("retained_on", cc.sent_forward), ("retained_back", cc.sent_backward),
                           ("forward", cm.forward_peak), ("backward", cm.backward_peak),
                           ("weight", cm.weight_peak), ("full_backward", cm.full_backward_peak),
                           ("optimizer", cm.optimizer_peak), ("unsharded", cm.unsharded)):
                out[n][a, b] = arr[i]
    if not out["unsharded"].any():       # only FSDP2 under a schedule keeps any: no lookups for it otherwise
        del out["unsharded"]
    out["priced"] = priced.copy()
    return out


@dataclass(frozen=True)
class _StandIn:
    """Just what ``chunk_memory`` reads of a schedule."""

    micro_batches: int
    traits: ScheduleTraits
    kind: ScheduleKind
    ends_share_rank: bool


def _stand_in(schedule: ScheduleInstance, chunks: int, first: bool, last: bool) -> _StandIn:
    placement: tuple[int, ...] = getattr(schedule, "chunk_rank", ())
    ends = chunks > 1 and len(placement) > 1 and placement[0] == placement[-1]
    return _StandIn(schedule.micro_batches, schedule.traits, schedule.kind if (chunks > 1) else ScheduleKind.GPIPE,
                    ends)
