"""The planning problem as plain arrays: what the ILP and the baselines work on.

``build_problem`` turns (block graph, cost model) into numbers: candidate units
(a non-CPU PU, or k cores of a CPU cluster), the cost of every block on every unit
that can run it, bytes and transfer times of every block edge between PUs, power
figures, memory. Everything after this is a pure function of these arrays.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from models.graph import OpGraph
from planner.costmodel import CostModel
from planner.plan import ACTIVATION_FRAMES, PlanError, PlanPrecision, activation_bytes

INF = float("inf")


# Accuracy losses are measured figures: a budget holds to this much (far below any measurable loss), so a loss of
# 1e-12 fits a budget of 0 the same in the solver and in any check of its plan
BUDGET_SLACK = 1e-9


@dataclass(frozen=True)
class Unit:
    pu: str
    kind: str
    cores: int
    instance: int  # 0.. among units of the same (pu, cores)

    @property
    def name(self) -> str:
        return f"{self.pu}x{self.cores}#{self.instance}" if self.kind == "cpu" else self.pu


@dataclass(frozen=True)
class Problem:
    model_name: str
    blocks: tuple[str, ...]  # topological order
    members: dict[str, tuple[str, ...]]
    param_bytes: dict[str, int]
    units: tuple[Unit, ...]
    cost: dict[tuple[int, int], float]  # (block index, unit index) -> ms; absent = cannot run there
    edges: tuple[tuple[int, int, int], ...]  # (producer index, consumer index, bytes)
    transfer: dict[tuple[int, str, str], float]  # (edge index, from PU, to PU) -> ms, PUs differ
    transfer_mj: dict[tuple[int, str, str], float]
    cluster_cores: dict[str, int]  # CPU PU -> cores
    memory: dict[str, float]  # PU -> bytes
    unit_overhead: dict[int, float]  # per-partition overhead (ms) of a unit, from calibration
    busy_extra_w: dict[int, float]  # unit busy power above idle
    idle_w: float  # all PUs idle
    independent: tuple[tuple[int, int], ...]  # block pairs with no path between them
    regions: tuple[tuple[int, int, tuple[int, ...]], ...]  # (fork, join, blocks strictly between them)
    max_stages: int
    # bytes of each block's output tensors (a unit holds ACTIVATION_FRAMES frames of them); absent: 0
    activation_bytes: dict[str, int] = field(default_factory=dict)
    # shared memories: name -> the PUs on it; (block, memory) -> ms its bytes occupy that memory per frame
    shared_memories: dict[str, tuple[str, ...]] = field(default_factory=dict)
    traffic: dict[tuple[int, str], float] = field(default_factory=dict)
    # (edge index, from PU, to PU) -> CPU ms the tensor adds to the sending and to the receiving unit (gRPC
    # between hosts); absent: none
    handoff_cpu: dict[tuple[int, str, str], tuple[float, float]] = field(default_factory=dict)
    # (edge index, from PU, to PU) -> ms the consumer waits beyond the transfer (the handoff delay ``tune``
    # learns between PUs of one host): latency only, it occupies no link; absent: none
    handoff_delay: dict[tuple[int, str, str], float] = field(default_factory=dict)
    # precision: (block, unit) -> ms of the block's validated reduced-precision variant there: int8, or fp16 on
    # the ``fp16_units`` (``cost`` holds fp32 times, absent where the PU does not compute fp32: an NPU runs a
    # block only in int8); each such block's accuracy loss alone in int8 (``sensitivity``) or alone in fp16
    # (``fp16_sensitivity``), the proxy the ILP sums, and the budget their sum stays under (None: no budget).
    # A unit's reduced precision is fp16 where its PU computes fp16 and fp16 times are given, else int8; a unit of
    # ``fp16_units`` whose PU computes int8 too (a GPU with int8 kernels) offers int8 as its second one
    # (``second_cost``: the block's int8 time there), so each block there runs in fp32, fp16 or int8.
    int8_cost: dict[tuple[int, int], float] = field(default_factory=dict)
    sensitivity: dict[int, float] = field(default_factory=dict)
    accuracy_budget: float | None = None
    fp16_units: frozenset[int] = frozenset()
    fp16_sensitivity: dict[int, float] = field(default_factory=dict)
    # (block, unit) -> ms of the block in int8 on a unit of ``fp16_units`` (its second reduced precision)
    second_cost: dict[tuple[int, int], float] = field(default_factory=dict)
    # what a plan with int8 blocks carries (calibration ranges, metric, budget); None: plans cannot have int8 blocks
    precision: PlanPrecision | None = None
    # unit -> how many times its time alone a unit's work takes back to back (a CFS-throttled PU's quota runs out:
    # ``CostModel.sustained_factor``): throughput counts a unit's load at this factor, latency only past the unit's
    # burst (``burst``); absent: 1
    sustained: dict[int, float] = field(default_factory=dict)
    # throttled unit -> the work (ms at full speed) one CFS period's quota runs (``CostModel.burst_ms``): a frame's
    # first this much work on the unit (its blocks, partition overheads, gRPC CPU time; in the order it runs them) runs
    # at full speed, the rest at the unit's share, its time times ``factor``, in latency too (``stalled``);
    # absent: never
    burst: dict[int, float] = field(default_factory=dict)
    # throttled unit -> how many times its time its work past the burst takes in a frame alone: the CFS share
    # (period / quota, ``CostModel.alone_factor``), where ``sustained`` is what ``tune`` fitted back to back
    # (other threads on the core take their part there); absent: its sustained factor
    alone: dict[int, float] = field(default_factory=dict)
    # what is derived from the problem alone (baselines, warm starts), computed once per problem
    derived: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def runs(self, block: int, unit: int) -> bool:
        """Whether the block can run on the unit in some precision."""
        return (block, unit) in self.cost or (block, unit) in self.int8_cost

    def reduced(self, unit: int, level: int = 1) -> str:
        """The precision of a level on the unit: 1, what ``int8_cost`` holds (fp16 or int8); 2, ``second_cost``'s
        (int8); 0, fp32."""
        if level == 0:
            return "fp32"
        return "fp16" if unit in self.fp16_units and level == 1 else "int8"

    def loss(self, block: int, unit: int, level: int = 1) -> float:
        """The block's accuracy loss alone in the unit's reduced precision of that level (``reduced``): the proxy
        summed under the budget."""
        table = self.fp16_sensitivity if self.reduced(unit, level) == "fp16" else self.sensitivity
        return table.get(block, 0.0) if level else 0.0

    def factor(self, unit: int) -> float:
        """The unit's load in the period is its work times this (``sustained``)."""
        return self.sustained.get(unit, 1.0)

    def alone_factor(self, unit: int) -> float:
        """A frame's work past the unit's burst takes this times its time (``alone``; never more than ``factor``)."""
        return min(self.alone.get(unit, self.factor(unit)), self.factor(unit))

    def stalled(self, unit_of: Sequence[int], dur: Sequence[float], order: Sequence[int]) -> list[float]:
        """Blocks' durations in latency, given where they run, their durations at full speed and the order
        the units run them in: on a throttled unit, a frame's first ``burst`` ms of work there runs at full
        speed (the quota one CFS period refilled) and the rest at its ``alone_factor`` (as ``ilp._stall_rows``
        and the simulator have it). A block gets full speed for what is left of the burst when it starts."""
        if not self.burst:
            return list(dur)
        left = {u: burst for u, burst in self.burst.items() if self.factor(u) > 1.0}
        span = list(dur)
        for b in order:
            u = unit_of[b]
            if u in left:
                d = dur[b]
                full = min(d, left[u])
                left[u] -= full
                span[b] = full + self.alone_factor(u) * (d - full)
        return span

    def ms(self, block: int, unit: int, int8: int = 0) -> float:
        """The block's time on the unit in fp32 (0), in the unit's reduced precision (1: ``int8_cost``) or in its
        second (2: ``second_cost``); KeyError where it cannot run so."""
        table = (self.cost, self.int8_cost, self.second_cost)[int(int8)]
        return table[(block, unit)]

    def traffic_share(self, block: int, unit: int, int8: int = 0) -> float:
        """The share of its fp32 traffic a block puts on the shared memory of the unit's PU: 1 in fp32; in int8,
        less by the share of the whole model's time on that unit its int8 variant saves, of the whole model's
        traffic (at most 1; below 0 where that is more than the block's own traffic: the row is a sum over a
        frame's blocks, and what it sums to is what counts). A memory's bandwidth is measured from the whole fp32 model's frames on all its
        cores at once (``profiler.contention``), so its row holds that run's period, compute included: a mix
        that takes r of the fp32 model's time on a unit puts r of that row on it, however its bytes are spread
        over its blocks. (A block's own time ratio would lower the row only by the bytes of the int8 blocks,
        few for a Conv whose time is mostly arithmetic, and price every int8 plan on several cores near the
        fp32 model's period on them.)"""
        fp32 = self.cost.get((block, unit))
        q = (self.int8_cost if int(int8) < 2 else self.second_cost).get((block, unit))
        if not int8 or not fp32 or q is None:
            return 1.0
        memory = self._memory_of(self.units[unit].pu)
        whole = self._whole_ms(unit)
        own = self.traffic.get((block, memory), 0.0) if memory is not None else 0.0
        if memory is None or not whole or own <= 0:
            return min(1.0, q / fp32)
        less = self._whole_traffic(memory) * (fp32 - q) / whole
        return min(1.0, 1.0 - less / own)

    def _memory_of(self, pu: str) -> str | None:
        return next((m for m, pus in self.shared_memories.items() if pu in pus), None)

    def _whole_ms(self, unit: int) -> float | None:
        """The whole model's fp32 time on the unit (the sum of its blocks there); None where one cannot run so."""
        cache = self.derived.setdefault("whole_ms", {})
        if unit not in cache:
            times = [self.cost.get((b, unit)) for b in range(len(self.blocks))]
            cache[unit] = None if any(t is None for t in times) else sum(t for t in times if t is not None)
        return cache[unit]

    def _whole_traffic(self, memory: str) -> float:
        cache = self.derived.setdefault("whole_traffic", {})
        if memory not in cache:
            cache[memory] = sum(v for (_, m), v in self.traffic.items() if m == memory)
        return cache[memory]

    def slowest(self, block: int, unit: int) -> float:
        return max(
            self.cost.get((block, unit), 0.0),
            self.int8_cost.get((block, unit), 0.0),
            self.second_cost.get((block, unit), 0.0),
        )

    def pus(self) -> list[str]:
        return list(dict.fromkeys(u.pu for u in self.units))

    def held_bytes(self, block: int) -> int:
        """Memory a block takes on the PU that runs it: its weights and ACTIVATION_FRAMES frames of its outputs."""
        name = self.blocks[block]
        return self.param_bytes[name] + ACTIVATION_FRAMES * self.activation_bytes.get(name, 0)

    def articulations(self) -> tuple[int, ...]:
        """Blocks every path from a source to a sink passes through (no block runs beside them), in order.
        Between two of them the blocks form a contiguous run of indices (topological order)."""
        beside = {b for pair in self.independent for b in pair}
        return tuple(b for b in range(len(self.blocks)) if b not in beside)

    def sections(self) -> tuple[tuple[int, int, tuple[int, ...]], ...]:
        """The stretches between consecutive articulation blocks (x, y, the blocks strictly between them): every
        block between runs after x ends and ends before y starts. x = -1 stands for the frame's arrival, y = n for
        its departure; only stretches with blocks that may run beside each other."""
        n = len(self.blocks)
        ends = [-1, *self.articulations(), n]
        return tuple((x, y, tuple(range(x + 1, y))) for x, y in itertools.pairwise(ends) if y - x > 2)

    def segment(self, lo: int, hi: int, sink: bool = False) -> Problem:
        """The sub-problem of blocks lo..hi (re-indexed from 0), for bounds: a relaxation of what those
        blocks cost within any plan of the whole. No per-partition overhead, no gRPC CPU time; with
        ``sink``, block hi costs nothing (its latency is then when hi can start)."""
        inside = {ei for ei, (i, j, _) in enumerate(self.edges) if lo <= i and j <= hi}
        index = {ei: k for k, ei in enumerate(sorted(inside))}

        def by_edge(d: dict) -> dict:
            return {(index[k[0]], *k[1:]): v for k, v in d.items() if k[0] in index}

        return dataclasses.replace(
            self,
            blocks=self.blocks[lo : hi + 1],
            cost={(b - lo, u): 0.0 if sink and b == hi else v for (b, u), v in self.cost.items() if lo <= b <= hi},
            int8_cost={
                (b - lo, u): 0.0 if sink and b == hi else v for (b, u), v in self.int8_cost.items() if lo <= b <= hi
            },
            second_cost={
                (b - lo, u): 0.0 if sink and b == hi else v for (b, u), v in self.second_cost.items() if lo <= b <= hi
            },
            sensitivity={b - lo: v for b, v in self.sensitivity.items() if lo <= b <= hi},
            fp16_sensitivity={b - lo: v for b, v in self.fp16_sensitivity.items() if lo <= b <= hi},
            edges=tuple((i - lo, j - lo, n) for ei, (i, j, n) in enumerate(self.edges) if ei in index),
            transfer=by_edge(self.transfer),
            transfer_mj=by_edge(self.transfer_mj),
            handoff_cpu={},
            handoff_delay=by_edge(self.handoff_delay),
            unit_overhead=dict.fromkeys(self.unit_overhead, 0.0),
            independent=tuple((i - lo, j - lo) for i, j in self.independent if lo <= i and j <= hi),
            regions=tuple(
                (x - lo, y - lo, tuple(b - lo for b in between))
                for x, y, between in self.regions
                if lo <= x and y <= hi
            ),
            traffic={(b - lo, m): v for (b, m), v in self.traffic.items() if lo <= b <= hi},
            derived={},
        )


def candidate_units(cost: CostModel, max_stages: int) -> list[Unit]:
    """Non-CPU PUs once; for a CPU cluster of n cores, k cores for k in 1..n, at most n // k (and max_stages) times."""
    units: list[Unit] = []
    for p in cost.profile.pus:
        if p.kind != "cpu":
            units.append(Unit(p.name, p.kind, 1, 0))
            continue
        n = len(p.cores)
        for k in range(n, 0, -1):
            for i in range(min(n // k, max_stages)):
                units.append(Unit(p.name, p.kind, k, i))
    return units


@dataclass(frozen=True)
class Int8Choice:
    """The blocks whose int8 variant was validated (measured against fp32 on the user's frames), each with its
    accuracy loss alone in int8 (the sensitivity proxy the ILP sums), and the budget of that sum (None: none).

    ``ms``: (block, PU, cores) -> the block's int8 time there, for PUs that compute fp32 too (a CPU): only
    where it is given is the block offered in int8 on such a PU (on an int8-only PU the cost model's figure
    is the int8 one). ``precision``: what a plan with int8 blocks embeds (calibration ranges, metric,
    budget); without it the solver may choose int8 but no plan can be written from such a solution.

    ``fp16_sensitivity`` and ``fp16_ms``: the same for fp16 (each block's loss alone in fp16, its fp16 time on
    a PU that computes fp16, a GPU). A PU given fp16 times offers its blocks in fp16, and in int8 too where it
    computes int8 and ``ms`` gives their int8 times there (``Problem.second_cost``)."""

    sensitivity: Mapping[str, float]
    budget: float | None = None
    ms: Mapping[tuple[str, str, int], float] = field(default_factory=dict)
    precision: PlanPrecision | None = None
    fp16_sensitivity: Mapping[str, float] = field(default_factory=dict)
    fp16_ms: Mapping[tuple[str, str, int], float] = field(default_factory=dict)


FP32_ONLY = Int8Choice({})


def build_problem(
    blocks: OpGraph, graph: OpGraph, cost: CostModel, max_stages: int = 4, int8: Int8Choice = FP32_ONLY
) -> Problem:
    """The problem of planning ``blocks`` on ``cost``'s board. A block runs in fp32 on the PUs that compute fp32;
    on a PU that computes int8 only (an NPU), only the blocks ``int8`` validated run, in int8."""
    if max_stages < 1:
        raise PlanError("--max-stages must be at least 1")
    if len(cost.profile.runtime_choices()) > 1:  # the same cores would be counted once per runtime
        raise PlanError(
            f"{cost.profile.name} offers several runtimes on one unit's hardware: plan one choice at a time "
            "(planner.search does; restrict with --pus)"
        )
    units = candidate_units(cost, max_stages)
    names = [b.name for b in blocks.nodes]
    index = {n: i for i, n in enumerate(names)}
    table, table8, fp16_units, second = _block_costs(blocks, units, cost, int8)
    flows: dict[tuple[int, int], dict[str, int]] = {}
    for e in blocks.edges:
        flows.setdefault((index[e.src], index[e.dst]), {})[e.tensor] = e.nbytes
    edges = tuple((i, j, sum(t.values())) for (i, j), t in sorted(flows.items()))
    succ = _successors(blocks)
    links = _links(edges, list(dict.fromkeys(u.pu for u in units)), cost)
    return Problem(
        model_name=blocks.name,
        blocks=tuple(names),
        members={b.name: b.members for b in blocks.nodes},
        param_bytes={b.name: b.param_bytes for b in blocks.nodes},
        units=tuple(units),
        cost=table,
        int8_cost=table8,
        sensitivity={index[name]: loss for name, loss in int8.sensitivity.items() if name in index},
        accuracy_budget=int8.budget,
        fp16_units=fp16_units,
        fp16_sensitivity={index[name]: loss for name, loss in int8.fp16_sensitivity.items() if name in index},
        second_cost=second,
        precision=int8.precision,
        edges=edges,
        transfer=links.transfer,
        transfer_mj=links.transfer_mj,
        cluster_cores={p.name: len(p.cores) for p in cost.profile.pus if p.kind == "cpu"},
        memory={p.name: p.memory_bytes.value for p in cost.profile.pus},
        unit_overhead={ui: cost.partition_overhead_ms(u.pu, u.cores) for ui, u in enumerate(units)},
        busy_extra_w={ui: _busy_extra_w(u, cost) for ui, u in enumerate(units)},
        sustained={ui: f for ui, u in enumerate(units) if (f := cost.sustained_factor(u.pu)) != 1.0},
        burst={ui: b for ui, u in enumerate(units) if (b := cost.burst_ms(u.pu)) is not None},
        alone={ui: f for ui, u in enumerate(units) if (f := cost.alone_factor(u.pu)) != cost.sustained_factor(u.pu)},
        idle_w=cost.profile.idle_w() * cost.calibration.power_idle_scale,
        independent=tuple(_independent_pairs(succ)),
        regions=tuple(_fork_join_regions(succ)),
        max_stages=max_stages,
        activation_bytes={b.name: activation_bytes(b.members, graph) for b in blocks.nodes},
        handoff_cpu=links.handoff_cpu,
        handoff_delay=links.handoff_delay,
        shared_memories={m.name: m.pus for m in cost.profile.memories},
        traffic={
            (bi, m.name): cost.traffic_ms(b.members, m.pus[0])
            for m in cost.profile.memories
            for bi, b in enumerate(blocks.nodes)
        },
    )


def _block_costs(
    blocks: OpGraph, units: list[Unit], cost: CostModel, int8: Int8Choice
) -> tuple[dict[tuple[int, int], float], dict[tuple[int, int], float], frozenset[int], dict[tuple[int, int], float]]:
    """(block, unit) -> ms in fp32 where the unit's PU computes fp32, and in the unit's reduced precision for
    validated blocks: fp16 on the units whose PU computes fp16 and fp32 and has fp16 times (returned), else int8
    where given, and int8 where the PU computes int8 only; on those fp16 units, int8 too where the PU computes it
    and int8 times are given (the second table); a block no PU can run is an error naming it."""
    table: dict[tuple[int, int], float] = {}
    table8: dict[tuple[int, int], float] = {}
    second: dict[tuple[int, int], float] = {}
    half_pus = {pu for _, pu, _ in int8.fp16_ms}
    fp16_units = frozenset(
        ui
        for ui, u in enumerate(units)
        if u.pu in half_pus and cost.profile.pu(u.pu).computes("fp16") and cost.profile.pu(u.pu).computes("fp32")
    )
    by_config: dict[tuple[str, int, str], float] = {}
    unsupported: list[str] = []
    int8_only: set[str] = set()
    for bi, b in enumerate(blocks.nodes):
        runnable = False
        for ui, u in enumerate(units):
            pu = cost.profile.pu(u.pu)
            if not all(pu.supports(t) for t in b.op_types):
                continue
            key = (u.pu, u.cores, b.name)
            if pu.computes("fp32"):
                target = table
                if ui in fp16_units:
                    half = int8.fp16_ms.get((b.name, u.pu, u.cores))
                    if half is not None and b.name in int8.fp16_sensitivity:
                        table8[(bi, ui)] = half
                    mine = int8.ms.get((b.name, u.pu, u.cores))
                    if (bi, ui) in table8 and mine is not None and pu.computes("int8") and b.name in int8.sensitivity:
                        second[(bi, ui)] = mine  # int8 beside fp16 (only where fp16 is offered: its q is level 1)
                else:
                    mine = int8.ms.get((b.name, u.pu, u.cores))
                    if mine is not None and pu.computes("int8") and b.name in int8.sensitivity:
                        table8[(bi, ui)] = mine
            elif pu.computes("int8") and b.name in int8.sensitivity:
                target = table8  # the cost model's figure for such a PU is its int8 figure
            else:
                int8_only.add(u.pu)
                continue
            if key not in by_config:
                # calibrated once: the block's share of a partition (alpha applied), the per-partition
                # part (beta) is the unit's overhead, charged once per partition
                by_config[key] = cost.block_ms(b.members, u.pu, u.cores)
            target[(bi, ui)] = by_config[key]
            runnable = True
        if not runnable:
            unsupported.append(f"{b.name} ({', '.join(b.op_types)})")
    if unsupported:
        why = (
            f"; {', '.join(sorted(int8_only))} compute{'s' if len(int8_only) == 1 else ''} int8 only, and the block "
            "has no validated int8 variant"
            if int8_only
            else ""
        )
        raise PlanError(
            f"no PU of {cost.profile.name} can run block(s) {'; '.join(unsupported[:3])}: every PU lacks one of their "
            f"op types{why}. Add the op type to a PU's supported_ops in the profile, or plan for a board with a CPU."
        )
    return table, table8, fp16_units, second


@dataclass(frozen=True)
class _Links:
    """Per (edge index, from PU, to PU): transfer ms and mJ, gRPC CPU ms at both ends, handoff delay ms."""

    transfer: dict[tuple[int, str, str], float]
    transfer_mj: dict[tuple[int, str, str], float]
    handoff_cpu: dict[tuple[int, str, str], tuple[float, float]]
    handoff_delay: dict[tuple[int, str, str], float]


def _links(edges: tuple[tuple[int, int, int], ...], pus: list[str], cost: CostModel) -> _Links:
    links = _Links({}, {}, {}, {})
    for ei, (_, _, nbytes) in enumerate(edges):
        for p in pus:
            if delay := cost.handoff_delay_ms(p, p):  # between two units of one PU (on different units only)
                links.handoff_delay[(ei, p, p)] = delay
            for q in pus:
                if p == q:
                    continue
                links.transfer[(ei, p, q)] = cost.transfer_ms(nbytes, p, q)
                links.transfer_mj[(ei, p, q)] = cost.transfer_mj(nbytes, p, q)
                ends = cost.handoff_cpu_ms(nbytes, p, q)
                if any(ends):
                    links.handoff_cpu[(ei, p, q)] = ends
                if delay := cost.handoff_delay_ms(p, q):
                    links.handoff_delay[(ei, p, q)] = delay
    return links


def _busy_extra_w(unit: Unit, cost: CostModel) -> float:
    """A unit's busy power above idle: its cores' share of a CPU cluster's, or the whole PU's."""
    pu = cost.profile.pu(unit.pu)
    span = pu.active_power_w.value - pu.idle_power_w.value
    if pu.kind == "cpu":
        span = span / max(1, len(pu.cores)) * unit.cores
    return span * cost.calibration.power_active_scale


def _successors(blocks: OpGraph) -> list[list[int]]:
    pos = {b.name: i for i, b in enumerate(blocks.nodes)}
    return [sorted(pos[s] for s in blocks.successors[b.name]) for b in blocks.nodes]


def _independent_pairs(succ: list[list[int]]) -> list[tuple[int, int]]:
    """Block pairs (i < j, topological indices) with no path between them."""
    n = len(succ)
    reach = [0] * n
    for i in reversed(range(n)):
        bits = 0
        for s in succ[i]:
            bits |= (1 << s) | reach[s]
        reach[i] = bits
    return [(i, j) for i in range(n) for j in range(i + 1, n) if not (reach[i] >> j) & 1]


def _fork_join_regions(succ: list[list[int]]) -> list[tuple[int, int, tuple[int, ...]]]:
    """Each fork with its join (immediate post-dominator) and the blocks between them."""
    n = len(succ)
    reach = [0] * n  # descendants
    pdom = [0] * n  # blocks every path from here to the end passes through (itself included)
    for i in reversed(range(n)):
        bits = 0
        common = None
        for s in succ[i]:
            bits |= (1 << s) | reach[s]
            common = pdom[s] if common is None else common & pdom[s]
        reach[i] = bits
        pdom[i] = (1 << i) | (common or 0)
    ancestors = [0] * n
    for i in range(n):
        for j in range(n):
            if (reach[i] >> j) & 1:
                ancestors[j] |= 1 << i
    regions = []
    for x in range(n):
        if len(succ[x]) < 2:
            continue
        rest = pdom[x] & ~(1 << x)
        if not rest:
            continue
        y = (rest & -rest).bit_length() - 1  # the nearest post-dominator
        between = reach[x] & ancestors[y]
        regions.append((x, y, tuple(b for b in range(n) if (between >> b) & 1)))
    return regions


def toy_problem(
    units: list[Unit],
    cost: dict[tuple[int, int], float],
    edges: list[tuple[int, int]],
    transfer_ms: float = 0.0,
    busy_w: dict[int, float] | None = None,
    idle_w: float = 0.0,
    overhead_ms: dict[int, float] | None = None,
    max_stages: int = 4,
    int8_cost: dict[tuple[int, int], float] | None = None,
    sensitivity: dict[int, float] | None = None,
    accuracy_budget: float | None = None,
    fp16_units: frozenset[int] = frozenset(),
    fp16_sensitivity: dict[int, float] | None = None,
    sustained: dict[int, float] | None = None,
    second_cost: dict[tuple[int, int], float] | None = None,
    burst: dict[int, float] | None = None,
    alone: dict[int, float] | None = None,
) -> Problem:
    """A problem from plain numbers (blocks 0..n-1 in topological order): for tests and examples."""
    n = 1 + max(b for b, _ in [*cost, *(int8_cost or {})])
    succ: list[list[int]] = [[] for _ in range(n)]
    for i, j in edges:
        if not i < j:
            raise ValueError("edges go from a lower block index to a higher one (topological order)")
        succ[i].append(j)
    pus = list(dict.fromkeys(u.pu for u in units))
    transfer = {(ei, p, q): transfer_ms for ei in range(len(edges)) for p in pus for q in pus if p != q}
    cluster: dict[str, int] = {}
    for u in units:
        if u.kind == "cpu":
            cluster[u.pu] = max(cluster.get(u.pu, 0), u.cores)
    return Problem(
        model_name="toy",
        blocks=tuple(f"b{i}" for i in range(n)),
        members={f"b{i}": (f"b{i}",) for i in range(n)},
        param_bytes={f"b{i}": 0 for i in range(n)},
        units=tuple(units),
        cost=dict(cost),
        int8_cost=dict(int8_cost or {}),
        sensitivity=dict(sensitivity or {}),
        accuracy_budget=accuracy_budget,
        fp16_units=fp16_units,
        fp16_sensitivity=dict(fp16_sensitivity or {}),
        second_cost=dict(second_cost or {}),
        edges=tuple((i, j, 1) for i, j in sorted(edges)),
        transfer=transfer,
        transfer_mj=dict.fromkeys(transfer, 0.0),
        cluster_cores=cluster,
        memory=dict.fromkeys(pus, 1e12),
        unit_overhead={u: (overhead_ms or {}).get(u, 0.0) for u in range(len(units))},
        busy_extra_w={u: (busy_w or {}).get(u, 1.0) for u in range(len(units))},
        idle_w=idle_w,
        sustained=dict(sustained or {}),
        burst=dict(burst or {}),
        alone=dict(alone or {}),
        independent=tuple(_independent_pairs(succ)),
        regions=tuple(_fork_join_regions(succ)),
        max_stages=max_stages,
    )
