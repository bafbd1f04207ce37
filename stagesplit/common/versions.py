"""stagesplit's version, and the versions of what its answers depend on (recorded in plans)."""

from __future__ import annotations

import platform
from importlib import metadata

__all__ = ["VERSION", "versions"]

VERSION = "0.1.0"


def versions() -> dict[str, str]:
    """Versions of stagesplit, Python, numpy and OR-Tools (the packages a plan's answer depends on)."""
    out = {"stagesplit": VERSION, "python": platform.python_version()}
    for package in ("numpy", "ortools"):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = "not installed"
    return out
