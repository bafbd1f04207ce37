"""docs/model-and-solver.md: every ``console`` example runs and prints what the page says it prints.

The blocks run in order from the repository root, through the command line's ``main`` (stdout,
then stderr). A line ``...`` stands for any number of lines, and a time (``0.00 s``) matches any
time, so the page can show real output.
"""

from __future__ import annotations

import re
import shlex

from helpers import ROOT, console_examples, lines_match
from stagesplit.cli import main

DOC = ROOT / "docs" / "model-and-solver.md"
SECONDS = re.compile(r"\b\d+\.\d\d s\b")


def examples() -> list[tuple[str, list[str]]]:
    return console_examples(DOC)


def matches(expected: list[str], got: list[str]) -> bool:
    """As the page shows it, with solve times ("0.01 s") compared as placeholders."""
    return lines_match(expected, got, lambda want, line: SECONDS.sub("#.## s", line) == SECONDS.sub("#.## s", want))


def test_every_example_prints_what_the_page_says(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    commands = examples()
    assert len(commands) >= 4 and all(c.startswith("$ stagesplit solve ") for c, _ in commands)
    for command, expected in commands:
        main(shlex.split(command)[2:])
        out, err = capsys.readouterr()
        got = (out + err).rstrip("\n").split("\n")
        assert matches(expected, got), f"{command}\n--- got:\n" + "\n".join(got)
