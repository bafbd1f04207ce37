"""Read Poplar's ``debug.cbor``: the debug contexts that link a compiled program back to the
framework operations (and user-level layer names) that created it.

The file is one CBOR map with two keys:

* ``stringTable``: an array of strings;
* ``contexts``: an array of maps, one per debug context, with ``name`` (an index into the
  string table), ``parentId``, ``layer`` (``"popart"``, ``"popartbuilder"``, ``"onnx"``,
  ``"poptorch"``, ``"xla_op"``, ``"poplibs"``, ...), ``category`` (``"op"``, ``"api"``,
  ``"variable"``, ``"tensor"``), ``location`` (``fileName``/``functionName`` string-table
  indices and ``lineNumber``) and per-layer fields (onnx ``opName``/``opType``/``input``/
  ``output``; popart ``instanceId``/``opid``/``inputs``/``outputs``; poptorch and xla_op
  ``op_name``/``op_type``).

A context's id is its ``id`` field when it has one and its index in ``contexts`` otherwise;
``parentId`` refers to that id. Strings may be stored inline or as string-table indices: both
are accepted everywhere. The user-level operation name is the xla_op ``op_name`` (TensorFlow),
the onnx ``opName`` (PopART) or the poptorch ``op_name``; ``DebugInfo.user_op_name`` walks up
the parents to find the nearest one, ``DebugInfo.inputs`` the nearest input tensor names.

A file that is not CBOR, is truncated, or does not have this shape raises a one-line
``ProfileError`` naming the file.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ProfileError, StagesplitError
from .pva_export import (
    DEBUG_SHAPE,
    TENSOR_FIELDS,
    USER_OP_FIELDS,
    DebugShapeError,
    debug_records,
    lineage,
    nearest_inputs,
    user_op_name,
)

__all__ = ["DebugContextRecord", "DebugInfo", "read_debug_cbor", "USER_OP_FIELDS", "TENSOR_FIELDS"]

_SHAPE = DEBUG_SHAPE


@dataclass(frozen=True, slots=True)
class DebugContextRecord:
    """One debug context. ``parent`` is the parent's id (None: a root)."""

    id: int
    index: int
    name: str
    parent: int | None
    layer: str
    category: str
    op_name: str | None = None
    op_type: str | None = None
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    instance_id: str | None = None
    file: str | None = None
    function: str | None = None
    line: int | None = None


class DebugInfo:
    """All debug contexts of one debug.cbor, indexed by id."""

    def __init__(self, path: str | Path, contexts: list[DebugContextRecord]):
        self.path = Path(path)
        self.contexts = contexts
        self._by_id = {c.id: k for k, c in enumerate(contexts)}

    def __len__(self) -> int:
        return len(self.contexts)

    def get(self, context_id: int) -> DebugContextRecord | None:
        k = self._by_id.get(context_id)
        return None if k is None else self.contexts[k]

    def lineage(self, context_id: int) -> Iterator[DebugContextRecord]:
        """The context and then its parents, nearest first (stops at a missing id or a cycle)."""
        return lineage(self.get, context_id)

    def user_op_name(self, context_id: int) -> str | None:
        """The nearest user-level operation name (xla_op, onnx or poptorch layer)."""
        return user_op_name(self.get, context_id)

    def inputs(self, context_id: int) -> tuple[str, ...]:
        """The nearest non-empty list of input tensor names."""
        return nearest_inputs(self.get, context_id)


def read_debug_cbor(path: str | Path) -> DebugInfo:
    """Read and check a debug.cbor file (see the module docstring)."""
    import cbor2

    path = Path(path)
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        raise StagesplitError(f"{path}: no such file (expected the debug.cbor written next to profile.pop)") from None
    except OSError as exc:
        raise StagesplitError(f"{path}: cannot read: {exc.strerror or exc}") from None
    with handle:
        try:
            doc = cbor2.load(handle)
            trailing = handle.read(1)
        except cbor2.CBORDecodeEOF as exc:
            raise ProfileError(path, "", _SHAPE, f"a truncated file ({_one_line(exc)})") from None
        except (cbor2.CBORError, ValueError, TypeError, LookupError, OverflowError, RecursionError, EOFError) as exc:
            raise ProfileError(path, "", _SHAPE, f"corrupt CBOR ({_one_line(exc)})") from None
        except MemoryError:
            raise ProfileError(path, "", _SHAPE, "corrupt CBOR (a length larger than memory)") from None
    if trailing:
        raise ProfileError(path, "", _SHAPE, "more data after the first CBOR object")
    return _records(doc, path)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _records(doc: Any, path: Path) -> DebugInfo:
    """The records of a decoded document, by the rules the standalone exporter applies too
    (``pva_export.ContextRules``)."""
    try:
        return DebugInfo(path, [DebugContextRecord(*fields) for fields in debug_records(doc)])
    except DebugShapeError as exc:
        raise ProfileError(path, exc.field, exc.expected, exc.got) from None
