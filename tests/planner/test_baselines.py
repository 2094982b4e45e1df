"""Baselines are what they say: pipe-only over every PU, ort-all-cores from measured multi-core runs,
computed once per problem, and no plan of ours predicts worse than any of them."""

from __future__ import annotations

import itertools

import pytest

from device_profiles.loader import load_profile, shipped_names
from models.coarsen import coarsen
from models.graph import build_graph
from models.onnx_io import load_onnx
from models.zoo import CORE as ZOO
from planner import heuristics as H
from planner.build import priced
from planner.costmodel import CostModel
from planner.ilp import relaxed_shares
from planner.plan import validate
from planner.problem import Unit, build_problem, toy_problem
from planner.search import SearchOptions, baselines, best_plan, key, shared_problem
from planner.simulate import simulate
from planner.timing import Assignment, period_loads
from profiler.costtable import Conditions, CostEntry, CostTable, entry_key

PROFILES = [n for n in shipped_names() if n != "local-biglittle"] + ["local-biglittle"]


def _load(exported, name: str):
    loaded = load_onnx(exported(name).path)
    graph = build_graph(loaded.proto, loaded.sha256, name)
    return graph, coarsen(graph, "coarse")


def test_pipe_only_considers_every_pu() -> None:
    # six single cores listed before an NPU that is ten times faster than any of them
    units = [Unit("cpu", "cpu", 1, i) for i in range(6)] + [Unit("npu", "npu", 1, 0)]
    cost = {(b, u): (1.0 if u == 6 else 10.0) for b in range(4) for u in range(7)}
    problem = toy_problem(units, cost, [(0, 1), (1, 2), (2, 3)], transfer_ms=0.01)
    assignment = H.pipe_only(problem)
    assert assignment is not None and 6 in assignment.block_unit


def test_load_balancing_starts_from_the_relaxation_where_the_greedy_start_gets_stuck() -> None:
    # four independent blocks on three accelerators (ms on gpu, npu, dsp): the optimum's period is 5 (b0 on the
    # gpu, b1 and b3 on the npu, b2 on the dsp); longest first then moves and swaps settles at 8
    units = [Unit("gpu", "gpu", 1, 0), Unit("npu", "npu", 1, 0), Unit("dsp", "dsp", 1, 0)]
    ms = [(5.0, 4.0, 9.0), (2.0, 1.0, 5.0), (4.0, 4.0, 4.0), (9.0, 4.0, 8.0)]
    problem = toy_problem(units, {(b, u): t for b, row in enumerate(ms) for u, t in enumerate(row)}, [])
    every = (period_loads(problem, Assignment(a))[0] for a in itertools.product(range(3), repeat=len(ms)))
    assert min(every) == 5.0
    greedy = H._rebalance(problem, H._longest_first(problem, [0, 1, 2]), [0, 1, 2], 1000)
    assert period_loads(problem, greedy)[0] == 8.0
    assert period_loads(problem, H.balanced(problem))[0] == 5.0


def test_load_balancing_past_the_relaxations_budget_starts_greedy(monkeypatch) -> None:
    """No relaxation within the budget: every cut gets none, and load balancing starts from the greedy start."""
    units = [Unit("gpu", "gpu", 1, 0), Unit("npu", "npu", 1, 0), Unit("dsp", "dsp", 1, 0)]
    ms = [(5.0, 4.0, 9.0), (2.0, 1.0, 5.0), (4.0, 4.0, 4.0), (9.0, 4.0, 8.0)]
    problem = toy_problem(units, {(b, u): t for b, row in enumerate(ms) for u, t in enumerate(row)}, [])
    assert relaxed_shares(problem, [[0, 1, 2]], 0.0) == [None]
    monkeypatch.setattr(H, "RELAXATION_SECONDS", 0.0)
    assert period_loads(problem, H.balanced(problem))[0] == 8.0  # the greedy start's local optimum


def test_pipe_only_is_the_best_consecutive_split(exported) -> None:
    graph, blocks = _load(exported, "squeezenet1_1")
    problem = build_problem(blocks, graph, CostModel(load_profile("khadas-vim3"), graph), 3)
    found = H.pipe_only(problem)
    units_used = list(dict.fromkeys(found.block_unit))
    assert len(units_used) <= 3
    # chunks are consecutive: a unit's blocks form one run in topological order
    runs = [u for i, u in enumerate(found.block_unit) if i == 0 or found.block_unit[i - 1] != u]
    assert len(runs) == len(set(runs))

    def load(a) -> float:
        out: dict[int, float] = {}
        for b, u in enumerate(a.block_unit):
            out[u] = out.get(u, 0.0) + problem.cost[(b, u)]
        return max(out.values())

    # no two-stage split over any pair of whole units does better
    n = len(problem.blocks)
    whole = H.full_units(problem)
    for u in whole:
        for w in whole:
            if u == w:
                continue
            for cut in range(1, n):
                if all((b, u) in problem.cost for b in range(cut)) and all(
                    (b, w) in problem.cost for b in range(cut, n)
                ):
                    split = type(found)(tuple([u] * cut + [w] * (n - cut)))
                    assert load(found) <= load(split) * (1 + 1e-9)


def test_ort_all_cores_uses_measured_multicore_runs(exported) -> None:
    graph, blocks = _load(exported, "squeezenet1_1")
    profile = load_profile("khadas-vim3")
    members = tuple(n.name for n in graph.nodes)
    table = CostTable()
    measured = {"a73": 40.0, "a53": 50.0}
    for pu, ms in measured.items():
        cores = len(profile.pu(pu).cores)
        cond = Conditions(profile.name, pu, cores, cores, "CPUExecutionProvider", "x", "all")
        key_ = entry_key(graph.model_sha256, "partition", members, cond)
        table.add(CostEntry(key_, "partition", graph.model_sha256, "part1of0", members, cond, ms, ms, ms, ms, 10))
    cost = CostModel.from_table(profile, graph, table)
    plan = baselines(blocks, graph, cost)["ort-all-cores"]
    # six threads split every operator; the A53s, measured at 50 ms on 2 cores (100 core-ms), set the pace
    assert plan.predicted.latency_ms == pytest.approx(max(40.0 * 4, 50.0 * 2) / 6)


def test_baselines_are_computed_once_per_problem(exported, monkeypatch) -> None:
    graph, blocks = _load(exported, "squeezenet1_1")
    cost = CostModel(load_profile("khadas-vim3"), graph)
    problem = build_problem(blocks, graph, cost, 4)
    calls = []
    real = H.pipe_only
    monkeypatch.setattr(H, "pipe_only", lambda *a, **k: calls.append(1) or real(*a, **k))
    first = baselines(blocks, graph, cost, 4, problem)
    for objective in ("latency", "throughput", "energy"):
        best_plan(blocks, graph, cost, objective, SearchOptions(time_limit=1), problem=problem)
    assert baselines(blocks, graph, cost, 4, problem) == first
    assert len(calls) == 1


# profiles that offer two runtimes on one unit's hardware are planned once per choice: one small model there
# (the choice itself: tests/planner/test_runtime_choice.py)
CASES = [(n, d) for d in PROFILES for n in ZOO if d != "intel-core-ultra" or n == "bert_tiny"]


@pytest.mark.parametrize(("name", "device"), CASES)
def test_the_plan_of_each_objective_is_never_worse_than_any_baseline(exported, name: str, device: str) -> None:
    graph, blocks = _load(exported, name)
    try:
        profile = load_profile(device)
    except ValueError as exc:  # local-biglittle where throttling is impossible
        pytest.skip(str(exc))
    cost = CostModel(profile, graph)
    problem = shared_problem(blocks, graph, cost, 4)  # None where units offer several runtimes: each planned
    base = baselines(blocks, graph, cost, 4, problem, frames=0)  # compared by their predictions
    for plan in base.values():
        validate(plan, graph, profile)
    for objective in ("latency", "throughput", "energy"):
        plan = best_plan(blocks, graph, cost, objective, SearchOptions(time_limit=0.3), problem=problem)
        validate(plan, graph, profile)
        assert plan.predicted is not None and plan.simulated is not None
        # the simulator runs the plan as the executor does (units by frame + lag): at the analytic throughput in
        # steady state (240 frames may still see the fill's transient: then 1,000 frames must agree)
        simulated = plan.simulated.throughput_fps
        if abs(simulated / plan.predicted.throughput_fps - 1) > 0.02:
            simulated = simulate(priced(plan, graph, cost), 1000).throughput_fps
        assert simulated == pytest.approx(plan.predicted.throughput_fps, rel=0.02), objective
        for other, theirs in base.items():
            assert key(plan, objective) <= key(theirs, objective) * (1 + 1e-9), (objective, other)
        if plan.provenance.method == "ilp" and plan.provenance.status == "optimal":
            # the solver's own incumbent, proven: its value is the prediction (a time-limited incumbent
            # may carry slack in its continuous variables, so its value is only an upper bound)
            predicted = {"latency": plan.predicted.latency_ms, "throughput": plan.predicted.throughput_fps}
            value = predicted.get(objective, plan.predicted.energy_mj)
            assert plan.provenance.solver_value == pytest.approx(value, rel=0.01), objective
