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
    assert model.num_tiles == 1, path           # each reproducer here is a one-tile profile
    band, sweep = model.price_ranges((1, 3)), price_all_ranges(model, (1, 3))
    for k in (1, 3):
        assert np.array_equal(band.dense_bytes(k), sweep.dense_bytes(k))


def test_a_captures_phase_sweeps_equal_the_band(monkeypatch):
    """A captured GPU profile (one tile, each operation's phase), priced as the phase table prices it
    (model/phases.py: every column, then each phase kind's columns alone, the split backward's on the
    view that holds the stash through it): the sweep's one-tile path (``_one_tile_peaks``: a layer's
    columns at once) gives the band's bytes (model/onetile.py, no code in common) for every range
    and in-flight count, and the from-scratch stage price for the whole model."""
    from helpers import PROFILES
    from stagesplit.model import phases, pricing
    swept = []
    one_tile = pricing._one_tile_peaks
    monkeypatch.setattr(pricing, "_one_tile_peaks", lambda *args: swept.append(1) or one_tile(*args))
    # a memo of its own: sweeps another test of this process made would be answered without the path
    monkeypatch.setattr(pricing, "_SWEEPS", pricing._SweepMemo())
    model = Analysis.load(PROFILES / "gpt-captured.stagesplit").model
    assert model.num_tiles == 1 and model.num_layers >= 4
    columns = model.phase_cols
    none = np.zeros(model.num_columns, bool)
    held = phases._held_through_backward(model, columns, phases._Entries.of(model))
    views = [phases._masked(model, none)]
    for kind, kinds in phases._PHASES_OF.items():
        mask = np.logical_or.reduce([columns[p] for p in kinds]) if kinds else none
        view = held if kind in phases._SPLIT_KINDS and held is not None else model
        views.append(phases._masked(view, mask))
    for view in views:
        sweep = price_all_ranges(view, (1, 2))
        band = price_one_tile_ranges(view, (1, 2), None)
        for k in (1, 2):
            assert np.array_equal(sweep.dense_bytes(k), band.dense_bytes(k)), k
    assert len(swept) == len(views)                   # each through the one-tile path
    L = model.num_layers
    assert price_all_ranges(model, (1,)).bytes_of(1, 0, L - 1) == model.stage_memory(0, L - 1).worst_bytes(1)


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), groups=st.integers(1, 6), cells=st.integers(1, 16), rows=st.integers(1, 9),
       cols=st.integers(1, 9), columns=st.integers(1, 5))
def test_grid_peak_on_the_cells_rows_and_columns_equals_the_full_grid(seed, groups, cells, rows, cols, columns):
    """The one-tile sweep's peak of a layer's columns (``_grid_peak``: the grid only on the cells'
    own rows and columns, spread to the rest) equals the full grid's maximum over the columns
    (``_grid_values``), cells beyond the extent, negative signs and columns with nothing live included."""
    from stagesplit.model.pricing import _Cells, _grid_peak, _grid_values
    rng = np.random.default_rng(seed)
    made = _Cells.of(rng.integers(0, groups, cells), rng.choice([-1, 1], cells).astype(np.int64),
                     rng.integers(0, rows, cells), rng.integers(0, cols + 3, cells))
    state = rng.integers(-50, 100, (groups, columns)) * (rng.random((groups, columns)) < 0.8)
    want = _grid_values(made, state, rows, cols).max(axis=2)
    got = _grid_peak(made, state, rows, cols)
    assert got.shape == (rows, cols) and np.array_equal(got, want)
