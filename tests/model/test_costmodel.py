"""The stage memory model: hand-computed expectations on tiny profiles, the incremental pricing
against the from-scratch computation, and the model's monotonicity and subadditivity."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from helpers import random_block_profile, random_profile, tiny_profile
from stagesplit.io.builder import ProfileBuilder
from stagesplit.io.layerform import LayerSpec, build_layer_profile
from stagesplit.io.profile import Target
from stagesplit.io.targets import load_target
from stagesplit.layers import group_layers
from stagesplit.model.costmodel import StageCostModel
from stagesplit.reporting.breakdown import operation_costs
from stagesplit.reporting.diagnosis import live_bytes_by_step


def model(profile, shared="every"):
    return StageCostModel(profile, group_layers(profile), shared=shared)


class TestTinyProfile:
    """Expectations derived by hand in tests/helpers.py:tiny_profile's docstring."""

    def test_layers(self):
        m = model(tiny_profile())
        assert m.layers.names == ["0", "1"]
        assert m.layers.op_layer.tolist() == [0, 0, 1, -1]

    def test_first_layer_every_category(self):
        sm = model(tiny_profile()).stage_memory(0, 0)
        # steps {0,1,2} + shared step 5; tile 0: a(30) at 0..2, b(40) from 2 -> 70 at step 2
        assert sm.not_always_live.tolist() == [70, 5]
        assert sm.peak_step.tolist() == [2, 5]
        assert sm.always_live.tolist() == [110, 0]          # w0 + the shared buffer
        assert sm.vertex_code.tolist() == [80, 60]          # MatMul 60 + Add 20 | MatMul 60
        assert sm.vertex_state.tolist() == [12, 8]
        assert sm.exchange_code.tolist() == [12, 0]
        assert sm.control_code.tolist() == [6, 2]           # p0's 4 + shared p3's 2 | p3's 2
        assert sm.total().tolist() == [290, 75]
        assert sm.worst_tile() == 0 and sm.worst_bytes() == 290

    def test_second_layer(self):
        sm = model(tiny_profile()).stage_memory(1, 1)
        # steps {3,4} + 5: tile 0 holds b (40) at 3..4; tile 1 c (20) at 3, counter (5) at 5
        assert sm.not_always_live.tolist() == [40, 20]
        assert sm.peak_step.tolist() == [3, 3]
        assert sm.always_live.tolist() == [10, 50]
        assert sm.vertex_code.tolist() == [60, 60]
        assert sm.vertex_state.tolist() == [0, 16]
        assert sm.exchange_code.tolist() == [0, 6]
        assert sm.control_code.tolist() == [2, 5]
        assert sm.total().tolist() == [112, 157]

    def test_whole_range_shares_code_and_counts_shared_variables_once(self):
        sm = model(tiny_profile()).stage_memory(0, 1)
        assert sm.not_always_live.tolist() == [70, 20]
        assert sm.always_live.tolist() == [110, 50]
        # MatMul code is used by both layers' programs but counted once per tile
        assert sm.vertex_code.tolist() == [80, 60]
        assert sm.vertex_state.tolist() == [12, 24]
        assert sm.exchange_code.tolist() == [12, 6]
        assert sm.control_code.tolist() == [6, 5]
        assert sm.total().tolist() == [290, 165]

    def test_shared_none_drops_items_without_a_layer(self):
        sm = model(tiny_profile(), shared="none").stage_memory(0, 0)
        assert sm.always_live.tolist() == [100, 0]
        assert sm.not_always_live.tolist() == [70, 0]
        assert sm.control_code.tolist() == [4, 0]
        assert sm.total().tolist() == [278, 68]

    def test_shared_memory_alone(self):
        sm = model(tiny_profile()).shared_memory()
        assert sm.always_live.tolist() == [10, 0]
        assert sm.not_always_live.tolist() == [0, 5]
        assert sm.control_code.tolist() == [2, 2]

    def test_price_ranges_matches_hand_values(self):
        m = model(tiny_profile())
        table = m.price_ranges()
        assert table.worst_bytes[0, 0, 0] == 290
        assert table.worst_bytes[0, 1, 1] == 157
        assert table.worst_tile[0, 1, 1] == 1
        assert table.worst_bytes[0, 0, 1] == 290
        assert table.compute[0, 0] == 110.0 and table.compute[1, 1] == 200.0 and table.compute[0, 1] == 310.0
        assert m.shared_compute == 7.0

    def test_live_bytes_by_step(self):
        by_step, in_stage = live_bytes_by_step(model(tiny_profile()), 0, 0, tile=0)
        assert by_step.tolist() == [30, 30, 70, 40, 40, 0]
        assert in_stage.tolist() == [True, True, True, False, False, True]

    def test_operation_costs(self):
        costs = operation_costs(model(tiny_profile()))
        # op A on its steps 0..1: w0 100 + a 30; op B at step 2: a + b = 70; op C at 3..4: w1 50, b 40, c 20
        assert costs.always_live.tolist() == [100, 0, 50, 0]
        assert costs.not_always_live.tolist() == [30, 70, 40 + 20, 5]
        assert costs.vertex_code.tolist() == [120, 20, 120, 0]
        assert costs.compute.tolist() == [100.0, 10.0, 200.0, 7.0]


class TestLayerFormTraining:
    """Three layers through the per-layer form; expectations worked out in io/layerform.py terms."""

    def profile(self):
        layers = [LayerSpec("l0", weights=1000, activations=100, workspace=10, output=5, compute=1),
                  LayerSpec("l1", weights=2000, activations=200, workspace=20, output=6, compute=2),
                  LayerSpec("l2", weights=3000, activations=300, workspace=30, output=7, compute=3)]
        return build_layer_profile(layers, load_target("a100-80gb"))

    def test_single_layers(self):
        m = model(self.profile())
        assert m.stage_memory(0, 0).total().tolist() == [1115]
        assert m.stage_memory(2, 2).total().tolist() == [3343]   # 3000 + a2 300 + s2 30 + o1 6 + o2 7

    def test_two_layers_peak_at_second_forward_step(self):
        sm = model(self.profile()).stage_memory(0, 1)
        assert sm.total().tolist() == [3331]           # 3000 + a0 100 + a1 200 + s1 20 + o0 5 + o1 6
        assert sm.peak_step.tolist() == [1]

    def test_stashed_activations_and_in_flight_copies(self):
        m = model(self.profile())
        sm = m.stage_memory(0, 1)
        assert sm.stash.tolist() == [300]              # a0 + a1; the last layer's activation is not stashed
        assert m.stage_memory(2, 2).stash.tolist() == [0]
        assert sm.total(in_flight=3).tolist() == [3331 + 2 * 300]
        table = m.price_ranges(in_flight=(1, 3))
        assert table.worst_bytes[1, 0, 1] == 3931

    def test_whole_model(self):
        assert model(self.profile()).stage_memory(0, 2).total().tolist() == [6643]


def test_stage_can_exceed_its_layers_sum_when_layers_interleave():
    """The model is not subadditive for arbitrary step orders, and physically so: here layer 1
    holds P1 (for layer 3) and P2 (from layer 0) while layer 2 runs, which neither layer 1 nor
    layer 2 alone ever has to."""
    b = ProfileBuilder(Target("t", 1, 10**6), 8)
    p1 = b.variable(100, 0, [(0, 6)])
    p2 = b.variable(100, 0, [(2, 8)])
    b.operation("layer0/write_p1", 0, 0, vars=[p1])
    b.operation("layer1/read_p1", 1, 1, vars=[p1])
    b.operation("layer0/write_p2", 2, 2, vars=[p2])
    b.operation("layer2/other", 4, 4)
    b.operation("layer3/read_p1", 5, 5, vars=[p1])
    b.operation("layer1/read_p2", 7, 7, vars=[p2])
    m = model(b.build())
    singles = m.stage_memory(1, 1).worst_bytes() + m.stage_memory(2, 2).worst_bytes()
    assert m.stage_memory(1, 2).worst_bytes() == 200 > singles == 100


def test_operations_with_unknown_steps_span_their_variables():
    b = ProfileBuilder(Target("t", 1, 10**6), 4)
    x = b.variable(10, 0, [(1, 3)])
    b.operation("layer0/a", vars=[x])          # steps unknown
    sm = model(b.build()).stage_memory(0, 0)
    assert sm.not_always_live.tolist() == [10]


@pytest.mark.slow
def test_samples_incremental_equals_scratch(sample_analysis):
    m = sample_analysis.model
    L = m.num_layers
    table = m.price_ranges(in_flight=(1, 4))
    for a in range(L):
        for b in range(a, L):
            sm = m.stage_memory(a, b)
            assert table.worst_bytes[0, a, b] == sm.worst_bytes()
            assert table.worst_bytes[1, a, b] == sm.worst_bytes(4)


def _check_incremental(profile, shared):
    m = model(profile, shared)
    table = m.price_ranges(in_flight=(1, 2, 5))
    for a in range(m.num_layers):
        for b in range(a, m.num_layers):
            sm = m.stage_memory(a, b)
            for k, inflight in enumerate(table.in_flight):
                assert table.worst_bytes[k, a, b] == sm.worst_bytes(inflight)
                assert sm.total(inflight)[table.worst_tile[k, a, b]] == table.worst_bytes[k, a, b]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), layers=st.integers(1, 5), shared=st.sampled_from(["every", "none"]))
def test_property_incremental_pricing_equals_scratch(seed, layers, shared):
    _check_incremental(random_profile(np.random.default_rng(seed), layers=layers), shared)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), layers=st.integers(1, 9), tiles=st.integers(1, 4),
       shared=st.sampled_from(["every", "none"]), block=st.booleans())
def test_property_sweep_pricing_equals_scratch_in_tile_blocks(seed, layers, tiles, shared, block):
    """The one-sweep pricing (pricing.py) against the from-scratch stage price, with up to 9
    layers in any order (items shared by far-apart layers), and with the tiles priced one
    block at a time (a memory budget of 1 byte forces blocks of one tile): the same bytes and
    the same worst tile (the lowest-numbered among equals, as np.argmax picks)."""
    from stagesplit.model.pricing import price_all_ranges
    m = model(random_profile(np.random.default_rng(seed), layers=layers, tiles=tiles, max_vars=24), shared)
    table = price_all_ranges(m, (1, 3), memory_budget=1 if block else 2**30)
    for a in range(m.num_layers):
        for b in range(a, m.num_layers):
            sm = m.stage_memory(a, b)
            for k, inflight in enumerate(table.in_flight):
                total = sm.total(inflight)
                assert table.worst_bytes[k, a, b] == total.max()
                assert table.worst_tile[k, a, b] == int(np.argmax(total))
            assert table.compute[a, b] == pytest.approx(m.range_compute(a, b))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), layers=st.integers(1, 5))
def test_property_adding_a_layer_never_shrinks_a_stage(seed, layers):
    m = model(random_profile(np.random.default_rng(seed), layers=layers))
    L = m.num_layers
    totals = {(a, b): m.stage_memory(a, b).total() for a in range(L) for b in range(a, L)}
    for (a, b), total in totals.items():
        if b + 1 < L:
            assert np.all(totals[(a, b + 1)] >= total)
        if a > 0:
            assert np.all(totals[(a - 1, b)] >= total)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), layers=st.integers(2, 5), training=st.booleans(),
       shared=st.sampled_from(["every", "none"]))
def test_property_stage_never_exceeds_sum_of_its_layers(seed, layers, training, shared):
    """Per tile, for profiles laid out in layer blocks (see helpers.random_block_profile)."""
    m = model(random_block_profile(np.random.default_rng(seed), layers=layers, training=training), shared)
    L = m.num_layers
    singles = [m.stage_memory(l, l).total() for l in range(L)]
    for a in range(L):
        for b in range(a, L):
            assert np.all(m.stage_memory(a, b).total() <= sum(singles[a:b + 1]))


def test_big_byte_counts_do_not_overflow():
    b = ProfileBuilder(load_target("h100-80gb"), 2)
    x = b.variable(3 * 2**31, 0, [(0, 2)])
    y = b.variable(2**33, 0, [(1, 2)])
    b.operation("layer0/a", 0, 1, vars=[x, y])
    m = model(b.build())
    assert m.price_ranges().worst_bytes[0, 0, 0] == 3 * 2**31 + 2**33 == m.stage_memory(0, 0).worst_bytes()


def test_range_outside_layers_is_rejected():
    with pytest.raises(IndexError):
        model(tiny_profile()).stage_memory(1, 2)


def test_sweep_pricing_on_a_compact_sample_with_narrow_arrays():
    """The compact reader keeps per-program code arrays as stored (int8/int16 here), so every
    index computation on them must widen first: an int8 vertex type times the number of
    program groups once wrapped around. Every third range of the bert-base sample, both ways."""
    from helpers import sample_path
    from stagesplit.io import load_profile
    from stagesplit.model.pricing import price_all_ranges
    profile = load_profile(sample_path("bert-base"))
    assert profile.programs.vertex_code.vertex_type.dtype.itemsize == 1       # the case that wrapped
    m = model(profile)
    table = price_all_ranges(m, (1, 3))
    for a in range(m.num_layers):
        for b in range(a, m.num_layers, 3):
            sm = m.stage_memory(a, b)
            assert table.worst_bytes[0, a, b] == sm.worst_bytes()
            assert table.worst_bytes[1, a, b] == sm.worst_bytes(3)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), layers=st.integers(1, 7), tiles=st.integers(1, 3),
       shared=st.sampled_from(["every", "none"]))
def test_property_sweep_pricing_with_layers_running_together(seed, layers, tiles, shared):
    """Operations of several layers (and of none) running in the same steps, so that columns
    belong to several layers at once and runs of one layer's columns interleave with others':
    the sweep's per-layer runs and its shift-only updates against the from-scratch price."""
    from helpers import _random_vars_and_programs
    from stagesplit.model.pricing import price_all_ranges
    rng = np.random.default_rng(seed)
    steps = int(rng.integers(3, 12))
    ops = []
    for _ in range(int(rng.integers(layers, 3 * layers + 2))):
        first = int(rng.integers(0, steps))
        last = int(rng.integers(first, min(steps, first + 4)))
        ops.append((int(rng.integers(-1, layers)), first, last))
    ops += [(layer, int(rng.integers(0, steps)), -1) for layer in range(layers)]   # every layer present
    ops = [(layer, first, last if last >= first else first) for layer, first, last in ops]
    m = model(_random_vars_and_programs(rng, ops, steps, tiles, 20), shared)
    table = price_all_ranges(m, (1, 2))
    for a in range(m.num_layers):
        for b in range(a, m.num_layers):
            sm = m.stage_memory(a, b)
            for k, inflight in enumerate(table.in_flight):
                assert table.worst_bytes[k, a, b] == sm.worst_bytes(inflight)


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2), st.integers(0, 2**40)), max_size=40),
       st.integers(1, 7))
@settings(max_examples=60, deadline=None)
def test_vertex_code_sizes_are_the_largest_reported(entries, chunk):
    from stagesplit.io.profile import VertexCode
    from stagesplit.model.costmodel import _vertex_code_sizes
    tile, vtype, size = (np.array([e[i] for e in entries], np.int64) for i in range(3))
    vc = VertexCode(np.zeros(len(entries), np.int64), tile.astype(np.int16), vtype.astype(np.int8), size)
    expected = np.zeros((4, 3), np.int64)
    for t, k, s in entries:
        expected[t, k] = max(expected[t, k], s)
    assert _vertex_code_sizes(vc, 4, 3, chunk=chunk).tolist() == expected.tolist()


@given(st.lists(st.sets(st.integers(0, 11)), max_size=8))
@settings(max_examples=150, deadline=None)
def test_interval_atoms_count_one_exactly_for_the_ranges_a_set_meets(sets):
    """LayerSets.atoms: for every range a..b, the signed count of a set's atoms with a <= lo and
    hi <= b is 1 when the set holds a layer of a..b, else 0 (runs of consecutive layers give one
    atom each, gaps between runs one negative atom)."""
    from stagesplit.model.pricing import LayerSets
    layer_sets = LayerSets.of([np.array(sorted(s), np.int64) for s in sets])
    s_of, lo, hi, sign = layer_sets.atoms()
    for a in range(12):
        for b in range(a, 12):
            counted = np.bincount(s_of[(a <= lo) & (hi <= b)], weights=sign[(a <= lo) & (hi <= b)],
                                  minlength=len(sets))
            assert counted.tolist() == [float(any(a <= x <= b for x in s)) for s in sets], (a, b)
    runs = sum(sum(1 for x in s if x - 1 not in s) for s in sets)
    assert int((sign > 0).sum()) == runs and int((sign < 0).sum()) == runs - sum(1 for s in sets if s)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), layers=st.integers(1, 7), shared=st.sampled_from(["every", "none"]))
def test_groups_by_owner_are_the_groups_live_in_each_layers_columns(seed, layers, shared):
    """Against a plain loop over the interval rows: group g is listed for layer m exactly when
    one of g's rows is live in a column where m runs."""
    from stagesplit.model.pricing import _groups_by_owner
    m = model(random_profile(np.random.default_rng(seed), layers=layers, max_vars=24), shared)
    tl = m.timeline
    groups = m.var_items.group[tl.row_var]
    num_groups = int(groups.max(initial=-1)) + 2
    found = _groups_by_owner(m, groups, num_groups)
    for layer in range(m.num_layers):
        expected = sorted({int(g) for g, s, e in zip(groups, tl.row_col_start, tl.row_col_end)
                           if g >= 0 and tl.cover[layer, s:e].any()})
        assert found[layer].tolist() == expected
