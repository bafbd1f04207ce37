"""The library's words for its parameters, as the command line's flags.

The library never writes a flag: an ``OptionError`` carries the Python parameter it is about,
and any other text that tells the user what to change (a plan's message, a note, a warning, the
why line) names the parameter in backquotes, as the Python API's user reads it:
``allow more with `time_limit```, ``use `devices=34` or fewer``, ``(`schedule='auto'`)``. Here,
and only here, those become the flags the command line's user types: ``allow more with
--time-limit``, ``use --devices 34 or fewer``, ``(--schedule auto)``. A backquoted word that
is not a parameter of the command line is left as it is."""

from __future__ import annotations

import re

from ..errors import OptionError, StagesplitError

__all__ = ["error_text", "flags_in"]

#: `name` or `name=value` (the value possibly quoted), not inside a ``double`` backquote
_NAMED = re.compile(r"(?<!`)`([a-z][a-z0-9_]*)(?:=('[^'`]*'|\"[^\"`]*\"|[^`\s]+))?`(?!`)")


def flags_in(text: str) -> str:
    """``text`` with each backquoted parameter written as its flag (its value after it)."""
    if "`" not in text:
        return text
    from .parser import FLAGS

    def flag(m: re.Match[str]) -> str:
        name, value = m.group(1), m.group(2)
        if name not in FLAGS:
            return m.group(0)
        if value is None:
            return FLAGS[name]
        if value[0] in "'\"":
            value = value[1:-1]
        return f"{FLAGS[name]} {value}"
    return _NAMED.sub(flag, text)


def error_text(exc: StagesplitError) -> str:
    """The error as the command line's user reads it: the parameter it is about, and any it
    names, as flags."""
    from .parser import FLAGS
    if isinstance(exc, OptionError):
        return flags_in(exc.render(FLAGS.get(exc.parameter, exc.parameter)))
    return flags_in(str(exc))
