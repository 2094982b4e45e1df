"""Lowering a plan to segments: the partitions the executor runs, one onnxruntime session each.

A unit (one assignment: a PU, or a set of cores of a CPU cluster) runs its blocks of
a stage as partitions. A partition starts when all its inputs have arrived, so it
must not hold a block that waits for more than the partition before it: a block
continues a partition only when every one of its inputs comes from that partition
(same unit); a block with an input from another unit or stage, or with inputs from
two partitions, or with none, starts a new partition. So a partition's only outside
inputs are those of its first block, independent branches on one unit are
independent partitions, and (fork on A, branch on B, join on A) splits A's blocks at
the join. A partition P waits only on partitions whose blocks precede P's first
block, so the partitions of a frame form a DAG. ``planner.ilp.partition_starts`` is
the same rule on the ILP's block indices.
"""

from __future__ import annotations

from dataclasses import dataclass

from device_profiles.schema import DeviceProfile
from models.graph import OpGraph
from planner.plan import Plan, core_ids

UnitKey = tuple[int, int, int]  # (stage, replica group, assignment index)


@dataclass(frozen=True)
class Segment:
    stage: int
    group: int
    unit: int  # assignment index within the group
    index: int  # segment number within the unit (dense, from 0)
    pu: str
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
    """Every segment of every stage and replica group, stage by stage in topological order."""
    order = _block_order(plan, graph)
    preds: dict[str, set[str]] = {b: set() for b in plan.blocks}
    for a, b in block_edges(plan, graph):
        preds[b].add(a)
    cores = core_ids(plan, profile)
    out: list[Segment] = []
    for s, stage in enumerate(plan.stages):
        for g, group in enumerate(stage.groups):
            unit_of = {b: i for i, a in enumerate(group) for b in a.blocks}
            part: dict[str, str] = {}  # block -> the first block of its partition
            for b in sorted(unit_of, key=order.__getitem__):
                owners = {part.get(p) for p in preds[b]}
                same_unit = all(p in unit_of and unit_of[p] == unit_of[b] for p in preds[b])
                part[b] = owners.pop() if preds[b] and same_unit and len(owners) == 1 else b
            for i, a in enumerate(group):
                firsts = sorted({part[b] for b in a.blocks}, key=order.__getitem__)
                for dense, first in enumerate(firsts):
                    blocks = tuple(sorted((b for b in a.blocks if part[b] == first), key=order.__getitem__))
                    members = tuple(m for b in blocks for m in plan.blocks[b])
                    out.append(Segment(s, g, i, dense, a.pu, a.cores, cores[(s, g, i)], blocks, members))
    return out


def _block_order(plan: Plan, graph: OpGraph) -> dict[str, int]:
    position = {n.name: i for i, n in enumerate(graph.nodes)}
    return {b: max(position[m] for m in ms) for b, ms in plan.blocks.items()}
