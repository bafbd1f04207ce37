"""The shapes of an ONNX graph's tensors, bound and inferred.

Symbolic input dimensions are bound by ``dims`` (name to size) and ``batch`` (a symbolic first
dimension), each a whole number up to ``MAX_DIM``. ONNX shape inference (``data_prop=True``, within
bounded memory) then gives every tensor its shape; shape arithmetic an export does at run time
(``Shape -> Gather -> Range``), which inference cannot always follow, is evaluated once and folded
into constants so that the shapes bind. ``shape_table`` reads the result: each tensor's shape and
element size.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..common.text import short_repr
from ..errors import OptionError, ProfileError
from .onnxread import PARSE_BYTES_PER_BYTE, PARSE_MEMORY_BASE, address_space_limit

__all__ = ["MAX_DIM", "checked_dims", "bind_dims", "infer_shapes", "fold_shape_computations",
           "shape_table", "numel"]

#: ``batch`` and ``dims`` values (and any dimension bound from them) are at most this
MAX_DIM = 1 << 40


def checked_dims(dims: dict[str, int] | None, batch: int | None) -> dict[str, int]:
    """``dims`` and ``batch`` as whole numbers in 1..MAX_DIM (a protobuf dimension is an int64)."""
    def ok(value) -> bool:
        return bool(isinstance(value, (int, np.integer)) and not isinstance(value, bool) and 1 <= value <= MAX_DIM)
    if batch is not None and not ok(batch):
        raise OptionError("batch", f"expected a whole number in 1..{MAX_DIM:,}, got {short_repr(batch)}")
    if dims is None:
        return {}
    if not isinstance(dims, dict):
        raise OptionError("dims", f"expected a mapping of dimension name to size, got {type(dims).__name__}")
    for key, value in dims.items():
        if not isinstance(key, str) or not ok(value):
            raise OptionError("dims", f"expected dimension names mapped to whole numbers in 1..{MAX_DIM:,}, "
                              f"got {short_repr(key)}: {short_repr(value)}")
    return {k: int(v) for k, v in dims.items()}


def bind_dims(model, dims: dict[str, int], batch: int | None, src: str) -> None:
    """Bind symbolic input dimensions: ``dims`` by name, then ``batch`` for a symbolic first dimension."""
    initializers = {t.name for t in model.graph.initializer}
    for inp in model.graph.input:
        if inp.name in initializers or not inp.type.HasField("tensor_type"):
            continue
        for axis, d in enumerate(inp.type.tensor_type.shape.dim):
            if d.HasField("dim_value") and d.dim_value > 0:
                continue
            symbol = d.dim_param if d.HasField("dim_param") else ""
            if symbol and symbol in dims:
                d.dim_value = dims[symbol]
            elif axis == 0 and batch is not None:
                d.dim_value = int(batch)
            else:
                label = f"'{symbol}'" if symbol else f"axis {axis} (unnamed)"
                hint = f"`dims` {symbol}=VALUE" if symbol else "`batch` N" if axis == 0 else "a model with a fixed shape"
                raise ProfileError(src, f"graph.input[{inp.name}]", f"every dimension bound (pass {hint})",
                                   f"dimension {label} of input '{inp.name}' is not bound")


def infer_shapes(onnx, model, src: str):
    """The model with every shape ONNX shape inference finds, inferred within bounded memory; a
    model inference cannot handle is refused naming the file."""
    budget = PARSE_MEMORY_BASE + PARSE_BYTES_PER_BYTE * model.ByteSize()
    try:
        with address_space_limit(budget):        # inference serializes, parses and infers in C++
            return onnx.shape_inference.infer_shapes(model, data_prop=True)
    except MemoryError:
        raise ProfileError(src, "graph", f"a model ONNX shape inference can handle within {budget:,} bytes of "
                           "memory") from None
    except Exception as exc:          # onnx raises its own InferenceError and ValidationError types
        raise ProfileError(src, "graph", "a model ONNX shape inference accepts",
                           str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__) from None


_FOLDABLE = {"Gather", "Range", "Concat", "Unsqueeze", "Squeeze", "Slice", "Add", "Sub", "Mul", "Div", "Cast",
             "Equal", "Where", "Reshape", "ConstantOfShape", "Expand", "Identity", "Min", "Max", "Neg", "Sqrt",
             "Less", "Greater", "Not", "And", "Floor", "Ceil", "ReduceProd", "Mod", "Abs"}
_FOLD_LIMIT = 1 << 16          # elements: shape arithmetic is tiny; anything bigger is real data


def fold_shape_computations(onnx, model) -> bool:
    """Exports with symbolic dimensions compute shapes at run time (Shape -> Gather -> Range ...),
    which ONNX's shape inference cannot always follow. With the inputs' dimensions bound, evaluate
    those small integer computations once (onnx's reference evaluator, node by node) and turn the
    nodes into Constants holding their values, so inference sees the shapes. Returns whether any
    node changed. Nodes keep their names; only data-movement and tiny arithmetic nodes change."""
    import warnings

    from onnx import numpy_helper
    from onnx.reference import ReferenceEvaluator
    g = model.graph
    known: dict[str, np.ndarray] = {}
    shapes = {vi.name: vi for vi in list(g.input) + list(g.value_info) + list(g.output)}
    from onnx.external_data_helper import uses_external_data
    for t in g.initializer:
        if int(math.prod(t.dims)) <= _FOLD_LIMIT and not uses_external_data(t):
            try:
                known[t.name] = numpy_helper.to_array(t)
            except Exception:            # an element type numpy cannot hold: never folded
                continue
    changed = False
    for node in g.node:
        outs = [o for o in node.output if o]
        if node.domain not in ("", "ai.onnx"):
            continue
        value: Any                              # the node's outputs (ReferenceEvaluator.run's list)
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")             # overflow in hostile shape arithmetic
                if node.op_type == "Constant":
                    if not _small_constant(node):
                        continue
                    value = ReferenceEvaluator(node).run(None, {})
                elif node.op_type == "Shape":
                    vi = shapes.get(node.input[0])
                    if vi is None or not vi.type.HasField("tensor_type"):
                        continue
                    dims = vi.type.tensor_type.shape.dim
                    if not all(d.HasField("dim_value") for d in dims):
                        continue
                    full = np.array([d.dim_value for d in dims], np.int64)
                    start, end = _attr(node, "start", 0), _attr(node, "end", None)
                    value = [full[start:end]]
                elif node.op_type in _FOLDABLE and all(not x or x in known for x in node.input):
                    values = {x: known[x] for x in node.input if x}
                    if not _small_constant(node) or not _small_result(node, values):
                        continue
                    value = ReferenceEvaluator(node).run(None, values)
                else:
                    continue
        except Exception:                # not evaluable here: leave it to shape inference
            continue
        if any(np.asarray(v).size > _FOLD_LIMIT for v in value):
            continue
        for o, v in zip(outs, value):
            known[o] = np.asarray(v)
        if node.op_type != "Constant" and len(outs) == 1:
            tensor = numpy_helper.from_array(np.asarray(value[0]), outs[0])
            del node.input[:]
            del node.attribute[:]
            node.op_type = "Constant"
            node.domain = ""
            node.attribute.append(onnx.helper.make_attribute("value", tensor))
            changed = True
    return changed


def _small_constant(node) -> bool:
    """Whether the node's attributes hold only small dense tensors: a sparse, large or external
    one is never evaluated (it could expand to far more than the file holds, or be read from
    a file outside the model's folder)."""
    for a in node.attribute:
        if a.type in (11, 12) or a.name == "sparse_value":           # SPARSE_TENSOR(S)
            return False
        for t in ([a.t] if a.type == 4 else list(a.tensors) if a.type == 9 else []):   # TENSOR(S)
            if t.data_location != 0 or any(d < 0 for d in t.dims) or math.prod(t.dims) > _FOLD_LIMIT:
                return False
    return True


def _small_result(node, values: dict[str, np.ndarray]) -> bool:
    """Whether evaluating ``node`` on these known inputs stays within _FOLD_LIMIT elements, decided
    before evaluating: operators whose output size is an input's value (Range, ConstantOfShape,
    Expand) are bounded by that value, the rest by the product of their inputs' sizes (which bounds
    any broadcast, gather or concatenation)."""
    inputs = [values.get(x) for x in node.input]
    op = node.op_type
    try:
        if op == "Range":
            start, limit, delta = (float(np.asarray(v).reshape(-1)[0]) for v in inputs[:3])
            if not (math.isfinite(start) and math.isfinite(limit) and math.isfinite(delta)) or delta == 0:
                return False
            return math.ceil((limit - start) / delta) <= _FOLD_LIMIT
        if op == "ConstantOfShape":
            shape = [int(d) for d in np.asarray(inputs[0]).reshape(-1)]
            return all(d >= 0 for d in shape) and math.prod(shape) <= _FOLD_LIMIT
        if op == "Expand":
            shape = [int(d) for d in np.asarray(inputs[1]).reshape(-1)]
            if any(d < 0 for d in shape) or len(shape) > 64:
                return False
            return math.prod(max(d, 1) for d in shape) * max(np.asarray(inputs[0]).size, 1) <= _FOLD_LIMIT
    except (TypeError, ValueError, IndexError, OverflowError):
        return False
    return math.prod(max(np.asarray(v).size, 1) for v in inputs if v is not None) <= _FOLD_LIMIT


def shape_table(model) -> dict[str, tuple[tuple[int | None, ...], int]]:
    """Tensor name -> (shape, element size in bytes); None for a dimension inference left open."""
    from onnx import helper
    out = {}
    infos = list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output)
    for vi in infos:
        if not vi.type.HasField("tensor_type"):
            continue
        tt = vi.type.tensor_type
        shape = tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim)
        out[vi.name] = (shape, _itemsize(helper, tt.elem_type))
    for t in model.graph.initializer:
        out[t.name] = (tuple(int(x) for x in t.dims), _itemsize(helper, t.data_type))
    return out


def _itemsize(helper, elem_type: int) -> int:
    try:
        return int(np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).itemsize)
    except Exception:
        return 2 if elem_type in (16,) else 4        # bfloat16 and exotic types


def numel(shape) -> int:
    if shape is None or any(d is None for d in shape):
        return 0
    return int(math.prod(shape))


def _attr(node, name: str, default=None):
    """An attribute's value, untyped (for the fold, which skips whatever it cannot evaluate)."""
    for a in node.attribute:
        if a.name == name:
            from onnx import helper
            return helper.get_attribute_value(a)
    return default
