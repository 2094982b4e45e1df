"""The ILP gives correct answers: bounds that cut off nothing valid, warm starts it keeps, calibration
applied once, the same plan in every process, honest labels and status."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pulp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from device_profiles.loader import load_profile
from models.coarsen import coarsen
from models.graph import build_graph
from models.onnx_io import load_onnx
from planner import heuristics as H
from planner.baselines import single_pu
from planner.costmodel import Calibration, CostModel, Fit
from planner.ilp import Bounds, Cuts, _formulate, _set_warm_start, ordering_rows, rows_within, segment_bounds, solve
from planner.plan import PlanError
from planner.problem import Problem, Unit, build_problem, toy_problem
from planner.search import SearchOptions, _candidates, best_plan, key
from planner.simulate import PlanModel, analytic
from planner.symmetry import as_start, canonical
from planner.timing import Assignment, fits, schedule

ROOT = Path(__file__).resolve().parents[2]


def _load(exported, name: str):
    loaded = load_onnx(exported(name).path)
    graph = build_graph(loaded.proto, loaded.sha256, name)
    return graph, coarsen(graph, "coarse")


def _fork_join_toy() -> Problem:
    """fork -> two branches -> join on a fast, power-hungry PU or a slow, frugal one."""
    fast, slow = Unit("fast", "gpu", 1, 0), Unit("slow", "npu", 1, 0)
    cost = {(0, 0): 1.0, (1, 0): 3.0, (2, 0): 3.0, (3, 0): 1.0, (0, 1): 2.0, (1, 1): 8.0, (2, 1): 8.0, (3, 1): 2.0}
    edges = [(0, 1), (0, 2), (1, 3), (2, 3)]
    return toy_problem([fast, slow], cost, edges, transfer_ms=0.1, busy_w={0: 1.0, 1: 0.1})


def test_latency_bound_does_not_cut_off_plans_slower_than_the_warm_start() -> None:
    problem = _fork_join_toy()
    warm = Assignment((0, 0, 0, 0))  # all on the fast PU: 8 ms, 8 mJ
    assert schedule(problem, warm).latency_ms == pytest.approx(8.0)
    solution = solve(problem, "energy", time_limit=10, bounds=Bounds(max_latency_ms=30.0), warm=warm)
    # everything on the frugal PU: 2 + 8 + 8 + 2 = 20 ms (under the 30 ms ceiling), 20 ms x 0.1 W = 2 mJ;
    # a big-M taken from the warm start's 8 ms made the solver call 4.2 mJ "optimal"
    assert solution.status == "optimal"
    assert solution.assignment.block_unit == (1, 1, 1, 1)  # the branches in either order
    assert solution.value == pytest.approx(2.0, rel=1e-6)
    assert solution.figures.latency_ms == pytest.approx(20.0)


def _cluster_toy(n_blocks: int, edges: list[tuple[int, int]], costs: list[float]) -> Problem:
    """A 4-core CPU cluster (cut into units of 4, 2 or 1 cores) and a GPU."""
    units = [Unit("cpu", "cpu", 4, 0), Unit("cpu", "cpu", 2, 0), Unit("cpu", "cpu", 2, 1)]
    units += [Unit("cpu", "cpu", 1, i) for i in range(4)] + [Unit("gpu", "gpu", 1, 0)]
    cost = {}
    for b in range(n_blocks):
        for u, x in enumerate(units):
            cost[(b, u)] = costs[b] * (4 / x.cores if x.kind == "cpu" else 0.7)
    return toy_problem(units, cost, edges, transfer_ms=0.3, busy_w={u: 0.2 * x.cores for u, x in enumerate(units)})


def test_symmetry_rows_forbid_a_later_instance_first_in_rows_linear_in_the_blocks() -> None:
    nonzeros = []
    for n in (20, 40):
        problem = _cluster_toy(n, [(i, i + 1) for i in range(n - 1)], [1.0] * n)
        lp, _ = _formulate(problem, "throughput")
        nonzeros.append(sum(len(row) for name, row in lp.constraints.items() if name.startswith("symmetry")))
    # a running count per unit: twice the blocks, about twice the nonzeros (the sums written out: four times)
    assert nonzeros[1] <= 2.2 * nonzeros[0]
    problem = _cluster_toy(3, [(0, 1), (1, 2)], [1.0, 1.0, 1.0])
    lp, v = _formulate(problem, "throughput")
    # the 1-core units are 3..6: instance 1 (unit 4) runs block 0, instance 0 (unit 3) only block 1
    _set_warm_start(problem, v, Assignment((4, 3, 7)))
    broken = {name for name, row in lp.constraints.items() if not row.valid(1e-6)}
    assert broken == {"symmetry_first_3_0"}
    _set_warm_start(problem, v, Assignment((3, 4, 7)))  # the same layout, instances in order
    assert not [name for name, row in lp.constraints.items() if not row.valid(1e-6)]


@st.composite
def _warm_starts(draw):
    n = draw(st.integers(3, 7))
    edges = sorted({(i, j) for j in range(1, n) for i in draw(st.sets(st.integers(0, j - 1), min_size=1, max_size=2))})
    costs = draw(st.lists(st.floats(0.5, 10.0), min_size=n, max_size=n))
    problem = _cluster_toy(n, edges, costs)
    # a layout of the cluster, its units under arbitrary instance labels (not the symmetry rows' order)
    layout = draw(st.sampled_from([[0], [1, 2], [1, 3, 4], [3, 4, 5, 6]]))
    relabel = draw(st.permutations([3, 4, 5, 6]))
    twos = draw(st.permutations([1, 2]))
    mapped = [
        {3: relabel[0], 4: relabel[1], 5: relabel[2], 6: relabel[3], 1: twos[0], 2: twos[1]}.get(u, u) for u in layout
    ]
    units = [*mapped, 7]
    warm = Assignment(tuple(draw(st.sampled_from(units)) for _ in range(n)))
    objective = draw(st.sampled_from(["latency", "throughput", "energy"]))
    limit = draw(st.sampled_from([0.001, 0.01, 0.05, 0.5]))
    return problem, warm, objective, limit


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_warm_starts())
def test_warm_start_satisfies_every_row_and_the_incumbent_is_never_worse(case) -> None:
    problem, warm, objective, limit = case
    assert schedule(problem, canonical(problem, warm)) == schedule(problem, warm)  # relabelling changes nothing
    start = as_start(problem, warm, objective == "latency")  # as the solver gets it
    figures = schedule(problem, start)
    assert figures.value(objective) == pytest.approx(schedule(problem, warm).value(objective), rel=1e-12)
    horizon = figures.latency_ms if objective == "latency" else None
    lp, v = _formulate(problem, objective, cuts=Cuts(horizon=horizon, upper_latency=horizon))
    _set_warm_start(problem, v, start)
    broken = [name for name, row in lp.constraints.items() if not row.valid(1e-6)]
    assert not broken, f"the warm start breaks {broken[:5]}: HiGHS would drop it"
    solution = solve(problem, objective, time_limit=limit, warm=warm)
    assert solution.best <= figures.value(objective) * (1 + 1e-9)
    assert schedule(problem, solution.assignment).value(objective) <= figures.value(objective) * (1 + 1e-9)


def test_balanced_warm_start_on_googlenet_is_feasible_for_the_solver(exported) -> None:
    graph, blocks = _load(exported, "googlenet")
    problem = build_problem(blocks, graph, CostModel(load_profile("khadas-vim3"), graph), 4)
    warm = canonical(problem, H.balanced(problem))
    lp, v = _formulate(problem, "throughput")
    _set_warm_start(problem, v, warm)
    assert all(row.valid(1e-6) for row in lp.constraints.values())


def test_calibration_is_applied_once(exported) -> None:
    graph, blocks = _load(exported, "squeezenet1_1")
    profile = load_profile("khadas-vim3")
    fit = Fit({}, 0.0, 1.0, alpha=1.5, beta_ms=2.0, partitions_fitted=3)
    cost = CostModel(profile, graph, Calibration(graph.model_sha256, profile.name).with_fit(("a73", 4), fit))
    members = [n.name for n in graph.nodes]
    units = sum(cost.roofline_ms(m, "a73", 4) for m in members)
    assert cost.group_ms(members, "a73", 4).ms == pytest.approx(1.5 * units + 2.0)
    problem = build_problem(blocks, graph, cost, 4)
    a73 = next(u for u, x in enumerate(problem.units) if (x.pu, x.cores, x.instance) == ("a73", 4, 0))
    whole = Assignment(tuple(a73 for _ in problem.blocks))
    predicted = analytic(PlanModel(single_pu(blocks, profile, "a73", 4), graph, cost))
    # one partition: alpha on every block, beta once
    assert schedule(problem, whole).latency_ms == pytest.approx(1.5 * units + 2.0, rel=1e-9)
    assert schedule(problem, whole).period_ms == pytest.approx(predicted.latency_ms, rel=1e-9)
    assert 1000.0 / schedule(problem, whole).period_ms == pytest.approx(predicted.throughput_fps, rel=1e-9)


_PLAN_SCRIPT = """
import json, sys
from device_profiles.loader import load_profile
from models.coarsen import coarsen
from models.graph import build_graph
from models.onnx_io import load_onnx
from planner.costmodel import CostModel
from planner.search import SearchOptions, best_plan
loaded = load_onnx(sys.argv[1])
graph = build_graph(loaded.proto, loaded.sha256, "squeezenet1_1")
blocks = coarsen(graph, "coarse")
cost = CostModel(load_profile(sys.argv[2]), graph)
out = {}
for objective in ("latency", "throughput", "energy"):
    data = best_plan(blocks, graph, cost, objective, SearchOptions(time_limit=60)).to_json()
    data["provenance"]["seconds"] = 0.0  # wall-clock time, the one field that may differ
    out[objective] = data
print(json.dumps(out, sort_keys=True))
"""


@pytest.mark.parametrize("device", ["khadas-vim3", "bst-a1000"])
def test_the_same_inputs_give_byte_identical_plans_in_other_processes(exported, device: str) -> None:
    path = str(exported("squeezenet1_1").path)
    outputs = []
    for seed in ("1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        ran = subprocess.run(
            [sys.executable, "-c", _PLAN_SCRIPT, path, device], env=env, capture_output=True, text=True, check=True
        )
        outputs.append(ran.stdout)
    assert outputs[0] == outputs[1]
    for data in json.loads(outputs[0]).values():
        assert data["provenance"]["status"] == "optimal"  # under a time limit, timing could change the answer


def test_a_plan_is_labelled_by_how_it_was_found(exported) -> None:
    graph, blocks = _load(exported, "googlenet")
    cost = CostModel(load_profile("khadas-vim3"), graph)
    problem = build_problem(blocks, graph, cost, 4)
    solved = best_plan(blocks, graph, cost, "energy", SearchOptions(time_limit=30), problem=problem)
    assert solved.provenance.method == "ilp" and solved.provenance.status == "optimal"
    assert solved.provenance.solver_value == pytest.approx(solved.predicted.energy_mj, rel=0.01)
    # no time to find a plan of its own: the warm start (a heuristic) is what comes back, named as such
    rushed = best_plan(blocks, graph, cost, "latency", SearchOptions(time_limit=0.001), problem=problem)
    assert rushed.provenance.method.startswith("heuristic:"), rushed.provenance
    assert rushed.provenance.status != "optimal"
    name = rushed.provenance.method.split(":", 1)[1]
    from planner.search import baselines, warm_candidates

    assert name in {c.name for c in warm_candidates(problem, "latency")}  # a baseline or the latency warm start
    base = baselines(blocks, graph, cost, 4, problem)
    assert key(rushed, "latency") <= min(key(p, "latency") for p in base.values()) * (1 + 1e-9)
    if name in base:
        assert key(rushed, "latency") == pytest.approx(key(base[name], "latency"), rel=1e-9)


def test_a_frame_overhead_is_in_the_solver_value_and_under_a_latency_ceiling(exported) -> None:
    """What a frame alone spends in a pipeline of several partitions outside their runs (``tune``'s frame
    overhead) is the same for every such plan: the ILP leaves it out of its latency, the plan's prediction has
    it. The solver's value still is the prediction, and a latency ceiling holds for the prediction."""
    from planner.build import frame_overhead_ms
    from planner.select import Constraints

    graph, blocks = _load(exported, "squeezenet1_1")
    plain = CostModel(load_profile("khadas-vim3"), graph)
    cost = plain.recalibrated(plain.calibration.with_frame_overhead(0.8))
    problem = build_problem(blocks, graph, cost, 4)
    fast = best_plan(blocks, graph, cost, "latency", SearchOptions(time_limit=30), problem=problem)
    assert fast.provenance.method == "ilp" and fast.provenance.status == "optimal", fast.provenance
    assert frame_overhead_ms(fast, graph, cost) == 0.8  # several partitions: it pays the overhead
    assert fast.provenance.solver_value == pytest.approx(fast.predicted.latency_ms, rel=0.01)
    without = dataclasses.replace(fast, predicted=None)
    from planner.build import evaluate

    assert evaluate(without, graph, plain, frames=0).predicted.latency_ms == pytest.approx(
        fast.predicted.latency_ms - 0.8, rel=1e-6
    )
    # a ceiling just above the fastest plan: the energy plan under it is predicted within it, overhead and all
    ceiling = fast.predicted.latency_ms * 1.05
    frugal = best_plan(
        blocks, graph, cost, "energy", SearchOptions(time_limit=30), Constraints(max_latency_ms=ceiling), problem
    )
    assert frugal.predicted.latency_ms <= ceiling * (1 + 1e-9), (frugal.predicted, ceiling)


@pytest.mark.parametrize("backend", ["highs", "cbc"])
def test_status_is_not_optimal_after_a_time_limit(exported, backend: str) -> None:
    graph, blocks = _load(exported, "inception_v3")
    problem = build_problem(blocks, graph, CostModel(load_profile("khadas-vim3"), graph), 4)
    warm = Assignment(tuple(0 for _ in problem.blocks))
    solution = solve(problem, "latency", time_limit=0.5, warm=warm, solver=backend)
    assert solution.status != "optimal", solution.status
    assert pulp.LpStatus  # the solver ran for real


def test_an_infeasible_verdict_against_a_feasible_warm_start_keeps_the_start(exported, monkeypatch) -> None:
    """A solver starved of CPU before its time limit may call the model infeasible; a warm start that fits and
    meets the bounds proves it is not: the start stands. One that breaks a bound proves nothing: the bound is
    named."""
    import planner.ilp as ilp

    graph, blocks = _load(exported, "googlenet")
    problem = build_problem(blocks, graph, CostModel(load_profile("khadas-vim3"), graph), 4)
    warm = Assignment(tuple(0 for _ in problem.blocks))
    monkeypatch.setattr(ilp, "status_of", lambda lp, backend: ("infeasible", None, None))
    kept = solve(problem, "latency", time_limit=1, warm=warm)
    assert "warm start kept" in kept.status and kept.assignment.block_unit == warm.block_unit
    with pytest.raises(PlanError, match="no plan meets --max-latency-ms"):
        solve(problem, "energy", 1, Bounds(max_latency_ms=1e-3), warm=warm)


@st.composite
def _modules(draw):
    """A chain of fork/join modules (where segment bounds cut), random costs and per-partition overheads."""
    edges: list[tuple[int, int]] = []
    n = 1
    for module in range(draw(st.integers(1, 2))):
        fork, ends = n - 1, []
        for _ in range(2 if module == 0 else draw(st.integers(1, 2))):
            previous = fork
            for _ in range(draw(st.integers(1, 2))):
                edges.append((previous, n))
                previous, n = n, n + 1
            ends.append(previous)
        edges += [(e, n) for e in ends]
        n += 1
    costs = draw(st.lists(st.floats(0.5, 10.0), min_size=n, max_size=n))
    problem = _cluster_toy(n, edges, costs)
    overhead = draw(st.sampled_from([0.0, 0.4]))
    problem = dataclasses.replace(problem, unit_overhead=dict.fromkeys(problem.unit_overhead, overhead))
    layout = draw(st.sampled_from([[0], [1, 2], [1, 5, 6], [3, 4, 5, 6]]))
    warm = Assignment(tuple(draw(st.sampled_from([*layout, 7])) for _ in range(n)))
    return problem, warm


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_modules())
def test_segment_bounds_cut_off_no_plan(case) -> None:
    problem, warm = case
    segments = segment_bounds(problem, 10.0)
    assert segments, "a chain of modules has segments to bound"
    # every plan's schedule meets every segment row ...
    figures = schedule(problem, canonical(problem, warm))
    for x, y, span in segments:
        early = figures.starts[x] if x >= 0 else 0.0
        late = figures.starts[y] if y < len(problem.blocks) else figures.latency_ms
        assert late - early >= span - 1e-6
    # ... and the optimum is the same with and without them
    bare = dataclasses.replace(problem, derived={"segment_bounds": ()})
    cut = solve(problem, "latency", time_limit=60, gap=1e-7)
    plain = solve(bare, "latency", time_limit=60, gap=1e-7)
    assert cut.status == plain.status == "optimal"
    assert cut.best == pytest.approx(plain.best, rel=1e-5)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_modules())
def test_segment_bounds_from_a_warm_start_at_a_gap_are_proven_and_within_it(case) -> None:
    """Each segment solved from the warm start's part of the frame to a proven 5%: every plan still meets every
    row, and no bound is more than 5% under the one proven to 0.01%."""
    problem, warm = case
    exact = {(x, y): span for x, y, span in segment_bounds(dataclasses.replace(problem, derived={}), 10.0)}
    loose = segment_bounds(dataclasses.replace(problem, derived={}), 10.0, warm, 0.05)
    assert {(x, y) for x, y, _ in loose} == set(exact)
    figures = schedule(problem, canonical(problem, warm))
    for x, y, span in loose:
        early = figures.starts[x] if x >= 0 else 0.0
        late = figures.starts[y] if y < len(problem.blocks) else figures.latency_ms
        assert late - early >= span - 1e-6
        assert span >= (1 - 0.05) * exact[(x, y)] - 1e-6
    # and they cut off no plan better than the warm start: the optimum is the same with them
    cut = solve(dataclasses.replace(problem, derived={"segment_bounds": loose}), "latency", time_limit=60, gap=1e-7)
    plain = solve(dataclasses.replace(problem, derived={"segment_bounds": ()}), "latency", time_limit=60, gap=1e-7)
    assert cut.status == plain.status == "optimal"
    assert cut.best == pytest.approx(plain.best, rel=1e-5)


def test_segment_bounds_hold_for_every_warm_start_on_googlenet(exported) -> None:
    graph, blocks = _load(exported, "googlenet")
    problem = build_problem(blocks, graph, CostModel(load_profile("khadas-vim3"), graph), 4)
    segments = segment_bounds(problem, 10.0)
    assert len(segments) >= 8  # the inception modules between the concats
    fast = H.fastest(problem)
    assert fast is not None and fits(problem, fast)
    cands = [c.assignment for c in _candidates(problem)]
    assert schedule(problem, fast).latency_ms <= min(schedule(problem, a).latency_ms for a in cands) + 1e-9
    for a in [*cands, fast]:
        figures = schedule(problem, a)
        for x, y, span in segments:
            late = figures.starts[y] if y < len(problem.blocks) else figures.latency_ms
            assert late - (figures.starts[x] if x >= 0 else 0.0) >= span - 1e-6


def test_a_latency_ilp_too_wide_for_its_time_limit_is_not_written_and_the_warm_start_stands() -> None:
    """300 parallel branches: 44,850 pairs of independent blocks, ~180,000 ordering rows, more than PuLP writes
    in 1 s; the solve returns the warm start at once (before, it spent its time writing rows it never solved)."""
    units = [Unit("cpu", "cpu", 2, 0), Unit("cpu", "cpu", 1, 0), Unit("cpu", "cpu", 1, 1)]
    n = 302
    edges = [(0, b) for b in range(1, n - 1)] + [(b, n - 1) for b in range(1, n - 1)]
    cost = {(b, u): 1.0 * 2 / x.cores for b in range(n) for u, x in enumerate(units)}
    problem = toy_problem(units, cost, edges)
    warm = Assignment((0,) * n)
    latency = solve(problem, "latency", time_limit=1.0, warm=warm)
    assert latency.status.startswith("not solved") and "raise --time-limit" in latency.status
    needed = float(latency.status.split("needs at least ")[1].split(" s")[0])  # advice with a number that works
    assert needed > 1.0 and rows_within(needed) >= ordering_rows(problem) > rows_within(needed - 1)
    assert latency.warm_kept and latency.assignment == warm
    assert latency.figures == schedule(problem, warm)
    throughput = solve(problem, "throughput", time_limit=5.0, warm=warm)  # no ordering rows: solved
    assert not throughput.status.startswith("not solved")


def test_a_throttled_unit_runs_its_first_burst_at_full_speed_in_the_order_it_chooses() -> None:
    """LITTLE (factor 2.5, a 1 ms burst) runs two independent blocks of a fork: a 1 ms one whose successor on
    big takes 7 ms, and a 3 ms one that goes straight to the join. A frame's first 1 ms of work there runs at
    full speed, the rest at 2.5x, in the order LITTLE runs them: the short one first (ends at 2, its
    successor at 9) and the long one after it at 2.5x (ends at 9.5): 10.5 ms with the join. The long one
    first: 17.5. The rule taken in index order would give the burst to the long block (11.5), the old rule
    (all of a stalling unit's work at the factor) 12."""
    big, little = Unit("big", "cpu", 1, 0), Unit("little", "cpu", 1, 0)
    # 0 fork (big); 1: 3 ms on LITTLE only; 2: 1 ms on LITTLE only; 3: 7 ms on big only, after 2; 4 join (big)
    cost = {(0, 0): 1.0, (1, 1): 3.0, (2, 1): 1.0, (3, 0): 7.0, (4, 0): 1.0}
    edges = [(0, 1), (0, 2), (2, 3), (1, 4), (3, 4)]
    problem = toy_problem([big, little], cost, edges, sustained={1: 2.5}, burst={1: 1.0})
    solution = solve(problem, "latency", time_limit=20, gap=1e-9)
    assert solution.status == "optimal"
    assert solution.value == pytest.approx(10.5)
    figures = schedule(problem, solution.assignment)
    assert figures.latency_ms == pytest.approx(10.5)
    long_first = schedule(problem, Assignment((0, 1, 1, 0, 0), (0, 1, 2, 3, 4)))
    assert long_first.latency_ms == pytest.approx(17.5)
    # back to back, LITTLE's 4 ms of work a frame take 10 ms: throughput sees the sustained time
    assert figures.period_ms == pytest.approx(10.0)
    # tune fitted 3.5 back to back (other threads on the core): the load is priced at it, a frame alone is not
    fitted = dataclasses.replace(problem, sustained={1: 3.5}, alone={1: 2.5})
    solution = solve(fitted, "latency", time_limit=20, gap=1e-9)
    assert solution.value == pytest.approx(10.5)
    assert schedule(fitted, solution.assignment).period_ms == pytest.approx(14.0)


def test_a_solve_highs_ends_in_a_solve_error_is_solved_again_with_a_tighter_tolerance() -> None:
    """Found by hypothesis (test_configuration_bound): HiGHS solved the presolved model to optimality, found its
    incumbent 3e-6 off a row of the model as given (tolerance 1e-6) and reported a solve error, which left no plan.
    An int8-only block on the NPU, CFS-throttled CPU units, a latency solve."""
    units = [Unit("cpu", "cpu", 2, 0), Unit("cpu", "cpu", 1, 0), Unit("cpu", "cpu", 1, 1)]
    units += [Unit("gpu", "gpu", 1, 0), Unit("npu", "npu", 1, 0)]
    a, c = 1.9835339835979073, 3.882517920395226
    cost = {(0, 0): 3.5, (0, 1): 7.0, (0, 2): 7.0, (0, 3): a, (1, 0): 1.25, (1, 1): 2.5, (1, 2): 2.5}
    cost |= {(2, 0): c, (2, 1): 2 * c, (2, 2): 2 * c, (3, 0): 2.25, (3, 1): 4.5, (3, 2): 4.5}
    throttled = {u: 2.5 for u in range(3)}
    problem = toy_problem(
        units,
        cost,
        [(0, 1), (0, 2), (0, 3), (1, 2)],
        transfer_ms=0.3,
        busy_w={u: 1.0 for u in range(5)},
        int8_cost={(0, 4): 3.5, (2, 0): 1.941258960197613},
        sustained=throttled,
        burst={u: 9.0 for u in range(3)},
        alone=throttled,
    )
    solution = solve(problem, "latency", time_limit=20, gap=1e-9)
    assert solution.status == "optimal"
    assert solution.value == pytest.approx(schedule(problem, solution.assignment).latency_ms, rel=1e-6)
