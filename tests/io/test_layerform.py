"""The per-layer profile form: the timeline of io/layerform.py's docstring, stage memory worked
out by hand for training and inference, shared items, one memory pool for multi-tile devices,
and bad fields."""

import pytest

from helpers import assert_profiles_equal, error_line
from stagesplit.errors import ProfileError
from stagesplit.io.jsonprofile import profile_from_document
from stagesplit.io.layerform import LayerSpec, build_layer_profile, layer_document, one_tile
from stagesplit.io.profile import Target
from stagesplit.io.targets import load_target
from stagesplit.layers import group_layers
from stagesplit.model.costmodel import StageCostModel
from stagesplit.reporting.diagnosis import live_bytes_by_step

SRC = "layers.json"

#        weights activations output other workspace compute
LAYERS = [LayerSpec("l0", 1000, 100, 10, 1, 50, 5.0),
          LayerSpec("l1", 2000, 200, 20, 2, 60, 7.0),
          LayerSpec("l2", 4000, 400, 40, 4, 70, 9.0)]
SHARED = 30000 + 3          # shared weights + shared other, always live, on every stage


def doc(training=True, target="a100-80gb", **extra):
    d = layer_document(LAYERS, target, training=training, name="three layers")
    d["shared"] = {"weights": 30000, "other": 3}
    d.update(extra)
    return d


def model(profile, shared="every"):
    return StageCostModel(profile, group_layers(profile), shared=shared)


def live_of(profile, name):
    """Half-open intervals of the variable called ``name`` ("always" for always-live ones)."""
    idx = profile.names.index(name)
    v = [i for i in range(len(profile.variables)) if profile.variables.name[i] == idx]
    assert len(v) == 1
    i = v[0]
    if profile.variables.always_live[i]:
        return "always"
    return profile.liveness.intervals[profile.variables.live_class[i]].tolist()


class TestTraining:
    """Steps: forward l0, l1, l2 = 0, 1, 2; backward l2, l1, l0 = 3, 4, 5."""

    def profile(self):
        return profile_from_document(doc(training=True), SRC)

    def test_timeline(self):
        p = self.profile()
        assert p.steps == ["forward l0", "forward l1", "forward l2", "backward l2", "backward l1", "backward l0"]
        assert p.operations.name == ["l0/forward", "l1/forward", "l2/forward", "l2/backward", "l1/backward",
                                     "l0/backward"]
        assert p.operations.first_step.tolist() == [0, 1, 2, 3, 4, 5]
        assert p.operations.layer == ["l0", "l1", "l2", "l2", "l1", "l0"]
        assert live_of(p, "l0/weights") == "always" and live_of(p, "l0/other") == "always"
        assert live_of(p, "l0/activations") == [[0, 6]]           # stashed forward -> backward
        assert live_of(p, "l1/activations") == [[1, 5]]
        assert live_of(p, "l2/activations") == [[2, 4]]
        assert live_of(p, "l0/workspace") == [[0, 1], [5, 6]]     # the layer's own two steps
        assert live_of(p, "l2/workspace") == [[2, 3], [3, 4]]
        assert live_of(p, "l0/output") == [[0, 2]]                # to the next layer's forward step
        assert live_of(p, "l2/output") == [[2, 3]]                # the last layer's output: its own step
        assert live_of(p, "l0/output_grad") == [[4, 6]]           # next layer's backward -> own backward
        assert live_of(p, "l1/output_grad") == [[3, 5]]
        assert "l2/output_grad" not in p.names
        assert live_of(p, "shared/weights") == "always" and live_of(p, "shared/other") == "always"
        assert p.compute_unit == "flops" and p.info.source == "layers" and p.info.name == "three layers"

    @pytest.mark.parametrize("first, last, always, peak, peak_step", [
        # always: own weights + other + SHARED; peak: the largest step sum of not-always-live bytes
        (0, 0, 1001, 160, 0),       # step 0: act 100 + ws 50 + out0 10 (= step 5 with the gradient)
        (1, 1, 2002, 290, 1),       # step 1: act 200 + ws 60 + out1 20 + out0 10
        (2, 2, 4004, 530, 2),       # step 2: act 400 + ws 70 + out2 40 + out1 20
        (0, 1, 3003, 390, 1),       # step 1: act0 100 + act1 200 + ws1 60 + out0 10 + out1 20
        (1, 2, 6006, 730, 2),       # step 2: act1 200 + act2 400 + ws2 70 + out1 20 + out2 40
        (0, 2, 7007, 830, 2),       # step 2: acts 700 + ws2 70 + out1 20 + out2 40
    ])
    def test_stage_memory(self, first, last, always, peak, peak_step):
        sm = model(self.profile()).stage_memory(first, last)
        assert sm.always_live.tolist() == [always + SHARED]
        assert sm.not_always_live.tolist() == [peak]
        assert sm.peak_step.tolist() == [peak_step]
        assert sm.total().tolist() == [always + SHARED + peak]

    def test_backward_steps_hold_gradients(self):
        m = model(self.profile())
        by_step, in_stage = live_bytes_by_step(m, 1, 1, tile=0)
        # l1's variables and the boundary tensors it touches, step by step:
        # 0: out0 10 | 1: act1 + ws1 + out0 + out1 | 2: act1 + out1 | 3: act1 + grad1
        # 4: act1 + ws1 + grad1 + grad0 | 5: grad0
        assert by_step.tolist() == [10, 290, 220, 220, 290, 10]
        assert in_stage.tolist() == [False, True, False, False, True, False]

    def test_stash_and_in_flight_copies(self):
        m = model(self.profile())
        assert m.stage_memory(0, 1).stash.tolist() == [300]      # act0 + act1; act2 is used back to back
        assert m.stage_memory(2, 2).stash.tolist() == [0]
        assert m.stage_memory(0, 2).stash.tolist() == [300]
        assert m.stage_memory(0, 1).total(in_flight=4).tolist() == [3003 + SHARED + 390 + 3 * 300]

    def test_compute_per_layer(self):
        m = model(self.profile())
        assert m.layer_compute.tolist() == [5.0, 7.0, 9.0]
        assert m.shared_compute == 0.0

    def test_shared_items_counted_on_every_stage_or_none(self):
        p = self.profile()
        every = [model(p).stage_memory(l, l).always_live[0] for l in range(3)]
        none = [model(p, "none").stage_memory(l, l).always_live[0] for l in range(3)]
        assert every == [1001 + SHARED, 2002 + SHARED, 4004 + SHARED]
        assert none == [1001, 2002, 4004]
        assert model(p).shared_memory().total().tolist() == [SHARED]

    def test_cut_moves_the_output(self):
        from stagesplit.model.traffic import layer_traffic
        t = layer_traffic(model(self.profile()))
        # a cut before l1 moves out0 forward and its gradient backward; before l2: out1 and grad1
        assert t.cut_bytes.tolist() == [0, 10 + 10, 20 + 20, 0]
        assert t.communication.tolist() == [[0, 10, 0], [10, 0, 20], [0, 20, 0]]


class TestInference:
    """One step per layer: activations and workspace on their step, outputs to the next step."""

    def profile(self):
        return profile_from_document(doc(training=False), SRC)

    def test_timeline(self):
        p = self.profile()
        assert p.steps == ["l0", "l1", "l2"]
        assert p.operations.name == ["l0", "l1", "l2"]
        assert live_of(p, "l1/activations") == [[1, 2]]
        assert live_of(p, "l1/workspace") == [[1, 2]]
        assert live_of(p, "l0/output") == [[0, 2]]
        assert live_of(p, "l2/output") == [[2, 3]]
        assert not any(n.endswith("output_grad") for n in p.names)

    @pytest.mark.parametrize("first, last, always, peak", [
        (0, 0, 1001, 160),          # act 100 + ws 50 + out0 10
        (1, 1, 2002, 290),          # act 200 + ws 60 + out1 20 + out0 10
        (2, 2, 4004, 530),          # act 400 + ws 70 + out2 40 + out1 20
        (0, 1, 3003, 290),          # nothing is stashed: the peak is the larger step
        (0, 2, 7007, 530),
    ])
    def test_stage_memory(self, first, last, always, peak):
        sm = model(self.profile()).stage_memory(first, last)
        assert sm.total().tolist() == [always + SHARED + peak]
        assert sm.stash.tolist() == [0]


def test_layer_document_matches_building_directly():
    direct = build_layer_profile(LAYERS, load_target("a100-80gb"), training=True, compute_unit="flops",
                                 shared_weights=30000, shared_other=3)
    read = profile_from_document(doc(training=True), SRC)
    direct.info.name = "three layers"
    assert_profiles_equal(direct, read)


def test_multi_tile_target_is_one_memory_pool():
    mk2 = load_target("ipu-mk2")
    pool = one_tile(mk2)
    assert (pool.tiles, pool.bytes_per_tile) == (1, 1472 * 638976)
    assert pool.device_bytes == mk2.device_bytes
    assert (pool.clock_hz, pool.link_bytes_per_s, pool.kind) == (mk2.clock_hz, mk2.link_bytes_per_s, "ipu")
    assert pool.description.endswith("(whole device as one memory pool)")
    gpu = load_target("h100-80gb")
    assert one_tile(gpu) is gpu
    p = profile_from_document(doc(target="ipu-mk2"), SRC)
    assert p.target == pool
    assert model(p).stage_memory(0, 0).total().tolist() == [1001 + SHARED + 160]


def test_target_object_and_defaults():
    d = {"format": "stagesplit-profile", "version": 1, "kind": "layers",
         "target": {"name": "gpu", "tiles": 1, "bytes_per_tile": 10**9},
         "layers": [{"name": "only", "weights": 5}]}
    p = profile_from_document(d, SRC)
    assert p.target == Target("gpu", 1, 10**9)
    assert p.compute_unit == "flops" and p.num_steps == 2          # training by default
    assert p.variables.bytes.tolist() == [5]
    assert p.operations.compute.tolist() == [0.0, 0.0]


def test_zero_fields_make_no_variables():
    p = build_layer_profile([LayerSpec("a", weights=3), LayerSpec("b")], load_target("a100-40gb"))
    assert p.names == ["a/weights"]


def base_doc():
    return {"format": "stagesplit-profile", "version": 1, "kind": "layers", "target": "a100-80gb",
            "layers": [{"name": "a", "weights": 1}, {"name": "b", "weights": 2}]}


@pytest.mark.parametrize("change, field, expected", [
    (lambda d: d.update(layers=[]), "layers", "a non-empty list"),
    (lambda d: d.pop("layers"), "layers", "a value (field is required)"),
    (lambda d: d.update(layers={"a": {}}), "layers", "a list"),
    (lambda d: d["layers"].append({"name": "a"}), "layers[2].name", "a layer name not used before"),
    (lambda d: d["layers"][1].pop("name"), "layers[1].name", "a value (field is required)"),
    (lambda d: d["layers"][1].update(name=2), "layers[1].name", "a string"),
    (lambda d: d["layers"][0].update(flops=1), "layers[0].flops", "a known field (activations, compute, name"),
    (lambda d: d["layers"][0].update(weights=-1), "layers[0].weights", "an integer >= 0"),
    (lambda d: d["layers"][0].update(activations="1 MB"), "layers[0].activations", "an integer >= 0"),
    (lambda d: d["layers"][1].update(workspace=1.5), "layers[1].workspace", "an integer >= 0"),
    (lambda d: d["layers"][0].update(compute="fast"), "layers[0].compute", "a number >= 0"),
    (lambda d: d["layers"][0].update(compute=-1), "layers[0].compute", "a number >= 0"),
    (lambda d: d["layers"].__setitem__(0, ["a", 1]), "layers[0]", "an object"),
    (lambda d: d.update(training="yes"), "training", "true or false"),
    (lambda d: d.update(shared={"weights": 1, "stash": 2}), "shared.stash", "a known field (other, weights)"),
    (lambda d: d.update(shared={"other": -5}), "shared.other", "an integer >= 0"),
    (lambda d: d.update(shared=[1]), "shared", "an object"),
    (lambda d: d.update(variables=[]), "variables", "a known field"),
    (lambda d: d.update(target="tpu-v9"), "target", "a known target name"),
    (lambda d: d.update(compute_unit="ops"), "compute_unit", "one of cycles, flops, seconds, none"),
], ids=["empty layers", "no layers", "layers not a list", "duplicate names", "missing name", "name not a string",
        "unknown layer field", "negative weights", "string bytes", "float bytes", "string compute",
        "negative compute", "layer not an object", "training", "shared field", "negative shared", "shared list",
        "full-form field", "unknown target", "compute unit"])
def test_bad_fields(change, field, expected):
    d = base_doc()
    change(d)
    with pytest.raises(ProfileError) as excinfo:
        profile_from_document(d, SRC)
    error_line(excinfo, file=SRC, field=field, expected=expected)
