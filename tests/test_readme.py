"""The README's "Using stagesplit from Python" section runs, and prints what it says it prints.

Its python blocks run in order in one namespace, from a temporary folder holding ``profiles/``
(a link to the shipped samples). Each ``# -> text`` line is the expected output of the
``print`` before it; every printed line must be claimed by one, in order.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SECTION = "## Using stagesplit from Python"


def python_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    section = text[start:end if end >= 0 else len(text)]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def expected_output(block: str) -> list[str]:
    return [line.split("# -> ", 1)[1] for line in block.splitlines() if line.lstrip().startswith("# -> ")]


def test_the_section_has_code_with_claimed_output():
    blocks = python_blocks()
    assert len(blocks) >= 2
    assert all(expected_output(b) for b in blocks)


@pytest.mark.slow
def test_readme_python_section_runs_and_prints_what_it_says(tmp_path, monkeypatch):
    (tmp_path / "profiles").symlink_to(ROOT / "profiles", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "readme"}
    for i, block in enumerate(python_blocks()):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(block, f"README.md python block {i + 1}", "exec"), namespace)   # noqa: S102 - our own README
        assert out.getvalue().splitlines() == expected_output(block), f"block {i + 1}"
    assert (tmp_path / "plan.json").is_file()
