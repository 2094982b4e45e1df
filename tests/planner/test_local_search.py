"""The local search on latency plans (``planner.local_search``): it never returns a plan worse than its start,
and every plan it returns is one the ILP allows (each block on a unit that runs it in its precision, after its
inputs, the clusters' cores and the memories respected, the bounds met); its fast latency is ``schedule``'s."""

from __future__ import annotations

import dataclasses
import time
from unittest import mock

import pulp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from device_profiles.loader import load_profile
from models.coarsen import coarsen
from models.graph import build_graph
from models.onnx_io import load_onnx
from planner import search as S
from planner.costmodel import CostModel
from planner.highs import LimitCut, WarmHiGHS
from planner.ilp import NO_BOUNDS, Bounds, Solution, solve
from planner.local_search import _Latency, polish
from planner.problem import Problem, Unit, toy_problem
from planner.search import Candidate, polished
from planner.timing import Assignment, fits, predecessors, schedule
from tests.support.toy_problems import NPU, UNITS, branchy_problems


@st.composite
def starts(draw, problem: Problem) -> Assignment:
    """A plan the ILP allows: the CPU cluster as one 2-core unit or two 1-core ones, each block on a unit that
    runs it (int8 where only that runs there, or at random), a random order the data flow allows."""
    n = len(problem.blocks)
    cpu = draw(st.sampled_from([[0], [1, 2]]))
    units = [*cpu, 3, NPU]
    unit_of, int8 = [], set()
    for b in range(n):
        u = draw(st.sampled_from([u for u in units if problem.runs(b, u)]))
        unit_of.append(u)
        if (b, u) not in problem.cost or ((b, u) in problem.int8_cost and draw(st.booleans())):
            int8.add(b)
    preds = [{i for i, _ in p} for p in predecessors(problem)]
    order: list[int] = []
    while len(order) < n:
        ready = [b for b in range(n) if b not in order and preds[b] <= set(order)]
        order.append(draw(st.sampled_from(ready)))
    return Assignment(tuple(unit_of), tuple(order), frozenset(int8))


def _allowed(problem: Problem, a: Assignment) -> None:
    """``a`` is a plan the ILP allows."""
    n = len(problem.blocks)
    assert sorted(a.sequence()) == list(range(n))
    position = {b: k for k, b in enumerate(a.sequence())}
    for i, j, _ in problem.edges:
        assert position[i] < position[j], f"block {j} runs before its input {i}"
    for b, u in enumerate(a.block_unit):
        assert (b, u) in (problem.int8_cost if b in a.int8 else problem.cost), f"block {b} cannot run so on {u}"
    cores = sum(UNITS[u].cores for u in set(a.block_unit) if UNITS[u].kind == "cpu")
    assert cores <= 2
    assert fits(problem, a)


def _key(problem: Problem, a: Assignment) -> tuple[float, float]:
    f = schedule(problem, a)
    return f.latency_ms, f.period_ms


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_the_search_never_returns_a_worse_plan_and_keeps_every_rule(data) -> None:
    problem = data.draw(branchy_problems())
    start = data.draw(starts(problem))
    figures = schedule(problem, start)
    # memories that just hold the start (so moves must respect them), bounds it just meets
    held: dict[str, int] = {}
    for b, u in enumerate(start.block_unit):
        held[UNITS[u].pu] = held.get(UNITS[u].pu, 0) + problem.held_bytes(b)
    problem = dataclasses.replace(problem, memory={p: float(held.get(p, 0)) for p in problem.memory})
    bounds = data.draw(
        st.sampled_from([NO_BOUNDS, Bounds(max_period_ms=figures.period_ms), Bounds(max_energy_mj=figures.energy_mj)])
    )
    result = polish(problem, start, time.perf_counter() + 60, bounds, patience=5, seed=data.draw(st.integers(0, 9)))
    _allowed(problem, result.assignment)
    assert result.assignment.int8 == start.int8
    after = schedule(problem, result.assignment)
    assert after == result.figures
    assert (after.latency_ms, after.period_ms) <= (figures.latency_ms, figures.period_ms)
    if result.improved:
        assert after.latency_ms < figures.latency_ms or after.period_ms < figures.period_ms
    else:
        assert result.assignment == start
    assert bounds.max_period_ms is None or after.period_ms <= bounds.max_period_ms
    assert bounds.max_energy_mj is None or after.energy_mj <= bounds.max_energy_mj


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_the_fast_latency_is_the_schedules(data) -> None:
    problem = data.draw(branchy_problems())
    a = data.draw(starts(problem))
    latency = _Latency(problem, a.int8)
    assert latency(a.block_unit, a.sequence()) == schedule(problem, a).latency_ms
    order = latency.blevel_order(a.block_unit)
    assert latency(a.block_unit, order) == schedule(problem, dataclasses.replace(a, order=tuple(order))).latency_ms
    if latency.incremental:  # one or two blocks on other units: scheduled again from the first of them
        unit_of, sequence = list(a.block_unit), list(a.sequence())
        latency.rebase(unit_of, sequence)
        changed = data.draw(st.sets(st.integers(0, len(unit_of) - 1), min_size=1, max_size=2))
        trial = list(unit_of)
        for b in changed:
            trial[b] = data.draw(st.sampled_from(sorted(latency.ms[b])))
        since = min(latency.position(b) for b in changed)
        assert (
            latency.after(trial, since) == schedule(problem, dataclasses.replace(a, block_unit=tuple(trial))).latency_ms
        )


def _chain_and_branches() -> Problem:
    """0 -> 1..6 (a chain) -> 7 and 8 side by side -> 9: the GPU runs the chain faster, the CPU each branch."""
    cost = {}
    for b in range(10):
        cost[(b, 0)] = 2.0
        cost[(b, 3)] = 1.0 if b <= 6 or b == 9 else 4.0
    edges = [(b, b + 1) for b in range(6)] + [(6, 7), (6, 8), (7, 9), (8, 9)]
    return toy_problem(UNITS[:4], cost, edges, transfer_ms=0.5)


def test_a_chain_on_a_slow_unit_moves_as_a_whole() -> None:
    """Each block of the chain alone would pay two transfers to move; the run moves at once."""
    problem = _chain_and_branches()
    start = Assignment((0,) * 10)
    result = polish(problem, start, time.perf_counter() + 60)
    assert result.improved
    assert result.figures.latency_ms < schedule(problem, start).latency_ms - 3.0
    assert all(result.assignment.block_unit[b] == 3 for b in range(1, 7))


def test_polished_renames_the_start_only_when_it_found_better() -> None:
    problem = _chain_and_branches()
    bad = Candidate("heft", Assignment((0,) * 10), False)
    better = polished(problem, "latency", bad, time.perf_counter() + 60)
    assert better.name == "heft+local-search"
    assert _key(problem, better.assignment) < _key(problem, bad.assignment)
    assert polished(problem, "latency", better, time.perf_counter() + 60).name == "heft+local-search"
    assert polished(problem, "throughput", bad, time.perf_counter() + 60) is bad
    assert polished(problem, "latency", bad, time.perf_counter() - 1) is bad  # past its deadline


def test_highs_gets_what_is_left_of_the_deadline_once_the_model_is_built() -> None:
    x = pulp.LpVariable("x", 0, 1, cat="Binary")
    lp = pulp.LpProblem("tiny", pulp.LpMinimize)
    lp += x
    lp += x >= 0
    for deadline, most in ((5.0, 5.0), (-1.0, 2.0)):  # past the deadline: a tenth of its limit
        # threads=1 as the planner's solves have it: HiGHS's thread scheduler is global to the process, and one
        # started with more threads made every later solve in it fail at once (status not set)
        lp.solve(WarmHiGHS(False, time.perf_counter() + deadline, msg=False, timeLimit=20.0, threads=1))
        _, limit = lp.solverModel.getOptionValue("time_limit")
        assert 0 < limit <= most


def test_best_plan_leaves_the_work_after_the_solve_its_measured_margin(exported) -> None:
    """The solve's limit is the objective's, less the warm start, the search and the margin: the lowering's,
    timed before the solve, and the simulation's, timed while it runs and cut from its limit then."""
    loaded = load_onnx(exported("googlenet").path)
    graph = build_graph(loaded.proto, loaded.sha256, "googlenet")
    blocks, cost = coarsen(graph, "coarse"), CostModel(load_profile("khadas-vim3"), graph)
    seen: list[tuple[float, LimitCut]] = []
    solve = S._Goal.solve

    def spy(self: S._Goal, search: S.SearchOptions, warm: Candidate, cut: LimitCut) -> Solution:
        seen.append((search.time_limit, cut))
        return solve(self, search, warm, cut)

    with (
        mock.patch.object(S._Goal, "solve", spy),
        mock.patch.object(S, "simulation_seconds", return_value=4.0),
    ):
        plan = S.best_plan(blocks, graph, cost, "latency", S.SearchOptions(time_limit=40.0), frames=0)
    assert plan.predicted is not None
    (limit, cut), *_ = seen
    assert cut.seconds == pytest.approx(S.RESERVE_FACTOR * 4.0)
    assert limit - cut.seconds <= 40.0 - S.margin(0.0, 4.0)


def test_a_solve_after_highs_ran_elsewhere_in_the_process_with_more_threads_still_solves() -> None:
    """HiGHS's thread scheduler is global to a process: a solve with another thread count before the planner's
    (threads=1) made every later planner solve fail at once (no plan); the planner starts it again with its own."""
    x = pulp.LpVariable("x", 0, 1, cat="Binary")
    lp = pulp.LpProblem("elsewhere", pulp.LpMinimize)
    lp += x
    lp += x >= 0
    lp.solve(pulp.HiGHS(msg=False, threads=2))
    problem = toy_problem([Unit("cpu", "cpu", 1, 0)], {(0, 0): 1.0, (1, 0): 2.0}, [(0, 1)])
    assert solve(problem, "latency", time_limit=5).status == "optimal"
