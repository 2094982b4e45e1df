"""The latency ILP's cuts (stretches between articulation blocks, chains of them, per-block head and tail
paths, twin branches in start order) cut off no plan: every schedule of every assignment meets them, and the solver's optimum with them is
the best plan there is, found by enumerating every assignment and every order."""

from __future__ import annotations

import dataclasses
import itertools
from unittest import mock

import pulp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.ilp import (
    _TIE,
    Assignment,
    Cuts,
    _formulate,
    _set_warm_start,
    as_start,
    chain_spans,
    path_bounds,
    schedule,
    solve,
    sorted_branches,
    twin_branches,
)
from planner.problem import Problem, Unit, toy_problem

# a 2-core CPU cluster (one 2-core unit or two 1-core units), a GPU, and an NPU that computes int8 only
UNITS = [
    Unit("cpu", "cpu", 2, 0),
    Unit("cpu", "cpu", 1, 0),
    Unit("cpu", "cpu", 1, 1),
    Unit("gpu", "gpu", 1, 0),
    Unit("npu", "npu", 1, 0),
]
NPU = 4


@st.composite
def problems(draw, overhead: float = 0.0) -> Problem:
    """Small DAGs with several sources and chains (where the cuts apply), blocks some PUs cannot run,
    transfers and handoff delays between PUs and between units of one PU, int8 variants; a per-partition overhead when given."""
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
    delay: dict[tuple[int, str, str], float] = {}
    if draw(st.booleans()):  # a handoff delay between the GPU and the CPU (latency only)
        delay |= {k: 0.4 for k in problem.transfer if {"cpu", "gpu"} == {k[1], k[2]}}
    if draw(st.booleans()):  # and between two units of the CPU (threads on its cores)
        delay |= {(ei, "cpu", "cpu"): 0.3 for ei in range(len(problem.edges))}
    if delay:
        problem = dataclasses.replace(problem, handoff_delay=delay)
    return problem


def _orders(problem: Problem) -> list[tuple[int, ...]]:
    n = len(problem.blocks)
    preds = {j: {i for i, jj, _ in problem.edges if jj == j} for j in range(n)}
    return [p for p in itertools.permutations(range(n)) if all(preds[b] <= set(p[: p.index(b)]) for b in p)]


def _plans(problem: Problem):
    """Every plan the ILP allows: each block on a unit that runs it (in int8 where that is faster or the only
    way), the cluster's cores shared out, every order the data flow allows."""
    n = len(problem.blocks)
    orders = _orders(problem)
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
        for order in orders:
            yield Assignment(units, order, int8)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.randoms(use_true_random=False))
def test_the_cuts_cut_off_no_plan_and_the_optimum_is_the_best_plan(problem, rng) -> None:
    plans = list(_plans(problem))
    best = min(_objective(problem, a) for a in plans)
    # every plan's schedule meets every row (the cuts included), so the solver could take it, once its twin
    # branches are in start order: a sample of them (writing the model is the slow part)
    for a in [*rng.sample(plans, min(4, len(plans))), min(plans, key=lambda a: schedule(problem, a).latency_ms)]:
        lp, v = _formulate(problem, "latency", cuts=Cuts())
        _set_warm_start(problem, v, as_start(problem, a, True))  # as ``solve`` hands it over
        broken = [name for name, row in lp.constraints.items() if not row.valid(1e-6)]
        assert not broken, f"{a} breaks {broken[:5]}"
    solution = solve(problem, "latency", time_limit=20, gap=1e-9)
    assert solution.status == "optimal"
    assert _objective(problem, solution.assignment) == pytest.approx(best, rel=1e-6)
    assert schedule(problem, solution.assignment).latency_ms == pytest.approx(solution.best, rel=1e-6)


def _objective(problem: Problem, a: Assignment) -> float:
    """What the latency ILP minimises: latency, ties broken toward the shorter period."""
    figures = schedule(problem, a)
    return figures.latency_ms + _TIE * figures.period_ms


def _uncut(problem: Problem) -> float:
    with (
        mock.patch("planner.ilp._section_rows"),
        mock.patch("planner.ilp._chain_rows"),
        mock.patch("planner.ilp._path_rows"),
    ):
        solution = solve(dataclasses.replace(problem, derived={}), "latency", time_limit=20, gap=1e-9)
    assert solution.status == "optimal"
    return solution.value


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(overhead=0.2))
def test_with_partition_overheads_the_cuts_leave_the_optimum_where_it_was(problem) -> None:
    """The ILP counts a partition's overhead from a lower bound on the lowering's partitions, so its optimum
    may lie below every plan's schedule: the cuts must leave it where the model without them has it."""
    solution = solve(problem, "latency", time_limit=20, gap=1e-9)
    assert solution.status == "optimal"
    assert solution.value == pytest.approx(_uncut(problem), rel=1e-6)


def test_a_chain_of_blocks_pays_the_transfers_no_assignment_avoids() -> None:
    """a -> b -> c -> d: b runs only on the GPU, a, c and d fastest on the GPU but d only on the CPU. Every
    plan pays one transfer into d; the LP's fractional assignment pays none, the chain and tail rows do."""
    units = [Unit("cpu", "cpu", 1, 0), Unit("gpu", "gpu", 1, 0)]
    cost = {(0, 0): 4.0, (0, 1): 1.0, (1, 1): 1.0, (2, 0): 4.0, (2, 1): 1.0, (3, 0): 1.0}
    problem = toy_problem(units, cost, [(0, 1), (1, 2), (2, 3)], transfer_ms=2.0)
    spans = next(s for k, j, s in chain_spans(problem) if (k, j) == (0, 3))
    assert spans[0] == pytest.approx(1.0 + 1.0 + 1.0 + 2.0)  # a, b, c on the GPU, then the transfer to d
    head, tail = path_bounds(problem)
    assert head[3][0] == pytest.approx(5.0) and tail[0][1] == pytest.approx(1.0 + 1.0 + 2.0 + 1.0)
    lp, v = _formulate(problem, "latency")
    for var in lp.variables():
        var.cat = "Continuous"
    lp.solve(pulp.HiGHS(msg=False))
    assert v["L"].value() == pytest.approx(6.0, rel=1e-6)  # the optimum, at the root
    assert solve(problem, "latency", gap=1e-9).best == pytest.approx(6.0)


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


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(twins())
def test_twin_branches_in_start_order_cut_off_no_figure(problem) -> None:
    classes = twin_branches(problem)
    assert len(classes) == 1 and len(classes[0]) >= 2
    plans = [a for a in _plans(problem) if all(u < 4 for u in a.block_unit)]
    best = min(_objective(problem, a) for a in plans)
    for a in plans[:: max(1, len(plans) // 5)]:
        twin = sorted_branches(problem, a)
        f, g = schedule(problem, a), schedule(problem, twin)
        assert (f.latency_ms, f.period_ms, f.energy_mj) == pytest.approx((g.latency_ms, g.period_ms, g.energy_mj))
        lp, v = _formulate(problem, "latency", cuts=Cuts())
        _set_warm_start(problem, v, as_start(problem, twin, True))
        broken = [name for name, row in lp.constraints.items() if not row.valid(1e-6)]
        assert not broken, f"{twin} breaks {broken[:5]}"
    solution = solve(problem, "latency", time_limit=20, gap=1e-9)
    assert solution.status == "optimal"
    assert _objective(problem, solution.assignment) == pytest.approx(best, rel=1e-6)


def test_branches_that_hold_other_weights_are_no_twins() -> None:
    units = UNITS[:4]
    cost = {(b, u): 1.0 for b in range(3) for u in range(4)}
    problem = toy_problem(units, cost, [(0, 2), (1, 2)])
    assert twin_branches(problem) == (((0,), (1,)),)
    heavier = dataclasses.replace(problem, param_bytes={**problem.param_bytes, "b0": 1 << 20}, derived={})
    assert twin_branches(heavier) == ()
