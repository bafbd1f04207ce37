"""Run one function in a forked child process while the caller goes on, and get its result back.

A reader uses it to read two independent parts of a large report on two cores at once: the
child starts as a copy of the caller (the open report included), runs the function, sends the
result back through a pipe and exits. The result is a tree of dicts with string keys, lists,
strings, numbers, booleans, ``None`` and numeric numpy arrays; it travels as one JSON header
and the arrays' raw bytes, so nothing is pickled. Off Linux, where the process runs other
Python threads, or with fewer than two usable cores, ``can_fork`` says no and callers do the
work in-process.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["ChildFailed", "Forked", "can_fork", "usable_cores"]

_LENGTH = struct.Struct("<Q")


class ChildFailed(Exception):
    """The child did not deliver a result (it raised, was killed or sent something unreadable);
    the caller does the work itself."""


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def can_fork() -> bool:
    """Whether a forked child can run here: on Linux (where libpva runs; fork elsewhere can
    break system libraries), with no other Python thread running (a thread holding a lock at
    the fork would leave the child stuck), and with two cores to use."""
    return (sys.platform.startswith("linux") and hasattr(os, "fork") and threading.active_count() == 1
            and usable_cores() >= 2)


class Forked:
    """``fn()`` running in a forked child. ``result()`` waits for it and returns its value or
    raises ChildFailed; leaving the ``with`` block without the result stops the child. Making
    one raises ChildFailed when no child can be started."""

    def __init__(self, fn: Callable[[], Any]):
        try:
            read_end, write_end = os.pipe()
        except OSError as exc:
            raise ChildFailed(f"no pipe: {exc}") from None
        try:
            with warnings.catch_warnings():
                # Python 3.12+ warns when native threads exist (a BLAS pool, say); the child runs
                # only Python and numpy code of its own and never waits on their locks
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
        except OSError as exc:                         # no memory or process slot for a child
            os.close(read_end)
            os.close(write_end)
            raise ChildFailed(f"no child process: {exc}") from None
        if pid == 0:                                   # the child: never returns into the caller
            status = 1
            try:
                signal.signal(signal.SIGINT, signal.SIG_IGN)     # the parent stops the child
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.close(read_end)
                with os.fdopen(write_end, "wb") as out:
                    try:
                        header, buffers = _encode(fn())
                    except BaseException as exc:       # noqa: BLE001 - reported to the parent, which redoes the work
                        header, buffers = {"error": f"{type(exc).__name__}: {exc}"}, []
                    data = json.dumps(header, allow_nan=True).encode()
                    out.write(_LENGTH.pack(len(data)))
                    out.write(data)
                    for array in buffers:
                        out.write(array.data.cast("B"))
                status = 0
            finally:
                os._exit(status)
        os.close(write_end)
        self.pid: int | None = pid
        self.pipe = os.fdopen(read_end, "rb")

    def result(self) -> Any:
        try:
            head = self._read_exact(_LENGTH.size)
            (length,) = _LENGTH.unpack(head)
            header = json.loads(self._read_exact(length))
            if "error" in header:
                raise ChildFailed(str(header["error"]))
            arrays = []
            for dtype, shape in header["buffers"]:
                array = np.empty(tuple(shape), np.dtype(dtype))
                self._read_into(array.data.cast("B") if array.size else memoryview(b""))
                arrays.append(array)
            value = _decode(header["value"], arrays)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self.close()
            raise ChildFailed(f"{type(exc).__name__}: {exc}") from None
        except BaseException:
            self.close()
            raise
        self.close(stop=False)                         # it has sent everything and is exiting
        return value

    def close(self, stop: bool = True) -> None:
        """Reap the child (stopping it first unless ``stop`` is False) and close the pipe."""
        if self.pid is not None:
            pid, self.pid = self.pid, None
            try:
                if stop:
                    os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ChildProcessError, ProcessLookupError):
                pass
        if not self.pipe.closed:
            self.pipe.close()

    def __enter__(self) -> Forked:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _read_exact(self, n: int) -> bytes:
        data = self.pipe.read(n)
        if data is None or len(data) != n:
            raise ChildFailed("the child exited before sending its whole result")
        return data

    def _read_into(self, view: memoryview) -> None:
        got = 0
        while got < len(view):
            n = self.pipe.readinto(view[got:])
            if not n:
                raise ChildFailed("the child exited before sending its whole result")
            got += n


def _encode(value: Any) -> tuple[dict, list[np.ndarray]]:
    buffers: list[np.ndarray] = []

    def walk(v: Any) -> Any:
        if isinstance(v, np.ndarray):
            if v.dtype.kind not in "biuf":
                raise TypeError(f"only numeric arrays travel back from the child, not {v.dtype}")
            buffers.append(np.ascontiguousarray(v))
            return {"__array__": len(buffers) - 1}
        if isinstance(v, np.generic):
            return v.item()
        if isinstance(v, dict):
            if "__array__" in v or not all(isinstance(k, str) for k in v):
                raise TypeError("dict keys must be strings other than '__array__'")
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [walk(x) for x in v]
        if v is None or isinstance(v, (str, bool, int, float)):
            return v
        raise TypeError(f"a {type(v).__name__} cannot travel back from the child")

    tree = walk(value)
    return {"value": tree, "buffers": [[a.dtype.str, list(a.shape)] for a in buffers]}, buffers


def _decode(tree: Any, arrays: list[np.ndarray]) -> Any:
    if isinstance(tree, dict):
        if "__array__" in tree:
            return arrays[tree["__array__"]]
        return {k: _decode(v, arrays) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_decode(v, arrays) for v in tree]
    return tree
