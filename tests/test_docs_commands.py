"""docs/commands.md's shell examples run and print what the page shows.

Each ```console block holds commands (``$ `` lines) and their output. The blocks run in order in
one temporary folder holding links to the checkout's ``profiles/`` and ``examples/``, each
command on a pseudo-terminal 100 columns wide (what a person sees: tables fitted, progress
lines drawn and cleared), and the screen it leaves must equal the block's output. Durations
("0.01 s") and hashes are compared as placeholders. ``python tests/test_docs_commands.py
--write`` rewrites the page's outputs from a run (then read the diff).
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from terminal import normalise, run_in_terminal, screen  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "commands.md"
COLUMNS = 100
SECTIONS = ("solve", "sweep", "breakdown", "diagnose", "report", "export", "capture", "import", "convert", "synth",
            "targets")
_BLOCK = re.compile(r"```console\n(.*?)```", re.S)


def examples(text: str) -> list[tuple[str, list[str]]]:
    """(command, the output lines shown under it) of every console block, in order."""
    out: list[tuple[str, list[str]]] = []
    for body in _BLOCK.findall(text):
        for line in body.rstrip("\n").split("\n"):
            if line.startswith("$ "):
                out.append((line[2:], []))
            else:
                assert out, f"docs/commands.md: output before any command: {line!r}"
                out[-1][1].append(line)
    return out


def argv_of(command: str) -> list[str]:
    words = shlex.split(command)
    if words[0] == "stagesplit":
        return [sys.executable, "-m", "stagesplit", *words[1:]]
    if words[0] == "python":
        return [sys.executable, *words[1:]]
    raise AssertionError(f"docs/commands.md: a command this test cannot run: {command}")


def run_example(command: str, folder: Path) -> list[str]:
    """The screen the command leaves."""
    _, raw = run_in_terminal(argv_of(command), folder, columns=COLUMNS)
    return screen(raw, COLUMNS)


def prepare(folder: Path) -> None:
    for name in ("profiles", "examples"):
        (folder / name).symlink_to(ROOT / name, target_is_directory=True)


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


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pseudo-terminals as Linux has them")
def test_every_example_prints_what_the_page_shows(tmp_path):
    prepare(tmp_path)
    for command, shown in examples(PAGE.read_text(encoding="utf-8")):
        got = run_example(command, tmp_path)
        assert normalise(got) == normalise(shown), f"docs/commands.md: $ {command}"


def write(page: Path = PAGE) -> None:
    """Rewrite the page's outputs from a run (for the people writing it)."""
    import tempfile
    text = page.read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory() as folder:
        prepare(Path(folder))
        parts, last = [], 0
        for m in _BLOCK.finditer(text):
            lines = []
            for command, _ in examples(m.group(0)):
                lines += [f"$ {command}"] + run_example(command, Path(folder))
            parts.append(text[last:m.start()])
            parts.append("```console\n" + "\n".join(lines) + "\n```")
            last = m.end()
        parts.append(text[last:])
    page.write_text("".join(parts), encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write()
