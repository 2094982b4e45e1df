"""Baselines and warm starts in problem terms: each returns an ``Assignment`` (block -> unit).

  single_unit     everything on one unit
  layer_switched  every block on the unit that runs it fastest, one frame at a time
  list_schedule   earliest-finish-time list scheduling; with topological priority it is
                  para-only (no pipelining, branches spread over PUs), with upward rank
                  HEFT, with the critical path pinned to one unit CPOP
  pipe_only       Pipe-it style: consecutive blocks in stages, one unit per stage,
                  split by dynamic programming for the smallest period
  balanced        load balancing for throughput (longest job first, then moves and swaps)
All work on full clusters and non-CPU PUs unless told which units to use.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from planner.ilp import Assignment, schedule
from planner.problem import Problem


def full_units(problem: Problem) -> list[int]:
    """Each CPU cluster with all its cores, and each non-CPU PU."""
    out = []
    for u, x in enumerate(problem.units):
        if x.instance == 0 and (x.kind != "cpu" or x.cores == problem.cluster_cores[x.pu]):
            out.append(u)
    return out


def core_units(problem: Problem) -> list[int]:
    """Every CPU core as its own unit, and each non-CPU PU."""
    return [u for u, x in enumerate(problem.units) if x.kind != "cpu" or x.cores == 1]


def _runs(problem: Problem, b: int, u: int) -> bool:
    return (b, u) in problem.cost


def single_unit(problem: Problem, u: int) -> Assignment | None:
    if all(_runs(problem, b, u) for b in range(len(problem.blocks))):
        return Assignment(tuple(u for _ in problem.blocks))
    return None


def layer_switched(problem: Problem, units: Sequence[int]) -> Assignment:
    return Assignment(
        tuple(
            min((u for u in units if _runs(problem, b, u)), key=lambda u: problem.cost[(b, u)])
            for b in range(len(problem.blocks))
        )
    )


def _preds(problem: Problem) -> dict[int, list[tuple[int, int]]]:
    preds: dict[int, list[tuple[int, int]]] = {b: [] for b in range(len(problem.blocks))}
    for ei, (i, j, _) in enumerate(problem.edges):
        preds[j].append((i, ei))
    return preds


def _comm(problem: Problem, ei: int, ui: int, uj: int) -> float:
    p, q = problem.units[ui].pu, problem.units[uj].pu
    return problem.transfer[(ei, p, q)] if p != q else 0.0


def upward_rank(problem: Problem, units: Sequence[int]) -> list[float]:
    n = len(problem.blocks)
    mean = [
        sum(problem.cost[(b, u)] for u in units if _runs(problem, b, u))
        / max(1, sum(1 for u in units if _runs(problem, b, u)))
        for b in range(n)
    ]
    succ: dict[int, list[tuple[int, int]]] = {b: [] for b in range(n)}
    for ei, (i, j, _) in enumerate(problem.edges):
        succ[i].append((j, ei))
    rank = [0.0] * n
    for b in reversed(range(n)):
        comm = [
            max((problem.transfer.get((ei, p, q), 0.0) for (e2, p, q) in problem.transfer if e2 == ei), default=0.0)
            for _, ei in succ[b]
        ]
        rank[b] = mean[b] + max((rank[j] + c for (j, _), c in zip(succ[b], comm, strict=True)), default=0.0)
    return rank


def list_schedule(
    problem: Problem,
    units: Sequence[int],
    priority: Sequence[float] | None = None,
    pinned: dict[int, int] | None = None,
) -> Assignment:
    """Earliest finish time: take ready blocks by priority (highest first), put each where it ends first."""
    n = len(problem.blocks)
    preds = _preds(problem)
    prio = priority or [-b for b in range(n)]
    placed: dict[int, int] = {}
    finish: dict[int, float] = {}
    free: dict[int, float] = {}
    remaining = set(range(n))
    while remaining:
        ready = [b for b in remaining if all(i in placed for i, _ in preds[b])]
        b = max(ready, key=lambda x: (prio[x], -x))
        best = None
        for u in [pinned[b]] if pinned and b in pinned else units:
            if not _runs(problem, b, u):
                continue
            start = free.get(u, 0.0)
            for i, ei in preds[b]:
                start = max(start, finish[i] + _comm(problem, ei, placed[i], u))
            end = start + problem.cost[(b, u)]
            if best is None or end < best[0]:
                best = (end, u)
        if best is None:  # the pinned unit cannot run it: fall back to any unit
            return list_schedule(problem, units, priority, None)
        finish[b], placed[b] = best
        free[best[1]] = best[0]
        remaining.remove(b)
    return Assignment(tuple(placed[b] for b in range(n)))


def heft(problem: Problem, units: Sequence[int]) -> Assignment:
    return list_schedule(problem, units, upward_rank(problem, units))


def cpop(problem: Problem, units: Sequence[int]) -> Assignment:
    """Critical-path-on-a-processor: the blocks of the longest path go to the one unit that runs them fastest."""
    n = len(problem.blocks)
    up = upward_rank(problem, units)
    down = [0.0] * n
    preds = _preds(problem)
    mean = [
        sum(problem.cost[(b, u)] for u in units if _runs(problem, b, u))
        / max(1, sum(1 for u in units if _runs(problem, b, u)))
        for b in range(n)
    ]
    for b in range(n):
        down[b] = max((down[i] + mean[i] for i, _ in preds[b]), default=0.0)
    prio = [up[b] + down[b] for b in range(n)]
    top = max(prio)
    critical = [b for b in range(n) if abs(prio[b] - top) <= 1e-9 * max(1.0, top)]
    candidates = [u for u in units if all(_runs(problem, b, u) for b in critical)]
    if not candidates:
        return list_schedule(problem, units, prio)
    cp_unit = min(candidates, key=lambda u: sum(problem.cost[(b, u)] for b in critical))
    return list_schedule(problem, units, prio, {b: cp_unit for b in critical})


def pipe_only(problem: Problem, max_stages: int | None = None) -> Assignment | None:
    """Consecutive blocks per stage, one unit per stage, over unit sets and orders; the smallest period wins."""
    n = len(problem.blocks)
    best: tuple[float, Assignment] | None = None
    limit = max_stages or problem.max_stages
    for units in _unit_sets(problem):
        for k in range(1, min(limit, len(units)) + 1):
            for order in itertools.permutations(units, k):
                assign = _split(problem, list(order), n)
                if assign is None:
                    continue
                period = schedule(problem, assign).period_ms
                if best is None or period < best[0]:
                    best = (period, assign)
    return best[1] if best else None


def _unit_sets(problem: Problem) -> list[list[int]]:
    """Ways to cut the board into units: clusters whole, clusters split into halves, into cores."""
    sets = []
    for split in ("whole", "halves", "cores"):
        chosen = []
        for u, x in enumerate(problem.units):
            if x.kind != "cpu":
                chosen.append(u)
                continue
            n = problem.cluster_cores[x.pu]
            want = {"whole": n, "halves": max(1, n // 2), "cores": 1}[split]
            if x.cores == want and x.instance < n // want:
                chosen.append(u)
        if chosen not in sets:
            sets.append(chosen)
    return [s[:6] for s in sets]  # permutations of more than six units are not worth their time here


def _split(problem: Problem, order: list[int], n: int) -> Assignment | None:
    """DP: blocks 0..n-1 cut into len(order) consecutive non-empty chunks minimising the largest chunk."""
    k = len(order)
    inf = float("inf")
    prefix = [[0.0] * (n + 1) for _ in order]
    blocked = [[0] * (n + 1) for _ in order]  # prefix count of blocks the unit cannot run
    for s, u in enumerate(order):
        for b in range(n):
            c = problem.cost.get((b, u))
            prefix[s][b + 1] = prefix[s][b] + (c or 0.0)
            blocked[s][b + 1] = blocked[s][b] + (c is None)
    best = [[inf] * (n + 1) for _ in range(k + 1)]
    cut = [[0] * (n + 1) for _ in range(k + 1)]
    best[0][0] = 0.0
    for s in range(1, k + 1):
        for end in range(s, n + 1):
            for start in range(s - 1, end):
                if best[s - 1][start] == inf or blocked[s - 1][end] != blocked[s - 1][start]:
                    continue
                load = prefix[s - 1][end] - prefix[s - 1][start]
                value = max(best[s - 1][start], load)
                if value < best[s][end]:
                    best[s][end], cut[s][end] = value, start
    if best[k][n] == inf:
        return None
    assign = [0] * n
    end = n
    for s in range(k, 0, -1):
        start = cut[s][end]
        for b in range(start, end):
            assign[b] = order[s - 1]
        end = start
    return Assignment(tuple(assign))


def balanced(problem: Problem) -> Assignment | None:
    """Throughput warm start: longest block first onto the least-loaded unit, then improving moves and swaps."""
    best: tuple[float, Assignment] | None = None
    for units in _unit_sets(problem):
        n = len(problem.blocks)
        order = sorted(range(n), key=lambda b: -min(problem.cost.get((b, u), float("inf")) for u in units))
        load = {u: 0.0 for u in units}
        assign = [-1] * n
        for b in order:
            options = [u for u in units if _runs(problem, b, u)]
            if not options:
                break
            u = min(options, key=lambda x: load[x] + problem.cost[(b, x)])
            assign[b] = u
            load[u] += problem.cost[(b, u)]
        if -1 in assign:
            continue
        current = Assignment(tuple(assign))
        period = schedule(problem, current).period_ms
        improved = True
        while improved:
            improved = False
            for b in range(n):
                for u in units:
                    if u == current.block_unit[b] or not _runs(problem, b, u):
                        continue
                    trial = list(current.block_unit)
                    trial[b] = u
                    cand = Assignment(tuple(trial))
                    p = schedule(problem, cand).period_ms
                    if p < period - 1e-9:
                        current, period, improved = cand, p, True
        if best is None or period < best[0]:
            best = (period, current)
    return best[1] if best else None
