"""Precision as a choice of the ILP: a block runs in fp32 or, where its int8 variant was validated, in int8;
a PU that computes int8 only (an NPU) takes validated blocks only, in int8; the blocks in int8 keep the sum
of their accuracy losses within the budget; and the solver's optimum is the best plan there is."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from device_profiles.loader import load_profile
from models.coarsen import coarsen
from models.graph import build_graph
from models.onnx_io import load_onnx
from planner.costmodel import CostModel
from planner.ilp import _TIE, OBJECTIVES, solve
from planner.plan import PlanError
from planner.problem import BUDGET_SLACK, Int8Choice, Problem, Unit, build_problem, toy_problem
from planner.timing import Assignment, schedule

# a 2-core CPU cluster (one 2-core unit, or two 1-core units) and an NPU that computes int8 only
UNITS = [Unit("cpu", "cpu", 2, 0), Unit("cpu", "cpu", 1, 0), Unit("cpu", "cpu", 1, 1), Unit("npu", "npu", 1, 0)]
CPU_UNITS, NPU = (0, 1, 2), 3


@st.composite
def problems(draw) -> Problem:
    n = draw(st.integers(2, 4))
    edges = sorted({(i, j) for j in range(1, n) for i in draw(st.sets(st.integers(0, j - 1), min_size=1, max_size=2))})
    fp32 = draw(st.lists(st.floats(1.0, 10.0), min_size=n, max_size=n))
    validated = draw(st.sets(st.integers(0, n - 1)))
    speedup = draw(st.lists(st.floats(1.0, 4.0), min_size=n, max_size=n))
    cost, int8_cost = {}, {}
    for b in range(n):
        for u in CPU_UNITS:
            cost[(b, u)] = fp32[b] * 2 / UNITS[u].cores
            if b in validated:
                int8_cost[(b, u)] = cost[(b, u)] / speedup[b]
        if b in validated and draw(st.booleans()):  # the NPU's compiler may not take every validated block
            int8_cost[(b, NPU)] = fp32[b] * draw(st.floats(0.2, 4.0))
    sensitivity = {b: draw(st.floats(0.0, 0.02)) for b in validated}
    budget = draw(st.sampled_from([0.0, 0.005, 0.01, 0.03]))
    return toy_problem(
        UNITS,
        cost,
        edges,
        transfer_ms=draw(st.sampled_from([0.0, 0.5])),
        busy_w={0: 2.0, 1: 1.0, 2: 1.0, 3: 0.3},
        idle_w=0.5,
        int8_cost=int8_cost,
        sensitivity=sensitivity,
        accuracy_budget=budget,
    )


def _valid(problem: Problem, a: Assignment) -> bool:
    """What the ILP allows: each block where it runs in its precision, cores shared out, the budget kept."""
    for b, u in enumerate(a.block_unit):
        if (b, u) not in (problem.int8_cost if b in a.int8 else problem.cost):
            return False
    cores = sum(problem.units[u].cores for u in set(a.block_unit) if problem.units[u].kind == "cpu")
    spent = sum(problem.sensitivity.get(b, 0.0) for b in a.int8)
    return cores <= 2 and spent <= (problem.accuracy_budget or 0.0) + BUDGET_SLACK


def _orders(problem: Problem) -> list[tuple[int, ...]]:
    n = len(problem.blocks)
    preds = {j: {i for i, jj, _ in problem.edges if jj == j} for j in range(n)}
    return [p for p in itertools.permutations(range(n)) if all(preds[b] <= set(p[: p.index(b)]) for b in p)]


def _best_by_enumeration(problem: Problem, objective: str) -> float:
    n, best = len(problem.blocks), math.inf
    orders = _orders(problem) if objective == "latency" else [tuple(range(n))]
    for units in itertools.product(range(len(UNITS)), repeat=n):
        for bits in itertools.product((False, True), repeat=n):
            for order in orders:
                a = Assignment(units, order, frozenset(b for b in range(n) if bits[b]))
                if _valid(problem, a):
                    best = min(best, schedule(problem, a).value(objective))
    return best


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.sampled_from(OBJECTIVES))
def test_the_solver_chooses_precisions_within_the_budget_and_finds_the_best_plan(problem, objective) -> None:
    solution = solve(problem, objective, time_limit=20, gap=1e-9)
    a = solution.assignment
    assert _valid(problem, a), "a block in a precision it cannot run in there, or the budget overspent"
    assert all(b in a.int8 for b, u in enumerate(a.block_unit) if u == NPU), "the NPU runs blocks in int8 only"
    figures = schedule(problem, a)
    assert figures.value(objective) == pytest.approx(solution.best, rel=1e-6)  # the solver's value is the plan's
    assert solution.best == pytest.approx(_best_by_enumeration(problem, objective), rel=1e-6)


# a one-core CPU (fp32, int8) and a GPU whose first reduced precision is fp16 and second int8
GPU_UNITS = [Unit("cpu", "cpu", 1, 0), Unit("gpu", "gpu", 1, 0)]
GPU = 1


@st.composite
def gpu_problems(draw) -> Problem:
    n = draw(st.integers(2, 3))
    edges = sorted({(i, j) for j in range(1, n) for i in draw(st.sets(st.integers(0, j - 1), min_size=1, max_size=2))})
    cost, first, second = {}, {}, {}
    int8_loss, fp16_loss = {}, {}
    for b in range(n):
        cost[(b, 0)] = draw(st.floats(1.0, 10.0))
        cost[(b, GPU)] = draw(st.floats(0.5, 10.0))
        if draw(st.booleans()):  # int8 validated: on the CPU, and on the GPU where it offers fp16 too
            int8_loss[b] = draw(st.floats(0.0, 0.02))
            first[(b, 0)] = cost[(b, 0)] / draw(st.floats(1.0, 4.0))
        if draw(st.booleans()):
            fp16_loss[b] = draw(st.floats(0.0, 0.02))
            first[(b, GPU)] = cost[(b, GPU)] / draw(st.floats(1.0, 3.0))
            if b in int8_loss:
                second[(b, GPU)] = cost[(b, GPU)] / draw(st.floats(1.0, 6.0))
    return toy_problem(
        GPU_UNITS,
        cost,
        edges,
        transfer_ms=draw(st.sampled_from([0.0, 0.5])),
        busy_w={0: 1.0, 1: 3.0},
        idle_w=0.5,
        int8_cost=first,
        sensitivity=int8_loss,
        accuracy_budget=draw(st.sampled_from([0.0, 0.005, 0.01, 0.03])),
        fp16_units=frozenset({GPU}),
        fp16_sensitivity=fp16_loss,
        second_cost=second,
    )


def _gpu_valid(problem: Problem, a: Assignment) -> bool:
    for b, u in enumerate(a.block_unit):
        table = (problem.cost, problem.int8_cost, problem.second_cost)[a.level(b)]
        if (b, u) not in table:
            return False
    spent = sum(problem.loss(b, u, a.level(b)) for b, u in enumerate(a.block_unit))
    return spent <= (problem.accuracy_budget or 0.0) + BUDGET_SLACK


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gpu_problems(), st.sampled_from(OBJECTIVES))
def test_a_gpu_that_computes_fp16_and_int8_gets_either_per_block_and_the_solver_finds_the_best_mix(
    problem, objective
) -> None:
    """Each block on the GPU in fp32, fp16 or int8 (the ones validated), on the CPU in fp32 or int8: the solver's
    optimum is the best over every placement, precision and order there is, within the summed losses' budget."""
    solution = solve(problem, objective, time_limit=20, gap=1e-9)
    a = solution.assignment
    assert a.second <= a.int8 and all(a.block_unit[b] == GPU for b in a.second)
    assert _gpu_valid(problem, a), "a block in a precision it cannot run in there, or the budget overspent"
    assert schedule(problem, a).value(objective) == pytest.approx(solution.best, rel=1e-6)
    n, best, tied = len(problem.blocks), math.inf, math.inf
    orders = _orders(problem) if objective == "latency" else [tuple(range(n))]
    for units in itertools.product(range(len(GPU_UNITS)), repeat=n):
        for levels in itertools.product((0, 1, 2), repeat=n):
            int8 = frozenset(b for b in range(n) if levels[b])
            for order in orders:
                trial = Assignment(units, order, int8, frozenset(b for b in range(n) if levels[b] == 2))
                if _gpu_valid(problem, trial):
                    figures = schedule(problem, trial)
                    best = min(best, figures.value(objective))
                    tied = min(tied, figures.latency_ms + _TIE * figures.period_ms)
    # the ILP minimises its objective plus _TIE times a secondary one (latency: the period; otherwise the edges
    # that cross units), so it may give up that much of the first for the second: never more
    if objective == "latency":
        found = schedule(problem, a)
        assert found.latency_ms + _TIE * found.period_ms == pytest.approx(tied, rel=1e-6)
    assert best * (1 - 1e-6) <= solution.best <= best * (1 + 1e-6) + _TIE * max(best, len(problem.edges))


def test_the_budget_puts_one_block_in_int8_and_another_in_fp16_on_the_same_gpu() -> None:
    """int8 is faster but loses more: a budget that holds one int8 block and one fp16 block, not two int8 ones,
    gets exactly that mix on the GPU, and the plan written from it names each block's precision."""
    from planner.build import to_plan
    from planner.plan import PlanPrecision, Provenance
    from tests.support.graphs import dag_graph

    cost = {(b, u): 8.0 for b in range(2) for u in range(2)}
    problem = toy_problem(
        GPU_UNITS,
        cost,
        [(0, 1)],
        busy_w={0: 1.0, 1: 1.0},
        int8_cost={(b, GPU): 4.0 for b in range(2)},  # fp16
        sensitivity={0: 0.006, 1: 0.006},
        accuracy_budget=0.008,
        fp16_units=frozenset({GPU}),
        fp16_sensitivity={0: 0.001, 1: 0.001},
        second_cost={(b, GPU): 1.0 for b in range(2)},  # int8
    )
    solution = solve(problem, "latency", gap=1e-9)
    a = solution.assignment
    assert a.block_unit == (GPU, GPU) and a.int8 == frozenset({0, 1}) and len(a.second) == 1
    assert solution.best == pytest.approx(4.0 + 1.0)
    graph, blocks = dag_graph([10**8, 10**8], [(0, 1)], [1 << 16] * 2)
    named = dataclasses.replace(problem, blocks=tuple(b.name for b in blocks.nodes), units=(
        Unit("a73", "cpu", 1, 0), Unit("mali", "gpu", 1, 0)))  # fmt: skip
    precision = PlanPrecision({t: (-1.0, 1.0) for t in graph.tensors}, "relerr", 0.008)
    plan = to_plan(dataclasses.replace(named, precision=precision), a, blocks, load_profile("khadas-vim3"),
                   Provenance("ilp"), "mixed")  # fmt: skip
    (only,) = [x for _, _, x in plan.assignments()]
    assert only.pu == "mali" and len(plan.int8) == 1 and len(plan.fp16) == 1
    assert set(plan.int8) | set(plan.fp16) == set(only.blocks)
    (int8_block,) = plan.int8
    assert plan.reduced_ms(int8_block, "malix1") == pytest.approx(1.0)
    assert plan.reduced_ms(plan.fp16[0], "malix1") == pytest.approx(4.0)


def test_no_budget_no_int8_and_a_loose_budget_takes_the_faster_int8() -> None:
    cost = {(b, u): 4.0 * 2 / UNITS[u].cores for b in range(2) for u in CPU_UNITS}
    int8 = {(b, u): v / 3 for (b, u), v in cost.items()}
    kwargs = dict(int8_cost=int8, sensitivity={0: 0.004, 1: 0.008}, busy_w={u: 1.0 for u in range(4)})
    strict = solve(toy_problem(UNITS, cost, [(0, 1)], accuracy_budget=0.0, **kwargs), "latency", gap=1e-9)
    assert strict.assignment.int8 == frozenset() and strict.best == pytest.approx(8.0)
    # 0.01 pays for block 1 (the larger loss) or block 0, not both: both save the same, ties go either way
    some = solve(toy_problem(UNITS, cost, [(0, 1)], accuracy_budget=0.01, **kwargs), "latency", gap=1e-9)
    assert len(some.assignment.int8) == 1 and some.best == pytest.approx(4.0 + 4.0 / 3)
    # a loss below the solver's feasibility tolerance (1e-7) still does not fit a budget of 0 (found by hypothesis)
    tiny = dict(kwargs, sensitivity={0: 0.0, 1: 5.8e-8})
    zero = solve(toy_problem(UNITS, cost, [(0, 1)], accuracy_budget=0.0, **tiny), "latency", gap=1e-9)
    assert zero.assignment.int8 == frozenset({0})
    # a loss within BUDGET_SLACK fits it, in the solver as in any check of its plan (found by hypothesis)
    slack = dict(kwargs, sensitivity={0: 0.0, 1: 1e-12})
    within = solve(toy_problem(UNITS, cost, [(0, 1)], accuracy_budget=0.0, **slack), "latency", gap=1e-9)
    assert within.assignment.int8 == frozenset({0, 1})
    loose = solve(toy_problem(UNITS, cost, [(0, 1)], accuracy_budget=0.05, **kwargs), "latency", gap=1e-9)
    assert loose.assignment.int8 == frozenset({0, 1}) and loose.best == pytest.approx(8.0 / 3)


def _googlenet(exported):
    loaded = load_onnx(exported("googlenet").path)
    graph = build_graph(loaded.proto, loaded.sha256, "googlenet")
    return graph, coarsen(graph, "coarse")


def _warm(problem: Problem, objective: str) -> Assignment:
    from planner.search import warm_candidates, warm_start

    return warm_start(problem, objective, warm_candidates(problem, objective)).assignment


@pytest.mark.zoo
@pytest.mark.parametrize("device", ["khadas-vim3", "bst-a1000"])
def test_units_that_compute_int8_only_receive_only_int8_validated_blocks(exported, device: str) -> None:
    graph, blocks = _googlenet(exported)
    cost = CostModel(load_profile(device), graph)
    int8_only = {p.name for p in cost.profile.pus if not p.computes("fp32")}
    assert int8_only, f"{device} has an NPU (or DSP) that computes int8 only"

    fp32 = build_problem(blocks, graph, cost)
    assert not fp32.int8_cost
    assert not any(fp32.units[u].pu in int8_only for _, u in fp32.cost), "an fp32 block offered to an NPU"
    # each solve starts from the objective's warm start: without one, a starved CPU could leave the solver no
    # incumbent within its limit (what is checked is where the solver may move blocks, not how fast it finds one)
    for objective in OBJECTIVES:
        a = solve(fp32, objective, time_limit=5, warm=_warm(fp32, objective)).assignment
        assert not any(fp32.units[u].pu in int8_only for u in a.block_unit)

    names = [b.name for b in blocks.nodes]
    validated = {name: 0.001 for name in names[::2]}  # every other block's int8 variant passed its check
    problem = build_problem(blocks, graph, cost, int8=Int8Choice(validated, budget=0.01))
    on_int8_only = {(b, u) for b, u in problem.int8_cost if problem.units[u].pu in int8_only}
    assert on_int8_only and {names[b] for b, _ in on_int8_only} <= set(validated)
    for objective in ("throughput", "energy"):
        a = solve(problem, objective, time_limit=10, warm=_warm(problem, objective)).assignment
        npu_blocks = {b for b, u in enumerate(a.block_unit) if problem.units[u].pu in int8_only}
        assert all(names[b] in validated and b in a.int8 for b in npu_blocks)
        assert sum(validated[names[b]] for b in a.int8) <= 0.01 + 1e-12


def test_a_solution_with_int8_blocks_is_not_written_as_a_plan_that_would_run_them_in_fp32() -> None:
    from planner.build import to_plan

    problem = toy_problem(UNITS[:1], {(0, 0): 1.0}, [], int8_cost={(0, 0): 0.5}, sensitivity={0: 0.0})
    with pytest.raises(PlanError, match="int8"):
        to_plan(problem, Assignment((0,), int8=frozenset({0})), None, None, None, "x")  # type: ignore[arg-type]


def test_int8_blocks_move_fewer_bytes_through_a_shared_memory() -> None:
    """Where the shared memory's row sets the period (its bandwidth is never taken below the whole fp32 model's
    time on one core), an int8 block moves its int8/fp32 time share of the bytes: int8 pays there too."""
    import dataclasses

    cost = {(b, u): 4.0 * 2 / UNITS[u].cores for b in range(2) for u in CPU_UNITS}
    int8 = {(b, u): v / 4 for (b, u), v in cost.items()}
    base = toy_problem(UNITS, cost, [(0, 1)], int8_cost=int8, sensitivity={0: 0.0, 1: 0.0}, accuracy_budget=0.0)
    shared = dataclasses.replace(base, shared_memories={"dram": ("cpu",)}, traffic={(0, "dram"): 8.0, (1, "dram"): 8.0})
    assert shared.traffic_share(0, 1, True) == pytest.approx(0.25) and shared.traffic_share(0, 1, False) == 1.0
    fp32 = dataclasses.replace(shared, int8_cost={}, sensitivity={})
    assert solve(fp32, "throughput", gap=1e-9).best == pytest.approx(16.0)  # the memory row: 8 + 8
    mixed = solve(shared, "throughput", gap=1e-9)
    assert mixed.assignment.int8 == frozenset({0, 1}) and mixed.best == pytest.approx(4.0)  # (8 + 8) / 4
    assert schedule(shared, mixed.assignment).period_ms == pytest.approx(mixed.best)


def test_one_int8_session_per_core_is_a_candidate_where_it_predicts_best(tmp_path) -> None:
    """Where int8 saves time on one core but not in a session spanning both (onnxruntime's int8 kernels scale
    worse over threads than its fp32 ones on some models), the throughput plan is the model in int8 on each core
    (replicas), not fp32 replicas, not one session over both cores, not a pipeline."""
    import numpy as np

    from models.precision import tensor_ranges
    from planner.plan import PlanPrecision
    from planner.search import SearchOptions, best_plan
    from tests.models.test_precision import SHAPE, _tiny_cnn

    tiny = load_onnx(_tiny_cnn(tmp_path / "tiny.onnx"))
    graph = build_graph(tiny.proto, tiny.sha256, "tiny")
    blocks = coarsen(graph, "fine")
    cost = CostModel(load_profile("local"), graph)
    if len(cost.profile.pu("cpu").cores) < 2:
        pytest.skip("needs a CPU cluster of at least two cores")
    rng = np.random.default_rng(0)
    frames = [{"x": rng.random(SHAPE, dtype=np.float32)} for _ in range(4)]
    names = [b.name for b in blocks.nodes]
    one_core = {(b.name, "cpu", 1): cost.block_ms(b.members, "cpu", 1) / 4 for b in blocks.nodes}
    spanning = {(b.name, "cpu", 2): cost.block_ms(b.members, "cpu", 2) for b in blocks.nodes}  # int8 gains nothing
    precision = PlanPrecision(tensor_ranges(tiny, frames), "relerr", 0.01, len(frames))
    choice = Int8Choice(dict.fromkeys(names, 0.001), 0.01, {**one_core, **spanning}, precision)
    problem = build_problem(blocks, graph, cost, 2, int8=choice)
    plan = best_plan(blocks, graph, cost, "throughput", SearchOptions(5, 2), problem=problem)

    assert [len(st.groups) for st in plan.stages] == [2], "one stage, one copy of the model per core"
    assert all(a.cores == 1 and set(a.blocks) == set(names) for _, _, a in plan.assignments())
    assert set(plan.int8) == set(names), "every block in int8: within the budget and faster on one core"
    assert plan.provenance.method == "heuristic:single-core+int8+replicated"
    fp32_replicas = sum(cost.block_ms(b.members, "cpu", 1) for b in blocks.nodes) / 2
    assert plan.predicted is not None and 1000.0 / plan.predicted.throughput_fps < fp32_replicas


@settings(max_examples=80, deadline=None)
@given(
    fp32=st.lists(st.floats(0.5, 10.0), min_size=2, max_size=5),
    speedup=st.lists(st.floats(1.0, 4.0), min_size=5, max_size=5),
    traffic=st.lists(st.floats(0.01, 10.0), min_size=5, max_size=5),
    int8=st.sets(st.integers(0, 4)),
)
def test_an_int8_mix_takes_the_share_of_the_memory_row_it_takes_of_the_time(fp32, speedup, traffic, int8) -> None:
    """The memory's row is measured as the whole fp32 model's period on all its cores at once, compute included:
    a mix that saves a share of the whole model's time on a unit takes that share off the row, however the
    bytes are spread over its blocks, in the ILP's schedule as in the row itself."""
    import dataclasses

    n = len(fp32)
    chosen = frozenset(b for b in int8 if b < n)
    cost = {(b, u): fp32[b] * 2 / UNITS[u].cores for b in range(n) for u in CPU_UNITS}
    q = {(b, u): v / speedup[b] for (b, u), v in cost.items()}
    base = toy_problem(UNITS[:3], cost, [(b, b + 1) for b in range(n - 1)], int8_cost=q)
    problem = dataclasses.replace(
        base, shared_memories={"dram": ("cpu",)}, traffic={(b, "dram"): traffic[b] for b in range(n)}
    )
    whole_traffic = sum(traffic[:n])
    for u in CPU_UNITS:
        whole = sum(cost[(b, u)] for b in range(n))
        row = sum(traffic[b] * problem.traffic_share(b, u, b in chosen) for b in range(n))
        mix = sum(q[(b, u)] if b in chosen else cost[(b, u)] for b in range(n))
        assert row == pytest.approx(whole_traffic * mix / whole, rel=1e-9)
        assert row > 0
        a = Assignment(tuple(u for _ in range(n)), int8=chosen)
        assert schedule(problem, a).loads[-1] == pytest.approx(row, rel=1e-9)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_every_block_runs_in_a_precision_its_units_pu_computes(data: st.DataObject) -> None:
    """On khadas-vim3 (CPUs fp32+int8, a GPU fp32+fp16, an NPU int8 only), with any blocks validated in int8 and
    in fp16 at any losses and times: every block of the plan runs in a precision its PU computes, fp16 only on
    the GPU (the unit that offers it), int8 only where int8 was validated, within the budget."""
    from planner.build import to_plan
    from planner.plan import PlanPrecision, Provenance
    from planner.search import SearchOptions, best_plan
    from tests.support.graphs import dag_graph

    n = data.draw(st.integers(2, 5), label="blocks")
    edges = sorted(
        {(i, j) for j in range(1, n) for i in data.draw(st.sets(st.integers(0, j - 1), min_size=1, max_size=2))}
    )
    flops = data.draw(st.lists(st.integers(10**7, 2 * 10**9), min_size=n, max_size=n), label="flops")
    graph, blocks = dag_graph(flops, edges, [1 << 16] * n)
    cost = CostModel(load_profile("khadas-vim3"), graph)
    names = [b.name for b in blocks.nodes]
    members = {b.name: b.members for b in blocks.nodes}
    loss = st.floats(0.0, 0.02)
    int8_ok = data.draw(st.dictionaries(st.sampled_from(names), loss), label="int8 sensitivity")
    fp16_ok = data.draw(st.dictionaries(st.sampled_from(names), loss), label="fp16 sensitivity")
    ms = {  # int8 times on the CPUs and on the GPU (whose profile lists int8 beside fp16)
        (b, pu.name, k): cost.block_ms(members[b], pu.name, k) * data.draw(st.floats(0.2, 1.5))
        for b in int8_ok
        for pu in cost.profile.pus
        if pu.kind in ("cpu", "gpu")
        for k in range(1, len(pu.cores) + 1 if pu.kind == "cpu" else 2)
    }
    half = {(b, "mali", 1): cost.block_ms(members[b], "mali", 1) * data.draw(st.floats(0.2, 1.5)) for b in fp16_ok}
    budget = data.draw(st.sampled_from([0.0, 0.01, 0.05]), label="budget")
    ranges = {t: (-1.0, 1.0) for t in graph.tensors}
    precision = PlanPrecision(ranges, "relerr", budget)
    problem = build_problem(blocks, graph, cost, int8=Int8Choice(int8_ok, budget, ms, precision, fp16_ok, half))
    assert {problem.units[u].pu for u in problem.fp16_units} == ({"mali"} if fp16_ok else set())
    objective = data.draw(st.sampled_from(OBJECTIVES), label="objective")
    # the whole search (warm starts, local search, the ILP, replicas) and the solver's own assignment alike
    searched = best_plan(blocks, graph, cost, objective, SearchOptions(1, 4), problem=problem)
    solved = solve(problem, objective, time_limit=5, warm=_warm(problem, objective)).assignment
    for made in (searched, to_plan(problem, solved, blocks, cost.profile, Provenance("ilp"), "p")):
        _check_precisions(made, graph, cost, int8_ok, fp16_ok, budget)


def _check_precisions(plan, graph, cost, int8_ok: dict, fp16_ok: dict, budget: float) -> None:  # type: ignore[no-untyped-def]
    from planner.plan import validate

    validate(plan, graph, cost.profile)  # every block on a PU that computes its precision, every range there
    for _, _, unit in plan.assignments():
        pu = cost.profile.pu(str(unit.pu))
        for b in unit.blocks:
            precision_of = plan.precision_of(b)
            assert pu.computes(precision_of), (b, precision_of, pu.name)
            assert precision_of != "fp16" or (pu.name == "mali" and b in fp16_ok)
            assert precision_of != "int8" or b in int8_ok
            assert pu.name != "npu" or precision_of == "int8"
            assert pu.kind != "cpu" or precision_of != "fp16", "a CPU without fp16 never gets fp16"
    spent = sum(int8_ok[b] for b in plan.int8) + sum(fp16_ok[b] for b in plan.fp16)
    assert spent <= budget + BUDGET_SLACK
    assert set(plan.fp16) <= set(fp16_ok) and not set(plan.fp16) & set(plan.int8)
