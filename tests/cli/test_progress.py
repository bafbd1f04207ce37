"""Progress in a real pseudo-terminal: one live line per phase on stderr, cleared when the phase
ends, so the README's first command leaves nothing glued to its output; off when stderr is not a
terminal, plain lines with --progress; every phase names itself and what it counts."""

from __future__ import annotations

import io
import os
import re
import select
import subprocess
import sys
from pathlib import Path

import pytest

from stagesplit.common.progress import Progress

ROOT = Path(__file__).resolve().parents[2]
BERT = ROOT / "profiles" / "bert-base.stagesplit"


def screen(raw: str, width: int = 200) -> list[str]:
    """What a terminal shows after ``raw``: carriage returns, line feeds, 'erase line' and
    'cursor up' applied, colours and cursor visibility ignored (the codes rich writes)."""
    lines, row, col = [""], 0, 0
    i = 0
    while i < len(raw):
        ch = raw[i]
        if ch == "\x1b":
            m = re.match(r"\x1b\[([0-9;?]*)([A-Za-z])", raw[i:])
            assert m, f"an escape this emulator does not know at {raw[i:i + 12]!r}"
            args, code = m.group(1), m.group(2)
            if code == "K":                                     # erase the line (2K) or to its end (K)
                lines[row] = "" if args == "2" else lines[row][:col]
            elif code == "A":
                row = max(0, row - int(args or 1))
            elif code not in "mhl":                            # colours, cursor shown/hidden
                raise AssertionError(f"unexpected escape {m.group(0)!r}")
            i += len(m.group(0))
            continue
        if ch == "\r":
            col = 0
        elif ch == "\n":
            row += 1
            col = 0
            if row == len(lines):
                lines.append("")
        else:
            line = lines[row].ljust(col)
            lines[row] = line[:col] + ch + line[col + 1:]
            col += 1
        i += 1
    while lines and not lines[-1]:
        lines.pop()
    return lines


def run_in_terminal(argv: list[str], cwd: Path, columns: int = 200) -> tuple[int, str]:
    """Run the command line with stdout and stderr on one pseudo-terminal (as a person's
    shell has them); everything the terminal received."""
    import fcntl
    import pty
    import struct
    import termios
    main_fd, child_fd = pty.openpty()
    fcntl.ioctl(child_fd, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS=str(columns), TERM="xterm-256color")
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen([sys.executable, "-m", "stagesplit", *argv], cwd=cwd, stdin=subprocess.DEVNULL,
                            stdout=child_fd, stderr=child_fd, env=env, close_fds=True)
    os.close(child_fd)
    chunks = []
    while True:
        ready, _, _ = select.select([main_fd], [], [], 120)
        if not ready:
            proc.kill()
            raise AssertionError("the command printed nothing for 120 s")
        try:
            data = os.read(main_fd, 65536)
        except OSError:                                   # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(main_fd)
    return proc.wait(60), b"".join(chunks).decode("utf-8", "replace").replace("\r\n", "\n")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pseudo-terminals as Linux has them")
def test_the_readmes_first_command_in_a_terminal_leaves_no_progress_behind(tmp_path):
    argv = ["solve", str(BERT), "--devices", "4", "--compare", "--plot", "bert-base-4.png"]
    code, raw = run_in_terminal(argv, tmp_path)
    assert code == 0
    shown = screen(raw)
    # the same command off a terminal prints no progress: the screen must equal its output
    plain = subprocess.run([sys.executable, "-m", "stagesplit", *argv], cwd=tmp_path, capture_output=True, text=True,
                           env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=300)
    assert plain.returncode == 0 and plain.stderr == "wrote bert-base-4.png\n"
    assert shown == ["wrote bert-base-4.png"] + plain.stdout.splitlines()
    # progress was drawn while it ran (and then cleared): each phase by name
    for phase in ("reading", "grouping 404 operations into layers", "building the cost model", "pricing 78 layer ranges",
                  "solving"):
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
                         "building the cost model (12 layers, 123,954 variables)", "pricing 78 layer ranges"]
    assert all(": done in " in line for line in err)
