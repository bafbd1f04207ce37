"""Exact dynamic programming over contiguous splits (the oracle CP-SAT is tested against), and
the two baselines it is compared with: PopLiner's greedy first-fit and a uniform split.

The DP walks device positions from the last to the first. Its state is the first layer still
to place and the number ``c`` of non-empty stages from this position on, which fixes the 1F1B
in-flight count of a stage (``min(M, c)``). A bottleneck objective combines by ``max``;
lexicographic objectives run the DP once per objective, each bounded by the previous optimum.
Stage times include the transfer time of both cuts (communication), and every rule of the
problem applies per (position, count): mixed capacities, pins, layer-count limits; the devices
objective is the smallest count with a feasible split. tests/test_oracle.py checks it against
a brute-force enumeration of every split. Work: about N^2/2 x (L+1) x W cells per pass, where
W is the most layers a fitting stage can hold (a stage's memory grows with its last layer).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .problem import Evaluation, Split, SplitProblem, evaluate, in_flight

__all__ = ["INF", "MIN_LAYERS_ORDER", "PROPORTIONS", "Solution", "UnlayeredFirst", "exact_optimum", "greedy",
           "uniform"]

INF = np.iinfo(np.int64).max // 4


@dataclass(frozen=True)
class Solution:
    split: Split | None
    evaluation: Evaluation | None
    method: str

    @property
    def feasible(self) -> bool:
        return self.evaluation is not None and self.evaluation.feasible


class _StageTables:
    """time[a, e], and per (position, k) the memory cost and feasibility of stage a..e-1, read
    on a band of ends e = a+1..a+W per first layer a: a stage's memory only grows with its last
    layer, so no end beyond the band fits (``width``). Nothing of size positions x counts x
    (L+1)^2 is built: 128 devices x 128 in-flight counts of 500-layer tables would take tens of
    gigabytes."""

    def __init__(self, problem: SplitProblem):
        self.p = problem
        L = problem.num_layers
        A = self.A = L + 1
        a_idx, e_idx = np.meshgrid(np.arange(A), np.arange(A), indexing="ij")
        self.nonempty = e_idx > a_idx
        self.time = np.where(self.nonempty, problem.time_up[None, :] - problem.time_down[:, None], INF).astype(np.int64)
        o = problem.options
        n = e_idx - a_idx
        count_ok = self.nonempty & (n >= o.min_layers)
        if o.max_layers is not None:
            count_ok &= n <= o.max_layers
        for j in o.pinned_splits:
            count_ok &= ~((a_idx < j) & (j < e_idx))
        self.allowed = [count_ok] * problem.devices
        if o.pinned_layers:
            for position in range(problem.devices):
                ok = count_ok.copy()
                for layer, pos in o.pinned_layers:
                    inside = (a_idx <= layer) & (layer < e_idx)
                    ok &= inside if pos == position else ~inside
                self.allowed[position] = ok
        self.mem = {}
        for k in problem.in_flight_values:
            m = np.full((A, A), INF, np.int64)
            m[:L, 1:] = problem.mem[problem.k_index(k)]
            self.mem[k] = np.where(self.nonempty, m, INF)
        self._widths: dict[tuple[int, int], int] = {}
        self.rows = np.arange(A)[:, None]

    def width(self, position: int, k: int) -> int:
        """The most layers a stage that fits at ``position`` with ``k`` in flight holds (0 if
        none fits): ends a+1..a+width cover every fitting stage, whatever its first layer."""
        cap = int(self.p.capacity[position])
        key = (cap, k)
        if key not in self._widths:
            fits = self.mem[k] <= cap
            length = np.where(fits, np.arange(self.A)[None, :] - np.arange(self.A)[:, None], 0)
            self._widths[key] = int(length.max(initial=0))
        return self._widths[key]

    def ends(self, width: int) -> tuple[np.ndarray, np.ndarray]:
        """End indices e = a+1..a+width per row a (clipped to L), and which are real."""
        e = self.rows + 1 + np.arange(width)[None, :]
        return np.minimum(e, self.A - 1), e <= self.A - 1

    def fits(self, position: int, k: int, e: np.ndarray, real: np.ndarray) -> np.ndarray:
        a = self.rows
        return real & self.nonempty[a, e] & (self.mem[k][a, e] <= int(self.p.capacity[position])) & \
            self.allowed[position][a, e]

    def time_of(self, position: int, k: int, e: np.ndarray) -> np.ndarray:
        return self.time[self.rows, e]

    def mem_cost(self, position: int, k: int, e: np.ndarray) -> np.ndarray:
        """Bytes, or parts per million of the position's capacity on mixed devices."""
        m = self.mem[k][self.rows, e]
        if self.p.homogeneous:
            return m
        return np.where(m < INF, -((-m * 1_000_000) // int(self.p.capacity[position])), INF)


def _k(problem: SplitProblem, c: int) -> int:
    """In-flight count of a stage with ``c`` non-empty stages from it to the end (itself included)."""
    o = problem.options
    return in_flight(o.schedule, o.micro_batches, 0, c)


def _dp(problem: SplitProblem, t: _StageTables, value, feasible, count: int | None = None):
    """Minimise the max of ``value(position, k, e)`` over splits whose stages satisfy
    ``feasible(position, k, e, real)`` (both on the band of ends ``e`` of ``t.ends``); with
    ``count``, exactly that many non-empty stages. Returns (optimum, split) or (INF, None)."""
    L, N = problem.num_layers, problem.devices
    A = L + 1
    f = np.full((N + 1, N + 1, A), INF, np.int64)       # f[i, c, a]
    choice = np.full((N + 1, N + 1, A), -1, np.int64)    # chosen end e (== a for an empty position)
    f[N, 0, L] = 0
    rows = np.arange(A)
    for i in range(N - 1, -1, -1):
        for c in range(0, N - i + 1):
            best = np.full(A, INF, np.int64)
            pick = np.full(A, -1, np.int64)
            if problem.empty_allowed(i):
                best = f[i + 1, c].copy()
                pick = np.where(best < INF, rows, -1)
            if c >= 1:
                k = _k(problem, c)
                width = t.width(i, k)
                if width:
                    e, real = t.ends(width)
                    cand = np.where(feasible(i, k, e, real), np.maximum(value(i, k, e), f[i + 1, c - 1][e]), INF)
                    j = cand.argmin(axis=1)
                    v = cand[rows, j]
                    better = v < best
                    best = np.where(better, v, best)
                    pick = np.where(better, e[rows, j], pick)
            f[i, c] = best
            choice[i, c] = pick
    counts = range(N + 1) if count is None else [count]
    best_c = min(counts, key=lambda c: (f[0, c, 0], c))
    if f[0, best_c, 0] >= INF:
        return INF, None
    bounds = [0]
    a, c = 0, best_c
    for i in range(N):
        e = int(choice[i, c, a])
        if e > a:
            c -= 1
        bounds.append(e)
        a = e
    return int(f[0, best_c, 0]), Split(tuple(bounds))


def exact_optimum(problem: SplitProblem) -> Solution:
    """The lexicographic optimum of ``problem.options.objective`` by dynamic programming."""
    t = _StageTables(problem)
    objective = problem.options.objective

    def zero(i, k, e):
        return np.zeros(e.shape, np.int64)

    if objective == "devices":
        # every feasible count scores 0, so the DP's tie-break (the smallest count) is the fewest devices
        _, fewest = _dp(problem, t, zero, t.fits)
        if fewest is None:
            return Solution(None, None, "exact")
        _, split = _dp(problem, t, t.time_of, t.fits, count=fewest.devices_used)
    else:
        first = t.time_of if objective == "compute" else t.mem_cost
        second = t.mem_cost if objective == "compute" else t.time_of
        best, split = _dp(problem, t, first, t.fits)
        if split is None:
            return Solution(None, None, "exact")
        _, split = _dp(problem, t, second,
                       lambda i, k, e, real: t.fits(i, k, e, real) & (first(i, k, e) <= best))
    return Solution(split, evaluate(problem, split), "exact")


@dataclass(frozen=True)
class UnlayeredFirst:
    """PopLiner's placement of the operations with no layer: a pseudo-layer in front of layer 0,
    so on the first stage only (and counted in its layer count). ``first[k_index, e]`` is the
    worst-tile bytes of the first stage holding layers 0..e with them; ``rest`` prices the other
    stages without them (``mem`` of a problem priced with ``shared="none"``)."""

    first: np.ndarray          # (K, L)
    rest: np.ndarray           # (K, L, L)
    alone: np.ndarray          # (K,) the unlayered operations on their own


MIN_LAYERS_ORDER = (3, 2, 1)
PROPORTIONS = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def greedy(problem: SplitProblem, proportions=PROPORTIONS, min_layers_order=MIN_LAYERS_ORDER,
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
            ev = evaluate(problem, split)
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
        if pseudo:
            need = min_layers - 1                    # the unlayered pseudo-layer counts as one
            cost = lambda e: int(unlayered_first.first[ki, e - 1]) if e > 0 else int(unlayered_first.alone[ki])  # noqa: E731
        else:
            need = min_layers
            mem = unlayered_first.rest if unlayered_first is not None else problem.mem
            cost = lambda e, a=a: int(mem[ki, a, e - 1])                              # noqa: E731
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
    return Solution(split, evaluate(problem, split), "uniform")
