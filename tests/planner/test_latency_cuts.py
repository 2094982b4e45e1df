"""The latency ILP's cuts (stretches between articulation blocks, chains of them, per-block head and tail
paths, twin branches in start order) cut off no plan: every schedule of every assignment meets them, and the solver's optimum with them is
the best plan there is, found by enumerating every assignment and every order."""

from __future__ import annotations

import dataclasses
from unittest import mock

import pulp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.ilp import _TIE, Cuts, _formulate, _set_warm_start, chain_spans, path_bounds, solve
from planner.problem import Problem, Unit, toy_problem
from planner.symmetry import as_start, sorted_branches, twin_branches
from planner.timing import Assignment, schedule
from tests.support.toy_problems import UNITS, every_plan, small_problems, twins


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_problems(), st.randoms(use_true_random=False))
def test_the_cuts_cut_off_no_plan_and_the_optimum_is_the_best_plan(problem, rng) -> None:
    plans = list(every_plan(problem))
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
@given(small_problems(overhead=0.2))
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


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(twins())
def test_twin_branches_in_start_order_cut_off_no_figure(problem) -> None:
    classes = twin_branches(problem)
    assert len(classes) == 1 and len(classes[0]) >= 2
    plans = [a for a in every_plan(problem) if all(u < 4 for u in a.block_unit)]
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
