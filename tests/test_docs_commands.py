"""The shell examples of the README and of docs/ run and print what the pages show.

Each ```console block holds commands (``$ `` lines) and their output. A page's blocks run in
order in one temporary folder holding links to the checkout's ``profiles/`` and ``examples/``,
each command on a pseudo-terminal 100 columns wide (what a person sees: tables fitted, progress
lines drawn and cleared), and the screen it leaves must match the block's output. Durations
("0.01 s") and hashes are compared as placeholders. On every page but docs/commands.md a line
``...`` stands for any number of lines, so a page can show the lines that matter; commands.md
shows every line. On a page listed with python blocks, each ```python block runs in the same
folder, in page order, in one namespace, and prints exactly its ``# ->`` lines (none if it has none).

Pages with their own test are not here: docs/export.md (tests/exporters/test_export_docs.py),
docs/model-and-solver.md (tests/plan/test_model_solver_docs.py), docs/safety.md
(tests/test_bad_input.py), the python of README.md and docs/python-api.md (tests/test_readme.py).

``python tests/test_docs_commands.py --write [PAGE]`` rewrites the outputs of docs/commands.md (or
of PAGE, every line: put the ``...`` back) from a run, then read the diff; ``python tests/test_docs_commands.py --show PAGE`` prints what each
example of PAGE prints today.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from terminal import normalise, run_in_terminal, screen  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "commands.md"
COLUMNS = 100
SECTIONS = ("solve", "sweep", "breakdown", "diagnose", "report", "export", "capture", "layouts", "import", "convert",
            "synth", "targets")
_BLOCK = re.compile(r"```(console|python)\n(.*?)```", re.S)
# a program other than stagesplit and python runs through this trampoline (run_in_terminal takes
# this interpreter's command lines)
_EXEC = "import os, sys; os.execvp(sys.argv[1], sys.argv[1:])"


def _ipu_report_files(folder: Path) -> None:
    """What a Poplar SDK run leaves (docs/ipu.md): empty here, enough for convert to look for libpva."""
    (folder / "report").mkdir()
    for name in ("profile.pop", "debug.cbor"):
        (folder / "report" / name).write_bytes(b"")


@dataclass(frozen=True)
class Page:
    path: str
    strict: bool = False                  # every output line shown: no "..." lines
    python: bool = False                  # its python blocks run too, in page order
    setup: Callable[[Path], None] | None = None


PAGES = (
    Page("docs/commands.md", strict=True),
    Page("README.md"),
    Page("docs/gpu.md", python=True),
    Page("docs/ipu.md", setup=_ipu_report_files),
    Page("docs/layouts.md"),
)


@dataclass
class Example:
    kind: str                             # "console" or "python"
    source: str                           # the command line, or the python code
    shown: list[str]                      # the output the page shows


def console_examples(body: str, where: str) -> list[Example]:
    out: list[Example] = []
    for line in body.rstrip("\n").split("\n"):
        if line.startswith("$ "):
            out.append(Example("console", line[2:], []))
        else:
            assert out, f"{where}: output before any command: {line!r}"
            out[-1].shown.append(line)
    return out


def claimed_output(code: str) -> list[str]:
    return [line.split("# -> ", 1)[1] for line in code.splitlines() if line.lstrip().startswith("# -> ")]


def page_examples(page: Page, text: str | None = None) -> list[Example]:
    """The page's examples in page order: every console command, and its python blocks where
    the page runs them."""
    text = (ROOT / page.path).read_text(encoding="utf-8") if text is None else text
    out: list[Example] = []
    for kind, body in _BLOCK.findall(text):
        body = textwrap.dedent(body)                  # a block inside a list item is indented
        if kind == "console":
            out += console_examples(body, page.path)
        elif page.python:
            out.append(Example("python", body, claimed_output(body)))
    return out


def examples(text: str) -> list[tuple[str, list[str]]]:
    """(command, the output lines shown under it) of every console block, in order."""
    return [(e.source, e.shown) for e in page_examples(PAGES[0], text) if e.kind == "console"]


def argv_of(command: str) -> list[str]:
    words = shlex.split(command)
    if words[0] == "stagesplit":
        return [sys.executable, "-m", "stagesplit", *words[1:]]
    if words[0] == "python":
        return [sys.executable, *words[1:]]
    if words[0] in ("cp", "mv", "rm", "ls"):
        return [sys.executable, "-c", _EXEC, *words]
    raise AssertionError(f"a command this test cannot run: {command}")


def run_example(command: str, folder: Path) -> list[str]:
    """The screen the command leaves."""
    _, raw = run_in_terminal(argv_of(command), folder, columns=COLUMNS)
    return screen(raw, COLUMNS)


def run_python(code: str, folder: Path, namespace: dict, where: str) -> list[str]:
    """What the block prints, run in ``folder``."""
    out = io.StringIO()
    before = Path.cwd()
    os.chdir(folder)
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, where, "exec"), namespace)   # noqa: S102 - our own documentation
    finally:
        os.chdir(before)
    return out.getvalue().splitlines()


def prepare(folder: Path, page: Page | None = None) -> None:
    for name in ("profiles", "examples"):
        (folder / name).symlink_to(ROOT / name, target_is_directory=True)
    if page is not None and page.setup is not None:
        page.setup(folder)


def placeholders(lines: list[str]) -> list[str]:
    """``normalise``, and the installed package's folder as ``.../site-packages/stagesplit``."""
    here = str(ROOT / "stagesplit")
    return normalise([line.replace(here, ".../site-packages/stagesplit") for line in lines])


def matches(shown: list[str], got: list[str]) -> bool:
    """``got`` against ``shown``, where a line ``...`` matches any run of lines."""
    if not shown:
        return not got
    if shown[0] == "...":
        return any(matches(shown[1:], got[i:]) for i in range(len(got) + 1))
    return bool(got) and got[0] == shown[0] and matches(shown[1:], got[1:])


def test_every_page_has_examples_this_test_can_run():
    for page in PAGES:
        found = page_examples(page)
        commands = [e.source for e in found if e.kind == "console"]
        assert commands, page.path
        for command in commands:
            argv_of(command)
        if page.strict:
            assert all(e.shown for e in found), f"{page.path}: every example shows its output"
            assert not any(line == "..." for e in found for line in e.shown), f"{page.path} shows every line"


def test_the_page_has_a_section_and_an_example_for_every_command():
    text = PAGE.read_text(encoding="utf-8")
    headings = re.findall(r"^## (\S+)$", text, flags=re.M)
    assert headings == list(SECTIONS)
    from stagesplit.cli.parser import build_parser
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices                  # argparse's own list
    assert set(SECTIONS) == set(commands)
    for name in SECTIONS:
        section = text.split(f"## {name}\n", 1)[1].split("\n## ", 1)[0]
        assert any(c.startswith(f"stagesplit {name}") for c, _ in examples(section)), name
    assert all(shown for _, shown in examples(text)), "every example shows its output"


def test_the_matcher_takes_dots_for_any_lines_and_nothing_else():
    assert matches(["a", "...", "d"], ["a", "b", "c", "d"])
    assert matches(["a", "..."], ["a"])
    assert not matches(["a", "...", "d"], ["a", "b", "c"])
    assert not matches(["a", "b"], ["a", "c"])
    assert not matches(["a"], ["a", "b"])


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pseudo-terminals as Linux has them")
@pytest.mark.parametrize("page", PAGES, ids=[p.path for p in PAGES])
def test_every_example_prints_what_the_page_shows(page, tmp_path):
    if page.path == "docs/gpu.md":
        pytest.importorskip("transformers", reason="docs/gpu.md captures Hugging Face models (the test extra)")
    if any(e.source.startswith(("stagesplit capture", "python examples/")) for e in page_examples(page)):
        pytest.importorskip("torch", reason="the page captures PyTorch models (the torch extra)")
    prepare(tmp_path, page)
    namespace: dict = {"__name__": "docs"}
    for example in page_examples(page):
        if example.kind == "console":
            got = run_example(example.source, tmp_path)
            where = f"{page.path}: $ {example.source}"
        else:
            got = run_python(example.source, tmp_path, namespace, page.path)
            where = f"{page.path}: python block\n{example.source}"
        shown = placeholders(example.shown)
        assert matches(shown, placeholders(got)), where + "\n--- got:\n" + "\n".join(got)


def write(path: str = "docs/commands.md") -> None:
    """Rewrite a page's console outputs from a run, every line of them (for the people writing
    it; on other pages than commands.md, put the ``...`` back where lines were left out)."""
    import tempfile
    page = next(p for p in PAGES if p.path == path)
    file = ROOT / page.path
    text = file.read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory() as folder:
        prepare(Path(folder), page)
        namespace: dict = {"__name__": "docs"}
        parts, last = [], 0
        for m in _BLOCK.finditer(text):
            body = textwrap.dedent(m.group(2))
            if m.group(1) == "python":
                if page.python:
                    run_python(body, Path(folder), namespace, page.path)
                continue
            indent = re.match(r"[ ]*", text[text.rfind("\n", 0, m.start()) + 1:]).group(0)
            lines = []
            for example in console_examples(body, page.path):
                lines += [f"$ {example.source}"] + run_example(example.source, Path(folder))
            parts.append(text[last:m.start()])
            parts.append("```console\n" + "".join(f"{indent}{line}\n" if line else "\n" for line in lines)
                         + f"{indent}```")
            last = m.end()
        parts.append(text[last:])
    file.write_text("".join(parts), encoding="utf-8")


def show(path: str) -> None:
    """Print what every example of the page prints today."""
    import tempfile
    page = next(p for p in PAGES if p.path == path)
    with tempfile.TemporaryDirectory() as folder:
        prepare(Path(folder), page)
        namespace: dict = {"__name__": "docs"}
        for example in page_examples(page):
            if example.kind == "console":
                print(f"$ {example.source}", *run_example(example.source, Path(folder)), sep="\n")
            else:
                print("--- python", *run_python(example.source, Path(folder), namespace, path), sep="\n")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--write"] and len(sys.argv) <= 3:
        write(*sys.argv[2:])
    elif sys.argv[1:2] == ["--show"] and len(sys.argv) == 3:
        show(sys.argv[2])
    else:
        sys.exit("usage: python tests/test_docs_commands.py --write [PAGE] | --show PAGE")
