"""``stagesplit.exporters.render``: the one place untrusted text becomes generated code, and the
checks that refuse a rendered file that says anything but the plan."""

from __future__ import annotations

import ast
import shlex
import subprocess

import pytest
from exporthelpers import make_plan, plan_from
from hypothesis import given, settings, strategies as st

from stagesplit.errors import ExportError
from stagesplit.exporters import FORMATS, export_plan, render as R

HOSTILE = ["a\nb", "a\rb", "x\u2028y", "x\u2029y", "x\x85y", "nul\0", "q\"uote", "q'uote", "b\\ack", "\udc80",
           "\ud800x", "tab\tt", "\x1b[31m", "\u202eevil", "zero\u200bwidth", "é ü 中文", "#", "'''", '"""']


@pytest.mark.parametrize("text", HOSTILE)
def test_comment_text_is_one_printable_line(text):
    out = R.comment(text)
    assert "\n" not in out and "\r" not in out and len(out.splitlines()) <= 1
    assert all(ch.isprintable() and not 0xD800 <= ord(ch) <= 0xDFFF for ch in out)
    tree = R.check_python(f"# {out}\nx = 1\n")                    # still one comment, then code
    assert [type(n) for n in tree.body] == [ast.Assign]


@given(st.text(alphabet=st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF)))
@settings(max_examples=300, deadline=None)
def test_py_str_reads_back_to_the_same_string(text):
    literal = R.py_str(text)
    assert ast.literal_eval(literal) == text
    assert "\n" not in literal and "\r" not in literal


@given(st.text())
@settings(max_examples=200, deadline=None)
def test_shell_word_splits_back_to_the_same_word(text):
    word = R.shell_word(text)
    if "\0" in text:
        return                                                     # no shell word holds NUL (exports never write one)
    assert shlex.split(word) == [text]


@pytest.mark.parametrize("text, word", [("Et|t*3|tL", '"Et|t*3|tL"'), ("--num-layers", "--num-layers"),
                                        ("16", "16"), ("a b", '"a b"'), ("$(touch x)", "'$(touch x)'"),
                                        ("it's", '"it\'s"'), ("a\nb", "'a\nb'")])
def test_shell_word_quotes_only_what_needs_it(text, word):
    assert R.shell_word(text) == word


def test_shell_words_run_as_words_in_bash(tmp_path):
    words = ["$(touch PWNED)", "`touch PWNED`", "a;touch PWNED", "*", "it's", "Et|t*3|tL", "a\nb"]
    script = "printf '%s\\0' " + " ".join(R.shell_word(w) for w in words)
    out = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, check=True).stdout
    assert out.split(b"\0")[:-1] == [w.encode() for w in words]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("path, tokens", [("transformer.h.3", ["transformer", "h", 3]),
                                          ("bert/encoder/layer3", ["bert", "encoder", "layer3"]),
                                          ("model.layers.12", ["model", "layers", 12]), ("_orig_mod.h.0", ["_orig_mod", "h", 0])])
def test_module_paths_become_tokens(path, tokens):
    assert R.path_tokens(path) == tokens


@pytest.mark.parametrize("path", ["", "a..b", "h.03", "h.٣", "class.h", "h.def", "a-b", "a b", 'x"y', "x\ny",
                                  "__class__.h", "h.__init__", "ｍodel.h", "a.", ".a", "h.-1", "match.x"])
def test_bad_module_paths_are_refused(path):
    with pytest.raises(ValueError):
        R.path_tokens(path)


def test_python_path_and_fqn():
    assert R.python_path("model", "transformer.h.3") == "model.transformer.h[3]"
    assert R.python_path("self.net", "bert/encoder/layer3") == "self.net.bert.encoder.layer3"
    assert R.module_fqn("bert/encoder/layer3") == "bert.encoder.layer3"
    with pytest.raises(ValueError):
        R.python_path("class", "h.0")


@pytest.mark.parametrize("text, reason", [
    ("# a\nimport os\n# b\n", None),                               # fine: a comment line, code, a comment
    ('x = """\n# not a comment\n"""\n', "looks like a comment"),    # a '#' line inside a string
    ("# header\n# -*- coding: utf-7 -*-\nx = 1\n", "utf-7"),        # a coding cookie in line 2
    ("x = 1\rimport os\n", "carriage return"),
    ("x = (\n", "does not parse"),
    ("x = '\udc80'\n", "UTF-8"),
])
def test_check_python(text, reason):
    if reason is None:
        R.check_python(text)
    else:
        with pytest.raises(R.RenderCheckError, match=reason):
            R.check_python(text)


def test_join_lines_refuses_a_line_break_inside_a_line():
    assert R.join_lines(["# a", "x = 1"]) == "# a\nx = 1\n"
    with pytest.raises(R.RenderCheckError, match="line break"):
        R.join_lines(["# a\nimport os"])


def test_check_shell_reads_comments_and_words():
    assert R.check_shell('# c "unclosed\n--a "b c" # tail\n') == ["--a", "b c"]
    with pytest.raises(R.RenderCheckError, match="shell words"):
        R.check_shell('--a "unclosed\n')


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_a_renderer_that_writes_something_else_is_caught(fmt, monkeypatch):
    """The read-back compares the written text with the plan: a renderer that drops a layer,
    moves a split point or adds a stage raises, and nothing is returned."""
    plan = plan_from((6, {2, 4}), micro_batches=6)
    spec = FORMATS[fmt]
    good = export_plan(plan, fmt)

    def corrupt(view, options):
        lines = spec.render(view, options)
        text = "\n".join(lines)
        for old, new in [('"blocks.2"', '"blocks.3"'), ("blocks.h[2]", "blocks.h[3]"), ("blocks[2]", "blocks[3]"),
                         ('"2": 1', '"2": 0'), ('["2", "3"]', '["3"]'), ("[0, 2, 4, 6]", "[0, 3, 4, 6]"),
                         ("[2, 2, 2]", "[3, 1, 2]"), ("t*2|t*2|t*2L", "t*3|t|t*2L"), ("layers.1 layers.2",
                                                                                    "layers.1,layers.2 "),
                         ('"layers": ["2", "3"]', '"layers": ["3"]'),
                         ("--pipeline-model-parallel-size 3", "--pipeline-model-parallel-size 2")]:
            if old in text:
                return text.replace(old, new, 1).split("\n")
        raise AssertionError(f"no corruption applies to {fmt}")

    patched = spec.__class__(**{**spec.__dict__, "render": corrupt})
    monkeypatch.setitem(FORMATS, fmt, patched)
    with pytest.raises(ExportError, match=rf"^{fmt}: internal check failed: .*nothing written$"):
        export_plan(plan, fmt)
    monkeypatch.setitem(FORMATS, fmt, spec)
    assert export_plan(plan, fmt) == good


def test_injected_code_after_a_comment_is_caught(monkeypatch):
    """A renderer bug that let a line break into a comment would make the rest of the line code:
    the line check refuses it before anything is returned."""
    plan = make_plan(["0", "1"], [0, 1])
    spec = FORMATS["popart"]

    def leaky(view, options):
        return ["# layer 0\nimport os", *spec.render(view, options)]

    monkeypatch.setitem(FORMATS, "popart", spec.__class__(**{**spec.__dict__, "render": leaky}))
    with pytest.raises(ExportError, match="internal check failed: a rendered line holds a line break"):
        export_plan(plan, "popart")
