"""The latency bound computed outside the solver per way to cut the CPU clusters (``planner.bounds``) is a proof:
it never exceeds the best plan there is (every assignment and every order enumerated) nor the latency ILP's own
optimum, and reporting it leaves the solver's plan as it was."""

from __future__ import annotations

import dataclasses
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner import bounds, ilp
from planner.ilp import solve
from planner.problem import Problem, Unit, toy_problem
from planner.timing import schedule
from tests.support.toy_problems import UNITS, every_plan, orders, small_problems, twins

_STATUS = ilp.status_of


def _unclosed(lp, solver) -> tuple[str, float | None, float | None]:
    """The solver's verdict as if it had stopped on its time limit with half the bound it proved."""
    _, gap, bound = _STATUS(lp, solver)
    return "time-limit", gap, None if bound is None else bound / 2


def _every_stretch_big(problem: Problem) -> set[tuple[int, int]]:
    return {(x, y) for x, y, _ in problem.sections()}


def _optimum(problem: Problem) -> float:
    return min(schedule(problem, a).latency_ms for a in every_plan(problem))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(small_problems(), small_problems(overhead=0.2), twins()), st.booleans())
def test_the_configuration_bound_never_exceeds_the_best_plan_nor_the_ilps_optimum(problem, big) -> None:
    """With every stretch bounded as a large one (the load bound) or as a small one (its own latency ILP)."""
    stretches = _every_stretch_big(problem) if big else set()
    floor = bounds.configuration_bound(problem, 5.0, big=stretches)
    assert floor is not None
    assert floor <= _optimum(problem) * (1 + 1e-6) + 1e-9
    solution = solve(problem, "latency", time_limit=20, gap=1e-9)
    assert solution.status == "optimal"
    assert floor <= solution.value * (1 + 1e-6) + 1e-9  # the ILP counts partitions from below: its optimum too


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(small_problems(), twins()))
def test_reporting_the_bound_leaves_the_solvers_plan_as_it_was(problem) -> None:
    """solve() with the bound (computed after a solve that did not close its gap: every solve here is taken for one
    that stopped on its time limit with half its bound, and every stretch counted as large) returns the plan and
    value it returns without it, and a bound no lower than the solver's own (which bounds latency plus the
    tie-break); where it is higher, no higher than the optimum, with the gap it proves."""
    unclosed = mock.patch.object(ilp, "status_of", _unclosed)
    with unclosed, mock.patch.object(bounds, "big_stretches", lambda p: ()):
        plain = solve(dataclasses.replace(problem, derived={}), "latency", time_limit=20, gap=1e-9)
    # every stretch counted as large; where there is none, a stand-in that switches the bound on all the same
    with (
        unclosed,
        mock.patch.object(bounds, "big_stretches", lambda p: tuple(sorted(_every_stretch_big(p))) or ((-1, 0),)),
    ):
        bounded = solve(dataclasses.replace(problem, derived={}), "latency", time_limit=20, gap=1e-9)
    assert (bounded.assignment, bounded.value) == (plain.assignment, plain.value)
    assert bounded.bound is not None and bounded.bound >= (plain.bound or 0.0) - 1e-9
    if bounded.bound > (plain.bound or 0.0):  # the bound from outside was reported: below the optimum
        assert bounded.bound <= bounded.value * (1 + 1e-6) + 1e-9
        assert bounded.gap == pytest.approx(max(bounded.value - bounded.bound, 0.0) / bounded.value, abs=1e-9)


def _split_or_join() -> Problem:
    """Two camera branches from the frame's arrival (two blocks each) into a join, then a chain of three blocks.
    On one 2-core unit everything takes 1 ms; on a 1-core unit 1.2 ms. The branches are fastest side by side on
    two 1-core units (2.4 ms), the chain on the 2-core unit (3 ms), and no plan has both."""
    units = [Unit("cpu", "cpu", 2, 0), Unit("cpu", "cpu", 1, 0), Unit("cpu", "cpu", 1, 1)]
    edges = [(0, 1), (2, 3), (1, 4), (3, 4), (4, 5), (5, 6)]
    cost = {(b, u): 1.0 if u == 0 else 1.2 for b in range(7) for u in range(3)}
    return toy_problem(units, cost, edges)


def test_a_plan_cuts_the_cluster_once_for_the_whole_frame() -> None:
    problem = _split_or_join()
    best = min(schedule(problem, a).latency_ms for a in _all_plans(problem))
    # both 1-core units: branches 2.4 ms, then 3 x 1.2 ms; the 2-core unit: 4 ms, then 3 ms
    assert best == pytest.approx(min(2.4 + 3 * 1.2, 4.0 + 3.0))
    spans_over_every_unit = 2.4 + 3.0  # the best of each span, on different cuts of the cluster
    floor = bounds.configuration_bound(problem, 5.0, big=_every_stretch_big(problem))
    assert floor is not None and spans_over_every_unit < floor <= best + 1e-9
    assert floor == pytest.approx(best)
    assert bounds.configurations(problem) == (frozenset({0}), frozenset({1, 2}))


def _all_plans(problem: Problem):
    import itertools

    from planner.timing import Assignment

    allowed = orders(problem)
    for units in itertools.product(range(len(problem.units)), repeat=len(problem.blocks)):
        if sum(problem.units[u].cores for u in set(units)) > 2:
            continue
        for order in allowed:
            yield Assignment(units, order)


def test_the_units_of_every_plan_fit_one_configuration() -> None:
    """The configurations of the toy units (a 2-core cluster, a GPU, an NPU): one 2-core unit, or two 1-core ones."""
    configs = bounds.configurations(toy_problem(UNITS, {(0, 0): 1.0}, []))
    assert sorted(map(sorted, configs)) == [[0, 3, 4], [1, 2, 3, 4]]
