"""Exact dynamic programming over contiguous splits (the oracle CP-SAT is tested against), and
the two baselines it is compared with: PopLiner's greedy first-fit and a uniform split.

The DP walks device positions from the last to the first. Its state is the first layer still
to place and the number ``c`` of non-empty stages from this position on, which fixes the 1F1B
in-flight count of a stage (``min(M, c)``). A bottleneck objective combines by ``max``;
lexicographic objectives run the DP once per objective, each bounded by the previous optimum.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .problem import Evaluation, Split, SplitProblem, evaluate, in_flight

INF = np.iinfo(np.int64).max // 4


@dataclass(frozen=True)
class Solution:
    split: Split | None
    evaluation: Evaluation | None
    method: str

    @property
    def feasible(self) -> bool:
        return self.evaluation is not None and self.evaluation.feasible


def _stage_matrices(problem: SplitProblem):
    """time[a, e], and per (position, k) the memory cost and feasibility of stage a..e-1."""
    L = problem.num_layers
    A = L + 1
    a_idx, e_idx = np.meshgrid(np.arange(A), np.arange(A), indexing="ij")
    nonempty = e_idx > a_idx
    time = np.where(nonempty, problem.time_up[None, :] - problem.time_down[:, None], INF).astype(np.int64)
    o = problem.options
    n = e_idx - a_idx
    count_ok = nonempty & (n >= o.min_layers)
    if o.max_layers is not None:
        count_ok &= n <= o.max_layers
    for j in o.pinned_splits:
        count_ok &= ~((a_idx < j) & (j < e_idx))
    allowed = []
    for position in range(problem.devices):
        ok = count_ok.copy()
        for layer, pos in o.pinned_layers:
            inside = (a_idx <= layer) & (layer < e_idx)
            ok &= inside if pos == position else ~inside
        allowed.append(ok)
    mem_cost = {}
    fits = {}
    for position in range(problem.devices):
        for k in problem.in_flight_values:
            m = np.full((A, A), INF, np.int64)
            m[:L, 1:] = problem.mem[problem.k_index(k)]
            m = np.where(nonempty, m, INF)
            fit = nonempty & (m <= int(problem.capacity[position])) & allowed[position]
            if problem.homogeneous:
                cost = m
            else:
                cost = np.where(nonempty, -((-m * 1_000_000) // int(problem.capacity[position])), INF)
            mem_cost[position, k] = cost
            fits[position, k] = fit
    return time, mem_cost, fits


def _k(problem: SplitProblem, c: int) -> int:
    """In-flight count of a stage with ``c`` non-empty stages from it to the end (itself included)."""
    o = problem.options
    return in_flight(o.schedule, o.micro_batches, 0, c)


def _dp(problem: SplitProblem, value, feasible, count: int | None = None):
    """Minimise the max of ``value(position, k)[a, e]`` over splits whose stages satisfy
    ``feasible(position, k)[a, e]``; with ``count``, exactly that many non-empty stages.
    Returns (optimum, split) or (INF, None)."""
    L, N = problem.num_layers, problem.devices
    A = L + 1
    f = np.full((N + 1, N + 1, A), INF, np.int64)       # f[i, c, a]
    choice = np.full((N + 1, N + 1, A), -1, np.int64)    # chosen end e (== a for an empty position)
    f[N, 0, L] = 0
    for i in range(N - 1, -1, -1):
        for c in range(0, N - i + 1):
            best = np.full(A, INF, np.int64)
            pick = np.full(A, -1, np.int64)
            if problem.empty_allowed(i):
                best = f[i + 1, c].copy()
                pick = np.where(best < INF, np.arange(A), -1)
            if c >= 1:
                k = _k(problem, c)
                cand = np.where(feasible(i, k), np.maximum(value(i, k), f[i + 1, c - 1][None, :]), INF)
                e = cand.argmin(axis=1)
                v = cand[np.arange(A), e]
                better = v < best
                best = np.where(better, v, best)
                pick = np.where(better, e, pick)
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
    time, mem_cost, fits = _stage_matrices(problem)
    objective = problem.options.objective

    def feasible(i, k):
        return fits[i, k]

    if objective == "devices":
        used = None
        for c in range(1, problem.devices + 1):
            v, _ = _dp(problem, lambda i, k: np.zeros_like(time), feasible, count=c)
            if v < INF:
                used = c
                break
        if used is None:
            return Solution(None, None, "exact")
        _, split = _dp(problem, lambda i, k: time, feasible, count=used)
    else:
        first = (lambda i, k: time) if objective == "compute" else (lambda i, k: mem_cost[i, k])
        second = (lambda i, k: mem_cost[i, k]) if objective == "compute" else (lambda i, k: time)
        best, split = _dp(problem, first, feasible)
        if split is None:
            return Solution(None, None, "exact")
        _, split = _dp(problem, second, lambda i, k: fits[i, k] & (first(i, k) <= best))
    return Solution(split, evaluate(problem, split), "exact")


def greedy(problem: SplitProblem, proportions=(0.5, 0.6, 0.7, 0.8, 0.9, 1.0)) -> Solution:
    """PopLiner's greedy first-fit: fill each device with as many layers as fit within a share
    of its memory, trying 50%, 60%, ... 100%, and take the first share that places every layer
    on at most N devices. It ignores compute, so the last devices often sit idle or unused."""
    L, N = problem.num_layers, problem.devices
    o = problem.options
    for share in proportions:
        bounds = [0]
        a = 0
        for position in range(N):
            if a == L:
                bounds.append(L)
                continue
            k = in_flight(o.schedule, o.micro_batches, position, N)
            limit = share * int(problem.capacity[position])
            e = a
            while e < L and problem.mem[problem.k_index(k), a, e] <= limit:
                e += 1
            if e - a < o.min_layers:
                break
            if o.max_layers is not None:
                e = min(e, a + o.max_layers)
            bounds.append(e)
            a = e
        if a == L and len(bounds) == N + 1:
            split = Split(tuple(bounds))
            ev = evaluate(problem, split)
            if ev.feasible:
                return Solution(split, ev, f"greedy ({share:.0%} of memory)")
    return Solution(None, None, "greedy")


def uniform(problem: SplitProblem) -> Solution:
    """Equal numbers of layers on every device, whether or not they fit."""
    L, N = problem.num_layers, problem.devices
    used = min(N, L)
    bounds = [round(s * L / used) for s in range(used + 1)] + [L] * (N - used)
    split = Split(tuple(bounds))
    return Solution(split, evaluate(problem, split), "uniform")
