"""Checks of option values, each raising ``OptionError`` that names the parameter: the one
place the options record, the API's functions and the plan reader validate a value.

The command line swaps the parameter for its flag; the plan reader for the field's path in
the plan file (``request.devices``), so a message names what the user actually wrote.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from enum import Enum
from typing import Any, Literal, TypeVar, overload

from ..errors import OptionError
from .text import short_repr

__all__ = ["boolean", "choice", "integer", "mapping_items", "number", "pairs", "strings"]

E = TypeVar("E", bound=Enum)


@overload
def integer(parameter: str, value: Any, minimum: int, maximum: int | None = None, *,
            optional: Literal[False] = False) -> int: ...
@overload
def integer(parameter: str, value: Any, minimum: int, maximum: int | None = None, *,
            optional: bool) -> int | None: ...
def integer(parameter: str, value: Any, minimum: int, maximum: int | None = None, *,
            optional: bool = False) -> int | None:
    """A whole number (not a bool) in ``minimum..maximum``; None passes with ``optional``."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or \
            (maximum is not None and value > maximum):
        top = f" and <= {maximum:,}" if maximum is not None else ""
        raise OptionError(parameter, f"expected an integer >= {minimum}{top}, got {short_repr(value)}")
    return int(value)


@overload
def number(parameter: str, value: Any, low: float, high: float, *, low_open: bool = False,
           high_open: bool = False, optional: Literal[False] = False) -> float: ...
@overload
def number(parameter: str, value: Any, low: float, high: float, *, low_open: bool = False,
           high_open: bool = False, optional: bool) -> float | None: ...
def number(parameter: str, value: Any, low: float, high: float, *, low_open: bool = False,
           high_open: bool = False, optional: bool = False) -> float | None:
    """A finite number (not a bool) in the interval, brackets as given."""
    if value is None and optional:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        left, right = "(" if low_open else "[", ")" if high_open else "]"
        raise OptionError(parameter, f"expected a number in {left}{low:g}, {high:g}{right}, got {short_repr(value)}")
    return float(value)


def boolean(parameter: str, value: Any) -> bool:
    """True or False (no strings, numbers or None: ``"yes"`` is refused)."""
    if not isinstance(value, bool):
        raise OptionError(parameter, f"expected true or false, got {short_repr(value)}")
    return value


def choice(kind: type[E], parameter: str, value: Any) -> E:
    """A member of the enum ``kind``, given as the member or its value."""
    if isinstance(value, kind):
        return value
    try:
        return kind(value)
    except (ValueError, TypeError):
        raise OptionError(parameter, f"expected one of {', '.join(str(k.value) for k in kind)}, "
                          f"got {short_repr(value)}") from None


def strings(parameter: str, value: Any, *, what: str = "names") -> tuple[str, ...]:
    """One string, or an iterable of strings (not a mapping, not bytes)."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (bytes, Mapping)) or not isinstance(value, Iterable):
        raise OptionError(parameter, f"expected a list of {what}, got {short_repr(value)}")
    items = tuple(value)
    for item in items:
        if not isinstance(item, str):
            raise OptionError(parameter, f"expected a list of {what}, got an item {short_repr(item)}")
    return items


def mapping_items(parameter: str, value: Any, *, what: str) -> tuple[tuple[Any, Any], ...]:
    """A mapping's items, or an iterable of (key, value) pairs, in order."""
    if isinstance(value, Mapping):
        return tuple(value.items())
    return pairs(parameter, value, what=what)


def pairs(parameter: str, value: Any, *, what: str) -> tuple[tuple[Any, Any], ...]:
    """An iterable of 2-item lists or tuples (a mapping gives its items)."""
    if isinstance(value, Mapping):
        return tuple(value.items())
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise OptionError(parameter, f"expected {what}, got {short_repr(value)}")
    out = []
    for item in value:
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise OptionError(parameter, f"expected {what}, got an item {short_repr(item)}")
        out.append((item[0], item[1]))
    return tuple(out)
