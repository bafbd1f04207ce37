"""An ONNX graph, its shapes known, built into a full-form profile (one tile).

Every node is one operation and one program step, in the graph's topological order. Per node:
parameter bytes (the initializers it reads; an initializer read by several nodes is one variable,
counted once and marked shared), output activation bytes, FLOPs (``onnxflops``) and bytes read
plus written (``bytes_accessed``, for roofline time).

Training mode (``adam`` or ``sgd``) adds, for every parameter, a gradient of its size and (adam)
two fp32 moment tensors, all always live (pipelined training accumulates gradients over
micro-batches). It adds a backward step per forward node in reverse order whose compute is 2 x the
node's forward FLOPs (the usual estimate: one product for the input gradient, one for the weight
gradient) and whose bytes accessed are 2 x the forward's. A forward activation stays live until
the last backward step that reads it: matrix products, normalisations and non-linear functions of
their input keep their inputs, Relu/Sigmoid/Tanh/Softmax/Exp keep their output, a product with a
constant keeps nothing, additions keep nothing (autograd's rules, node by node). View operators
(Reshape, Transpose, Squeeze, ...) alias their input: no bytes of their own. The gradient of an
activation is live from the backward step of its last consumer to the backward step of its
producer. Inference (``none``) frees each tensor after its last consumer. Stage memory then comes
from this liveness, not from sums.

Operators whose FLOPs are not modelled count 0 FLOPs; they are listed in one warning.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path

from ..common.limits import MAX_COMPUTE
from ..errors import ProfileError
from .builder import ProfileBuilder
from .layerform import one_tile
from .onnxcheck import tensor_bytes
from .onnxflops import node_flops
from .onnxshapes import numel, shape_table
from .profile import Profile, ProfileInfo, Target, batch_of

__all__ = ["DTYPES", "NodeCost", "OnnxImport", "build_profile"]

DTYPES = {"float32": 4, "float16": 2, "bfloat16": 2}


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
    """What an import gives: the profile, and the per-node figures and warnings behind it."""

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


def _saved_inputs(node, constants: AbstractSet[str] = frozenset()) -> range | tuple[int, ...]:
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


def _topological(nodes, src: str) -> list[int]:
    """Kahn's order over tensor edges (stable: ties keep file order); a cycle is refused."""
    producer = {}
    for i, n in enumerate(nodes):
        for o in n.output:
            if o:
                producer[o] = i
    deps: list[set[int]] = [set() for _ in nodes]
    users: list[list[int]] = [[] for _ in nodes]
    for i, n in enumerate(nodes):
        for x in n.input:
            j = producer.get(x)
            if j is not None and j != i and j not in deps[i]:
                deps[i].add(j)
                users[j].append(i)
            elif j == i:
                raise ProfileError(src, f"graph.node[{n.name or i}]", "an acyclic graph",
                                   "a node that reads its own output")
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


def build_profile(onnx, model, target: Target, training: str, dtype: str | None, name: str, src: str) -> OnnxImport:
    """The profile of ``model`` (checked, its shapes inferred) on one tile of ``target``, with its
    per-node figures (see the module docstring); ``dtype`` overrides the floating tensors' size."""
    g = model.graph
    nodes = list(g.node)
    order = _topological(nodes, src)
    shapes = shape_table(model)
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
        return numel(shp) * item

    # every node output must have a bound shape: a dimension inference could not resolve never binds;
    # and every tensor's dimensions (from the file or from inference) must make a tensor that can exist
    for i in order:
        n = nodes[i]
        for k, o in enumerate(n.output):
            if not o:
                continue
            entry = shapes.get(o)
            if entry is not None and any(d is None for d in entry[0]):
                raise ProfileError(src, f"graph.node[{n.name or i}]", "shapes that bind (pass `dims` NAME=VALUE or "
                                   "`batch` N for the model's symbolic dimensions)",
                                   f"output '{o}' has a dimension that never binds")
            if entry is not None:
                tensor_bytes(entry[0], 8 * entry[1], f"graph.node[{n.name or i}].output[{k}]", src)
    for x in g.input:
        if x.name in shapes and x.name not in init:
            tensor_bytes(shapes[x.name][0], 8 * shapes[x.name][1], f"graph.input[{x.name}]", src)

    n_fwd = len(order)
    step_of = {i: s for s, i in enumerate(order)}
    train = training != "none"
    total_steps = 2 * n_fwd + 1 if train else n_fwd    # forward, backward, optimizer step
    tgt = one_tile(target)
    b = ProfileBuilder(tgt, total_steps, compute_unit="flops",
                       info=ProfileInfo(name=name, source="onnx", compute_source="onnx: FLOPs from shapes",
                                        description=f"imported from {Path(src).name} (training: {training})",
                                        batch_size=batch_of(shapes[x.name][0] for x in g.input
                                                            if x.name in shapes and x.name not in init)))
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
                elems = numel(shapes[t.name][0])
                vs.append(b.variable(4 * elems, 0, "always", name=f"{t.name}.adam_m"))
                vs.append(b.variable(4 * elems, 0, "always", name=f"{t.name}.adam_v"))
            state_bytes += nb + (8 * numel(shapes[t.name][0]) if training == "adam" else 0)
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
        warnings.append(f"{sum(unknown.values())} node(s) of operators whose FLOPs are not modelled count 0 FLOPs: "
                        f"{listed}")
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
