"""Cutting a model into partitions by the tensor names at their boundaries.

A grouping maps partition names to ONNX node names. It is valid when every node is in
exactly one partition and the partitions depend on each other without a cycle;
partitions with no path between them run in parallel. Each partition is extracted by
``GroupExtractor`` (control-flow nodes stay whole, with what their subgraphs read),
and ``verify_partitions`` runs them chained with onnxruntime against the full model.
Partition names may be anything a model file holds; file names are made from them
with ``models.names.safe_name``.
"""

from __future__ import annotations

import graphlib
import hashlib
import heapq
import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from models.errors import PartitionError
from models.files import atomic_write
from models.graph import OpGraph, all_reads, subgraphs
from models.inputs import input_specs, make_feeds
from models.names import safe_name
from models.onnx_io import write_model_atomic

MANIFEST_VERSION = 1
VERIFY_TOLERANCE = 1e-5  # absolute floor of the allowed difference
VERIFY_RELATIVE = 1e-4  # allowed difference relative to the output's scale (its largest magnitude)


@dataclass(frozen=True)
class OutputCheck:
    """How far outputs are from the full model's: the largest absolute difference and the outputs' scale."""

    max_abs_diff: float
    scale: float

    @property
    def allowed(self) -> float:
        return max(VERIFY_TOLERANCE, VERIFY_RELATIVE * self.scale)

    @property
    def ok(self) -> bool:
        return self.max_abs_diff <= self.allowed

    def describe(self) -> str:
        return (
            f"max abs diff {self.max_abs_diff:.3g} (allowed {self.allowed:.3g}: {VERIFY_RELATIVE:g} of the "
            f"output scale {self.scale:.3g}, at least {VERIFY_TOLERANCE:g})"
        )


def compare_outputs(expected: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray]) -> OutputCheck:
    """Outputs against the full model's, by name; NaN matches NaN, a shape mismatch is an error."""
    worst = scale = 0.0
    for name, ref in expected.items():
        if name not in got:
            raise PartitionError(f"output {name!r} is missing from the partitions' results")
        val = np.asarray(got[name])
        ref = np.asarray(ref)
        if val.shape != ref.shape:
            raise PartitionError(f"output {name!r}: partitions give shape {val.shape}, the full model {ref.shape}")
        if not ref.size:
            continue
        a, b = ref.astype(np.float64), val.astype(np.float64)
        both_nan = np.isnan(a) & np.isnan(b)
        diff = np.where(both_nan, 0.0, np.abs(a - b))
        worst = max(worst, float(np.max(np.where(np.isnan(diff), np.inf, diff))))
        finite = np.abs(a[np.isfinite(a)])
        scale = max(scale, float(finite.max()) if finite.size else 0.0)
    return OutputCheck(worst, scale)


@dataclass(frozen=True)
class Partition:
    name: str
    nodes: tuple[str, ...]  # ONNX node names, topological order
    inputs: tuple[str, ...]  # boundary tensors read (graph inputs or other partitions' outputs)
    outputs: tuple[str, ...]  # boundary tensors produced (read by other partitions or graph outputs)
    model: onnx.ModelProto

    def sha256(self) -> str:
        return hashlib.sha256(self.model.SerializeToString()).hexdigest()


@dataclass(frozen=True)
class TensorRoute:
    """A tensor crossing a partition boundary: who makes it (None = graph input) and who reads it."""

    tensor: str
    producer: str | None
    consumers: tuple[str, ...]
    nbytes: int
    graph_output: bool


@dataclass(frozen=True)
class PartitionSet:
    partitions: tuple[Partition, ...]  # dependency order
    routes: tuple[TensorRoute, ...]
    graph_inputs: tuple[str, ...]
    graph_outputs: tuple[str, ...]
    model_sha256: str

    def by_name(self, name: str) -> Partition:
        return next(p for p in self.partitions if p.name == name)

    def dependencies(self) -> dict[str, tuple[str, ...]]:
        """Partition -> the partitions it reads from."""
        deps: dict[str, set[str]] = {p.name: set() for p in self.partitions}
        for r in self.routes:
            for c in r.consumers:
                if r.producer is not None:
                    deps[c].add(r.producer)
        return {k: tuple(sorted(v)) for k, v in deps.items()}

    def parallel_pairs(self) -> list[tuple[str, str]]:
        """Pairs of partitions with no path between them (they can run at the same time)."""
        deps = self.dependencies()
        ancestors: dict[str, set[str]] = {}
        for p in self.partitions:
            anc: set[str] = set()
            for d in deps[p.name]:
                anc |= {d} | ancestors[d]
            ancestors[p.name] = anc
        names = [p.name for p in self.partitions]
        return [
            (a, b)
            for i, a in enumerate(names)
            for b in names[i + 1 :]
            if a not in ancestors[b] and b not in ancestors[a]
        ]

    def manifest(self) -> dict[str, object]:
        return {
            "version": MANIFEST_VERSION,
            "model_sha256": self.model_sha256,
            "graph_inputs": list(self.graph_inputs),
            "graph_outputs": list(self.graph_outputs),
            "partitions": [
                {
                    "name": p.name,
                    "file": f"{safe_name(p.name)}.onnx",
                    "sha256": p.sha256(),
                    "nodes": list(p.nodes),
                    "inputs": list(p.inputs),
                    "outputs": list(p.outputs),
                    "after": list(self.dependencies()[p.name]),
                }
                for p in self.partitions
            ],
            "tensors": [
                {
                    "name": r.tensor,
                    "producer": r.producer,
                    "consumers": list(r.consumers),
                    "bytes": r.nbytes,
                    "graph_output": r.graph_output,
                }
                for r in self.routes
            ],
        }

    def save(self, folder: Path) -> Path:
        """Write one .onnx per partition and manifest.json (each file written atomically)."""
        folder.mkdir(parents=True, exist_ok=True)
        for p in self.partitions:
            write_model_atomic(p.model, folder / f"{safe_name(p.name)}.onnx")
        return atomic_write(folder / "manifest.json", json.dumps(self.manifest(), indent=2) + "\n")


def _validate(graph: OpGraph, groups: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """Every node in exactly one partition; returns node -> partition."""
    if not groups:
        raise PartitionError("no partitions given")
    known = {n.name for n in graph.nodes}
    part_of: dict[str, str] = {}
    for part, nodes in groups.items():
        if not part:
            raise PartitionError("a partition has an empty name")
        if not nodes:
            raise PartitionError(f"partition {part!r} holds no nodes")
        for node in nodes:
            if node not in known:
                raise PartitionError(f"partition {part!r} names node {node!r}, which the model does not have")
            if node in part_of and part_of[node] != part:
                raise PartitionError(f"node {node!r} is in two partitions: {part_of[node]!r} and {part!r}")
            part_of[node] = part
    missing = [n.name for n in graph.nodes if n.name not in part_of]
    if missing:
        more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
        raise PartitionError(f"{len(missing)} node(s) are in no partition: {', '.join(missing[:8])}{more}")
    return part_of


def _partition_order(graph: OpGraph, part_of: dict[str, str], names: list[str]) -> list[str]:
    """Topological order of partitions, keeping the caller's order where dependencies allow;
    a cycle is reported with the operator edges that close it."""
    succ: dict[str, dict[str, tuple[str, str]]] = {p: {} for p in names}
    for e in graph.edges:
        a, b = part_of[e.src], part_of[e.dst]
        if a != b:
            succ[a].setdefault(b, (e.src, e.dst))
    sorter: graphlib.TopologicalSorter[int] = graphlib.TopologicalSorter()
    index = {p: i for i, p in enumerate(names)}
    for p in names:
        sorter.add(index[p])
        for q in succ[p]:
            sorter.add(index[q], index[p])
    try:
        sorter.prepare()
    except graphlib.CycleError as exc:
        cycle = [names[i] for i in exc.args[1]]  # in the direction data flows
        hops = [f"{succ[x][y][0]} ({x}) -> {succ[x][y][1]} ({y})" for x, y in itertools.pairwise(cycle)]
        raise PartitionError(
            "partitions form a cycle "
            + " -> ".join(cycle)
            + ": "
            + "; ".join(hops)
            + ". Move these nodes so data flows one way between partitions."
        ) from None
    order: list[int] = []
    ready: list[int] = []
    while sorter.is_active():
        for i in sorter.get_ready():
            heapq.heappush(ready, i)
        i = heapq.heappop(ready)
        order.append(i)
        sorter.done(i)
    return [names[i] for i in order]


def cut_partitions(model: onnx.ModelProto, graph: OpGraph, groups: Mapping[str, Sequence[str]]) -> PartitionSet:
    """Cut ``model`` (as returned by ``load_onnx``) into one ONNX model per group of ONNX node names."""
    if graph.granularity != "op":
        raise PartitionError("cut_partitions takes the operator-level graph; expand blocks with their members")
    part_of = _validate(graph, groups)
    order = _partition_order(graph, part_of, list(groups))
    graph_inputs = tuple(t.name for t in graph.inputs)
    graph_outputs = tuple(t.name for t in graph.outputs)

    producer_part: dict[str, str | None] = {t: None for t in graph_inputs}
    for node in graph.nodes:
        for t in node.outputs:
            producer_part[t] = part_of[node.name]
    readers: dict[str, list[str]] = {}
    for node in graph.nodes:
        for t in node.inputs:
            p = part_of[node.name]
            if producer_part.get(t) != p and p not in readers.setdefault(t, []):
                readers[t].append(p)
    routes = tuple(
        TensorRoute(
            tensor=t,
            producer=producer_part.get(t),
            consumers=tuple(sorted(readers.get(t, []), key=order.index)),
            nbytes=graph.tensors[t].nbytes if t in graph.tensors else 0,
            graph_output=t in graph_outputs,
        )
        for t in dict.fromkeys([*readers, *graph_outputs])
    )

    extractor = GroupExtractor(model, graph)
    parts = []
    for name in order:
        members = [n.name for n in graph.nodes if part_of[n.name] == name]
        inputs = tuple(r.tensor for r in routes if name in r.consumers)
        outputs = tuple(r.tensor for r in routes if r.producer == name)
        parts.append(extractor.extract(name, members, inputs, outputs))
    return PartitionSet(tuple(parts), routes, graph_inputs, graph_outputs, graph.model_sha256)


class GroupExtractor:
    """Cuts groups of nodes out of one model.

    Written here rather than with ``onnx.utils.Extractor``, which follows only
    ``node.input`` and so loses what the subgraphs of ``If``/``Loop``/``Scan`` read from
    the enclosing graph; a control-flow node with its subgraphs is one opaque node here.
    """

    def __init__(self, model: onnx.ModelProto, graph: OpGraph) -> None:
        self.model = model
        self.graph = graph
        self.nodes = {n.name: n for n in model.graph.node}
        self.order = {n.name: i for i, n in enumerate(graph.nodes)}
        self.inits = {t.name: t for t in model.graph.initializer}
        self.infos: dict[str, onnx.ValueInfoProto] = {}
        for vi in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
            self.infos.setdefault(vi.name, vi)

    def boundary(self, members: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(tensors the group reads from outside, tensors it produces that outside or the caller reads)."""
        inside = set(members)
        index = self.graph.index
        produced = {t for m in members for t in index[m].outputs}
        inputs = tuple(dict.fromkeys(t for m in members for t in index[m].inputs if t not in produced))
        graph_outputs = {t.name for t in self.graph.outputs}
        outputs = []
        for m in members:
            for t in index[m].outputs:
                readers = [s for s in self.graph.successors[m] if s not in inside and t in index[s].inputs]
                if readers or t in graph_outputs:
                    outputs.append(t)
        return inputs, tuple(outputs)

    def _check_convex(self, name: str, members: Sequence[str]) -> None:
        """No path leaves the group and comes back (the partition could not run as one piece)."""
        inside = set(members)
        frontier = [s for m in members for s in self.graph.successors[m] if s not in inside]
        seen: set[str] = set()
        while frontier:
            n = frontier.pop()
            if n in seen:
                continue
            seen.add(n)
            for s in self.graph.successors[n]:
                if s in inside:
                    raise PartitionError(
                        f"partition {name!r} does not cut cleanly: {n!r}, outside it, reads from it and feeds "
                        f"{s!r} inside it (the group must be convex)"
                    )
                frontier.append(s)

    def _value_info(self, tensor: str, symbolic: bool = False) -> onnx.ValueInfoProto:
        if tensor in self.infos:
            vi = self.infos[tensor]
        else:
            info = self.graph.tensors.get(tensor)
            if info is None:
                raise PartitionError(f"tensor {tensor!r} has no known type and shape; cannot cut the model there")
            vi = onnx.helper.make_tensor_value_info(
                tensor, onnx.helper.np_dtype_to_tensor_dtype(np.dtype(info.dtype)), list(info.shape)
            )
        if not symbolic:
            return vi
        tt = vi.type.tensor_type
        rank = len(tt.shape.dim)
        return onnx.helper.make_tensor_value_info(tensor, tt.elem_type, [f"d{i}" for i in range(rank)])

    def extract(
        self,
        name: str,
        members: Sequence[str],
        inputs: Sequence[str] | None = None,
        outputs: Sequence[str] | None = None,
    ) -> Partition:
        if inputs is None or outputs is None:
            inputs, outputs = self.boundary(members)
        if not outputs:
            raise PartitionError(f"partition {name!r} produces nothing another partition or the caller reads")
        unknown = [m for m in members if m not in self.nodes]
        if unknown:
            raise PartitionError(f"partition {name!r} names node {unknown[0]!r}, which the model does not have")
        self._check_convex(name, members)
        ordered = sorted(dict.fromkeys(members), key=lambda m: self.order[m])
        nodes = [self.nodes[m] for m in ordered]
        read = {t for n in nodes for t in all_reads(n)}
        produced = {o for n in nodes for o in n.output if o}
        initializers = [t for t in self.model.graph.initializer if t.name in read]
        # Control flow: ORT type-checks every branch against the declared shapes, and a branch not taken may
        # not fit concrete ones; declare the boundary by rank only and leave the inside to ORT.
        symbolic = any(subgraphs(n) for n in nodes)
        inner = [] if symbolic else [self._value_info(t) for t in produced if t in self.infos and t not in set(outputs)]
        sub = onnx.helper.make_graph(
            nodes,
            name,
            [self._value_info(t, symbolic) for t in inputs],
            [self._value_info(t, symbolic) for t in outputs],
            initializer=initializers,
            value_info=inner,
        )
        model = onnx.helper.make_model(sub, opset_imports=list(self.model.opset_import))
        model.ir_version = self.model.ir_version
        model.functions.extend(self.model.functions)
        model.producer_name = self.model.producer_name
        return Partition(name, tuple(ordered), tuple(inputs), tuple(outputs), model)


def run_partitions(parts: PartitionSet, feeds: Mapping[str, np.ndarray], threads: int = 0) -> dict[str, np.ndarray]:
    """Run the partitions chained in dependency order with onnxruntime; return the graph outputs."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3  # unused-initializer warnings of cut models are not the user's concern
    values: dict[str, np.ndarray] = dict(feeds)
    for p in parts.partitions:
        session = ort.InferenceSession(p.model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        result = session.run(list(p.outputs), {t: values[t] for t in p.inputs})
        values.update(zip(p.outputs, result, strict=True))
    return {t: values[t] for t in parts.graph_outputs}


def verify_partitions(
    model: onnx.ModelProto, parts: PartitionSet, feeds: Mapping[str, np.ndarray], tolerance: float | None = None
) -> float:
    """Chained partitions vs the full model on the same inputs; returns the max abs difference.

    Raises above ``tolerance`` when given, else above ``OutputCheck.allowed`` (relative to the outputs' scale).
    """
    import onnxruntime as ort

    full = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = dict(zip(parts.graph_outputs, full.run(list(parts.graph_outputs), dict(feeds)), strict=True))
    check = compare_outputs(expected, run_partitions(parts, feeds))
    if (tolerance is not None and check.max_abs_diff > tolerance) or (tolerance is None and not check.ok):
        raise PartitionError(f"chained partitions differ from the full model: {check.describe()}")
    return check.max_abs_diff


def random_feeds(graph: OpGraph, model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs for checks, made by the rules the graph shows (``models.inputs``): ids below their table, etc."""
    specs = input_specs(model, {t.name: (t.dtype, t.shape) for t in graph.inputs})
    return make_feeds(specs, seed=seed)


def example_grouping(blocks: OpGraph, parts: int = 4) -> dict[str, list[str]]:
    """A valid grouping of ONNX nodes into ``parts`` partitions, with a parallel pair when the graph has one.

    Two independent blocks A and B near the middle become partitions of their own;
    their common ancestors form the head (split by topological prefix if more parts
    are wanted) and everything else the tail. Without independent blocks (a pure
    chain such as MobileNetV2) the topological order is cut into contiguous pieces.
    """
    if parts < 1:
        raise PartitionError("ask for at least one partition")
    order = [n.name for n in blocks.nodes]
    if parts > len(order):
        raise PartitionError(f"the graph has {len(order)} blocks; it cannot be cut into {parts} partitions")
    members = {n.name: list(n.members) for n in blocks.nodes}
    pair = _middle_pair(blocks) if parts >= 3 else None
    if pair is None:
        return _contiguous(order, members, parts)
    a, b = pair
    ancestors = _ancestors(blocks)
    head = [n for n in order if n in ancestors[a] | ancestors[b]]
    tail = [n for n in order if n not in ancestors[a] | ancestors[b] and n not in (a, b)]
    groups: dict[str, list[str]] = {}
    head_parts = max(0, min(parts - 2 - (1 if tail else 0), len(head)))
    if head and head_parts == 0:
        tail = head + tail  # still valid: head precedes everything it feeds
        tail.sort(key=order.index)
    for i, chunk in enumerate(_chunks(head, head_parts)):
        groups[f"p{len(groups)}_head{i}"] = [m for n in chunk for m in members[n]]
    groups[f"p{len(groups)}_branch_a"] = members[a]
    groups[f"p{len(groups)}_branch_b"] = members[b]
    if tail:
        groups[f"p{len(groups)}_tail"] = [m for n in tail for m in members[n]]
    return groups


def _ancestors(blocks: OpGraph) -> dict[str, set[str]]:
    anc: dict[str, set[str]] = {}
    for n in blocks.nodes:
        acc: set[str] = set()
        for p in blocks.predecessors[n.name]:
            acc |= {p} | anc[p]
        anc[n.name] = acc
    return anc


def _middle_pair(blocks: OpGraph) -> tuple[str, str] | None:
    """Two blocks with no path between them, the pair closest to the middle by FLOPs."""
    anc = _ancestors(blocks)
    order = [n.name for n in blocks.nodes]
    total = sum(n.flops for n in blocks.nodes) or 1
    done = 0
    position: dict[str, float] = {}
    for n in blocks.nodes:
        done += n.flops
        position[n.name] = done / total
    best: tuple[float, tuple[str, str]] | None = None
    for fork, succ in blocks.successors.items():
        for i, a in enumerate(succ):
            for b in succ[i + 1 :]:
                if a in anc[b] or b in anc[a]:
                    continue
                score = abs(position[fork] - 0.5)
                if best is None or score < best[0]:
                    best = (score, (a, b) if order.index(a) < order.index(b) else (b, a))
    return best[1] if best else None


def _chunks(names: list[str], k: int) -> list[list[str]]:
    if k <= 0:
        return []
    size, extra = divmod(len(names), k)
    out, start = [], 0
    for i in range(k):
        end = start + size + (1 if i < extra else 0)
        out.append(names[start:end])
        start = end
    return [c for c in out if c]


def _contiguous(order: list[str], members: dict[str, list[str]], parts: int) -> dict[str, list[str]]:
    return {f"p{i}": [m for n in chunk for m in members[n]] for i, chunk in enumerate(_chunks(order, parts))}
