"""The full-form JSON profile format: write/read round trips, every field mapped where it belongs,
and bad input rejected with one line naming the file, the field path and what was expected."""

import copy
import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from helpers import (
    assert_profiles_equal,
    error_line,
    load_sample,
    random_block_profile,
    random_profile,
    sample_json_text,
    sample_path,
    tiny_profile,
)
from stagesplit.errors import ProfileError
from stagesplit.io import load_profile, save_profile
from stagesplit.io.builder import ProfileBuilder
from stagesplit.io.jsonprofile import dumps_profile, profile_from_document, profile_to_document, read_json_profile
from stagesplit.io.profile import GroundTruth, ProfileInfo, Target
from stagesplit.io.targets import load_target

SRC = "bad.json"


def round_trip(profile):
    return profile_from_document(json.loads(dumps_profile(profile)), "rt.json")


def tiny_doc(ground_truth=True) -> dict:
    return profile_to_document(tiny_profile(ground_truth))


# --------------------------------------------------------------------------------------------------
# Round trips

@pytest.mark.parametrize("ground_truth", [False, True])
def test_tiny_round_trip(ground_truth):
    p = tiny_profile(ground_truth)
    back = round_trip(p)
    assert_profiles_equal(p, back)
    assert (back.ground_truth is None) == (not ground_truth)


def test_round_trip_through_a_file(tmp_path):
    p = tiny_profile(True)
    path = tmp_path / "tiny.json"
    save_profile(p, path)
    assert_profiles_equal(p, read_json_profile(path))
    assert_profiles_equal(p, load_profile(path))


def test_written_file_has_one_record_per_line(tmp_path):
    p = tiny_profile(True)
    lines = dumps_profile(p).splitlines()
    # every variable, program and operation is one line of its own, parseable alone
    for key, count in (("variables", 7), ("programs", 4), ("operations", 4)):
        start = lines.index(f'  "{key}": [')
        records = lines[start + 1:start + 1 + count]
        parsed = [json.loads(r.rstrip(",")) for r in records]
        assert len(parsed) == count and all(isinstance(r, dict) for r in parsed)
        assert lines[start + 1 + count].startswith("  ]")
    first_var = json.loads(lines[lines.index('  "variables": [') + 1].rstrip(","))
    assert first_var == {"name": "layer0.w", "bytes": 100, "tile": 0, "live": "always"}


@pytest.mark.slow
def test_shipped_sample_round_trip():
    """A whole shipped sample (124k variables, 1907 programs on 1472 tiles) survives JSON, and its
    compact form (io/compact.py) is over a hundred times smaller than that JSON (one JSON text, slow
    to make, for both claims)."""
    p = load_sample("bert-base")
    text = sample_json_text("bert-base")
    back = profile_from_document(json.loads(text), "bert-base.json")
    assert_profiles_equal(p, back)
    assert back.info.synthetic and back.target.tiles == 1472
    assert sample_path("bert-base").stat().st_size * 100 < len(text.encode("utf-8"))   # about 0.65 MB against 215 MB


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), layers=st.integers(1, 5), block=st.booleans(), training=st.booleans(),
       tiles=st.integers(1, 4))
def test_property_round_trip_random_profiles(seed, layers, block, training, tiles):
    rng = np.random.default_rng(seed)
    p = (random_block_profile(rng, layers=layers, training=training, tiles=tiles) if block
         else random_profile(rng, layers=layers, tiles=tiles))
    assert_profiles_equal(p, round_trip(p))


names = st.text(st.characters(blacklist_categories=("Cs",)), max_size=8)


@settings(max_examples=80, deadline=None)
@given(step_names=st.lists(names, min_size=1, max_size=4),
       var_names=st.lists(st.none() | names, min_size=1, max_size=4), op_name=names, layer=st.none() | names, inputs=st.lists(names, max_size=3), warnings=st.lists(names, max_size=2),
       nbytes=st.integers(0, 2**62), cycles=st.none() | st.floats(0, 1e12), compute=st.none() | st.floats(0, 1e15),
       debug_id=st.integers(-1, 2**40))
def test_property_round_trip_any_strings_and_numbers(step_names, var_names, op_name, layer, inputs, warnings, nbytes,
                                                      cycles, compute, debug_id):
    info = ProfileInfo(name=op_name, description="\n".join(warnings), warnings=warnings, source="hypothesis")
    b = ProfileBuilder(Target("t", 2, 10**6), step_names, info=info)
    n = len(step_names)
    ids = [b.variable(nbytes, k % 2, [(0, n)] if k % 2 else "always", name=nm) for k, nm in enumerate(var_names)]
    prog = b.program(op_name, cycles=math.nan if cycles is None else cycles, vertex_code=[(1, op_name, 7)])
    b.operation(op_name, 0, n - 1, vars=ids, programs=[prog], inputs=inputs, layer=layer, debug_id=debug_id,
                compute=math.nan if compute is None else compute)
    p = b.build()
    assert_profiles_equal(p, round_trip(p))


# --------------------------------------------------------------------------------------------------
# Every field of the format lands where it belongs

def every_field_doc() -> dict:
    return {
        "format": "stagesplit-profile", "version": 1, "kind": "full",
        "name": "hand", "description": "every field", "synthetic": True, "source": "handwritten",
        "compute_source": "a guess", "warnings": ["first warning", "second"],
        "target": {"name": "dev", "kind": "gpu", "tiles": 2, "bytes_per_tile": 4096, "clock_hz": 1e9,
                   "link_bytes_per_s": 5e9, "flops_per_s": 1e12, "description": "a device"},
        "compute_unit": "flops",
        "steps": ["s0", "s1", "s2", "s3"],
        "variables": [
            {"name": "w", "bytes": 64, "tile": 1, "live": "always"},
            {"bytes": 32, "live": [[3, 4], [0, 2]]},
            {"name": "t", "bytes": 8, "tile": 1, "live": [[1, 3]]},
            {"name": "never", "bytes": 4, "live": []},
            {"name": "w", "bytes": 16},
            {"name": "t2", "bytes": 2, "live": [[0, 2], [3, 4]]},
        ],
        "programs": [
            {"name": "p0", "type": "DoExchange", "cycles": 12.5, "vertices": 3,
             "vertex_code": [[0, "V", 100], [1, "V", 100], [1, "U", 30]], "vertex_state": [[0, 7]],
             "exchange_code": [[1, 9]], "control_code": [[0, 2], [1, 3]]},
            {},
        ],
        "operations": [
            {"name": "layer0/a", "layer": "L0", "debug_id": 5, "inputs": ["x", "w"], "first_step": 0,
             "last_step": 1, "vars": [0, 1], "programs": [0], "compute": 1.5},
            {"name": "layer1/b", "first_step": 2, "last_step": 3, "vars": [1, 2, 5], "programs": [0, 1]},
            {"name": "c"},
        ],
        "ground_truth": {"always_live": [16, 64], "not_always_live": [34, 8],
                         "categories": {"vertex_code": [100, 130], "constant": [1, 2]},
                         "step_trace": {"tiles": [1, 0], "bytes": [[0, 8, 8, 0], [34, 34, 0, 34]]}},
    }


def test_every_documented_field():
    p = profile_from_document(every_field_doc(), "hand.json")
    assert p.info == ProfileInfo(name="hand", source="handwritten", description="every field", synthetic=True,
                                 compute_source="a guess", warnings=["first warning", "second"])
    assert p.target == Target("dev", tiles=2, bytes_per_tile=4096, clock_hz=1e9, kind="gpu", link_bytes_per_s=5e9,
                              flops_per_s=1e12, description="a device")
    assert p.compute_unit == "flops"
    assert p.steps == ["s0", "s1", "s2", "s3"]
    v = p.variables
    assert v.bytes.tolist() == [64, 32, 8, 4, 16, 2]
    assert v.tile.tolist() == [1, 0, 1, 0, 0, 0]            # tile defaults to 0
    assert v.always_live.tolist() == [True, False, False, False, True, False]   # live defaults to "always"
    assert p.names == ["w", "t", "never", "t2"]             # names are shared: both "w" variables -> 0
    assert v.name.tolist() == [0, -1, 1, 2, 0, 3]
    # intervals are stored sorted, and identical patterns share one liveness class
    assert v.live_class.tolist() == [-1, 0, 1, -1, -1, 0]
    assert p.liveness.intervals.tolist() == [[[0, 2], [3, 4]], [[1, 3]]]
    pr = p.programs
    assert pr.name == ["p0", "program1"] and pr.kind == ["DoExchange", "OnTileExecute"]
    assert pr.cycles[0] == 12.5 and math.isnan(pr.cycles[1])
    assert pr.vertices.tolist() == [3, 0]
    assert pr.vertex_types == ["V", "U"]
    vc = pr.vertex_code
    assert list(zip(vc.program.tolist(), vc.tile.tolist(), vc.vertex_type.tolist(), vc.bytes.tolist())) == \
        [(0, 0, 0, 100), (0, 1, 0, 100), (0, 1, 1, 30)]
    assert (pr.vertex_state.program.tolist(), pr.vertex_state.tile.tolist(), pr.vertex_state.bytes.tolist()) == \
        ([0], [0], [7])
    assert (pr.exchange_code.tile.tolist(), pr.exchange_code.bytes.tolist()) == ([1], [9])
    assert (pr.control_code.tile.tolist(), pr.control_code.bytes.tolist()) == ([0, 1], [2, 3])
    ops = p.operations
    assert ops.name == ["layer0/a", "layer1/b", "c"]
    assert ops.layer == ["L0", None, None]
    assert ops.debug_id.tolist() == [5, -1, -1]
    assert ops.inputs == [("x", "w"), (), ()]
    assert ops.first_step.tolist() == [0, 2, -1] and ops.last_step.tolist() == [1, 3, -1]
    assert ops.vars.tolist() == [[0, 1], [1, 2, 5], []]
    assert ops.programs.tolist() == [[0], [0, 1], []]
    assert ops.compute[0] == 1.5 and np.isnan(ops.compute[1:]).all()
    gt = p.ground_truth
    assert gt.always_live.tolist() == [16, 64] and gt.not_always_live.tolist() == [34, 8]
    assert {k: a.tolist() for k, a in gt.categories.items()} == {"vertex_code": [100, 130], "constant": [1, 2]}
    assert gt.step_tiles.tolist() == [1, 0]
    assert gt.step_bytes.tolist() == [[0, 8, 8, 0], [34, 34, 0, 34]]
    assert gt.tile_total().tolist() == [16 + 34 + 100 + 1, 64 + 8 + 130 + 2]
    # and it writes back to the same profile
    assert_profiles_equal(p, round_trip(p))


def test_defaults_of_optional_fields():
    doc = {"format": "stagesplit-profile", "version": 1, "target": "a100-80gb", "steps": 2,
           "operations": [{"name": "only"}]}
    p = profile_from_document(doc, "min.json")
    assert p.info == ProfileInfo(source="json")
    assert p.compute_unit == "cycles" and p.ground_truth is None
    assert len(p.variables) == 0 and len(p.programs) == 0
    assert p.steps == ["step0", "step1"]


def test_steps_given_as_a_count():
    doc = tiny_doc()
    doc["steps"] = 6
    p = profile_from_document(doc, "count.json")
    assert p.steps == [f"step{i}" for i in range(6)]
    listed = tiny_profile(True)
    assert listed.steps == p.steps      # the builder names counted steps the same way
    assert_profiles_equal(listed, p)


def test_steps_as_integral_float_count():
    doc = tiny_doc()
    doc["steps"] = 6.0
    assert profile_from_document(doc, "f.json").num_steps == 6


def test_overlapping_intervals_are_merged():
    """A variable is live on the union of its intervals: overlaps must not count it twice."""
    doc = tiny_doc(ground_truth=False)
    doc["variables"][2]["live"] = [[1, 3], [0, 2]]            # a (30 B): the union is [0, 3)
    doc["variables"][6]["live"] = [[5, 6], [5, 6]]
    p = profile_from_document(doc, "overlap.json")
    assert p.liveness.intervals[p.variables.live_class[2]].tolist() == [[0, 3]]
    assert_profiles_equal(tiny_profile(), p)
    from stagesplit.layers import group_layers
    from stagesplit.model.costmodel import StageCostModel
    sm = StageCostModel(p, group_layers(p)).stage_memory(0, 0)
    assert sm.not_always_live.tolist() == [70, 5]             # as in test_costmodel: a and b once each


def test_touching_intervals_stay_separate():
    doc = tiny_doc(ground_truth=False)
    doc["variables"][2]["live"] = [[2, 3], [0, 2]]
    p = profile_from_document(doc, "touch.json")
    assert p.liveness.intervals[p.variables.live_class[2]].tolist() == [[0, 2], [2, 3]]


def test_target_by_name():
    doc = tiny_doc(ground_truth=False)
    doc["target"] = "ipu-mk2"
    doc["variables"] = [dict(v, tile=1471 if k == 0 else v["tile"]) for k, v in enumerate(doc["variables"])]
    p = profile_from_document(doc, "named.json")
    assert p.target == load_target("ipu-mk2")
    assert (p.target.tiles, p.target.bytes_per_tile) == (1472, 638976)
    assert p.variables.tile[0] == 1471


def test_target_by_object():
    doc = tiny_doc(ground_truth=False)
    doc["target"] = {"tiles": 2, "bytes_per_tile": 7, "kind": "gpu"}
    p = profile_from_document(doc, "obj.json")
    assert p.target == Target("custom", tiles=2, bytes_per_tile=7, kind="gpu")


# --------------------------------------------------------------------------------------------------
# Bad input: one line naming the file, the field and what was expected

def mutate(doc, path, value):
    obj = doc
    for key in path[:-1]:
        obj = obj[key]
    obj[path[-1]] = value
    return doc


def delete(doc, path):
    obj = doc
    for key in path[:-1]:
        obj = obj[key]
    del obj[path[-1]]
    return doc


BAD = [
    # (id, change, field path, expected text)
    ("string bytes", lambda d: mutate(d, ["variables", 1, "bytes"], "50"), "variables[1].bytes", "an integer >= 0"),
    ("float tile", lambda d: mutate(d, ["variables", 1, "tile"], 0.5), "variables[1].tile", "an integer >= 0"),
    ("list for a variable", lambda d: mutate(d, ["variables", 1], [50, 1]), "variables[1]", "an object"),
    ("list for the target", lambda d: mutate(d, ["target"], [2, 1000]), "target", "an object"),
    ("list for ground truth", lambda d: mutate(d, ["ground_truth"], []), "ground_truth", "an object"),
    ("string for variables", lambda d: mutate(d, ["variables"], "v"), "variables", "a list"),
    ("negative bytes", lambda d: mutate(d, ["variables", 1, "bytes"], -4), "variables[1].bytes", "an integer >= 0"),
    ("bytes beyond 64 bits", lambda d: mutate(d, ["variables", 1, "bytes"], 2**70), "variables[1].bytes",
     "an integer <="),
    ("negative code bytes", lambda d: mutate(d, ["programs", 0, "vertex_state"], [[0, -8]]),
     "programs[0].vertex_state[0][1]", "an integer >= 0"),
    ("negative cycles", lambda d: mutate(d, ["programs", 0, "cycles"], -1), "programs[0].cycles", "a number >= 0"),
    ("negative compute", lambda d: mutate(d, ["operations", 0, "compute"], -2.5), "operations[0].compute",
     "a number >= 0"),
    ("unknown version", lambda d: mutate(d, ["version"], 2), "version", "1 (this stagesplit reads"),
    ("boolean version", lambda d: mutate(d, ["version"], True), "version", "1 (this stagesplit reads"),
    ("missing version", lambda d: delete(d, ["version"]), "version", "a value (field is required)"),
    ("wrong format header", lambda d: mutate(d, ["format"], "popvision"), "format", '"stagesplit-profile"'),
    ("unknown kind", lambda d: mutate(d, ["kind"], "partial"), "kind", "one of full, layers"),
    ("unknown top-level field", lambda d: mutate(d, ["tiles"], 2), "tiles", "a known field ("),
    ("unknown variable field", lambda d: mutate(d, ["variables", 2, "size"], 1), "variables[2].size",
     "a known field (bytes, live, name, role, tile)"),
    ("unknown program field", lambda d: mutate(d, ["programs", 1, "code"], 1), "programs[1].code", "a known field"),
    ("unknown operation field", lambda d: mutate(d, ["operations", 3, "stage"], 1), "operations[3].stage",
     "a known field"),
    ("unknown ground truth field", lambda d: mutate(d, ["ground_truth", "peak"], 1), "ground_truth.peak",
     "a known field"),
    ("bad live string", lambda d: mutate(d, ["variables", 2, "live"], "sometimes"), "variables[2].live",
     '"always" or a list of [start, end) step intervals'),
    ("interval not a pair", lambda d: mutate(d, ["variables", 2, "live"], [[0, 1, 2]]), "variables[2].live[0]",
     "a [start, end) pair"),
    ("interval end before start", lambda d: mutate(d, ["variables", 2, "live"], [[3, 1]]), "variables[2].live[0][1]",
     "an end >= start (3) and <= 6"),
    ("interval end beyond the steps", lambda d: mutate(d, ["variables", 2, "live"], [[0, 2], [3, 7]]),
     "variables[2].live[1][1]", "and <= 6 (end is exclusive)"),
    ("interval start beyond the steps", lambda d: mutate(d, ["variables", 2, "live"], [[7, 8]]),
     "variables[2].live[0][0]", "a step index in 0..6"),
    ("negative interval start", lambda d: mutate(d, ["variables", 2, "live"], [[-1, 2]]), "variables[2].live[0][0]",
     "an integer >= 0"),
    ("operation references a missing variable", lambda d: mutate(d, ["operations", 1, "vars"], [2, 7]),
     "operations[1].vars[1]", "a variable index in 0..6"),
    ("operation references a missing program", lambda d: mutate(d, ["operations", 2, "programs"], [4]),
     "operations[2].programs[0]", "a program index in 0..3"),
    ("variable tile out of range", lambda d: mutate(d, ["variables", 4, "tile"], 2), "variables[4].tile",
     "a tile index in 0..1"),
    ("code tile out of range", lambda d: mutate(d, ["programs", 2, "exchange_code"], [[1, 6], [2, 6]]),
     "programs[2].exchange_code[1][0]", "a tile index in 0..1"),
    ("vertex code tile out of range", lambda d: mutate(d, ["programs", 1, "vertex_code"], [[9, "Add", 20]]),
     "programs[1].vertex_code[0][0]", "a tile index in 0..1"),
    ("trace tile out of range", lambda d: mutate(d, ["ground_truth", "step_trace", "tiles"], [2]),
     "ground_truth.step_trace.tiles[0]", "a tile index in 0..1"),
    ("last_step before first_step", lambda d: mutate(d, ["operations", 2, "last_step"], 2), "operations[2].last_step",
     "a step index >= first_step and <= 5"),
    ("last_step beyond the steps", lambda d: mutate(d, ["operations", 3, "last_step"], 6), "operations[3].last_step",
     "a step index >= first_step and <= 5"),
    ("first_step beyond the steps", lambda d: mutate(d, ["operations", 3, "first_step"], 6),
     "operations[3].first_step", "a step index in 0..5"),
    ("last_step without first_step", lambda d: delete(d, ["operations", 3, "first_step"]), "operations[3].last_step",
     "-1 when first_step is unknown"),
    ("empty profile", lambda d: mutate(d, ["operations"], []), "operations", "a non-empty list"),
    ("no operations field", lambda d: delete(d, ["operations"]), "operations", "a value (field is required)"),
    ("unknown target name", lambda d: mutate(d, ["target"], "ipu-mk9"), "target",
     "a known target name (ipu-mk1, ipu-mk2"),
    ("target tiles as a string", lambda d: mutate(d, ["target", "tiles"], "2"), "target.tiles", "an integer >= 1"),
    ("unknown target field", lambda d: mutate(d, ["target", "cores"], 2), "target.cores", "one of bytes_per_tile"),
    ("ground truth of the wrong length", lambda d: mutate(d, ["ground_truth", "always_live"], [1]),
     "ground_truth.always_live", "2 values (one per tile)"),
    ("step trace row of the wrong length", lambda d: mutate(d, ["ground_truth", "step_trace", "bytes"], [[1, 2]]),
     "ground_truth.step_trace.bytes[0]", "6 values (one per step)"),
    ("unknown compute unit", lambda d: mutate(d, ["compute_unit"], "joules"), "compute_unit",
     "one of cycles, flops, seconds, none"),
    ("negative step count", lambda d: mutate(d, ["steps"], -1), "steps", "an integer >= 0"),
    ("step name not a string", lambda d: mutate(d, ["steps", 2], 3), "steps[2]", "a string"),
    ("input not a string", lambda d: mutate(d, ["operations", 0, "inputs"], ["x", 1]), "operations[0].inputs[1]",
     "a string"),
    ("layer not a string", lambda d: mutate(d, ["operations", 0, "layer"], 0), "operations[0].layer", "a string"),
    ("synthetic not a boolean", lambda d: mutate(d, ["synthetic"], "yes"), "synthetic", "true or false"),
    ("warning not a string", lambda d: mutate(d, ["warnings"], [1]), "warnings[0]", "a string"),
    ("debug id below -1", lambda d: mutate(d, ["operations", 0, "debug_id"], -2), "operations[0].debug_id",
     "an integer >= -1"),
    ("vertex code not a triple", lambda d: mutate(d, ["programs", 0, "vertex_code"], [[0, "MatMul"]]),
     "programs[0].vertex_code[0]", "a [tile, vertex type name, bytes] triple"),
    ("variable bytes missing", lambda d: delete(d, ["variables", 0, "bytes"]), "variables[0].bytes",
     "a value (field is required)"),
    ("operation name missing", lambda d: delete(d, ["operations", 0, "name"]), "operations[0].name",
     "a value (field is required)"),
    ("batch size of none", lambda d: mutate(d, ["batch_size"], 0), "batch_size", "an integer >= 1"),
    ("batch size as a string", lambda d: mutate(d, ["batch_size"], "8"), "batch_size", "an integer >= 1"),
    ("batch size fractional", lambda d: mutate(d, ["batch_size"], 2.5), "batch_size", "an integer >= 1"),
]


@pytest.mark.parametrize("change, field, expected", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_document(change, field, expected):
    doc = change(tiny_doc())
    with pytest.raises(ProfileError) as excinfo:
        profile_from_document(doc, SRC)
    error_line(excinfo, file=SRC, field=field, expected=expected)
    assert excinfo.value.field == field and excinfo.value.file == SRC


@pytest.mark.parametrize("layers, field, expected", [
    ([], "layers", "a non-empty list"),
    ([{"name": "enc"}, {"name": "dec"}, {"name": "enc"}], "layers[2].name", "a layer name not used before"),
], ids=["empty layers list", "duplicate layer names"])
def test_bad_layers_document(layers, field, expected):
    doc = {"format": "stagesplit-profile", "version": 1, "kind": "layers", "target": "h100-80gb", "layers": layers}
    with pytest.raises(ProfileError) as excinfo:
        profile_from_document(doc, SRC)
    error_line(excinfo, file=SRC, field=field, expected=expected)


def test_document_not_an_object():
    with pytest.raises(ProfileError) as excinfo:
        profile_from_document([1, 2], SRC)
    error_line(excinfo, file=SRC, field="document", expected="an object")


def test_invalid_json_file(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"format": "stagesplit-profile", "version": 1,\n  "steps": [1 2]}')
    with pytest.raises(ProfileError) as excinfo:
        read_json_profile(path)
    error_line(excinfo, file=path, field="line 2 column 15", expected="valid JSON")


def test_json_file_that_is_not_utf8(tmp_path):
    path = tmp_path / "latin.json"
    path.write_bytes(b'{"name": "caf\xe9"}')
    with pytest.raises(ProfileError) as excinfo:
        load_profile(path)
    error_line(excinfo, file=path, expected="a UTF-8 JSON document")


def test_truncated_file(tmp_path):
    text = dumps_profile(tiny_profile(True))
    path = tmp_path / "cut.json"
    path.write_text(text[: len(text) // 2])
    with pytest.raises(ProfileError) as excinfo:
        load_profile(path)
    message = error_line(excinfo, file=path, expected="valid JSON")
    assert ": line " in message


@settings(max_examples=60, deadline=None)
@given(cut=st.floats(0.0, 1.0, exclude_max=True))
def test_property_every_truncation_is_a_one_line_error(cut, tmp_path_factory):
    text = dumps_profile(tiny_profile(True))
    keep = int(cut * (len(text) - 1))          # every proper prefix short of the closing brace
    path = tmp_path_factory.mktemp("cut") / "cut.json"
    path.write_text(text[:keep])
    with pytest.raises(ProfileError) as excinfo:
        read_json_profile(path)
    error_line(excinfo, file=path, expected="valid JSON")


# the empty list and mapping are leaves, so that every draw of ``extend`` draws ``inner`` (hypothesis warns,
# as an error, when a run of draws never does)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True) | st.text(max_size=5)
    | st.just([]) | st.just({}),
    lambda inner: st.lists(inner, min_size=1, max_size=3) | st.dictionaries(st.text(max_size=4), inner, min_size=1,
                                                                            max_size=3),
    max_leaves=6)


def _field_paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _field_paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _field_paths(v, prefix + (i,))


TINY_PATHS = [p for p in _field_paths(tiny_doc()) if p]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(which=st.integers(0, len(TINY_PATHS) - 1), value=json_values, remove=st.booleans())
def test_property_any_damaged_field_reads_or_fails_cleanly(which, value, remove):
    """Replacing or deleting any one field gives a valid profile or a one-line ProfileError
    naming the file, never another exception."""
    doc = tiny_doc()
    path = TINY_PATHS[which]
    if remove:
        obj = doc
        for key in path[:-1]:
            obj = obj[key]
        obj.pop(path[-1])
    else:
        mutate(doc, list(path), copy.deepcopy(value))
    try:
        profile = profile_from_document(doc, SRC)
    except ProfileError as exc:
        message = str(exc)
        assert "\n" not in message and message.startswith(f"{SRC}: ")
    else:
        profile.validate()


def test_overflowing_sizes_do_not_crash_layers_form():
    doc = {"format": "stagesplit-profile", "version": 1, "kind": "layers", "target": "a100-80gb",
           "layers": [{"name": "a", "other": 2**70}]}
    with pytest.raises(ProfileError) as excinfo:
        profile_from_document(doc, SRC)
    error_line(excinfo, file=SRC, field="layers[0].other", expected="an integer <=")


def test_ground_truth_is_optional_and_kept_separately():
    p = tiny_profile()
    p.ground_truth = GroundTruth(always_live=np.array([1, 2]), not_always_live=np.array([3, 4]))
    back = round_trip(p)
    assert back.ground_truth.categories == {}
    assert back.ground_truth.step_tiles.shape == (0,)
    assert_profiles_equal(p, back)


def test_byte_order_mark_is_accepted(tmp_path):
    """Editors on Windows save UTF-8 with a byte order mark."""
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + dumps_profile(tiny_profile(True)).encode())
    assert_profiles_equal(tiny_profile(True), load_profile(path))


def test_roles_round_trip_and_documents_without_roles_have_none():
    b = ProfileBuilder(Target("t", 1, 1000), 2)
    ids = [b.variable(8, 0, "always", f"w{k}", role=role) for k, role in enumerate(("param", "grad", "state"))]
    ids.append(b.variable(4, 0, [(0, 1)], "x", role="other"))
    b.operation("op", 0, 1, vars=ids)
    p = b.build()
    doc = profile_to_document(p)
    assert [v["role"] for v in doc["variables"]] == ["param", "grad", "state", "other"]
    assert profile_from_document(json.loads(json.dumps(doc)), "r.json").variables.role.tolist() == [1, 2, 3, 5]
    for v in doc["variables"]:
        del v["role"]
    assert profile_from_document(doc, "r.json").variables.role is None
    doc["variables"][0]["role"] = "weights"
    with pytest.raises(ProfileError, match=r"r\.json: variables\[0\]\.role: expected one of unknown, param, grad, state, "
                                           r"buffer, other, got 'weights'"):
        profile_from_document(doc, "r.json")


_PAIRS_DOC = {"format": "stagesplit-profile", "version": 1,
              "target": {"name": "t", "tiles": 4, "bytes_per_tile": 1000, "clock_hz": 1e9}, "steps": 2,
              "variables": [{"bytes": 10, "live": "always"}],
              "programs": [{"name": "p", "vertex_state": [[0, 5], [1, 6]], "vertex_code": [[0, "v", 3], [2, "w", 4]]}],
              "operations": [{"name": "op", "first_step": 0, "last_step": 1, "vars": [0], "programs": [0]}]}


@pytest.mark.parametrize("field, value, message", [
    ("vertex_state", [[0, 5], [1, True]], "vertex_state[1][1]: expected an integer >= 0, got True"),
    ("vertex_state", [[0, 3.5]], "vertex_state[0][1]: expected an integer >= 0, got 3.5"),
    ("vertex_state", [[0, -1]], "vertex_state[0][1]: expected an integer >= 0, got -1"),
    ("vertex_state", [[0, 1], [4, 1]], "vertex_state[1][0]: expected a tile index in 0..3, got 4"),
    ("vertex_state", [[1]], "vertex_state[0]: expected a [tile, bytes] pair, got [1]"),
    ("vertex_state", [[0, 2**70]], "vertex_state[0][1]: expected an integer <= 9223372036854775807 (64-bit)"),
    ("vertex_state", [[True, 1]], "vertex_state[0][0]: expected an integer >= 0, got True"),
    ("vertex_code", [[0, 5, 3]], "vertex_code[0][1]: expected a string, got 5"),
    ("vertex_code", [[0, "v", 1], [0, "v", True]], "vertex_code[1][2]: expected an integer >= 0, got True"),
    ("vertex_code", [[9, "v", 1]], "vertex_code[0][0]: expected a tile index in 0..3, got 9"),
])
def test_program_cost_pairs_are_checked_one_by_one_where_any_is_wrong(field, value, message):
    """Program costs are read as arrays when every pair is plainly right (millions of them in a large
    profile), and otherwise checked one by one: the first wrong one is named as before."""
    doc = copy.deepcopy(_PAIRS_DOC)
    doc["programs"][0][field] = value
    with pytest.raises(ProfileError) as excinfo:
        profile_from_document(doc, "x.json")
    assert str(excinfo.value).startswith(f"x.json: programs[0].{message}")


def test_program_cost_pairs_read_as_arrays_keep_their_order_and_whole_floats():
    doc = copy.deepcopy(_PAIRS_DOC)
    p = profile_from_document(copy.deepcopy(doc), "x.json")
    assert p.programs.vertex_state.tile.tolist() == [0, 1] and p.programs.vertex_state.bytes.tolist() == [5, 6]
    assert p.programs.vertex_code.tile.tolist() == [0, 2] and p.programs.vertex_code.bytes.tolist() == [3, 4]
    assert [p.programs.vertex_types[t] for t in p.programs.vertex_code.vertex_type] == ["v", "w"]
    doc["programs"][0]["vertex_state"] = [[0, 3.0]]                    # a whole float is an integer, as before
    assert profile_from_document(doc, "x.json").programs.vertex_state.bytes.tolist() == [3]
