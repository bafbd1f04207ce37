"""The one-line "why" under a split, and the comparison lines: each case built so that one thing
binds (a layer's compute alone, memory, the balance of compute), with the figures worked out by
hand; the memory-free bound checked against brute force."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stagesplit.plan.advise import advise, inputs_of
from stagesplit.reporting.units import device_words
from stagesplit.reporting.why import Comparison, balanced_bottleneck, compare_line, step_time, why_line

from stagesplit.plan.text import seconds_text

from helpers import layer_model, options

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
    return advise(model, inputs_of(model, options(devices, capacity))).plan, model


def test_one_layer_alone_binds():
    """Layer l2 computes 10 of 15: whatever the devices, no stage is faster than 10."""
    plan, model = plan_of([1, 1, 1, 1], [1, 2, 10, 2], 3, 100)
    assert model.profile.target.flops_per_s == FLOPS and plan.bottleneck.compute == 10
    stage = next(s.stage for s in plan.stages if s.first_layer <= 2 <= s.last_layer)
    assert why_line(plan, model, GPU) == (
        f"why: the compute of layer l2 alone binds stage {stage}: more devices cannot help below {seconds(10)} per "
        "micro-batch (a finer --layer-regex, or tensor parallelism inside that layer, would); headroom: stage 0, the "
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
