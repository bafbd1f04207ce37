"""The one-line "why" under a split, and the comparison lines: each case built so that one thing
binds (a layer's compute alone, memory, the balance of compute), with the figures worked out by
hand; the memory-free bound checked against brute force."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import event, given, settings, strategies as st

from helpers import layer_model, options
from indexed_inputs import indexed_inputs
from stagesplit.plan.advise import advise
from stagesplit.plan.text import seconds_text
from stagesplit.reporting.units import device_words
from stagesplit.reporting.why import Comparison, balanced_bottleneck, compare_line, step_time, why_line

GPU = device_words(1)
#: the A100 profile's compute is in FLOPs: 312 TFLOP/s turns it into seconds
FLOPS = 312e12


def seconds(flops: float) -> str:
    return seconds_text(flops / FLOPS)


def brute_force(compute: list[float], stages: int) -> float:
    L = len(compute)
    best = float("inf")
    for k in range(1, min(stages, L) + 1):
        for cuts in itertools.combinations(range(1, L), k - 1):
            bounds = (0, *cuts, L)
            best = min(best, max(sum(compute[a:b]) for a, b in zip(bounds, bounds[1:])))
    return best


def test_balanced_bottleneck_by_hand():
    # [1 2 3 | 4 5]: 6 and 9; no split of two stages does better
    assert balanced_bottleneck([1, 2, 3, 4, 5], 2) == 9
    assert balanced_bottleneck([1, 2, 3, 4, 5], 5) == 5 == balanced_bottleneck([1, 2, 3, 4, 5], 9)
    assert balanced_bottleneck([7], 3) == 7 and balanced_bottleneck([], 2) == 0


@given(st.lists(st.integers(0, 20), min_size=1, max_size=8), st.integers(1, 5))
@settings(max_examples=120, deadline=None)
def test_balanced_bottleneck_is_the_brute_force_optimum(compute, stages):
    assert balanced_bottleneck(compute, stages) == brute_force(compute, stages)


def plan_of(weights, compute, devices, capacity):
    model = layer_model(weights, compute)
    return advise(model, indexed_inputs(model, options(devices, capacity))).plan, model


def test_one_layer_alone_binds():
    """Layer l2 computes 10 of 15: whatever the devices, no stage is faster than 10."""
    plan, model = plan_of([1, 1, 1, 1], [1, 2, 10, 2], 3, 100)
    assert model.profile.target.flops_per_s == FLOPS and plan.bottleneck.compute == 10
    stage = next(s.stage for s in plan.stages if s.first_layer <= 2 <= s.last_layer)
    assert why_line(plan, model, GPU) == (
        f"why: the compute of layer l2 alone binds stage {stage}: more devices cannot help below {seconds(10)} per "
        "micro-batch (a finer `layer_regex`, or tensor parallelism inside that layer, would); headroom: stage 0, the "
        "fullest, uses 0.00 of 0.00 GiB (2.0%), 0.00 GiB free")          # [ l0 l1 | l2 | l3 ]: 2 of 100 units


def test_memory_binds_and_says_what_it_costs():
    """Compute 4, 1, 1, 4: two devices balance as [l0 l1 | l2 l3] (5 each). Memory (weights
    5, 5, 1, 1 on devices of 9) forbids it; the best split that fits is [l0 | l1 l2 l3] (6)."""
    plan, model = plan_of([5, 5, 1, 1], [4, 1, 1, 4], 2, 9)
    assert plan.split_text == "[ l0 | l1 l2 l3 ]" and plan.bottleneck.compute == 6
    assert why_line(plan, model, GPU) == (
        f"why: memory binds: ignoring memory, 2 devices could reach {seconds(5)} per stage instead of {seconds(6)} "
        "(1.20x) with [ l0 l1 | l2 l3 ], which does not fit (more memory per device would allow it); headroom: "
        "stage 1, the fullest, uses 0.00 of 0.00 GiB (77.8%), 0.00 GiB free")     # stage 1: 7 of 9 units


def test_the_balance_of_compute_binds():
    """Compute 3, 3, 3, 3 on 3 devices: one stage must hold two layers (6); 4 devices reach 3."""
    plan, model = plan_of([1, 1, 1, 1], [3, 3, 3, 3], 3, 100)
    assert plan.bottleneck.compute == 6
    line = why_line(plan, model, GPU)
    assert line.startswith("why: the balance of the layers' compute binds: stage ")
    assert line.endswith(f"({seconds(6)}) is the best the layer boundaries allow on 3 devices; 4 devices could bring "
                         f"it to {seconds(3)} if memory allows; headroom: stage 0, the fullest, uses 0.00 of 0.00 GiB "
                         "(2.0%), 0.00 GiB free")


def test_a_model_that_does_not_price_the_plan_gives_only_the_slowest_stage():
    """The model given is not the one the plan was solved on (compute 1, 1, 1, 1 against the
    plan's 3, 3, 3, 3): no layer's time is trusted, so only the plan's own figures: stages 0 and
    1 both take 6 FLOPs, the first is named. Without any model, no line."""
    plan, _ = plan_of([1, 1, 1, 1], [3, 3, 3, 3], 3, 100)
    assert plan.split_text == "[ l0 l1 | l2 l3 ]"
    other = layer_model([1, 1, 1, 1], [1, 1, 1, 1])
    assert why_line(plan, other, GPU) == (f"why: stage 0 (layers l0..l1) is the slowest at {seconds(6)}; headroom: "
                                          "stage 0, the fullest, uses 0.00 of 0.00 GiB (2.0%), 0.00 GiB free")
    assert why_line(plan, None, GPU) == ""


def test_the_devices_that_would_lower_the_slowest_stage_are_counted_past_one_more(monkeypatch):
    """Compute 2, 2, 2, 2 on 2 devices: [l0 l1 | l2 l3] (4). A third device does not help (one
    stage still holds two layers); a fourth brings it to 2. Past ``SCAN_LAYERS`` layers only
    one more device is tried, and the line says no more than that."""
    from stagesplit.reporting import why
    plan, model = plan_of([1, 1, 1, 1], [2, 2, 2, 2], 2, 100)
    assert plan.split_text == "[ l0 l1 | l2 l3 ]"
    head = (f"why: the balance of the layers' compute binds: stage 0 ({seconds(4)}) is the best the layer "
            "boundaries allow ")
    tail = "; headroom: stage 0, the fullest, uses 0.00 of 0.00 GiB (2.0%), 0.00 GiB free"
    assert why_line(plan, model, GPU) == (head + f"on 2 devices; 4 devices could bring it to {seconds(2)} if memory "
                                          "allows" + tail)
    monkeypatch.setattr(why, "SCAN_LAYERS", 3)
    assert why_line(plan, model, GPU) == head + "on 2 devices; one more device would not lower it" + tail


def test_step_time_counts_the_bubble():
    plan, _ = plan_of([1, 1, 1, 1], [3, 3, 3, 3], 3, 100)
    # at most 3 devices: the solver uses two stages of 6 FLOPs (a third cannot go faster);
    # one micro-batch: (1 + 2 - 1) x 6, in seconds as the solver saw it
    assert plan.split_text == "[ l0 l1 | l2 l3 ]"
    assert step_time(plan) == pytest.approx((1 + 2 - 1) * 6 / FLOPS, rel=1e-9, abs=0)
    assert step_time(plan, seconds=False) == (1 + 2 - 1) * 6


@pytest.mark.parametrize("comparison, line", [
    (Comparison("Megatron's even layout", 1.31, False, "does not fit stage 0 (92.10 of 80.00 GiB)"),
     "1.31x faster than Megatron's even layout, which does not fit stage 0 (92.10 of 80.00 GiB)"),
    (Comparison("torchtitan's default split", 1.0, True, ""), "the same split as torchtitan's default split"),
    (Comparison("PopLiner's greedy", 0.8, False, ""), "1.25x slower than PopLiner's greedy"),
    (Comparison("an even split of the layers", 1.0, False, ""), "as fast as an even split of the layers"),
    (Comparison("Megatron's even layout", None, False, "megatron-core needs ..."),
     "Megatron's even layout: not possible here: megatron-core needs ..."),
])
def test_compare_lines(comparison, line):
    assert compare_line(comparison) == line


# -- every claim of the line against the plan's own numbers ----------------------------------------------------------

import dataclasses  # noqa: E402
import functools  # noqa: E402
import re  # noqa: E402

import numpy as np  # noqa: E402

from helpers import PROFILES, random_problems  # noqa: E402
from stagesplit.plan.records import RankRecord, ScheduleRecord  # noqa: E402
from stagesplit.solver.schedule_generation import build_schedule  # noqa: E402
from stagesplit.solver.schedule_simulation import critical_path  # noqa: E402

#: a figure as the line prints it: seconds (3 significant figures) or a count in the profile's unit
FIGURE = r"(?:[0-9.e+-]+ (?:ms|us|ns)|[0-9.e+-]+ [a-z]+)"
#: a stage and its layers by name
STAGE = r"stage (\d+) \((?:layer (\S+)|layers (\S+)\.\.(\S+))\)"


def figure(text: str, unit: str = "") -> float:
    """A printed figure back in seconds (or in ``unit``, the profile's, where it is not seconds)."""
    number, word = text.split(" ")
    scale = {"ms": 1e-3, "us": 1e-6, "ns": 1e-9}.get(word)
    assert scale is not None or word == unit, text
    return float(number) * (scale or 1.0)


def near(text: str, value: float, unit: str = "") -> bool:
    """The printed figure is ``value`` to the 3 significant figures printed."""
    return math.isclose(figure(text, unit), value, rel_tol=6e-3, abs_tol=0)


def check_stage(plan, match, at: int = 1) -> int:
    """A named stage holds exactly the layers named with it; its index back."""
    stage = int(match.group(at))
    s = plan.stages[stage]
    one, first, last = match.group(at + 1), match.group(at + 2), match.group(at + 3)
    names = plan.layer_names
    if one is not None:
        assert s.first_layer == s.last_layer and names[s.first_layer] == one, (match.group(0), s)
    else:
        assert (names[s.first_layer], names[s.last_layer]) == (first, last) and s.first_layer < s.last_layer
    return stage


def parse_split(plan, text: str) -> list[tuple[int, int]]:
    """``[ l0 l1 | l2 ]`` back into (first, last) layer ranges (every layer named, in order)."""
    assert text.startswith("[ ") and text.endswith(" ]"), text
    out, j = [], 0
    for group in text[2:-2].split(" | "):
        names = group.split(" ")
        assert names == plan.layer_names[j:j + len(names)], (text, plan.layer_names)
        out.append((j, j + len(names) - 1))
        j += len(names)
    assert j == len(plan.layer_names), text
    return out


class _Shifted:
    """A match of the clause after its verb, read with the group numbers of the whole clause."""

    def __init__(self, m):
        assert m
        self.m = m

    def group(self, i):
        return self.m.group(i - 2)


def headroom_claim(plan, clause: str) -> None:
    retried = clause.endswith(" (within it once the allocator frees cached blocks and retries)")
    clause = clause.removesuffix(" (within it once the allocator frees cached blocks and retries)")
    m = re.fullmatch(r"headroom: (device|stage) (\d+), the fullest, (uses|reserves) (.+) of (.+) (GiB|bytes)"
                     r"( on tile (\d+))? \((\d+\.\d)%\), (.+) (GiB|bytes) (free|over)", clause)
    assert m, clause
    kind, who = m.group(1), int(m.group(2))
    verb = m.group(3)
    m = re.fullmatch(r"(.+) of (.+) (GiB|bytes)( on tile (\d+))? \((\d+\.\d)%\), (.+) (GiB|bytes) (free|over)",
                     clause.split(f" {verb} ", 1)[1])
    # groups renumbered as before the verb was added: 3 used, 4 capacity, 5 unit, 7 tile, 8 share, 9 rest, 11 word
    m = _Shifted(m)
    if plan.schedule is not None:
        assert kind == "device"
        # where the caching allocator was replayed, what it reserves ("reserves"), else the priced peak
        assert (verb == "reserves") == (plan.schedule.ranks[who].reserved_bytes is not None)
        assert retried == bool(plan.schedule.ranks[who].fits_after_retries)
        shares = [r.needed_bytes / r.capacity_bytes for r in plan.schedule.ranks]
        used, capacity = plan.schedule.ranks[who].needed_bytes, plan.schedule.ranks[who].capacity_bytes
    else:
        assert kind == "stage" and verb == "uses" and not retried
        shares = [s.worst_tile_bytes / s.capacity_bytes for s in plan.stages]
        used, capacity = plan.stages[who].worst_tile_bytes, plan.stages[who].capacity_bytes
        if m.group(7) is not None:
            assert int(m.group(7)) == plan.stages[who].worst_tile
    assert shares[who] == max(shares)
    assert abs(float(m.group(8)) - 100 * used / capacity) <= 0.05 + 1e-9
    gib = m.group(5) == "GiB"
    as_bytes = (lambda t: float(t) * 2**30) if gib else (lambda t: int(t.replace(",", "")))
    slack = 0.005 * 2**30 if gib else 0
    assert abs(as_bytes(m.group(3)) - used) <= slack and abs(as_bytes(m.group(4)) - capacity) <= slack
    assert abs(as_bytes(m.group(9)) - abs(capacity - used)) <= slack
    assert (m.group(11) == "free") == (used <= capacity)


def brute_least(layers, cuts, positions: int, o, exact_positions: bool = False) -> float:
    """The least slowest stage over every split of the layers onto ``positions`` positions that
    keeps the rules (written out again here), memory ignored."""
    L = len(layers)
    best = math.inf
    for inner in itertools.combinations_with_replacement(range(L + 1), positions - 1):
        bounds = (0, *inner, L)
        stages = [(p, a, e) for p, (a, e) in enumerate(zip(bounds, bounds[1:])) if e > a]
        if (exact_positions or o.exact) and len(stages) != positions:
            continue
        if any(j not in {a for _, a, _ in stages} for j in o.pinned_splits):
            continue
        if any(e - a < o.min_layers or (o.max_layers is not None and e - a > o.max_layers) for _, a, e in stages):
            continue
        if any(not any(p == pos and a <= layer < e for p, a, e in stages) for layer, pos in o.pinned_layers):
            continue
        best = min(best, max(sum(layers[a:e]) + cuts[a] + cuts[e] for _, a, e in stages))
    return best


def check_stage_model(plan, model, problem, line: str) -> None:
    """Each clause of a stage-model plan's line, checked by brute force over every split."""
    from bruteforce import brute_evaluate
    from stagesplit.solver.problem import _raw_times
    clauses = line.split("; ")
    headroom_claim(plan, clauses[-1])
    head = clauses[:-1]
    o = plan.inputs.options
    compute, cuts, seconds, unit = _raw_times(model, o, None)
    fig = [s.time_s if unit == "seconds" else s.stage_time for s in plan.stages]
    worst = max(fig)
    per_s = 1.0 if unit == "seconds" else seconds       # the printed figures are seconds where known

    def same(text: str, value: float) -> bool:
        return near(text, value * per_s) if per_s else near(text, value, plan.compute_unit)
    if plan.status != "optimal":
        assert head == ["why: the search stopped at its time limit, so what binds this split is not known",
                        "allow more `time_limit` for a proven split"]
        return
    if o.objective == "memory":
        kind = "device" if plan.schedule is not None else "stage"
        assert head == [f"why: the objective is memory: no split on {plan.devices} devices leaves its fullest {kind} "
                        "emptier (more devices, fewer micro-batches in flight or recompute may)"]
        return
    if o.objective == "devices":
        are = "device is the fewest that holds" if len(plan.stages) == 1 else "devices are the fewest that hold"
        assert head == [f"why: {len(plan.stages)} {are} the model (fewer would not fit)"]
        return
    if max(compute) <= 0:
        assert head == ["why: no compute estimates, so memory decides"]
        return
    L = len(compute)
    free = brute_least(compute, cuts, plan.devices, o)
    m = re.fullmatch(rf"why: memory binds: ignoring memory, (\d+) devices could reach ({FIGURE}) per stage instead "
                     rf"of ({FIGURE}) \((\d+\.\d\d)x\) with (\[.*\]), which does not fit \(more memory per device "
                     r"would allow it\)", head[0])
    if m:
        assert len(head) == 1 and int(m.group(1)) == plan.devices
        assert same(m.group(2), free) and same(m.group(3), worst) and worst > free
        assert abs(float(m.group(4)) - worst / free) <= 0.005 + 1e-9
        ranges = parse_split(plan, m.group(5))
        assert math.isclose(max(sum(compute[a:b + 1]) + cuts[a] + cuts[b + 1] for a, b in ranges), free, rel_tol=1e-9)
        bounds = [0] * (plan.devices + 1)           # the faster split, stage s on position s, does not fit
        for s, (_a, b) in enumerate(ranges):
            bounds[s + 1] = b + 1
        for p in range(len(ranges) + 1, plan.devices + 1):
            bounds[p] = L
        assert brute_evaluate(problem, tuple(bounds)) is None
        return
    assert not worst > free * (1 + 1e-4), (line, free, worst)      # memory binds, and the line does not say so
    m = re.fullmatch(rf"why: the compute of layer (\S+) alone binds stage (\d+): more devices cannot help below "
                     rf"({FIGURE}) per micro-batch \(a finer `layer_regex`, or tensor parallelism inside that layer, "
                     r"would\)", head[0])
    if m:
        assert len(head) == 1
        layer, stage = plan.layer_names.index(m.group(1)), int(m.group(2))
        s = plan.stages[stage]
        assert s.first_layer <= layer <= s.last_layer and fig[stage] == worst      # the layer is on the stage
        assert same(m.group(3), compute[layer])
        assert math.isclose(sum(compute[s.first_layer:s.last_layer + 1]), compute[layer], rel_tol=1e-6)
        return
    m = re.fullmatch(rf"why: the balance of the layers' compute binds: stage (\d+) \(({FIGURE})\) is the best the "
                     rf"layer boundaries allow on (\d+) devices", head[0])
    assert m and len(head) == 2, line
    assert fig[int(m.group(1))] == worst and same(m.group(2), worst) and int(m.group(3)) == plan.devices
    assert math.isclose(worst, free, rel_tol=1e-4)
    m = re.fullmatch(rf"(\d+) devices could bring it to ({FIGURE}) if memory allows", head[1])
    if m:
        k = int(m.group(1))
        assert k > plan.devices and all(brute_least(compute, cuts, n, o) >= worst * (1 - 1e-4)
                                        for n in range(plan.devices + 1, k))
        lower = brute_least(compute, cuts, k, o)
        assert lower < worst and same(m.group(2), lower)
    elif head[1] == "one more device would not lower it":
        assert brute_least(compute, cuts, plan.devices + 1, o) >= worst * (1 - 1e-4)
    else:
        assert head[1] == "no number of devices would lower it"
        assert brute_least(compute, cuts, max(plan.devices, L) + 1, o) >= worst * (1 - 1e-4)


def check_schedule(plan, model, line: str) -> None:
    """Each clause of a scheduled plan's line against its schedule record: the critical path
    recomputed from the record's own times, every split of the layers into its chunks, and the
    splits the line names evaluated."""
    from stagesplit.plan.scheduled import schedule_problem
    from stagesplit.solver.chunk_evaluation import evaluate_chunk_split
    s = plan.schedule
    unit = "" if s.time_unit == "seconds" else s.time_unit
    clauses = line.split("; ")
    headroom_claim(plan, clauses[-1])
    head = clauses[:-1]
    o = plan.inputs.options
    if plan.status != "optimal":
        assert head[0].startswith("why: the search stopped")
        return
    if o.objective == "memory":
        kind = "device" if plan.schedule is not None else "stage"
        assert head == [f"why: the objective is memory: no split on {plan.devices} devices leaves its fullest {kind} "
                        "emptier (more devices, fewer micro-batches in flight or recompute may)"]
        return
    if o.objective == "devices":
        are = "device is the fewest that holds" if len(s.ranks) == 1 else "devices are the fewest that hold"
        assert head == [f"why: {len(s.ranks)} {are} the model (fewer would not fit)"]
        return
    times = np.asarray(s.chunk_times)
    chunk = times.sum(axis=1)
    m = re.fullmatch(rf"why: the step's critical path \(({FIGURE}), bubble (\d+\.\d)%\) spends ({FIGURE}) on device "
                     rf"(\d+), which runs (.+)", head[0])
    assert m, line
    assert near(m.group(1), s.step_time, unit) and abs(float(m.group(2)) - 100 * s.bubble) <= 0.05 + 1e-9
    d = int(m.group(4))
    # the path from the record's own numbers: each device's optimizer step is its busy time less its actions
    schedule = build_schedule(s.kind, len(s.ranks), s.micro_batches, s.chunks_per_rank)
    optimizer = [r.busy - s.micro_batches * sum(chunk[c] for c in r.chunks) for r in s.ranks]
    transfer = None
    if o.communication:         # each boundary's cut, forward and back, once a micro-batch over the link
        from stagesplit.plan.scheduled import schedule_problem as problem_of
        table = problem_of(model, plan.inputs).table
        cuts = [x.first_layer for x in plan.stages[1:]]
        transfer = (table.forward_cut[cuts] + table.backward_cut[cuts]) / 2 / o.link_bytes_per_s
    path = critical_path(schedule, times[:, 0], times[:, 1], times[:, 2], transfer, optimizer)
    assert math.isclose(path.length, s.step_time, rel_tol=1e-9)
    ranks = np.asarray(schedule.chunk_rank)
    on = np.bincount(ranks, weights=path.forward * times[:, 0] + path.backward_input * times[:, 1]
                     + path.backward_weight * times[:, 2], minlength=len(s.ranks))
    on[path.optimizer_rank] += optimizer[path.optimizer_rank]
    crossed = 0.0 if transfer is None else float(path.transfers @ np.where(ranks[:-1] == ranks[1:], 0, transfer))
    assert math.isclose(on.sum() + crossed, s.step_time, rel_tol=1e-9)
    assert near(m.group(3), on[d], unit) and on[d] == on.max() and on[d] <= s.ranks[d].busy * (1 + 1e-9)
    named = [check_stage(plan, x) for x in re.finditer(STAGE, m.group(5))]
    assert m.group(5) == ", ".join(x.group(0) for x in re.finditer(STAGE, m.group(5)))
    assert tuple(named) == s.ranks[d].chunks and all(plan.stages[c].device == d for c in named)
    m = re.fullmatch(rf"(?:stage (\d+)|{STAGE}) is the slowest: ({FIGURE}) per micro-batch", head[1])
    assert m, head[1]
    slowest = int(m.group(1)) if m.group(1) is not None else check_stage(plan, m, 2)
    assert (m.group(1) is not None) == (slowest in named)
    assert chunk[slowest] == chunk.max() and near(m.group(6), chunk[slowest], unit)
    rest = head[2:]
    if model.phase_cols is None:                  # no phases: no layer's phase times to weigh
        assert rest == []
        return
    problem = schedule_problem(model, plan.inputs)
    layers = problem.table.layer_times[:, :3].sum(axis=1)
    C = len(plan.stages)
    least = brute_least(layers, np.zeros(len(layers) + 1), C, dataclasses.replace(o, pinned_layers=()),
                        exact_positions=True)
    if rest and rest[0] == f"no split into {C} stages has a faster slowest stage":
        assert chunk.max() <= least * (1 + 1e-4)
        rest = rest[1:]
    elif rest and rest[0].startswith("the layers allow"):
        m = re.fullmatch(rf"the layers allow a slowest stage of ({FIGURE}) \((\[.*\])\), but (.+)", rest[0])
        assert m and near(m.group(1), least, unit) and chunk.max() > least
        ranges = parse_split(plan, m.group(2))
        assert len(ranges) == C and math.isclose(max(layers[a:b + 1].sum() for a, b in ranges), least, rel_tol=1e-9)
        other = evaluate_chunk_split(problem, (0, *[b + 1 for _, b in ranges]))
        tail = m.group(3)
        if tail.startswith("that split's step takes "):
            assert other.feasible and near(tail[len("that split's step takes "):], other.step_time, unit)
            assert other.step_time >= s.step_time * (1 - 1e-9)
        elif tail == "that split does not fit":
            assert not other.feasible
        else:
            assert tail == "no split that fits has a faster step than this one"
        rest = rest[1:]
    if rest:
        m = re.fullmatch(rf"memory binds: ignoring memory, (\[.*\]) would take ({FIGURE}) per step instead of "
                         rf"({FIGURE}) \((\d+\.\d\d)x\), but it does not fit", rest[0])
        assert m and len(rest) == 1, rest
        ranges = parse_split(plan, m.group(1))
        other = evaluate_chunk_split(problem, (0, *[b + 1 for _, b in ranges]), np.zeros(len(layers), np.int64))
        assert not other.feasible and "needs" in other.reason and other.step_time < s.step_time
        assert near(m.group(2), other.step_time, unit) and near(m.group(3), s.step_time, unit)


def check_why(plan, model, problem=None) -> str:
    line = why_line(plan, model, device_words(plan.profile.tiles))
    (check_schedule(plan, model, line) if plan.schedule is not None else check_stage_model(plan, model, problem, line))
    return line


# -- a hand-built scheduled plan --------------------------------------------------------------------------------------

def test_the_critical_path_of_a_hand_built_gpipe_step():
    """Three stages of one layer each under GPipe, 2 micro-batches; forward 1, 2, 1 ms and
    backward 2, 4, 2 ms, no weight-gradient step; device 0's optimizer step takes 1 ms.

    device 0: F0 0-1, F1 1-2; B0 12-14 (after device 1's B0), B1 16-18, optimizer 18-19
    device 1: F0 1-3, F1 3-5;  B0 8-12 (after device 2's B0 at 8), B1 12-16
    device 2: F0 3-4, F1 5-6;  B0 6-8, B1 8-10
    The step is 19 ms. Its chain, from the end: device 0's optimizer (1) and B1 (2); device 1's
    B1 (4) and B0 (4); device 2's B0 (2) and F1 (1); device 1's F1 (2) and F0 (2); device 0's F0
    (1): 4 ms on device 0, 12 on device 1, 3 on device 2. Busy: 7, 12 and 6 ms of 3 x 19: the
    bubble is 1 - 25 / 57 = 56.1%. Stage 1 is the slowest: 2 + 4 = 6 ms a micro-batch."""
    plan, model = plan_of([1, 1, 1], [1, 2, 1], 3, 100)
    assert plan.split_text == "[ l0 | l1 | l2 ]"
    ms, gib = 1e-3, 2**30
    ranks = tuple(RankRecord(rank=r, chunks=(r,), peak_bytes=peak * gib, capacity_bytes=80 * gib, peak_at="",
                             busy=busy * ms) for r, peak, busy in ((0, 10, 7), (1, 40, 12), (2, 20, 6)))
    record = ScheduleRecord(kind="gpipe", chunks_per_rank=1, micro_batches=2, step_time=19 * ms, time_unit="seconds",
                            bubble=1 - 25 / 57, ranks=ranks,
                            chunk_times=((1 * ms, 2 * ms, 0.0), (2 * ms, 4 * ms, 0.0), (1 * ms, 2 * ms, 0.0)))
    plan = dataclasses.replace(plan, schedule=record)
    line = why_line(plan, model, GPU)           # a model without phases: the record's own figures only
    assert line == ("why: the step's critical path (19 ms, bubble 56.1%) spends 12 ms on device 1, which runs stage 1 "
                    "(layer l1); stage 1 is the slowest: 6 ms per micro-batch; headroom: device 1, the fullest, uses "
                    "40.00 of 80.00 GiB (50.0%), 40.00 GiB free")
    assert check_schedule(plan, model, line) is None


def test_headroom_is_what_the_allocator_reserves_where_it_was_replayed():
    """The same hand-built GPipe step with each device's reserved bytes recorded: device 2 reserves
    the most of its capacity (70 of 80 GiB) though device 1 priced the highest peak."""
    plan, model = plan_of([1, 1, 1], [1, 2, 1], 3, 100)
    ms, gib = 1e-3, 2**30
    ranks = tuple(RankRecord(rank=r, chunks=(r,), peak_bytes=peak * gib, capacity_bytes=80 * gib, peak_at="",
                             busy=busy * ms, reserved_bytes=reserved * gib, replayed_bytes=peak * gib)
                  for r, peak, reserved, busy in ((0, 10, 11, 7), (1, 40, 44, 12), (2, 20, 70, 6)))
    record = ScheduleRecord(kind="gpipe", chunks_per_rank=1, micro_batches=2, step_time=19 * ms, time_unit="seconds",
                            bubble=1 - 25 / 57, ranks=ranks,
                            chunk_times=((1 * ms, 2 * ms, 0.0), (2 * ms, 4 * ms, 0.0), (1 * ms, 2 * ms, 0.0)))
    plan = dataclasses.replace(plan, schedule=record)
    line = why_line(plan, model, GPU)
    assert line.endswith("headroom: device 2, the fullest, reserves 70.00 of 80.00 GiB (87.5%), 10.00 GiB free")
    headroom_claim(plan, line.rsplit("; ", 1)[1])
    text = "\n".join(plan._schedule_lines(True))
    assert ("reserved: torch's caching allocator, replayed on each device's allocations in the schedule's order "
            "with cuBLAS's workspaces, reserves at most 70.00 GiB on device 2 (87.5% of 80.00 GiB; the replay "
            "allocates 20.00 GiB, the plan priced 20.00 GiB); 10.00 GiB left; per device: 14%, 55%, 88%") in text
    over = dataclasses.replace(ranks[2], reserved_bytes=90 * gib)
    plan = dataclasses.replace(plan, schedule=dataclasses.replace(record, ranks=(ranks[0], ranks[1], over)))
    assert not over.fits and ranks[2].fits
    assert "does not fit by 10.00 GiB; per device: 14%, 55%, 112%" in "\n".join(plan._schedule_lines(True))
    assert why_line(plan, model, GPU).endswith("reserves 90.00 of 80.00 GiB (112.5%), 10.00 GiB over")
    headroom_claim(plan, why_line(plan, model, GPU).rsplit("; ", 1)[1])
    # over without retries, within with them (the allocator frees cached segments before it runs out)
    retried = dataclasses.replace(over, fits_after_retries=True, allocator_retries=3)
    plan = dataclasses.replace(plan, schedule=dataclasses.replace(record, ranks=(ranks[0], ranks[1], retried)))
    assert retried.fits
    assert ("10.00 GiB over, but freeing cached blocks and retrying, as torch does before it runs out of memory, "
            "keeps it within (3 retries a step, each a synchronising cudaFree); per device: 14%, 55%, 112%"
            in "\n".join(plan._schedule_lines(True)))
    line = why_line(plan, model, GPU)
    assert line.endswith("10.00 GiB over (within it once the allocator frees cached blocks and retries)")
    headroom_claim(plan, line.rsplit("; ", 1)[1])


# -- the two lines issue #34 quotes, on the shipped capture -------------------------------------------------------

@functools.cache
def gpt_plan(schedule: str):
    import stagesplit
    return stagesplit.solve(PROFILES / "gpt-captured.stagesplit", 4, schedule=schedule, micro_batches=8)


def test_1f1b_on_the_gpt_capture_does_not_say_memory_binds():
    """Every device under 1% full: the line said "memory binds (stage 0 is 0% full)" (it took
    each layer's time with its optimizer step against stage times without it)."""
    plan = gpt_plan("1f1b")
    line = check_why(plan, plan.analysis)
    assert "memory binds" not in line and max(r.peak_bytes / r.capacity_bytes for r in plan.schedule.ranks) < 0.01
    assert line.startswith("why: the step's critical path (6.84 ms, bubble 34.7%) spends ")
    assert "stage 0 is the slowest: 0.755 ms per micro-batch" in line


def test_auto_on_the_gpt_capture_names_the_slowest_stage_with_its_own_layers():
    """``--schedule auto`` chose interleaved 1F1B on [ 0 1 2 | 3 4 | 5 6 | 7 ]: the line said "the
    compute of layer 7 alone binds stage 0" (layer 7 is on stage 3; stage 0 is the slowest)."""
    plan = gpt_plan("auto")
    assert plan.split_text == "[ 0 1 2 | 3 4 | 5 6 | 7 ]"
    line = check_why(plan, plan.analysis)
    assert "layer 7" not in line and "alone binds" not in line and "memory binds" not in line
    assert "which runs stage 0 (layers 0..2); stage 0 is the slowest: 0.755 ms per micro-batch" in line


# -- random problems: every claim parsed and checked ---------------------------------------------------------------

@given(random_problems(max_layers=6, max_devices=4), st.integers(0, 3))
@settings(max_examples=50, deadline=None)
def test_every_claim_of_a_stage_model_line_is_the_plan_s(problem, objective):
    model, opts = problem
    if objective:                       # mostly the compute objective, whose line says the most
        opts = dataclasses.replace(opts, objective="compute")
    advice = advise(model, indexed_inputs(model, opts))
    if advice.plan.stages:
        event(check_why(advice.plan, model, advice.problem).split(":")[1])


@functools.cache
def _analysis():
    from stagesplit import api
    return api.analyze(PROFILES / "gpt-captured.stagesplit")


@functools.cache
def gpt_model():
    """The capture's model with the A100's roofline, as ``solve`` resolves it (one for every example)."""
    from stagesplit import api
    from stagesplit.solver.request import SolveRequest
    return api.resolve(SolveRequest(devices=1), _analysis()).model


def _inputs(request):
    from stagesplit import api
    return api.resolve(request, _analysis()).inputs


@st.composite
def scheduled(draw):
    from stagesplit.solver.schedule_kinds import ScheduleKind, is_valid, traits
    kind = draw(st.sampled_from([k.value for k in ScheduleKind]))
    v = traits(kind).fixed_chunks_per_rank or draw(st.integers(1, 2))
    devices = draw(st.integers(1, 4))
    micro = draw(st.integers(1, 6))
    if devices * v > 8 or not is_valid(kind, devices, micro, v):
        devices, v, micro = 2, traits(kind).fixed_chunks_per_rank or 1, 4
    # from no limit to a device about as full as the fullest stage of an even split
    capacity = draw(st.sampled_from([None, 0.30, 0.24, 0.2, 0.15]))
    return kind, v, devices, micro, capacity, draw(st.booleans())


@pytest.mark.slow
@given(scheduled())
@settings(max_examples=20, deadline=None)
def test_every_claim_of_a_scheduled_line_is_the_plan_s(case):
    from stagesplit.errors import StagesplitError
    from stagesplit.plan.scheduled import advise_schedule
    from stagesplit.solver.request import SolveRequest
    kind, v, devices, micro, capacity, communication = case
    model = gpt_model()
    request = SolveRequest(devices=devices, schedule=kind, chunks_per_rank=v, micro_batches=micro, time_limit=20,
                           communication=communication, link_bandwidth=2e9 if communication else None)
    inputs = _inputs(request)
    if capacity is not None:
        o = inputs.options
        inputs = dataclasses.replace(inputs, options=dataclasses.replace(
            o, capacities=(int(capacity * 2**30),) * devices))
    try:
        plan = advise_schedule(model, inputs).plan
    except StagesplitError:
        return
    if plan.stages:
        line = check_why(plan, model)
        event("memory binds" if "memory binds" in line else "memory does not bind")
        event("allows" if "the layers allow" in line else "balanced")

