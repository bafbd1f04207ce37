"""The search's deadline, seen by the long loops many calls below it.

``time_limit`` bounds the whole search, but much of a schedule search's time goes in loops
several calls below the solver: generating a schedule's actions, its dependency graph, the
simulation of a step, each rank's memory action by action, the memory signatures CP-SAT's model
is built from. With 4,096 micro-batches and 16 chunks per device these are millions of actions
each. Passing a deadline through every one of those functions (they also serve the reports,
where there is none) would thread an argument through the whole schedule module, so the search
sets it once for a block (``deadline_at``) and the loops call ``check_deadline`` every few
thousand steps: outside any block it costs one context-variable read. A block inside another
keeps the earlier deadline, so a part of the search given a share of the time never outlives the
whole. What reaches the deadline raises ``TimeLimitReached``; each search catches it where it has
a best-so-far to return (marked not proven), and where nothing was found it is the one-line error.

The searches themselves (the exact DP, CP-SAT, the schedules' chunk search, ``schedule='auto'``)
take a ``Deadline``: made once from the time limit where the solve starts (the API) and passed
down, each phase asking it what is left instead of re-splitting seconds by hand, and a phase
given a share of the time gets a ``part`` of it that never outlives the whole.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from ..errors import StagesplitError

__all__ = ["Deadline", "TimeLimitReached", "check_deadline", "deadline_at", "seconds_left", "without_deadline"]

#: (the deadline on time.monotonic(), the time limit the user gave in seconds, for the message)
_DEADLINE: ContextVar[tuple[float, float | None] | None] = ContextVar("stagesplit_deadline", default=None)
#: the whole command's end, where one search runs many solves (the layout search): no grant passes it
_FINAL: ContextVar[float | None] = ContextVar("stagesplit_final_deadline", default=None)


class TimeLimitReached(StagesplitError):
    """The search's time limit passed inside a long computation (its message is the one line
    the user sees where nothing was found before it)."""


class Deadline:
    """When the search must end (a point on ``time.monotonic()``'s clock) and the time limit the
    user gave (seconds, for the messages that name it). Immutable: a phase given a share of the
    time gets a new one (``part``), ending no later than this one."""

    __slots__ = ("at", "limit")
    at: float
    limit: float | None

    def __init__(self, at: float, limit: float | None = None) -> None:
        object.__setattr__(self, "at", float(at))
        object.__setattr__(self, "limit", None if limit is None else float(limit))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("a Deadline is immutable: make a part of it instead")

    def __repr__(self) -> str:
        return f"Deadline(left={self.left():.3f} s, limit={self.limit})"

    @classmethod
    def after(cls, seconds: float, limit: float | None = None) -> Deadline:
        """The deadline ``seconds`` from now (``limit``, for messages: ``seconds`` unless given)."""
        return cls(time.monotonic() + float(seconds), float(seconds) if limit is None else limit)

    def left(self) -> float:
        """Seconds until the deadline, 0 once past it (an outer ``deadline_at`` block included)."""
        return min(max(self.at - time.monotonic(), 0.0), seconds_left())

    def reached(self) -> bool:
        return self.left() <= 0.0

    def part(self, seconds: float) -> Deadline:
        """A phase's share: ``seconds`` from now, or this deadline where it is sooner; its
        messages still name the whole time limit."""
        return Deadline(min(self.at, time.monotonic() + max(float(seconds), 0.0)), self.limit)

    def at_least(self, seconds: float) -> Deadline:
        """At least ``seconds`` from now even past this deadline: a search that must run a little
        to say anything (CP-SAT's one-second floor) gets that little."""
        return Deadline(max(self.at, time.monotonic() + float(seconds)), self.limit)

    @contextmanager
    def watched(self) -> Iterator[None]:
        """Within the block, the long loops below (``check_deadline``) stop at this deadline."""
        with deadline_at(self.at, self.limit):
            yield

    @contextmanager
    def granted(self) -> Iterator[None]:
        """Within the block, the long loops stop at this deadline even where it is later than the
        one outside (what ``at_least`` grants is kept: ``watched`` would stop at the earlier), but
        never past the command's ``final`` deadline."""
        final = _FINAL.get()
        token = _DEADLINE.set((self.at if final is None else min(self.at, final), self.limit))
        try:
            yield
        finally:
            _DEADLINE.reset(token)

    @contextmanager
    def final(self) -> Iterator[None]:
        """Within the block, this deadline is the command's last word: no share granted to a solve
        inside (``granted``) runs past it (the layout search: each combination's solve has a share)."""
        token = _FINAL.set(self.at)
        try:
            yield
        finally:
            _FINAL.reset(token)


@contextmanager
def deadline_at(at: float | None, limit: float | None = None) -> Iterator[None]:
    """Within the block, ``check_deadline`` raises once ``time.monotonic()`` passes ``at`` (or
    an earlier deadline already set outside); ``limit``: the seconds the user gave, for the
    message. ``at`` None leaves the deadline as it is."""
    current = _DEADLINE.get()
    token = _DEADLINE.set(current if at is None or current is not None and current[0] <= at else (at, limit))
    try:
        yield
    finally:
        _DEADLINE.reset(token)


@contextmanager
def without_deadline() -> Iterator[None]:
    """No deadline within the block: building the plan from what a search found (its simulation,
    each device's memory) runs to the end even where the search used all of the time."""
    token = _DEADLINE.set(None)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def seconds_left() -> float:
    """Seconds until the deadline (infinite outside any block, 0 past it)."""
    current = _DEADLINE.get()
    return float("inf") if current is None else max(current[0] - time.monotonic(), 0.0)


def check_deadline(doing: str = "") -> None:
    """Raise ``TimeLimitReached`` if the deadline has passed; ``doing`` says what was under way."""
    current = _DEADLINE.get()
    if current is not None and time.monotonic() > current[0]:
        limit = f" ({current[1]:g} s)" if current[1] is not None else ""
        raise TimeLimitReached(f"no split was found within the time limit{limit}"
                               + (f": it was reached while {doing}" if doing else "")
                               + "; allow more with `time_limit`")
