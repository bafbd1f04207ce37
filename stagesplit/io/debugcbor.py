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

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from ..errors import ProfileError, StagesplitError

#: layer -> (field holding the user-level operation name, field holding its type)
USER_OP_FIELDS: dict[str, tuple[str, str]] = {
    "xla_op": ("op_name", "op_type"),
    "onnx": ("opName", "opType"),
    "poptorch": ("op_name", "op_type"),
}
#: layer -> (field holding input tensor names, field holding output tensor names)
TENSOR_FIELDS: dict[str, tuple[str, str]] = {
    "onnx": ("input", "output"),
    "popart": ("inputs", "outputs"),
}
_SHAPE = "one CBOR map with stringTable and contexts (a Poplar debug.cbor)"


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
        seen: set[int] = set()
        record = self.get(context_id)
        while record is not None and record.id not in seen:
            seen.add(record.id)
            yield record
            record = None if record.parent is None else self.get(record.parent)

    def user_op_name(self, context_id: int) -> str | None:
        """The nearest user-level operation name (xla_op, onnx or poptorch layer)."""
        for record in self.lineage(context_id):
            if record.op_name:
                return record.op_name
        return None

    def inputs(self, context_id: int) -> tuple[str, ...]:
        """The nearest non-empty list of input tensor names."""
        for record in self.lineage(context_id):
            if record.inputs:
                return record.inputs
        return ()


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
    if not isinstance(doc, dict):
        raise ProfileError(path, "", _SHAPE, f"a CBOR {type(doc).__name__}")
    table = doc.get("stringTable")
    if not isinstance(table, list):
        raise ProfileError(path, "stringTable", "an array of strings", None if table is None else type(table).__name__)
    if not all(isinstance(s, str) for s in table):
        k = next(i for i, s in enumerate(table) if not isinstance(s, str))
        raise ProfileError(path, f"stringTable[{k}]", "a string", table[k])
    contexts = doc.get("contexts")
    if not isinstance(contexts, list):
        raise ProfileError(path, "contexts", "an array of debug contexts",
                           None if contexts is None else type(contexts).__name__)
    nstrings = len(table)

    def text(value: Any, field: str) -> str | None:
        if value is None:
            return None
        if isinstance(value, str):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            if 0 <= value < nstrings:
                return table[value]
            raise ProfileError(path, field, f"a string or an index into stringTable (0..{nstrings - 1})", value)
        raise ProfileError(path, field, "a string or a string-table index", value)

    def names(value: Any, field: str) -> tuple[str, ...]:
        if value is None:
            return ()
        if not isinstance(value, list):
            value = [value]
        out = []
        for k, item in enumerate(value):
            s = text(item, f"{field}[{k}]")
            if s:
                out.append(s)
        return tuple(out)

    def integer(value: Any, field: str) -> int | None:
        if value is None:
            return None
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ProfileError(path, field, "an integer", value)

    records = []
    for i, ctx in enumerate(contexts):
        where = f"contexts[{i}]"
        if not isinstance(ctx, dict):
            raise ProfileError(path, where, "a map (one debug context)", ctx)
        cid = integer(ctx.get("id"), f"{where}.id")
        layer = text(ctx.get("layer"), f"{where}.layer") or ""
        op_field, type_field = USER_OP_FIELDS.get(layer, (None, None))
        in_field, out_field = TENSOR_FIELDS.get(layer, ("inputs", "outputs"))
        location = ctx.get("location")
        if location is not None and not isinstance(location, dict):
            raise ProfileError(path, f"{where}.location", "a map with fileName, functionName and lineNumber", location)
        location = location or {}
        instance = ctx.get("instanceId")
        parent = integer(ctx.get("parentId"), f"{where}.parentId")
        records.append(DebugContextRecord(
            id=i if cid is None else cid,
            index=i,
            name=text(ctx.get("name"), f"{where}.name") or "",
            parent=None if parent is None or parent < 0 else parent,
            layer=layer,
            category=text(ctx.get("category"), f"{where}.category") or "",
            op_name=text(ctx.get(op_field), f"{where}.{op_field}") if op_field else None,
            op_type=text(ctx.get(type_field), f"{where}.{type_field}") if type_field else None,
            inputs=names(ctx.get(in_field), f"{where}.{in_field}"),
            outputs=names(ctx.get(out_field), f"{where}.{out_field}"),
            instance_id=None if instance is None else str(instance),
            file=text(location.get("fileName"), f"{where}.location.fileName"),
            function=text(location.get("functionName"), f"{where}.location.functionName"),
            line=integer(location.get("lineNumber"), f"{where}.location.lineNumber"),
        ))
    return DebugInfo(path, records)
