"""One-tile profiles priced on the band (model/onetile.py) against the per-tile sweep
(model/pricing.py) and the from-scratch stage pricing, on random one-tile profiles."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from helpers import random_block_profile, random_profile
from stagesplit.io.profile import Target
from stagesplit.model.analysis import Analysis
from stagesplit.model.onetile import price_one_tile_ranges
from stagesplit.model.pricing import price_all_ranges
from stagesplit.model.rangetable import OVER


def one_tile(profile):
    profile.target = Target("one", tiles=1, bytes_per_tile=10**9)
    return profile


@settings(max_examples=120, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), layers=st.integers(1, 7), blocks=st.booleans(), training=st.booleans(),
       shared=st.sampled_from(["every", "none"]), ks=st.lists(st.integers(1, 5), min_size=1, max_size=3))
def test_band_equals_the_sweep_and_the_stage_pricing(seed, layers, blocks, training, shared, ks):
    rng = np.random.default_rng(seed)
    profile = random_block_profile(rng, layers=layers, training=training, tiles=1) if blocks else \
        random_profile(rng, layers=layers, tiles=1)
    model = Analysis.of(one_tile(profile), shared=shared).model
    L = model.num_layers
    ks = tuple(sorted(set(ks)))
    band = model.price_ranges(ks)
    assert band.stash is not None and band.width == L
    sweep = price_all_ranges(model, tuple(sorted({1, *ks})))
    for k in ks:
        assert np.array_equal(band.dense_bytes(k), sweep.dense_bytes(k)), k
        for a in range(L):
            for b in range(a, L):
                assert band.bytes_of(k, a, b) == model.stage_memory(a, b).worst_bytes(k)
    # in blocks of first layers (a tiny memory budget), and cut to a capacity: the same entries
    whole = model.stage_memory(0, L - 1).worst_bytes() if L else 0
    capacity = int(rng.integers(1, whole + 2))
    blocked = price_one_tile_ranges(model, ks, capacity, memory_budget=1)
    for k in ks:
        for a in range(L):
            for b in range(a, L):
                value = blocked.bytes_of(k, a, b)
                truth = sweep.bytes_of(k, a, b)
                assert value == truth or (value == OVER and sweep.bytes_of(1, a, b) > capacity)
    assert all(sweep.bytes_of(1, a, a + blocked.width) > capacity for a in range(L - blocked.width))


def test_the_band_is_narrow_where_little_fits():
    rng = np.random.default_rng(3)
    model = Analysis.of(one_tile(random_block_profile(rng, layers=12, training=True, tiles=1))).model
    single = max(model.stage_memory(a, a).worst_bytes() for a in range(12))
    table = model.price_ranges((1, 2), capacity=single)
    assert table.width < 12 and table.covers(single)
    reference = price_all_ranges(model, (1, 2))
    for a in range(12):
        reach = table.reach(1, single)[a]
        assert all(reference.bytes_of(1, a, b) <= single for b in range(a, reach))
        assert reach == 12 or reference.bytes_of(1, a, reach) > single


@pytest.mark.parametrize("path", ["tests/data/reproducers/stash-overlap-a.json",
                                  "tests/data/reproducers/unknown-steps-hull.json",
                                  "tests/data/reproducers/infeasible-no-pins.json"])
def test_reproducers(path):
    from helpers import ROOT
    model = Analysis.load(ROOT / path).model
    if model.num_tiles != 1:
        pytest.skip("not one tile")
    band, sweep = model.price_ranges((1, 3)), price_all_ranges(model, (1, 3))
    for k in (1, 3):
        assert np.array_equal(band.dense_bytes(k), sweep.dense_bytes(k))
