"""Import an ONNX model as a full-form profile (one tile): ``stagesplit import model.onnx``.

Every node is one operation and one program step, in the graph's topological order. Per node:
parameter bytes (the initializers it reads; an initializer read by several nodes is one variable,
counted once and marked shared), output activation bytes, FLOPs (2 x multiply-accumulates) and
bytes read plus written (``bytes_accessed``, for roofline time). Shapes come from ONNX shape
inference after symbolic dimensions are bound by ``--dim NAME=VALUE`` and ``--batch N``.

Training mode (``--training adam|sgd``) adds, for every parameter, a gradient of its size and
(adam) two fp32 moment tensors, all always live (pipelined training accumulates gradients over
micro-batches). It adds a backward step per forward node in reverse order whose compute is
2 x the node's forward FLOPs (the usual estimate: one product for the input gradient, one for the
weight gradient) and whose bytes accessed are 2 x the forward's. A forward activation stays
live until the last backward step that reads it: matrix products, normalisations and
non-linear functions of their input keep their inputs, Relu/Sigmoid/Tanh/Softmax/Exp keep their
output, a product with a constant keeps nothing, additions keep nothing (autograd's rules, node
by node). View operators (Reshape, Transpose, Squeeze, ...) alias their input: no bytes of their
own. The gradient of an activation is live from the backward step of its last consumer to the
backward step of its producer. Inference (``--training none``) frees each tensor after its last
consumer. Stage memory then comes from this liveness, not from sums.

Operators whose FLOPs are not modelled count 0 FLOPs; they are listed in one warning.
"""

from __future__ import annotations

import math
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .builder import ProfileBuilder
from ..errors import OptionError, ProfileError, StagesplitError
from .profile import Profile, ProfileInfo, Target
from ..common.safeinput import InputFile, confined_path
from ..common.limits import MAX_BYTES, MAX_COMPUTE, MAX_STEPS, MAX_STREAM_BYTES
from ..common.text import one_line, short_repr
from .layerform import one_tile

__all__ = ["import_onnx", "parse_dims", "node_flops", "OnnxImport", "NodeCost", "TRAINING", "DTYPES",
           "MAX_ONNX_BYTES", "MAX_DIM"]

#: an ONNX file is one protobuf message, which protobuf caps at 2 GiB (larger models keep their
#: weights in external data files, which are never read); a pipe or device is capped lower
MAX_ONNX_BYTES = (2 << 30) - 1
#: --batch and --dim values (and any dimension bound from them) are at most this
MAX_DIM = 1 << 40
#: nodes in one graph: each is a forward and a backward program step
MAX_NODES = MAX_STEPS // 2 - 1

TRAINING = ("adam", "sgd", "none")
DTYPES = {"float32": 4, "float16": 2, "bfloat16": 2}

# FLOPs per output element (element-wise) or per input element (reductions, normalisations)
_ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Relu", "Sigmoid", "Tanh", "Erf", "Gelu", "Exp", "Log", "Sqrt", "Pow",
                "Neg", "Abs", "Max", "Min", "Where", "Clip", "LeakyRelu", "Reciprocal", "Elu", "Selu", "HardSigmoid",
                "HardSwish", "Softplus", "Mish", "PRelu", "Sin", "Cos", "Floor", "Ceil", "Round", "Sign", "Mod",
                "Sum", "Mean", "BitShift", "Not", "And", "Or", "Xor", "Equal", "Greater", "Less", "GreaterOrEqual",
                "LessOrEqual", "IsNaN", "IsInf", "ThresholdedRelu", "Celu", "Silu"}
_SOFTMAX = {"Softmax": 5, "LogSoftmax": 5}        # max, subtract, exp, sum, divide per element
_NORMS = {"BatchNormalization": 2, "LayerNormalization": 5, "InstanceNormalization": 5,
          "GroupNormalization": 5, "SimplifiedLayerNormalization": 4, "RMSNormalization": 4,
          "LpNormalization": 3, "MeanVarianceNormalization": 5}
_REDUCE = {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
           "ReduceSumSquare", "ReduceLogSumExp", "ArgMax", "ArgMin", "GlobalAveragePool", "GlobalMaxPool",
           "GlobalLpPool", "CumSum"}
_POOL = {"MaxPool", "AveragePool", "LpPool"}
# data movement and bookkeeping: 0 FLOPs by definition, not "unknown"
_MOVEMENT = {"Reshape", "Transpose", "Gather", "GatherElements", "GatherND", "Concat", "Slice", "Shape", "Size",
             "Unsqueeze", "Squeeze", "Constant", "Identity", "Expand", "Cast", "CastLike", "Split", "Flatten",
             "Dropout", "ConstantOfShape", "Range", "Tile", "Pad", "ScatterND", "ScatterElements", "Scatter",
             "DepthToSpace", "SpaceToDepth", "Trilu", "NonZero", "OneHot", "EyeLike", "Resize", "Upsample",
             "TopK", "Compress", "ReverseSequence", "Col2Im", "Optional", "SequenceConstruct"}


@dataclass
class NodeCost:
    """One node's figures (forward)."""

    name: str
    op_type: str
    param_bytes: int            # initializers it reads (a shared one counted in full on each reader)
    own_param_bytes: int        # the same, with shared initializers left out
    shared_params: tuple[str, ...]
    activation_bytes: int       # its outputs
    flops: float
    bytes_read: int
    bytes_written: int


@dataclass
class OnnxImport:
    profile: Profile
    nodes: list[NodeCost]
    param_bytes: int                          # every initializer once
    shared: list[str]                         # initializers read by more than one node
    unknown_ops: Counter = field(default_factory=Counter)
    warnings: list[str] = field(default_factory=list)
    #: the layers the profile's operations group into (set by ``stagesplit.api.import_onnx``)
    layers: list[str] = field(default_factory=list)
    external_files: list[str] = field(default_factory=list)   # external data files the model names (inputs too)


# view operators: their output aliases their first input (no memory of its own)
_VIEWS = {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Expand", "Dropout", "Split",
          "Slice"}
# training: which inputs each operator's backward reads (matrix products and non-linear functions
# of their input), and the operators whose backward reads their own output
_SAVES_OUTPUT = {"Relu", "Sigmoid", "Tanh", "Softmax", "LogSoftmax", "Exp", "Sqrt", "Reciprocal"}
_SAVES_INPUTS = {"MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum", "Mul", "Div", "Pow", "Gelu", "Erf",
                 "LayerNormalization", "BatchNormalization", "InstanceNormalization", "GroupNormalization",
                 "Log", "Sin", "Cos", "MaxPool", "Max", "Min", "Clip", "LeakyRelu", "PRelu", "Softplus", "Mish",
                 "Silu", "HardSigmoid", "HardSwish", "Elu", "Selu", "Celu", "ReduceMax", "ReduceMin",
                 "SimplifiedLayerNormalization", "RMSNormalization"}


def _saved_inputs(node, constants: set[str] = frozenset()) -> range | tuple[int, ...]:
    """Indices of the inputs a node's backward reads (so they stay live until it runs). A product
    or quotient with a constant needs only the constant, so the activation is not kept for it."""
    if node.op_type in ("Mul", "Div") and len(node.input) == 2:
        return tuple(k for k in (0, 1) if node.input[1 - k] not in constants)
    if node.op_type in _SAVES_INPUTS:
        return range(len(node.input))
    if node.op_type in ("Gather", "GatherElements", "GatherND"):
        return (1,)                     # the indices
    if node.op_type == "Where":
        return (0,)                     # the condition
    return ()


def _onnx():
    try:
        import onnx  # noqa: F401
        from onnx import shape_inference  # noqa: F401
    except ImportError:
        raise StagesplitError("import needs the onnx package: pip install 'stagesplit[onnx]' (from a checkout of "
                              "stagesplit: pip install '.[onnx]')") from None
    return onnx


def import_onnx(path: str | Path, target: Target, *, batch: int | None = None, dims: dict[str, int] | None = None,
                training: str = "adam", dtype: str | None = None, name: str | None = None) -> OnnxImport:
    """Read ``path`` and build its profile on ``target`` (see the module docstring)."""
    onnx = _onnx()
    if training not in TRAINING:
        raise StagesplitError(f"--training: expected one of {', '.join(TRAINING)}, got '{one_line(str(training))}'")
    if dtype is not None and dtype not in DTYPES:
        raise StagesplitError(f"--dtype: expected one of {', '.join(DTYPES)}, got '{one_line(str(dtype))}'")
    dims = _checked_dims(dims, batch)
    path = Path(path)
    src = str(path)
    model = _load(onnx, path)
    external = _check_graph(onnx, model, path)
    _bind_dims(model, dims, batch, src)
    model = _infer(onnx, model, src)
    if _fold_shape_computations(onnx, model):      # shapes computed from shapes: fold, then infer again
        model = _infer(onnx, model, src)
    result = _build(onnx, model, target, training, dtype, name or path.stem, src)
    result.external_files = external
    return result


def _checked_dims(dims: dict[str, int] | None, batch: int | None) -> dict[str, int]:
    """``dims`` and ``batch`` as whole numbers in 1..MAX_DIM (a protobuf dimension is an int64)."""
    def ok(value) -> bool:
        return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and 1 <= value <= MAX_DIM
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


def _infer(onnx, model, src: str):
    budget = PARSE_MEMORY_BASE + PARSE_BYTES_PER_BYTE * model.ByteSize()
    try:
        with _address_space_limit(budget):        # inference serializes, parses and infers in C++
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


def _fold_shape_computations(onnx, model) -> bool:
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


def _load(onnx, path: Path):
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
        with _address_space_limit(budget):
            return onnx.load_from_string(raw)
    except MemoryError:
        raise ProfileError(src, "", f"an ONNX model that parses within {budget:,} bytes of memory",
                           f"{len(raw):,} bytes that need more") from None
    except Exception as exc:         # google.protobuf.message.DecodeError and friends
        maybe_memory = _WORST_BLOWUP * len(raw) > budget
        expected = "an ONNX model (a protobuf ModelProto)" + (
            f" that parses within {budget:,} bytes of memory" if maybe_memory else "")
        raise ProfileError(src, "", expected, f"undecodable ({type(exc).__name__})") from None


class _address_space_limit:
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


# -- the graph, checked before shapes are inferred ---------------------------------------------------------

# bits per element of each tensor element type; None: stored as strings (no fixed size)
_BITS = {1: 32, 2: 8, 3: 8, 4: 16, 5: 16, 6: 32, 7: 64, 8: None, 9: 8, 10: 16, 11: 64, 12: 32, 13: 64, 14: 64,
         15: 128, 16: 16, 17: 8, 18: 8, 19: 8, 20: 8, 21: 4, 22: 4, 23: 4, 24: 8, 25: 2, 26: 2, 27: 6, 28: 6}


def _element_bits(onnx, elem_type: int, where: str, src: str) -> int | None:
    """Bits per element of a tensor type the model declares; an unknown type is refused."""
    if elem_type not in _BITS:
        raise ProfileError(src, where, "a known ONNX tensor element type (TensorProto.DataType: FLOAT, INT64, ...)",
                           elem_type)
    return _BITS[elem_type]


def _tensor_bytes(dims, bits: int | None, where: str, src: str) -> int:
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


def _check_graph(onnx, model, path: Path) -> list[str]:
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
        external += _check_initializer(onnx, t, where, path)
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
                external += _check_initializer(onnx, t, f"{label}.attribute.{a.name}" +
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


def _check_initializer(onnx, t, where: str, path: Path) -> list[str]:
    """An initializer's type, dims and data (or external data file); returns that file if any."""
    src = str(path)
    bits = _element_bits(onnx, t.data_type, f"{where}.data_type", src)
    nbytes = _tensor_bytes(list(t.dims), bits, where, src)
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


def _bind_dims(model, dims: dict[str, int], batch: int | None, src: str) -> None:
    """Bind symbolic input dimensions: --dim NAME=VALUE, then --batch for a symbolic first dimension."""
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
                hint = f"--dim {symbol}=VALUE" if symbol else "--batch N" if axis == 0 else "a model with a fixed shape"
                raise ProfileError(src, f"graph.input[{inp.name}]", f"every dimension bound (pass {hint})",
                                   f"dimension {label} of input '{inp.name}' is not bound")


def _shape_table(model) -> dict[str, tuple[tuple[int | None, ...], int]]:
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


def _numel(shape) -> int:
    if shape is None or any(d is None for d in shape):
        return 0
    return int(math.prod(shape))


def _topological(nodes, src: str) -> list[int]:
    """Kahn's order over tensor edges (stable: ties keep file order); a cycle is refused."""
    producer = {}
    for i, n in enumerate(nodes):
        for o in n.output:
            if o:
                producer[o] = i
    deps = [set() for _ in nodes]
    users: list[list[int]] = [[] for _ in nodes]
    for i, n in enumerate(nodes):
        for x in n.input:
            j = producer.get(x)
            if j is not None and j != i and j not in deps[i]:
                deps[i].add(j)
                users[j].append(i)
            elif j == i:
                raise ProfileError(src, f"graph.node[{n.name or i}]", "an acyclic graph", "a node that reads its own output")
    import heapq
    indegree = [len(d) for d in deps]
    ready = [i for i, d in enumerate(indegree) if d == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            indegree[u] -= 1
            if indegree[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(nodes):
        stuck = next(i for i, d in enumerate(indegree) if d > 0)
        raise ProfileError(src, f"graph.node[{nodes[stuck].name or stuck}]", "an acyclic graph",
                           f"a cycle through node '{nodes[stuck].name or nodes[stuck].op_type}'")
    return order


def _attr(node, name: str, default=None):
    """An attribute's value, untyped (for the fold, which skips whatever it cannot evaluate)."""
    for a in node.attribute:
        if a.name == name:
            from onnx import helper
            return helper.get_attribute_value(a)
    return default


# AttributeProto.AttributeType numbers of the kinds read here
_INT, _STRING, _INTS = 2, 3, 7


def _typed_attr(node, name: str, kind: int, default, src: str | None):
    """The attribute ``name`` of the given AttributeProto type, or ``default`` when absent; any
    other type is refused naming the node and attribute."""
    for a in node.attribute:
        if a.name != name:
            continue
        where = f"graph.node[{node.name or node.op_type}].attribute.{name}"
        if a.type != kind:
            expected = {_INT: "an integer (INT attribute)", _STRING: "a string (STRING attribute)",
                        _INTS: "a list of integers (INTS attribute)"}[kind]
            raise ProfileError(src, where, expected, f"attribute type {a.type}")
        if kind == _INT:
            return int(a.i)
        if kind == _INTS:
            return [int(x) for x in a.ints]
        try:
            return a.s.decode("utf-8")
        except UnicodeDecodeError:
            raise ProfileError(src, where, "UTF-8 text", short_repr(bytes(a.s))) from None
    return default


def _int_attr(node, name: str, default: int, src: str | None, minimum: int | None = None) -> int:
    value = _typed_attr(node, name, _INT, default, src)
    if minimum is not None and value < minimum:
        raise ProfileError(src, f"graph.node[{node.name or node.op_type}].attribute.{name}",
                           f"an integer >= {minimum}", value)
    return value


def node_flops(node, shapes, src: str | None = None) -> float | None:
    """FLOPs of one node (2 per multiply-accumulate); None for an operator not modelled or a
    shape not known. An attribute of the wrong type is refused naming the node (``src``: the file)."""
    op = node.op_type

    def shape(k: int):
        if k >= len(node.input) or not node.input[k]:
            return None
        entry = shapes.get(node.input[k])
        if not entry or any(d is None for d in entry[0]):
            return None
        return entry[0]

    def out_numel() -> int:
        entry = shapes.get(node.output[0]) if node.output else None
        return _numel(entry[0]) if entry else 0

    if op in _MOVEMENT:
        return 0.0
    if op == "MatMul" or op == "MatMulInteger":
        a = shape(0)
        k = a[-1] if a else 0
        return 2.0 * out_numel() * k
    if op == "Gemm":
        a = shape(0)
        trans = _int_attr(node, "transA", 0, src)
        k = (a[0] if trans else a[-1]) if a else 0
        bias = out_numel() if len(node.input) > 2 and node.input[2] else 0
        return 2.0 * out_numel() * k + bias
    if op == "Conv":
        w = shape(1)
        if not w:
            return None
        per_output = int(math.prod(w[1:]))             # Cin / group x kernel
        bias = out_numel() if len(node.input) > 2 and node.input[2] else 0
        return 2.0 * out_numel() * per_output + bias
    if op == "ConvTranspose":
        x, w = shape(0), shape(1)
        _int_attr(node, "group", 1, src, minimum=1)      # checked; the weight's shape already holds Cout / group
        if not w or not x or len(w) < 2:
            return None
        per_input = w[1] * int(math.prod(w[2:]))       # Cout / group x kernel
        return 2.0 * _numel(x) * per_input
    if op == "Einsum":
        return _einsum_flops(node, shape, src)
    if op in _POOL:
        kernel = _typed_attr(node, "kernel_shape", _INTS, [], src)
        if any(k < 1 for k in kernel):
            raise ProfileError(src, f"graph.node[{node.name or op}].attribute.kernel_shape",
                               "kernel sizes >= 1", short_repr(kernel))
        return float(out_numel()) * float(math.prod(kernel))
    if op in _REDUCE:
        return float(_numel(shape(0)))
    if op in _NORMS:
        return float(_NORMS[op] * _numel(shape(0)))
    if op in _SOFTMAX:
        return float(_SOFTMAX[op] * out_numel())
    if op in _ELEMENTWISE:
        return float(out_numel())
    return None


def _einsum_flops(node, shape, src: str | None = None) -> float | None:
    equation = _typed_attr(node, "equation", _STRING, "", src).replace(" ", "")
    if "..." in equation or equation.count("->") != 1:
        return None                       # ellipses and implicit output: not decidable here
    lhs, rhs = equation.split("->")
    sizes: dict[str, int] = {}
    for k, term in enumerate(lhs.split(",")):
        s = shape(k)
        if s is None or len(s) != len(term):
            return None
        for letter, n in zip(term, s):
            sizes[letter] = n
    total = float(math.prod(sizes.values()))
    contracted = set(sizes) - set(rhs)
    return 2.0 * total if contracted else total


def _build(onnx, model, target: Target, training: str, dtype: str | None, name: str, src: str) -> OnnxImport:
    g = model.graph
    nodes = list(g.node)
    order = _topological(nodes, src)
    shapes = _shape_table(model)
    init = {t.name for t in g.initializer}
    float_types = {1, 10, 11, 16}
    init_float = {t.name: t.data_type in float_types for t in g.initializer}
    elem_float = {vi.name: vi.type.tensor_type.elem_type in float_types
                  for vi in list(g.input) + list(g.value_info) + list(g.output) if vi.type.HasField("tensor_type")}
    elem_float.update(init_float)

    def nbytes(tensor: str) -> int:
        entry = shapes.get(tensor)
        if entry is None:
            return 0
        shp, item = entry
        if any(d is None for d in shp):
            return 0
        if dtype is not None and elem_float.get(tensor, False):      # --dtype: floating tensors only
            item = DTYPES[dtype]
        return _numel(shp) * item

    # every node output must have a bound shape: a dimension inference could not resolve never binds;
    # and every tensor's dimensions (from the file or from inference) must make a tensor that can exist
    for i in order:
        n = nodes[i]
        for k, o in enumerate(n.output):
            if not o:
                continue
            entry = shapes.get(o)
            if entry is not None and any(d is None for d in entry[0]):
                raise ProfileError(src, f"graph.node[{n.name or i}]", "shapes that bind (pass --dim NAME=VALUE or "
                                   "--batch N for the model's symbolic dimensions)",
                                   f"output '{o}' has a dimension that never binds")
            if entry is not None:
                _tensor_bytes(entry[0], 8 * entry[1], f"graph.node[{n.name or i}].output[{k}]", src)
    for x in g.input:
        if x.name in shapes and x.name not in init:
            _tensor_bytes(shapes[x.name][0], 8 * shapes[x.name][1], f"graph.input[{x.name}]", src)

    n_fwd = len(order)
    step_of = {i: s for s, i in enumerate(order)}
    train = training != "none"
    total_steps = 2 * n_fwd + 1 if train else n_fwd    # forward, backward, optimizer step
    tgt = one_tile(target)
    b = ProfileBuilder(tgt, total_steps, compute_unit="flops",
                       info=ProfileInfo(name=name, source="onnx", compute_source="onnx: FLOPs from shapes",
                                        description=f"imported from {Path(src).name} (training: {training})"))
    # readers of each initializer and of each activation
    readers: dict[str, list[int]] = {}
    producer: dict[str, int] = {}
    for i in order:
        for x in nodes[i].input:
            if x:
                readers.setdefault(x, []).append(step_of[i])
        for o in nodes[i].output:
            if o:
                producer[o] = step_of[i]
    shared = sorted(t for t in init if len({s for s in readers.get(t, [])}) > 1)
    shared_set = set(shared)

    # parameters (+ gradients, optimizer state): always live, one variable per initializer
    param_var: dict[str, list[int]] = {}
    state_bytes = 0
    for t in g.initializer:
        nb = nbytes(t.name)
        label = f"{t.name} (shared)" if t.name in shared_set else t.name
        vs = [b.variable(nb, 0, "always", name=label)]
        if train and init_float.get(t.name, False) and t.name in readers:
            vs.append(b.variable(nb, 0, "always", name=f"{t.name}.grad"))
            if training == "adam":
                elems = _numel(shapes[t.name][0])
                vs.append(b.variable(4 * elems, 0, "always", name=f"{t.name}.adam_m"))
                vs.append(b.variable(4 * elems, 0, "always", name=f"{t.name}.adam_v"))
            state_bytes += nb + (8 * _numel(shapes[t.name][0]) if training == "adam" else 0)
        param_var[t.name] = vs
    param_total = sum(nbytes(t.name) for t in g.initializer)

    def bwd(step: int) -> int:
        return 2 * n_fwd - 1 - step

    # activations: graph inputs (step 0) and every node output. Outputs of view operators
    # (reshape, transpose, ...) are aliases of their input, as in the frameworks that export them:
    # 0 bytes of their own, and their uses keep the aliased tensor live.
    root: dict[str, str] = {}
    for i in order:
        n = nodes[i]
        if n.op_type in _VIEWS and n.input and n.input[0]:        # (a view of a weight: part of the weight)
            for o in n.output:
                if o:
                    root[o] = root.get(n.input[0], n.input[0])
    graph_outputs = {o.name for o in g.output}
    constants = set(init) | {o for n in nodes if n.op_type == "Constant" for o in n.output}
    last_use: dict[str, int] = {}
    kept_until: dict[str, int] = {}     # training: the backward step that still reads the tensor

    def keep(tensor: str, step: int) -> None:
        r = root.get(tensor, tensor)
        if r not in init:
            kept_until[r] = max(kept_until.get(r, -1), step)

    for i in order:
        n = nodes[i]
        s = step_of[i]
        for x in n.input:
            r = root.get(x, x)
            if x and r not in init:
                last_use[r] = max(last_use.get(r, -1), s)
        if train:
            for k in _saved_inputs(n, constants):
                if k < len(n.input) and n.input[k]:
                    keep(n.input[k], bwd(s))
            if n.op_type in _SAVES_OUTPUT:
                for o in n.output:
                    if o:
                        keep(o, bwd(s))
    for o in graph_outputs:                     # outputs live to the end of the forward (the loss)
        r = root.get(o, o)
        last_use[r] = max(last_use.get(r, -1), n_fwd - 1 if not train else n_fwd)

    act_var: dict[str, int] = {}
    grad_var: dict[str, int] = {}
    sources = [(x.name, 0) for x in g.input if x.name not in init] + [(o, s) for o, s in producer.items()]
    for tensor, start in sources:
        if tensor in root:
            act_var[tensor] = b.variable(0, 0, [], name=f"{tensor} (view of {root[tensor]})")
            continue
        nb = nbytes(tensor)
        end = max(last_use.get(tensor, start), kept_until.get(tensor, start))
        act_var[tensor] = b.variable(nb, 0, [(start, end + 1)], name=tensor)
        uses = readers.get(tensor, [])
        if train and uses and tensor in producer:
            gstart, gend = bwd(max(uses)), bwd(start)
            grad_var[tensor] = b.variable(nb, 0, [(gstart, gend + 1)], name=f"{tensor}.grad")

    costs: list[NodeCost] = []
    unknown: Counter = Counter()
    for i in order:
        n = nodes[i]
        s = step_of[i]
        label = n.name or f"{n.op_type}_{i}"
        flops = node_flops(n, shapes, src)
        if flops is None:
            unknown[n.op_type] += 1
            flops = 0.0
        if not flops <= MAX_COMPUTE / 3:             # forward and a backward of twice as much
            raise ProfileError(src, f"graph.node[{n.name or i}]", f"at most {MAX_COMPUTE / 3:.3g} FLOPs per node "
                               "(its shapes give more)", f"{flops:.3g}")
        ins = [x for x in n.input if x]
        outs = [o for o in n.output if o]
        read = sum(nbytes(x) for x in ins)
        written = sum(nbytes(o) for o in outs)
        params = [x for x in dict.fromkeys(ins) if x in init]
        pb = sum(nbytes(x) for x in params)
        costs.append(NodeCost(label, n.op_type, pb, sum(nbytes(x) for x in params if x not in shared_set),
                              tuple(x for x in params if x in shared_set), written, float(flops), read, written))
        vars_ = [v for x in params for v in param_var[x][:1]]
        vars_ += [act_var[x] for x in dict.fromkeys(ins) if x in act_var] + [act_var[o] for o in outs if o in act_var]
        b.operation(label, s, s, vars=vars_, inputs=ins, compute=flops, bytes_accessed=float(read + written))
    if train:
        # backward steps in reverse order: the same operation names so they join the same layers
        for i in reversed(order):
            n = nodes[i]
            s = step_of[i]
            c = costs[s]
            ins = [x for x in n.input if x]
            outs = [o for o in n.output if o]
            vars_ = [v for x in dict.fromkeys(ins) if x in param_var for v in param_var[x][:2]]
            vars_ += [act_var[x] for x in dict.fromkeys(ins) if x in act_var]
            vars_ += [grad_var[x] for x in list(dict.fromkeys(ins)) + outs if x in grad_var]
            b.operation(f"{c.name}/backward", bwd(s), bwd(s), vars=vars_, inputs=outs, compute=2.0 * c.flops,
                        bytes_accessed=2.0 * (c.bytes_read + c.bytes_written))
        # the optimizer step reads and writes every parameter's state once (its FLOPs are not modelled)
        # (no variables listed: each parameter's state belongs to the layers that read it)
        b.operation("optimizer/step", 2 * n_fwd, 2 * n_fwd, compute=0.0, bytes_accessed=float(2 * state_bytes))
    warnings = []
    if unknown:
        kinds = sorted(unknown.items())
        listed = ", ".join(f"{op} x{k}" for op, k in kinds[:20]) + (f" and {len(kinds) - 20} more operators"
                                                                      if len(kinds) > 20 else "")
        warnings.append(f"{sum(unknown.values())} node(s) of operators whose FLOPs are not modelled count 0 FLOPs: {listed}")
    b.info.warnings = list(warnings)
    total = 3.0 * sum(c.flops for c in costs)
    if not total <= MAX_COMPUTE:
        raise ProfileError(src, "graph", f"a model of at most {MAX_COMPUTE:g} FLOPs per training step", f"{total:.3g}")
    profile = _checked(b, src)
    return OnnxImport(profile=profile, nodes=costs, param_bytes=param_total, shared=shared, unknown_ops=unknown,
                      warnings=warnings)


def _checked(builder: ProfileBuilder, src: str) -> Profile:
    """The built profile, within the limits every profile meets. Each tensor was checked by name
    already; what can still fail is a sum (parameters plus their gradients and optimizer state,
    or all activations together), which belongs to the whole graph, not to one field."""
    from .limits import check_profile_limits
    try:
        return check_profile_limits(builder.build(source=src), src)
    except ProfileError as exc:
        raise ProfileError(src, "graph", f"a model whose tensors, gradients and optimizer state fit "
                           f"stagesplit's limits ({exc.expected})") from None


def parse_dims(items: list[str]) -> dict[str, int]:
    """--dim NAME=VALUE items."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        value = value.strip()
        if not sep or not key.strip() or not re.fullmatch(r"[0-9]{1,20}", value) or not 1 <= int(value) <= MAX_DIM:
            raise StagesplitError(f"--dim: expected NAME=VALUE with VALUE a whole number in 1..{MAX_DIM:,}, "
                                  f"got '{one_line(item)[:80]}'")
        out[key.strip()] = int(value)
    return out
