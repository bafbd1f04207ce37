"""Ctrl-C that stops cleanly: the CP-SAT search ends at once and the run exits 130 with every
output file as it was; an atomic write in progress removes its temporary file.

CP-SAT's own SIGINT handling (``catch_sigint_signal``) stops the search but lets the program
carry on as if the time limit had been reached, and leaves the process-level SIGINT handler
at its default afterwards (a later Ctrl-C then kills the process outright). Instead the search
runs in a helper thread while the main thread waits with Python's handler in place; Ctrl-C
calls ``StopSearch`` and ``KeyboardInterrupt`` is raised once the search has returned.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["deferred_signals", "solve_interruptibly"]

_DEFERRED = (signal.SIGINT, signal.SIGTERM)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def solve_interruptibly(solver: Any, model: Any) -> Any:
    """``solver.Solve(model)``, stopped by Ctrl-C: then ``KeyboardInterrupt`` is raised after
    the search returns (no result is used). Off the main thread it is a plain ``Solve``."""
    solver.parameters.catch_sigint_signal = False
    if not _main_thread():
        return solver.Solve(model)
    interrupted: list[int] = []
    outcome: dict[str, Any] = {}

    def on_sigint(signum: int, frame: Any) -> None:
        interrupted.append(signum)
        solver.StopSearch()

    def run() -> None:
        try:
            outcome["status"] = solver.Solve(model)
        except BaseException as exc:         # re-raised in the main thread below
            outcome["error"] = exc

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        worker = threading.Thread(target=run, name="cp-sat", daemon=True)
        worker.start()
        while worker.is_alive():
            worker.join(0.05)                # short waits so the handler runs promptly
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)
    if interrupted:
        raise KeyboardInterrupt
    if "error" in outcome:
        raise outcome["error"]
    return outcome["status"]


@contextmanager
def deferred_signals() -> Iterator[Callable[[], bool]]:
    """Hold SIGINT and SIGTERM for the duration of the block (they are recorded, not acted
    on); yields a function telling whether one arrived. On leaving, the previous handlers are
    restored and a held signal is delivered again, so it takes effect after the block's own
    cleanup. Off the main thread signals cannot be held and the block runs as it is."""
    if not _main_thread():
        yield lambda: False
        return
    arrived: list[int] = []

    def hold(signum: int, frame: Any) -> None:
        arrived.append(signum)

    previous = {}
    for sig in _DEFERRED:
        previous[sig] = signal.signal(sig, hold)
    try:
        yield lambda: bool(arrived)
    finally:
        for sig, handler in previous.items():
            if handler is None:             # installed from C: restore a sane default
                handler = signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL
            signal.signal(sig, handler)
        for pending in dict.fromkeys(arrived):
            signal.raise_signal(pending)
