"""Memory affinity and inter-layer communication, worked out by hand on small profiles."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from helpers import load_sample, random_block_profile, tiny_profile
from stagesplit.io.builder import ProfileBuilder
from stagesplit.io.profile import Target
from stagesplit.layers import group_layers
from stagesplit.model.costmodel import StageCostModel
from stagesplit.model.traffic import layer_traffic


def traffic(profile, shared="every"):
    m = StageCostModel(profile, group_layers(profile), shared=shared)
    return m, layer_traffic(m)


class TestTiny:
    """tiny_profile: layer 0 uses w0 (100, always), a (30), b (40); layer 1 uses w1 (50, always),
    b and c (20). b goes live at step 2 where layer 0's op B runs, and is read by layer 1."""

    def test_affinity(self):
        _, t = traffic(tiny_profile())
        assert t.affinity.tolist() == [[100 + 30 + 40, 40], [40, 50 + 40 + 20]]

    def test_communication_and_cuts(self):
        _, t = traffic(tiny_profile())
        assert t.communication.tolist() == [[0, 40], [0, 0]]
        assert t.cut_bytes.tolist() == [0, 40, 0]
        assert t.var_index.tolist() == [3]              # b is the only variable two layers share
        assert t.var_producer.tolist() == [0]
        assert (t.var_min_layer.tolist(), t.var_max_layer.tolist()) == ([0], [1])
        assert t.var_bytes.tolist() == [40]

    def test_stage_io(self):
        _, t = traffic(tiny_profile())
        assert t.stage_io(0, 0) == (0, 40)
        assert t.stage_io(1, 1) == (40, 0)
        assert t.stage_io(0, 1) == (0, 0)

    def test_shared_items_do_not_count(self):
        _, every = traffic(tiny_profile(), "every")
        _, none = traffic(tiny_profile(), "none")
        assert every.affinity.tolist() == none.affinity.tolist()
        assert every.cut_bytes.tolist() == none.cut_bytes.tolist()


def three_layers():
    """Forward layers 0, 1, 2 at steps 0..2, backward 2, 1, 0 at steps 3..5 (one tile).

    x (100): written by layer 0 forward, read by layer 2 forward and layer 0 backward
    y (7):   written by layer 1 forward, read by layer 2 forward
    g (11):  a gradient written by layer 2 backward, read by layer 1 backward
    w (1000, always live): a weight tied between layers 0 and 2 (affinity, never communicated)
    z (3):   layer 1's own temporary
    """
    b = ProfileBuilder(Target("t", 1, 10**6), 6)
    x = b.variable(100, 0, [(0, 6)], name="x")
    y = b.variable(7, 0, [(1, 3)], name="y")
    g = b.variable(11, 0, [(3, 5)], name="g")
    w = b.variable(1000, 0, "always", name="w")
    z = b.variable(3, 0, [(1, 2)], name="z")
    b.operation("layer0/fwd", 0, 0, vars=[x, w])
    b.operation("layer1/fwd", 1, 1, vars=[y, z])
    b.operation("layer2/fwd", 2, 2, vars=[x, y, w])
    b.operation("layer2/bwd", 3, 3, vars=[g])
    b.operation("layer1/bwd", 4, 4, vars=[g])
    b.operation("layer0/bwd", 5, 5, vars=[x])
    return b.build()


class TestThreeLayers:
    def test_affinity(self):
        _, t = traffic(three_layers())
        assert t.affinity.tolist() == [[1100, 0, 1100],
                                       [0, 7 + 11 + 3, 18],
                                       [1100, 18, 1118]]

    def test_communication(self):
        _, t = traffic(three_layers())
        # x: 0 -> 2 (forward, skipping layer 1); y: 1 -> 2; g: 2 -> 1 (the gradient flows back)
        assert t.communication.tolist() == [[0, 0, 100], [0, 0, 7], [0, 11, 0]]

    def test_tensor_used_by_layers_0_and_2_crosses_both_cuts_once(self):
        _, t = traffic(three_layers())
        # before layer 1: x only; before layer 2: x, y and the gradient g
        assert t.cut_bytes.tolist() == [0, 100, 100 + 7 + 11, 0]

    @pytest.mark.parametrize("first, last, received, sent", [
        (0, 0, 0, 100),          # sends x
        # receives x (from stage 0) and g, sends y and x (relayed on to layer 2): 100 + 11 in,
        # 7 + 100 out; in total cut_bytes[1] + cut_bytes[2] = 100 + 118, what its time is charged
        (1, 1, 111, 107),
        (2, 2, 107, 11),         # receives x and y, sends g
        (0, 1, 11, 107),         # receives g, sends x and y
        (1, 2, 100, 0),          # receives x; y and g stay inside
        (0, 2, 0, 0),
    ])
    def test_stage_io(self, first, last, received, sent):
        _, t = traffic(three_layers())
        assert t.stage_io(first, last) == (received, sent)

    def test_relayed_bytes_match_the_time_charged(self):
        """Split [0 | 1 | 2] with the middle stage relaying x: its time counts both of its cuts."""
        import dataclasses

        from stagesplit.solver.problem import SolveOptions, build_problem
        profile = three_layers()
        m, t = traffic(dataclasses.replace(profile, target=dataclasses.replace(profile.target, clock_hz=1e9)))
        problem = build_problem(m, SolveOptions(devices=3, communication=True, link_bytes_per_s=1e9), traffic=t)
        assert problem.cut_units.tolist() == [0, 100, 118, 0]       # 1 ns per byte on a 1 GHz clock
        # the middle stage's time is its compute plus 100 + 118 transfer cycles
        assert problem.stage_time(1, 2) == round(m.range_compute(1, 1)) + 100 + 118
        received, sent = t.stage_io(1, 1)
        assert received + sent == 100 + 118 == int(t.cut_bytes[1] + t.cut_bytes[2])

    def test_producer_is_the_layer_running_when_the_variable_goes_live(self):
        _, t = traffic(three_layers())
        producers = dict(zip(t.var_index.tolist(), t.var_producer.tolist()))
        assert producers == {0: 0, 1: 1, 2: 2}          # x, y, g


def test_variable_with_unknown_producer_counts_from_its_first_layer():
    """A variable that goes live where none of its layers runs is charged to its first layer."""
    b = ProfileBuilder(Target("t", 1, 100), 4)
    v = b.variable(9, 0, [(0, 4)])
    b.operation("prologue", 0, 0)
    b.operation("layer1/a", 1, 1, vars=[v])
    b.operation("layer2/b", 2, 2, vars=[v])
    _, t = traffic(b.build())
    assert t.var_producer.tolist() == [0]
    assert t.communication.tolist() == [[0, 9], [0, 0]]
    assert t.cut_bytes.tolist() == [0, 9, 0]


def test_single_layer_profile_has_nothing_to_move():
    b = ProfileBuilder(Target("t", 2, 100), 2)
    v = b.variable(9, 1, [(0, 2)])
    b.operation("layer1/a", 0, 1, vars=[v])
    _, t = traffic(b.build())
    assert t.affinity.tolist() == [[9]]
    assert t.communication.tolist() == [[0]]
    assert t.cut_bytes.tolist() == [0, 0]
    assert t.stage_io(0, 0) == (0, 0)


def _brute_force(m):
    """Communication and cuts from first principles, variable by variable."""
    p = m.profile
    v = p.variables
    L = m.num_layers
    ops = p.operations
    comm = np.zeros((L, L), np.int64)
    cut = np.zeros(L + 1, np.int64)
    for i in range(len(v)):
        if v.always_live[i] or v.live_class[i] < 0:
            continue
        users = sorted({int(m.layers.op_layer[o]) for o in range(len(ops)) if i in ops.vars[o].tolist()
                        and m.layers.op_layer[o] >= 0})
        if len(users) < 2:
            continue
        start = int(p.liveness.intervals[v.live_class[i]][:, 0].min())
        running = [l for l in users
                   if any(ops.first_step[o] <= start <= ops.last_step[o] for o in range(len(ops))
                          if m.layers.op_layer[o] == l)]
        producer = running[0] if running else users[0]
        for l in users:
            if l != producer:
                comm[producer, l] += v.bytes[i]
        cut[users[0] + 1:users[-1] + 1] += v.bytes[i]
    return comm, cut


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), layers=st.integers(1, 5), training=st.booleans())
def test_property_matches_brute_force(seed, layers, training):
    m, t = traffic(random_block_profile(np.random.default_rng(seed), layers=layers, training=training))
    comm, cut = _brute_force(m)
    assert t.communication.tolist() == comm.tolist()
    assert t.cut_bytes.tolist() == cut.tolist()
    assert np.array_equal(t.affinity, t.affinity.T)
    # affinity: every grouped variable's bytes on each pair of the layers that use it, variable by variable
    affinity = np.zeros((layers, layers), np.int64)
    ops = m.profile.operations
    for i in np.flatnonzero(m.var_items.group >= 0):
        users = sorted({int(m.layers.op_layer[o]) for o in range(len(ops)) if i in ops.vars[o].tolist()
                        and m.layers.op_layer[o] >= 0})
        for a in users:
            for b in users:
                affinity[a, b] += int(m.profile.variables.bytes[i])
    assert t.affinity.tolist() == affinity.tolist()
    # a stage's received + sent bytes are exactly the bytes crossing its two cuts (what its
    # time is charged for), and what one stage sends across a cut its neighbour receives
    for first in range(layers):
        for last in range(first, layers):
            received, sent = t.stage_io(first, last)
            assert received + sent == int(cut[first] + cut[last + 1])
    for j in range(1, layers):
        _, left_sent = t.stage_io(0, j - 1)
        right_received, _ = t.stage_io(j, layers - 1)
        assert left_sent == right_received


@pytest.mark.parametrize("name, batch, seq, hidden", [("bert-base", 8, 128, 768), ("gpt", 2, 512, 1024)])
def test_sample_cuts_move_one_activation_each_way(name, batch, seq, hidden):
    """In a transformer training step a cut between blocks moves the block's output forward
    and the gradient of the next block's input back: batch x seq x hidden halves each way.
    Weights (the tied embedding included) are always live and never communicated."""
    m, t = traffic(load_sample(name))
    act = batch * seq * hidden * 2
    L = m.num_layers
    assert t.cut_bytes.tolist() == [0] + [2 * act] * (L - 1) + [0]
    expected = np.zeros((L, L), np.int64)
    expected[np.arange(L - 1), np.arange(1, L)] = act       # forward: layer j-1 -> j
    expected[np.arange(1, L), np.arange(L - 1)] = act       # backward: layer j -> j-1
    assert t.communication.tolist() == expected.tolist()
    assert t.stage_io(3, 5) == (2 * act, 2 * act)
