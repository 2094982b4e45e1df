"""Baselines and warm starts in problem terms: each returns an ``Assignment`` (block -> unit).

  single_unit     everything on one unit
  layer_switched  every block on the unit that runs it fastest, one frame at a time
  list_schedule   earliest-finish-time list scheduling; with topological priority it is
                  para-only (no pipelining, branches spread over PUs), with upward rank
                  HEFT, with the critical path pinned to one unit CPOP
  pipe_only       Pipe-it style: consecutive blocks in stages, one unit per stage,
                  split by dynamic programming for the smallest period
  balanced        load balancing for throughput (the LP relaxation rounded, then moves and swaps)
  segmented       latency: the ILP on each segment between articulation blocks, one after the other
All work on full clusters and non-CPU PUs unless told which units to use.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
from collections.abc import Sequence

from planner.ilp import relaxed_shares
from planner.plan import PlanError
from planner.problem import Problem
from planner.timing import Assignment, fits, period_loads, schedule


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
    """Earliest finish time: take ready blocks by priority (highest first), put each where it ends first.
    The units run their blocks in the order they were taken (a topological order): that is the schedule
    whose finish times it chose by, and it can be far shorter than the same assignment in index order."""
    n = len(problem.blocks)
    preds = _preds(problem)
    prio = priority or [-b for b in range(n)]
    placed: dict[int, int] = {}
    finish: dict[int, float] = {}
    free: dict[int, float] = {}
    remaining = set(range(n))
    taken: list[int] = []
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
        taken.append(b)
    return Assignment(tuple(placed[b] for b in range(n)), tuple(taken))


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
    """Consecutive blocks per stage, one unit per stage, any order of units, every PU considered: for each
    way to cut the CPU clusters into units, the smallest largest stage load (bisection on the period, a
    subset DP deciding each), then the candidate whose period in the ILP's model (links, overheads) is best."""
    n = len(problem.blocks)
    limit = max_stages or problem.max_stages
    best: tuple[float, Assignment] | None = None
    for units in _unit_sets(problem):
        assign = _pipe_split(problem, units, limit, n)
        if assign is None:
            continue
        period = schedule(problem, assign).period_ms
        if best is None or period < best[0] - 1e-12:
            best = (period, assign)
    return best[1] if best else None


def _pipe_split(problem: Problem, units: list[int], limit: int, n: int) -> Assignment | None:
    prefix: dict[int, list[float]] = {}
    blocked_next: dict[int, list[int]] = {}  # first block at or after b that u cannot run
    for u in units:
        acc = [0.0]
        for b in range(n):
            acc.append(acc[-1] + problem.cost.get((b, u), 0.0) * problem.factor(u))  # its load in the period
        prefix[u] = acc
        nxt = [n] * (n + 1)
        for b in reversed(range(n)):
            nxt[b] = b if (b, u) not in problem.cost else nxt[b + 1]
        blocked_next[u] = nxt
    masks = [m for m in range(1, 1 << len(units)) if bin(m).count("1") <= limit]
    masks.sort(key=lambda m: bin(m).count("1"))

    def furthest(u: int, start: int, period: float) -> int:
        """The end of the longest chunk from ``start`` that u runs within the period."""
        end = bisect.bisect_right(prefix[u], prefix[u][start] + period * (1 + 1e-12)) - 1
        return max(start, min(end, blocked_next[u][start]))

    def cover(period: float) -> list[tuple[int, int, int]] | None:
        """Chunks (unit, start, end) covering every block, each within the period, or None."""
        reach = {0: 0}
        parent: dict[int, tuple[int, int]] = {}
        for m in masks:
            best_end, how = -1, None
            for k, u in enumerate(units):
                prev = m & ~(1 << k)
                if not (m >> k) & 1 or prev not in reach:
                    continue
                end = furthest(u, reach[prev], period)
                if end > best_end:
                    best_end, how = end, (prev, k)
            if how is None:
                continue
            reach[m], parent[m] = best_end, how
            if best_end == n:
                chunks = []
                while m:
                    prev, k = parent[m]
                    if reach[m] > reach[prev]:
                        chunks.append((units[k], reach[prev], reach[m]))
                    m = prev
                return chunks
        return None

    singles = [prefix[u][n] for u in units if blocked_next[u][0] == n]
    load = {(b, u): v * problem.factor(u) for (b, u), v in problem.cost.items()}
    hi = min(singles) if singles else sum(max(v for (b, _), v in load.items() if b == c) for c in range(n))
    lo = max(min(load[(b, u)] for u in units if (b, u) in load) for b in range(n))
    if cover(hi) is None:
        return None
    for _ in range(60):
        if hi - lo <= 1e-9 * hi:
            break
        mid = (lo + hi) / 2
        if cover(mid) is None:
            lo = mid
        else:
            hi = mid
    chunks = cover(hi)
    assert chunks is not None
    assign = [0] * n
    for u, start, end in chunks:
        for b in range(start, end):
            assign[b] = u
    return Assignment(tuple(assign))


def _unit_sets(problem: Problem) -> list[list[int]]:
    """Ways to cut the board into units: each CPU cluster whole, in halves or in single cores (every
    combination over the clusters), with every non-CPU PU."""
    others = [u for u, x in enumerate(problem.units) if x.kind != "cpu"]
    per_cluster: list[list[list[int]]] = []
    for pu, n in problem.cluster_cores.items():
        options: list[list[int]] = []
        for want in dict.fromkeys((n, max(1, n // 2), 1)):
            chosen = [
                u for u, x in enumerate(problem.units) if x.pu == pu and x.cores == want and x.instance < n // want
            ]
            if chosen and chosen not in options:
                options.append(chosen)
        per_cluster.append(options)
    sets = []
    for combo in itertools.product(*per_cluster):
        chosen = sorted(others + [u for part in combo for u in part])
        if chosen not in sets:
            sets.append(chosen)
    return sets


def _uniform_unit_sets(problem: Problem) -> list[list[int]]:
    """Every CPU cluster cut the same way (whole, halves, single cores), with every non-CPU PU."""
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
    return sets


def balanced(problem: Problem, tries: int | None = None) -> Assignment | None:
    """Throughput warm start, on each uniform cut of the board, from two starts: longest block first onto the
    least-loaded unit, and every block on the unit the throughput model's LP relaxation gives most of it; each
    then improved by single-block moves and pairwise swaps while they help (at most ``tries`` evaluations per
    start, by default about 150,000 block evaluations: a count, not a time, so the same inputs give the same
    plan); the best of them, a plan that fits memory before one that does not.

    Why the relaxation: a vertex of it splits few blocks between units (Lenstra, Shmoys and Tardos), so its
    rounding starts near the optimum's loads, where the greedy start settles in a local optimum that moves and
    swaps do not leave. On khadas-vim3, multiview_bev: 35.9 ms from the greedy start, 32.8 from the relaxation's
    (HiGHS took 40 s to find a plan within 1% from the first, 5 s from the second); googlenet 49.0 and 47.9.
    Over the zoo's 8 models on khadas-vim3, khadas-vim3-armcl and bst-a1000 the relaxation's start is 1-9%
    better on the first two, as good on bst-a1000, and 1.3% worse once (dbnet_det): hence both."""
    best: tuple[tuple[bool, tuple[float, float]], Assignment] | None = None
    n = len(problem.blocks)
    tries = min(4000, 150_000 // max(n, 1)) if tries is None else tries
    sets = _uniform_unit_sets(problem)
    shares = relaxed_shares(problem, sets, RELAXATION_SECONDS)
    for units, share in zip(sets, shares, strict=True):
        for start in (_longest_first(problem, units), _rounded(problem, units, share)):
            if start is None:
                continue
            current = _rebalance(problem, start, units, tries)
            score = (not fits(problem, current), _balance(problem, current))
            if best is None or score < best[0]:
                best = (score, current)
    return best[1] if best else None


# The relaxations of the throughput model (one per uniform cut) take 0.3-1.6 s together for the zoo's models on a
# 2-core x86 VM (bert_small's 256 fine blocks the most); a cut left without one past this budget
# has the greedy start alone (and a model that large may then plan differently from one run to the next)
RELAXATION_SECONDS = 10.0


def _longest_first(problem: Problem, units: Sequence[int]) -> Assignment | None:
    """Longest block first onto the unit it would leave least loaded (None: a block runs on none of them)."""
    n = len(problem.blocks)
    order = sorted(range(n), key=lambda b: -min(problem.cost.get((b, u), float("inf")) for u in units))
    load = {u: 0.0 for u in units}
    assign = [-1] * n
    for b in order:
        options = [u for u in units if _runs(problem, b, u)]
        if not options:
            return None
        u = min(options, key=lambda x: load[x] + problem.cost[(b, x)] * problem.factor(x))
        assign[b] = u
        load[u] += problem.cost[(b, u)] * problem.factor(u)
    return Assignment(tuple(assign))


def _rounded(problem: Problem, units: Sequence[int], share: dict[tuple[int, int], float] | None) -> Assignment | None:
    """Every block on the unit of ``units`` with its largest share in the relaxation (the lowest unit of equal
    shares; None: no relaxation, or a block runs on none of them)."""
    if share is None:
        return None
    assign = []
    for b in range(len(problem.blocks)):
        options = [u for u in units if _runs(problem, b, u)]
        if not options:
            return None
        assign.append(max(options, key=lambda u: (share.get((b, u), 0.0), -u)))
    return Assignment(tuple(assign))


def _balance(problem: Problem, assignment: Assignment) -> tuple[float, float]:
    """What load balancing minimises: the period, then the sum of squared resource loads (so that a move
    off one of several equally busiest units counts: it is the way down to a shorter period)."""
    period, loads = period_loads(problem, assignment)
    return round(period, 9), sum(x * x for x in loads)


def _rebalance(problem: Problem, start: Assignment, units: Sequence[int], tries: int) -> Assignment:
    """Moves of a block off a busiest unit, else swaps of such a block with one elsewhere: the first that
    improves ``_balance`` is taken, until none does or ``tries`` evaluations are spent."""
    current, score = start, _balance(problem, start)
    n = len(problem.blocks)

    def trial(changes: dict[int, int]) -> bool:
        nonlocal current, score, tries
        tries -= 1
        unit_of = list(current.block_unit)
        for b, u in changes.items():
            unit_of[b] = u
        cand = Assignment(tuple(unit_of))
        s = _balance(problem, cand)
        if s < score and fits(problem, cand):
            current, score = cand, s
            return True
        return False

    improved = True
    while improved and tries > 0:
        improved = False
        period, loads = period_loads(problem, current)
        busiest = {u for u in units if loads[u] >= period - 1e-9}
        for b in (b for b in range(n) if current.block_unit[b] in busiest):
            if any(tries > 0 and u != current.block_unit[b] and _runs(problem, b, u) and trial({b: u}) for u in units):
                improved = True
                break
        if improved:
            continue
        for b in (b for b in range(n) if current.block_unit[b] in busiest):
            u = current.block_unit[b]
            if any(
                tries > 0 and v != u and _runs(problem, b, v) and _runs(problem, c, u) and trial({b: v, c: u})
                for c, v in enumerate(current.block_unit)
            ):
                improved = True
                break
    return current


def segmented(problem: Problem, units: Sequence[int], time_limit: float = 1.0) -> Assignment | None:
    """Latency warm start: the segments between articulation blocks (nothing runs beside them) one after
    the other, each solved by the ILP on ``units`` for its shortest span, its first block kept on the unit
    the segment before it chose. A frame's latency is the sum of its segments' spans, so this is exact
    but for that greedy choice at the joins (and the per-partition overhead the segments do not see)."""
    from planner.ilp import ordering_rows, rows_within, solve  # the ILP on a segment: a far smaller sub-problem

    n = len(problem.blocks)
    allowed = set(units)
    cuts = [c for c in problem.articulations() if c > 0]
    bounds = [0, *cuts] if cuts and cuts[-1] == n - 1 else [0, *cuts, n - 1]
    unit_of: dict[int, int] = {}
    per = time_limit / max(1, len(bounds) - 1)
    for lo, hi in itertools.pairwise(bounds):
        sub = problem.segment(lo, hi, sink=hi != n - 1)
        # the first block stays where the segment before put it; identical units are interchangeable within
        # a segment, so it is pinned to the first of its kind (the ILP's symmetry rows ask for that) and the
        # two swap back afterwards
        pinned = unit_of.get(lo)
        swap: dict[int, int] = {}
        if pinned is not None:
            x = problem.units[pinned]
            first = next(u for u, y in enumerate(problem.units) if (y.pu, y.cores, y.instance) == (x.pu, x.cores, 0))
            swap = {first: pinned, pinned: first}
        cost = {
            (b, u): v
            for (b, u), v in sub.cost.items()
            if u in allowed and (b != 0 or pinned is None or u == swap[pinned])
        }
        if len({b for b, _ in cost}) < hi - lo + 1:
            return None  # a block none of these units can run
        if ordering_rows(sub) > rows_within(per):
            return None  # a segment too wide for its share of the time (HEFT stands in)
        # fp32 placements, as every heuristic's (``with_int8`` adds the precision choice to the start): the segment's
        # int8/fp16 times would let its ILP put blocks on units outside ``units`` (an NPU) in a precision the
        # assignment returned here does not record
        sub = dataclasses.replace(sub, cost=cost, int8_cost={}, second_cost={}, derived={})
        try:  # HEFT on the segment is the start: a share of the time too short for a solution keeps it
            solution = solve(sub, "latency", per, gap=1e-4, warm=heft(sub, sorted({u for _, u in cost})))
        except PlanError:
            return None
        for b, u in enumerate(solution.assignment.block_unit):
            unit_of[lo + b] = swap.get(u, u)
    # the units run their blocks in topological order (the lowering's order, so the prediction agrees)
    return Assignment(tuple(unit_of[b] for b in range(n)))


def improve_latency(problem: Problem, start: Assignment, units: Sequence[int], tries: int = 2000) -> Assignment:
    """Moves one block at a time to another of ``units`` while the latency drops (and memory fits), trying
    at most ``tries`` moves (a count, not a time: the same inputs give the same plan)."""
    current, best = start, schedule(problem, start).latency_ms
    improved = True
    while improved and tries > 0:
        improved = False
        for b in range(len(problem.blocks)):
            for u in units:
                if u == current.block_unit[b] or not _runs(problem, b, u):
                    continue
                tries -= 1
                trial = list(current.block_unit)
                trial[b] = u
                candidate = Assignment(tuple(trial), current.order)
                latency = schedule(problem, candidate).latency_ms
                if latency < best - 1e-9 and fits(problem, candidate):
                    current, best, improved = candidate, latency, True
    return current


def fastest(problem: Problem, tries: int = 2, time_limit: float = 2.0) -> Assignment | None:
    """Latency warm start: on the ``tries`` ways to cut the board into units where HEFT is fastest, the
    segment-by-segment ILP (``segmented``) and HEFT; the fastest of them, improved by single-block moves.
    The segments' ILPs take at most about ``time_limit`` seconds."""
    ranked = sorted(_unit_sets(problem), key=lambda us: schedule(problem, heft(problem, us)).latency_ms)
    starts = []
    for units in ranked[:tries]:
        for start in (segmented(problem, units, time_limit / tries), heft(problem, units)):
            if start is not None and fits(problem, start):
                starts.append((schedule(problem, start).latency_ms, start, units))
    if not starts:
        return None
    _, start, units = min(starts, key=lambda s: s[0])
    return improve_latency(problem, start, units)


def with_int8(problem: Problem, a: Assignment) -> Assignment:
    """The same placement with blocks switched to int8 (fp16 on a unit that offers fp16) where their unit runs them
    faster so, most time saved
    per unit of sensitivity first, while the summed sensitivities stay within the accuracy budget (a warm
    start for plans with a precision choice; blocks on a unit that computes int8 only stay int8)."""
    forced = {b for b, u in enumerate(a.block_unit) if (b, u) not in problem.cost and (b, u) in problem.int8_cost}
    spent = sum(problem.loss(b, a.block_unit[b]) for b in forced)
    budget = problem.accuracy_budget if problem.accuracy_budget is not None else float("inf")
    gains = []
    for b, u in enumerate(a.block_unit):
        if b in forced or (b, u) not in problem.int8_cost or (b, u) not in problem.cost:
            continue
        saved = problem.cost[(b, u)] - problem.int8_cost[(b, u)]
        if saved > 0:
            gains.append((saved / max(problem.loss(b, u), 1e-9), b))
    chosen = set(forced)
    for _, b in sorted(gains, reverse=True):
        loss = problem.loss(b, a.block_unit[b])
        if spent + loss <= budget:
            chosen.add(b)
            spent += loss
    return dataclasses.replace(a, int8=frozenset(chosen), second=frozenset())
