"""The per-step rules of docs/profile-format.md ("How a stage is priced from the full form"):
the steps an operation runs at, the stash rule and the compute of shared programs.

The issue-9 reproducers (tests/data/reproducers/) are checked against values worked out by hand
here; a from-scratch implementation of the documented rules, written below on plain Python sets
and sharing no code with stagesplit's cost model, is compared with it on random small profiles
(operations that overlap, operations with unknown steps, liveness written in pieces)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from stagesplit.io import load_profile
from stagesplit.io.builder import ProfileBuilder
from stagesplit.io.jsonprofile import read_json_profile
from stagesplit.io.profile import Target
from stagesplit.layers import group_layers
from stagesplit.model.costmodel import StageCostModel
from stagesplit.reporting.breakdown import operation_costs
from stagesplit.reporting.diagnosis import live_bytes_by_step

REPRODUCERS = Path(__file__).resolve().parents[1] / "data" / "reproducers"


def model_of(profile, shared="every"):
    return StageCostModel(profile, group_layers(profile), shared=shared)


def reproducer(name: str):
    return model_of(load_profile(REPRODUCERS / f"{name}.json"))


def reproducer_with(name: str, edit) -> StageCostModel:
    """The reproducer with its JSON document changed by ``edit`` (read from memory)."""
    doc = json.loads((REPRODUCERS / f"{name}.json").read_text())
    edit(doc)
    return model_of(read_json_profile(f"{name}-edited.json", json.dumps(doc).encode()))


# ------------------------------------------------------------------------------------------------
# Reproducers

class TestStashSplitInterval:
    """act0 (100 B) is live at steps 0..4; layer 0 runs at steps 0 and 4, layer 1 at step 2. It
    stays live from a layer-0 step (0) through a step where only layer 1 runs (2) to a later
    layer-0 step (4): stashed, however its liveness is written."""

    def test_two_touching_intervals_are_stashed(self):
        m = reproducer("stash-split-interval")
        assert m.layers.names == ["0", "1"]
        assert m.var_stashed.tolist() == [True]
        assert m.stage_memory(0, 0).stash.tolist() == [100]
        assert m.stage_memory(0, 1).stash.tolist() == [100]
        assert m.stage_memory(1, 1).stash.tolist() == [0]          # layer 1 does not use act0
        # layer 0 alone: act0 100 at its steps 0 and 4; with 3 micro-batches in flight 2 more copies
        assert m.stage_memory(0, 0).total(3).tolist() == [100 + 2 * 100]
        assert m.price_ranges(in_flight=(1, 3)).worst_bytes[1, 0, 0] == 300

    @pytest.mark.parametrize("live", [[[0, 5]], [[0, 1], [1, 2], [2, 3], [3, 4], [4, 5]], [[0, 2], [2, 5]]])
    def test_any_writing_of_the_same_steps_gives_the_same_answer(self, live):
        def edit(doc):
            doc["variables"][0]["live"] = live
        m = reproducer_with("stash-split-interval", edit)
        assert m.var_stashed.tolist() == [True]
        assert m.stage_memory(0, 0).total(3).tolist() == [300]
        assert m.price_ranges(in_flight=(1, 3)).worst_bytes[1, 0, 0] == 300


class TestStashOverlap:
    """x (100 B, live 0..2) is used by op0 (layer 0, steps 0..2); op1 (layer 1) runs at step 1
    (-a) or at steps 1..3 (-b). Layer 0 runs at every step x is live, so no step is a wait of
    layer 0: x is op0's working data, not stashed, in both files (which agree at steps 0..2)."""

    @pytest.mark.parametrize("name", ["stash-overlap-a", "stash-overlap-b"])
    def test_not_stashed(self, name):
        m = reproducer(name)
        assert m.var_stashed.tolist() == [False]
        for a, b in [(0, 0), (0, 1), (1, 1)]:
            assert m.stage_memory(a, b).stash.tolist() == [0]
        sm = m.stage_memory(0, 0)
        assert sm.total(4).tolist() == sm.total(1).tolist() == [100]

    def test_both_files_price_every_range_alike(self):
        a, b = reproducer("stash-overlap-a"), reproducer("stash-overlap-b")
        ta, tb = a.price_ranges(in_flight=(1, 2, 4)), b.price_ranges(in_flight=(1, 2, 4))
        assert np.array_equal(ta.worst_bytes, tb.worst_bytes)
        # layer 0: x 100; layer 1: nothing; both: 100
        assert ta.worst_bytes[2].tolist() == [[100, 100], [0, 0]]

    def test_a_real_wait_is_stashed(self):
        """Same as -a but op0 split into steps 0 and 2: at step 1 only layer 1 runs."""
        def edit(doc):
            doc["operations"][0]["last_step"] = 0
            doc["operations"].append({"name": "op0b", "layer": "0", "first_step": 2, "last_step": 2, "vars": [0]})
        m = reproducer_with("stash-overlap-a", edit)
        assert m.var_stashed.tolist() == [True]
        assert m.stage_memory(0, 0).total(4).tolist() == [400]


class TestSharedProgramCompute:
    """Program p (100 cycles) is run by a (layer 0) and b (layer 1), neither giving compute:
    each gets an equal share, 50; a stage with both layers 100."""

    def test_each_layer_gets_an_equal_share(self):
        m = reproducer("compute-shared-program")
        assert m.layer_compute.tolist() == [50.0, 50.0]
        assert m.shared_compute == 0.0
        t = m.price_ranges()
        assert t.compute[0, 0] == 50.0 and t.compute[1, 1] == 50.0 and t.compute[0, 1] == 100.0
        assert operation_costs(m).compute.tolist() == [50.0, 50.0]

    def test_independent_of_operation_order(self):
        def edit(doc):
            doc["operations"] = doc["operations"][::-1]
        assert reproducer_with("compute-shared-program", edit).layer_compute.tolist() == [50.0, 50.0]

    def test_three_users_and_an_explicit_figure(self):
        """p (100) run by a, b (layer 0) and c (layer 1): a and b get 100/3 each (layer 0:
        200/3), c 100/3; an operation's own compute replaces its shares (c gives 7)."""
        def edit(doc):
            doc["operations"][1]["name"] = "c"
            doc["operations"].insert(1, {"name": "b", "layer": "0", "first_step": 0, "last_step": 0,
                                         "programs": [0]})
        m = reproducer_with("compute-shared-program", edit)
        assert m.layer_compute == pytest.approx([200 / 3, 100 / 3])
        assert m.range_compute(0, 1) == pytest.approx(100.0)

        def edit_explicit(doc):
            edit(doc)
            doc["operations"][2]["compute"] = 7
        m = reproducer_with("compute-shared-program", edit_explicit)
        assert m.layer_compute == pytest.approx([200 / 3, 7.0])

    def test_program_listed_twice_by_one_operation_counts_once(self):
        def edit(doc):
            doc["operations"][0]["programs"] = [0, 0]
        assert reproducer_with("compute-shared-program", edit).layer_compute.tolist() == [50.0, 50.0]


class TestUnknownSteps:
    """u (layer 0) has unknown steps; its variables v1, v2 are live at steps 0 and 3, so it runs at
    steps 0 and 3 (not 0..3). Layer 0 (k at step 0, u) runs at {0, 3}; at step 0: q 50 + v1 10 =
    60 (r is live only at 1..2); at step 3: v2 10. Peak 60."""

    def test_runs_where_its_variables_are_live(self):
        m = reproducer("unknown-steps-hull")
        sm = m.stage_memory(0, 0)
        assert sm.not_always_live.tolist() == [60]
        assert sm.peak_step.tolist() == [0]
        by_step, in_stage = live_bytes_by_step(m, 0, 0, tile=0)
        assert in_stage.tolist() == [True, False, False, True, False]
        assert by_step.tolist() == [60, 150, 150, 10, 0]
        assert m.price_ranges().worst_bytes[0, 0, 0] == 60
        # u on its own steps: v1 at step 0 (10), v2 at step 3 (10): peak 10
        assert operation_costs(m).not_always_live.tolist() == [50, 10, 0]

    def test_whole_profile(self):
        m = reproducer("unknown-steps-hull")
        # steps {0, 3, 4}: step 0 has 60; r (never at a stage step) does not count
        assert m.stage_memory(0, 1).not_always_live.tolist() == [60]
        assert m.stage_memory(1, 1).not_always_live.tolist() == [0]

    def test_operation_without_not_always_live_data_runs_nowhere(self):
        def edit(doc):
            doc["variables"].append({"name": "w", "bytes": 1})            # always live
            doc["operations"].append({"name": "n", "layer": "1", "vars": [4], "compute": 1})
        m = reproducer_with("unknown-steps-hull", edit)
        assert m.timeline.cover[m.layers.names.index("1")].sum() == 1               # still only z's step
        assert m.stage_memory(1, 1).always_live.tolist() == [1]


# ------------------------------------------------------------------------------------------------
# An independent implementation of the documented rules

def random_spec(rng: np.random.Generator) -> dict:
    """Steps, layers, variables (liveness as a set of steps) and operations, some overlapping,
    some with unknown steps, some without a layer."""
    steps = int(rng.integers(3, 11))
    layers = int(rng.integers(1, 4))
    variables = []
    for _ in range(int(rng.integers(1, 7))):
        tile = int(rng.integers(0, 2))
        nbytes = int(rng.integers(1, 60))
        if rng.random() < 0.2:
            variables.append({"bytes": nbytes, "tile": tile, "live": None})
        else:
            live = {s for s in range(steps) if rng.random() < 0.55}
            variables.append({"bytes": nbytes, "tile": tile, "live": live})
    ops = []
    for i in range(int(rng.integers(1, 7))):
        layer = None if i and rng.random() < 0.15 else int(rng.integers(0, layers))   # one layer at least
        if rng.random() < 0.2:
            first = last = None
        else:
            first = int(rng.integers(0, steps))
            last = min(steps - 1, first + int(rng.integers(0, 3)))
        used = sorted({int(x) for x in rng.integers(0, len(variables), int(rng.integers(0, 3)))})
        ops.append({"layer": layer, "first": first, "last": last, "vars": used})
    return {"steps": steps, "variables": variables, "ops": ops}


def intervals(live: set[int], cuts: set[int]) -> list[tuple[int, int]]:
    """``live`` as half-open intervals, split at every step in ``cuts`` (touching pieces)."""
    out: list[list[int]] = []
    for s in sorted(live):
        if out and out[-1][1] == s and s not in cuts:
            out[-1][1] = s + 1
        else:
            out.append([s, s + 1])
    return [(a, b) for a, b in out]


def build(spec: dict, cuts: set[int]):
    b = ProfileBuilder(Target("rules", tiles=2, bytes_per_tile=10**6, clock_hz=1e9), spec["steps"])
    for v in spec["variables"]:
        b.variable(v["bytes"], v["tile"], "always" if v["live"] is None else intervals(v["live"], cuts))
    for i, op in enumerate(spec["ops"]):
        name = f"layer{op['layer']}/op{i}" if op["layer"] is not None else f"misc{i}"
        first = -1 if op["first"] is None else op["first"]
        last = -1 if op["last"] is None else op["last"]
        b.operation(name, first, last, vars=op["vars"])
    return b.build()


class Reference:
    """The rules of docs/profile-format.md, step by step on sets."""

    def __init__(self, spec: dict):
        self.spec = spec
        V = spec["variables"]
        self.live = [v["live"] for v in V]                   # None: always live

        def op_steps(op) -> set[int]:
            if op["first"] is not None:
                return set(range(op["first"], op["last"] + 1))
            return set().union(*[self.live[x] for x in op["vars"] if self.live[x] is not None])

        self.runs: dict[int, set[int]] = {}
        self.unlayered_steps: set[int] = set()
        self.var_layers: list[set[int]] = [set() for _ in V]
        for op in spec["ops"]:
            s = op_steps(op)
            if op["layer"] is None:
                self.unlayered_steps |= s
                continue
            self.runs.setdefault(op["layer"], set()).update(s)
            for x in op["vars"]:
                self.var_layers[x].add(op["layer"])

    def stashed_for(self, x: int, layer: int) -> bool:
        live = self.live[x]
        if live is None:
            return False
        own = self.runs[layer]
        others = set().union(*[r for l, r in self.runs.items() if l != layer])
        S = self.spec["steps"]
        for s1 in own:
            for s3 in own:
                if s3 <= s1 + 1 or not all(s in live for s in range(s1, s3 + 1)):
                    continue
                if any(s2 in others and s2 not in own for s2 in range(s1 + 1, s3)):
                    return True
        assert S > 0
        return False

    def stashed(self, x: int) -> bool:
        return any(self.stashed_for(x, l) for l in self.var_layers[x])

    def stage(self, layers: set[int], shared: str) -> dict[str, list[int]]:
        V = self.spec["variables"]
        every = shared == "every"
        held = [x for x in range(len(V)) if (self.var_layers[x] & layers) or (every and not self.var_layers[x])]
        steps = set().union(*[self.runs[l] for l in layers]) | (self.unlayered_steps if every else set())
        out = {"always_live": [0, 0], "not_always_live": [0, 0], "stash": [0, 0]}
        for x in held:
            if self.live[x] is None:
                out["always_live"][V[x]["tile"]] += V[x]["bytes"]
            if self.stashed(x):
                out["stash"][V[x]["tile"]] += V[x]["bytes"]
        for tile in (0, 1):
            at = [sum(V[x]["bytes"] for x in held if V[x]["tile"] == tile and self.live[x] is not None
                      and s in self.live[x]) for s in sorted(steps)]
            out["not_always_live"][tile] = max(at, default=0)
        return out


def _cuts(rng: np.random.Generator, steps: int) -> set[int]:
    return {s for s in range(1, steps) if rng.random() < 0.5}


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), shared=st.sampled_from(["every", "none"]))
def test_property_cost_model_follows_the_documented_rules(seed, shared):
    rng = np.random.default_rng(seed)
    spec = random_spec(rng)
    m = model_of(build(spec, _cuts(rng, spec["steps"])), shared)
    ref = Reference(spec)
    # the layering is the one the names say
    expected_layer = [str(op["layer"]) if op["layer"] is not None else None for op in spec["ops"]]
    assert [m.layers.names[l] if l >= 0 else None for l in m.layers.op_layer] == expected_layer
    for x in range(len(spec["variables"])):
        assert bool(m.var_stashed[x]) == ref.stashed(x), f"variable {x}"
    names = m.layers.names
    table = m.price_ranges(in_flight=(1, 3))
    for a in range(len(names)):
        for b in range(a, len(names)):
            want = ref.stage({int(n) for n in names[a:b + 1]}, shared)
            sm = m.stage_memory(a, b)
            got = {"always_live": sm.always_live.tolist(), "not_always_live": sm.not_always_live.tolist(),
                   "stash": sm.stash.tolist()}
            assert got == want, (a, b)
            # no programs: a stage's memory is its variables (plus 2 more stash copies at k=3)
            worst3 = max(want["always_live"][t] + want["not_always_live"][t] + 2 * want["stash"][t] for t in (0, 1))
            assert table.worst_bytes[1, a, b] == worst3


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), shared=st.sampled_from(["every", "none"]))
def test_property_splitting_or_merging_touching_intervals_changes_nothing(seed, shared):
    rng = np.random.default_rng(seed)
    spec = random_spec(rng)
    S = spec["steps"]
    merged = model_of(build(spec, set()), shared)
    split = model_of(build(spec, set(range(1, S))), shared)
    some = model_of(build(spec, _cuts(rng, S)), shared)
    ks = (1, 2, 5)
    base = merged.price_ranges(in_flight=ks).worst_bytes
    assert np.array_equal(split.price_ranges(in_flight=ks).worst_bytes, base)
    assert np.array_equal(some.price_ranges(in_flight=ks).worst_bytes, base)
    assert np.array_equal(merged.var_stashed, split.var_stashed)
    L = merged.num_layers
    for a in range(L):
        for b in range(a, L):
            for other in (split, some):
                x, y = merged.stage_memory(a, b), other.stage_memory(a, b)
                for k in ks:
                    assert x.total(k).tolist() == y.total(k).tolist()
                assert x.stash.tolist() == y.stash.tolist()
                assert x.not_always_live.tolist() == y.not_always_live.tolist()
