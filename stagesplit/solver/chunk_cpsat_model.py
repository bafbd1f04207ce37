"""The CP-SAT model of one round of the chunk search (``chunk_cpsat``), built in named steps.

CP-SAT chooses the chunk boundaries. Every figure of a chunk is an exact table lookup
(``chunk_cpsat_tables``) indexed by its range of layers, each rank's memory is the schedule's own
accounting as a max over linear forms (``schedule_memory.memory_signatures``), and the step time is
bounded below by what every schedule obeys (each rank's busy time, one micro-batch's pass) and by
every known chain of actions (the critical paths of splits already evaluated). With AUTO recompute
each chunk also gets recompute prefix lengths (``_recompute_variables``). The search adds a chain
per round, so each round builds its model afresh (``build_chunk_model``) from tables computed once
(``model_tables``).

The order in which variables and constraints are added is kept as it was measured
(bench_schedules.py): CP-SAT's search, and so the split it returns among equals, depends on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..common.deadline import check_deadline
from .chunk_cpsat_tables import TRANSIENT_FIGURE, fits_alone, memory_tables, range_busy
from .chunk_problem import ChunkProblem, ChunkResult, handing_chunks, remote_links
from .chunk_recompute import prefix_counts, recompute_option_figures, recompute_options
from .request import Objective
from .schedule_memory import RankSignatures
from .schedule_simulation import CriticalPath

__all__ = ["ChunkModel", "ModelTables", "build_chunk_model", "model_tables", "solution_log", "time_slack_units"]

#: what the search was doing where the time limit stops it (common/deadline.py)
_BUILDING = "building CP-SAT's model"

# A CP-SAT model, and its variables and linear expressions: ortools makes the pre-PEP 8 method names
# this module calls (NewIntVar, Add, AddElement, Value, ...) at run time, and its stubs declare only
# the new ones, so these are Any to mypy
_Model = Any
_Expr = Any
#: the chunk figures' lookups: {figure name: one expression per chunk}
_Figures = dict[str, list[_Expr]]
#: the recompute prefix lengths: {(chunk, "full" or "selective"): variable}
_Prefixes = dict[tuple[int, str], _Expr]


def time_slack_units(chunks: int) -> int:
    """Times are integers in the model: a chain's length there is within one unit per boundary of
    each kind it reads of its true length; this many units cover them all."""
    return 6 * chunks + 4


@dataclass(frozen=True)
class ModelTables:
    """What every round's model is built from, computed once per search."""

    signatures: tuple[RankSignatures, ...]   #: each rank's memory as a max over linear forms
    fixed: np.ndarray | None                 #: every layer's recompute option where the mode fixes it
    auto: bool                               #: recompute chosen per chunk by the model (AUTO)
    scale: float                             #: integer time units per second (or compute unit)
    prefix: dict[str, np.ndarray]            #: "F", "B", "W", "O": per-layer prefix times, in units
    cut_units: np.ndarray                    #: per layer boundary: one crossing's transfer time, in units
    memory: dict[str, np.ndarray]            #: per-range chunk figures (``memory_tables``)
    fits_alone: np.ndarray                   #: (C, L, L): the ranges each chunk may hold (``fits_alone``)
    range_busy: np.ndarray                   #: (L, L): a range's busy time (``range_busy``)


def model_tables(problem: ChunkProblem, signatures: tuple[RankSignatures, ...], scale: float) -> ModelTables:
    """The per-layer prefix times and per-range tables, as integers."""
    table = problem.table
    L = problem.num_layers
    fixed = problem.fixed_choice()
    auto = fixed is None and table.recompute is not None
    layer_times = table.layer_times.copy()
    if fixed is not None and table.recompute is not None:
        layer_times[:, 1] += table.recompute.added[fixed, np.arange(L)]
    prefix = {k: np.round(np.concatenate([[0.0], np.cumsum(layer_times[:, i])]) * scale).astype(np.int64)
              for i, k in enumerate(("F", "B", "W", "O"))}
    cut_units = np.round((table.forward_cut + table.backward_cut) / 2 * problem.seconds_per_byte
                         * scale).astype(np.int64)
    memory = memory_tables(problem)
    # each chunk's ranges (first layer a, last b) that fit its device on their own: no other can be
    # in a split that fits, so the range lookups need no other (a much smaller model to presolve)
    allowed = fits_alone(problem, memory, signatures)
    return ModelTables(signatures, fixed, auto, scale, prefix, cut_units, memory, allowed, range_busy(problem))


@dataclass(frozen=True)
class ChunkModel:
    """One round's model and the variables the search reads back from a solution."""

    model: _Model          #: the ``cp_model.CpModel``
    boundaries: list[_Expr]  #: C + 1 boundaries: chunk c holds layers boundaries[c] .. boundaries[c + 1] - 1
    recompute: _Prefixes   #: {(c, "full"), (c, "selective")}: the recompute prefix lengths (AUTO only)


def build_chunk_model(problem: ChunkProblem, tables: ModelTables, paths: list[CriticalPath], limit: float,
                      best: ChunkResult | None) -> ChunkModel:
    """The model of one round: splits that keep the rules and fit every rank, with the step at
    least every known chain in ``paths``; the step minimised (and, where ``limit`` is finite,
    below it: only splits faster than the step to beat), or the fullest rank's share of its
    capacity with the memory objective; ``best`` as the hint."""
    from ortools.sat.python import cp_model

    C = problem.chunks
    m: _Model = cp_model.CpModel()
    s = _boundaries(m, problem)
    _pin_boundaries(m, problem, s)
    at = _prefix_times(m, tables.prefix, s)
    cut = _transfer_times(m, tables.cut_units, s)
    ranges = _chunk_ranges(m, problem, tables, s, limit)
    q = _chunk_figures(m, problem, tables.memory, ranges)
    added: list[_Expr] = [0] * C
    y: _Prefixes = {}
    if tables.auto:
        largest = {k: int(v.max()) for k, v in tables.memory.items()}
        q, added, y = _recompute_variables(m, problem, s, q, tables.scale, largest, ranges)
    rank_forms = _rank_forms(tables.signatures, q, C)
    _memory_limits(m, problem, tables.signatures, rank_forms)
    step = _step_variable(m, problem, tables)
    _schedule_bounds(m, problem, at, cut, added, step, tables.auto)
    _chain_bounds(m, problem, at, cut, added, paths, step, tables.auto)
    _objective(m, problem, tables, rank_forms, step, limit)
    _hints(m, problem, best, s, y)
    invalid = m.Validate()
    if invalid:
        raise RuntimeError(f"internal error: CP-SAT model invalid: {invalid}")
    return ChunkModel(m, s, y)


# --- the steps, in the order the model is built -----------------------------------------------------

def _boundaries(m: _Model, problem: ChunkProblem) -> list[_Expr]:
    """The boundary variables (0 and L fixed at the ends), each chunk between the layer-count limits."""
    L, C = problem.num_layers, problem.chunks
    lo = max(problem.min_layers, 1)
    s = [m.NewConstant(0)] + [m.NewIntVar(c * lo, L - (C - c) * lo, f"s{c}") for c in range(1, C)] + \
        [m.NewConstant(L)]
    for c in range(C):
        m.Add(s[c + 1] - s[c] >= lo)
        if problem.max_layers is not None:
            m.Add(s[c + 1] - s[c] <= problem.max_layers)
    return s


def _pin_boundaries(m: _Model, problem: ChunkProblem, s: list[_Expr]) -> None:
    """A chunk starts at each pinned layer."""
    C = problem.chunks
    for j in problem.pinned_splits:
        hits = []
        for c in range(1, C):
            h = m.NewBoolVar(f"pin{j}_{c}")
            m.Add(s[c] == j).OnlyEnforceIf(h)
            hits.append(h)
        m.AddBoolOr(hits)


def _prefix_times(m: _Model, prefix: dict[str, np.ndarray], s: list[_Expr]) -> _Figures:
    """Each kind's prefix time at each boundary: a chunk's time is the difference at its ends."""
    at: _Figures = {}
    for k, arr in prefix.items():
        at[k] = []
        for c in range(len(s)):
            v = m.NewIntVar(0, int(arr[-1]), f"{k}{c}")
            m.AddElement(s[c], [int(x) for x in arr], v)
            at[k].append(v)
    return at


def _transfer_times(m: _Model, cut_units: np.ndarray, s: list[_Expr]) -> list[_Expr]:
    """Each inner boundary's transfer time (one crossing), looked up at the layer it falls on."""
    cut = []
    for c in range(1, len(s) - 1):
        v = m.NewIntVar(0, int(cut_units.max(initial=0)), f"t{c}")
        m.AddElement(s[c], [int(x) for x in cut_units], v)
        cut.append(v)
    return cut


@dataclass(frozen=True)
class _Ranges:
    """The ranges one chunk may hold, as (first layer, last layer) rows, and the variable that
    picks one of them (its row)."""

    pick: _Expr
    rows: np.ndarray


def _chunk_ranges(m: _Model, problem: ChunkProblem, tables: ModelTables, s: list[_Expr], limit: float) -> list[_Ranges]:
    """Each chunk's range, picked from the ranges it may hold: those that fit its device on their
    own, keep it busy for less than the step to beat (``limit``) beside the rank's other chunks at
    their least, and leave every chunk before and after it a layer (``min_layers``) at least. The
    figures of a chunk are looked up by that pick over its own ranges, not over all (L+1)^2 of them:
    on the Llama-3.1-405B's 126 layers in 64 chunks, about 2,000 a chunk instead of 16,129 (with the
    recompute prefixes' pairs, ``_prefix_pairs``, the layout search of its TP 8 rank under interleaved
    1F1B peaked at 1.4 GB, 5.8 GB before). A rank runs its chunks one after another, so no step is
    under their busy times' sum, and each of its other chunks holds ``min_layers`` layers at least:
    busy at least as long as the least busy range of that many layers."""
    L, C = problem.num_layers, problem.chunks
    lo = max(problem.min_layers, 1)
    busy = tables.range_busy
    ranks = np.asarray(problem.schedule.chunk_rank, np.int64)
    sharing = np.bincount(ranks)[ranks] - 1                  # per chunk, the other chunks on its rank
    least = float(min((busy[a, a + lo - 1] for a in range(L - lo + 1)), default=0.0))
    out = []
    for c in range(C):
        check_deadline(_BUILDING)
        # (the sum a hair over the limit kept: the model's own bound on the step settles it)
        ok = tables.fits_alone[c] & (busy + int(sharing[c]) * least <= limit * (1 + 1e-9))
        rows = np.argwhere(ok)                                   # (a, e - 1)
        first, end = rows[:, 0], rows[:, 1] + 1
        keep = (first >= c * lo) & (first <= L - (C - c) * lo) & (end >= (c + 1) * lo) & (end <= L - (C - c - 1) * lo)
        if c == 0:
            keep &= first == 0
        if c == C - 1:
            keep &= end == L
        rows = rows[keep]
        if len(rows):
            pick = m.NewIntVar(0, len(rows) - 1, f"range{c}")
            m.AddElement(pick, [int(a) for a in rows[:, 0]], s[c])
            m.AddElement(pick, [int(b) + 1 for b in rows[:, 1]], s[c + 1])
        else:                       # no range fits this chunk: no split does
            pick = m.NewIntVar(0, 0, f"range{c}")
            m.AddBoolOr([])
            rows = np.zeros((1, 2), np.int64)
        out.append(_Ranges(pick, rows))
    return out


def _chunk_figures(m: _Model, problem: ChunkProblem, memory: dict[str, np.ndarray], ranges: list[_Ranges]
                   ) -> _Figures:
    """Every chunk's memory figures, looked up by its range; ``retained`` as what each chunk's
    links to other ranks keep."""
    C = problem.chunks

    def lookup(name: str, values: np.ndarray, c: int) -> _Expr:
        check_deadline(_BUILDING)
        rows = ranges[c].rows
        held = values[rows[:, 0], rows[:, 1]]
        v = m.NewIntVar(0, int(max(held.max(initial=0), 0)), f"{name}{c}")
        m.AddElement(ranges[c].pick, [int(x) for x in held], v)
        return v

    q = {name: [lookup(name, arr, c) for c in range(C)] for name, arr in memory.items()}
    # a V's turn hands the chunk's output to the next chunk's receive slot (chunk_memory)
    for c in np.flatnonzero(handing_chunks(problem.schedule, C)):
        q["stash"][c], q["weight_stash"][c] = q["stash_handed"][c], q["weight_stash_handed"][c]
        if c == 0 and problem.schedule.traits.splits_backward:
            q["backward"][c] = q["stash"][c]
    on, back = remote_links(problem.schedule, C)
    q["retained"] = [int(on[c]) * q["retained_on"][c] + int(back[c]) * q["retained_back"][c]
                     for c in range(C)]
    return q


def _memory_limits(m: _Model, problem: ChunkProblem, signatures: tuple[RankSignatures, ...], rank_forms: list[list[_Expr]]) -> None:
    """Every rank fits: each of its memory signatures within its capacity."""
    for rs, forms in zip(signatures, rank_forms):
        for form in forms:
            m.Add(form <= int(problem.capacities[rs.rank]))


def _step_variable(m: _Model, problem: ChunkProblem, tables: ModelTables) -> _Expr:
    """The step time, in units, up to a horizon no split reaches."""
    M = problem.schedule.micro_batches
    prefix = tables.prefix
    horizon = int(prefix["F"][-1] + prefix["B"][-1] + prefix["W"][-1]) * M * 2 + \
        int(prefix["O"][-1]) + int(tables.cut_units.sum()) * M * 2 + 1
    return m.NewIntVar(0, horizon, "step")


def _schedule_bounds(m: _Model, problem: ChunkProblem, at: _Figures, cut: list[_Expr], added: list[_Expr], step: _Expr,
                     auto: bool) -> None:
    """Bounds every schedule obeys: a rank is busy for all its actions and its optimizer step, and
    one micro-batch goes forward through every chunk and back (then the first chunk's W)."""
    C, P = problem.chunks, problem.schedule.devices
    rank_of = np.asarray(problem.schedule.chunk_rank)
    M = problem.schedule.micro_batches
    for r in range(P):
        mine = [c for c in range(C) if rank_of[c] == r]
        busy = [M * (at[k][c + 1] - at[k][c]) for c in mine for k in ("F", "B", "W")]
        busy += [at["O"][c + 1] - at["O"][c] for c in mine]
        busy += [M * added[c] for c in mine if auto]
        m.Add(step >= sum(busy))
    chain = [at["F"][C], at["B"][C], at["W"][1]] + [2 * cut[j] for j in range(C - 1)
                                                   if rank_of[j] != rank_of[j + 1]]
    chain += [added[c] for c in range(C) if auto]
    m.Add(step >= sum(chain))


def _chain_bounds(m: _Model, problem: ChunkProblem, at: _Figures, cut: list[_Expr], added: list[_Expr],
                  paths: list[CriticalPath], step: _Expr,
                  auto: bool) -> None:
    """The step is at least every known chain's length (each chain exists in every split)."""
    C = problem.chunks
    rank_of = np.asarray(problem.schedule.chunk_rank)
    for path in paths:
        check_deadline(_BUILDING)
        terms = []
        for c in range(C):
            for k, n in (("F", path.forward[c]), ("B", path.backward_input[c]), ("W", path.backward_weight[c])):
                if n:
                    terms.append(int(n) * (at[k][c + 1] - at[k][c]))
            if path.backward_input[c] and auto:
                terms.append(int(path.backward_input[c]) * added[c])
            if rank_of[c] == path.optimizer_rank:
                terms.append(at["O"][c + 1] - at["O"][c])
        for j in range(C - 1):
            if path.transfers[j]:
                terms.append(int(path.transfers[j]) * cut[j])
        m.Add(step >= sum(terms))


def _objective(m: _Model, problem: ChunkProblem, tables: ModelTables, rank_forms: list[list[_Expr]], step: _Expr,
               limit: float) -> None:
    """The fullest rank's share of its capacity (in parts per million) with the memory objective;
    else the step, below the step to beat where there is one."""
    if problem.objective is Objective.MEMORY:
        worst = m.NewIntVar(0, 10**6, "worst_ppm")
        for rs, forms in zip(tables.signatures, rank_forms):
            for form in forms:
                m.Add(worst * int(problem.capacities[rs.rank]) >= form * 10**6)
        m.Minimize(worst)
        return
    m.Minimize(step)
    if math.isfinite(limit):
        # only splits faster than the best known (beyond the model's rounding): where
        # there is none, the best known is optimal
        m.Add(step <= int(math.floor(limit * tables.scale)) - time_slack_units(problem.chunks))


def _hints(m: _Model, problem: ChunkProblem, best: ChunkResult | None, s: list[_Expr], y: _Prefixes) -> None:
    """The best split known (and its recompute prefixes) as CP-SAT's starting point."""
    if best is None:
        return
    C = problem.chunks
    for c in range(1, C):
        m.AddHint(s[c], best.bounds[c])
    counts = prefix_counts(best.bounds, best.choice) if y and best.choice else None
    if counts is not None:
        for c in range(C):
            m.AddHint(y[c, "full"], counts[0][c])
            m.AddHint(y[c, "selective"], counts[1][c])


def _range_max(values: np.ndarray, offset: np.ndarray | None = None) -> np.ndarray:
    """(L+1, L+1) table: at [p, e], the largest ``values[i] + offset[i] - offset[p]`` over
    ``p <= i < e`` (0 for an empty range). ``offset``: a prefix sum of length L + 1."""
    L = len(values)
    out = np.zeros((L + 1, L + 1), np.int64)
    for p in range(L):
        term = values[p:] + (offset[p:L] - offset[p] if offset is not None else 0)
        out[p, p + 1:] = np.maximum.accumulate(term)
    return out


def _recompute_variables(m: _Model, problem: ChunkProblem, s: list[_Expr], q: _Figures, scale: float,
                         largest: dict[str, int], ranges: list[_Ranges]) -> tuple[_Figures, list[_Expr], _Prefixes]:
    """AUTO recompute in the CP-SAT model as recompute prefixes: in chunk c, the first ``f_c``
    layers take full and the next ``g_c`` selective (Megatron's block method, with selective
    after it): recomputing a chunk's first layers costs least, since their rerun comes when the
    later layers' stashes are freed (model/recompute.py). With ``p = s_c + f_c`` and ``r = p +
    g_c``, everything is a lookup: bytes saved ``S`` and time added from prefix sums, the chunk's
    own stash ``U``, and the transients' terms (as ``RecomputeTable.chunk_changes``): the forward
    ``max(largest own over [s_c, p), max over [p, r) of kept-before + own, kept)`` and the
    backward ``max(kept, largest full rerun over [s_c, p), max over [p, r) of kept-through +
    rerun)``, kept = the selective layers' unsaved own bytes + the none layers' own. The chunk
    figures become stash ``max(0, stash - S)``, forward ``max(0, peak - U + forward term)``, B /
    full backward ``max(0, peak - U + backward term)``. Returns the chunk figures, the time added
    per chunk and the variables ``{(c, "full"), (c, "selective")}``."""
    C = problem.chunks
    if all(len(o) == 1 for o in recompute_options(problem)):
        return q, [0] * C, {}
    t = _recompute_tables(problem, scale)
    x: _Prefixes = {}
    out = {name: list(values) for name, values in q.items()}
    added: list[_Expr] = []
    for c in range(C):
        x[c, "full"], x[c, "selective"], time_added, terms = _chunk_prefixes(m, problem, t, s, c, ranges[c])
        added.append(time_added)
        _recomputed_figures(m, problem, q, out, c, terms, t.big, largest)
    return out, added, x


@dataclass(frozen=True)
class _RecomputeTables:
    """What a chunk's recompute prefixes are looked up in: per-layer prefix sums (``O`` own bytes,
    ``S2``/``S1`` bytes full/selective saves, ``T2``/``T1`` time each adds in units, ``K2`` own bytes
    of full-prefix layers full is not open to) and (L+1, L+1) range maxima of the transients' terms."""

    sums: dict[str, np.ndarray]
    full_rerun: np.ndarray
    full_forward: np.ndarray
    selective_backward: np.ndarray
    selective_forward: np.ndarray
    big: int                        #: above any chunk's own bytes and rerun


def _recompute_tables(problem: ChunkProblem, scale: float) -> _RecomputeTables:
    saved, rerun, added_t = recompute_option_figures(problem)
    assert problem.table.recompute is not None        # AUTO recompute: the table has its options
    own = problem.table.recompute.saved[2].astype(np.int64)
    kept_full = own - saved[2]                      # a layer of the full prefix that full is not open to
    kept_selective = own - saved[1]                 # what a selective layer still holds of its own bytes

    def cum(v: np.ndarray) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(v)])

    O, S2, S1, K2, D = (cum(v).astype(np.int64) for v in (own, saved[2], saved[1], kept_full, kept_selective))
    T2, T1 = (np.round(cum(v) * scale).astype(np.int64) for v in (added_t[2], added_t[1]))
    return _RecomputeTables(
        sums={"O": O, "S2": S2, "S1": S1, "T2": T2, "T1": T1, "K2": K2},
        full_rerun=_range_max(rerun[2] + kept_full, K2), full_forward=_range_max(own, K2),
        selective_backward=_range_max(rerun[1] + kept_selective, D), selective_forward=_range_max(own, D),
        big=int(own.sum() + rerun.max(initial=0)) + 1)


def _element(m: _Model, name: str, index: _Expr, values: np.ndarray) -> _Expr:
    """A variable that is ``values[index]`` (``values`` flattened)."""
    v = m.NewIntVar(int(min(values.min(initial=0), 0)), int(max(values.max(initial=0), 0)), name)
    m.AddElement(index, [int(z) for z in values.ravel()], v)
    return v


def _pairs(m: _Model, name: str, low: _Expr, high: _Expr, allowed: np.ndarray) -> _Expr:
    """A variable that picks one of the ``allowed`` (low, high) rows, tied to ``low`` and
    ``high``: the index figures of a chunk's prefixes are looked up by (over a chunk's few pairs,
    not all (L+1)^2)."""
    pick = m.NewIntVar(0, max(len(allowed) - 1, 0), name)
    m.AddElement(pick, [int(v) for v in allowed[:, 0]], low)
    m.AddElement(pick, [int(v) for v in allowed[:, 1]], high)
    return pick


def _prefix_pairs(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (start, p) and (p, r) pairs a chunk's prefixes can take over its ranges ``rows`` ((first
    layer, last layer)): ``start <= p <= r <= end`` of one of them."""
    ends = rows[:, 1] + 1
    reach: dict[int, int] = {}
    for a, e in zip(rows[:, 0].tolist(), ends.tolist()):
        reach[a] = max(reach.get(a, a), e)
    start_p = [(a, p) for a, e in sorted(reach.items()) for p in range(a, e + 1)]
    top = np.full(int(ends.max()) + 1, -1, np.int64)          # the furthest end a start at or before p reaches
    for a, e in reach.items():
        top[a] = max(top[a], e)
    top = np.maximum.accumulate(top)
    p_r = [(p, r) for p in range(len(top)) if top[p] >= p for r in range(p, int(top[p]) + 1)]
    return np.asarray(start_p, np.int64).reshape(-1, 2), np.asarray(p_r, np.int64).reshape(-1, 2)


#: where each prefix sum is read (``_chunk_prefixes``): 0 the chunk's start, 1 its full prefix's
#: end p, 2 its selective prefix's end r, 3 the chunk's end
_READ_AT = {"O": (0, 3), "S2": (0, 1), "S1": (1, 2), "T2": (0, 1), "T1": (1, 2), "K2": (0, 1)}


def _chunk_prefixes(m: _Model, problem: ChunkProblem, t: _RecomputeTables, s: list[_Expr], c: int,
                    ranges: _Ranges) -> tuple[_Expr, _Expr, _Expr, tuple[_Expr, _Expr, _Expr, _Expr]]:
    """Chunk c's prefix lengths (full, selective), the time they add, and what they change:
    ``(saving, whole, forward term, backward term)`` (see ``_recompute_variables``)."""
    L = problem.num_layers
    f = m.NewIntVar(0, L, f"full{c}")
    g = m.NewIntVar(0, L, f"selective{c}")
    m.Add(f + g <= s[c + 1] - s[c])
    p = m.NewIntVar(0, L, f"p{c}")
    r = m.NewIntVar(0, L, f"r{c}")
    m.Add(p == s[c] + f)
    m.Add(r == p + g)
    # each prefix sum only where a chunk's figures read it: at the chunk's start (0), p (1), r (2), end (3)
    at = {key: {j: _element(m, f"{key}{c}_{j}", (s[c], p, r, s[c + 1])[j], t.sums[key]) for j in where}
          for key, where in _READ_AT.items()}
    start_p, p_r = _prefix_pairs(ranges.rows)
    pick_fp = _pairs(m, f"fp{c}", s[c], p, start_p)
    pick_pr = _pairs(m, f"pr{c}", p, r, p_r)
    rerun_full = _element(m, f"rf{c}", pick_fp, t.full_rerun[start_p[:, 0], start_p[:, 1]])
    forward_full = _element(m, f"ff{c}", pick_fp, t.full_forward[start_p[:, 0], start_p[:, 1]])
    rerun_sel = _element(m, f"rs{c}", pick_pr, t.selective_backward[p_r[:, 0], p_r[:, 1]])
    forward_sel = _element(m, f"fs{c}", pick_pr, t.selective_forward[p_r[:, 0], p_r[:, 1]])
    kept_f = at["K2"][1] - at["K2"][0]                       # full-prefix layers that full is not open to
    saving = (at["S2"][1] - at["S2"][0]) + (at["S1"][2] - at["S1"][1])
    whole = at["O"][3] - at["O"][0]
    kept = m.NewIntVar(0, t.big, f"kept{c}")                 # own bytes still held after the chunk's forward
    m.Add(kept == whole - saving)
    backward_term = m.NewIntVar(0, 2 * t.big, f"bt{c}")
    m.AddMaxEquality(backward_term, [kept, rerun_full, kept_f + rerun_sel])
    forward_term = m.NewIntVar(0, 2 * t.big, f"ft{c}")
    m.AddMaxEquality(forward_term, [kept, forward_full, kept_f + forward_sel])
    time_added = (at["T2"][1] - at["T2"][0]) + (at["T1"][2] - at["T1"][1])
    return f, g, time_added, (saving, whole, forward_term, backward_term)


def _recomputed_figures(m: _Model, problem: ChunkProblem, q: _Figures, out: _Figures, c: int,
                        terms: tuple[_Expr, _Expr, _Expr, _Expr], big: int,
                        largest: dict[str, int]) -> None:
    """Chunk c's figures with its prefixes recomputed, into ``out``; under a split backward the
    first chunk's B is its stash and its W the whole backward (``chunk_memory``)."""
    saving, whole, forward_term, backward_term = terms

    def clipped(name: str, expression: _Expr) -> _Expr:
        v = m.NewIntVar(0, 2 * big + max(largest[name], 0), f"{name}_r{c}")
        m.AddMaxEquality(v, [0, expression])
        return v
    out["stash"][c] = clipped("stash", q["stash"][c] - saving)
    out["forward"][c] = clipped("forward", q["forward"][c] - whole + forward_term)
    out["full_backward"][c] = clipped("full_backward", q["full_backward"][c] - whole + backward_term)
    if problem.schedule.traits.splits_backward and c == 0:
        out["backward"][c] = out["stash"][c]
        out["weight_stash"][c] = out["stash"][c]
        out["weight"][c] = out["full_backward"][c]
    else:
        out["backward"][c] = clipped("backward", q["backward"][c] - whole + backward_term)


def _rank_forms(sig: tuple[RankSignatures, ...], q: _Figures, C: int) -> list[list[_Expr]]:
    """Each rank's memory signatures as linear expressions of the chunk lookups ``q`` (built from
    term lists: adding in place to a CP-SAT expression would change the shared part)."""
    out: list[list[_Expr]] = []
    for rs in sig:
        chunks = list(rs.chunks)
        forms: list[_Expr] = []
        for k, signature in enumerate(rs.signatures):
            check_deadline(_BUILDING)
            terms = [q["resident"][c] for c in chunks]
            for c in range(C):
                for name, counts in (("stash", rs.stash_counts), ("weight_stash", rs.weight_stash_counts),
                                     ("retained", rs.retained_counts), ("unsharded", rs.unsharded_counts)):
                    if counts[k, c] and name in q:
                        terms.append(int(counts[k, c]) * q[name][c])
            if signature.op is None:
                # the optimizer step runs one parameter's kernels at a time (schedule_memory): the rank's
                # transient is its largest chunk's, a form per chunk
                forms.extend(sum([*terms, q["optimizer"][c]]) for c in chunks)
                continue
            terms.append(q[TRANSIENT_FIGURE[signature.op]][signature.chunk])
            forms.append(sum(terms))
        out.append(forms)
    return out


def solution_log(s: list[_Expr], y: _Prefixes, C: int) -> Any:
    """A CP-SAT callback that keeps every solution found during a round (boundaries, and the
    recompute prefix counts) in ``.found``: the splits the search passes through on its way are as
    good a source of chains as the one it ends on."""
    from ortools.sat.python import cp_model

    class SolutionLog(cp_model.CpSolverSolutionCallback):
        def __init__(self) -> None:
            super().__init__()
            self.found: list[tuple[tuple[int, ...], tuple[list[int], list[int]] | None]] = []

        def on_solution_callback(self) -> None:
            bounds = tuple(int(self.Value(x)) for x in s)
            counts = ([int(self.Value(y[c, "full"])) for c in range(C)],
                      [int(self.Value(y[c, "selective"])) for c in range(C)]) if y else None
            self.found.append((bounds, counts))
    return SolutionLog()
