"""One execution model: the ILP's value of a plan, the analytic prediction of the lowered plan and the
discrete-event simulation agree, on random DAGs and random boards, and lowering respects every dependency.

The DAGs are operator graphs made in memory (no ONNX): chains, fork/join, nested branches, skip
connections. The boards: one or two CPU clusters of 1-8 cores and up to three accelerators (with or
without host CPU time per tensor), clusters CFS-throttled or not, with links whose latency, bandwidth and
conversion cost make transfers matter, and with or without one DRAM all PUs share.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from device_profiles.schema import (
    OP_CLASSES,
    DeviceProfile,
    Host,
    Link,
    ProcessingUnit,
    Quantity,
    SharedMemory,
    Throttle,
)
from models.graph import OpGraph
from planner.build import analytic, evaluate, frame_overhead_ms, priced, to_plan
from planner.costmodel import CostModel, Fit
from planner.heuristics import _unit_sets
from planner.ilp import solve
from planner.plan import Plan, Provenance, validate
from planner.problem import build_problem
from planner.segments import block_edges, lower
from planner.simulate import MIN_SIM_FRAMES, _steady, simulate
from planner.timing import Assignment, schedule
from tests.support.graphs import dag_graph


def _q(value: float) -> Quantity:
    return Quantity(float(value), "estimate", "test")


@st.composite
def dags(draw) -> tuple[list[int], list[tuple[int, int]]]:
    """(FLOPs per node, edges i -> j with i < j): every node but the first reads an earlier one."""
    shape = draw(st.sampled_from(["chain", "fork-join", "nested", "skip", "random"]))
    edges: set[tuple[int, int]] = set()
    if shape == "chain":
        n = draw(st.integers(2, 7))
        edges = {(i, i + 1) for i in range(n - 1)}
    elif shape == "fork-join":  # 0 -> k branches of 1-2 nodes -> join
        widths = draw(st.lists(st.integers(1, 2), min_size=2, max_size=3))
        n, ends = 1, []
        for w in widths:
            prev = 0
            for _ in range(w):
                edges.add((prev, n))
                prev, n = n, n + 1
            ends.append(prev)
        edges |= {(e, n) for e in ends}
        n += 1
    elif shape == "nested":  # 0 -> (1 -> (2, 3) -> 4), 5 -> 6
        edges = {(0, 1), (1, 2), (1, 3), (2, 4), (3, 4), (0, 5), (4, 6), (5, 6)}
        n = 7
    elif shape == "skip":  # a residual chain: i -> i+1 and i -> i+2
        n = draw(st.integers(3, 7))
        edges = {(i, i + 1) for i in range(n - 1)} | {(i, i + 2) for i in range(0, n - 2, 2)}
    else:
        n = draw(st.integers(2, 7))
        for j in range(1, n):
            for i in draw(st.sets(st.integers(max(0, j - 3), j - 1), min_size=1, max_size=2)):
                edges.add((i, j))
    flops = draw(st.lists(st.integers(5, 400), min_size=n, max_size=n))
    return [f * 1_000_000 for f in flops], sorted(edges)


@st.composite
def boards(draw) -> DeviceProfile:
    pus = []
    core = 0
    for c in range(draw(st.integers(1, 2))):
        cores = draw(st.integers(1, 8 if c == 0 else 4))
        pus.append(
            ProcessingUnit(
                name=f"cpu{c}",
                kind="cpu",
                host="board",
                cores=tuple(range(core, core + cores)),
                execution_provider="CPUExecutionProvider",
                ep_options=(),
                peak_gflops={k: _q(draw(st.floats(2.0, 30.0)) * cores) for k in OP_CLASSES},
                memory_bandwidth_gbps=_q(8.0),
                memory_bytes=_q(4e9),
                launch_overhead_us=_q(draw(st.floats(0.0, 200.0))),
                active_power_w=_q(draw(st.floats(0.5, 4.0))),
                idle_power_w=_q(draw(st.floats(0.0, 0.3))),
                # a CFS-throttled cluster: full speed alone, its quota's share of the core back to back
                throttle=draw(st.none() | st.sampled_from([Throttle(25.0), Throttle(40.0), Throttle(70.0)])),
            )
        )
        core += cores
    for a in range(draw(st.integers(0, 5 - len(pus) if len(pus) < 4 else 0))):
        pus.append(
            ProcessingUnit(
                name=f"acc{a}",
                kind=draw(st.sampled_from(["gpu", "npu"])),
                host="board",
                cores=(),
                execution_provider="CPUExecutionProvider",
                ep_options=(),
                peak_gflops={k: _q(draw(st.floats(5.0, 200.0))) for k in OP_CLASSES},
                memory_bandwidth_gbps=_q(8.0),
                memory_bytes=_q(4e9),
                launch_overhead_us=_q(draw(st.floats(0.0, 500.0))),
                active_power_w=_q(draw(st.floats(0.5, 4.0))),
                idle_power_w=_q(draw(st.floats(0.0, 0.3))),
                # host CPU time per tensor in or out: none, or charged to the accelerator's unit
                host_cpu_us_per_tensor=_q(draw(st.sampled_from([0.0, 0.0, 80.0, 600.0]))),
            )
        )
    link = Link(
        "*",
        "*",
        bandwidth_gbps=_q(draw(st.floats(0.2, 10.0))),
        latency_us=_q(draw(st.floats(0.0, 500.0))),
        conversion_us_per_mb=_q(draw(st.floats(0.0, 2000.0))),
    )
    memories = ()
    if draw(st.booleans()):  # every PU on one DRAM whose bandwidth their traffic shares
        memories = (SharedMemory("dram", tuple(p.name for p in pus), _q(draw(st.floats(0.5, 20.0)))),)
    return DeviceProfile("random", "random board", (Host("board"),), tuple(pus), (), (), link, memories=memories)


@st.composite
def cases(draw):
    flops, edges = draw(dags())
    nbytes = draw(st.lists(st.integers(1_000, 2_000_000), min_size=len(flops), max_size=len(flops)))
    # (alpha, beta ms, the run overhead in a pipeline ms)
    calibration = draw(st.none() | st.tuples(st.floats(0.7, 1.6), st.floats(0.0, 1.0), st.sampled_from([0.0, 0.3])))
    objective = draw(st.sampled_from(["latency", "throughput", "energy"]))
    handoff = draw(st.sampled_from([0.0, 0.0, 0.4, 3.0]))  # the handoff delay tune learns between PUs (ms)
    # and what a frame alone spends in a pipeline of several partitions outside their runs (ms)
    frame = draw(st.sampled_from([0.0, 0.0, 0.5]))
    board = draw(boards())
    # a throttled PU's sustained factor as tune fits it back to back, above the CFS share a frame alone sees
    slower = draw(st.sampled_from([1.0, 1.0, 1.4]))
    return dag_graph(flops, edges, nbytes), (board, slower), objective, calibration, (handoff, frame)


def _cost(profile_and_slower: tuple[DeviceProfile, float], graph: OpGraph) -> CostModel:
    """The case's cost model: a throttled PU's sustained factor ``slower`` x its CFS share where that is not 1."""
    profile, slower = profile_and_slower
    cost = CostModel(profile, graph)
    if slower != 1.0:
        calibration = cost.calibration
        for p in profile.pus:
            if p.throttle is not None:
                calibration = calibration.with_sustained(p.name, slower * 100.0 / p.throttle.quota_percent)
        cost = cost.recalibrated(calibration)
    return cost


def _calibrate(cost: CostModel, alpha: float, beta: float, run: float = 0.0) -> CostModel:
    """What ``parapipe tune`` learns on a board: partition = alpha * sum(blocks) + beta, for every config, and
    every partition's run overhead in a pipeline."""
    calibration = cost.calibration
    for p in cost.profile.pus:
        calibration = calibration.with_run_overhead(p.name, run)
        for k in range(1, len(p.cores) + 1) if p.kind == "cpu" else (1,):
            calibration = calibration.with_fit((p.name, k), Fit({}, 0.0, 1.0, alpha, beta, 3))
    return cost.recalibrated(calibration)


def _check_partitions(plan: Plan, graph: OpGraph, profile: DeviceProfile) -> None:
    """Every dependency is respected: inside a partition blocks run in data-flow order, a later block takes
    inputs from outside only from partitions its first block waits for already (so the partition waits for
    nothing it does not need at its start); between partitions the dependencies form no cycle."""
    segments = lower(plan, graph, profile)
    seg_of = {b: s.key for s in segments for b in s.blocks}
    assert sorted(seg_of) == sorted(plan.blocks), "every block in exactly one partition"
    first = {s.key: s.blocks[0] for s in segments}
    position = {s.key: {b: i for i, b in enumerate(s.blocks)} for s in segments}
    after: dict[tuple, set[tuple]] = {s.key: set() for s in segments}
    edges = block_edges(plan, graph)
    at_start = {s.key: {seg_of[a] for a, b in edges if b == s.blocks[0]} for s in segments}
    for a, b in edges:
        if seg_of[a] == seg_of[b]:
            assert position[seg_of[a]][a] < position[seg_of[a]][b], "a block runs after its inputs"
        else:
            assert first[seg_of[b]] == b or seg_of[a] in at_start[seg_of[b]], f"{b} waits for {a} mid-partition"
            after[seg_of[a]].add(seg_of[b])
    state: dict[tuple, int] = {}

    def visit(k: tuple) -> None:
        assert state.get(k) != 1, "the partitions of a frame form a cycle"
        if state.get(k) == 2:
            return
        state[k] = 1
        for nxt in after[k]:
            visit(nxt)
        state[k] = 2

    for k in after:
        visit(k)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(cases())
def test_solver_analytic_and_simulation_are_one_model(case) -> None:
    (graph, blocks), profile, objective, calibration, (handoff, frame) = case
    cost = _cost(profile, graph)
    if calibration is not None:
        cost = _calibrate(cost, *calibration)
    cost = cost.recalibrated(cost.calibration.with_handoff(handoff).with_frame_overhead(frame))
    problem = build_problem(blocks, graph, cost, 4)
    solution = solve(problem, objective, time_limit=20, gap=1e-6)
    assert solution.status == "optimal"
    plan = to_plan(problem, solution.assignment, blocks, cost.profile, Provenance("ilp"), "p")
    validate(plan, graph, cost.profile)
    _check_partitions(plan, graph, cost.profile)
    plan = evaluate(plan, graph, cost, frames=240)
    predicted, simulated = plan.predicted, plan.simulated
    figures = schedule(problem, solution.assignment)
    # the ILP's latency leaves out the frame overhead of a plan of several partitions (the same for all of them)
    overhead = frame_overhead_ms(plan, graph, cost)
    if len(lower(plan, graph, cost.profile)) > 1:
        assert overhead == frame
    # the ILP's model of the plan it returns: the same partitions, overheads, order and transfers
    assert 1000.0 / figures.period_ms == pytest.approx(predicted.throughput_fps, rel=0.01)
    assert figures.energy_mj == pytest.approx(predicted.energy_mj, rel=0.01)
    assert simulated.throughput_fps <= predicted.throughput_fps * 1.02
    if handoff == 0:  # a handoff delay many periods long can make the window of in-flight frames the limit
        assert simulated.throughput_fps == pytest.approx(predicted.throughput_fps, rel=0.02)
    assert figures.latency_ms + overhead == pytest.approx(predicted.latency_ms, rel=0.01)
    # the analytic period is the busiest unit, link or memory: no run of the plan is faster
    assert simulated.throughput_fps <= predicted.throughput_fps * 1.02
    if handoff == 0:
        # a handoff delay several times the period can make the executor's window of in-flight frames, not a
        # unit or link, set the simulated throughput; the analytic figure has no window. Balanced plans reach
        # it too: units take frames by frame + lag (``profiler.modulo``), not oldest first
        assert simulated.throughput_fps == pytest.approx(predicted.throughput_fps, rel=0.02)
    if calibration is not None and (calibration[1] > 0 or calibration[2] > 0):
        # the solver counts partitions (for their overhead) from a lower bound: it may only be optimistic
        value = {"latency": predicted.latency_ms - overhead, "throughput": 1000 / predicted.throughput_fps}
        assert solution.value <= value.get(objective, predicted.energy_mj) * (1 + 1e-6)
        return
    if objective == "throughput":
        assert 1000.0 / solution.value == pytest.approx(predicted.throughput_fps, rel=0.01)
    elif objective == "energy":
        assert solution.value == pytest.approx(predicted.energy_mj, rel=0.01)
    else:
        assert solution.value + overhead == pytest.approx(predicted.latency_ms, rel=0.01)


@st.composite
def placed(draw):
    """A case with a plan the solver did not choose: each block on a random unit of one way to cut the board,
    the units running their blocks in a random order that respects the data flow (mostly not the
    topological one)."""
    (graph, blocks), profile, _, calibration, (handoff, frame) = draw(cases())
    cost = _cost(profile, graph)
    if calibration is not None:
        cost = _calibrate(cost, *calibration)
    cost = cost.recalibrated(cost.calibration.with_handoff(handoff).with_frame_overhead(frame))
    problem = build_problem(blocks, graph, cost, 4)
    units = draw(st.sampled_from(_unit_sets(problem)))
    unit_of = tuple(
        draw(st.sampled_from([u for u in units if (b, u) in problem.cost])) for b in range(len(problem.blocks))
    )
    waiting = {b: {i for i, j, _ in problem.edges if j == b} for b in range(len(problem.blocks))}
    order: list[int] = []
    while len(order) < len(problem.blocks):
        ready = sorted(b for b, ps in waiting.items() if b not in order and ps <= set(order))
        order.append(draw(st.sampled_from(ready)))
    return graph, blocks, cost, problem, Assignment(unit_of, tuple(order)), handoff


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(placed())
def test_schedule_is_the_lowered_plan_for_any_placement_and_order(case) -> None:
    """``schedule`` (the ILP's model of one assignment) and the analytic prediction of its lowered plan are one
    model for every placement and every per-unit order, not just the ones the solver picks: the same latency
    (transfers of one frame overlap; each consumer gets its tensor when it has crossed), period and energy; and
    the simulator, its units taking frames by frame + lag, runs it at the analytic throughput."""
    graph, blocks, cost, problem, assignment, handoff = case
    plan = to_plan(problem, assignment, blocks, cost.profile, Provenance("hand"), "p")
    _check_partitions(plan, graph, cost.profile)
    evaluated = evaluate(plan, graph, cost, frames=240)
    predicted, simulated = evaluated.predicted, evaluated.simulated
    figures = schedule(problem, assignment)
    assert figures.latency_ms + frame_overhead_ms(plan, graph, cost) == pytest.approx(predicted.latency_ms, rel=0.01)
    assert 1000.0 / figures.period_ms == pytest.approx(predicted.throughput_fps, rel=0.01)
    assert figures.energy_mj == pytest.approx(predicted.energy_mj, rel=0.01)
    assert simulated.throughput_fps <= predicted.throughput_fps * 1.02
    if handoff == 0:  # a handoff delay many periods long can make the window of in-flight frames the limit
        assert simulated.throughput_fps == pytest.approx(predicted.throughput_fps, rel=0.02)
    # the simulator may run fewer frames in flight than the executor's window where they already reach the
    # bound on throughput (checked above): the plan run with its whole window goes no faster, but where its
    # measured stretch comes out above the bound itself
    # (where that run misses the bound, the simulator runs it once more, twice as long, and takes that: the
    # longer run may come out a little lower, the plan's own limit, and is as much the plan's answer)
    model = priced(plan, graph, cost)
    whole = _steady(model, 240, model.max_inflight())[5]
    longer = _steady(model, 2 * 240, model.max_inflight())[5]
    assert simulated.throughput_fps >= min(whole, longer, predicted.throughput_fps) * (1 - 0.002)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(placed(), st.sampled_from([MIN_SIM_FRAMES, 60, 240]))
def test_a_short_simulation_reports_the_steady_state_not_its_fill_or_drain(case, frames: int) -> None:
    """However few frames the simulation is asked for, the rate it reports is the steady state's: frames that
    queued while the window filled leave in a burst faster than any steady rate, and a short run whose measured
    stretch catches that burst must not be taken for the plan's throughput (yolo_det's energy plan on
    khadas-vim3 ran at 1.038x its bound over 100 frames at 50 in flight). So: never above the analytic bound
    (the busiest unit, link or memory), and with no handoff delay (which can make the window the limit) that
    bound within 2% over 240 frames, 5% over fewer. (With a trial window's rate taken up to 2x above the bound, 300 examples find a plan
    reported at 1.034x.)"""
    graph, blocks, cost, problem, assignment, handoff = case
    plan = to_plan(problem, assignment, blocks, cost.profile, Provenance("hand"), "p")
    model = priced(plan, graph, cost)
    bound = analytic(model).throughput_fps
    short = simulate(model, frames).throughput_fps
    assert short <= bound * 1.02
    if handoff == 0:
        # a short run may end before its measured stretch is all steady state: one 40-frame run of a plan read
        # 1614 fps against a bound of 1664 (3% under; its 240-frame run met it), so short runs get 5%
        assert short == pytest.approx(bound, rel=0.02 if frames >= 240 else 0.05)
