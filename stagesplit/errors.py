"""User-facing errors: each one prints as a single line that says what to fix."""

from __future__ import annotations

from pathlib import Path

from .common.text import one_line, short_repr

__all__ = ["ExportError", "LayerRangeError", "OptionError", "ProfileError", "StagesplitError"]


class StagesplitError(Exception):
    """An error caused by the user's input or options, reported without a traceback."""


class ProfileError(StagesplitError):
    """A profile (or plan, or config) file holds something stagesplit cannot use.

    The message names the file, the path of the offending field inside it, and what was
    expected there, e.g. ``bert.json: variables[12].bytes: expected an integer >= 0, got -4``.
    """

    def __init__(self, file: str | Path | None, field: str, expected: str, got: object = None):
        self.file = str(file) if file is not None else None
        self.field = field
        self.expected = expected
        self.got = got
        where = f"{one_line(self.file)}: " if self.file else ""
        location = f"{one_line(field)}: " if field else ""
        detail = f", got {_short(got)}" if got is not None else ""
        super().__init__(f"{where}{location}expected {expected}{detail}")


def _short(value: object, limit: int = 60) -> str:
    """A bounded one-line repr: a huge or deeply nested value (a YAML alias bomb) is never
    printed whole."""
    return short_repr(value, limit)


class OptionError(StagesplitError, ValueError):
    """A library argument that cannot be used. ``parameter`` is the argument's name in the
    Python API (``devices``, ``pin_layers``...); the command line swaps in its flag."""

    def __init__(self, parameter: str, message: str, subject: str | None = None):
        self.parameter = parameter
        self.detail = message
        #: what the parameter named when the message is about it (an output's path): "out plan.json: ..."
        self.subject = subject
        super().__init__(self.render(parameter))

    def render(self, name: str) -> str:
        """The message with the parameter called ``name`` (the command line passes its flag)."""
        return f"{name} {self.subject}: {self.detail}" if self.subject is not None else f"{name}: {self.detail}"


class LayerRangeError(StagesplitError, IndexError):
    """A layer index or range outside the profile's layers."""


class ExportError(StagesplitError):
    """A plan that cannot be exported as asked (malformed, or beyond what the format can
    express). The message starts with the plan file (``source``) when there is one."""

    def __init__(self, source: str | Path | None, message: str):
        self.source = str(source) if source is not None else None
        self.detail = message
        super().__init__(f"{one_line(self.source)}: {message}" if self.source else message)
