"""The planning problem as plain arrays: what the ILP and the baselines work on.

``build_problem`` turns (block graph, cost model) into numbers: candidate units
(a non-CPU PU, or k cores of a CPU cluster), the cost of every block on every unit
that can run it, bytes and transfer times of every block edge between PUs, power
figures, memory. Everything after this is a pure function of these arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

from models.graph import OpGraph
from planner.costmodel import CostModel
from planner.plan import PlanError

INF = float("inf")


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

    def pus(self) -> list[str]:
        return list(dict.fromkeys(u.pu for u in self.units))


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


def build_problem(blocks: OpGraph, graph: OpGraph, cost: CostModel, max_stages: int = 4) -> Problem:
    if max_stages < 1:
        raise PlanError("--max-stages must be at least 1")
    units = candidate_units(cost, max_stages)
    names = [b.name for b in blocks.nodes]
    index = {n: i for i, n in enumerate(names)}
    table: dict[tuple[int, int], float] = {}
    by_config: dict[tuple[str, int, str], float] = {}
    unsupported: list[str] = []
    for bi, b in enumerate(blocks.nodes):
        runnable = False
        for ui, u in enumerate(units):
            pu = cost.profile.pu(u.pu)
            if not all(pu.supports(t) for t in b.op_types):
                continue
            key = (u.pu, u.cores, b.name)
            if key not in by_config:
                fit = cost.fits.get((u.pu, u.cores))
                alpha = fit.alpha if fit and fit.partitions_fitted else 1.0
                by_config[key] = alpha * cost.group_ms(b.members, u.pu, u.cores).ms
            table[(bi, ui)] = by_config[key]
            runnable = True
        if not runnable:
            unsupported.append(f"{b.name} ({', '.join(b.op_types)})")
    if unsupported:
        raise PlanError(
            f"no PU of {cost.profile.name} can run block(s) {'; '.join(unsupported[:3])}: every PU lacks one of their "
            "op types. Add the op type to a PU's supported_ops in the profile, or plan for a board with a CPU."
        )
    flows: dict[tuple[int, int], dict[str, int]] = {}
    for e in blocks.edges:
        flows.setdefault((index[e.src], index[e.dst]), {})[e.tensor] = e.nbytes
    edges = tuple((i, j, sum(t.values())) for (i, j), t in sorted(flows.items()))
    pus = list(dict.fromkeys(u.pu for u in units))
    transfer, transfer_mj = {}, {}
    for ei, (_, _, nbytes) in enumerate(edges):
        for p in pus:
            for q in pus:
                if p != q:
                    transfer[(ei, p, q)] = cost.transfer_ms(nbytes, p, q)
                    transfer_mj[(ei, p, q)] = cost.transfer_mj(nbytes, p, q)
    overhead = {}
    busy_extra = {}
    for ui, u in enumerate(units):
        fit = cost.fits.get((u.pu, u.cores))
        overhead[ui] = max(0.0, fit.beta_ms) if fit and fit.partitions_fitted else 0.0
        pu = cost.profile.pu(u.pu)
        if pu.kind == "cpu":
            n = max(1, len(pu.cores))
            busy_extra[ui] = (pu.active_power_w.value - pu.idle_power_w.value) / n * u.cores * cost.power_active_scale
        else:
            busy_extra[ui] = (pu.active_power_w.value - pu.idle_power_w.value) * cost.power_active_scale
    return Problem(
        model_name=blocks.name,
        blocks=tuple(names),
        members={b.name: b.members for b in blocks.nodes},
        param_bytes={b.name: b.param_bytes for b in blocks.nodes},
        units=tuple(units),
        cost=table,
        edges=edges,
        transfer=transfer,
        transfer_mj=transfer_mj,
        cluster_cores={p.name: len(p.cores) for p in cost.profile.pus if p.kind == "cpu"},
        memory={p.name: p.memory_bytes.value for p in cost.profile.pus},
        unit_overhead=overhead,
        busy_extra_w=busy_extra,
        idle_w=sum(p.idle_power_w.value for p in cost.profile.pus) * cost.power_idle_scale,
        independent=tuple(_independent_pairs(blocks)),
        regions=tuple(_fork_join_regions(blocks)),
        max_stages=max_stages,
    )


def _independent_pairs(blocks: OpGraph) -> list[tuple[int, int]]:
    names = [b.name for b in blocks.nodes]
    pos = {n: i for i, n in enumerate(names)}
    reach = [0] * len(names)
    for n in reversed(names):
        bits = 0
        for s in blocks.successors[n]:
            bits |= (1 << pos[s]) | reach[pos[s]]
        reach[pos[n]] = bits
    return [(i, j) for i in range(len(names)) for j in range(i + 1, len(names)) if not (reach[i] >> j) & 1]


def _fork_join_regions(blocks: OpGraph) -> list[tuple[int, int, tuple[int, ...]]]:
    """Each fork with its join (immediate post-dominator) and the blocks between them."""
    names = [b.name for b in blocks.nodes]
    pos = {n: i for i, n in enumerate(names)}
    n = len(names)
    reach = [0] * n  # descendants
    pdom = [0] * n  # blocks every path from here to the end passes through (itself included)
    for name in reversed(names):
        i = pos[name]
        succ = [pos[s] for s in blocks.successors[name]]
        bits = 0
        common = None
        for s in succ:
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
    for name in names:
        x = pos[name]
        if len(blocks.successors[name]) < 2:
            continue
        rest = pdom[x] & ~(1 << x)
        if not rest:
            continue
        y = (rest & -rest).bit_length() - 1  # the nearest post-dominator
        between = reach[x] & ancestors[y]
        regions.append((x, y, tuple(b for b in range(n) if (between >> b) & 1)))
    return regions
