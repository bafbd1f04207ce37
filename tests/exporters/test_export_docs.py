"""docs/export.md: every ``console`` example runs and prints what the page says it prints.

The blocks run in order, in one temporary folder holding ``profiles/`` (a link to the shipped
samples), through the command line's ``main`` (stdout, then stderr). A line ``...`` stands for
any number of lines.
"""

from __future__ import annotations

import shlex

from exporthelpers import ROOT

from helpers import console_examples, lines_match
from stagesplit.cli import main

DOC = ROOT / "docs" / "export.md"


def examples() -> list[tuple[str, list[str]]]:
    """(command, expected output lines) for every ``$ stagesplit ...`` line of the page."""
    return console_examples(DOC)


def test_the_page_has_examples():
    commands = [c for c, _ in examples()]
    assert len(commands) >= 12 and all(c.startswith("$ stagesplit ") for c in commands)
    for fmt in ("poptorch", "popart", "tf-ipu", "optimum-ipu", "torch-pipelining", "deepspeed", "megatron",
                "megatron-uneven", "torchtitan", "json"):
        assert any(f"--to {fmt}" in c for c in commands), fmt
        assert f"\n## {fmt}\n" in DOC.read_text(encoding="utf-8"), fmt


def test_every_example_prints_what_the_page_says(tmp_path, monkeypatch, capsys):
    (tmp_path / "profiles").symlink_to(ROOT / "profiles", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    for command, expected in examples():
        main(shlex.split(command)[2:])
        out, err = capsys.readouterr()
        got = (out + err).rstrip("\n").split("\n")
        assert lines_match(expected, got), f"{command}\n--- got:\n" + "\n".join(got)
