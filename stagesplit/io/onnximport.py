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
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .builder import ProfileBuilder
from ..errors import ProfileError, StagesplitError
from .profile import Profile, ProfileInfo, Target
from .layerform import one_tile

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
        raise StagesplitError("import needs the onnx package: pip install 'stagesplit[onnx]'") from None
    return onnx


def import_onnx(path: str | Path, target: Target, *, batch: int | None = None, dims: dict[str, int] | None = None,
                training: str = "adam", dtype: str | None = None, name: str | None = None) -> OnnxImport:
    """Read ``path`` and build its profile on ``target`` (see the module docstring)."""
    onnx = _onnx()
    if training not in TRAINING:
        raise StagesplitError(f"--training: expected one of {', '.join(TRAINING)}, got '{training}'")
    if dtype is not None and dtype not in DTYPES:
        raise StagesplitError(f"--dtype: expected one of {', '.join(DTYPES)}, got '{dtype}'")
    path = Path(path)
    src = str(path)
    model = _load(onnx, path)
    _check_external(onnx, model, path)
    _bind_dims(model, dims or {}, batch, src)
    model = _infer(onnx, model, src)
    if _fold_shape_computations(onnx, model):      # shapes computed from shapes: fold, then infer again
        model = _infer(onnx, model, src)
    return _build(onnx, model, target, training, dtype, name or path.stem, src)


def _infer(onnx, model, src: str):
    try:
        return onnx.shape_inference.infer_shapes(model, data_prop=True)
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
    from onnx import numpy_helper
    from onnx.reference import ReferenceEvaluator
    g = model.graph
    known: dict[str, np.ndarray] = {}
    shapes = {vi.name: vi for vi in list(g.input) + list(g.value_info) + list(g.output)}
    from onnx.external_data_helper import uses_external_data
    for t in g.initializer:
        if int(math.prod(t.dims)) <= _FOLD_LIMIT and not uses_external_data(t):
            known[t.name] = numpy_helper.to_array(t)
    changed = False
    for node in g.node:
        outs = [o for o in node.output if o]
        try:
            if node.op_type == "Constant":
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
                value = ReferenceEvaluator(node).run(None, {x: known[x] for x in node.input if x})
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


def _load(onnx, path: Path):
    src = str(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ProfileError(src, "", "a readable ONNX file", exc.strerror or str(exc)) from None
    try:
        model = onnx.load_from_string(raw)
    except Exception as exc:         # google.protobuf.message.DecodeError and friends
        raise ProfileError(src, "", "an ONNX model (a protobuf ModelProto)",
                           f"undecodable ({type(exc).__name__})") from None
    if model.ir_version <= 0 or len(model.graph.node) == 0:
        raise ProfileError(src, "graph.node", "an ONNX model with at least one node (is this an ONNX file?)",
                           f"ir_version {model.ir_version}, {len(model.graph.node)} nodes")
    return model


def _check_external(onnx, model, path: Path) -> None:
    """Sizes come from each initializer's dims, so external data is never read; its files must exist."""
    from onnx.external_data_helper import uses_external_data
    for t in model.graph.initializer:
        if uses_external_data(t):
            location = next((e.value for e in t.external_data if e.key == "location"), "")
            if not (path.parent / location).is_file():
                raise ProfileError(str(path), f"graph.initializer[{t.name}].external_data.location",
                                   "an external data file next to the model", f"'{location}' is missing")


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
                d.dim_value = int(dims[symbol])
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
    return int(math.prod(shape)) if shape is not None else 0


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
    for a in node.attribute:
        if a.name == name:
            from onnx import helper
            return helper.get_attribute_value(a)
    return default


def node_flops(node, shapes) -> float | None:
    """FLOPs of one node (2 per multiply-accumulate); None for an operator not modelled."""
    op = node.op_type

    def shape(k: int):
        if k >= len(node.input) or not node.input[k]:
            return None
        entry = shapes.get(node.input[k])
        return entry[0] if entry else None

    def out_numel() -> int:
        entry = shapes.get(node.output[0]) if node.output else None
        return _numel(entry[0]) if entry else 0

    if op in _MOVEMENT:
        return 0.0
    if op == "MatMul" or op == "MatMulInteger":
        a, b = shape(0), shape(1)
        k = a[-1] if a else 0
        return 2.0 * out_numel() * k
    if op == "Gemm":
        a = shape(0)
        k = (a[0] if _attr(node, "transA", 0) else a[-1]) if a else 0
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
        if not w or not x:
            return None
        group = int(_attr(node, "group", 1))
        per_input = (w[1] * group // max(group, 1)) * int(math.prod(w[2:]))   # Cout / group x kernel
        return 2.0 * _numel(x) * per_input
    if op == "Einsum":
        return _einsum_flops(node, shape)
    if op in _POOL:
        kernel = _attr(node, "kernel_shape", [])
        return float(out_numel() * int(math.prod(kernel)))
    if op in _REDUCE:
        return float(_numel(shape(0)))
    if op in _NORMS:
        return float(_NORMS[op] * _numel(shape(0)))
    if op in _SOFTMAX:
        return float(_SOFTMAX[op] * out_numel())
    if op in _ELEMENTWISE:
        return float(out_numel())
    return None


def _einsum_flops(node, shape) -> float | None:
    equation = (_attr(node, "equation", b"") or b"")
    equation = equation.decode() if isinstance(equation, bytes) else str(equation)
    equation = equation.replace(" ", "")
    if "..." in equation or "->" not in equation:
        return None                       # ellipses and implicit output: not decidable here
    lhs, rhs = equation.split("->")
    sizes: dict[str, int] = {}
    for k, term in enumerate(lhs.split(",")):
        s = shape(k)
        if s is None or len(s) != len(term):
            return None
        for letter, n in zip(term, s):
            sizes[letter] = n
    total = int(math.prod(sizes.values()))
    contracted = set(sizes) - set(rhs)
    return 2.0 * total if contracted else float(total)


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

    # every node output must have a bound shape: a dimension inference could not resolve never binds
    for i in order:
        n = nodes[i]
        for o in n.output:
            if not o:
                continue
            entry = shapes.get(o)
            if entry is not None and any(d is None for d in entry[0]):
                raise ProfileError(src, f"graph.node[{n.name or i}]", "shapes that bind (pass --dim NAME=VALUE or "
                                   "--batch N for the model's symbolic dimensions)",
                                   f"output '{o}' has a dimension that never binds")

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
        flops = node_flops(n, shapes)
        if flops is None:
            unknown[n.op_type] += 1
            flops = 0.0
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
        listed = ", ".join(f"{op} x{k}" for op, k in sorted(unknown.items()))
        warnings.append(f"{sum(unknown.values())} node(s) of operators whose FLOPs are not modelled count 0 FLOPs: {listed}")
    b.info.warnings = list(warnings)
    profile = b.build(source=src)
    return OnnxImport(profile=profile, nodes=costs, param_bytes=param_total, shared=shared, unknown_ops=unknown,
                      warnings=warnings)


def parse_dims(items: list[str]) -> dict[str, int]:
    """--dim NAME=VALUE items."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or not re.fullmatch(r"\d+", value.strip()) or int(value) < 1:
            raise StagesplitError(f"--dim: expected NAME=VALUE with VALUE a positive integer, got '{item}'")
        out[key.strip()] = int(value)
    return out
