"""A progress line on stderr for long steps (loading, pricing, solving); silent when stderr is
not a terminal unless forced, so logs and tests stay clean."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    def __init__(self, enabled: bool | None = None, stream: TextIO | None = None, min_interval: float = 0.2):
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.min_interval = min_interval
        self._last = 0.0
        self._label = ""
        self._start = time.monotonic()

    def start(self, label: str) -> None:
        self._label = label
        self._start = time.monotonic()
        self._last = 0.0
        self._write(f"{label}...")

    def update(self, done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - self._last < self.min_interval:
            return
        self._last = now
        self._write(f"{self._label}: {done:,}/{total:,} ({100 * done / max(total, 1):.0f}%)")

    def done(self, detail: str = "") -> None:
        elapsed = time.monotonic() - self._start
        self._write(f"{self._label}: done in {elapsed:.1f} s{(' - ' + detail) if detail else ''}", end="\n")

    def _write(self, text: str, end: str = "") -> None:
        if self.enabled:
            self.stream.write("\r\x1b[2K" + text + end if self.stream.isatty() else text + "\n")
            self.stream.flush()
