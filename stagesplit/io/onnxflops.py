"""The FLOPs of one ONNX node, from its operator, attributes and shapes.

2 FLOPs per multiply-accumulate for Conv, ConvTranspose, MatMul, Gemm and Einsum (explicit
equations); per element for pooling (the kernel's size), normalisations, reductions, Softmax
and element-wise operators. Data movement and bookkeeping (Reshape, Transpose, Gather, ...) is 0
by definition; any other operator is not modelled (``node_flops`` gives None). An attribute of the
wrong type is refused naming the node.
"""

from __future__ import annotations

import math

from ..common.text import short_repr
from ..errors import ProfileError
from .onnxshapes import numel

__all__ = ["node_flops"]

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
        return numel(entry[0]) if entry else 0

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
        return 2.0 * numel(x) * per_input
    if op == "Einsum":
        return _einsum_flops(node, shape, src)
    if op in _POOL:
        kernel = _typed_attr(node, "kernel_shape", _INTS, [], src)
        if any(k < 1 for k in kernel):
            raise ProfileError(src, f"graph.node[{node.name or op}].attribute.kernel_shape",
                               "kernel sizes >= 1", short_repr(kernel))
        return float(out_numel()) * float(math.prod(kernel))
    if op in _REDUCE:
        return float(numel(shape(0)))
    if op in _NORMS:
        return float(_NORMS[op] * numel(shape(0)))
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
