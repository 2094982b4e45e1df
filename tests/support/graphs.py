"""Synthetic operator graphs for planner tests: a DAG of blocks, each two fused operators."""

from __future__ import annotations

from models.graph import Edge, OpGraph, OpNode, TensorInfo


def dag_graph(flops: list[int], edges: list[tuple[int, int]], nbytes: list[int]) -> tuple[OpGraph, OpGraph]:
    """The operator graph (two operators per block, so every partition is a fused group) and its blocks."""
    n = len(flops)
    tensors = {"x": TensorInfo("x", (1, 3, 32, 32), "float32", 12288)}
    for i in range(n):
        tensors[f"t{i}"] = TensorInfo(f"t{i}", (nbytes[i] // 4,), "float32", nbytes[i])
        tensors[f"m{i}"] = TensorInfo(f"m{i}", (nbytes[i] // 4,), "float32", nbytes[i])
    preds = {j: [i for i, k in edges if k == j] for j in range(n)}
    succs = {i: [k for j, k in edges if j == i] for i in range(n)}

    def node(name: str, members: tuple[str, ...], inputs: tuple[str, ...], output: str, f: int) -> OpNode:
        return OpNode(name, "Conv", members, inputs, (output,), f, 4096, (("conv", f),), ("Conv",))

    ops, op_edges, block_nodes = [], [], []
    for i in range(n):
        inputs = tuple(f"t{p}" for p in preds[i]) or ("x",)
        ops.append(node(f"n{i}a", (f"n{i}a",), inputs, f"m{i}", flops[i] * 4 // 5))
        ops.append(node(f"n{i}b", (f"n{i}b",), (f"m{i}",), f"t{i}", flops[i] // 5))
        op_edges.append(Edge(f"n{i}a", f"n{i}b", f"m{i}", nbytes[i]))
        block_nodes.append(node(f"b{i}", (f"n{i}a", f"n{i}b"), inputs, f"t{i}", flops[i]))
    op_edges += [Edge(f"n{i}b", f"n{j}a", f"t{i}", nbytes[i]) for i, j in edges]
    outputs = tuple(tensors[f"t{i}"] for i in range(n) if not succs[i])
    common = dict(inputs=(tensors["x"],), outputs=outputs, tensors=tensors, model_sha256="0" * 64)
    op = OpGraph(name="dag", granularity="op", nodes=tuple(ops), edges=tuple(op_edges), **common)
    block_edges_ = tuple(Edge(f"b{i}", f"b{j}", f"t{i}", nbytes[i]) for i, j in edges)
    return op, OpGraph(name="dag", granularity="coarse", nodes=tuple(block_nodes), edges=block_edges_, **common)
