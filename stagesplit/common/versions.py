"""stagesplit's version, and the versions of what its answers depend on (recorded in plans)."""

from __future__ import annotations

import sys
from functools import cache

__all__ = ["VERSION", "versions"]

VERSION = "0.1.0"


def versions() -> dict[str, str]:
    """Versions of stagesplit, Python, numpy and OR-Tools (the packages a plan's answer depends on).
    A package already imported says its own (``__version__``): reading the installed packages'
    metadata (importlib.metadata) costs a solve tens of milliseconds, and is left for one that
    is not imported (OR-Tools where only the exact DP ran)."""
    out = {"stagesplit": VERSION, "python": sys.version.split()[0]}
    for package in ("numpy", "ortools"):
        version = getattr(sys.modules.get(package), "__version__", None)
        out[package] = str(version) if version is not None else _installed(package)
    return out


@cache
def _installed(package: str) -> str:
    """The installed version of ``package`` by its metadata (read once per process): the
    ``Version`` of the first ``<package>-<version>.dist-info`` on ``sys.path``, as importlib.metadata
    finds it, read directly (importing importlib.metadata costs a solve 20-30 ms); importlib.metadata
    itself where there is no such folder."""
    found = _dist_info_version(package)
    if found is not None:
        return found
    from importlib import metadata
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _dist_info_version(package: str) -> str | None:
    """The version in the first ``<package>-*.dist-info/METADATA`` on ``sys.path`` (None: none)."""
    import os
    prefix = package.lower().replace("-", "_") + "-"
    for entry in sys.path:
        try:
            names = sorted(os.listdir(entry or "."))
        except OSError:
            continue
        for name in names:
            if name.lower().startswith(prefix) and name.endswith(".dist-info"):
                try:
                    with open(os.path.join(entry or ".", name, "METADATA"), encoding="utf-8") as f:
                        for line in f:
                            if line.startswith("Version:"):
                                return line.split(":", 1)[1].strip()
                            if not line.strip():
                                break            # the headers end at the first empty line
                except OSError:
                    pass
                return None
    return None
