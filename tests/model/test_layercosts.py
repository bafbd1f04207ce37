"""Per-layer profiles: the closed-form range costs (model/layercosts.py) equal the per-tile sweep
(model/pricing.py) and the from-scratch stage pricing, on random per-layer profiles; which
profiles are recognised as per-layer; and the band (only ranges that can fit are kept)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from stagesplit.io.layerform import LayerSpec, build_layer_profile, layer_form
from stagesplit.io.targets import load_target
from stagesplit.layers import LayerOptions
from stagesplit.model.analysis import Analysis
from stagesplit.model.costmodel import StageCostModel
from stagesplit.model.pricing import price_all_ranges
from stagesplit.model.rangetable import OVER

GPU = load_target("a100-80gb")


@st.composite
def layer_profiles(draw, max_layers=9):
    n = draw(st.integers(1, max_layers))
    figure = st.one_of(st.just(0), st.integers(1, 500))
    specs = [LayerSpec(f"l{i}", weights=draw(figure), activations=draw(figure), output=draw(figure),
                       other=draw(figure), workspace=draw(figure), compute=float(draw(st.integers(0, 9))))
             for i in range(n)]
    training = draw(st.booleans())
    shared = (draw(figure), draw(figure))
    return build_layer_profile(specs, GPU, training=training, shared_weights=shared[0], shared_other=shared[1])


@settings(max_examples=150, deadline=None)
@given(layer_profiles(), st.sampled_from(["every", "none"]), st.lists(st.integers(1, 6), min_size=1, max_size=3))
def test_closed_form_equals_the_sweep_and_the_stage_pricing(profile, shared, in_flight):
    model = Analysis.of(profile, shared=shared).model
    assert model.layer_costs() is not None                     # recognised as per-layer
    ks = tuple(sorted(set(in_flight)))
    closed = model.price_ranges(ks)
    sweep = price_all_ranges(model, ks)
    L = model.num_layers
    assert closed.stash is not None and closed.width == L      # linear, every range
    for k in ks:
        assert np.array_equal(closed.dense_bytes(k), sweep.dense_bytes(k)), k
        for a in range(L):
            for b in range(a, L):
                assert closed.bytes_of(k, a, b) == model.stage_memory(a, b).worst_bytes(k)


def test_closed_form_by_hand():
    # three training layers (x 10 bytes): weights 5, 6, 7; activations 1, 2, 4; outputs 3, 0, 2;
    # workspace 0, 9, 0
    specs = [LayerSpec("a", weights=50, activations=10, output=30),
             LayerSpec("b", weights=60, activations=20, workspace=90),
             LayerSpec("c", weights=70, activations=40, output=20)]
    model = Analysis.of(build_layer_profile(specs, GPU, training=True)).model
    table = model.price_ranges((1, 3))
    # a alone: 50 + peak at its forward step (activation 10 + output 30) = 90; stash 10
    assert table.bytes_of(1, 0, 0) == 90 and table.bytes_of(3, 0, 0) == 110
    # b alone: 60 + (20 + workspace 90 + input 30) = 200; a..b: 110 + max(10 + 30, 30 + 90 + 30) = 260
    assert table.bytes_of(1, 1, 1) == 200 and table.bytes_of(1, 0, 1) == 260
    # c alone: 70 + (40 + 20 + input 0) = 130; the last layer's activations are not stashed
    assert table.bytes_of(1, 2, 2) == 130 and table.bytes_of(3, 2, 2) == 130
    # a..c with 3 in flight: 180 + max(40, 150, 10 + 20 + 40 + 20) + 2 x (10 + 20) = 390
    assert table.bytes_of(3, 0, 2) == 390
    assert table.bytes_of(3, 0, 2) == model.stage_memory(0, 2).worst_bytes(3)


def test_the_band_keeps_the_ranges_that_fit():
    specs = [LayerSpec(f"l{i}", weights=100) for i in range(10)]
    model = Analysis.of(build_layer_profile(specs, GPU, training=False)).model
    table = model.price_ranges((1, 2), capacity=350)
    assert table.width == 3 and table.covers(350) and not table.covers(400)
    assert table.bytes_of(1, 4, 6) == 300 and table.bytes_of(1, 4, 7) == OVER
    assert table.reach(1, 350).tolist() == [3, 4, 5, 6, 7, 8, 9, 10, 10, 10]
    assert table.reach(1, 99).tolist() == list(range(10))          # nothing fits: a stage ends where it starts
    assert table.single().tolist() == [100] * 10


def test_other_profiles_and_orders_are_not_recognised(sample_analysis):
    # a full-form profile, and a per-layer profile whose layers are put in another order, take the sweep
    assert layer_form(sample_analysis.profile) is None
    profile = build_layer_profile([LayerSpec(name, weights=10, activations=5, output=3)
                                   for name in ("b", "a", "d", "c")], GPU)
    assert layer_form(profile) is not None
    reordered = Analysis.of(profile, LayerOptions(order="natural")).model
    assert list(reordered.layers.names) == ["a", "b", "c", "d"] and reordered.layer_costs() is None
    sweep = price_all_ranges(reordered, (1, 2))
    assert np.array_equal(reordered.price_ranges((1, 2)).dense_bytes(2), sweep.dense_bytes(2))


def test_an_edited_per_layer_profile_is_not_recognised():
    profile = build_layer_profile([LayerSpec(f"l{i}", weights=10, activations=5) for i in range(3)], GPU)
    names = [profile.variable_name(v) for v in range(len(profile.variables))]
    cls = int(profile.variables.live_class[names.index("l0/activations")])
    intervals = profile.liveness.intervals
    intervals.values.reshape(-1, 2)[intervals.offsets[cls], 1] -= 1    # dies a step early: not what its figures build
    assert layer_form(profile) is None
    model = Analysis.of(profile).model
    assert model.layer_costs() is None
    assert model.price_ranges((1,)).bytes_of(1, 0, 0) == model.stage_memory(0, 0).worst_bytes()


@pytest.mark.parametrize("training", [True, False])
def test_one_tile_profiles_priced_linearly(training):
    """A one-tile profile that is not per-layer: the sweep once, bytes linear in the in-flight count."""
    from helpers import random_block_profile
    from stagesplit.io.profile import Target
    rng = np.random.default_rng(5)
    profile = random_block_profile(rng, layers=6, training=training, tiles=1)
    profile.target = Target("one", tiles=1, bytes_per_tile=10**9)
    model = Analysis.of(profile).model
    table = model.price_ranges((1, 2, 5))
    assert table.stash is not None and table.one_tile
    reference = price_all_ranges(model, (1, 2, 5))
    for k in (1, 2, 5):
        assert np.array_equal(table.dense_bytes(k), reference.dense_bytes(k))


def test_regex_layering_keeps_names():
    profile = build_layer_profile([LayerSpec(f"l{i}", weights=10) for i in range(3)], GPU, training=False)
    assert StageCostModel(profile, Analysis.of(profile).layers).layer_costs() is not None
