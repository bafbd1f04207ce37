"""The pure helpers of plan/search.py and plan/explain.py on tiny hand-made range tables:
``fewest_stages_that_fit`` (against hand-worked first-fit runs and a brute force over every split)
and ``explain_infeasible`` (each of its messages; the rule that binds, on priced models). The DP's
time budget is tested in test_search.py."""

import itertools
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, strategies as st

from helpers import UNIT, layer_model, options
from stagesplit.model.costmodel import RangeTable
from stagesplit.plan.explain import explain_infeasible
from stagesplit.plan.search import fewest_stages_that_fit
from stagesplit.solver.problem import SolveOptions, build_problem, in_flight


def range_table(weights, stash=None, in_flights=(1,), tiles=None) -> RangeTable:
    """Range ``a..b`` needs sum(weights[a..b]) + (k - 1) x sum(stash[a..b]) bytes with k
    micro-batches in flight; its worst tile is ``tiles[a]`` (0 by default)."""
    L = len(weights)
    stash = stash or [0] * L
    w, s = np.cumsum([0, *weights]), np.cumsum([0, *stash])
    worst = np.zeros((len(in_flights), L, L), np.int64)
    tile = np.zeros((len(in_flights), L, L), np.int64)
    for i, k in enumerate(in_flights):
        for a in range(L):
            for b in range(a, L):
                worst[i, a, b] = w[b + 1] - w[a] + (k - 1) * (s[b + 1] - s[a])
                tile[i, a, b] = tiles[a] if tiles else 0
    return RangeTable.dense(tuple(in_flights), worst, tile)


def opts(schedule="none", micro_batches=1, **kw) -> SolveOptions:
    return SolveOptions(devices=kw.pop("devices", 1), schedule=schedule, micro_batches=micro_batches, **kw)


# -- fewest_devices ----------------------------------------------------------------------------------

WEIGHTS = [4, 3, 5, 2]


@pytest.mark.parametrize("capacity, expected", [
    ([14], 1),          # everything on one device
    ([13], 2),
    ([7], 2),           # [4 3 | 5 2]: 7 and 7
    ([6], 4),           # 4+3 > 6, 3+5 > 6, 5+2 > 6: one layer each
    ([5], 4),
    ([4], None),        # layer 2 (5 bytes) fits nowhere
    ([12, 5], 2),       # [4 3 5 | 2]: the first device takes all it can
    ([5, 12], 2),       # [4 | 3 5 2]
    ([3, 100], None),   # layer 0 must go on the first device (positions in order), which cannot hold it
])
def test_fewest_devices_first_fit(capacity, expected):
    assert fewest_stages_that_fit(range_table(WEIGHTS), np.array(capacity), opts()) == expected


def test_fewest_devices_limit():
    table = range_table(WEIGHTS)
    assert fewest_stages_that_fit(table, np.array([6]), opts(), limit=4) == 4
    assert fewest_stages_that_fit(table, np.array([6]), opts(), limit=3) is None
    assert fewest_stages_that_fit(table, np.array([7]), opts(), limit=1) is None


def test_fewest_devices_1f1b_holds_more_on_the_first_stages():
    # one stashed byte per layer and micro-batch; 1F1B with 2 micro-batches: stage s of P holds
    # min(2, P - s). Capacity 8:
    #   P=1: k=1           4, 4+3=7, 7+5 > 8           stops at layer 2
    #   P=2: k=2, 1        5, 7+2 > 8 | 3, 8, 10 > 8   stops at layer 3
    #   P=3: k=2, 2, 1     5 | 4, 8+2 > 8 | 5, 7       fits
    table = range_table(WEIGHTS, stash=[1, 1, 1, 1], in_flights=(1, 2))
    assert fewest_stages_that_fit(table, np.array([8]), opts("1f1b", 2)) == 3
    # with no schedule one micro-batch is in flight everywhere: [4 3 | 5 2]
    assert fewest_stages_that_fit(table, np.array([8]), opts()) == 2
    # GPipe holds both micro-batches on every stage: 5 | 4 | 6 | 3
    gpipe = range_table(WEIGHTS, stash=[1, 1, 1, 1], in_flights=(2,))
    assert fewest_stages_that_fit(gpipe, np.array([8]), opts("gpipe", 2)) == 4
    assert fewest_stages_that_fit(gpipe, np.array([5]), opts("gpipe", 2)) is None


def test_fewest_devices_stops_where_the_table_lacks_an_in_flight_count():
    # only k=1 priced: one stage works, any 1F1B pipeline of 2+ stages cannot be judged
    table = range_table(WEIGHTS, stash=[1, 1, 1, 1], in_flights=(1,))
    assert fewest_stages_that_fit(table, np.array([100]), opts("1f1b", 2)) == 1
    assert fewest_stages_that_fit(table, np.array([8]), opts("1f1b", 2)) is None


def brute_force_fewest(table, capacity, schedule, micro_batches):
    """The fewest stages of any split (every one tried) whose stage s fits position s's capacity."""
    L = table.worst_bytes.shape[1]
    for stages in range(1, L + 1):
        for cuts in itertools.combinations(range(1, L), stages - 1):
            bounds = [0, *cuts, L]
            if all(table.worst_bytes[table.k_index(in_flight(schedule, micro_batches, s, stages)),
                                     bounds[s], bounds[s + 1] - 1] <= capacity[s % len(capacity)]
                   for s in range(stages)):
                return stages
    return None


@given(weights=st.lists(st.integers(1, 9), min_size=1, max_size=7), data=st.data())
def test_fewest_devices_matches_brute_force(weights, data):
    L = len(weights)
    stash = data.draw(st.lists(st.integers(0, 4), min_size=L, max_size=L))
    schedule = data.draw(st.sampled_from(["none", "1f1b", "gpipe"]))
    micro = data.draw(st.integers(1, 4))
    ks = sorted({1, *range(1, micro + 1)}) if schedule == "1f1b" else sorted({1, micro})
    capacity = data.draw(st.lists(st.integers(1, 30), min_size=1, max_size=3))   # a repeating pattern of devices
    table = range_table(weights, stash, tuple(ks))
    assert fewest_stages_that_fit(table, np.array(capacity), opts(schedule, micro)) == \
        brute_force_fewest(table, capacity, schedule, micro)


def test_fewest_devices_on_mixed_devices():
    """First fit is not optimal on mixed devices: taking all it can on a large device can leave
    a layer in front of a small one that cannot hold it (fewest_stages_that_fit tracks every prefix)."""
    # capacities 2, 1, 2, 1, ...: [1 | 1 | 1 | 1 | 2] fits on 5; first fit takes [1 1 | 1 | 1] and then
    # finds the last layer (2) in front of a device of 1, for any number of devices
    table = range_table([1, 1, 1, 1, 2])
    assert brute_force_fewest(table, [2, 1], "none", 1) == 5
    assert fewest_stages_that_fit(table, np.array([2, 1]), opts()) == 5


# -- explain_infeasible ------------------------------------------------------------------------------

def explain(table, names, capacity, **kw):
    model = SimpleNamespace(layers=SimpleNamespace(names=names))
    o = opts(devices=kw.pop("devices"), **kw)
    problem = SimpleNamespace(capacity=np.array(capacity), devices=o.devices, options=o)
    return explain_infeasible(model, problem, table)


def test_explain_a_layer_too_big_names_the_biggest_and_its_tile():
    table = range_table([2, 9, 7], tiles=[0, 3, 1])
    assert explain(table, ["a", "b", "c"], [5, 5], devices=2) == (
        "layer 'b' alone needs 9 bytes on tile 3, more than a device holds (5 bytes per tile after headroom), "
        "so no number of devices fits; split that layer (a finer `layer_regex`) or free memory on that tile")


def test_explain_a_layer_too_big_for_every_device_of_a_mixed_set():
    # 7,000 fits the larger device (8,000), so only layer 'b' (9,000) is named, with the larger capacity
    table = range_table([2000, 9000, 7000], tiles=[0, 3, 1])
    message = explain(table, ["a", "b", "c"], [5000, 8000], devices=2)
    assert message.startswith("layer 'b' alone needs 9,000 bytes on tile 3, more than a device holds "
                              "(8,000 bytes per tile after headroom)")


def test_explain_more_devices_needed():
    table = range_table([3, 3, 3, 3])
    # 6 per device: [3 3 | 3 3] needs two
    assert explain(table, list("abcd"), [6], devices=1) == \
        "no split of the 4 layers fits on 1 device(s); the smallest number that fits is 2"
    assert explain(table, list("abcd"), [6], devices=1, max_layers=4) == \
        ("no split of the 4 layers fits on 1 device(s); the smallest number that fits is 2 "
         "(ignoring the layer-count limits)")
    # 5 per device: one layer each; the caveat names only the rules given
    assert explain(table, list("abcd"), [5, 5, 5], devices=3, pinned_splits=(2,)).endswith(
        "the smallest number that fits is 4 (ignoring the pinned splits)")
    assert explain(table, list("abcd"), [5, 5, 5], devices=3, exact=True, min_layers=1, max_layers=2).endswith(
        "the smallest number that fits is 4 (ignoring the exact device count and the layer-count limits)")


def test_explain_names_the_rule_that_binds():
    # 3 x 1000 bytes per layer, 6000 per device: two devices would do
    model = layer_model([3, 3, 3, 3], [1, 1, 1, 1])

    def why(devices, **kw):
        problem = build_problem(model, options(devices, 6, **kw))
        return explain_infeasible(model, problem, problem.table)
    # at most one layer per stage needs four devices
    assert why(2, max_layers=1) == "no split fits on 2 device(s) with at most 1 layer per stage; without it 2 " \
        "device(s) would do"
    # layer 0 pinned to device 1 and layer 3 to device 0: the order forbids it, whatever the memory
    assert why(2, pinned_layers=((0, 1), (3, 0))) == \
        "no split fits on 2 device(s) with the layers pinned to devices; without it 2 device(s) would do"
    # exactly four devices with at least two layers each is impossible; either rule alone is fine
    assert why(4, exact=True, min_layers=2) == (
        "no split fits on exactly 4 device(s) with at least 2 layers per stage; it would fit without the exact "
        "device count or the minimum of 2 layers per stage, and without all of them 2 device(s) would do")
    # two rules that each forbid every split: dropping one leaves the other
    assert why(2, pinned_layers=((0, 1), (3, 0)), max_layers=1) == (
        "no split fits on 2 device(s) with the layers pinned to devices and at most 1 layer per stage; dropping any "
        "one of these rules alone is not enough, and without all of them 2 device(s) would do")


def test_explain_the_reproducer_without_pins(tmp_path):
    """issue 18: --devices 4 --exact --schedule 1f1b --micro-batches 8 gave no pins and no limits; the
    exact device count binds (the first of 4 stages holds 4 micro-batches), 3 devices would do."""
    from helpers import ROOT
    from stagesplit import api
    plan = api.solve(ROOT / "tests/data/reproducers/infeasible-no-pins.json", 4, exact=True, schedule="1f1b",
                     micro_batches=8)
    assert plan.status == "infeasible"
    assert plan.message == ("no split fits on exactly 4 device(s); on at most 4, 3 would do (with 1F1B, the first "
                            "of P stages holds min(8, P) micro-batches in flight, so more stages need more memory on "
                            "the first ones)")
    assert api.solve(ROOT / "tests/data/reproducers/infeasible-no-pins.json", 4, schedule="1f1b",
                     micro_batches=8).devices == 4


def test_explain_nothing_fits_with_stashed_micro_batches():
    # each layer fits alone with one micro-batch (5, 4 <= 6), both together do not (9), and the
    # first stage of any 1F1B pipeline of 2+ stages holds 2 micro-batches of layer 0 (8 > 6)
    table = range_table([5, 4], stash=[3, 3], in_flights=(1, 2))
    assert explain(table, ["x", "y"], [6, 6, 6], devices=3, schedule="1f1b", micro_batches=2) == \
        "no split of the 2 layers fits on 3 device(s), nor on any number of such devices"


def test_explain_on_a_priced_model():
    # a per-layer model in inference with no activations: a stage needs exactly its weights
    model = layer_model([2, 9, 3], [1, 1, 1])
    o = options(2, 5)
    table = model.price_ranges((1,))
    problem = build_problem(model, o, table=table)
    assert explain_infeasible(model, problem, table) == (
        f"layer 'l1' alone needs {9 * UNIT:,} bytes on tile 0, more than a device holds ({5 * UNIT:,} bytes per "
        "tile after headroom), so no number of devices fits; split that layer (a finer `layer_regex`) or free "
        "memory on that tile")
    model = layer_model([3, 3, 3, 3], [1, 1, 1, 1])
    problem = build_problem(model, options(1, 7), table=model.price_ranges((1,)))
    assert explain_infeasible(model, problem, model.price_ranges((1,))) == \
        "no split of the 4 layers fits on 1 device(s); the smallest number that fits is 2"
