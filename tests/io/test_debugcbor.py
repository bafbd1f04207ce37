"""debug.cbor: the typed reader, parent lookups, and one-line errors on corrupt or truncated files."""

from __future__ import annotations

import cbor2
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fake_pva.support import load_fake_pva
from stagesplit.errors import ProfileError, StagesplitError
from stagesplit.io.debugcbor import DebugContextRecord, read_debug_cbor


@pytest.fixture
def pva(monkeypatch):
    return load_fake_pva(monkeypatch)


CONTEXTS = [
    {"name": "model", "layer": "poptorch", "category": "api",
     "location": {"fileName": "train.py", "functionName": "main", "lineNumber": 10}},
    {"name": "Linear", "parentId": 0, "layer": "poptorch", "category": "op", "op_name": "layer3/dense",
     "op_type": "Linear"},
    {"name": "MatMul", "parentId": 1, "layer": "onnx", "category": "op", "opName": "layer3/dense/MatMul",
     "opType": "MatMul", "input": ["x", "layer3.w"], "output": ["y"]},
    {"name": "MatMul:0", "parentId": 2, "layer": "popart", "category": "op", "instanceId": 17,
     "opid": "ai.onnx.MatMul:9", "inputs": ["x:0", "layer3.w:0"], "outputs": ["y:0"]},
    {"name": "matMul", "parentId": 3, "layer": "poplibs", "category": "api"},
    {"name": "dense", "layer": "xla_op", "category": "op", "op_name": "tf/layer4/dense", "op_type": "Dot"},
]


def test_records_resolve_strings_and_layers(pva, tmp_path):
    info = read_debug_cbor(pva.write_debug_cbor(tmp_path / "debug.cbor", CONTEXTS))
    assert len(info) == 6
    root, linear, onnx, popart, poplibs, xla = info.contexts
    assert root == DebugContextRecord(id=0, index=0, name="model", parent=None, layer="poptorch", category="api",
                                      file="train.py", function="main", line=10)
    assert (linear.name, linear.parent, linear.op_name, linear.op_type) == ("Linear", 0, "layer3/dense", "Linear")
    assert (onnx.op_name, onnx.op_type, onnx.inputs, onnx.outputs) == (
        "layer3/dense/MatMul", "MatMul", ("x", "layer3.w"), ("y",))
    assert (popart.op_name, popart.inputs, popart.outputs, popart.instance_id) == (
        None, ("x:0", "layer3.w:0"), ("y:0",), "17")
    assert (poplibs.layer, poplibs.category, poplibs.op_name, poplibs.inputs) == ("poplibs", "api", None, ())
    assert (xla.op_name, xla.op_type, xla.parent) == ("tf/layer4/dense", "Dot", None)


def test_string_table_indices_everywhere(pva, tmp_path):
    inline = read_debug_cbor(pva.write_debug_cbor(tmp_path / "a.cbor", CONTEXTS))
    interned = read_debug_cbor(pva.write_debug_cbor(tmp_path / "b.cbor", CONTEXTS, intern_all=True))
    raw = cbor2.loads((tmp_path / "b.cbor").read_bytes())
    assert isinstance(raw["contexts"][2]["opName"], int) and isinstance(raw["contexts"][0]["name"], int)
    assert interned.contexts == inline.contexts


def test_lineage_user_op_name_and_inputs(pva, tmp_path):
    info = read_debug_cbor(pva.write_debug_cbor(tmp_path / "debug.cbor", CONTEXTS))
    assert [r.index for r in info.lineage(4)] == [4, 3, 2, 1, 0]
    # nearest user-level name: the onnx opName (context 2) before the poptorch op_name (1)
    assert info.user_op_name(4) == "layer3/dense/MatMul"
    assert info.user_op_name(1) == "layer3/dense"
    assert info.user_op_name(0) is None and info.user_op_name(99) is None
    assert info.inputs(4) == ("x:0", "layer3.w:0")       # popart's own inputs first
    assert info.inputs(2) == ("x", "layer3.w")
    assert info.inputs(1) == ()
    assert info.user_op_name(5) == "tf/layer4/dense"


def test_explicit_ids_and_parent_cycles(pva, tmp_path):
    path = pva.write_debug_cbor(tmp_path / "debug.cbor", [
        {"id": 40, "name": "a", "parentId": 41, "layer": "popart", "category": "op"},
        {"id": 41, "name": "b", "parentId": 40, "layer": "onnx", "category": "op", "opName": "layer1/b"},
        {"id": 42, "name": "c", "parentId": -1, "layer": "onnx", "category": "op"},
    ])
    info = read_debug_cbor(path)
    assert [r.id for r in info.lineage(40)] == [40, 41]       # stops at the cycle
    assert info.user_op_name(40) == "layer1/b"
    assert info.get(42).parent is None and info.get(0) is None


def test_empty_contexts(pva, tmp_path):
    info = read_debug_cbor(pva.write_debug_cbor(tmp_path / "debug.cbor", []))
    assert len(info) == 0 and info.user_op_name(0) is None


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.fixed_dictionaries(
    {"name": st.text(max_size=8), "layer": st.sampled_from(["onnx", "popart", "poptorch", "xla_op", "poplibs"]),
     "category": st.sampled_from(["op", "api", "tensor", "variable"]),
     "names": st.lists(st.text(min_size=1, max_size=5), max_size=3), "parent": st.integers(-1, 6)}), max_size=6),
    st.booleans())
def test_random_contexts_round_trip(pva, tmp_path, specs, intern_all):
    user_key = {"onnx": "opName", "poptorch": "op_name", "xla_op": "op_name"}
    input_key = {"onnx": "input", "popart": "inputs"}
    contexts = []
    for s in specs:
        ctx = {"name": s["name"], "layer": s["layer"], "category": s["category"], "parentId": s["parent"]}
        if s["layer"] in user_key:
            ctx[user_key[s["layer"]]] = s["name"] + "/op"
        ctx[input_key.get(s["layer"], "inputs")] = s["names"]
        contexts.append(ctx)
    info = read_debug_cbor(pva.write_debug_cbor(tmp_path / "r.cbor", contexts, intern_all=intern_all))
    for i, (s, rec) in enumerate(zip(specs, info.contexts)):
        assert (rec.id, rec.index, rec.name, rec.layer, rec.category) == (i, i, s["name"], s["layer"], s["category"])
        assert rec.parent == (None if s["parent"] < 0 else s["parent"])
        assert rec.op_name == (s["name"] + "/op" if s["layer"] in user_key else None)
        assert rec.inputs == tuple(s["names"])
    for i in range(len(specs)):
        names = [r.op_name for r in info.lineage(i) if r.op_name]
        assert info.user_op_name(i) == (names[0] if names else None)


# ------------------------------------------------------------------------------------------------
# Bad files: one line naming the file

def error_line(path) -> str:
    with pytest.raises(ProfileError) as err:
        read_debug_cbor(path)
    text = str(err.value)
    assert "\n" not in text and text.startswith(f"{path}: ")
    return text


def test_missing_file(tmp_path):
    with pytest.raises(StagesplitError) as err:
        read_debug_cbor(tmp_path / "debug.cbor")
    assert str(err.value) == f"{tmp_path / 'debug.cbor'}: no such file (expected the debug.cbor written next to " \
                              "profile.pop)"


def test_corrupt_file(tmp_path):
    path = tmp_path / "debug.cbor"
    path.write_bytes(b"\xff\x00 this is not CBOR")
    assert "corrupt CBOR" in error_line(path)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_every_truncation_is_an_error(pva, tmp_path, data):
    path = pva.write_debug_cbor(tmp_path / "full.cbor", CONTEXTS)
    whole = path.read_bytes()
    cut = data.draw(st.integers(0, len(whole) - 1))
    short = tmp_path / "short.cbor"
    short.write_bytes(whole[:cut])
    assert "truncated" in error_line(short)


def test_trailing_data(pva, tmp_path):
    path = pva.write_debug_cbor(tmp_path / "debug.cbor", CONTEXTS)
    path.write_bytes(path.read_bytes() + b"\x00")
    assert "more data after the first CBOR object" in error_line(path)


@pytest.mark.parametrize("doc, field", [
    ([1, 2], "expected one CBOR map with stringTable and contexts (a Poplar debug.cbor), got 'a CBOR list'"),
    ({"contexts": []}, "stringTable: expected an array of strings"),
    ({"stringTable": ["a", 3], "contexts": []}, "stringTable[1]: expected a string, got 3"),
    ({"stringTable": [], "contexts": {}}, "contexts: expected an array of debug contexts"),
    ({"stringTable": ["a"], "contexts": [7]}, "contexts[0]: expected a map (one debug context), got 7"),
    ({"stringTable": ["a"], "contexts": [{"name": 4}]},
     "contexts[0].name: expected a string or an index into stringTable (0..0), got 4"),
    ({"stringTable": ["a"], "contexts": [{"name": 0, "parentId": "x"}]}, "contexts[0].parentId: expected an integer"),
    ({"stringTable": ["a"], "contexts": [{"name": 0, "layer": "onnx", "input": [0, 9]}]},
     "contexts[0].input[1]: expected a string or an index into stringTable (0..0), got 9"),
])
def test_wrong_shape(tmp_path, doc, field):
    path = tmp_path / "debug.cbor"
    path.write_bytes(cbor2.dumps(doc))
    assert error_line(path).startswith(f"{path}: {field}")
