"""The timing model of an assignment: which unit runs each block and in what order, evaluated without a solver.

``schedule`` is the ILP's model for a fixed assignment (every block as early as its inputs and its unit allow;
latency, period and energy per frame), what every heuristic, the local search and the ILP's warm start are
judged by; ``period_loads`` is its period and loads alone. ``partition_starts`` is the lowering's partition
rule on block indices, (``planner.symmetry`` puts an assignment in the ILP's symmetry rows' order).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.problem import Problem


@dataclass(frozen=True)
class Assignment:
    """A solution in problem terms: block index -> unit index, and the order blocks run in (block indices;
    empty: topological). A unit runs its blocks in this order, one after another."""

    block_unit: tuple[int, ...]
    order: tuple[int, ...] = ()
    int8: frozenset[int] = frozenset()  # blocks that run in their unit's reduced precision (the rest in fp32)
    # of those, the blocks that run in their unit's second one (int8 on a unit of ``Problem.fp16_units``)
    second: frozenset[int] = frozenset()

    def sequence(self) -> tuple[int, ...]:
        return self.order or tuple(range(len(self.block_unit)))

    def level(self, b: int) -> int:
        """Block b's precision level on its unit (``Problem.reduced``): 0 fp32, 1 the unit's reduced, 2 its second."""
        return 2 if b in self.second else 1 if b in self.int8 else 0


@dataclass(frozen=True)
class Figures:
    latency_ms: float
    period_ms: float
    energy_mj: float
    starts: tuple[float, ...] = ()  # block start times of one frame (the list schedule)
    # every resource's time per frame: each unit (by index), links, shared memories; not part of equality
    # (relabelling identical units permutes it and changes no figure)
    loads: tuple[float, ...] = field(default=(), compare=False)

    def value(self, objective: str) -> float:
        return {"latency": self.latency_ms, "throughput": self.period_ms, "energy": self.energy_mj}[objective]


def predecessors(problem: Problem) -> list[list[tuple[int, int]]]:
    """For every block, its (producer block, edge index) pairs."""
    preds: list[list[tuple[int, int]]] = [[] for _ in problem.blocks]
    for ei, (i, j, _) in enumerate(problem.edges):
        preds[j].append((i, ei))
    return preds


def _shape(
    problem: Problem,
) -> tuple[tuple[tuple[tuple[int, int], ...], ...], tuple[str, ...], tuple[tuple[str, ...], ...]]:
    """What ``schedule`` and ``partition_starts`` read on every call, from the problem alone (computed once per
    problem: a warm start's local moves evaluate thousands of assignments): every block's (producer, edge)
    pairs, every unit's PU, and the shared memories every unit's PU is on."""
    if "schedule_shape" not in problem.derived:
        pu_of = tuple(x.pu for x in problem.units)
        memories = tuple(tuple(m for m, members in problem.shared_memories.items() if pu in members) for pu in pu_of)
        problem.derived["schedule_shape"] = (tuple(map(tuple, predecessors(problem))), pu_of, memories)
    return problem.derived["schedule_shape"]


def partition_starts(problem: Problem, assignment: Assignment) -> tuple[bool, ...]:
    """Which blocks start a partition when the plan is lowered (``planner.segments``, the same rule):
    a block continues the partition its unit ran last only when all its inputs come from it or from
    partitions of the unit it already waits for, and no block of it sends to another unit."""
    unit_of = assignment.block_unit
    exports = [False] * len(problem.blocks)
    for i, j, _ in problem.edges:
        if unit_of[i] != unit_of[j]:
            exports[i] = True
    preds = _shape(problem)[0]
    part: dict[int, int] = {}
    feeds: dict[int, set[int]] = {}
    last: dict[int, int] = {}  # unit -> the block it ran last
    closed: set[int] = set()
    starts = [True] * len(problem.blocks)
    for b in assignment.sequence():
        ps = preds[b]
        u = unit_of[b]
        current = part.get(last.get(u, -1))
        joins = bool(ps) and current is not None and current not in closed
        if joins:
            fed = feeds[current]
            for i, _ in ps:
                if unit_of[i] != u or (part[i] != current and part[i] not in fed):
                    joins = False
                    break
        if joins:
            part[b] = current
            starts[b] = False
        else:
            part[b] = b
            feeds[b] = {part[i] for i, _ in ps}
        last[u] = b
        if exports[b]:
            closed.add(part[b])
    return tuple(starts)


def fits(problem: Problem, assignment: Assignment) -> bool:
    """The ILP's memory rows for a fixed assignment: on every PU, weights and activations fit its memory."""
    held: dict[str, int] = {}
    for b, u in enumerate(assignment.block_unit):
        pu = problem.units[u].pu
        held[pu] = held.get(pu, 0) + problem.held_bytes(b)
    return all(v <= problem.memory[p] for p, v in held.items())


def _block_ms(problem: Problem, assignment: Assignment, pu_of: list[str]) -> tuple[list[float], list[int]]:
    """Every block's time on its unit in a frame (with its partition's overhead where it starts one, and gRPC's
    CPU time where it sends to or receives from another host) and its precision level."""
    n = len(problem.blocks)
    unit_of = assignment.block_unit
    overhead = problem.unit_overhead
    # which blocks start a partition matters for the per-partition overhead only (none on a profile not calibrated:
    # a third of a call's time, and load balancing makes thousands of calls)
    starts_part = partition_starts(problem, assignment) if any(overhead.values()) else (False,) * n
    if assignment.int8 or assignment.second:
        levels = [assignment.level(b) for b in range(n)]
        dur = [
            problem.ms(b, unit_of[b], levels[b]) + (overhead[unit_of[b]] if starts_part[b] else 0.0) for b in range(n)
        ]
    else:
        levels = [0] * n
        cost = problem.cost
        dur = [cost[(b, unit_of[b])] + (overhead[unit_of[b]] if starts_part[b] else 0.0) for b in range(n)]
    if problem.handoff_cpu:  # gRPC between hosts: CPU time on the sender and the receiver
        for ei, (i, j, _) in enumerate(problem.edges):
            send, receive = problem.handoff_cpu.get((ei, pu_of[i], pu_of[j]), (0.0, 0.0))
            dur[i] += send
            dur[j] += receive
    return dur, levels


def _loads(
    problem: Problem, assignment: Assignment, pu_of: list[str], dur: list[float], levels: list[int]
) -> tuple[tuple[float, ...], float]:
    """Every resource's time per frame (each unit by index, then the links, then the shared memories) and the
    energy of the bytes a frame moves between PUs."""
    preds, _, memories_of_unit = _shape(problem)
    unit_of = assignment.block_unit
    transfer = problem.transfer
    link_load: dict[tuple[str, str], float] = {}
    transfer_mj = 0.0
    for b in assignment.sequence():  # the list schedule's order: the same sums, to the last bit
        q = pu_of[b]
        for i, ei in preds[b]:
            p = pu_of[i]
            if p != q:
                link_load[(p, q)] = link_load.get((p, q), 0.0) + transfer[(ei, p, q)]
                transfer_mj += problem.transfer_mj[(ei, p, q)]
    load: dict[int, float] = {}
    factors = [problem.factor(u) for u in range(len(problem.units))]
    for b in range(len(problem.blocks)):
        u = unit_of[b]
        load[u] = load.get(u, 0.0) + dur[b] * factors[u]
    traffic: dict[str, float] = {}  # per shared memory: the time a frame's bytes occupy it
    if problem.shared_memories:
        for b in range(len(problem.blocks)):
            for m in memories_of_unit[unit_of[b]]:
                share = problem.traffic_share(b, unit_of[b], levels[b]) if levels[b] else 1.0
                traffic[m] = traffic.get(m, 0.0) + problem.traffic[(b, m)] * share
    loads = (*(load.get(u, 0.0) for u in range(len(problem.units))), *link_load.values(), *traffic.values())
    return loads, transfer_mj


def period_loads(problem: Problem, assignment: Assignment) -> tuple[float, tuple[float, ...]]:
    """``schedule``'s period and loads alone, without the list schedule (load balancing's thousands of calls)."""
    pu_of_unit = _shape(problem)[1]
    pu_of = [pu_of_unit[u] for u in assignment.block_unit]
    dur, levels = _block_ms(problem, assignment, pu_of)
    loads, _ = _loads(problem, assignment, pu_of, dur, levels)
    return max(loads), loads


def schedule(problem: Problem, assignment: Assignment) -> Figures:
    """The ILP's model evaluated for a fixed assignment: every block as early as its inputs and its unit
    allow, each unit running its blocks in the assignment's order (topological unless given).

    A block that starts a partition carries its unit's per-partition overhead, in latency, load and energy. On
    a CFS-throttled unit, a frame's work past one period's quota (``Problem.stalled``) takes the unit's factor
    times its time in latency (its load and energy are its work)."""
    unit_of = assignment.block_unit
    preds, pu_of_unit, _ = _shape(problem)
    pu_of = [pu_of_unit[u] for u in unit_of]
    dur, levels = _block_ms(problem, assignment, pu_of)
    # a frame's work on a throttled unit past one period's quota: at the unit's share (latency only)
    span = problem.stalled(unit_of, dur, assignment.sequence())
    transfer, handoff_delay = problem.transfer, problem.handoff_delay
    free: dict[int, float] = {}
    finish = [0.0] * len(problem.blocks)
    starts = [0.0] * len(problem.blocks)
    for b in assignment.sequence():
        u = unit_of[b]
        q = pu_of[b]
        start = free.get(u, 0.0)
        for i, ei in preds[b]:
            p = pu_of[i]
            comm = transfer[(ei, p, q)] if p != q else 0.0
            delay = handoff_delay.get((ei, p, q), 0.0) if handoff_delay and unit_of[i] != u else 0.0
            ready = finish[i] + comm + delay
            if ready > start:
                start = ready
        starts[b] = start
        finish[b] = start + span[b]
        free[u] = finish[b]
    loads, transfer_mj = _loads(problem, assignment, pu_of, dur, levels)
    busy_w = problem.busy_extra_w
    busy_mj = 0.0
    for b in range(len(problem.blocks)):
        busy_mj += dur[b] * busy_w[unit_of[b]]
    period = max(loads)
    return Figures(max(finish), period, busy_mj + transfer_mj + period * problem.idle_w, tuple(starts), loads)
