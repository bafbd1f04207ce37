"""Exact dynamic programming over contiguous splits (the oracle CP-SAT is tested against, and
the exact pre-solve ``advise`` runs first), and the two baselines it is compared with: PopLiner's
greedy first-fit and a uniform split.

Stages are read on the band of the range table: a stage starting at layer ``a`` ends at
``e = a+1..a+W``, where W is the longest stage that fits any device (a stage's memory grows
with its last layer). A bottleneck objective combines by ``max``; lexicographic objectives run
one pass per objective, each bounded by the previous optimum. Every rule of the problem applies:
capacities per position, the schedule's in-flight counts, pins, layer-count limits, stage times
with the transfer time of both cuts. The state of a pass depends on what the rules need:

* **by count** (identical devices, no layer pinned to a position, "at most N"): the state is the
  first layer still to place and the number ``c`` of stages from there on, which fixes the 1F1B
  in-flight count ``min(M, c)``; the stages go on the first positions. C x L x W cells a pass
  (C = N, or the devices objective's fewest count, found by growing c until a split fits).
* **by position** ("exactly N" devices: stage i is on position i and has N - i stages from it on;
  or mixed capacities / pinned layers with an in-flight count that does not depend on the stage
  count): the state is the position and the first layer; a position may stay empty where the
  rules allow. N x L x W cells a pass.
* **by position and count** (mixed capacities or pinned layers with 1F1B, and the devices
  objective on them): N^2/2 x L x W cells a pass.

Ties between equal optima: the fewest stages where the count is part of the state, then, walking
from the first layer, the shortest first stage (and an empty position before a stage).

With profile variants (``SplitProblem.variants``) a stage's value in a pass is the best over the
variants that fit it and keep the earlier passes' bounds (each bound holds per stage, since
every objective is a maximum over stages), so the passes stay exact; ``evaluate_split`` then gives the
split's variants. tests/solver/test_variants.py checks it against every split and every
choice of variants.

A pass stops when the clock passes ``deadline`` (checked after each position or count): the
result then keeps the phases proven so far (``Solution.proven``) and says it stopped
(``Solution.stopped``). ``dp_cells`` estimates the work before starting.
tests/solver/test_oracle.py checks the DP against a brute-force enumeration of every split.
"""

from __future__ import annotations

import time as _time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..model.rangetable import OVER, RangeTable
from .problem import Evaluation, Split, SplitProblem, evaluate_split, in_flight

__all__ = ["INF", "MIN_LAYERS_ORDER", "ORDER", "PROPORTIONS", "Solution", "UnlayeredFirst", "conservative_split", "dp_cells",
           "dp_mode", "exact_optimum", "greedy", "uniform"]

INF = OVER

#: the objective quantities of each objective, in lexicographic order
ORDER = {"compute": ("time", "memory"), "memory": ("memory", "time"), "devices": ("devices", "time")}


@dataclass(frozen=True)
class Solution:
    """A split and its evaluation. The exact DP also says which objective quantities it proved
    optimal (``proven``, in order; with no split, a proof that nothing fits), how long each of its
    passes took, and why it stopped early (``stopped``: "" when it finished)."""

    split: Split | None
    evaluation: Evaluation | None
    method: str
    proven: tuple[str, ...] = ()
    seconds: tuple[float, ...] = ()
    stopped: str = ""

    @property
    def feasible(self) -> bool:
        return self.evaluation is not None and self.evaluation.feasible

    @property
    def complete(self) -> bool:
        """The DP proved every phase (or that nothing fits)."""
        return not self.stopped


#: bytes of (stage allowed, stage value) bands a pass keeps for the positions and counts it meets again
OK_CACHE_BYTES = 64 * 2**20


class _OutOfTime(Exception):
    """A pass reached the deadline."""


def dp_mode(problem: SplitProblem) -> str:
    """The state the DP's passes need (see the module docstring): "count", "position" or
    "position-count"."""
    o = problem.options
    if o.exact:
        return "position"
    if problem.homogeneous and not o.pinned_layers:
        return "count"
    counted = len(problem.in_flight_values) > 1 or o.objective == "devices"
    return "position-count" if counted else "position"


def dp_cells(problem: SplitProblem) -> int:
    """About how many (state, end) cells the DP's passes visit: the work its time limit is
    checked against before it starts. A stage count with more micro-batches in flight reads a
    narrower band (fewer stages fit), so each count's band is measured."""
    L, N = problem.num_layers, problem.devices
    cap = int(problem.capacity.max())
    ks = problem.in_flight_values
    widths: dict[int, int] = {}
    if L:
        most = np.max([t.widths_for(ks, cap) for t, _, _ in problem.variant_tables()], axis=0)
        widths = {k: max(int(w), 1) for k, w in zip(ks, most)}

    def width(c: int) -> int:
        return widths.get(_k(problem, c), 1) if L else 1
    mode = dp_mode(problem)
    if mode == "count" or (mode == "position" and problem.options.exact):
        per_pass = sum(L * width(c) for c in range(1, N + 1))
    elif mode == "position":
        per_pass = N * L * width(1)
    else:
        per_pass = sum((N - c + 1) * L * width(c) for c in range(1, N + 1))   # positions with c stages from them
    return 2 * per_pass * problem.variant_count          # with profile variants, each cell reads every variant


class _Stages:
    """The band of stages a..e-1, e = a+1..a+W (``ends``), with what every pass reads: stage
    time, the layer-count and pin rules, and per (position, in-flight count) the bytes and
    whether the stage fits; with profile variants, time and bytes per variant ``v``. What
    depends on the in-flight count is read on the band's first ``columns`` only: the stages
    that can fit with that count (``columns``), far fewer than W with many in flight."""

    def __init__(self, problem: SplitProblem):
        p = self.p = problem
        o = p.options
        L = self.L = p.num_layers
        W = self.W = max(p.width, 1)
        self.rows = np.arange(L)
        a = self.rows[:, None]
        e = a + 1 + np.arange(W)[None, :]
        self.real = e <= L
        self.ends = np.minimum(e, L)
        self.tables = p.variant_tables()
        self.variants = len(self.tables)
        self.times = [np.where(self.real, up[self.ends] - down[a], INF).astype(np.int64) for _, up, down in self.tables]
        self.time = self.times[0]
        length = e - a
        ok = self.real & (length >= o.min_layers)
        if o.max_layers is not None:
            ok &= length <= o.max_layers
        if o.pinned_splits:                                  # no pinned split strictly inside a stage
            pins = np.array(sorted(o.pinned_splits), np.int64)
            after = np.searchsorted(pins, self.rows, side="right")
            next_pin = np.where(after < len(pins), pins[np.minimum(after, len(pins) - 1)], L)
            ok &= e <= next_pin[:, None]
        self.count_ok = ok
        #: whether any rule but the band's end holds a stage back (else ``allowed`` adds nothing to ``fits``)
        self.ruled = bool(o.min_layers > 1 or o.max_layers is not None or o.pinned_splits or o.pinned_layers)
        self._allowed: dict[int, np.ndarray] = {}
        #: per capacity, each variant's (most in flight per range, fit counts per column) of the
        #: linear form (RangeTable.most_in_flight, fit_counts), or None (a band per count)
        self._most: dict[int, list[tuple[np.ndarray, np.ndarray] | None]] = {}

    def allowed(self, position: int) -> np.ndarray:
        """Layer-count, pinned-split and pinned-layer rules of a stage at ``position``."""
        pins = self.p.options.pinned_layers
        if not pins:
            return self.count_ok
        if position not in self._allowed:
            ok = self.count_ok.copy()
            a = self.rows[:, None]
            for layer, pos in pins:
                inside = (a <= layer) & (layer < self.ends) & self.real
                ok &= inside if pos == position else ~inside
            self._allowed[position] = ok
        return self._allowed[position]

    def columns(self, position: int, k: int) -> int:
        """The band columns past which no stage fits ``position`` with ``k`` in flight in any
        variant (exact on one tile, where bytes are linear in k; else W)."""
        most = self._linear(position)
        if any(m is None for m in most):
            return self.W
        return max(int(np.count_nonzero(m[1] >= k)) for m in most if m is not None)

    def _linear(self, position: int) -> list[tuple[np.ndarray, np.ndarray] | None]:
        cap = int(self.p.capacity[position])
        most = self._most.get(cap)
        if most is None:
            most = self._most[cap] = []
            for table, _, _ in self.tables:
                m = table.most_in_flight(cap)
                counts = table.fit_counts(cap) if m is not None else None
                if m is None or counts is None:
                    most.append(None)
                    continue
                if m.shape[1] < self.W:
                    m = np.concatenate([m, np.zeros((self.L, self.W - m.shape[1]), np.int64)], axis=1)
                most.append((m, counts))
        return most

    def nbytes(self, k: int, v: int = 0, columns: int | None = None) -> np.ndarray:
        """(L, W) worst-tile bytes with ``k`` in flight in variant ``v`` (OVER past the variant's
        band); ``columns``: the first ``columns`` only."""
        w = self.W if columns is None else columns
        band = self.tables[v][0].band(k, w)
        if band.shape[1] < w:
            band = np.concatenate([band, np.full((self.L, w - band.shape[1]), OVER, np.int64)], axis=1)
        return band

    def fits(self, position: int, k: int, v: int = 0, columns: int | None = None) -> np.ndarray:
        w = self.W if columns is None else columns
        linear = self._linear(position)[v]
        fit = linear[0][:, :w] >= k if linear is not None else \
            self.nbytes(k, v, w) <= int(self.p.capacity[position])
        return self.allowed(position)[:, :w] & fit if self.ruled else fit

    def value(self, quantity: str, position: int, k: int, v: int = 0, columns: int | None = None) -> np.ndarray:
        """A stage's contribution to an objective quantity in variant ``v``: time, memory cost
        (bytes, or parts per million of the position's capacity on mixed devices), or 0
        (devices: counted apart); ``columns``: the band's first ``columns`` only."""
        w = self.W if columns is None else columns
        if quantity == "time":
            return self.times[v][:, :w]
        if quantity == "memory":
            m = self.nbytes(k, v, w)
            if self.p.homogeneous:
                return m
            return np.where(m < INF, -((-m * 1_000_000) // int(self.p.capacity[position])), INF)
        return np.zeros((self.L, w), np.int64)


def _k(problem: SplitProblem, c: int) -> int:
    """In-flight count of a stage with ``c`` non-empty stages from it to the end (itself included)."""
    o = problem.options
    return in_flight(o.schedule, o.micro_batches, 0, c)


class _Pass:
    """One lexicographic pass: minimise the max of ``quantity`` over the splits whose stages
    keep the earlier quantities within ``bounds``."""

    def __init__(self, stages: _Stages, quantity: str, bounds: dict[str, int], deadline: float | None,
                 clock: Callable[[], float]):
        self.s, self.quantity, self.bounds = stages, quantity, bounds
        self.deadline, self.clock = deadline, clock
        self._ok: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, int]] = {}
        self._ok_bytes = 0
        # ``rest`` at each end a+1+j, j < W, as a window over one buffer (INF past the last layer):
        # each call writes ``rest`` into the buffer and reads the window, made once
        self._rest = np.full(stages.L + 1 + stages.W, INF, np.int64)
        step = self._rest.strides[0]
        self._after = np.lib.stride_tricks.as_strided(self._rest[1:], shape=(stages.L, stages.W),
                                                      strides=(step, step), writeable=False)

    def tick(self) -> None:
        if self.deadline is not None and self.clock() > self.deadline:
            raise _OutOfTime

    def ok(self, position: int, k: int) -> tuple[np.ndarray, np.ndarray, int]:
        """(the stages allowed at ``position`` with ``k`` in flight within the bounds, their
        values, the band columns that hold any), narrowed to those columns; kept (up to
        ``OK_CACHE_BYTES``) for positions alike (same capacity, no pins) and counts met again."""
        s = self.s
        key = (int(s.p.capacity[position]) if not s.p.options.pinned_layers else -1 - position, k)
        hit = self._ok.get(key)
        if hit is None:
            ok, value = None, None
            w = s.columns(position, k)                   # no stage longer fits: read no further
            for v in range(s.variants):              # with variants: the best that fits within the bounds
                fits = s.fits(position, k, v, w)
                for q, bound in self.bounds.items():
                    if q != "devices":
                        fits = fits & (s.value(q, position, k, v, w) <= bound)
                mine = s.value(self.quantity, position, k, v, w)
                if s.variants == 1:
                    ok, value = fits, mine
                else:
                    mine = np.where(fits, mine, INF)
                    ok, value = (fits, mine) if ok is None or value is None else (ok | fits, np.minimum(value, mine))
            assert ok is not None and value is not None     # a problem has at least one variant
            columns = ok.any(axis=0)
            width = int(np.flatnonzero(columns)[-1]) + 1 if columns.any() else 0
            ok = np.ascontiguousarray(ok[:, :width])
            hit = (~ok, np.ascontiguousarray(value[:, :width]), width)
            size = hit[0].nbytes + hit[1].nbytes
            while self._ok and self._ok_bytes + size > OK_CACHE_BYTES:      # the oldest go first
                old = self._ok.pop(next(iter(self._ok)))
                self._ok_bytes -= old[0].nbytes + old[1].nbytes
            self._ok[key] = hit
            self._ok_bytes += size
        return hit

    def candidates(self, position: int, k: int, rest: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per first layer: the best value with a stage at ``position`` followed by ``rest`` (the
        best of each end), and the band column of the stage's end (the first on ties)."""
        s = self.s
        not_ok, value, width = self.ok(position, k)
        if width == 0:
            return np.full(s.L, INF, np.int64), np.zeros(s.L, np.int16)
        self._rest[:s.L + 1] = rest                  # rest at each end a+1+j: the window (past the last layer: INF)
        cand = np.maximum(value, self._after[:, :width])
        np.copyto(cand, INF, where=not_ok)
        j = cand.argmin(axis=1)
        return cand[s.rows, j], j.astype(np.int16 if s.W < 2**15 else np.int32)

    def by_count(self, count: int | None = None) -> tuple[int, Split | None]:
        """Identical devices: g[c][a] over exactly c stages; stages on the first positions."""
        s, p = self.s, self.s.p
        L, N = s.L, p.devices
        g = np.full(L + 1, INF, np.int64)
        g[L] = 0
        picks: list[np.ndarray] = []
        best_c, best = 0, INF
        devices_first = self.quantity == "devices"
        for c in range(1, (count or N) + 1):
            self.tick()
            value, j = self.candidates(0, _k(p, c), g)
            g = np.empty(L + 1, np.int64)
            g[:L], g[L] = value, INF
            picks.append(j)
            if (count is None or c == count) and value[0] < best:
                best_c, best = c, int(value[0])
                if devices_first:
                    break                    # the fewest stages that fit: no need to try more
        if best >= INF:
            return INF, None
        bounds, a = [0], 0
        for c in range(best_c, 0, -1):
            a = a + 1 + int(picks[c - 1][a])
            bounds.append(a)
        bounds += [L] * (N - best_c)
        return (best_c if devices_first else best), Split(tuple(bounds))

    def by_position(self, most_in_flight: bool = False) -> tuple[int, Split | None]:
        """Position-dependent rules with an in-flight count fixed per position (exactly N stages:
        N - i from position i on; else the schedule's, which does not depend on the count).
        ``most_in_flight``: every stage holds the most micro-batches its position can have, as if
        every later position held a stage (a restriction: what it finds fits, not proven best)."""
        s, p = self.s, self.s.p
        L, N = s.L, p.devices
        exact = p.options.exact or most_in_flight
        f = np.full(L + 1, INF, np.int64)
        f[L] = 0
        takes: list[tuple[np.ndarray, np.ndarray]] = []
        for i in range(N - 1, -1, -1):
            self.tick()
            value, j = self.candidates(i, _k(p, N - i if exact else 1), f)
            new = f.copy() if p.empty_allowed(i) else np.full(L + 1, INF, np.int64)
            take = value < new[:L]                    # an empty position wins ties
            new[:L] = np.where(take, value, new[:L])
            takes.append((take, j))
            f = new
        if f[0] >= INF:
            return INF, None
        bounds, a = [0], 0
        for i in range(N):
            take, j = takes[N - 1 - i]
            if a < L and take[a]:
                a = a + 1 + int(j[a])
            bounds.append(a)
        return int(f[0]), Split(tuple(bounds))

    def by_position_and_count(self, count: int | None = None) -> tuple[int, Split | None]:
        """f[i, c, a]: positions i.. with exactly c stages (1F1B on mixed devices or with pinned
        layers, and the devices objective there)."""
        s, p = self.s, self.s.p
        L, N = s.L, p.devices
        C = count or N
        f = np.full((C + 1, L + 1), INF, np.int64)          # positions i+1..: f[c, a]
        f[0, L] = 0
        takes: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        for i in range(N - 1, -1, -1):
            self.tick()
            new = f.copy() if p.empty_allowed(i) else np.full((C + 1, L + 1), INF, np.int64)
            for c in range(1, min(C, N - i) + 1):
                value, j = self.candidates(i, _k(p, c), f[c - 1])
                take = value < new[c, :L]
                new[c, :L] = np.where(take, value, new[c, :L])
                takes[i, c] = (take, j)
            f = new
        counts = range(C + 1) if count is None else [count]
        best_c = min(counts, key=lambda c: (f[c, 0], c))
        if f[best_c, 0] >= INF:
            return INF, None
        bounds, a, c = [0], 0, best_c
        for i in range(N):
            pick = takes.get((i, c))
            if pick is not None and a < L and pick[0][a]:
                a, c = a + 1 + int(pick[1][a]), c - 1
            bounds.append(a)
        answer = best_c if self.quantity == "devices" else int(f[best_c, 0])
        return answer, Split(tuple(bounds))


def conservative_split(problem: SplitProblem, deadline: float | None = None,
                       clock: Callable[[], float] = _time.monotonic) -> Solution:
    """A split that fits, found fast where the exact DP needs the stage count in its state (1F1B
    on mixed devices or with pinned layers): the by-position DP with each stage holding as many
    micro-batches as its position can (``min(M, N - i)``, never fewer than it really holds), so
    every split it finds fits. Lexicographic like ``exact_optimum``, but not proven optimal
    (``proven`` is empty); None when it finds none or reaches ``deadline``."""
    stages = _Stages(problem)
    bounds: dict[str, int] = {}
    split = None
    for quantity in ORDER[problem.options.objective]:
        try:
            value, found = _Pass(stages, quantity, dict(bounds), deadline, clock).by_position(most_in_flight=True)
        except _OutOfTime:
            break
        if found is None:
            break
        bounds[quantity] = found.devices_used if quantity == "devices" else value
        split = found
    if split is None:
        return Solution(None, None, "dp with the most micro-batches in flight")
    return Solution(split, evaluate_split(problem, split), "dp with the most micro-batches in flight")


def exact_optimum(problem: SplitProblem, deadline: float | None = None,
                  clock: Callable[[], float] = _time.monotonic) -> Solution:
    """The lexicographic optimum of ``problem.options.objective`` by dynamic programming. With a
    ``deadline`` (on ``clock``), the passes stop when it passes: the answer then holds the
    phases proven so far (and the split of the last one), ``stopped`` says so."""
    stages = _Stages(problem)
    mode = dp_mode(problem)
    quantities = ORDER[problem.options.objective]
    bounds: dict[str, int] = {}
    proven: list[str] = []
    seconds: list[float] = []
    split: Split | None = None
    for quantity in quantities:
        started = clock()
        step = _Pass(stages, quantity, dict(bounds), deadline, clock)
        count = bounds.get("devices")
        try:
            if mode == "count":
                value, found = step.by_count(count)
            elif mode == "position":                 # "exactly N" (count N), or no count in the rules
                value, found = step.by_position()
            else:
                value, found = step.by_position_and_count(count)
        except _OutOfTime:
            seconds.append(clock() - started)
            return Solution(split, evaluate_split(problem, split) if split is not None else None, "exact",
                            tuple(proven), tuple(seconds), "time")
        seconds.append(clock() - started)
        proven.append(quantity)
        if found is None:
            return Solution(None, None, "exact", tuple(proven), tuple(seconds))
        bounds[quantity] = found.devices_used if quantity == "devices" else value
        split = found
    assert split is not None                     # every objective has at least one phase
    return Solution(split, evaluate_split(problem, split), "exact", tuple(proven), tuple(seconds))


@dataclass(frozen=True)
class UnlayeredFirst:
    """PopLiner's placement of the operations with no layer: a pseudo-layer in front of layer 0,
    so on the first stage only (and counted in its layer count). ``first[k_index, e]`` is the
    worst-tile bytes of the first stage holding layers 0..e with them; ``rest`` prices the other
    stages without them (``mem`` of a problem priced with ``shared="none"``)."""

    first: np.ndarray          # (K, L)
    rest: RangeTable           # the other stages, priced with shared="none"
    alone: np.ndarray          # (K,) the unlayered operations on their own


MIN_LAYERS_ORDER = (3, 2, 1)
PROPORTIONS = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def greedy(problem: SplitProblem, proportions: Sequence[float] = PROPORTIONS,
           min_layers_order: Sequence[int] = MIN_LAYERS_ORDER,
           unlayered_first: UnlayeredFirst | None = None) -> Solution:
    """PopLiner's greedy first-fit. For at least 3 layers per stage, then 2, then 1, and for
    each a share of memory of 50%, 60%, ... 100%: fill each device in turn, starting with that
    many layers (fewer only for a last stage with fewer left) and adding layers while the stage
    fits in the share; take the first (layer count, share) that places every layer on at most
    N devices. It ignores compute, so the last devices often sit idle or unused.

    With ``unlayered_first`` the operations with no layer go on the first stage, as PopLiner
    does; the split is then returned as PopLiner would choose it, even where this project's
    memory model (the problem's) says it does not fit (the plan shows that)."""
    o = problem.options
    orders = [m for m in min_layers_order if m >= o.min_layers] or [o.min_layers]
    for min_layers in orders:
        for share in proportions:
            split = _greedy_fill(problem, share, min_layers, unlayered_first)
            if split is None:
                continue
            ev = evaluate_split(problem, split)
            if ev.feasible or unlayered_first is not None:
                placement = ", unlayered code on stage 0" if unlayered_first is not None else ""
                return Solution(split, ev, f"greedy ({min_layers}+ layers, {share:.0%} of memory{placement})")
    return Solution(None, None, "greedy")


def _greedy_fill(problem: SplitProblem, share: float, min_layers: int,
                 unlayered_first: UnlayeredFirst | None) -> Split | None:
    """One first-fit pass (see ``greedy``): the split, or None when some stage's first
    ``min_layers`` layers already overflow or layers are left over."""
    L, N = problem.num_layers, problem.devices
    o = problem.options
    bounds = [0]
    a = 0
    for position in range(N):
        if a == L:
            bounds.append(L)
            continue
        k = in_flight(o.schedule, o.micro_batches, position, N)
        ki = problem.k_index(k)
        limit = share * int(problem.capacity[position])
        pseudo = unlayered_first is not None and position == 0
        # cost is called only within this iteration, before a moves on: its k, ki and a are the ones meant
        cost: Callable[[int], int]
        if pseudo:
            assert unlayered_first is not None       # pseudo says so
            need = min_layers - 1                    # the unlayered pseudo-layer counts as one
            cost = lambda e: int(unlayered_first.first[ki, e - 1]) if e > 0 else int(unlayered_first.alone[ki])  # noqa: E731, B023
        else:
            need = min_layers
            if unlayered_first is not None:
                cost = lambda e: unlayered_first.rest.bytes_of(k, a, e - 1)     # noqa: E731, B023
            else:
                cost = lambda e: problem.stage_bytes(k, a, e)                   # noqa: E731, B023
        e = a + max(need, 0)
        if e > L:                                    # fewer layers left than the minimum: one at a time
            e = a + (0 if pseudo else 1)
        if (e > a or pseudo) and cost(e) > limit:    # the first candidate must fit
            return None
        while e < L and cost(e + 1) <= limit:
            e += 1
        if o.max_layers is not None:
            e = min(e, a + o.max_layers)
        if e == a and not pseudo:                    # (PopLiner's stage 0 may hold the unlayered code alone)
            return None
        bounds.append(e)
        a = e
    if a != L:
        return None
    return Split(tuple(bounds))


def uniform(problem: SplitProblem) -> Solution:
    """Equal numbers of layers on every device, whether or not they fit."""
    L, N = problem.num_layers, problem.devices
    used = min(N, L)
    bounds = [round(s * L / used) for s in range(used + 1)] + [L] * (N - used)
    split = Split(tuple(bounds))
    return Solution(split, evaluate_split(problem, split), "uniform")
