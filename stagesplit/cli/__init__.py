"""The ``stagesplit`` command line: parse argv (``parser``), call the API and render what comes
back (``commands``). Bad input ends with one line on stderr and exit status 2; ``--debug``
shows the traceback; a bug is one line and exit status 1."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from ..errors import StagesplitError, one_line

__all__ = ["main"]

EXIT_USAGE = 2
EXIT_INTERNAL = 1


def _print_traceback() -> None:
    """The traceback, for --debug (traceback is imported only then: 2 ms a run otherwise)."""
    import traceback
    traceback.print_exc()


def _check_outputs(args: argparse.Namespace) -> None:
    """Every output path checked before any input is read or any file written (cli/files.py)."""
    from .files import check_command_files
    plot_formats: tuple[str, ...] = ()
    if getattr(args, "plot", None):
        from ..reporting.plot import FORMATS as plot_formats
    check_command_files(args, plot_formats)


def _safe_stdout() -> None:
    """Names that UTF-8 cannot encode (lone surrogates from JSON escapes) print as escapes
    instead of crashing the table printer."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]  # not on every stream: caught
        except (AttributeError, ValueError, OSError):
            pass


def _message(exc: StagesplitError) -> str:
    """The error as the user should read it: an API parameter named by its flag."""
    from .naming import error_text
    return error_text(exc)


#: what the user may set to choose BLAS threads themselves (left alone then)
_BLAS_THREAD_SETTINGS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _one_blas_thread() -> None:
    """numpy's OpenBLAS starts a thread per core when numpy is imported, and each spins for about a
    tenth of a second before it sleeps (OpenBLAS's thread timeout): 0.1 CPU-s on this 2-core machine,
    more with more cores, for nothing, since the command's arrays are small and its numpy calls almost
    never reach BLAS. Before numpy is first imported, and only where the user chose no BLAS threads,
    the command asks OpenBLAS for one. (CP-SAT's workers and torch's threads are their own.)"""
    if "numpy" in sys.modules or any(name in os.environ for name in _BLAS_THREAD_SETTINGS):
        return
    os.environ["OPENBLAS_NUM_THREADS"] = "1"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    _one_blas_thread()
    from .parser import build_parser, command_word
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    _safe_stdout()
    try:
        parser = build_parser(only=command_word(argv))
        args = parser.parse_args(argv)
        if not getattr(args, "command", None):
            parser.print_help(sys.stderr)
            return EXIT_USAGE
        from .commands import COMMANDS
        _check_outputs(args)
        try:
            return COMMANDS[args.command](args)
        finally:
            from .commands import end_progress
            end_progress()
    except StagesplitError as exc:
        if debug:
            _print_traceback()
        print(f"stagesplit: error: {one_line(_message(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("stagesplit: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except MemoryError:                    # an input too large for this machine: still bad input, one line
        if debug:
            _print_traceback()
        print("stagesplit: error: out of memory: the input is too large for this machine", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:  # a bug: still one line unless --debug
        if debug:
            _print_traceback()
        print(f"stagesplit: internal error: {type(exc).__name__}: {one_line(str(exc))[:500]} (run with --debug "
              "for the traceback)", file=sys.stderr)
        return EXIT_INTERNAL
