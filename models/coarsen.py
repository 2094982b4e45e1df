"""Coarsening: group operators into blocks, the units the planner places.

``fine``: one block per operator, except that an elementwise op whose only dynamic
input comes from a producer with no other reader is fused into that producer
(Conv -> BatchNorm -> Relu is one block), and Constants join their only reader.
``coarse``: on top of fine, every linear chain (a block with one successor whose
successor has one predecessor) is contracted, so each branch of an Inception
block or a residual body becomes one block and the trunk between forks another.
"""

from __future__ import annotations

from collections.abc import Iterable

from models.errors import ModelError
from models.graph import Edge, OpGraph, OpNode
from models.ops import FUSABLE

GRANULARITIES = ("op", "fine", "coarse")


class _UnionFind:
    def __init__(self, names: Iterable[str]) -> None:
        self.parent = {n: n for n in names}

    def find(self, x: str) -> str:
        root = x
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[x] != root:
            self.parent[x], x = root, self.parent[x]
        return root

    def union(self, keep: str, other: str) -> None:
        self.parent[self.find(other)] = self.find(keep)


def coarsen(graph: OpGraph, granularity: str) -> OpGraph:
    """Return the block graph of an operator-level graph at ``fine`` or ``coarse`` granularity."""
    if graph.granularity != "op":
        raise ModelError(f"coarsen takes an operator-level graph, not a {graph.granularity!r} one")
    if granularity not in GRANULARITIES:
        raise ModelError(f"unknown granularity {granularity!r}; choose one of {', '.join(GRANULARITIES)}")
    if granularity == "op":
        return graph
    uf = _UnionFind(n.name for n in graph.nodes)
    _fuse_elementwise(graph, uf)
    if granularity == "coarse":
        _contract_chains(graph, uf)
    return _build_blocks(graph, uf, granularity)


def _fuse_elementwise(graph: OpGraph, uf: _UnionFind) -> None:
    graph_outputs = {t.name for t in graph.outputs}
    for node in graph.nodes:
        if node.op_type == "Constant":
            succ = graph.successors[node.name]
            if len(succ) == 1 and not set(node.outputs) & graph_outputs:
                uf.union(succ[0], node.name)
            continue
        if node.op_type not in FUSABLE:
            continue
        dynamic = [
            t
            for t in node.inputs
            if graph.producer.get(t) is None or graph.index[graph.producer[t]].op_type != "Constant"
        ]
        if len(dynamic) != 1 or dynamic[0] not in graph.producer:
            continue
        producer = graph.producer[dynamic[0]]
        if graph.successors[producer] == (node.name,) and not set(graph.index[producer].outputs) & graph_outputs:
            uf.union(producer, node.name)


def _contract_chains(graph: OpGraph, uf: _UnionFind) -> None:
    """Merge block u into v's block while u -> v is the only edge out of u and into v."""
    changed = True
    while changed:
        changed = False
        succ: dict[str, set[str]] = {}
        pred: dict[str, set[str]] = {}
        for e in graph.edges:
            a, b = uf.find(e.src), uf.find(e.dst)
            if a != b:
                succ.setdefault(a, set()).add(b)
                pred.setdefault(b, set()).add(a)
        outputs_of: dict[str, bool] = {}
        graph_outputs = {t.name for t in graph.outputs}
        for n in graph.nodes:
            if set(n.outputs) & graph_outputs:
                outputs_of[uf.find(n.name)] = True
        for a, targets in succ.items():
            if len(targets) != 1 or outputs_of.get(a):
                continue
            (b,) = targets
            if len(pred.get(b, ())) == 1 and uf.find(a) != uf.find(b):
                uf.union(a, b)
                changed = True


def _build_blocks(graph: OpGraph, uf: _UnionFind, granularity: str) -> OpGraph:
    groups: dict[str, list[OpNode]] = {}
    for node in graph.nodes:  # topological order, so members stay topologically ordered
        groups.setdefault(uf.find(node.name), []).append(node)
    block_of = {m.name: root for root, members in groups.items() for m in members}
    graph_outputs = {t.name for t in graph.outputs}
    names: dict[str, str] = {}
    for i, (root, members) in enumerate(groups.items()):
        names[root] = f"b{i:03d}_{members[0].name}" if len(members) > 1 else members[0].name

    blocks: list[OpNode] = []
    for root, members in groups.items():
        produced = {t for m in members for t in m.outputs}
        inside = {m.name for m in members}
        inputs = tuple(dict.fromkeys(t for m in members for t in m.inputs if t not in produced))
        leaving = []
        for m in members:
            for t in m.outputs:
                readers = [s for s in graph.successors[m.name] if t in graph.index[s].inputs]
                if t in graph_outputs or any(r not in inside for r in readers):
                    leaving.append(t)
        by_class: dict[str, int] = {}
        for m in members:
            for cls, f in m.flops_by_class:
                by_class[cls] = by_class.get(cls, 0) + f
        blocks.append(
            OpNode(
                name=names[root],
                op_type="+".join(dict.fromkeys(m.op_type for m in members)) if len(members) > 1 else members[0].op_type,
                members=tuple(m.name for m in members),
                inputs=inputs,
                outputs=tuple(leaving),
                flops=sum(m.flops for m in members),
                param_bytes=sum(m.param_bytes for m in members),
                flops_by_class=tuple(sorted(by_class.items())),
                op_types=tuple(sorted({m.op_type for m in members})),
            )
        )
    edges = tuple(
        Edge(names[block_of[e.src]], names[block_of[e.dst]], e.tensor, e.nbytes)
        for e in graph.edges
        if block_of[e.src] != block_of[e.dst]
    )
    return OpGraph(
        name=graph.name,
        granularity=granularity,
        nodes=_topo(blocks, edges),
        edges=edges,
        inputs=graph.inputs,
        outputs=graph.outputs,
        tensors=graph.tensors,
        model_sha256=graph.model_sha256,
        opset=graph.opset,
        ir_version=graph.ir_version,
    )


def _topo(blocks: list[OpNode], edges: tuple[Edge, ...]) -> tuple[OpNode, ...]:
    """Blocks ordered by dependencies (first member's position breaks ties)."""
    pos = {b.name: i for i, b in enumerate(blocks)}
    waiting = {b.name: 0 for b in blocks}
    succ: dict[str, set[str]] = {b.name: set() for b in blocks}
    for e in edges:
        if e.dst not in succ[e.src]:
            succ[e.src].add(e.dst)
            waiting[e.dst] += 1
    ready = sorted((n for n, w in waiting.items() if w == 0), key=pos.__getitem__)
    order: list[OpNode] = []
    while ready:
        n = ready.pop(0)
        order.append(blocks[pos[n]])
        for s in succ[n]:
            waiting[s] -= 1
            if waiting[s] == 0:
                ready.append(s)
        ready.sort(key=pos.__getitem__)
    if len(order) != len(blocks):
        raise ModelError("coarsening produced a cycle between blocks; report this model as a bug")
    return tuple(order)
