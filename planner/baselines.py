"""Plans a user could write by hand, built as ``Plan`` values so every comparison is like for like."""

from __future__ import annotations

from collections.abc import Sequence

from device_profiles.schema import DeviceProfile
from models.graph import OpGraph
from planner.plan import Assignment, Plan, Provenance, Stage


def _blocks(blocks: OpGraph) -> dict[str, tuple[str, ...]]:
    return {b.name: b.members for b in blocks.nodes}


def single_pu(blocks: OpGraph, profile: DeviceProfile, pu: str, cores: int, name: str = "") -> Plan:
    """Everything in one onnxruntime session on one PU with ``cores`` threads."""
    stage = Stage(((Assignment(pu, cores, tuple(b.name for b in blocks.nodes)),),))
    return Plan(
        model_sha256=blocks.model_sha256,
        model_name=blocks.name,
        device=profile.name,
        device_sha256=profile.content_hash(),
        granularity=blocks.granularity,
        blocks=_blocks(blocks),
        stages=(stage,),
        provenance=Provenance(method=f"baseline:{name or 'single-pu'}"),
        name=name or f"single-{pu}x{cores}",
    )


def flop_pipeline(blocks: OpGraph, profile: DeviceProfile, stages: Sequence[tuple[str, int]], name: str = "") -> Plan:
    """Consecutive blocks (topological order) cut into stages with FLOPs in proportion to PU peak."""
    weights = [
        profile.pu(pu).peak_gflops["conv"].value * cores / max(1, len(profile.pu(pu).cores)) for pu, cores in stages
    ]
    total_w = sum(weights)
    total = sum(b.flops for b in blocks.nodes) or 1
    bounds, acc = [], 0.0
    for w in weights[:-1]:
        acc += w / total_w
        bounds.append(acc * total)
    chunks: list[list[str]] = [[] for _ in stages]
    done = 0
    for b in blocks.nodes:
        idx = sum(1 for x in bounds if done + b.flops / 2 > x)
        chunks[idx].append(b.name)
        done += b.flops
    built = tuple(
        Stage(((Assignment(pu, cores, tuple(chunk)),),))
        for (pu, cores), chunk in zip(stages, chunks, strict=True)
        if chunk
    )
    return Plan(
        model_sha256=blocks.model_sha256,
        model_name=blocks.name,
        device=profile.name,
        device_sha256=profile.content_hash(),
        granularity=blocks.granularity,
        blocks=_blocks(blocks),
        stages=built,
        provenance=Provenance(method=f"baseline:{name or 'flop-pipeline'}"),
        name=name or "flop-pipeline",
    )
