"""A real pseudo-terminal for tests of what a person sees: run the command line on one, and
replay what it received as the screen shows it."""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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
    proc = subprocess.Popen(argv if argv and argv[0] == sys.executable else [sys.executable, "-m", "stagesplit", *argv], cwd=cwd, stdin=subprocess.DEVNULL,
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




def normalise(lines: list[str]) -> list[str]:
    """Durations and hashes as placeholders; trailing spaces dropped."""
    out = []
    for line in lines:
        line = re.sub(r"\b\d+\.\d+ s\b", "<seconds> s", line)
        line = re.sub(r"\b[0-9a-f]{64}\b", "<sha256>", line)
        line = re.sub(r"SHA-256 [0-9a-f]{12}\.\.\.", "SHA-256 <sha>...", line)
        out.append(line.rstrip())
    return out
