"""A proven lower bound on the latency of every plan, computed outside the latency ILP, per way to cut the CPU
clusters into units.

Why: between consecutive articulation blocks (blocks nothing runs beside) a plan's latency is a sum of spans,
and each span is bounded by a small problem on its own (``ilp.segment_bounds``). But a plan cuts each CPU
cluster into units once, for the whole frame: a multi-view model's six camera branches run fastest over four
one-core units, its transformer head on one four-core unit, and no plan has both. Bounds per span taken over
every unit add up to a figure no plan reaches (the solver's bound stayed 3.8% under the best plan there).

So, for every maximal configuration (each CPU cluster cut into units whose cores add up to the cluster's, the
other PUs as they are): the sum over the spans of a bound on each with only that configuration's units, the
spans being

- a run of consecutive articulation blocks: the shortest path through it over the units, a transfer (and
  handoff delay) wherever two consecutive blocks change PU (no other edge, no unit busy with anything else);
- a stretch with blocks between two articulation blocks: the proven bound of the latency ILP of that stretch
  alone (``ilp.latency_bound``: no partition overhead, no gRPC CPU time); for the stretches that bound leaves
  out (more than a quarter of a large model: the camera branches, a detector's neck and heads) a load bound
  (``load_bound``: the articulation block before it at its fastest, then each block on one unit, every unit's
  blocks one after the other between the least time before each can start and after each ends: an assignment
  problem without the ordering, whose MIP closes where the scheduling one does not).

A plan's units fit within one maximal configuration (identical units are used in instance order, as the ILP's
symmetry rows ask, and a cluster's units extend to a maximal set), and each span's problem on that
configuration's units holds the plan's part of the frame, so the least of these sums over the configurations is
a lower bound on every plan's latency, and on the latency ILP's optimum. Relaxations all: memory, the accuracy
budget, the other figures' bounds, partition overheads and gRPC CPU time are left out, and each block takes its
faster precision.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time

import pulp

from planner.highs import solve_for_bound
from planner.ilp import latency_bound, least_ms, section_paths, segment_bounds
from planner.problem import Problem
from planner.symmetry import twin_branches


def configurations(problem: Problem) -> tuple[frozenset[int], ...]:
    """Every maximal set of units a plan may use at once: per CPU cluster, units whose cores add up to at most
    the cluster's and to which no unit can be added (identical units taken in instance order); every other unit.
    Each plan's units are, relabelled among identical units, a subset of one of them."""
    units = problem.units
    others = frozenset(u for u, x in enumerate(units) if x.pu not in problem.cluster_cores)
    per_cluster = []
    for pu, cores in problem.cluster_cores.items():
        mine = [u for u, x in enumerate(units) if x.pu == pu]
        by_size: dict[int, list[int]] = {}
        for u in sorted(mine, key=lambda u: units[u].instance):
            by_size.setdefault(units[u].cores, []).append(u)
        sizes = sorted(by_size)
        choices = []
        for counts in itertools.product(*(range(len(by_size[k]) + 1) for k in sizes)):
            used = sum(k * c for k, c in zip(sizes, counts, strict=True))
            if used > cores:
                continue
            # maximal: no unit left that fits the cores that are left
            if any(c < len(by_size[k]) and used + k <= cores for k, c in zip(sizes, counts, strict=True)):
                continue
            choices.append(frozenset(u for k, c in zip(sizes, counts, strict=True) for u in by_size[k][:c]))
        per_cluster.append(choices)
    return tuple(others.union(*combo) for combo in itertools.product(*per_cluster))


def restricted(problem: Problem, units: frozenset[int]) -> Problem:
    """The same problem with blocks allowed only on ``units``."""
    return dataclasses.replace(
        problem,
        cost={k: v for k, v in problem.cost.items() if k[1] in units},
        int8_cost={k: v for k, v in problem.int8_cost.items() if k[1] in units},
        second_cost={k: v for k, v in problem.second_cost.items() if k[1] in units},
        derived={},
    )


@dataclasses.dataclass(frozen=True)
class _Piece:
    """A span of a frame: from x's start (x = -1: the frame's arrival) to y's start (y = n: its departure)."""

    x: int
    y: int
    chain: tuple[int, ...] = ()  # a run of consecutive articulation blocks x..y (y = n: through the last block)


def pieces(problem: Problem) -> tuple[_Piece, ...]:
    """The frame cut at its articulation blocks into runs (consecutive articulation blocks, each feeding the
    next) and stretches (blocks between two articulation blocks); their spans add up to the latency."""
    n = len(problem.blocks)
    cuts = problem.articulations()
    ends = [-1, *cuts, n]
    edge = {(i, j) for i, j, _ in problem.edges}
    out: list[_Piece] = []
    run: list[int] = []
    for x, y in itertools.pairwise(ends):
        if x >= 0 and y == x + 1 and (y == n or (x, y) in edge):
            run = run or [x]
            run.append(y)
            continue
        if run:
            out.append(_Piece(run[0], run[-1], tuple(run)))
            run = []
        out.append(_Piece(x, y))
    if run:
        out.append(_Piece(run[0], run[-1], tuple(run)))
    return tuple(p for p in out if p.y - p.x >= 1 and not (p.x == -1 and p.y == 0))


def _chain_span(problem: Problem, chain: tuple[int, ...], units: frozenset[int]) -> float:
    """The least time from the chain's first block's start to its last one's (its end, where the last is the
    frame's departure n) on ``units``: a shortest path, a transfer where consecutive blocks change PU."""
    n = len(problem.blocks)
    edge = {(i, j): ei for ei, (i, j, _) in enumerate(problem.edges)}
    pu = [x.pu for x in problem.units]
    order = sorted(units)
    arrive = {u: 0.0 for u in order if least_ms(problem, chain[0], u) < math.inf}
    for prev, b in itertools.pairwise(chain):
        done = {u: a + least_ms(problem, prev, u) for u, a in arrive.items()}
        if b == n:
            return min(done.values(), default=math.inf)
        ei = edge[(prev, b)]
        arrive = {}
        for v in order:
            if least_ms(problem, b, v) == math.inf:
                continue
            arrive[v] = min(
                (
                    f
                    + (
                        0.0
                        if pu[u] == pu[v]
                        else problem.transfer[(ei, pu[u], pu[v])] + problem.handoff_delay.get((ei, pu[u], pu[v]), 0.0)
                    )
                    for u, f in done.items()
                ),
                default=math.inf,
            )
    return min(arrive.values(), default=math.inf)


def load_bound(
    problem: Problem, x: int, y: int, units: frozenset[int], time_limit: float, relaxed: bool = False
) -> float | None:
    """A lower bound on the time from x's start to y's start with only ``units`` (``Problem.sections``' stretch x..y):
    x at its fastest, then the proven bound of an assignment MIP: every block between on one unit, the span at
    least each unit's work plus its least idle time before and after (``section_gaps``), a cluster's cores
    delivering at most their number of core-ms per ms. Twin branches (``twin_branches``) are counted per unit,
    not placed one by one (each placement of them is one count). ``relaxed``: its LP relaxation (fast, weaker).
    None: no bound in the time."""
    sections = {(s[0], s[1]): k for k, s in enumerate(problem.sections())}
    if (x, y) not in sections:
        return None
    between = problem.sections()[sections[(x, y)]][2]
    head, tail = section_paths(problem)[sections[(x, y)]]
    inside = set(between)
    twins = [c for c in twin_branches(problem) if c[0][0] in inside]
    in_twin = {b for c in twins for branch in c for b in branch}
    order = sorted(units)
    lp = pulp.LpProblem("load_bound", pulp.LpMinimize)
    span = pulp.LpVariable("span", 0)
    used = {u: pulp.LpVariable(f"used_{u}", cat="Binary") for u in order}
    # (block, unit) -> how many copies of the block run on the unit: 0/1, or 0..k for a block of k twin branches
    placed: dict[tuple[int, int], pulp.LpVariable] = {}
    for b in between:
        if b in in_twin:
            continue
        allowed = [u for u in order if least_ms(problem, b, u) < math.inf]
        if not allowed:
            return math.inf
        for u in allowed:
            placed[(b, u)] = pulp.LpVariable(f"a_{b}_{u}", cat="Binary")
            lp += used[u] >= placed[(b, u)]
        lp += pulp.lpSum(placed[(b, u)] for u in allowed) == 1
        # the block's own path: the least time before it, its time, the least time after it
        lp += span >= pulp.lpSum((head[b][u] + least_ms(problem, b, u) + tail[b][u]) * placed[(b, u)] for u in allowed)
    for ci, members in enumerate(twins):
        k = len(members)
        for j, b in enumerate(members[0]):
            allowed = [u for u in order if least_ms(problem, b, u) < math.inf]
            if not allowed:
                return math.inf
            for u in allowed:
                var = placed[(b, u)] = pulp.LpVariable(f"n_{ci}_{j}_{u}", 0, k, cat="Integer")
                lp += k * used[u] >= var
                some = pulp.LpVariable(f"some_{ci}_{j}_{u}", cat="Binary")  # 1 in a plan where a copy runs on u
                lp += k * some >= var
                lp += span >= (head[b][u] + least_ms(problem, b, u) + tail[b][u]) * some
            lp += pulp.lpSum(placed[(b, u)] for u in allowed) == k
    copies = {b: len(c) for c in twins for b in c[0]}
    work = {u: pulp.lpSum(least_ms(problem, b, u) * v for (b, w), v in placed.items() if w == u) for u in order}
    for u in order:
        mine = [(b, v) for (b, w), v in placed.items() if w == u]
        if not mine:
            continue
        # one unit runs its blocks one at a time: those that cannot start before h end no earlier than h plus their
        # time there, and the frame leaves no earlier than that plus the least tail among them (when one of them
        # runs there: ``any``); the same from the end
        for side in (0, 1):
            ends = (head, tail)[side]
            for k, h in enumerate(_thresholds({ends[b][u] for b, _ in mine})):
                chosen = [(b, v) for b, v in mine if ends[b][u] >= h]
                other = min((tail, head)[side][b][u] for b, _ in chosen)
                some = pulp.LpVariable(f"any_{u}_{side}_{k}", 0, 1)
                for b, v in chosen:
                    lp += copies.get(b, 1) * some >= v
                lp += span >= (h + other) * some + pulp.lpSum(least_ms(problem, b, u) * v for b, v in chosen)
    for pu, cores in problem.cluster_cores.items():
        mine = [u for u in order if problem.units[u].pu == pu]
        if mine:
            lp += pulp.lpSum(problem.units[u].cores * work[u] for u in mine) <= cores * span
    for u, w in itertools.permutations(order, 2):  # identical units: the busier first (any plan, relabelled)
        a_, b_ = problem.units[u], problem.units[w]
        if (a_.pu, a_.cores, a_.instance + 1) == (b_.pu, b_.cores, b_.instance):
            lp += work[u] >= work[w]
    lp += span
    if relaxed:
        for var in lp.variables():
            var.cat = pulp.LpContinuous
    solved = solve_for_bound(lp, time_limit)
    if solved is None:
        return None
    status, bound = solved
    if status == "infeasible":
        return math.inf
    if relaxed:
        bound = pulp.value(span) if status == "optimal" else None
    if bound is None:
        return None
    first = min((least_ms(problem, x, u) for u in order), default=0.0) if x >= 0 else 0.0
    return first + bound


def _thresholds(values: set[float], most: int = 8) -> list[float]:
    """At most ``most`` of the values (spread over their range), the least left out (it adds nothing)."""
    ordered = sorted(v for v in values if v > 0)
    if len(ordered) > most:
        ordered = [ordered[round(k * (len(ordered) - 1) / (most - 1))] for k in range(most)]
    return ordered


def big_stretches(problem: Problem) -> tuple[tuple[int, int], ...]:
    """The stretches ``ilp.segment_bounds`` leaves out (more than a quarter of a large model), as (x, y)."""
    n = len(problem.blocks)
    return tuple((x, y) for x, y, between in problem.sections() if len(between) + 1 > max(n // 4, 8))


def configuration_bound(
    problem: Problem, budget: float, ceiling: float | None = None, big: set[tuple[int, int]] | None = None
) -> float | None:
    """The least over the maximal configurations (``configurations``) of the summed bounds of the frame's spans
    (``pieces``) with that configuration's units: a lower bound on every plan's latency (and on the latency
    ILP's optimum), within about ``budget`` seconds; None where that found none.

    First every configuration is bounded fast: runs by their shortest path on its units, the stretches
    ``ilp.segment_bounds`` bounds by those bounds, the others by the LP relaxation of ``load_bound`` (these two
    over every unit, computed once). Then, the configurations below ``ceiling`` (a plan's latency: a
    configuration that reaches it holds no better plan, so a bound need not go past it) least first, each large
    stretch by the MIP ``load_bound`` and each small one by its own latency ILP on the configuration's units, in
    what is left. ``big``: the stretches (x, y) bounded as large ones (default ``big_stretches``)."""
    deadline = time.perf_counter() + budget
    n = len(problem.blocks)
    parts = pieces(problem)
    known = {(x, y): span for x, y, span in segment_bounds(problem, budget / 4)}
    big = set(big_stretches(problem)) if big is None else big
    everywhere = frozenset(range(len(problem.units)))
    for p in parts:
        if not p.chain and (p.x, p.y) in big:
            known[(p.x, p.y)] = load_bound(problem, p.x, p.y, everywhere, budget, relaxed=True) or 0.0
        if time.perf_counter() > deadline:
            return None
    fast: list[tuple[float, frozenset[int], dict[_Piece, float]]] = []
    for units in configurations(problem):
        sub = restricted(problem, units)
        spans = {p: _chain_span(sub, p.chain, units) if p.chain else known.get((p.x, p.y), 0.0) for p in parts}
        fast.append((sum(spans.values()), units, spans))
    fast.sort(key=lambda f: f[0])
    best = [min(total, ceiling) if ceiling is not None else total for total, _, _ in fast]
    todo = [k for k, (total, _, _) in enumerate(fast) if ceiling is None or total < ceiling]
    for done, k in enumerate(todo):
        _, units, spans = fast[k]
        sub = restricted(problem, units)
        for p in sorted(spans, key=lambda p: -(p.y - p.x)):
            left = deadline - time.perf_counter()
            if left <= 0.05:
                break
            if p.chain:
                continue
            share = left / (len(todo) - done)
            if (p.x, p.y) in big:
                tighter = load_bound(sub, p.x, p.y, units, share)
            else:
                sink = p.y < n
                seg = sub.segment(max(p.x, 0), p.y if sink else n - 1, sink=sink)
                tighter = latency_bound(seg, min(share, 0.5))
            if tighter is not None and tighter > spans[p]:
                spans[p] = tighter
        best[k] = min(sum(spans.values()), ceiling) if ceiling is not None else sum(spans.values())
    return min(best, default=None)
