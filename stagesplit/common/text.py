"""Bounded, one-line text for messages and tables: names from untrusted input are escaped
so a message stays one printable line whatever they hold."""

from __future__ import annotations

import reprlib
from typing import Any

__all__ = ["escape_surrogates", "one_line", "short_repr", "show"]

_repr = reprlib.Repr()
_repr.maxlevel = 2
_repr.maxstring = 60
_repr.maxother = 60
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = 4
_repr.maxlong = 40


def short_repr(value: Any, limit: int = 60) -> str:
    """A bounded, one-line repr: never walks more than a few levels or items of ``value``
    (a YAML alias bomb or a deeply nested list prints in constant time)."""
    try:
        text = _repr.repr(value)
    except Exception:                       # a hostile __repr__ is no reason to crash a message
        text = f"<{type(value).__name__}>"
    text = one_line(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def one_line(text: str) -> str:
    """``text`` with line breaks, other control characters and lone surrogates escaped, so a
    message stays one printable line whatever names the input holds."""
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch.isprintable() and not 0xD800 <= ord(ch) <= 0xDFFF:
            out.append(ch)
        else:
            code = ord(ch)
            out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(ch) or
                       (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"))
    return "".join(out)


def show(name: object) -> str:
    """A name from the input, escaped for a message or a table cell."""
    return one_line(str(name))



def escape_surrogates(text: str) -> str:
    """``text`` with only lone surrogates escaped (``\\ud800``): for output that keeps line
    breaks (plot labels, text files) but must encode as UTF-8."""
    if text.isascii():
        return text
    return "".join(f"\\u{ord(ch):04x}" if 0xD800 <= ord(ch) <= 0xDFFF else ch for ch in text)
