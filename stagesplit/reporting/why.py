"""Why this split: what binds the plan (the memory of one stage, or the compute of one layer
alone, or the balance of the layers' compute) and what would change it; and how it compares
with what the user would do otherwise, each in one line.

A stage's time is what the solver minimised: its roofline seconds where the target gives them
(``StagePlan.time_s``), else its compute with transfers (``StagePlan.stage_time``). A pipeline
step of ``P`` stages and ``M`` micro-batches takes ``(M + P - 1)`` times the slowest stage
(GPipe and 1F1B alike), which is how plans with different stage counts are compared.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..plan.baselines import LABELS
from ..plan.records import Plan
from .units import DeviceWords

__all__ = ["Comparison", "balanced_bottleneck", "compare_line", "comparisons", "layer_times", "stage_times",
           "step_ratio", "step_time", "why_line"]

#: relative tolerance under which two stage times are the same
SAME = 1e-6


def balanced_bottleneck(compute: Sequence[float], stages: int) -> float:
    """The least possible slowest-stage compute of ``compute`` (one figure per layer) split into
    at most ``stages`` contiguous stages, memory ignored (the linear partition problem)."""
    c = np.asarray(compute, np.float64)
    L = len(c)
    if L == 0:
        return 0.0
    prefix = np.concatenate([[0.0], np.cumsum(c)])
    span = prefix[None, :] - prefix[:, None]              # span[a, e]: layers a..e-1
    best = span[0].copy()                                  # one stage: layers 0..e-1
    for _ in range(1, min(stages, L)):
        # best'[e] = min over a of max(best[a], span[a, e]), a <= e
        candidates = np.maximum(best[:, None], span)
        candidates[np.tril_indices(L + 1, -1)] = np.inf
        best = np.minimum(best, candidates.min(axis=0))
    return float(best[L])


def _timed(plan: Plan) -> bool:
    return bool(plan.stages) and all(s.time_s is not None for s in plan.stages)


def stage_times(plan: Plan, seconds: bool | None = None) -> tuple[list[float], bool]:
    """Each stage's time as the solver saw it, and whether it is in seconds (``seconds``: force
    the choice; seconds are used only where every stage has them)."""
    if (_timed(plan) if seconds is None else seconds and _timed(plan)):
        return [float(s.time_s) for s in plan.stages], True
    return [s.stage_time for s in plan.stages], False


def layer_times(model) -> tuple[np.ndarray, bool]:
    """Each layer's time as the solver saw it (roofline seconds, else compute), and whether in seconds."""
    seconds = getattr(model, "layer_time_s", None)
    if seconds is not None:
        return np.asarray(seconds, np.float64), True
    return np.nan_to_num(np.asarray(model.layer_compute, np.float64)), False


def step_time(plan: Plan, seconds: bool | None = None) -> float:
    """One pipeline step: (M + P - 1) x the slowest stage (see ``stage_times``)."""
    if not plan.stages:
        return float("inf")
    M = plan.inputs.micro_batches
    return (M + len(plan.stages) - 1) * max(stage_times(plan, seconds)[0])


def step_ratio(plan: Plan, reference: Plan) -> float | None:
    """``plan``'s step time over ``reference``'s, both in seconds where both have them."""
    if not plan.stages or not reference.stages:
        return None
    seconds = _timed(plan) and _timed(reference)
    base = step_time(reference, seconds)
    return step_time(plan, seconds) / base if base > 0 else None


def _time(plan: Plan, value: float, seconds: bool, words: DeviceWords) -> str:
    if seconds:
        return words.seconds(value)
    s = plan.bottleneck                       # compute in the profile's unit, seconds where known
    if s is not None and s.time_s is not None and s.stage_time > 0:
        return words.seconds(value * s.time_s / s.stage_time)
    return f"{value:.4g} {plan.compute_unit}"


def why_line(plan: Plan, model, words: DeviceWords) -> str:
    """One line: what binds the plan and what would change it. ``model``: the cost model the
    plan was solved on (each layer's time); without it only memory can be discussed."""
    if not plan.stages:
        return ""
    if plan.status != "optimal":
        return ("why: the search stopped at its time limit, so what binds this split is not known; allow more "
                "--time-limit for a proven split")
    o = plan.inputs.options
    fullest = plan.worst_memory
    full = fullest.worst_tile_bytes / fullest.capacity_bytes if fullest.capacity_bytes else 0.0
    where = f"stage {fullest.stage} is {full:.0%} full" + (f" on tile {fullest.worst_tile}" if not words.one_tile else "")
    if o.objective == "memory":
        return (f"why: the objective is memory; {where}, the least any split on {plan.devices} devices reaches "
                f"(more devices, fewer micro-batches in flight or recompute would lower it)")
    if o.objective == "devices" and o.exact:
        return f"why: --exact uses all {plan.devices} devices, so the device count was given, not searched; {where}"
    if o.objective == "devices":
        return (f"why: {len(plan.stages)} devices are the fewest that hold the model; {where} "
                f"(fewer would not fit; more would cut the bottleneck)")
    if plan.variants:
        return _variants_why(plan, words)
    if model is None:
        return ""
    layers, seconds = layer_times(model)
    times, _ = stage_times(plan)
    if not len(layers) or layers.max() <= 0:
        return f"why: no compute estimates, so memory decides: {where}"
    b = int(np.argmax(times))
    stage = plan.stages[b]
    have = float(sum(layers[stage.first_layer:stage.last_layer + 1]))       # transfers left out
    slowest = int(np.argmax(layers))
    floor = float(layers[slowest])
    if have <= floor * (1 + SAME):
        return (f"why: the compute of layer {plan.layer_names[slowest]} alone binds stage {stage.stage}: more "
                f"devices cannot help below {_time(plan, floor, seconds, words)} per micro-batch (a finer "
                f"--layer-regex, or tensor parallelism inside that layer, would)")
    free = balanced_bottleneck(layers, plan.devices)
    if have > free * (1 + SAME):
        return (f"why: memory binds ({where}): ignoring memory, {plan.devices} devices could reach "
                f"{_time(plan, free, seconds, words)} per stage instead of {_time(plan, have, seconds, words)} "
                f"({have / free:.2f}x); more memory per device, fewer micro-batches in flight or recompute would "
                f"allow it")
    more = balanced_bottleneck(layers, plan.devices + 1)
    if more < have * (1 - SAME):
        change = f"{plan.devices + 1} devices could bring it to {_time(plan, more, seconds, words)} if memory allows"
    else:
        change = f"more devices would not lower it"
    return (f"why: the balance of the layers' compute binds: stage {stage.stage} "
            f"({_time(plan, have, seconds, words)}) is the best the layer boundaries allow on {plan.devices} devices; "
            f"{change}")


def _variants_why(plan: Plan, words: DeviceWords) -> str:
    """The why of a plan solved on profile variants: the bottleneck stage and its proportion,
    and which stages run below the highest proportion."""
    times, seconds = stage_times(plan)
    b = plan.stages[int(np.argmax(times))]
    highest = max((v.proportion for v in plan.variants if v.proportion is not None), default=None)
    lower = [s.stage for s in plan.stages if highest is not None and s.memory_proportion is not None
             and s.memory_proportion < highest]
    text = (f"why: each stage's memory proportion was chosen with the split; stage {b.stage} binds at "
            f"{_time(plan, max(times), seconds, words)} with proportion {b.memory_proportion:g} ({b.variant})")
    if lower:
        stages = ", ".join(map(str, lower))
        text += (f"; stage{'s' if len(lower) > 1 else ''} {stages} run{'s' if len(lower) == 1 else ''} below the "
                 f"highest proportion ({highest:g}): a higher one does not fit there or is not faster")
    return text


@dataclass(frozen=True)
class Comparison:
    """The plan against one alternative: how many times faster a pipeline step is (> 1: the
    plan is faster), and what is wrong with the alternative (empty when it fits)."""

    label: str
    speedup: float | None           # None: the alternative has no split
    same_split: bool
    problem: str


def _label(method: str) -> str:
    if method.startswith("greedy"):
        return "PopLiner's greedy"
    return LABELS.get(method, method)


def _problem(alternative: Plan, words: DeviceWords) -> str:
    if not alternative.stages:
        return alternative.message or "no split"
    over = [s for s in alternative.stages if not s.fits]
    if over:
        s = over[0]
        return f"does not fit stage {s.stage} ({words.bytes_of(s.worst_tile_bytes, s.capacity_bytes)})"
    if not alternative.feasible:
        return alternative.message or "breaks a rule of the request"
    return ""


def comparisons(plan: Plan, alternatives: Sequence[Plan], words: DeviceWords) -> list[Comparison]:
    out = []
    bounds = [(s.first_layer, s.last_layer, s.memory_proportion) for s in plan.stages]
    for alt in alternatives:
        speedup = step_ratio(alt, plan)
        same = bounds == [(s.first_layer, s.last_layer, s.memory_proportion) for s in alt.stages]
        out.append(Comparison(_label(alt.method), speedup, same, _problem(alt, words)))
    return out


def compare_line(c: Comparison) -> str:
    """E.g. "1.31x faster than Megatron's even layout, which does not fit stage 0 (...)"."""
    if c.speedup is None:
        return f"{c.label}: not possible here: {c.problem}"
    if c.same_split:
        head = f"the same split as {c.label}"
    elif c.speedup > 1 + SAME:
        head = f"{c.speedup:.2f}x faster than {c.label}"
    elif c.speedup < 1 - SAME:
        head = f"{1 / c.speedup:.2f}x slower than {c.label}"
    else:
        head = f"as fast as {c.label}"
    return head + (f", which {c.problem}" if c.problem else "")
