"""Predict a plan's latency, throughput and energy: analytically and by discrete-event simulation.

Both use the same partitions and costs. A partition is what one PU runs for one stage
(its blocks, fused, with the assignment's cores); it starts for a frame when all its
inputs have arrived and its PU is free, and its outputs cross to other PUs over the
profile's links, one transfer at a time per link and direction. Frames are admitted
while fewer than ``max_inflight`` are in the pipeline (the executor's bounded
queues), replicated stages take frames round-robin, and frames leave in order.

Energy is modelled from the profile's power figures: every PU of the board draws idle
power for the whole run and its busy power while it computes; network transfers add
their energy per byte. It is labelled ``modelled``.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from models.graph import OpGraph
from planner.costmodel import CostModel
from planner.plan import Plan, Predicted


@dataclass(frozen=True)
class Part:
    stage: int
    group: int
    pu: str
    cores: int
    members: frozenset[str]
    ms: float


@dataclass(frozen=True)
class SimResult:
    frames: int
    latency_p50_ms: float
    latency_p99_ms: float
    throughput_fps: float
    energy_mj: float
    busy_ms: Mapping[str, float]  # per PU, whole run
    makespan_ms: float

    def predicted(self) -> Predicted:
        return Predicted(self.latency_p50_ms, self.throughput_fps, self.energy_mj, "modelled", "simulated")


class PlanModel:
    """A plan lowered to partitions, their costs and the bytes that flow between them."""

    def __init__(self, plan: Plan, graph: OpGraph, cost: CostModel) -> None:
        self.plan, self.graph, self.cost = plan, graph, cost
        self.parts: dict[tuple[int, int, str], Part] = {}
        for s, g, a in plan.assignments():
            members = frozenset(m for b in a.blocks for m in plan.blocks[b])
            self.parts[(s, g, a.pu)] = Part(s, g, a.pu, a.cores, members, cost.group_ms(members, a.pu, a.cores).ms)
        block_of = {m: b for b, ms in plan.blocks.items() for m in ms}
        flows: dict[tuple[str, str], dict[str, int]] = {}
        for e in graph.edges:
            bs, bd = block_of[e.src], block_of[e.dst]
            if bs != bd:
                flows.setdefault((bs, bd), {})[e.tensor] = e.nbytes
        self.block_flows = {k: sum(v.values()) for k, v in flows.items()}
        self.stage_of_block = {b: s for s, st in enumerate(plan.stages) for a in st.groups[0] for b in a.blocks}

    def frame_parts(self, frame: int) -> list[Part]:
        """The partitions frame ``frame`` runs on, in an order that respects their data flow."""
        chosen = []
        for s, stage in enumerate(self.plan.stages):
            g = frame % stage.replicas
            chosen += [self.parts[(s, g, a.pu)] for a in stage.groups[g]]
        return _topo(chosen, self.frame_flows(chosen))

    def frame_flows(self, parts: list[Part]) -> dict[tuple[str, str], int]:
        """Bytes from PU to PU for one frame, given the partitions it runs on."""
        pu_of_block = {}
        for p in parts:
            for a in self.plan.stages[p.stage].groups[p.group]:
                if a.pu == p.pu:
                    for b in a.blocks:
                        pu_of_block[b] = p.pu
        flows: dict[tuple[str, str], int] = {}
        for (bs, bd), nbytes in self.block_flows.items():
            x, y = pu_of_block[bs], pu_of_block[bd]
            if x != y:
                flows[(x, y)] = flows.get((x, y), 0) + nbytes
        return flows

    def idle_w(self) -> float:
        return sum(p.idle_power_w.value for p in self.cost.profile.pus)

    def busy_extra_w(self, part: Part) -> float:
        pu = self.cost.profile.pu(part.pu)
        return self.cost.busy_power_w(part.pu, part.cores) - pu.idle_power_w.value

    def max_inflight(self) -> int:
        return sum(st.replicas for st in self.plan.stages) + 1


def _topo(parts: list[Part], flows: Mapping[tuple[str, str], int]) -> list[Part]:
    by_pu = {p.pu: p for p in parts}
    waiting = {p.pu: 0 for p in parts}
    for _, y in flows:
        waiting[y] += 1
    ready = [p.pu for p in parts if waiting[p.pu] == 0]
    order: list[Part] = []
    while ready:
        pu = ready.pop(0)
        order.append(by_pu[pu])
        for x, y in flows:
            if x == pu:
                waiting[y] -= 1
                if waiting[y] == 0:
                    ready.append(y)
    if len(order) != len(parts):
        raise ValueError("partitions of one frame form a cycle; validate the plan first")
    return order


def analytic(model: PlanModel) -> Predicted:
    """One frame through an empty pipeline (latency); the slowest PU or link per frame (throughput)."""
    one = simulate(model, frames=1)
    load: dict[str, float] = {}
    link_load: dict[tuple[str, str], float] = {}
    extra_mj = 0.0
    frames = 1
    for st in model.plan.stages:
        frames = _lcm(frames, st.replicas)
    for f in range(frames):
        parts = model.frame_parts(f)
        for p in parts:
            load[p.pu] = load.get(p.pu, 0.0) + p.ms
            extra_mj += p.ms * model.busy_extra_w(p)
        for (x, y), nbytes in model.frame_flows(parts).items():
            link_load[(x, y)] = link_load.get((x, y), 0.0) + model.cost.transfer_ms(nbytes, x, y)
            extra_mj += model.cost.transfer_mj(nbytes, x, y)
    period_ms = max([*load.values(), *link_load.values()]) / frames
    energy = extra_mj / frames + period_ms * model.idle_w()
    return Predicted(one.latency_p50_ms, 1000.0 / period_ms, energy, "modelled", "analytic")


def _lcm(a: int, b: int) -> int:
    from math import gcd

    return a * b // gcd(a, b)


def simulate(model: PlanModel, frames: int = 200, max_inflight: int | None = None) -> SimResult:
    """Discrete-event run of ``frames`` frames offered back to back."""
    window = max_inflight or model.max_inflight()
    pu_free: dict[str, float] = {}
    link_free: dict[tuple[str, str], float] = {}
    busy: dict[str, float] = {}
    leave: list[float] = []
    enter: list[float] = []
    extra_mj = 0.0
    for f in range(frames):
        admit = leave[f - window] if f >= window else 0.0
        parts = model.frame_parts(f)
        flows = model.frame_flows(parts)
        arrived: dict[str, float] = {}
        starts, finish = [], 0.0
        for p in parts:
            ready = max(admit, arrived.get(p.pu, admit))
            start = max(ready, pu_free.get(p.pu, 0.0))
            end = start + p.ms
            pu_free[p.pu] = end
            busy[p.pu] = busy.get(p.pu, 0.0) + p.ms
            extra_mj += p.ms * model.busy_extra_w(p)
            starts.append(start)
            finish = max(finish, end)
            for (x, y), nbytes in flows.items():
                if x != p.pu:
                    continue
                t0 = max(end, link_free.get((x, y), 0.0))
                t1 = t0 + model.cost.transfer_ms(nbytes, x, y)
                link_free[(x, y)] = t1
                extra_mj += model.cost.transfer_mj(nbytes, x, y)
                arrived[y] = max(arrived.get(y, admit), t1)
        enter.append(min(starts))
        leave.append(max(finish, leave[-1] if leave else 0.0))
    latencies = sorted(b - a for a, b in zip(enter, leave, strict=True))
    warm = min(frames - 1, max(1, frames // 10))
    span = leave[-1] - leave[warm - 1] if frames > 1 else leave[0] - enter[0]
    done = frames - warm if frames > 1 else 1
    makespan = leave[-1] - enter[0]
    energy = (extra_mj + makespan * model.idle_w()) / frames
    return SimResult(
        frames=frames,
        latency_p50_ms=statistics.median(latencies),
        latency_p99_ms=latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        throughput_fps=1000.0 * done / span if span > 0 else float("inf"),
        energy_mj=energy,
        busy_ms=busy,
        makespan_ms=makespan,
    )
