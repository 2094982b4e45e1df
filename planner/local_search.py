"""Local search on a latency plan, evaluated exactly in the ILP's model (``ilp.schedule``).

``polish`` takes an assignment (the warm start the solver is about to be handed) and improves it: it descends
by moving one block to another unit (each move tried with the current order and with the blocks ordered by
their b-level on their new units), then by swapping the units of two blocks between the same two articulation
blocks; then it kicks (moves a few nearby blocks at random, seeded) and descends again, keeping a result only
when it lowers the latency (ties: the period). Every plan it keeps fits memory and the clusters' cores, meets
the bounds it is given, keeps each block's precision and runs each block after its inputs, so it never returns
a plan worse than the one it was given. The solver then starts from that plan: its big-M rows and its latency
ceiling tighten with it, and the gap it proves is measured against it.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from planner.ilp import NO_BOUNDS, Bounds, path_bounds
from planner.problem import Problem
from planner.timing import Assignment, Figures, fits, partition_starts, predecessors, schedule

_EPS = 1e-9
# a kick whose descent ends within this share of the latency of the plan it kicked is walked to (the search
# crosses plateaus); after RESTART kicks without a better plan the walk goes back to the best one
WALK, RESTART = 0.005, 10
# a move is tried in b-level order only when the current order leaves it within this share of the latency (on
# yolo_det, 70 of the 73 moves that paid in that order in 8 s)
REORDER_WITHIN = 0.03
# the search stops once it has gone twice as long without a better plan as it took to find the last one (at
# least STALL_S), or after ``patience`` kicks without one
STALL_S = 2.0
State = tuple[list[int], list[int], Figures]  # units of the blocks, their order, the figures in the ILP's model
Neighbourhood = Callable[[int, list[int], list[int], Figures], State | None]  # at a block, a better state or None


@dataclass(frozen=True)
class Polished:
    """What ``polish`` did: the assignment (the start itself when nothing better was found), its figures in
    the ILP's model, and how many kicks it made and how many of them paid."""

    assignment: Assignment
    figures: Figures
    improved: bool
    kicks: int
    kept: int


class _Latency:
    """The latency ``schedule`` computes, and only it: the inner loop of the search (several thousand plans a
    second on a 200-block model). Equal to ``schedule(problem, a).latency_ms`` for every assignment."""

    def __init__(
        self,
        problem: Problem,
        int8: frozenset[int],
        unit_of: Sequence[int] | None = None,
        second: frozenset[int] = frozenset(),
    ) -> None:
        """With ``unit_of`` (the start's units), a block in reduced precision may run only on units of the same
        one as its start's (int8, or fp16: the budget counted its loss in that one); a block of ``second`` (int8
        on a unit whose first reduced precision is fp16) only on such units, in int8."""
        self.problem = problem
        self.int8 = int8
        self.second = second
        self.n = len(problem.blocks)
        self.pu = [x.pu for x in problem.units]
        self.preds = predecessors(problem)
        self.succs: list[list[tuple[int, int]]] = [[] for _ in range(self.n)]
        for ei, (i, j, _) in enumerate(problem.edges):
            self.succs[i].append((j, ei))
        table = [
            problem.second_cost if b in second else problem.int8_cost if b in int8 else problem.cost
            for b in range(self.n)
        ]
        self.ms = [
            {
                u: table[b][(b, u)]
                for u in range(len(problem.units))
                if (b, u) in table[b]
                and (
                    unit_of is None or b not in int8 or b in second or problem.reduced(u) == problem.reduced(unit_of[b])
                )
            }
            for b in range(self.n)
        ]
        self.overheads = any(v > 0 for v in problem.unit_overhead.values())
        # a block's time is its own unit's alone: a plan changed from some position of its order on can be
        # scheduled again from there (``after``)
        self.incremental = not self.overheads and not problem.handoff_cpu and not problem.burst
        self.base: tuple[list[int], list[int], list[float], list[list[float]], dict[int, int]] | None = None
        self.comm: dict[tuple[int, str, str], float] = {}
        for (ei, p, q), v in problem.transfer.items():
            if p != q:
                self.comm[(ei, p, q)] = v

    def durations(self, unit_of: Sequence[int], order: Sequence[int]) -> list[float]:
        problem = self.problem
        if self.overheads:
            starts = partition_starts(problem, Assignment(tuple(unit_of), tuple(order), self.int8, self.second))
            dur = [
                self.ms[b][unit_of[b]] + (problem.unit_overhead[unit_of[b]] if starts[b] else 0.0)
                for b in range(self.n)
            ]
        else:
            dur = [self.ms[b][unit_of[b]] + 0.0 for b in range(self.n)]
        if problem.handoff_cpu:
            for ei, (i, j, _) in enumerate(problem.edges):
                send, receive = problem.handoff_cpu.get((ei, self.pu[unit_of[i]], self.pu[unit_of[j]]), (0.0, 0.0))
                dur[i] += send
                dur[j] += receive
        return problem.stalled(unit_of, dur, order)  # a throttled unit's work past its burst: at its factor

    def __call__(self, unit_of: Sequence[int], order: Sequence[int]) -> float:
        dur = self.durations(unit_of, order)
        pu, preds, delay = self.pu, self.preds, self.problem.handoff_delay
        free: dict[int, float] = {}
        finish = [0.0] * self.n
        for b in order:
            u = unit_of[b]
            q = pu[u]
            start = free.get(u, 0.0)
            for i, ei in preds[b]:
                p = pu[unit_of[i]]
                if p != q:
                    ready = finish[i] + self.comm[(ei, p, q)] + delay.get((ei, p, q), 0.0)
                else:  # another unit of the same PU pays the handoff delay; the same unit none
                    ready = finish[i] + delay.get((ei, p, p), 0.0) if unit_of[i] != u else finish[i]
                if ready > start:
                    start = ready
            finish[b] = free[u] = start + dur[b]
        return max(finish)

    def rebase(self, unit_of: list[int], order: list[int]) -> None:
        """Keeps the schedule of this plan (each block's finish, each unit's free time before each position of
        ``order``) for ``after``; nothing to do when it is the plan kept last (the same lists)."""
        if self.base is not None and self.base[0] is unit_of and self.base[1] is order:
            return
        dur = self.durations(unit_of, order)
        pu, preds, delay = self.pu, self.preds, self.problem.handoff_delay
        free = [0.0] * len(self.pu)
        finish = [0.0] * self.n
        before: list[list[float]] = []
        for b in order:
            before.append(free[:])
            u = unit_of[b]
            q = pu[u]
            start = free[u]
            for i, ei in preds[b]:
                p = pu[unit_of[i]]
                if p != q:
                    ready = finish[i] + self.comm[(ei, p, q)] + delay.get((ei, p, q), 0.0)
                else:  # another unit of the same PU pays the handoff delay; the same unit none
                    ready = finish[i] + delay.get((ei, p, p), 0.0) if unit_of[i] != u else finish[i]
                if ready > start:
                    start = ready
            finish[b] = free[u] = start + dur[b]
        self.base = (unit_of, order, finish, before, {b: k for k, b in enumerate(order)})

    def position(self, b: int) -> int:
        """Block b's position in the order of the plan kept by ``rebase``."""
        assert self.base is not None
        return self.base[4][b]

    def after(self, unit_of: Sequence[int], since: int) -> float:
        """The latency of the plan kept by ``rebase`` with the blocks at positions ``since`` and later of its
        order on ``unit_of``'s units (the blocks before them where they were): only those are scheduled again.
        Only without per-partition overheads, gRPC CPU time and throttled units (``incremental``), where a block's
        time is its own unit's alone."""
        assert self.base is not None and self.incremental
        _, order, finish, before, _ = self.base
        pu, preds, delay, ms = self.pu, self.preds, self.problem.handoff_delay, self.ms
        finish = finish[:]
        free = before[since][:]
        for k in range(since, self.n):
            b = order[k]
            u = unit_of[b]
            q = pu[u]
            start = free[u]
            for i, ei in preds[b]:
                p = pu[unit_of[i]]
                if p != q:
                    ready = finish[i] + self.comm[(ei, p, q)] + delay.get((ei, p, q), 0.0)
                else:  # another unit of the same PU pays the handoff delay; the same unit none
                    ready = finish[i] + delay.get((ei, p, p), 0.0) if unit_of[i] != u else finish[i]
                if ready > start:
                    start = ready
            finish[b] = free[u] = start + (ms[b][u] + 0.0)
        return max(finish)

    def blevel_order(self, unit_of: Sequence[int]) -> list[int]:
        """The blocks by decreasing b-level (their time and the longest path after them, transfers included) on
        their units; ties by index. Topological: a block's b-level is at least its successors'."""
        pu, bl = self.pu, [0.0] * self.n
        for b in reversed(range(self.n)):
            p, after = pu[unit_of[b]], 0.0
            for j, ei in self.succs[b]:
                q = pu[unit_of[j]]
                if p != q:
                    after = max(after, self.comm[(ei, p, q)] + bl[j])
                elif bl[j] > after:
                    after = bl[j]
            bl[b] = self.ms[b][unit_of[b]] + after
        return sorted(range(self.n), key=lambda b: (-bl[b], b))


def polish(
    problem: Problem,
    start: Assignment,
    deadline: float,
    bounds: Bounds = NO_BOUNDS,
    *,
    patience: int = 60,
    seed: int = 0,
) -> Polished:
    """The best plan the search finds from ``start`` by ``deadline`` (``time.perf_counter()``), never worse
    than ``start``; it stops earlier after ``patience`` kicks in a row that found nothing better, or once it has
    gone twice as long without a better plan as it took to find the last one (at least ``STALL_S``)."""
    search = _Search(problem, start, bounds, seed)
    figures = search.best_figures
    if search.acceptable(figures, start.block_unit):
        search.run(deadline, patience)
    best = search.best
    improved = best != start
    return Polished(best if improved else start, search.best_figures, improved, search.kicks, search.kept)


class _Search:
    def __init__(self, problem: Problem, start: Assignment, bounds: Bounds, seed: int) -> None:
        self.problem = problem
        self.bounds = bounds
        self.int8, self.second = start.int8, start.second
        self.latency = _Latency(problem, start.int8, start.block_unit, start.second)
        self.rng = random.Random(seed)
        n = len(problem.blocks)
        self.allowed = [sorted(self.latency.ms[b]) for b in range(n)]
        # the least time before a block can start on a unit and after it ends (a relaxation): a move whose
        # block cannot end in time on its new unit is not tried
        self.head, self.tail = path_bounds(problem)
        cuts = problem.articulations()
        self.section = [0] * n  # blocks between the same two articulation blocks share a number
        k = 0
        for b in range(n):
            if b in cuts:
                k += 1
            self.section[b] = k
        beside = {b for pair in problem.independent for b in pair}
        self.parallel = [b in beside for b in range(n)]  # runs beside another block: its order matters
        self.beside = sorted(beside)
        self.edge = {(i, j): ei for ei, (i, j, _) in enumerate(problem.edges)}
        # runs of consecutive articulation blocks, each fed by the one before it
        self.runs: list[list[int]] = []
        for b in cuts:
            if self.runs and self.runs[-1][-1] == b - 1 and (b - 1, b) in self.edge:
                self.runs[-1].append(b)
            else:
                self.runs.append([b])
        self.runs = [r for r in self.runs if len(r) >= 2]
        self.best = Assignment(start.block_unit, start.sequence(), start.int8, start.second)
        self.best_figures = schedule(problem, self.best)
        self.kicks = self.kept = 0

    # what a plan must keep
    def cores_fit(self, unit_of: Sequence[int]) -> bool:
        used: dict[str, int] = {}
        for u in set(unit_of):
            x = self.problem.units[u]
            if x.pu in self.problem.cluster_cores:
                used[x.pu] = used.get(x.pu, 0) + x.cores
        return all(v <= self.problem.cluster_cores[p] for p, v in used.items())

    def acceptable(self, f: Figures, unit_of: Sequence[int]) -> bool:
        b = self.bounds
        return (
            self.cores_fit(unit_of)
            and fits(self.problem, Assignment(tuple(unit_of)))
            and (b.max_period_ms is None or f.period_ms <= b.max_period_ms)
            and (b.max_energy_mj is None or f.energy_mj <= b.max_energy_mj)
            and (b.max_latency_ms is None or f.latency_ms <= b.max_latency_ms)
        )

    def confirm(self, unit_of: list[int], order: list[int], than: Figures) -> Figures | None:
        """The plan's figures when it is better than ``than`` in the ILP's model and acceptable, else None."""
        a = Assignment(tuple(unit_of), tuple(order), self.int8, self.second)
        f = schedule(self.problem, a)
        better = f.latency_ms < than.latency_ms * (1 - _EPS) or (
            f.latency_ms <= than.latency_ms and f.period_ms < than.period_ms * (1 - _EPS)
        )
        return f if better and self.acceptable(f, unit_of) else None

    def run(self, deadline: float, patience: int) -> None:
        unit_of, order = list(self.best.block_unit), list(self.best.sequence())
        unit_of, order, figures = self.descend(unit_of, order, self.best_figures, deadline)
        self.keep(unit_of, order, figures)
        current = (list(self.best.block_unit), list(self.best.sequence()), self.best_figures)
        idle, began = 0, time.perf_counter()
        last = began  # when the search last found a better plan
        while idle < patience and time.perf_counter() < deadline:
            if time.perf_counter() - last > max(STALL_S, 2 * (last - began)):
                break  # twice as long without a better plan as it took to find the last one
            self.kicks += 1
            unit_of, order, near = self.kick(list(current[0]), list(current[1]))
            figures = schedule(self.problem, Assignment(tuple(unit_of), tuple(order), self.int8, self.second))
            # the descent stays near the kick (its section) and goes over the whole plan once that pays
            unit_of, order, figures = self.descend(unit_of, order, figures, deadline, near)
            if self.confirm(unit_of, order, self.best_figures) is not None:
                unit_of, order, figures = self.descend(unit_of, order, figures, deadline)
                self.keep(unit_of, order, figures)
                current = (unit_of, order, figures)
                self.kept += 1
                idle, last = 0, time.perf_counter()
                continue
            idle += 1
            if figures.latency_ms <= current[2].latency_ms * (1 + WALK) and self.acceptable(figures, unit_of):
                current = (unit_of, order, figures)  # a step along the plateau, to leave it elsewhere
            if idle % RESTART == 0:
                current = (list(self.best.block_unit), list(self.best.sequence()), self.best_figures)

    def keep(self, unit_of: list[int], order: list[int], figures: Figures) -> None:
        if figures is self.best_figures:
            return
        self.best = Assignment(tuple(unit_of), tuple(order), self.int8, self.second)
        self.best_figures = figures

    def kick(self, unit_of: list[int], order: list[int]) -> tuple[list[int], list[int], list[int]]:
        """A few blocks near one another (by index) moved to units the plan uses, at random: blocks that run
        beside others where there are such (a chain's units are settled by ``chains``). Also the blocks of the
        sections the kick touched."""
        n = len(unit_of)
        used = sorted(set(unit_of))
        pool = self.beside or list(range(n))
        centre = self.rng.randrange(len(pool))
        kicked = {pool[min(len(pool) - 1, max(0, centre + self.rng.randint(-4, 4)))] for _ in range(3)}
        for b in sorted(kicked):
            choices = [u for u in self.allowed[b] if u in used and u != unit_of[b]]
            if choices:
                unit_of[b] = self.rng.choice(choices)
        sections = {self.section[b] for b in kicked}
        near = [b for b in range(n) if self.section[b] in sections]
        return unit_of, self.latency.blevel_order(unit_of) if self.rng.random() < 0.5 else order, near

    def descend(
        self, unit_of: list[int], order: list[int], figures: Figures, deadline: float, near: Sequence[int] = ()
    ) -> State:
        """The runs of articulation blocks placed anew, single-block moves, then swaps between blocks of one
        section, until none lowers the latency; only moves and swaps of the ``near`` blocks when given. Each
        neighbourhood is scanned round from where the last improvement was found, not from the start."""
        state = (unit_of, order, figures)
        blocks = list(near) or list(range(len(unit_of)))
        while time.perf_counter() < deadline:
            found = None if near else self.chains(*state)
            found = found or self.scan(self.moves, state, deadline, blocks)
            found = found or (None if near else self.scan(self.swaps, state, deadline, blocks))
            if found is None:
                break
            state = found
        return state

    def chains(self, unit_of: list[int], order: list[int], figures: Figures) -> State | None:
        """Each run of articulation blocks (``self.runs``) placed anew over the units the plan uses, by a shortest
        path: each block's time, the transfer where consecutive blocks change PU, and the transfers from the
        run's inputs and to its consumers where those change PU (one move of many blocks); then each stretch of
        it on one unit moved to another."""
        used = sorted(set(unit_of))
        pu, comm = self.latency.pu, self.latency.comm
        for run in self.runs:
            first, last = run[0], run[-1]
            dist: dict[int, float] = {}
            back: list[dict[int, int]] = []
            for b in run:
                here = [u for u in used if u in self.latency.ms[b]]
                step: dict[int, int] = {}
                new: dict[int, float] = {}
                for u in here:
                    if b == first:
                        into = max(
                            (comm.get((ei, pu[unit_of[i]], pu[u]), 0.0) for i, ei in self.latency.preds[b]), default=0.0
                        )
                        best, via = into, -1
                    else:
                        ei = self.edge[(b - 1, b)]
                        best, via = (
                            min((d + comm.get((ei, pu[v], pu[u]), 0.0), v) for v, d in dist.items())
                            if dist
                            else (float("inf"), -1)
                        )
                    cost = best + self.latency.ms[b][u]
                    if b == last:
                        cost += max(
                            (comm.get((ei, pu[u], pu[unit_of[j]]), 0.0) for j, ei in self.latency.succs[b]), default=0.0
                        )
                    new[u], step[u] = cost, via
                dist = new
                back.append(step)
            if not dist:
                continue
            trial = list(unit_of)
            u = min(dist, key=lambda v: (dist[v], v != unit_of[last]))
            for k in range(len(run) - 1, -1, -1):
                trial[run[k]] = u
                u = back[k][u]
            if trial != unit_of and (found := self.trial(trial, order, figures, False)):
                return found
            # the path leaves out edges that skip blocks of the run (a tensor kept for a later block, which a
            # change of PU sends too): also each stretch of the run on one unit, and the whole run, moved to
            # each other unit the plan uses
            stretches = [list(g) for _, g in itertools.groupby(run, key=lambda b: unit_of[b])]
            for stretch in [*stretches, run] if len(stretches) > 1 else stretches:
                for u in used:
                    if any(u not in self.latency.ms[b] for b in stretch) or all(unit_of[b] == u for b in stretch):
                        continue
                    trial = list(unit_of)
                    for b in stretch:
                        trial[b] = u
                    if found := self.trial(trial, order, figures, False):
                        return found
        return None

    def reach(self, b: int, u: int) -> float:
        """The least latency of any plan that runs block b on unit u (``path_bounds``)."""
        return self.head[b][u] + self.latency.ms[b][u] + self.tail[b][u]

    def scan(self, neighbours: Neighbourhood, state: State, deadline: float, blocks: list[int]) -> State | None:
        """Improves ``state`` by the neighbourhood's moves at each of ``blocks`` in turn, round and round from the
        block after the last improvement, until a whole round finds none; None when the first round finds none."""
        n, k, quiet, improved = len(blocks), 0, 0, False
        while quiet < n:
            if time.perf_counter() >= deadline:
                break
            found = neighbours(blocks[k], *state)
            if found is not None:
                state, quiet, improved = found, 0, True
            else:
                quiet += 1
            k = (k + 1) % n
        return state if improved else None

    def trial(
        self, trial: list[int], order: list[int], figures: Figures, reorder: bool, since: int | None = None
    ) -> State | None:
        """The trial assignment with the current order, or (``reorder``, when that order leaves it within
        ``REORDER_WITHIN`` of the latency) by b-level, when it is better. ``since``: the first position of the
        order whose block changed unit from the plan kept by ``rebase`` (its schedule before that is reused)."""
        latency = figures.latency_ms * (1 - _EPS)
        if since is not None and self.latency.incremental:
            kept = self.latency.after(trial, since)
        else:
            kept = self.latency(trial, order)
        if kept < latency and (f := self.confirm(trial, order, figures)):
            return trial, order, f
        if reorder and kept < figures.latency_ms * (1 + REORDER_WITHIN):
            o = self.latency.blevel_order(trial)
            if self.latency(trial, o) < latency and (f := self.confirm(trial, o, figures)):
                return trial, o, f
        return None

    def moves(self, b: int, unit_of: list[int], order: list[int], figures: Figures) -> State | None:
        """Block b to another unit that runs it (and leaves the clusters' cores enough)."""
        here, latency = unit_of[b], figures.latency_ms
        self.latency.rebase(unit_of, order)
        since = self.latency.position(b)
        for u in self.allowed[b]:
            if u == here or self.reach(b, u) >= latency:
                continue
            trial = list(unit_of)
            trial[b] = u
            if self.cores_fit(trial) and (found := self.trial(trial, order, figures, self.parallel[b], since)):
                return found
        return None

    def swaps(self, b: int, unit_of: list[int], order: list[int], figures: Figures) -> State | None:
        """Block b and a later block of its section trade units."""
        for c in range(b + 1, len(unit_of)):
            if self.section[c] != self.section[b]:
                break
            ub, uc = unit_of[b], unit_of[c]
            if ub == uc or uc not in self.latency.ms[b] or ub not in self.latency.ms[c]:
                continue
            if max(self.reach(b, uc), self.reach(c, ub)) >= figures.latency_ms:
                continue
            trial = list(unit_of)
            trial[b], trial[c] = uc, ub
            self.latency.rebase(unit_of, order)
            since = min(self.latency.position(b), self.latency.position(c))
            if found := self.trial(trial, order, figures, True, since):
                return found
        return None
