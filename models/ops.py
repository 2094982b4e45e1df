"""Operator classes and FLOP counts for ONNX nodes.

The op class (conv, depthwise, matmul, elementwise, pooling, other) is what device
profiles state peak throughput for, so it is the unit the cost model works in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import onnx

OP_CLASSES = ("conv", "depthwise", "matmul", "elementwise", "pooling", "other")

ELEMENTWISE = frozenset(
    {
        "Relu",
        "LeakyRelu",
        "PRelu",
        "Clip",
        "Sigmoid",
        "HardSigmoid",
        "HardSwish",
        "Tanh",
        "Erf",
        "Gelu",
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Pow",
        "Sqrt",
        "Exp",
        "Log",
        "Neg",
        "Abs",
        "Reciprocal",
        "Max",
        "Min",
        "Softmax",
        "LogSoftmax",
        "BatchNormalization",
        "LayerNormalization",
        "InstanceNormalization",
        "Cast",
        "Where",
        "Equal",
        "Less",
        "Greater",
        "Not",
        "And",
        "Or",
        "Elu",
        "Selu",
        "Softplus",
        "Mish",
        "Swish",
    }
)
POOLING = frozenset(
    {"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "ReduceMean", "ReduceMax", "ReduceSum", "LpPool"}
)
MATMUL = frozenset({"MatMul", "Gemm", "MatMulInteger", "QLinearMatMul", "Einsum"})
CONV = frozenset({"Conv", "ConvTranspose", "QLinearConv", "ConvInteger"})
# Ops a fine-grained block may absorb into the producer of their one dynamic input.
FUSABLE = frozenset(
    {
        "Relu",
        "LeakyRelu",
        "Clip",
        "Sigmoid",
        "HardSigmoid",
        "HardSwish",
        "Tanh",
        "Gelu",
        "BatchNormalization",
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Erf",
        "Cast",
        "Elu",
        "Selu",
        "Softplus",
        "Swish",
    }
)
# Per-element cost of elementwise ops that are more than one arithmetic operation.
_ELEMENT_COST = {
    "Softmax": 5,
    "LogSoftmax": 6,
    "LayerNormalization": 8,
    "BatchNormalization": 2,
    "InstanceNormalization": 8,
    "Gelu": 8,
    "Erf": 4,
    "Sigmoid": 4,
    "Tanh": 4,
    "Exp": 2,
}


def _attr(node: onnx.NodeProto, name: str, default: object) -> object:
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def op_class(node: onnx.NodeProto, shapes: Mapping[str, Sequence[int]]) -> str:
    if node.op_type in CONV:
        group = int(_attr(node, "group", 1))  # type: ignore[arg-type]
        w = shapes.get(node.input[1]) if len(node.input) > 1 else None
        if group > 1 and w is not None and len(w) >= 2 and w[1] == 1:
            return "depthwise"
        return "conv"
    if node.op_type in MATMUL:
        return "matmul"
    if node.op_type in POOLING:
        return "pooling"
    if node.op_type in ELEMENTWISE:
        return "elementwise"
    return "other"


def node_flops(node: onnx.NodeProto, shapes: Mapping[str, Sequence[int]]) -> int:
    """Multiply-adds count as two FLOPs; data movement (Reshape, Concat, ...) counts zero."""
    out = shapes.get(node.output[0]) if node.output else None
    out_n = math.prod(out) if out is not None else 0
    op = node.op_type
    if op in ("Conv", "QLinearConv", "ConvInteger"):
        w = shapes.get(node.input[1 if op == "Conv" else 3 if op == "QLinearConv" else 1])
        if w is None or out is None:
            return 0
        per_out = math.prod(w[1:])  # Cin/group * kH * kW
        return 2 * out_n * per_out + (out_n if len(node.input) > 2 and op == "Conv" else 0)
    if op == "ConvTranspose":
        x, w = shapes.get(node.input[0]), shapes.get(node.input[1])
        if x is None or w is None:
            return 0
        return 2 * math.prod(x) * math.prod(w[1:])
    if op in ("MatMul", "MatMulInteger", "QLinearMatMul"):
        a = shapes.get(node.input[0])
        return 2 * out_n * (a[-1] if a else 0)
    if op == "Gemm":
        a = shapes.get(node.input[0])
        if a is None:
            return 0
        k = a[0] if int(_attr(node, "transA", 0)) else a[-1]  # type: ignore[arg-type]
        return 2 * out_n * k + (out_n if len(node.input) > 2 else 0)
    if op in ("MaxPool", "AveragePool", "LpPool"):
        kernel = _attr(node, "kernel_shape", [1])
        return out_n * math.prod(kernel)  # type: ignore[arg-type]
    if op in POOLING:
        x = shapes.get(node.input[0])
        return math.prod(x) if x is not None else 0
    if op in ELEMENTWISE:
        return out_n * _ELEMENT_COST.get(op, 1)
    return 0
