"""Typed access to parsed JSON/YAML values that reports the file and field path on bad input."""

from __future__ import annotations

import math
from typing import Any, NoReturn

from ..errors import ProfileError

__all__ = ["FieldReader", "INT64_MAX", "MISSING"]

MISSING = object()
INT64_MAX = 2**63 - 1


class FieldReader:
    """Reads fields of one document; every failure names ``source`` and the field's path."""

    def __init__(self, source: str | None):
        self.source = source

    def fail(self, path: str, expected: str, got: Any = None) -> NoReturn:
        raise ProfileError(self.source, path, expected, got)

    def mapping(self, value: Any, path: str) -> dict:
        if not isinstance(value, dict):
            self.fail(path, "an object", type(value).__name__)
        return value

    def get(self, obj: dict, key: str, path: str, default: Any = MISSING) -> Any:
        if key in obj:
            return obj[key]
        if default is MISSING:
            self.fail(f"{path}.{key}" if path else key, "a value (field is required)")
        return default

    def list(self, value: Any, path: str, *, nonempty: bool = False) -> list:
        if not isinstance(value, list):
            self.fail(path, "a list", type(value).__name__)
        if nonempty and not value:
            self.fail(path, "a non-empty list", value)
        return value

    def string(self, value: Any, path: str) -> str:
        if not isinstance(value, str):
            self.fail(path, "a string", value)
        return value

    def integer(self, value: Any, path: str, minimum: int | None = 0) -> int:
        if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(path, "an integer" + (f" >= {minimum}" if minimum is not None else ""), value)
        if minimum is not None and value < minimum:
            self.fail(path, f"an integer >= {minimum}", value)
        if abs(value) > INT64_MAX:          # stored as int64: larger values cannot be held
            self.fail(path, f"an integer <= {INT64_MAX} (64-bit)", value)
        return value

    def number(self, value: Any, path: str, minimum: float | None = 0.0) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or math.isinf(value):
            self.fail(path, "a number" + (f" >= {minimum:g}" if minimum is not None else ""), value)
        if minimum is not None and value < minimum:
            self.fail(path, f"a number >= {minimum:g}", value)
        return float(value)

    def boolean(self, value: Any, path: str) -> bool:
        if not isinstance(value, bool):
            self.fail(path, "true or false", value)
        return value

    def choice(self, value: Any, path: str, choices: tuple[str, ...]) -> str:
        if value not in choices:
            self.fail(path, "one of " + ", ".join(choices), value)
        return value

    def known_keys(self, obj: dict, path: str, keys: set[str]) -> None:
        for key in obj:
            if key not in keys:
                where = f"{path}.{key}" if path else str(key)
                self.fail(where, "a known field (" + ", ".join(sorted(keys)) + ")", key)
