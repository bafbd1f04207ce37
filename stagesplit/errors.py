"""User-facing errors: each one prints as a single line that says what to fix."""

from __future__ import annotations

from pathlib import Path

from .common.text import one_line, short_repr  # one_line: also how the command line prints a message

__all__ = ["ExportError", "FileOptionError", "LayerRangeError", "OptionError", "PatternError", "ProfileError",
           "StagesplitError", "one_line"]


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
        StagesplitError.__init__(self, self.render(parameter))   # not super(): FileOptionError's next is ProfileError

    #: where the value came from when a file gave it ("plan.json: request.schedule"), which then
    #: names it instead of the parameter or its flag (see ``FileOptionError``)
    origin: str | None = None

    def render(self, name: str) -> str:
        """The message with the parameter called ``name`` (the command line passes its flag); a
        value a file gave is named by that file and its field instead."""
        name = self.origin or name
        return f"{name} {self.subject}: {self.detail}" if self.subject is not None else f"{name}: {self.detail}"

    def from_file(self, file: str | Path, field: str) -> FileOptionError:
        """This error about a value that ``file`` gave in ``field`` (a settings file's key, a plan
        file's ``request.chunks_per_rank``): the user fixes the file, not a flag."""
        return FileOptionError(self, file, field)

    def detail_in_file(self) -> str:
        """The message after the file and field that gave the value."""
        return self.detail


class FileOptionError(OptionError, ProfileError):
    """An option whose value came from a file (a settings file's, the request a plan
    recorded) and cannot be used: named by the file and the field, e.g. ``plan.json:
    request.chunks_per_rank: zbv runs exactly 2 chunks per rank ...``. Both an ``OptionError``
    (``parameter`` is the API's name) and a ``ProfileError`` (``file``, ``field``): a bad file."""

    def __init__(self, error: OptionError, file: str | Path, field: str):
        OptionError.__init__(self, error.parameter, error.detail_in_file(), error.subject)
        self.file, self.field = str(file), field
        self.expected, self.got = error.detail.removeprefix("expected "), None
        self.origin = f"{one_line(self.file)}: {one_line(field)}"
        self.args = (self.render(error.parameter),)

    def from_file(self, file: str | Path, field: str) -> FileOptionError:
        """Itself: it is already named by the file that gave the value."""
        return self


class PatternError(OptionError):
    """A regular expression that cannot be compiled: ``invalid layer_regex '(': missing ), ...``
    in the Python API (``shown``; the command line names its flag there), ``plan.json:
    request.layering.layer_regex: invalid regular expression '(': ...`` when a file gave it
    (``from_file``)."""

    def __init__(self, parameter: str, detail: str, shown: str):
        super().__init__(parameter, detail)
        self.args = (self.render(shown),)

    def render(self, name: str) -> str:
        """``invalid layer_regex '(': ...``: the API's name (or the command line's flag) inside the sentence."""
        return f"invalid {name} {self.detail}"

    def detail_in_file(self) -> str:
        """``invalid regular expression '(': ...``, after the file and field that gave it."""
        return f"invalid regular expression {self.detail}"


class LayerRangeError(StagesplitError, IndexError):
    """A layer index or range outside the profile's layers."""


class ExportError(StagesplitError):
    """A plan that cannot be exported as asked (malformed, or beyond what the format can
    express). The message starts with the plan file (``source``) when there is one."""

    def __init__(self, source: str | Path | None, message: str):
        self.source = str(source) if source is not None else None
        self.detail = message
        super().__init__(f"{one_line(self.source)}: {message}" if self.source else message)
