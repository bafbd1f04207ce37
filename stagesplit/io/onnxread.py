"""Reading an ONNX file: one protobuf message, read once and parsed within bounded memory.

The file goes through the capped input path (a FIFO waits a bounded time, a device or an
oversized file is refused by name); its external data is never read. Parsing allocates an object
per protobuf field, so a small hostile file can parse into more memory than any machine has: the
parse runs under an address-space limit of its own (``address_space_limit``, Linux), and a file
that cannot parse within it is refused like one that cannot parse at all.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..common.limits import MAX_STREAM_BYTES
from ..common.safeinput import InputFile
from ..errors import ProfileError

__all__ = ["MAX_ONNX_BYTES", "PARSE_MEMORY_BASE", "PARSE_BYTES_PER_BYTE", "load_model", "address_space_limit"]

#: an ONNX file is one protobuf message, which protobuf caps at 2 GiB (larger models keep their
#: weights in external data files, which are never read); a pipe or device is capped lower
MAX_ONNX_BYTES = (2 << 30) - 1


def load_model(onnx, path: Path):
    """The model, read once through the capped input path (a FIFO waits a bounded time, a device
    or an oversized file is refused by name) and parsed without touching its external data."""
    src = str(path)
    with InputFile(path, "model file") as f:
        head = f.head(1)
        if not head:
            raise ProfileError(src, "", "an ONNX model (a protobuf ModelProto)", "an empty file")
        if head[0] >> 3 == 0 or head[0] & 7 not in (0, 1, 2, 5):     # no protobuf message starts so
            raise ProfileError(src, "", "an ONNX model (a protobuf ModelProto)", f"a file starting with byte "
                               f"0x{head[0]:02x}")
        raw = f.read_all(MAX_ONNX_BYTES if f.regular else MAX_STREAM_BYTES)
    model = _parse_bounded(onnx, raw, src)
    del raw
    if model.ir_version <= 0 or len(model.graph.node) == 0:
        raise ProfileError(src, "graph.node", "an ONNX model with at least one node (is this an ONNX file?)",
                           f"ir_version {model.ir_version}, {len(model.graph.node)} nodes")
    return model


# -- parsing with bounded memory -----------------------------------------------------------------------
# Parsing allocates an object per protobuf field: twenty megabytes of empty nodes parse into more
# than a gigabyte, two gigabytes of them into more memory than any machine has. The parse runs
# under an address-space limit of its own (Linux), so such a file fails to parse instead.

#: memory a parse may take: this much plus PARSE_BYTES_PER_BYTE x the file's size
PARSE_MEMORY_BASE = 1 << 30
PARSE_BYTES_PER_BYTE = 4
#: the most memory one byte of protobuf can parse into (an empty nested message: 2 bytes -> ~150)
_WORST_BLOWUP = 100


def _parse_bounded(onnx, raw: bytes, src: str):
    """``onnx.load_from_string(raw)`` within PARSE_MEMORY_BASE + PARSE_BYTES_PER_BYTE x its size of
    memory; a file that cannot parse within it is refused like one that cannot parse at all."""
    budget = PARSE_MEMORY_BASE + PARSE_BYTES_PER_BYTE * len(raw)
    try:
        with address_space_limit(budget):
            return onnx.load_from_string(raw)
    except MemoryError:
        raise ProfileError(src, "", f"an ONNX model that parses within {budget:,} bytes of memory",
                           f"{len(raw):,} bytes that need more") from None
    except Exception as exc:         # google.protobuf.message.DecodeError and friends
        maybe_memory = _WORST_BLOWUP * len(raw) > budget
        expected = "an ONNX model (a protobuf ModelProto)" + (
            f" that parses within {budget:,} bytes of memory" if maybe_memory else "")
        raise ProfileError(src, "", expected, f"undecodable ({type(exc).__name__})") from None


class address_space_limit:
    """Within the block, the process may map at most ``extra`` more bytes (RLIMIT_AS; Linux only,
    and never raising a lower limit already set): an allocation past it fails instead of the
    machine running out of memory. The limit is process-wide, so it is set only while no other
    thread runs (one that allocated meanwhile could fail)."""

    def __init__(self, extra: int):
        self.extra = extra
        self.saved = None

    def __enter__(self):
        import threading
        if threading.active_count() > 1 or not sys.platform.startswith("linux"):
            return self
        try:
            import resource
            with open("/proc/self/statm") as f:
                mapped = int(f.read().split()[0]) * resource.getpagesize()
            soft, hard = resource.getrlimit(resource.RLIMIT_AS)
            limit = mapped + self.extra
            if hard != resource.RLIM_INFINITY:
                limit = min(limit, hard)
            if soft == resource.RLIM_INFINITY or limit < soft:
                resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
                self.saved = (soft, hard)
        except (ImportError, OSError, ValueError):
            self.saved = None                   # not Linux, or no permission: parse without a limit
        return self

    def __exit__(self, *exc) -> None:
        if self.saved is not None:
            import resource
            resource.setrlimit(resource.RLIMIT_AS, self.saved)
