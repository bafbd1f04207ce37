"""docs/model-and-solver.md: every ``console`` example runs and prints what the page says it prints.

The blocks run in order from the repository root, through the command line's ``main`` (stdout,
then stderr). A line ``...`` stands for any number of lines, and a time (``0.00 s``) matches any
time, so the page can show real output.
"""

from __future__ import annotations

import re
import shlex

from helpers import ROOT
from stagesplit.cli import main

DOC = ROOT / "docs" / "model-and-solver.md"
SECONDS = re.compile(r"\b\d+\.\d\d s\b")


def examples() -> list[tuple[str, list[str]]]:
    out = []
    for block in re.findall(r"```console\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S):
        for chunk in re.split(r"^(?=\$ )", block, flags=re.M):
            if chunk.strip():
                command, *expected = chunk.rstrip("\n").split("\n")
                out.append((command, expected))
    return out


def matches(expected: list[str], got: list[str]) -> bool:
    if not expected:
        return not got
    if expected[0] == "...":
        return any(matches(expected[1:], got[i:]) for i in range(len(got) + 1))
    same = bool(got) and SECONDS.sub("#.## s", got[0]) == SECONDS.sub("#.## s", expected[0])
    return same and matches(expected[1:], got[1:])


def test_every_example_prints_what_the_page_says(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    commands = examples()
    assert len(commands) >= 4 and all(c.startswith("$ stagesplit solve ") for c, _ in commands)
    for command, expected in commands:
        main(shlex.split(command)[2:])
        out, err = capsys.readouterr()
        got = (out + err).rstrip("\n").split("\n")
        assert matches(expected, got), f"{command}\n--- got:\n" + "\n".join(got)
