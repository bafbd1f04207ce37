"""User regular expressions, matched in linear time with RE2 (the ``google-re2`` package).

Python's ``re`` backtracks: a pattern like ``(a+)+$`` on a long operation name takes
exponential time, and ``layer_regex`` and friends come from the user (or from a plan file).
RE2 guarantees time linear in the text. It accepts Python's syntax for everything the default
patterns use (``(?i)``, ``\\b``, groups, named groups, classes); lookaround and backreferences
have no linear-time algorithm, so patterns using them are refused with a one-line message.

``compile_regex`` returns an object with the ``re.Pattern`` methods stagesplit uses
(``search``, ``findall``, ``finditer``, ``groups``, ``pattern``). Names holding lone
surrogates (possible from JSON escapes) are matched as if each were U+FFFD, keeping positions.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

from ..errors import PatternError
from .text import one_line, short_repr

__all__ = ["ENGINE", "MAX_PATTERN_LENGTH", "MAX_REGEX_MEMORY", "Match", "Pattern", "compile_regex"]

try:
    import re2 as _re2
except ImportError:                          # pragma: no cover - google-re2 is a dependency
    _re2 = None

ENGINE = "RE2 (linear time)" if _re2 is not None else "Python re (backtracking)"
#: RE2's memory budget for one compiled pattern; larger patterns are refused
MAX_REGEX_MEMORY = 64 << 20
MAX_PATTERN_LENGTH = 10_000

_SURROGATES = re.compile("[\ud800-\udfff]")


def _matchable(text: str) -> str:
    return _SURROGATES.sub("\ufffd", text) if not text.isascii() else text


def _subject(text: str) -> str | bytes:
    """What RE2 matches for ``text``: an ASCII name as its bytes (the same positions, and RE2's
    wrapper then has no offsets to convert between UTF-8 and characters, half the time per match),
    any other as ``_matchable`` gives it."""
    return text.encode("ascii") if text.isascii() else _matchable(text)


class Match:
    """The parts of ``re.Match`` stagesplit uses, on the original (unreplaced) text."""

    __slots__ = ("_text", "_spans")

    def __init__(self, text: str, spans: list[tuple[int, int]]):
        self._text = text
        self._spans = spans

    def span(self, group: int = 0) -> tuple[int, int]:
        return self._spans[group]

    def start(self, group: int = 0) -> int:
        return self._spans[group][0]

    def end(self, group: int = 0) -> int:
        return self._spans[group][1]

    def group(self, group: int = 0) -> str | None:
        a, b = self._spans[group]
        return None if a < 0 else self._text[a:b]

    def groups(self) -> tuple[str | None, ...]:
        return tuple(self.group(i) for i in range(1, len(self._spans)))


class Pattern:
    """A compiled user pattern (RE2 where available)."""

    def __init__(self, pattern: str, compiled):
        self.pattern = pattern
        self._compiled = compiled
        self.groups = compiled.groups
        # Python's re (no RE2 installed) matches str patterns on str only
        self._subject: Callable[[str], str | bytes] = _matchable if isinstance(compiled, re.Pattern) else _subject

    def _wrap(self, text: str, m) -> Match:
        return Match(text, [m.span(i) for i in range(self.groups + 1)])

    def search(self, text: str) -> Match | None:
        m = self._compiled.search(self._subject(text))
        return None if m is None else self._wrap(text, m)

    def finditer(self, text: str) -> Iterator[Match]:
        for m in self._compiled.finditer(self._subject(text)):
            yield self._wrap(text, m)

    def findall(self, text: str) -> list:
        """Like ``re.findall``: whole matches, the one group, or tuples of groups."""
        out: list[str | tuple[str, ...] | None] = []
        for m in self.finditer(text):
            if self.groups == 0:
                out.append(m.group(0))
            elif self.groups == 1:
                out.append(m.group(1) or "")
            else:
                out.append(tuple(g or "" for g in m.groups()))
        return out


def compile_regex(pattern: str, flag: str = "regex", parameter: str | None = None) -> Pattern:
    """Compile a user pattern for linear-time matching; a bad or unsupported pattern raises a
    one-line ``PatternError`` (an ``OptionError`` about ``parameter``, the API's name for it)
    naming ``flag``, or the file and field that gave it (``OptionError.from_file``)."""
    parameter = parameter or flag
    if not isinstance(pattern, str):
        raise PatternError(parameter, f"{short_repr(pattern)}: expected a string", flag)
    text = one_line(pattern)
    shown = "'" + (text if len(text) <= 80 else text[:77] + "...") + "'"
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise PatternError(parameter, f"{shown}: {len(pattern):,} characters, at most {MAX_PATTERN_LENGTH:,} "
                           "accepted", flag)
    try:
        python = re.compile(pattern)       # Python's own syntax check (and its messages)
    except (re.error, OverflowError, RecursionError) as exc:
        raise PatternError(parameter, f"{shown}: {one_line(str(exc))}", flag) from None
    if _re2 is None:                       # pragma: no cover
        return Pattern(pattern, python)
    options = _re2.Options()
    options.log_errors = False              # RE2 would log parse errors to stderr itself
    options.max_mem = MAX_REGEX_MEMORY
    try:
        compiled = _re2.compile(_matchable(pattern), options=options)
    except Exception as exc:                # re2.error: lookaround, backreferences, too large...
        detail = exc.args[0] if exc.args else exc
        if isinstance(detail, bytes):
            detail = detail.decode("utf-8", "replace")
        raise PatternError(parameter, f"{shown}: not supported by the linear-time regex engine RE2 "
                           f"({one_line(str(detail))}); it has no lookaround or backreferences "
                           "(and writes \\Z as \\z)", flag) from None
    return Pattern(pattern, compiled)
