"""Untrusted names never become code (#18): the ONNX node-name payload through import, solve
and every export; quotes and line breaks in module paths; ``--model class``; and a property
test with names drawn from all of Unicode.

For every format, an export either refuses in one line or writes text that (Python) parses,
whose ``#`` lines are each one comment token, whose statements are exactly those of the same
plan with harmless names, and whose executed definitions (stand-in framework modules in
``sys.modules``) create no file; (argument files) splits into the same words under ``shlex``
and under bash, creating no file; (JSON) loads back to the plan's names.
"""

from __future__ import annotations

import ast
import io
import json
import os
import shlex
import subprocess
import tokenize
from pathlib import Path

import pytest
from exporthelpers import PYTHON_FORMATS, ModuleRef, make_plan, run
from hypothesis import HealthCheck, given, settings, strategies as st
from standins import all_modules, installed

from stagesplit.errors import StagesplitError
from stagesplit.exporters import FORMATS, export_plan
from stagesplit.plan import read_plan, write_plan

PAYLOAD = "\"\nimport os; os.system('touch PWNED') #"


# -- what every written export must satisfy ------------------------------------------------------------

def _comment_lines_are_comments(text: str) -> None:
    """Every line starting with '#' is exactly one COMMENT token: nothing after it is code."""
    lines = text.split("\n")
    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    for number, line in enumerate(lines, 1):
        if not line.lstrip().startswith("#"):
            continue
        on_line = [t for t in tokens if t.start[0] <= number <= t.end[0]
                   and t.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                                      tokenize.ENDMARKER)]
        assert [t.type for t in on_line] == [tokenize.COMMENT] and on_line[0].string == line.lstrip(), line


class _Shape(ast.NodeTransformer):
    """Every constant the same: what is left is the program's shape (its statements, calls,
    names and the length of every literal list)."""

    def visit_Constant(self, node):
        return ast.Constant("C")


def _shape(text: str) -> str:
    return ast.dump(_Shape().visit(ast.parse(text)))


def _run_definitions(text: str, folder: Path, training: bool) -> None:
    """Execute the snippet's module-level code with stand-in frameworks, in an empty folder."""
    modules, _ = all_modules(training)
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        with installed(*modules):
            exec(compile(text, "export", "exec"), {"model": ModuleRef("model", [])})
    finally:
        os.chdir(cwd)
    assert list(folder.iterdir()) == []


def _bash_words(text: str, folder: Path) -> list[str]:
    """The argument file's words as bash reads them (each argument line run as printf's
    arguments, comments as comments), in an empty folder."""
    script = "\n".join(line if line.lstrip().startswith("#") or not line.strip() else "printf '%s\\0' " + line
                       for line in text.split("\n"))
    out = subprocess.run(["bash", "-c", script], cwd=folder, capture_output=True, check=True).stdout
    assert list(folder.iterdir()) == []
    return [w.decode("utf-8", "surrogateescape") for w in out.split(b"\0")[:-1]]


def check_export(text: str, fmt: str, folder: Path, training: bool = True, benign: str | None = None) -> None:
    """What every export must satisfy, whatever names the plan holds (see the module docstring)."""
    spec = FORMATS[fmt]
    text.encode("utf-8")                                              # writable as UTF-8
    if spec.language == "python":
        ast.parse(text)
        _comment_lines_are_comments(text)
        if benign is not None:
            assert _shape(text) == _shape(benign)                   # names changed literals only, no code
        _run_definitions(text, folder, training)
    elif spec.language == "args":
        words = shlex.split(text, comments=True)
        assert _bash_words(text, folder) == words
        if benign is not None:
            assert len(words) == len(shlex.split(benign, comments=True))
    else:
        json.loads(text)


# -- the payload of #18, through import, solve and export ---------------------------------------------

@pytest.fixture(scope="module")
def payload_plan(tmp_path_factory):
    """An ONNX model whose node names and file name hold the payload, imported and solved with a
    layer regex that keeps the payload in the layer names and module paths."""
    onnx = pytest.importorskip("onnx")
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    folder = tmp_path_factory.mktemp("payload")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    weights = [numpy_helper.from_array(np.ones((8, 8), np.float32), f"w{i}") for i in range(4)]
    nodes, prev = [], "x"
    for i in range(4):
        out = "y" if i == 3 else f"h{i}"
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [out], name=f"/m/blk{i}{PAYLOAD}/MatMul"))
        prev = out
    model = helper.make_model(helper.make_graph(nodes, "payload" + PAYLOAD, [x], [y], weights),
                              opset_imports=[helper.make_opsetid("", 17)])
    onnx_path = folder / f"model{PAYLOAD.replace('/', '')}.onnx"
    onnx.save(model, str(onnx_path))
    profile = folder / f"profile{PAYLOAD}.stagesplit"
    from stagesplit.cli import main
    assert main(["import", str(onnx_path), "--target", "a100-80gb", "-o", str(profile)]) == 0
    assert main(["solve", str(profile), "--devices", "2", "--layer-regex", r"(?s)blk(\d[^/]*)",
                 "--out", str(folder / "plan.json")]) == 0
    plan = read_plan(folder / "plan.json")
    assert all(PAYLOAD in name for name in plan.layer_names) and all(PAYLOAD in p for p in plan.module_paths)
    assert PAYLOAD in plan.profile.path
    return folder / "plan.json"


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_onnx_node_name_payload_never_runs(capsys, tmp_path, payload_plan, fmt):
    out_file = tmp_path / f"export.{fmt}"
    code, out, err = run(capsys, "export", payload_plan, "--to", fmt, "-o", out_file)
    work = tmp_path / "work"
    work.mkdir()
    if FORMATS[fmt].needs_module_paths:                               # the payload is no dotted Python path
        assert (code, out) == (2, "") and len(err.strip().splitlines()) == 1 and not out_file.exists()
        assert err.startswith(f"stagesplit: error: {payload_plan}: {fmt}: layer '") and \
            "\\nimport os; os.system('touch PWNED') #' has the module path" in err and \
            "which is not a dotted Python path" in err, err
        return
    assert code == 0, err
    text = out_file.read_text(encoding="utf-8")
    check_export(text, fmt, work)
    if FORMATS[fmt].language != "json":
        assert "\\nimport os; os.system('touch PWNED') #" in text   # the names are there, escaped
    if FORMATS[fmt].language == "args":                              # the vector: bash args.txt
        subprocess.run(["bash", str(out_file)], cwd=work, capture_output=True)
        assert list(work.iterdir()) == []
    if FORMATS[fmt].language == "python":
        subprocess.run(["python3", "-c", "import sys; compile(open(sys.argv[1], 'rb').read(), 'x', 'exec')",
                        str(out_file)], check=True)                 # from bytes: honours any coding cookie


@pytest.mark.parametrize("path", ['blocks."x', 'blocks.1"]; import os; os.system("touch PWNED"); x = ["',
                                  "blocks.1\nimport os", "blocks.1\u2028x", "blocks.class", "blocks.__class__"])
def test_quotes_and_line_breaks_in_module_paths(capsys, tmp_path, path):
    """#18: a '"' in a module path ended torch-pipelining's string, a newline broke the file.
    Formats that address modules refuse the path in one line naming the layer; the others
    carry it only as escaped comment text or data."""
    names = ["0", "1", "2"]
    plan = make_plan(names, [0, 1], paths=["blocks.0", path, "blocks.2"], micro_batches=2)
    write_plan(plan, tmp_path / "p.json")
    for fmt in FORMATS:
        code, out, err = run(capsys, "export", tmp_path / "p.json", "--to", fmt)
        if FORMATS[fmt].needs_module_paths:
            assert (code, out) == (2, "")
            (line,) = err.strip().splitlines()
            assert line.startswith(f"stagesplit: error: {tmp_path / 'p.json'}: {fmt}: layer '1' has the module path ")
            assert "which is not a dotted Python path" in line
        else:
            assert code == 0, err
            work = tmp_path / fmt
            work.mkdir()
            check_export(out, fmt, work)


def test_model_class_is_refused(capsys, tmp_path):
    """#18: ``export --to poptorch --model class`` wrote ``class.layer0 = ...`` (exit 0)."""
    write_plan(make_plan(["0", "1"], [0, 1], paths=["layer0", "layer1"]), tmp_path / "p.json")
    code, out, err = run(capsys, "export", tmp_path / "p.json", "--to", "poptorch", "--model", "class")
    assert (code, out) == (2, "")
    assert err.strip().splitlines() == ["stagesplit: error: --model: expected a dotted Python name such as model or "
                                        "self.net (keywords refused), got 'class'"]


def test_a_coding_cookie_in_a_name_cannot_reach_the_first_two_lines(tmp_path):
    """Python reads a ``coding:`` cookie from lines 1 and 2; the header's first two lines are
    fixed text, so a profile named ``-*- coding: utf-7 -*-`` stays a comment."""
    plan = make_plan(["0", "1"], [0, 1], paths=["a.b", "a.c"],
                     profile={"name": "-*- coding: utf-7 -*-", "path": "+AAo-import os", "target": "x"})
    for fmt in PYTHON_FORMATS:
        text = export_plan(plan, fmt)
        assert tokenize.detect_encoding(io.BytesIO(text.encode()).readline)[0] == "utf-8"
        assert "coding" not in "".join(text.split("\n")[:2])


# -- the property test ------------------------------------------------------------------------------------

SPECIAL = ["\n", "\r", "\r\n", "\u2028", "\u2029", "\x85", "\0", '"', "'", "\\", "\udc80", "\ud800", "#", "'''",
           '"""', "\x1b", "\u202e", " ", "import os", "os.system('touch PWNED')", "-*- coding: utf-7 -*-", "$(touch X)",
           "`touch X`", ";", "|", "*"]
unicode_text = st.text(st.characters(exclude_categories=()), max_size=12)
hostile = st.lists(st.one_of(unicode_text, st.sampled_from(SPECIAL)), min_size=0, max_size=4).map("".join)
valid_path = st.sampled_from(["blocks", "model.layers", "h", "bert/encoder/layer"])


@st.composite
def hostile_plans(draw):
    n = draw(st.integers(1, 5))
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=n - 1))) if n > 1 else []
    raw = [draw(hostile) for _ in range(n)]
    names = [f"{i}{r}" for i, r in enumerate(raw)]                   # unique, as a plan's layer names are
    paths = [draw(st.one_of(hostile, valid_path.map(lambda p, i=i: f"{p}.{i}"))) for i in range(n)]
    profile = {"name": draw(hostile), "path": draw(hostile), "sha256": draw(hostile), "target": draw(hostile)}
    plan = make_plan(names, [0] + cuts, paths=paths, profile=profile, micro_batches=n,
                     schedule=draw(st.sampled_from(["none", "gpipe", "1f1b"])))
    benign = make_plan([str(i) for i in range(n)], [0] + cuts, paths=paths, micro_batches=n,
                       schedule=plan.inputs.schedule)
    return plan, benign


@given(hostile_plans(), st.booleans())
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_unicode_name_gives_a_one_line_refusal_or_harmless_text(tmp_path, case, training):
    plan, benign_plan = case
    for fmt in FORMATS:
        folder = tmp_path / f"{fmt}-{os.urandom(4).hex()}"
        folder.mkdir()
        try:
            text = export_plan(plan, fmt, training=training, source=tmp_path / "p\nq.json")
        except StagesplitError as exc:
            assert "\n" not in str(exc) and "\r" not in str(exc)
            continue
        try:                                                         # the same plan with harmless names
            benign = export_plan(benign_plan, fmt, training=training)
        except StagesplitError:                                      # (names can decide the embedding/head roles)
            benign = None
        check_export(text, fmt, folder, training, benign)
