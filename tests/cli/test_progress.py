"""Progress in a real pseudo-terminal: one live line per phase on stderr, cleared when the phase
ends, so the README's first command leaves nothing glued to its output; off when stderr is not a
terminal, plain lines with --progress; every phase names itself and what it counts."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stagesplit.reporting.progress import Progress
from terminal import normalise, run_in_terminal, screen

ROOT = Path(__file__).resolve().parents[2]
BERT = ROOT / "profiles" / "bert-base.stagesplit"


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pseudo-terminals as Linux has them")
def test_the_readmes_first_command_in_a_terminal_leaves_no_progress_behind(tmp_path):
    argv = ["solve", str(BERT), "--devices", "4", "--compare", "--plot", "bert-base-4.png"]
    code, raw = run_in_terminal(argv, tmp_path, columns=300)      # wide enough that no table is fitted
    assert code == 0
    shown = screen(raw, 300)
    # the same command off a terminal prints no progress: the screen must equal its output
    plain = subprocess.run([sys.executable, "-m", "stagesplit", *argv], cwd=tmp_path, capture_output=True, text=True,
                           env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=300)
    assert plain.returncode == 0 and plain.stderr == "wrote bert-base-4.png\n"
    # (the solver's wall time in the status line differs from run to run)
    assert normalise(shown) == normalise(["wrote bert-base-4.png"] + plain.stdout.splitlines())
    # progress was drawn while it ran (and then cleared): each phase by name
    for phase in ("reading", "grouping 404 operations into layers", "building the cost model",
                  "pricing the ranges of 12 layers that can fit a device", "solving"):
        assert phase in raw, phase
    assert "\x1b[2K" in raw


def test_progress_is_off_when_stderr_is_not_a_terminal():
    stream = io.StringIO()
    p = Progress(stream=stream)
    p.start("pricing", "layer ranges")
    p.update(5, 10)
    p.done()
    assert stream.getvalue() == "" and not p.enabled


def test_forced_progress_off_a_terminal_prints_one_line_per_phase_with_its_unit():
    stream = io.StringIO()
    p = Progress(enabled=True, stream=stream)
    p.start("solving", "device counts")
    p.update(3, 16)
    p.start("writing plan.json")                     # a new phase ends the one before
    p.done()
    p.start("pricing 78 layer ranges")
    p.update(1, 8)
    p.done("ok")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3
    assert re.fullmatch(r"solving: done in \d+\.\d s, 3/16 device counts", lines[0])
    assert re.fullmatch(r"writing plan\.json: done in \d+\.\d s", lines[1])
    assert re.fullmatch(r"pricing 78 layer ranges: done in \d+\.\d s, 12% - ok", lines[2])


def test_the_progress_flag_reaches_stderr(capsys, tmp_path):
    from stagesplit.cli import main
    assert main(["solve", str(BERT), "--devices", "4", "--progress"]) == 0
    err = capsys.readouterr().err.splitlines()
    names = [line.split(": done in")[0] for line in err]
    assert names[:4] == [f"reading {BERT}", "grouping 404 operations into layers",
                         "building the cost model (12 layers, 123,954 variables)",
                         "pricing the ranges of 12 layers that can fit a device"]
    assert all(": done in " in line for line in err)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pseudo-terminals as Linux has them")
@pytest.mark.parametrize("argv, columns", [
    (["solve", str(BERT), "--devices", "4", "--compare"], 80),
    (["breakdown", str(ROOT / "profiles" / "llama-7b-layers.json")], 80),
])
def test_tables_fit_an_80_column_terminal(tmp_path, argv, columns):
    """Every table line fits; what was left out is named; plain sentences wrap as the terminal
    wraps them."""
    code, raw = run_in_terminal(argv, tmp_path, columns=columns)
    assert code == 0
    lines = screen(raw, 1000)
    rule = [i for i, line in enumerate(lines) if line and set(line) <= {"-", " "} and "--" in line]
    assert rule, "no table"
    for i in rule:                                    # each table: its header, rule and rows
        gaps = [k for k in range(len(lines[i]) - 1) if lines[i][k:k + 2] == "  "]

        def is_row(line: str) -> bool:                # blank where the rule has its gaps (a note is prose)
            return bool(line) and all(k >= len(line) or line[k] == " " for k in gaps)  # noqa: B023 (this iteration's)

        end = next((j for j in range(i + 1, len(lines)) if not is_row(lines[j])), len(lines))
        assert end > i + 1
        assert all(len(line) < columns for line in lines[i - 1:end]), lines[i - 1:end]
    if argv[0] == "solve":
        assert any(line.startswith("(") and "left out to fit 79 characters" in line and line.endswith(
            "--wide shows them)") for line in lines)
