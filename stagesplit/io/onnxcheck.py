"""An ONNX graph checked before its shapes are inferred: what no model can hold is refused.

Tensors defined twice or never, element types and dimensions no tensor can have, names that are
not UTF-8 text, initializers whose data does not match their dims, and external data outside
the model's folder are each refused in one line naming the node, input or initializer. What
passes is safe to hand to ONNX's shape inference, and every size computed from it stays within
stagesplit's limits (``tensor_bytes``).
"""

from __future__ import annotations

import math
from pathlib import Path

from ..common.limits import MAX_BYTES, MAX_STEPS
from ..common.safeinput import confined_path
from ..common.text import one_line, short_repr
from ..errors import ProfileError

__all__ = ["MAX_NODES", "check_graph", "check_initializer", "tensor_bytes"]

#: nodes in one graph: each is a forward and a backward program step
MAX_NODES = MAX_STEPS // 2 - 1

# bits per element of each tensor element type; None: stored as strings (no fixed size)
_BITS = {1: 32, 2: 8, 3: 8, 4: 16, 5: 16, 6: 32, 7: 64, 8: None, 9: 8, 10: 16, 11: 64, 12: 32, 13: 64, 14: 64,
         15: 128, 16: 16, 17: 8, 18: 8, 19: 8, 20: 8, 21: 4, 22: 4, 23: 4, 24: 8, 25: 2, 26: 2, 27: 6, 28: 6}


def _element_bits(onnx, elem_type: int, where: str, src: str) -> int | None:
    """Bits per element of a tensor type the model declares; an unknown type is refused."""
    if elem_type not in _BITS:
        raise ProfileError(src, where, "a known ONNX tensor element type (TensorProto.DataType: FLOAT, INT64, ...)",
                           elem_type)
    return _BITS[elem_type]


def tensor_bytes(dims, bits: int | None, where: str, src: str) -> int:
    """Bytes of a tensor of these dims (``where`` names the tensor); negative dims and sizes past
    MAX_BYTES are refused."""
    for k, d in enumerate(dims):
        if d is not None and d < 0:
            raise ProfileError(src, f"{where}.dims[{k}]", "a dimension >= 0", d)
    count = 1
    for d in dims:
        count *= int(d or 0)
        if count > MAX_BYTES * 8:
            break
    nbytes = -(-count * (bits or 8) // 8)
    if nbytes > MAX_BYTES:
        raise ProfileError(src, f"{where}.dims", f"dimensions of a tensor of at most {MAX_BYTES:,} bytes (1 PiB)",
                           short_repr(list(dims)))
    return nbytes


def check_graph(onnx, model, path: Path) -> list[str]:
    """Refuse, naming the node, input or initializer: tensors defined twice or never, element
    types and dimensions no tensor can have, initializers whose data does not match their dims,
    and external data outside the model's folder. Returns the external data files."""
    src = str(path)
    g = model.graph
    if len(g.node) > MAX_NODES:
        raise ProfileError(src, "graph.node", f"at most {MAX_NODES:,} nodes", len(g.node))
    _check_text(model, src)
    defined: dict[str, str] = {}

    def define(name: str, where: str) -> None:
        if name in defined:
            raise ProfileError(src, where, f"a tensor name defined once (SSA form); '{one_line(name)}' is "
                               f"already defined by {defined[name]}")
        defined[name] = where

    initializers: set[str] = set()
    external: list[str] = []
    for t in g.initializer:
        where = f"graph.initializer[{t.name}]"
        if not t.name:
            raise ProfileError(src, "graph.initializer", "every initializer named", "an initializer with no name")
        define(t.name, where)
        initializers.add(t.name)
        external += check_initializer(onnx, t, where, path)
    for t in g.sparse_initializer:
        name = t.values.name
        if not name:
            raise ProfileError(src, "graph.sparse_initializer", "every sparse initializer named (values.name)")
        define(name, f"graph.sparse_initializer[{name}]")
        initializers.add(name)
    seen_inputs: set[str] = set()
    for inp in g.input:
        where = f"graph.input[{inp.name}]"
        if not inp.name:
            raise ProfileError(src, "graph.input", "every graph input named", "an input with no name")
        if inp.name in seen_inputs:
            raise ProfileError(src, where, "each graph input listed once", f"'{inp.name}' twice")
        seen_inputs.add(inp.name)
        if inp.name not in initializers:               # an input with a default value: the initializer
            define(inp.name, where)
        if inp.type.HasField("tensor_type"):
            tt = inp.type.tensor_type
            _element_bits(onnx, tt.elem_type, f"{where}.type.tensor_type.elem_type", src)
            for axis, d in enumerate(tt.shape.dim):
                if d.HasField("dim_value") and d.dim_value < 0:
                    raise ProfileError(src, f"{where}.type.tensor_type.shape.dim[{axis}]",
                                       "a dimension >= 0 (or a symbolic name)", d.dim_value)
    for i, node in enumerate(g.node):
        label = f"graph.node[{node.name or i}]"
        for k, o in enumerate(node.output):
            if o:
                define(o, f"{label}.output[{k}]")
        for a in node.attribute:                    # tensors held in attributes: as initializers
            tensors = [a.t] if a.type == 4 else list(a.tensors) if a.type == 9 else []
            for k, t in enumerate(tensors):
                external += check_initializer(onnx, t, f"{label}.attribute.{a.name}" +
                                               (f"[{k}]" if a.type == 9 else ""), path)
    for i, node in enumerate(g.node):
        label = f"graph.node[{node.name or i}]"
        for k, x in enumerate(node.input):
            if x and x not in defined:
                raise ProfileError(src, f"{label}.input[{k}]", "a tensor that a graph input, an initializer or "
                                   "a node output defines", f"'{one_line(x)}', which nothing defines")
    for out in g.output:
        if out.name not in defined:
            raise ProfileError(src, f"graph.output[{out.name}]", "a tensor that a graph input, an initializer "
                               "or a node output defines", f"'{one_line(out.name)}', which nothing defines")
    return external


def _check_text(model, src: str) -> None:
    """Every name the importer reads is UTF-8 text: protobuf hands back a ``bytes`` object for a
    string field that is not, which no later step expects."""
    g = model.graph

    def text(value, where: str) -> None:
        if not isinstance(value, str):
            raise ProfileError(src, where, "UTF-8 text", short_repr(bytes(value)))

    def value_info(vi, where: str) -> None:
        text(vi.name, f"{where}.name")
        if vi.type.HasField("tensor_type"):
            for axis, d in enumerate(vi.type.tensor_type.shape.dim):
                if d.HasField("dim_param"):
                    text(d.dim_param, f"{where}[{vi.name}].type.tensor_type.shape.dim[{axis}].dim_param")

    for k, t in enumerate(g.initializer):
        text(t.name, f"graph.initializer[{k}].name")
        for e in t.external_data:
            text(e.key, f"graph.initializer[{t.name}].external_data.key")
            text(e.value, f"graph.initializer[{t.name}].external_data.{e.key}")
    for k, t in enumerate(g.sparse_initializer):
        text(t.values.name, f"graph.sparse_initializer[{k}].values.name")
    for field_ in ("input", "output", "value_info"):
        for k, vi in enumerate(getattr(g, field_)):
            value_info(vi, f"graph.{field_}[{k}]")
    for i, node in enumerate(g.node):
        text(node.name, f"graph.node[{i}].name")
        label = f"graph.node[{node.name or i}]"
        text(node.op_type, f"{label}.op_type")
        text(node.domain, f"{label}.domain")
        for field_ in ("input", "output"):
            for k, x in enumerate(getattr(node, field_)):
                text(x, f"{label}.{field_}[{k}]")
        for k, a in enumerate(node.attribute):
            text(a.name, f"{label}.attribute[{k}].name")
            for t in [a.t] if a.type == 4 else list(a.tensors) if a.type == 9 else []:
                text(t.name, f"{label}.attribute.{a.name}.name")
                for e in t.external_data:
                    text(e.key, f"{label}.attribute.{a.name}.external_data.key")
                    text(e.value, f"{label}.attribute.{a.name}.external_data.{e.key}")


def check_initializer(onnx, t, where: str, path: Path) -> list[str]:
    """An initializer's type, dims and data (or external data file); returns that file if any."""
    src = str(path)
    bits = _element_bits(onnx, t.data_type, f"{where}.data_type", src)
    nbytes = tensor_bytes(list(t.dims), bits, where, src)
    count = int(math.prod(int(d) for d in t.dims))
    if t.data_location == onnx.TensorProto.EXTERNAL:
        return [_check_external_data(t, where, path, nbytes if bits is not None else None)]
    if t.data_location not in (onnx.TensorProto.DEFAULT,):
        raise ProfileError(src, f"{where}.data_location", "DEFAULT or EXTERNAL", t.data_location)
    if t.HasField("raw_data"):
        have, want = len(t.raw_data), nbytes
        unit = "bytes of raw_data"
    else:
        have = sum(len(getattr(t, f)) for f in ("float_data", "int32_data", "string_data", "int64_data",
                                                   "double_data", "uint64_data"))
        if bits is not None and bits < 8 and bits != 4:
            return []                                       # 2- and 6-bit types: packing not checked
        if bits == 4:
            want = -(-count // 2)                           # int32_data holds two 4-bit values each
        else:
            want = count * (2 if t.data_type in (14, 15) else 1)    # complex: two numbers per element
        unit = "data values"
    if bits is None and t.HasField("raw_data"):
        return []                                           # strings have no fixed size
    if have != want:
        raise ProfileError(src, where, f"data for its dims {short_repr(list(t.dims))} ({want:,} {unit})", have)
    return []


def _check_external_data(t, where: str, path: Path, nbytes: int | None) -> str:
    """External data confined to the model's folder, as onnx's own checker does: a relative
    location with no ``..``, resolving (symlinks followed) to a regular file inside the folder,
    holding ``offset + length`` bytes."""
    import os
    import stat as stat_
    src = str(path)
    entries: dict[str, str] = {}
    for k, e in enumerate(t.external_data):
        if e.key in entries:
            raise ProfileError(src, f"{where}.external_data[{k}]", "each key at most once", e.key)
        entries[e.key] = e.value
    location = entries.get("location", "")
    field_ = f"{where}.external_data.location"
    joined = confined_path(location, path.parent, src, field_, "a file", within="the model's folder")
    target = os.path.realpath(joined)
    try:
        st = os.stat(target)
    except OSError as exc:
        raise ProfileError(src, field_, "an external data file next to the model",
                           f"'{one_line(location)}' is missing ({exc.strerror or exc})") from None
    if not stat_.S_ISREG(st.st_mode):
        raise ProfileError(src, field_, "an external data file that is a regular file", location)
    numbers = {}
    for key in ("offset", "length"):
        if key in entries:
            text = entries[key]
            if not (text.isascii() and text.isdigit() and len(text) <= 20):
                raise ProfileError(src, f"{where}.external_data.{key}", "a whole number of bytes >= 0", text)
            numbers[key] = int(text)
    offset = numbers.get("offset", 0)
    if nbytes is not None and "length" in numbers and numbers["length"] != nbytes:
        raise ProfileError(src, f"{where}.external_data.length", f"{nbytes:,} bytes (the size of its dims)",
                           numbers["length"])
    length = numbers.get("length", nbytes or 0)        # without a length: the data runs to the end of the file
    if offset + length > st.st_size:
        raise ProfileError(src, field_, f"a file of at least offset + length = {offset + length:,} bytes",
                           f"'{one_line(location)}' of {st.st_size:,} bytes")
    return os.path.normpath(joined)
