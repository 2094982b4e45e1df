"""Toy planning problems for the planner's property tests: a 2-core CPU cluster (one 2-core unit or two
1-core units), a GPU and an NPU that computes int8 only; DAGs small enough to enumerate every plan of
(``small_problems``, ``twins``: ``every_plan``) or larger ones with branches (``branchy_problems``)."""

from __future__ import annotations

import dataclasses
import itertools

from hypothesis import strategies as st

from planner.problem import Problem, Unit, toy_problem
from planner.timing import Assignment

# a 2-core CPU cluster (one 2-core unit or two 1-core units), a GPU, and an NPU that computes int8 only
UNITS = [
    Unit("cpu", "cpu", 2, 0),
    Unit("cpu", "cpu", 1, 0),
    Unit("cpu", "cpu", 1, 1),
    Unit("gpu", "gpu", 1, 0),
    Unit("npu", "npu", 1, 0),
]
NPU = 4


def _with_handoff_delays(draw, problem: Problem) -> Problem:
    delay: dict[tuple[int, str, str], float] = {}
    if draw(st.booleans()):  # a handoff delay between the GPU and the CPU (latency only)
        delay |= {k: 0.4 for k in problem.transfer if {"cpu", "gpu"} == {k[1], k[2]}}
    if draw(st.booleans()):  # and between two units of the CPU (threads on its cores)
        delay |= {(ei, "cpu", "cpu"): 0.3 for ei in range(len(problem.edges))}
    if delay:
        problem = dataclasses.replace(problem, handoff_delay=delay)
    return problem


@st.composite
def small_problems(draw, overhead: float = 0.0) -> Problem:
    """Small DAGs with several sources and chains (where the cuts apply), blocks some PUs cannot run,
    transfers and handoff delays between PUs and between units of one PU, int8 variants, a CFS-throttled CPU cluster; a
    per-partition overhead when given."""
    n = draw(st.integers(3, 5))
    sources = draw(st.integers(1, 2))
    edges: set[tuple[int, int]] = set()
    for j in range(sources, n):
        for i in draw(st.sets(st.integers(0, j - 1), min_size=1, max_size=2)):
            edges.add((i, j))
    base = draw(st.lists(st.floats(0.5, 8.0), min_size=n, max_size=n))
    gpu = draw(st.lists(st.one_of(st.none(), st.floats(0.2, 6.0)), min_size=n, max_size=n))
    cost, int8_cost = {}, {}
    for b in range(n):
        for u in (0, 1, 2):
            cost[(b, u)] = base[b] * 2 / UNITS[u].cores
        if gpu[b] is not None:
            cost[(b, 3)] = gpu[b]
        if draw(st.booleans()):
            int8_cost[(b, NPU)] = base[b] * draw(st.floats(0.2, 2.0))
        if draw(st.booleans()):
            int8_cost[(b, 0)] = cost[(b, 0)] / 2
    problem = toy_problem(
        UNITS,
        cost,
        sorted(edges),
        transfer_ms=draw(st.sampled_from([0.0, 0.3, 1.5])),
        int8_cost=int8_cost,
        sensitivity=dict.fromkeys(range(n), 0.0),
        accuracy_budget=None,
        overhead_ms=dict.fromkeys(range(len(UNITS)), overhead),
    )
    problem = _with_handoff_delays(draw, problem)
    return _maybe_throttled(draw, problem)


def _maybe_throttled(draw, problem: Problem) -> Problem:
    """Half the time the CPU cluster CFS-throttled (each of its units: they stay interchangeable): a frame's
    work on one of them past its burst runs there at the factor (``Problem.stalled``)."""
    if not draw(st.booleans()):
        return problem
    cpu = [u for u, unit in enumerate(problem.units) if unit.pu == "cpu"]
    burst = draw(st.sampled_from([1.0, 4.0, 9.0]))
    alone = draw(st.sampled_from([2.5, 1.8]))  # past the burst alone: the CFS share, or less than tune's fit
    return dataclasses.replace(
        problem, sustained=dict.fromkeys(cpu, 2.5), burst=dict.fromkeys(cpu, burst), alone=dict.fromkeys(cpu, alone)
    )


@st.composite
def branchy_problems(draw) -> Problem:
    """DAGs of 6-14 blocks (chains and branches), some blocks the GPU cannot run, int8 variants (the NPU runs
    only those), transfers, per-partition overheads, gRPC CPU time and handoff delays between PUs and units of one PU, weights
    against memories, a CFS-throttled CPU cluster."""
    n = draw(st.integers(6, 14))
    edges: set[tuple[int, int]] = set()
    for j in range(1, n):
        for i in draw(st.sets(st.integers(max(0, j - 4), j - 1), min_size=1, max_size=2)):
            edges.add((i, j))
    cost, int8_cost = {}, {}
    for b in range(n):
        base = draw(st.floats(0.5, 8.0))
        for u in (0, 1, 2):
            cost[(b, u)] = base * 2 / UNITS[u].cores * draw(st.sampled_from([1.0, 0.8]))
        if draw(st.booleans()):
            cost[(b, 3)] = draw(st.floats(0.2, 6.0))
        if draw(st.booleans()):
            int8_cost[(b, NPU)] = base * draw(st.floats(0.2, 2.0))
        if draw(st.booleans()):
            int8_cost[(b, 0)] = cost[(b, 0)] / 2
    overhead = draw(st.sampled_from([0.0, 0.0, 0.2]))
    problem = toy_problem(
        UNITS,
        cost,
        sorted(edges),
        transfer_ms=draw(st.sampled_from([0.0, 0.3, 1.5])),
        int8_cost=int8_cost,
        overhead_ms=dict.fromkeys(range(len(UNITS)), overhead),
    )
    problem = _with_handoff_delays(draw, problem)
    if draw(st.booleans()):  # the GPU on another host: gRPC CPU time on both ends of its tensors
        handoff = {k: (0.1, 0.2) for k in problem.transfer if "gpu" in k[1:]}
        problem = dataclasses.replace(problem, handoff_cpu=handoff)
    weights = {name: draw(st.integers(0, 4)) for name in problem.blocks}
    return _maybe_throttled(draw, dataclasses.replace(problem, param_bytes=weights))


@st.composite
def twins(draw) -> Problem:
    """Copies of one branch (2 or 3, of 1 or 2 blocks) side by side, from a fork or from the frame's arrival,
    into a join: the branch symmetry rows order them."""
    copies, length = draw(st.sampled_from([(2, 1), (2, 2), (3, 1)]))
    fork = draw(st.booleans())
    branch = draw(st.lists(st.floats(0.5, 8.0), min_size=length, max_size=length))
    gpu = draw(st.lists(st.one_of(st.none(), st.floats(0.2, 6.0)), min_size=length, max_size=length))
    ends = draw(st.lists(st.floats(0.2, 3.0), min_size=2, max_size=2))
    base: list[float] = []
    on_gpu: list[float | None] = []
    edges: list[tuple[int, int]] = []
    if fork:
        base.append(ends[0])
        on_gpu.append(None)
    for _ in range(copies):
        first = len(base)
        base += branch
        on_gpu += gpu
        if fork:
            edges.append((0, first))
        edges += [(first + k, first + k + 1) for k in range(length - 1)]
    join = len(base)
    base.append(ends[1])
    on_gpu.append(draw(st.one_of(st.none(), st.floats(0.2, 3.0))))
    edges += [(first + length - 1, join) for first in range(int(fork), join, length)]
    units = UNITS[:4]
    cost = {(b, u): base[b] * 2 / units[u].cores for b in range(len(base)) for u in (0, 1, 2)}
    cost |= {(b, 3): g for b, g in enumerate(on_gpu) if g is not None}
    return toy_problem(units, cost, edges, transfer_ms=draw(st.sampled_from([0.0, 0.4])))


def orders(problem: Problem) -> list[tuple[int, ...]]:
    n = len(problem.blocks)
    preds = {j: {i for i, jj, _ in problem.edges if jj == j} for j in range(n)}
    return [p for p in itertools.permutations(range(n)) if all(preds[b] <= set(p[: p.index(b)]) for b in p)]


def every_plan(problem: Problem):
    """Every plan the ILP allows: each block on a unit that runs it (in int8 where that is faster or the only
    way), the cluster's cores shared out, every order the data flow allows."""
    n = len(problem.blocks)
    allowed = orders(problem)
    for units in itertools.product(range(len(UNITS)), repeat=n):
        if not all(problem.runs(b, u) for b, u in enumerate(units)):
            continue
        if sum(UNITS[u].cores for u in set(units) if UNITS[u].kind == "cpu") > 2:
            continue
        int8 = frozenset(
            b
            for b, u in enumerate(units)
            if (b, u) in problem.int8_cost
            and ((b, u) not in problem.cost or problem.int8_cost[(b, u)] < problem.cost[(b, u)])
        )
        for order in allowed:
            yield Assignment(units, order, int8)
