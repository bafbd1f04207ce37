"""Progress of long phases on stderr, one line per phase, drawn by rich.

In a terminal each phase is one live line (a spinner, the phase, a bar and count when the
phase reports its size, the elapsed time) that is cleared when the phase ends, so nothing is
left glued to the output that follows. When stderr is not a terminal nothing is shown, unless
forced (``Progress(enabled=True)``): then each phase prints one plain line when it ends, with its
count and duration, for logs.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

__all__ = ["Progress"]


def _is_terminal(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


class Progress:
    """``start`` a phase (a label and the unit it counts), ``update`` it with done/total,
    ``done`` ends it; starting a phase ends the one before. ``enabled``: None follows whether
    the stream is a terminal, True forces plain lines off a terminal, False shows nothing."""

    def __init__(self, enabled: bool | None = None, stream: TextIO | None = None):
        self.stream = stream or sys.stderr
        terminal = _is_terminal(self.stream)
        self.enabled = terminal if enabled is None else bool(enabled)
        self.live = self.enabled and terminal
        self._label: str | None = None
        self._unit = ""
        self._started = 0.0
        self._done = 0
        self._total: int | None = None
        self._bar: Any = None                # a rich Progress while a bar is shown
        self._task: Any = None               # its task id

    @property
    def active(self) -> bool:
        return self._label is not None

    def start(self, label: str, unit: str = "") -> None:
        self.finish()
        self._label, self._unit, self._started = label, unit, time.monotonic()
        self._done, self._total = 0, None
        if self.live:
            from rich.console import Console
            from rich.progress import BarColumn, Progress as Bar, SpinnerColumn, TextColumn, TimeElapsedColumn
            console = Console(file=self.stream, force_terminal=True, highlight=False, soft_wrap=False)
            self._bar = Bar(SpinnerColumn(), TextColumn("{task.description}", markup=False), BarColumn(),
                            TextColumn("{task.fields[count]}", markup=False), TimeElapsedColumn(),
                            console=console, transient=True, redirect_stdout=False, redirect_stderr=False)
            self._bar.start()
            self._task = self._bar.add_task(label, total=None, count="")

    def update(self, done: int, total: int) -> None:
        if self._label is None:
            return
        self._done, self._total = int(done), int(total)
        if self._bar is not None:
            self._bar.update(self._task, completed=self._done, total=max(self._total, 1), count=self._count())

    def done(self, detail: str = "") -> None:
        self.finish(detail)

    def finish(self, detail: str = "") -> None:
        """End the current phase (if any): its live line is cleared; off a terminal with
        progress forced, one line says what it did and how long it took."""
        if self._label is None:
            return
        elapsed = time.monotonic() - self._started
        if self._bar is not None:
            self._bar.stop()
            self._bar = self._task = None
        elif self.enabled:
            count = f", {self._count()}" if self._total is not None else ""
            extra = f" - {detail}" if detail else ""
            self.stream.write(f"{self._label}: done in {elapsed:.1f} s{count}{extra}\n")
            self.stream.flush()
        self._label = None

    def write(self, line: str) -> None:
        """A line of text (a warning) on the stream, above the live line when there is one."""
        if self._bar is not None:
            self._bar.console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            self.stream.write(line + "\n")
            self.stream.flush()

    def _count(self) -> str:
        if self._total is None:
            return ""
        if self._unit:
            return f"{self._done:,}/{self._total:,} {self._unit}"
        return f"{100 * self._done / max(self._total, 1):.0f}%"
