"""Lowering a plan to segments: the partitions the executor runs, one onnxruntime session each.

A unit (one assignment: a PU, or a set of cores of a CPU cluster) runs its blocks of
a stage as partitions. A partition starts when all its inputs have arrived and hands
its outputs on when it ends, so it must not hold a block that waits for more than
the partition before it, nor keep an output that another unit waits for: a block
continues the partition its unit ran last only when every one of its inputs comes
from that partition or from a partition of the same unit that it already waits for,
and no block of the partition sends to another unit or stage; otherwise (an input
from another unit or stage, from a partition it does not wait for, or no input) it
starts a new partition, and a block whose output leaves the unit ends its partition.
So partitions are runs of consecutive blocks in the unit's order. So a partition's only outside
inputs are those of its first block, independent branches on one unit are
independent partitions, and (fork on A, branch on B, join on A) splits A's blocks at
the join. A partition P waits only on partitions whose blocks precede P's first
block, so the partitions of a frame form a DAG. ``planner.ilp.partition_starts`` is
the same rule on the ILP's block indices.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from device_profiles.schema import DeviceProfile
from models.graph import OpGraph
from planner.plan import Plan, core_ids
from planner.unitname import UnitName

UnitKey = tuple[int, int, int]  # (stage, replica group, assignment index)


@dataclass(frozen=True)
class Segment:
    stage: int
    group: int
    unit: int  # assignment index within the group
    index: int  # segment number within the unit (dense, from 0)
    pu: UnitName
    cores: int
    core_ids: tuple[int, ...]
    blocks: tuple[str, ...]  # topological order
    members: tuple[str, ...]  # ONNX node names, topological order

    @property
    def key(self) -> tuple[int, int, int, int]:
        return (self.stage, self.group, self.unit, self.index)

    @property
    def unit_key(self) -> UnitKey:
        return (self.stage, self.group, self.unit)

    @property
    def name(self) -> str:
        return f"s{self.stage}g{self.group}u{self.unit}_{self.pu}_p{self.index}"


def block_edges(plan: Plan, graph: OpGraph) -> dict[tuple[str, str], dict[str, int]]:
    """(producer block, consumer block) -> {tensor: bytes}."""
    block_of = {m: b for b, ms in plan.blocks.items() for m in ms}
    flows: dict[tuple[str, str], dict[str, int]] = {}
    for e in graph.edges:
        a, b = block_of[e.src], block_of[e.dst]
        if a != b:
            flows.setdefault((a, b), {})[e.tensor] = e.nbytes
    return flows


def lower(plan: Plan, graph: OpGraph, profile: DeviceProfile) -> list[Segment]:
    """Every segment of every stage and replica group, stage by stage; a unit's segments in the order it
    runs them (``Segment.index``)."""
    order = _block_order(plan, graph)
    preds: dict[str, set[str]] = {b: set() for b in plan.blocks}
    succs: dict[str, set[str]] = {b: set() for b in plan.blocks}
    for a, b in block_edges(plan, graph):
        preds[b].add(a)
        succs[a].add(b)
    cores = core_ids(plan, profile)
    out: list[Segment] = []
    for s, stage in enumerate(plan.stages):
        for g, group in enumerate(stage.groups):
            unit_of = {b: i for i, a in enumerate(group) for b in a.blocks}
            sequence = _run_order(group, preds, order)
            part: dict[str, str] = {}  # block -> the first block of its partition
            feeds: dict[str, set[str]] = {}  # partition -> the partitions it waits for
            last: dict[int, str] = {}  # unit -> the block it ran last
            closed: set[str] = set()  # partitions holding a block whose output leaves the unit
            for b in sequence:
                u = unit_of[b]
                current = part.get(last.get(u, ""))
                if (
                    preds[b]
                    and current is not None
                    and current not in closed
                    and all(
                        p in unit_of and unit_of[p] == u and (part[p] == current or part[p] in feeds[current])
                        for p in preds[b]
                    )
                ):
                    part[b] = current  # it waits for nothing the partition does not wait for already
                else:
                    part[b] = b
                    feeds[b] = {part.get(p, p) for p in preds[b]}
                last[u] = b
                if any(x not in unit_of or unit_of[x] != u for x in succs[b]):
                    closed.add(part[b])  # its outputs leave when the partition ends: end it here
            rank = {b: k for k, b in enumerate(sequence)}
            for i, a in enumerate(group):
                firsts = sorted({part[b] for b in a.blocks}, key=rank.__getitem__)
                for dense, first in enumerate(firsts):
                    blocks = tuple(sorted((b for b in a.blocks if part[b] == first), key=rank.__getitem__))
                    members = tuple(m for b in blocks for m in plan.blocks[b])
                    out.append(Segment(s, g, i, dense, a.pu, a.cores, cores[(s, g, i)], blocks, members))
    return out


def segment_precision(plan: Plan, seg: Segment, profile: DeviceProfile) -> str:
    """The precision a segment runs in, as its cost-table entries are labelled (``Conditions.precision``).

    ``fp32`` where none of its blocks is int8 or fp16, and on a PU that does not compute fp32 (an NPU: its one
    precision is what the profiler measured there, and what the cost model prices it at); ``int8`` or ``fp16``
    where every block is; otherwise the mix, named by its reduced blocks (``int8:b3,b5``, in the segment's
    order), since the same nodes with other blocks reduced run at another speed."""
    if not seg.pu.spans and not profile.pu(seg.pu).computes("fp32"):
        return "fp32"
    reduced = [(b, plan.precision_of(b)) for b in seg.blocks if plan.precision_of(b) != "fp32"]
    if not reduced:
        return "fp32"
    kinds = sorted({p for _, p in reduced})
    if len(reduced) == len(seg.blocks) and len(kinds) == 1:
        return kinds[0]
    return "|".join(f"{k}:{','.join(b for b, p in reduced if p == k)}" for k in kinds)


def _run_order(group: tuple, preds: dict[str, set[str]], order: dict[str, int]) -> list[str]:
    """The group's blocks in an order that respects the data flow and every unit's own order (its
    assignment's block list); where the two contradict each other, data-flow order alone."""
    mine = {b for a in group for b in a.blocks}
    after: dict[str, set[str]] = {b: {p for p in preds[b] if p in mine} for b in mine}
    for a in group:
        for x, y in zip(a.blocks, a.blocks[1:], strict=False):
            after[y].add(x)
    waiting = {b: len(ps) for b, ps in after.items()}
    nexts: dict[str, list[str]] = {b: [] for b in mine}
    for b, ps in after.items():
        for p in ps:
            nexts[p].append(b)
    ready = [(order[b], b) for b, k in waiting.items() if k == 0]
    heapq.heapify(ready)
    out: list[str] = []
    while ready:
        _, b = heapq.heappop(ready)
        out.append(b)
        for c in nexts[b]:
            waiting[c] -= 1
            if waiting[c] == 0:
                heapq.heappush(ready, (order[c], c))
    if len(out) < len(mine):  # a unit's order contradicts the data flow: fall back to it
        return sorted(mine, key=order.__getitem__)
    return out


def _block_order(plan: Plan, graph: OpGraph) -> dict[str, int]:
    position = {n.name: i for i, n in enumerate(graph.nodes)}
    return {b: max(position[m] for m in ms) for b, ms in plan.blocks.items()}


def max_inflight(plan: Plan, segments: list[Segment]) -> int:
    """Frames admitted at once: one a time for plans that are not pipelined, else one in each partition of
    every replica group and one waiting in front of each, plus the one being fed (the executor's bounded
    queues). Every replica counts: a stage of R replicas keeps R frames busy at once."""
    if not plan.pipelined:
        return 1
    return 2 * len({s.key for s in segments}) + 1
