"""stagesplit's version, and the versions of what its answers depend on (recorded in plans)."""

from __future__ import annotations

import platform
import sys
from functools import cache

__all__ = ["VERSION", "versions"]

VERSION = "0.1.0"


def versions() -> dict[str, str]:
    """Versions of stagesplit, Python, numpy and OR-Tools (the packages a plan's answer depends on).
    A package already imported says its own (``__version__``): reading the installed packages'
    metadata (importlib.metadata) costs a solve tens of milliseconds, and is left for one that
    is not imported (OR-Tools where only the exact DP ran)."""
    out = {"stagesplit": VERSION, "python": platform.python_version()}
    for package in ("numpy", "ortools"):
        version = getattr(sys.modules.get(package), "__version__", None)
        out[package] = str(version) if version is not None else _installed(package)
    return out


@cache
def _installed(package: str) -> str:
    """The installed version of ``package`` by its metadata (read once per process)."""
    from importlib import metadata
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"
