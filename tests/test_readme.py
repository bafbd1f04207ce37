"""The README and the docs as a manual: their Python runs and prints what they say, the README's
test command is what CI runs, the README names what a user looks for, and every file and link
the pages name exists.

The python blocks of README.md and docs/python-api.md run in order, one namespace per page, from a
temporary folder holding ``profiles/`` and ``examples/`` (links to the checkout's). Each
``# -> text`` line is a line printed by the block; every printed line must be claimed by one, in
order. (The console examples are tests/test_docs_commands.py's.)
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PYTHON_PAGES = ("README.md", "docs/python-api.md")
PAGES = ("README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")))


def python_blocks(page: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / page).read_text(encoding="utf-8"), flags=re.S)


def expected_output(block: str) -> list[str]:
    return [line.split("# -> ", 1)[1] for line in block.splitlines() if line.lstrip().startswith("# -> ")]


def section(text: str, heading: str) -> str:
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + len(heading) + 2)
    return text[start:end if end >= 0 else len(text)]


def test_the_python_pages_have_code_with_claimed_output():
    for page in PYTHON_PAGES:
        blocks = python_blocks(page)
        assert blocks, page
        assert all(expected_output(b) for b in blocks), page


@pytest.mark.slow
@pytest.mark.parametrize("page", PYTHON_PAGES)
def test_python_blocks_run_and_print_what_they_say(page, tmp_path, monkeypatch):
    blocks = python_blocks(page)
    if any("stagesplit.capture(" in b for b in blocks):
        pytest.importorskip("torch", reason="the page captures a PyTorch model (the torch extra)")
    for name in ("profiles", "examples"):          # copies, not links: a plan's recorded path through a link that
        shutil.copytree(ROOT / name, tmp_path / name)  # leaves the folder is refused (docs/safety.md)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "docs"}
    for i, block in enumerate(blocks):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(block, f"{page} python block {i + 1}", "exec"), namespace)   # noqa: S102 - our own docs
        assert out.getvalue().splitlines() == expected_output(block), f"{page}: block {i + 1}"


# -- the README's two commands -------------------------------------------------------------------

def two_commands() -> list[str]:
    return re.findall(r"```sh\n(.*?)\n```", section(README.read_text(encoding="utf-8"), "## The two commands"),
                      flags=re.S)


def test_the_readmes_test_command_is_what_ci_runs():
    main, tests = two_commands()
    ci = [line for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
          if line and not line.startswith("#") and not line.startswith(("set ", "cd "))]
    assert ci == [tests]
    words = shlex.split(tests)
    assert words[:4] == ["apt-get", "install", "-y", "chromium"]      # the HTML report's browser test
    # the whole suite: everything but the timed tests on both cores, then the timed tests alone
    assert tests.endswith(".venv/bin/python -m pytest -q -n 2 -m 'not timed' && .venv/bin/python -m pytest -q -m timed")
    assert "'.[test,torch,onnx]'" in tests


@pytest.mark.slow
def test_the_two_runs_of_the_test_command_cover_the_whole_suite_and_the_timed_tests_run_alone():
    """``-m 'not timed'`` and ``-m timed`` partition the suite (nothing falls between them), the timed
    tests are the step-time comparisons (slow, so never in the quick loop), and one of them put beside
    another worker fails at once (conftest.py) rather than measure that worker."""
    import json
    import os
    import subprocess
    import sys

    # pytest's own selection of each expression, the four collections in one process (the test modules
    # imported once: four processes took 20 s of the suite)
    code = ("import json, sys, pytest\n"
            "class Selected:\n"
            "    def pytest_collection_finish(self, session):\n"
            "        self.ids = sorted(item.nodeid for item in session.items)\n"
            "found = []\n"
            "for marks in (['-m', 'timed'], ['-m', 'not timed'], ['-m', 'slow'], []):\n"
            "    plugin = Selected()\n"
            "    pytest.main(['--collect-only', '-q', '-p', 'no:cacheprovider', *marks, 'tests/plan'], plugins=[plugin])\n"
            "    found.append(plugin.ids)\n"
            "print('SELECTED', json.dumps(found))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False).stdout
    timed, not_timed, slow, every = (set(ids) for ids in json.loads(out.split("SELECTED ", 1)[1]))
    assert len(every) > 100 and all("::" in t for t in every)
    assert {t.split("::")[0] for t in timed} == {"tests/plan/test_steptime_real.py", "tests/plan/test_steptime_layouts.py"}
    assert not timed & not_timed
    assert timed <= slow
    assert timed | not_timed == every
    # as an xdist worker beside another (xdist sets the count): failed before the test's body runs
    beside = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "timed",
                             "tests/plan/test_steptime_real.py"], cwd=ROOT, capture_output=True, text=True, check=False,
                            env={**os.environ, "PYTEST_XDIST_WORKER_COUNT": "2"}, timeout=300)
    assert beside.returncode == 1 and "runs alone, not beside other pytest workers" in beside.stdout, beside.stdout
    assert "1 error" in beside.stdout and " passed" not in beside.stdout


def test_the_readmes_first_command_is_the_one_its_annotated_output_shows():
    main, _ = two_commands()
    assert main.startswith("python3.11 -m venv .venv && .venv/bin/pip install -q . && ")
    command = main.split(" && ")[-1].replace(".venv/bin/stagesplit", "stagesplit", 1)
    assert f"\n$ {command}\n" in section(README.read_text(encoding="utf-8"), "## Reading the output")


# -- what a user looks for -----------------------------------------------------------------------

def test_the_readme_names_what_a_user_looks_for():
    text = README.read_text(encoding="utf-8")
    for words in ("stagesplit report", "plan.report()", "plan.plot()", "--wide", "breakdown model.stagesplit "
                  "--sections all", "2**30", "pip install '.[torch]'", "python examples/make_gpt_onnx.py -o gpt.onnx",
                  "--chunks-per-rank", "--recompute auto|none|selective|full", "--time-limit", "bounds the whole search",
                  "Megatron's even layout", "PopLiner's greedy", "torchtitan's default split"):
        assert words in text, words


def test_the_readme_lists_every_schedule_and_recompute_mode_the_solver_takes():
    from stagesplit.solver.request import RecomputeMode, Schedule
    text = README.read_text(encoding="utf-8")
    for schedule in Schedule:
        assert f"`{schedule.value}`" in text, schedule
    assert "--recompute " + "|".join(mode.value for mode in RecomputeMode) in text


def test_the_readme_has_one_line_per_command_linking_its_section():
    from stagesplit.cli.parser import build_parser
    commands = build_parser()._subparsers._group_actions[0].choices                # argparse's own list
    lines = section(README.read_text(encoding="utf-8"), "## Commands").splitlines()
    for name in commands:
        ours = [line for line in lines if line.startswith(f"- [`stagesplit {name}`](docs/commands.md#{name})")]
        assert len(ours) == 1, name


# -- files and links ---------------------------------------------------------------------------

_PATH = re.compile(r"\b((?:stagesplit|tests|benchmarks|examples|configs|profiles)/[\w./-]*\w)")
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {slug(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def test_the_slug_is_githubs():
    assert slug("The search within `--time-limit`") == "the-search-within---time-limit"
    assert slug("bench_capture.py") == "bench_capturepy"
    assert slug("IPU: PopTorch, PopART, TensorFlow") == "ipu-poptorch-popart-tensorflow"


@pytest.mark.parametrize("page", PAGES)
def test_every_file_the_page_names_exists(page):
    text = (ROOT / page).read_text(encoding="utf-8")
    missing = []
    for path in set(_PATH.findall(text)):
        if path.startswith("stagesplit/") and "." not in Path(path).name and not (ROOT / path).exists():
            continue                                   # a module path written with slashes, not a file
        if not (ROOT / path).exists() and not (ROOT / path).with_suffix("").exists():
            missing.append(path)
    assert not missing, f"{page} names files that are not in the checkout: {sorted(missing)}"


@pytest.mark.parametrize("page", PAGES)
def test_every_link_to_a_page_and_heading_exists(page):
    here = (ROOT / page).parent
    text = (ROOT / page).read_text(encoding="utf-8")
    broken = []
    for target in _LINK.findall(text):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        file = (here / path).resolve() if path else ROOT / page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(target)
    assert not broken, f"{page}: broken links {broken}"
