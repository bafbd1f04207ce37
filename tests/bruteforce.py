"""A third, independent solver for tiny instances: enumerate every split of L layers over N
device positions and keep the lexicographically best feasible one.

It shares only the priced tables with the DP and CP-SAT (``problem.table``, the integer stage
times ``time_up``/``time_down`` and the capacities); the rules (in-flight counts per schedule,
layer counts, pins, empty positions, the objectives and their tie-breaks) are written out here
again from the README's definitions rather than taken from ``problem.py``.

With profile variants (``problem.variants``) it also enumerates every choice of a variant for
every stage of every split, each variant's own table and stage times, and keeps the best.
"""

from __future__ import annotations

import itertools
import math

from stagesplit.solver.problem import SplitProblem


def in_flight_here(schedule: str, micro_batches: int, stage: int, stages: int) -> int:
    if schedule == "gpipe":
        return micro_batches
    if schedule == "1f1b":
        return min(micro_batches, stages - stage)
    return 1


def brute_evaluate(problem: SplitProblem, bounds: tuple[int, ...], choice: tuple[int, ...] | None = None):
    """(time, memory, devices) of a split given by its N+1 bounds, its non-empty stages taking
    the variants ``choice`` (one per stage; None: the problem's own tables), or None when a rule
    fails."""
    o = problem.options
    N = o.devices
    stages = [(i, a, e) for i, (a, e) in enumerate(zip(bounds[:-1], bounds[1:])) if e > a]
    if o.exact and len(stages) != N:
        return None
    starts = {a for _, a, _ in stages}
    if any(j not in starts for j in o.pinned_splits):
        return None
    times, mems = [], []
    for s, (position, a, e) in enumerate(stages):
        if e - a < o.min_layers or (o.max_layers is not None and e - a > o.max_layers):
            return None
        for layer, pos in o.pinned_layers:
            if (a <= layer < e) != (pos == position):
                return None
        k = in_flight_here(o.schedule, o.micro_batches, s, len(stages))
        if choice is None:
            table, up, down = problem.table, problem.time_up, problem.time_down
        else:
            variant = problem.variants[choice[s]]
            table, up, down = variant.table, variant.time_up, variant.time_down
        nbytes = table.bytes_of(k, a, e - 1)
        cap = int(problem.capacity[position])
        if nbytes > cap:
            return None
        times.append(int(up[e]) - int(down[a]))
        mems.append(nbytes if problem.homogeneous else math.ceil(nbytes * 1_000_000 / cap))
    for _layer, pos in o.pinned_layers:          # a layer pinned to a position left empty
        if not any(p == pos for p, _, _ in stages):
            return None
    return max(times), max(mems), len(stages)


def brute_key(objective: str, value: tuple[int, int, int]) -> tuple[int, int]:
    time, memory, devices = value
    return {"compute": (time, memory), "memory": (memory, time), "devices": (devices, time)}[objective]


def brute_force(problem: SplitProblem):
    """(best key, every optimal bounds tuple), or (None, []) when nothing is feasible; with
    variants, over every split and every choice of variants for its stages."""
    L, N = problem.num_layers, problem.devices
    objective = problem.options.objective
    best, argbest = None, []
    for inner in itertools.combinations_with_replacement(range(L + 1), N - 1):
        bounds = (0, *inner, L)
        stages = sum(1 for a, e in zip(bounds[:-1], bounds[1:]) if e > a)
        choices = itertools.product(range(len(problem.variants)), repeat=stages) if problem.variants else [None]
        values = [v for v in (brute_evaluate(problem, bounds, c) for c in choices) if v is not None]
        if not values:
            continue
        key = min(brute_key(objective, value) for value in values)
        if best is None or key < best:
            best, argbest = key, [bounds]
        elif key == best:
            argbest.append(bounds)
    return best, argbest


def brute_variant_keys(problem: SplitProblem, bounds: tuple[int, ...]) -> dict[tuple[int, ...], tuple[int, int]]:
    """Every choice of variants that fits the split ``bounds``, with its objective key."""
    stages = sum(1 for a, e in zip(bounds[:-1], bounds[1:]) if e > a)
    out = {}
    for choice in itertools.product(range(len(problem.variants)), repeat=stages):
        value = brute_evaluate(problem, bounds, choice)
        if value is not None:
            out[choice] = brute_key(problem.options.objective, value)
    return out
