"""The ``stagesplit`` command line: parse argv into the API's request, call the API, render."""

from .commands import main

__all__ = ["main"]
