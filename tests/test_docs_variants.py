"""docs/ipu.md's section on profile variants: its ```console examples run and print what the page
shows.

The commands (``$ `` lines) run in order in one temporary folder holding links to the checkout's
``profiles/`` and ``examples/``, with stdout and stderr in one pipe (not a terminal: no progress
lines, tables not fitted to a width). Durations ("0.00 s") and SHA-256 hashes are compared as
placeholders. ``python tests/test_docs_variants.py --write`` rewrites the section's outputs from a
run (then read the diff).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "ipu.md"
HEADING = "## 5. Profile variants: a memory proportion per IPU"
_BLOCK = re.compile(r"```console\n(.*?)```", re.S)


def section(text: str) -> str:
    assert HEADING in text, f"docs/ipu.md has no section '{HEADING}'"
    return text.split(HEADING, 1)[1].split("\n## ", 1)[0]


def examples(text: str) -> list[tuple[str, list[str]]]:
    """(command, the output lines shown under it) of every console block of the section."""
    out: list[tuple[str, list[str]]] = []
    for body in _BLOCK.findall(section(text)):
        for line in body.rstrip("\n").split("\n"):
            if line.startswith("$ "):
                out.append((line[2:], []))
            else:
                assert out, f"docs/ipu.md: output before any command: {line!r}"
                out[-1][1].append(line)
    return out


def run(command: str, folder: Path) -> list[str]:
    words = shlex.split(command)
    argv = {"stagesplit": [sys.executable, "-m", "stagesplit"], "python": [sys.executable]}[words[0]] + words[1:]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), "COLUMNS": "100"}
    done = subprocess.run(argv, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=300)
    return done.stdout.rstrip("\n").split("\n") if done.stdout.strip() else []


def normalise(lines: list[str]) -> list[str]:
    return [re.sub(r"\b\d+\.\d\d s\b", "<seconds>", re.sub(r"\b[0-9a-f]{64}\b", "<sha256>", line)).rstrip()
            for line in lines]


def prepare(folder: Path) -> None:
    for name in ("profiles", "examples"):
        (folder / name).symlink_to(ROOT / name, target_is_directory=True)


def test_the_variants_section_shows_a_solve_and_an_export_with_their_output():
    shown = examples(PAGE.read_text(encoding="utf-8"))
    commands = [c for c, _ in shown]
    assert any(c.startswith("stagesplit solve") and "=0.2" in c for c in commands)
    assert any(c.startswith("stagesplit solve") and c.split()[2].endswith(".yaml") for c in commands)
    assert any(c.startswith("stagesplit export") for c in commands)
    assert all(lines for _, lines in shown), "every example shows its output"


@pytest.mark.slow
def test_the_variants_section_prints_what_the_page_shows(tmp_path):
    prepare(tmp_path)
    shown = examples(PAGE.read_text(encoding="utf-8"))
    for command, lines in shown:
        assert normalise(run(command, tmp_path)) == normalise(lines), command


def write() -> None:
    """Rewrite the section's outputs from a run."""
    text = PAGE.read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory() as folder:
        prepare(Path(folder))
        head, rest = text.split(HEADING, 1)
        body, sep, tail = rest.partition("\n## ")

        def block(match: re.Match) -> str:
            lines = []
            for line in match.group(1).rstrip("\n").split("\n"):
                if line.startswith("$ "):
                    lines += [line] + run(line[2:], Path(folder))
            return "```console\n" + "\n".join(lines) + "\n```"
        body = _BLOCK.sub(block, body)
    PAGE.write_text(head + HEADING + body + sep + tail, encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write()
    else:
        print(__doc__)
