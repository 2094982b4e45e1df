"""``OpGraph``: the operator graph every other part plans, measures and cuts by.

A node is either one ONNX operator (granularity ``op``) or a block of them after
coarsening (``fine`` / ``coarse``); ``members`` always lists the ONNX node names a
node stands for, in topological order, so a plan made on blocks can be cut back out
of the ONNX file.
"""

from __future__ import annotations

import functools
import graphlib
import heapq
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import onnx

from models.errors import ModelError
from models.ops import node_flops, op_class

_DTYPE_BYTES = {
    onnx.TensorProto.FLOAT: 4,
    onnx.TensorProto.FLOAT16: 2,
    onnx.TensorProto.BFLOAT16: 2,
    onnx.TensorProto.DOUBLE: 8,
    onnx.TensorProto.INT64: 8,
    onnx.TensorProto.INT32: 4,
    onnx.TensorProto.INT16: 2,
    onnx.TensorProto.INT8: 1,
    onnx.TensorProto.UINT8: 1,
    onnx.TensorProto.BOOL: 1,
    onnx.TensorProto.UINT16: 2,
    onnx.TensorProto.UINT32: 4,
    onnx.TensorProto.UINT64: 8,
}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int


@dataclass(frozen=True)
class OpNode:
    """One operator or one block of operators."""

    name: str
    op_type: str  # the ONNX op type, or "A+B+..." for a block
    members: tuple[str, ...]  # ONNX node names, topological order
    inputs: tuple[str, ...]  # tensors produced outside the node (graph inputs or other nodes), no weights
    outputs: tuple[str, ...]  # tensors the node produces that something outside it (or the graph output) reads
    flops: int
    param_bytes: int
    flops_by_class: tuple[tuple[str, int], ...]  # (op class, FLOPs), classes with FLOPs > 0 or ops
    op_types: tuple[str, ...]  # every distinct ONNX op type inside

    @property
    def op_class(self) -> str:
        """The class carrying most FLOPs (or "other" for pure data movement)."""
        if not self.flops_by_class:
            return "other"
        return max(self.flops_by_class, key=lambda kv: kv[1])[0]


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    tensor: str
    nbytes: int


@dataclass(frozen=True)
class OpGraph:
    """Nodes in topological order, edges carrying tensors, graph inputs and outputs."""

    name: str
    granularity: str  # "op" | "fine" | "coarse"
    nodes: tuple[OpNode, ...]
    edges: tuple[Edge, ...]
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    tensors: Mapping[str, TensorInfo] = field(repr=False, compare=False)
    model_sha256: str = ""
    opset: int = 0
    ir_version: int = 0

    @functools.cached_property
    def index(self) -> dict[str, OpNode]:
        return {n.name: n for n in self.nodes}

    @functools.cached_property
    def successors(self) -> dict[str, tuple[str, ...]]:
        succ: dict[str, list[str]] = {n.name: [] for n in self.nodes}
        for e in self.edges:
            if e.dst not in succ[e.src]:
                succ[e.src].append(e.dst)
        return {k: tuple(v) for k, v in succ.items()}

    @functools.cached_property
    def predecessors(self) -> dict[str, tuple[str, ...]]:
        pred: dict[str, list[str]] = {n.name: [] for n in self.nodes}
        for e in self.edges:
            if e.src not in pred[e.dst]:
                pred[e.dst].append(e.src)
        return {k: tuple(v) for k, v in pred.items()}

    @functools.cached_property
    def producer(self) -> dict[str, str]:
        """Tensor name -> the node producing it (graph inputs have none)."""
        return {t: n.name for n in self.nodes for t in n.outputs}

    @property
    def total_flops(self) -> int:
        return sum(n.flops for n in self.nodes)

    @property
    def param_bytes(self) -> int:
        return sum(n.param_bytes for n in self.nodes)

    @property
    def activation_bytes(self) -> int:
        """Bytes of every tensor a node hands to another node or to the caller."""
        produced = {t for n in self.nodes for t in n.outputs}
        return sum(self.tensors[t].nbytes for t in produced if t in self.tensors)

    def forks(self) -> dict[str, int]:
        """Nodes whose outputs go to two or more nodes -> number of branches leaving them."""
        return {k: len(v) for k, v in self.successors.items() if len(v) >= 2}

    def max_parallel_width(self) -> int:
        """Largest set of nodes no two of which depend on each other (Dilworth: n - max matching)."""
        names = [n.name for n in self.nodes]
        pos = {n: i for i, n in enumerate(names)}
        reach = [0] * len(names)  # bitset of descendants
        for name in reversed(names):
            bits = 0
            for s in self.successors[name]:
                bits |= (1 << pos[s]) | reach[pos[s]]
            reach[pos[name]] = bits
        import networkx as nx
        from networkx.algorithms import bipartite

        pairs = nx.Graph()
        left = [("out", u) for u in range(len(names))]
        pairs.add_nodes_from(left)
        pairs.add_nodes_from(("in", v) for v in range(len(names)))
        for u in range(len(names)):
            bits = reach[u]
            while bits:
                low = bits & -bits
                pairs.add_edge(("out", u), ("in", low.bit_length() - 1))
                bits ^= low
        matching = bipartite.hopcroft_karp_matching(pairs, top_nodes=left)
        return len(names) - len(matching) // 2


def _tensor_infos(model: onnx.ModelProto) -> dict[str, TensorInfo]:
    infos: dict[str, TensorInfo] = {}
    g = model.graph
    for vi in [*g.input, *g.value_info, *g.output]:
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
            continue
        dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim)
        if any(d < 0 for d in dims):
            continue
        size = _DTYPE_BYTES.get(tt.elem_type, 4)
        infos[vi.name] = TensorInfo(
            vi.name, dims, onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type).name, math.prod(dims) * size
        )
    for init in g.initializer:
        dims = tuple(init.dims)
        infos[init.name] = TensorInfo(
            init.name,
            dims,
            onnx.helper.tensor_dtype_to_np_dtype(init.data_type).name,
            math.prod(dims) * _DTYPE_BYTES.get(init.data_type, 4),
        )
    return infos


CONTROL_FLOW = frozenset({"If", "Loop", "Scan"})


def subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graphs a node carries in its attributes (the branches of an If, the body of a Loop or Scan)."""
    out: list[onnx.GraphProto] = []
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            out.append(a.g)
        elif a.type == onnx.AttributeProto.GRAPHS:
            out.extend(a.graphs)
    return out


def outer_reads(node: onnx.NodeProto) -> list[str]:
    """Tensors of the enclosing graph that a node's subgraphs read implicitly (not through ``node.input``)."""
    reads: list[str] = []

    def walk(g: onnx.GraphProto, bound: set[str]) -> None:
        local = set(bound) | {i.name for i in g.input} | {t.name for t in g.initializer}
        local |= {t.values.name for t in g.sparse_initializer}
        for n in g.node:
            for t in n.input:
                if t and t not in local and t not in reads:
                    reads.append(t)
            for sub in subgraphs(n):
                walk(sub, local)
            local |= {o for o in n.output if o}

    for g in subgraphs(node):
        walk(g, set())
    return reads


def all_reads(node: onnx.NodeProto) -> list[str]:
    """Every tensor a node reads: its inputs, then what its subgraphs read from outside."""
    return list(dict.fromkeys([*(t for t in node.input if t), *outer_reads(node)]))


def _subgraph_weights(node: onnx.NodeProto, shapes: Mapping[str, tuple[int, ...]]) -> tuple[int, int]:
    """(bytes of weights, FLOPs as far as shapes are known) inside a node's subgraphs."""
    params = flops = 0
    for g in subgraphs(node):
        inner = dict(shapes)
        for vi in [*g.input, *g.value_info, *g.output]:
            tt = vi.type.tensor_type
            if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
                inner[vi.name] = tuple(d.dim_value for d in tt.shape.dim)
        for t in g.initializer:
            params += math.prod(t.dims) * _DTYPE_BYTES.get(t.data_type, 4)
            inner[t.name] = tuple(t.dims)
        for n in g.node:
            if n.op_type == "Constant":
                for a in n.attribute:
                    if a.type == onnx.AttributeProto.TENSOR:
                        params += len(a.t.raw_data) or math.prod(a.t.dims) * _DTYPE_BYTES.get(a.t.data_type, 4)
            flops += node_flops(n, inner)
            p, f = _subgraph_weights(n, inner)
            params, flops = params + p, flops + f
    return params, flops


def _topological(model: onnx.ModelProto, available: set[str]) -> list[onnx.NodeProto]:
    """Kahn's algorithm, stable in file order; refuses graphs whose nodes read unknown tensors."""
    nodes = list(model.graph.node)
    produced = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    sorter: graphlib.TopologicalSorter[int] = graphlib.TopologicalSorter()
    for i, n in enumerate(nodes):
        reads = all_reads(n)
        missing = [t for t in reads if t not in available and t not in produced]
        if missing:
            raise ModelError(f"node {n.name!r} reads {missing[0]!r}, which no node, input or initializer provides")
        sorter.add(i, *{produced[t] for t in reads if t not in available and t in produced and produced[t] != i})
    try:
        sorter.prepare()
    except graphlib.CycleError as exc:
        raise ModelError(f"the graph has a cycle through nodes {[nodes[i].name for i in exc.args[1]][:6]}") from None
    order: list[int] = []
    ready: list[int] = []
    while sorter.is_active():  # among the ready nodes, always the first in file order: stable and deterministic
        for i in sorter.get_ready():
            heapq.heappush(ready, i)
        i = heapq.heappop(ready)
        order.append(i)
        sorter.done(i)
    return [nodes[i] for i in order]


def build_graph(model: onnx.ModelProto, sha256: str = "", name: str = "", partial: bool = False) -> OpGraph:
    """The operator-level OpGraph of a model returned by ``load_onnx`` (static shapes, named nodes).

    ``partial`` (for ``inspect`` only) accepts graph outputs whose shape is unknown: they get shape ``()``
    and 0 bytes instead of an error.
    """
    g = model.graph
    infos = _tensor_infos(model)
    shapes = {k: v.shape for k, v in infos.items()}
    init_names = {t.name for t in g.initializer}
    graph_inputs = [i.name for i in g.input if i.name not in init_names]
    ordered = _topological(model, init_names | set(graph_inputs))
    # Weights: each initializer counts once, for the first node reading it; Constants count their value.
    owner: dict[str, str] = {}
    reads = {node.name: all_reads(node) for node in ordered}
    for node in ordered:
        for t in reads[node.name]:
            if t in init_names and t not in owner:
                owner[t] = node.name
    consumers: dict[str, list[str]] = {}
    for node in ordered:
        for t in reads[node.name]:
            if t not in init_names:
                consumers.setdefault(t, []).append(node.name)
    graph_outputs = {o.name for o in g.output}

    nodes: list[OpNode] = []
    edges: list[Edge] = []
    producer: dict[str, str] = {}
    for node in ordered:
        params = sum(infos[t].nbytes for t in reads[node.name] if owner.get(t) == node.name and t in infos)
        if node.op_type == "Constant":
            for a in node.attribute:
                if a.type == onnx.AttributeProto.TENSOR:
                    params += len(a.t.raw_data) or math.prod(a.t.dims) * _DTYPE_BYTES.get(a.t.data_type, 4)
        flops = node_flops(node, shapes)
        if node.op_type in CONTROL_FLOW or subgraphs(node):
            inner_params, inner_flops = _subgraph_weights(node, shapes)
            params, flops = params + inner_params, flops + inner_flops
        cls = op_class(node, shapes)
        outputs = tuple(o for o in node.output if o and (o in consumers or o in graph_outputs))
        dyn_inputs = tuple(t for t in reads[node.name] if t not in init_names)
        nodes.append(
            OpNode(
                name=node.name,
                op_type=node.op_type,
                members=(node.name,),
                inputs=dyn_inputs,
                outputs=outputs,
                flops=flops,
                param_bytes=params,
                flops_by_class=((cls, flops),),
                op_types=(node.op_type,),
            )
        )
        for t in dyn_inputs:
            if t in producer:
                edges.append(Edge(producer[t], node.name, t, infos[t].nbytes if t in infos else 0))
        for o in node.output:
            if o:
                producer[o] = node.name

    def info(name: str) -> TensorInfo:
        if name not in infos and partial:
            return TensorInfo(name, (), "unknown", 0)
        if name not in infos:
            raise ModelError(f"shape inference left tensor {name!r} without a static shape; give static input shapes")
        return infos[name]

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    return OpGraph(
        name=name or g.name or "model",
        granularity="op",
        nodes=tuple(nodes),
        edges=tuple(edges),
        inputs=tuple(info(i) for i in graph_inputs),
        outputs=tuple(info(o.name) for o in g.output),
        tensors=infos,
        model_sha256=sha256,
        opset=opset,
        ir_version=model.ir_version,
    )
