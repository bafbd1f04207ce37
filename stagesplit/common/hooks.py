"""Late binding for a record's methods whose work belongs to a later stage of the data flow.

``Plan.plot()`` and ``Plan.report()`` are methods of a plan record (stage 6) but draw with the
reporting stage (8). Rather than import a later stage (which the architecture forbids), the
record calls a named hook here, and the package's front door (``stagesplit/__init__.py``, run
before any of its modules) binds each name to the function that does the work, imported only
when first called.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import StagesplitError

__all__ = ["call", "register"]

_HOOKS: dict[str, Callable[..., Any]] = {}


def register(name: str, function: Callable[..., Any]) -> None:
    _HOOKS[name] = function


def call(name: str, *args: Any, **kwargs: Any) -> Any:
    if name not in _HOOKS:
        raise StagesplitError(f"{name} is not available: stagesplit's reporting is not installed with this package")
    return _HOOKS[name](*args, **kwargs)
