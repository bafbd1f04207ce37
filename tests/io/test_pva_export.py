"""The standalone PopVision exporter (stagesplit/io/pva_export.py, issue 22): on every report the
libpva test double serves, its file is the one ``stagesplit convert`` writes (byte for byte, and
the same Profile when loaded), with numpy and without; it runs as a single file copied alone;
its syntax floor is Python 3.6 (checked by vermin); its CBOR decoder agrees with cbor2."""

from __future__ import annotations

import ast
import io
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import cbor2
import pytest
from hypothesis import given, settings, strategies as st
from test_popvision import hand_report, two_ipu_report

from fake_pva.support import FAKE_DIR, load_fake_pva
from helpers import assert_profiles_equal
from stagesplit.cli import main
from stagesplit.io import load_profile, pva_export
from stagesplit.io.debugcbor import read_debug_cbor
from stagesplit.io.profile import Target
from stagesplit.io.synth import synthesize

ROOT = Path(__file__).resolve().parents[2]
EXPORTER = ROOT / "stagesplit" / "io" / "pva_export.py"
SMALL = Target("small", tiles=16, bytes_per_tile=638976, clock_hz=1.33e9)


@pytest.fixture
def pva(monkeypatch):
    return load_fake_pva(monkeypatch)


@pytest.fixture(params=["numpy", "standard library"])
def numpy_or_not(request, monkeypatch):
    """Run with numpy, and again with the exporter's standard-library path."""
    if request.param != "numpy":
        monkeypatch.setattr(pva_export, "NUMPY", None)
    return request.param


@pytest.fixture(scope="module")
def synthetic():
    return {"bert-base": synthesize("bert-base", SMALL, layers=2, piece_bytes=16384),
            "gpt": synthesize("gpt", SMALL, layers=1, piece_bytes=65536, programs_per_op=2, seed=5),
            "cnn": synthesize("cnn", Target("small", 64, 10**8), piece_bytes=2**20, programs_per_op=1, seed=2)}


DEBUG_CONTEXTS = [
    {"id": 3, "name": "Call", "layer": "popart", "category": "op", "inputs": ["layer1/in:0"], "parentId": 30},
    {"id": 30, "name": "Add", "layer": "onnx", "category": "op", "opName": "layer1/Add", "input": ["a"]},
    {"id": 6, "name": "poplibs", "layer": "poplibs", "category": "api", "parentId": 60},
    {"id": 60, "name": "Linear", "layer": "poptorch", "category": "op", "op_name": "layer1/linear",
     "location": {"fileName": "model.py", "functionName": "forward", "lineNumber": 12}},
]


def no_tiles(pva):
    report = hand_report(pva)
    report.compilation._tiles = []
    return report


def anonymous_from_json(pva):
    report = hand_report(pva)
    report._operations[6].debugContext.json = json.dumps({"opName": "layer1/from_json", "instanceId": 2})
    return report


#: every kind of report the double serves: name -> (report maker, debug contexts or None, intern strings)
REPORTS = {
    "hand": (lambda pva, s: hand_report(pva), None, False),
    "hand, no estimates": (lambda pva, s: hand_report(pva, estimates=False), None, False),
    "hand, libpva convention": (lambda pva, s: hand_report(pva, code_in_always_live=True), None, False),
    "hand, bytes in no figure": (lambda pva, s: hand_report(pva, total=[293, 241, 596]), None, False),
    "hand, total too small": (lambda pva, s: hand_report(pva, total=[100, 232, 596]), None, False),
    "hand, no total": (lambda pva, s: hand_report(pva, total=False), None, False),
    "hand, no tiles": (lambda pva, s: no_tiles(pva), None, False),
    "hand, debug.cbor": (lambda pva, s: hand_report(pva), DEBUG_CONTEXTS, False),
    "hand, debug.cbor interned": (lambda pva, s: hand_report(pva), DEBUG_CONTEXTS, True),
    "hand, name from json": (lambda pva, s: anonymous_from_json(pva), DEBUG_CONTEXTS, False),
    "two IPUs": (lambda pva, s: two_ipu_report(pva), None, False),
    "one IPU": (lambda pva, s: two_ipu_report(pva, ipus=1), None, False),
    "replicas": (lambda pva, s: two_ipu_report(pva, replicas=2, ipus=1), None, False),
    "bert-base": (lambda pva, s: pva.report_from_profile(s["bert-base"]), None, False),
    "bert-base, 3 IPUs, libpva convention": (
        lambda pva, s: pva.report_from_profile(s["bert-base"], ipus=3, code_in_always_live=True), None, False),
    "bert-base, extra total": (
        lambda pva, s: pva.report_from_profile(s["bert-base"], extra_total=range(16)), None, False),
    "gpt, ids from 7 by 5": (
        lambda pva, s: pva.report_from_profile(s["gpt"], var_id_start=7, var_id_step=5, ipus=2), None, False),
    "cnn": (lambda pva, s: pva.report_from_profile(s["cnn"]), None, False),
}


def convert_and_export(pva, tmp_path, report, contexts=None, intern=False, capsys=None):
    pop = pva.register(tmp_path / "run" / "profile.pop", report)
    debug = None
    if contexts is not None:
        debug = pva.write_debug_cbor(tmp_path / "run" / "debug.cbor", contexts, intern_all=intern)
    converted, exported = tmp_path / "convert.stagesplit", tmp_path / "export.stagesplit"
    assert main(["convert", str(pop), *([str(debug)] if debug else []), "-o", str(converted)]) == 0
    done = pva_export.export(str(pop), None if debug is None else str(debug), str(exported))
    return converted, exported, done


@pytest.mark.usefixtures("numpy_or_not")
@pytest.mark.parametrize("name", list(REPORTS))
def test_export_equals_convert(pva, tmp_path, synthetic, name):
    make, contexts, intern = REPORTS[name]
    converted, exported, _ = convert_and_export(pva, tmp_path, make(pva, synthetic), contexts, intern)
    assert exported.read_bytes() == converted.read_bytes()
    a, b = load_profile(converted), load_profile(exported)
    assert a.info.sha256 == b.info.sha256
    assert_profiles_equal(a, b)


def test_export_of_a_report_file_in_a_fresh_interpreter_equals_convert(pva, tmp_path, synthetic):
    """The single file, copied alone into a folder, run by a fresh interpreter as the SDK user
    runs it; stagesplit cannot be imported while it runs (the double's report is built first)."""
    pop = pva.write_report_file(tmp_path / "bert" / "profile.pop", synthetic["bert-base"], ipus=2)
    debug = pva.write_debug_cbor(tmp_path / "bert" / "debug.cbor", DEBUG_CONTEXTS)
    alone = tmp_path / "sdk"
    alone.mkdir()
    shutil.copy(EXPORTER, alone / "pva_export.py")
    out = tmp_path / "model.stagesplit"
    runner = (
        "import importlib.abc, runpy, sys\n"
        "import pva\n"
        "pva.register(sys.argv[1], pva.openReport(sys.argv[1]))      # built here, before stagesplit is blocked\n"
        "for name in [m for m in sys.modules if m == 'stagesplit' or m.startswith('stagesplit.')]:\n"
        "    del sys.modules[name]\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'stagesplit' or name.startswith('stagesplit.'):\n"
        "            raise ImportError('stagesplit is not installed here')\n"
        "sys.meta_path.insert(0, Block())\n"
        "sys.path[:] = [p for p in sys.path if p != sys.argv[5]]\n"
        "sys.argv = [sys.argv[4]] + sys.argv[1:4]\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(FAKE_DIR), str(ROOT)])}
    proc = subprocess.run([sys.executable, "-c", runner, str(pop), str(debug), f"-o{out}",
                           str(alone / "pva_export.py"), str(ROOT)],
                          capture_output=True, text=True, env=env, cwd=alone)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("pva_export: read 0% of ") and "pva_export: read 100% of " in lines[-3]
    assert lines[-2].startswith("pva_export: warning: the profile spans 2 IPU(s)")
    assert lines[-1] == (f"wrote {out}: {len(synthetic['bert-base'].variables):,} variables, "
                         f"{len(synthetic['bert-base'].operations):,} operations, "
                         f"{len(synthetic['bert-base'].programs):,} programs, {synthetic['bert-base'].num_steps:,} steps")
    converted = tmp_path / "convert.stagesplit"
    assert main(["convert", str(pop), str(debug), "-o", str(converted)]) == 0
    assert out.read_bytes() == converted.read_bytes()


def test_the_exporter_imports_only_the_standard_library_pva_and_numpy():
    tree = ast.parse(EXPORTER.read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "no relative imports: the file runs alone"
            imported.add(node.module.split(".")[0])
    assert imported - set(sys.stdlib_module_names) == {"numpy", "pva"}


def test_syntax_floor_is_python_3_6():
    """vermin (a real checker of the minimum Python version) finds nothing above 3.6 in the
    exporter, which imports nothing of stagesplit's; Python's own parser agrees."""
    vermin = shutil.which("vermin") or str(Path(sys.executable).parent / "vermin")
    proc = subprocess.run([vermin, "--target=3.6-", "--no-tips", "--violations", str(EXPORTER)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Minimum required versions: 3." in proc.stdout
    ast.parse(EXPORTER.read_text(), feature_version=(3, 6))


def test_progress_lines(pva, tmp_path):
    pop = pva.register(tmp_path / "profile.pop", hand_report(pva))
    stream = io.StringIO()
    pva_export.export(str(pop), None, str(tmp_path / "m.stagesplit"), progress=stream)
    lines = stream.getvalue().splitlines()
    # 21 items: 6 programs one by one (5% .. 28%), 7 variables at once (61%), 8 operations (66% .. 100%);
    # a line each time a tenth is passed, saying which
    assert lines == [f"pva_export: read {p}% of 21 items" for p in (0, 10, 20, 60, 70, 80, 90, 100)]


@pytest.mark.parametrize("args, message", [
    (["nope/profile.pop"], "nope/profile.pop: no such file (expected a PopVision profile.pop)"),
    (["{pop}", "nope.cbor"], "nope.cbor: no such file (expected the debug.cbor written next to profile.pop)"),
    (["{bad}"], "{bad}: libpva could not open the report"),
    (["{pop}", "{cbor}"], "{cbor}: expected one CBOR map with stringTable and contexts (a Poplar debug.cbor), got "
                          "corrupt CBOR"),
    (["{pop}", "{short}"], "{short}: expected one CBOR map with stringTable and contexts (a Poplar debug.cbor), got a "
                           "truncated file"),
    (["{damaged}"], "{damaged}: OperationAnalysis(report).operations: expected objects with the attributes"),
])
def test_errors_are_one_line(pva, tmp_path, capsys, monkeypatch, args, message):
    names = {"pop": str(pva.register(tmp_path / "profile.pop", hand_report(pva))),
             "bad": str(tmp_path / "bad.pop"), "cbor": str(tmp_path / "debug.cbor"),
             "short": str(tmp_path / "short.cbor")}
    damaged = hand_report(pva)
    damaged._operations[0].firstStepIndex = "first"
    names["damaged"] = str(pva.register(tmp_path / "damaged" / "profile.pop", damaged))
    Path(names["bad"]).write_bytes(b"not a report")
    Path(names["cbor"]).write_bytes(b"\xff\x00 not CBOR")
    whole = pva.write_debug_cbor(tmp_path / "whole.cbor", DEBUG_CONTEXTS).read_bytes()
    Path(names["short"]).write_bytes(whole[:-3])
    monkeypatch.chdir(tmp_path)                 # restored after the test: later tests run where pytest started
    code = pva_export.main([a.format(**names) for a in args] + ["-o", str(tmp_path / "out.stagesplit")])
    lines = capsys.readouterr().err.splitlines()
    errors = [line for line in lines if not line.startswith("pva_export: read ")]   # progress lines may come first
    assert code == 2 and errors == lines[-1:]
    assert errors[0].startswith("pva_export: error: " + message.format(**names)), errors
    assert not (tmp_path / "out.stagesplit").exists()


def test_libpva_missing_says_how_to_get_it(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "pva", None)
    (tmp_path / "profile.pop").write_bytes(b"x")
    assert pva_export.main([str(tmp_path / "profile.pop"), "-o", str(tmp_path / "m.stagesplit")]) == 2
    err = capsys.readouterr().err
    assert "cannot import libpva" in err and "source <sdk>/enable.sh" in err and len(err.splitlines()) == 1


# --------------------------------------------------------------------------------------------------
# The standard-library CBOR decoder against cbor2

# the empty list and mapping are leaves, so that every draw of ``extend`` draws ``inner`` (hypothesis warns,
# as an error, when a run of draws never does)
cbor_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**64, 2**64 - 1) | st.text() | st.binary()
    | st.floats(allow_nan=False) | st.just([]) | st.just({}),
    lambda inner: st.lists(inner, min_size=1, max_size=5) | st.dictionaries(st.text(max_size=6) | st.integers(-5, 5),
                                                                            inner, min_size=1, max_size=5),
    max_leaves=25)


@settings(max_examples=200, deadline=None)
@given(cbor_values, st.booleans())
def test_decoder_agrees_with_cbor2(value, canonical):
    data = cbor2.dumps(value, canonical=canonical)
    decoded = pva_export.decode_cbor(data)
    assert decoded == cbor2.loads(data) == value
    assert type(decoded) is type(value)


@pytest.mark.parametrize("data, value", [
    (b"\x9f\x01\x82\x02\x03\xff", [1, [2, 3]]),                          # indefinite array
    (b"\xbf\x61a\x01\x61b\x9f\xff\xff", {"a": 1, "b": []}),              # indefinite map
    (b"\x7f\x62ab\x61c\xff", "abc"),                                       # indefinite text
    (b"\x5f\x41\x01\x42\x02\x03\xff", b"\x01\x02\x03"),                    # indefinite bytes
    (b"\xf9\x3c\x00", 1.0), (b"\xfa\x47\xc3\x50\x00", 100000.0), (b"\xf9\x7c\x00", math.inf),
])
def test_decoder_reads_what_cbor2_reads(data, value):
    assert pva_export.decode_cbor(data) == cbor2.loads(data) == value


def test_decoder_gives_the_item_of_a_tag_and_none_for_undefined():
    tagged = b"\xd9\x10\x92\x82\x01\x02"                     # tag 4242, which cbor2 does not interpret
    assert list(cbor2.loads(tagged).value) == pva_export.decode_cbor(tagged) == [1, 2]
    assert cbor2.loads(b"\xf7") is cbor2.undefined and pva_export.decode_cbor(b"\xf7") is None


@pytest.mark.parametrize("data, error", [
    (b"\xff", pva_export.CborError), (b"\x1c", pva_export.CborError), (b"\x82\x01", pva_export.CborEOF),
    (b"\x62\xff\xfe", pva_export.CborError), (b"\x9f\x01", pva_export.CborEOF), (b"", pva_export.CborEOF),
])
def test_decoder_refuses_what_cbor2_refuses(data, error):
    with pytest.raises(error):
        pva_export.decode_cbor(data)
    with pytest.raises(cbor2.CBORDecodeError):
        cbor2.loads(data)


def test_decoder_refuses_trailing_data_and_deep_nesting():
    with pytest.raises(pva_export.CborError, match="more data after the first CBOR object"):
        pva_export.decode_cbor(b"\x01\x02")
    with pytest.raises(pva_export.CborError, match="nested more than 200 deep"):
        pva_export.decode_cbor(b"\x81" * 300 + b"\x01")
    assert pva_export.decode_cbor(b"\x81" * 150 + b"\x01") == cbor2.loads(b"\x81" * 150 + b"\x01")


@pytest.mark.parametrize("intern", [False, True])
@pytest.mark.parametrize("order", ["table first", "contexts first"])
def test_debug_records_agree_with_the_cbor2_reader(pva, tmp_path, intern, order):
    path = pva.write_debug_cbor(tmp_path / "debug.cbor", DEBUG_CONTEXTS + [{"name": "x", "layer": "onnx",
                                                                            "opName": "o", "parentId": -1}],
                                intern_all=intern)
    if order == "contexts first":
        doc = cbor2.loads(path.read_bytes())
        path.write_bytes(cbor2.dumps({"contexts": doc["contexts"], "stringTable": doc["stringTable"]}))
    with path.open("rb") as stream:
        records = pva_export.read_debug_records(stream)
    expected = [tuple(getattr(r, f) for f in pva_export.CONTEXT_FIELDS) for r in read_debug_cbor(path).contexts]
    assert records == expected and len(records) == 5


def test_every_truncated_debug_file_is_truncated(pva, tmp_path):
    whole = pva.write_debug_cbor(tmp_path / "debug.cbor", DEBUG_CONTEXTS).read_bytes()
    for cut in range(len(whole)):
        with pytest.raises(pva_export.CborEOF):
            pva_export.read_debug_records(io.BytesIO(whole[:cut]))


# --------------------------------------------------------------------------------------------------
# The compact format's one description

def test_every_array_a_profile_writes_is_described(synthetic):
    from stagesplit.io.compact import profile_to_arrays
    arrays = profile_to_arrays(synthetic["bert-base"])
    columns = [pva_export.column_for(name) for name in arrays]
    assert all(c is not None for c in columns)
    order = [pva_export.COLUMNS.index(c) for c in columns]
    assert order == sorted(order)                       # written in the format's order
    for name, column in zip(arrays, columns):
        assert arrays[name].dtype.kind == pva_export.KIND_LETTER[column.kind] and arrays[name].ndim == column.ndim


@pytest.mark.parametrize("descr, shape", [("<i8", (3,)), ("|i1", (0,)), ("<i2", (2, 2)), ("|b1", (7,)),
                                          ("<f8", (10**12,)), ("|u1", (5,)), ("<i4", (0, 0))])
def test_npy_header_is_numpys(descr, shape):
    import numpy as np
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": descr, "fortran_order": False, "shape": shape})
    padded = io.BytesIO()
    np.save(padded, np.zeros(shape if math.prod(shape) < 100 else (1,), descr))
    assert pva_export.npy_header(descr, shape)[:10] == padded.getvalue()[:8] + pva_export.npy_header(descr,
                                                                                                     shape)[8:10]
    if math.prod(shape) < 100:
        assert padded.getvalue().startswith(pva_export.npy_header(descr, shape))


def test_writer_keeps_the_format_order_and_required_arrays(tmp_path):
    with open(tmp_path / "x.zip", "w+b") as handle:
        writer = pva_export.CompactWriter(handle)
        with pytest.raises(ValueError, match="not an array of the compact format"):
            writer.values("weights", [1])
        writer.strings("steps", ["a"])
        with pytest.raises(ValueError, match="written after steps_offsets"):
            writer.raw_bytes("header", b"{}")
        with pytest.raises(ValueError, match="needs the arrays header, names_blob"):
            writer.close()
