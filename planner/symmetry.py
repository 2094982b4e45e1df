"""Plans that are the same plan: identical units relabelled, twin branches swapped. The ILP's symmetry rows keep
one of each set (``planner.ilp``), so a warm start is handed to the solver in that order (``as_start``)."""

from __future__ import annotations

from planner.problem import Problem
from planner.timing import Assignment, schedule


def canonical(problem: Problem, assignment: Assignment) -> Assignment:
    """The same plan with identical units (same PU and cores) relabelled in the order the ILP's symmetry
    rows ask for: used instances first, ordered by the first block they run."""
    unit_of = list(assignment.block_unit)
    groups: dict[tuple[str, int], list[int]] = {}
    for u, x in enumerate(problem.units):
        groups.setdefault((x.pu, x.cores), []).append(u)
    relabel: dict[int, int] = {}
    for members in groups.values():
        members = sorted(members, key=lambda u: problem.units[u].instance)
        first = {u: unit_of.index(u) for u in members if u in unit_of}
        order = sorted(first, key=first.__getitem__) + [u for u in members if u not in first]
        relabel.update(zip(order, members, strict=True))
    return Assignment(tuple(relabel[u] for u in unit_of), assignment.order, assignment.int8, assignment.second)


def twin_branches(problem: Problem) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """Classes of interchangeable branches: within a stretch between articulation blocks (``Problem.sections``), the
    connected parts that are copies of each other (the same costs, memory, sensitivities and edges, block by
    block in index order, and the same edges to the same blocks outside). Swapping two of them changes no
    figure of any plan. Each class lists its branches in index order, each branch its blocks in index order."""
    if "twin_branches" in problem.derived:
        return problem.derived["twin_branches"]
    units = range(len(problem.units))
    by_edge: dict[int, list[tuple]] = {}
    for d in (problem.transfer, problem.transfer_mj, problem.handoff_cpu, problem.handoff_delay):
        for (ei, p, q), v in sorted(d.items()):
            by_edge.setdefault(ei, []).append((p, q, v))
    classes = []
    for _, _, between in problem.sections():
        inside = set(between)
        parent = {b: b for b in between}
        for i, j, _ in problem.edges:
            if i in inside and j in inside:
                parent[_root(parent, j)] = _root(parent, i)
        parts: dict[int, list[int]] = {}
        for b in between:
            parts.setdefault(_root(parent, b), []).append(b)
        groups: dict[tuple, list[tuple[int, ...]]] = {}
        for part in parts.values():
            pos = {b: k for k, b in enumerate(part)}
            blocks = tuple(
                (
                    tuple(problem.cost.get((b, u)) for u in units),
                    tuple(problem.int8_cost.get((b, u)) for u in units),
                    tuple(problem.second_cost.get((b, u)) for u in units),
                    problem.held_bytes(b),
                    (problem.sensitivity.get(b), problem.fp16_sensitivity.get(b)),
                    tuple(sorted((m, v) for (c, m), v in problem.traffic.items() if c == b)),
                )
                for b in part
            )
            edges = tuple(
                (
                    pos[i] if i in pos else ("out", i),
                    pos[j] if j in pos else ("out", j),
                    nbytes,
                    tuple(by_edge.get(ei, ())),
                )
                for ei, (i, j, nbytes) in enumerate(problem.edges)
                if i in pos or j in pos
            )
            groups.setdefault((blocks, edges), []).append(tuple(part))
        classes += [tuple(members) for members in groups.values() if len(members) >= 2]
    problem.derived["twin_branches"] = tuple(classes)
    return problem.derived["twin_branches"]


def _root(parent: dict[int, int], b: int) -> int:
    while parent[b] != b:
        b = parent[b]
    return b


def sorted_branches(problem: Problem, assignment: Assignment) -> Assignment:
    """The same plan with twin branches (``twin_branches``) swapped so that, within each class, their first
    blocks start in index order (what the ILP's branch symmetry rows ask for). Every figure stays the same."""
    classes = twin_branches(problem)
    if not classes:
        return assignment
    starts = schedule(problem, assignment).starts
    where: dict[int, int] = {}  # block -> the block whose place it takes
    for members in classes:
        ranked = sorted(members, key=lambda part: (round(starts[part[0]], 9), part[0]))
        for slot, part in zip(members, ranked, strict=True):
            where.update(zip(part, slot, strict=True))
    unit_of = list(assignment.block_unit)
    for b, to in where.items():
        unit_of[to] = assignment.block_unit[b]
    order = tuple(where.get(b, b) for b in assignment.order)
    return Assignment(
        tuple(unit_of),
        order,
        frozenset(where.get(b, b) for b in assignment.int8),
        frozenset(where.get(b, b) for b in assignment.second),
    )


def as_start(problem: Problem, warm: Assignment, timed: bool) -> Assignment:
    """The same plan as the solver is handed it: identical units relabelled (``canonical``) and, when the
    scheduling part is built, twin branches in start order (``sorted_branches``); else the symmetry rows make
    it infeasible and HiGHS drops it."""
    return canonical(problem, sorted_branches(problem, warm) if timed else warm)
