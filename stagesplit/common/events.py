"""The one channel for progress and warnings (``Events``), defined below every stage so that the
engine (plan/engine.py) reports through it as the API does; ``stagesplit.Events`` is this class."""

from __future__ import annotations

__all__ = ["Events"]


class Events:
    """The one channel for progress and warnings. ``start``/``update``/``done`` frame a long
    phase (loading, pricing, solving); ``warn`` reports something the user should know. This
    base class keeps the warnings (``warnings``) and shows nothing; the command line subclasses
    it to print them."""

    def __init__(self) -> None:
        self.warnings: list[str] = []

    def warn(self, message: str) -> None:
        """Something the user should know (kept in ``warnings``)."""
        self.warnings.append(message)

    def start(self, label: str, unit: str = "") -> None:
        """A phase begins (it ends at ``done`` or when the next one starts); ``unit`` names
        what its ``update`` counts (e.g. "device counts"), empty when only the share matters."""

    def update(self, done: int, total: int) -> None:
        """``done`` of ``total`` units of the current phase."""

    def done(self, detail: str = "") -> None:
        """The current phase ended."""
