"""Costs that matter on real SoCs, in all three views of the execution model (ILP, analytic, simulator):
activation memory, the host CPU time of feeding an accelerator, and bandwidth of a memory PUs share."""

from __future__ import annotations

import dataclasses

import pytest

from device_profiles.schema import (
    OP_CLASSES,
    DeviceProfile,
    Host,
    Link,
    NetworkLink,
    ProcessingUnit,
    Quantity,
    SharedMemory,
)
from planner.build import evaluate, to_plan
from planner.costmodel import CostModel
from planner.ilp import solve
from planner.plan import ACTIVATION_FRAMES, PlanError, Provenance, memory_use, validate
from planner.problem import build_problem
from planner.timing import Assignment, fits, schedule
from tests.support.graphs import dag_graph


def _q(value: float) -> Quantity:
    return Quantity(float(value), "estimate", "test")


def _pu(name: str, kind: str, cores: tuple[int, ...], gflops: float, memory: float, **extra) -> ProcessingUnit:
    return ProcessingUnit(
        name=name,
        kind=kind,
        host="board",
        cores=cores,
        execution_provider="CPUExecutionProvider",
        ep_options=(),
        peak_gflops={k: _q(gflops) for k in OP_CLASSES},
        memory_bandwidth_gbps=_q(8.0),
        memory_bytes=_q(memory),
        launch_overhead_us=_q(10.0),
        active_power_w=_q(2.0),
        idle_power_w=_q(0.1),
        **extra,
    )


def _board(*pus: ProcessingUnit, **extra) -> DeviceProfile:
    link = Link("*", "*", _q(4.0), _q(20.0), _q(0.0))
    return DeviceProfile("soc", "test board", (Host("board"),), pus, (), (), link, **extra)


def _chain(n: int, flops: int, nbytes: int):
    return dag_graph([flops] * n, [(i, i + 1) for i in range(n - 1)], [nbytes] * n)


def test_activations_count_in_the_memory_constraint() -> None:
    """An NPU a hundred times faster whose memory holds the weights but not the activations: no plan uses it."""
    graph, blocks = _chain(3, 200_000_000, 1_000_000)
    weights = sum(n.param_bytes for n in graph.nodes)
    board = _board(_pu("cpu", "cpu", (0, 1), 10.0, 4e9), _pu("npu", "npu", (), 1000.0, 1.5e6))
    assert weights < 1.5e6 < ACTIVATION_FRAMES * 1_000_000, "the weights alone would fit the NPU"
    cost = CostModel(board, graph)
    problem = build_problem(blocks, graph, cost, 4)
    npu = next(u for u, x in enumerate(problem.units) if x.pu == "npu")
    on_npu = Assignment((npu,) * len(problem.blocks))
    assert not fits(problem, on_npu)
    for objective in ("latency", "throughput", "energy"):
        solution = solve(problem, objective, time_limit=20, warm=on_npu)
        assert npu not in solution.assignment.block_unit, objective
        plan = to_plan(problem, solution.assignment, blocks, board, Provenance("ilp"), "p")
        validate(plan, graph, board)
    plan = to_plan(problem, on_npu, blocks, board, Provenance("hand"), "all-npu")
    assert memory_use(plan, graph)["npu"] == weights + ACTIVATION_FRAMES * 3 * 1_000_000
    with pytest.raises(PlanError, match="'npu' would hold"):
        validate(plan, graph, board)


def _views(board: DeviceProfile, graph, blocks, pus: tuple[str, ...]):
    """(ILP schedule, analytic, simulated) figures of the plan that runs block i on the first unit of pus[i]."""
    cost = CostModel(board, graph)
    problem = build_problem(blocks, graph, cost, 4)
    assignment = Assignment(tuple(next(u for u, x in enumerate(problem.units) if x.pu == p) for p in pus))
    plan = evaluate(to_plan(problem, assignment, blocks, board, Provenance("hand"), "p"), graph, cost)
    return schedule(problem, assignment), plan.predicted, plan.simulated


def test_host_cpu_time_feeding_an_accelerator_in_all_three_views() -> None:
    """Handing a tensor to the GPU costs the host 3 ms: the frame waits for it (latency), the handoff carries
    it (its period load) and one host core's busy power is paid for it, in the ILP's model, the analytic
    prediction and the simulation alike."""
    graph, blocks = dag_graph([20_000_000, 200_000_000, 200_000_000], [(0, 1), (1, 2)], [100_000] * 3)
    gpu = _pu("gpu", "gpu", (), 100.0, 4e9, host_cpu_us_per_tensor=_q(3000.0))
    fed = _board(_pu("cpu", "cpu", (0, 1), 10.0, 4e9), gpu)
    free = _board(_pu("cpu", "cpu", (0, 1), 10.0, 4e9), dataclasses.replace(gpu, host_cpu_us_per_tensor=_q(0.0)))
    split = ("cpu", "gpu", "gpu")  # one tensor crosses into the GPU
    (f1, a1, s1), (f0, a0, s0) = _views(fed, graph, blocks, split), _views(free, graph, blocks, split)
    feed_mj = 3.0 * (2.0 - 0.1) / 2  # one of the two host cores, busy above idle
    for one, zero in ((f1, f0), (a1, a0), (s1, s0)):
        assert one.latency_ms - zero.latency_ms == pytest.approx(3.0, rel=0.01)
        assert one.energy_mj - zero.energy_mj == pytest.approx(feed_mj, rel=0.02)
    assert f1.energy_mj == pytest.approx(a1.energy_mj, rel=0.01)
    assert 1000 / f1.period_ms == pytest.approx(a1.throughput_fps, rel=0.01)
    assert s1.throughput_fps == pytest.approx(a1.throughput_fps, rel=0.02)


def test_feeding_cost_decides_whether_pipelining_into_an_accelerator_pays() -> None:
    """CPU then GPU pipelines more frames than either alone while handing a tensor over is free; when it
    costs the host 40 ms per tensor, the best plan keeps the model on one PU."""
    graph, blocks = _chain(2, 200_000_000, 100_000)
    cpu = _pu("cpu", "cpu", (0, 1), 10.0, 4e9)
    for feed_us, both in ((0.0, True), (40_000.0, False)):
        board = _board(cpu, _pu("gpu", "gpu", (), 12.0, 4e9, host_cpu_us_per_tensor=_q(feed_us)))
        cost = CostModel(board, graph)
        problem = build_problem(blocks, graph, cost, 4)
        solution = solve(problem, "throughput", time_limit=20, gap=1e-6)
        pus = {problem.units[u].pu for u in solution.assignment.block_unit}
        assert (pus == {"cpu", "gpu"}) == both, (feed_us, pus)
        plan = evaluate(to_plan(problem, solution.assignment, blocks, board, Provenance("ilp"), "p"), graph, cost)
        assert 1000 / solution.value == pytest.approx(plan.predicted.throughput_fps, rel=0.01)
        assert plan.simulated.throughput_fps == pytest.approx(plan.predicted.throughput_fps, rel=0.02)


def _cpu_units(problem, cores: int) -> list[int]:
    return [u for u, x in enumerate(problem.units) if x.pu == "cpu" and x.cores == cores]


def test_shared_memory_bandwidth_stops_rewarding_one_core_units() -> None:
    """Memory-bound blocks on a 4-core cluster: without a shared memory, four one-core units each get the full
    bandwidth and pipeline four times the frames of one 4-core unit. Sharing it, they gain nothing."""
    graph, blocks = _chain(4, 1_000_000, 4_000_000)  # ~1 MFLOP moving ~8 MB per block
    # no launch overhead: else a split overlaps one unit's launches with another's memory traffic (~1% here)
    cpu = dataclasses.replace(_pu("cpu", "cpu", (0, 1, 2, 3), 400.0, 4e9), launch_overhead_us=_q(0.0))
    for shared in (False, True):
        memories = (SharedMemory("dram", ("cpu",), _q(8.0)),) if shared else ()
        board = _board(cpu, memories=memories)
        cost = CostModel(board, graph)
        problem = build_problem(blocks, graph, cost, 4)
        whole = Assignment((_cpu_units(problem, 4)[0],) * 4)
        split = Assignment(tuple(_cpu_units(problem, 1)[:4]))
        plans = {
            name: evaluate(to_plan(problem, a, blocks, board, Provenance("hand"), name), graph, cost)
            for name, a in (("whole", whole), ("split", split))
        }
        for name, a in (("whole", whole), ("split", split)):  # the three views agree on both plans
            p = plans[name]
            assert 1000 / schedule(problem, a).period_ms == pytest.approx(p.predicted.throughput_fps, rel=0.01)
            assert p.simulated.throughput_fps == pytest.approx(p.predicted.throughput_fps, rel=0.02)
        gain = plans["split"].predicted.throughput_fps / plans["whole"].predicted.throughput_fps
        solution = solve(problem, "throughput", time_limit=20, gap=1e-6)
        if not shared:
            assert gain > 3.5  # the reward the roofline used to give
            assert solution.value < schedule(problem, whole).period_ms * 0.5
        else:
            assert gain == pytest.approx(1.0, rel=0.01)
            # the best any split reaches is what one 4-core unit reaches: memory, not cores, sets the period
            assert solution.value == pytest.approx(schedule(problem, whole).period_ms, rel=0.01)
            traffic = sum(problem.traffic[(b, "dram")] for b in range(4))
            assert solution.value == pytest.approx(traffic, rel=0.01)


def _edge_cloud(cpu_us_per_message: float | None, cpu_us_per_mb: float | None) -> DeviceProfile:
    """Two one-core hosts joined by a network whose gRPC costs each end CPU time."""
    edge = dataclasses.replace(_pu("edge", "cpu", (0,), 10.0, 4e9), host="edge")
    cloud = dataclasses.replace(_pu("cloud", "cpu", (1,), 10.0, 4e9), host="cloud")
    net = NetworkLink(
        "edge",
        "cloud",
        _q(1.0),
        _q(100.0),
        _q(0.0),
        _q(cpu_us_per_message) if cpu_us_per_message is not None else None,
        _q(cpu_us_per_mb) if cpu_us_per_mb is not None else None,
    )
    return DeviceProfile("edge-cloud", "two hosts", (Host("edge"), Host("cloud")), (edge, cloud), (), (net,))


def test_grpc_cpu_time_on_both_ends_in_all_three_views() -> None:
    """A tensor sent between hosts costs the sender and the receiver CPU time (per message and per MB): the
    edge-cloud split's period and latency carry it in the ILP, the analytic model and the simulator alike."""
    graph, blocks = _chain(4, 100_000_000, 2_000_000)
    per_end = (300.0 + 1500.0 * 2.0) / 1e3  # ms: one message of 2 MB
    figures = {}
    for fields in ((None, None), (300.0, 1500.0)):
        board = _edge_cloud(*fields)
        cost = CostModel(board, graph)
        problem = build_problem(blocks, graph, cost, 4)
        edge, cloud = (next(u for u, x in enumerate(problem.units) if x.pu == p) for p in ("edge", "cloud"))
        split = Assignment((edge, edge, cloud, cloud))
        plan = evaluate(to_plan(problem, split, blocks, board, Provenance("hand"), "split"), graph, cost)
        f = schedule(problem, split)
        assert 1000 / f.period_ms == pytest.approx(plan.predicted.throughput_fps, rel=0.01)
        assert f.latency_ms == pytest.approx(plan.predicted.latency_ms, rel=0.01)
        assert f.energy_mj == pytest.approx(plan.predicted.energy_mj, rel=0.01)
        assert plan.simulated.throughput_fps == pytest.approx(plan.predicted.throughput_fps, rel=0.02)
        for objective in ("latency", "throughput", "energy"):
            solution = solve(problem, objective, time_limit=20, gap=1e-6)
            best = schedule(problem, solution.assignment)
            assert solution.value == pytest.approx(best.value(objective), rel=0.01), objective
        figures[fields] = f
    plain, grpc = figures[(None, None)], figures[(300.0, 1500.0)]
    assert grpc.latency_ms - plain.latency_ms == pytest.approx(2 * per_end)  # sender, then receiver
    assert grpc.period_ms - plain.period_ms == pytest.approx(per_end)  # each host's unit carries one end


def test_a_calibrated_bandwidth_never_slows_one_unit_alone_below_its_measured_time() -> None:
    """A bandwidth fitted to units running at once is floored where one unit alone showed the memory moves a
    frame's bytes faster: the whole model measured on both cores alone took T, so no plan waits longer than T a
    frame for the memory. The one-unit plan then runs at its measured time, not at the fitted bandwidth's pace
    (``local``, bert_small: 88.8 fps predicted for a plan measured at 93-106), and a split over two one-core
    units is as slow as the memory lets it be: T a frame."""
    from profiler.costtable import Conditions, CostEntry

    graph, blocks = _chain(4, 200_000_000, 1_000_000)
    cpu = dataclasses.replace(_pu("cpu", "cpu", (0, 1), 100.0, 4e9), launch_overhead_us=_q(0.0))
    board = _board(cpu, memories=(SharedMemory("dram", ("cpu",), _q(100.0)),))
    plain = CostModel(board, graph)
    every = tuple(n.name for n in graph.nodes)
    measured_ms = plain.group_ms(every, "cpu", 2).ms * 1.1  # both cores alone, as measured: a bit off the estimate
    cond = Conditions(board.name, "cpu", 2, 2, "CPUExecutionProvider", "x", "all")
    whole = CostEntry("k", "partition", graph.model_sha256, "whole", every, cond, measured_ms, measured_ms, 0, 0, 9)
    frame_bytes = plain.moved_bytes(every)
    fitted = frame_bytes / (1.6 * measured_ms * 1e6)  # as if units at once were 1.6x slower than that
    calibration = dataclasses.replace(plain.calibration, fused={(("cpu", 2), frozenset(every)): whole})
    cost = plain.recalibrated(calibration.with_memory("dram", fitted))
    assert cost.memory_gbps("dram") == pytest.approx(frame_bytes / (measured_ms * 1e6))
    problem = build_problem(blocks, graph, cost, 2)
    one, split = (
        Assignment(tuple(_cpu_units(problem, 2)[:1] * 4)),
        Assignment(tuple(_cpu_units(problem, 1)[:1] * 2 + _cpu_units(problem, 1)[1:2] * 2)),
    )
    for assignment in (one, split):
        plan = evaluate(to_plan(problem, assignment, blocks, board, Provenance("hand"), "p"), graph, cost)
        assert 1000 / plan.predicted.throughput_fps == pytest.approx(measured_ms, rel=0.01)
        assert 1000 / schedule(problem, assignment).period_ms == pytest.approx(plan.predicted.throughput_fps, rel=0.01)
        assert plan.simulated.throughput_fps == pytest.approx(plan.predicted.throughput_fps, rel=0.02)


def test_a_calibrated_memory_bandwidth_replaces_the_profiles_in_all_three_views() -> None:
    """The bandwidth ``parapipe profile`` measures for a model (its units running at once) or ``tune`` fits is a
    calibration value: it replaces the profile's figure in the traffic the ILP, the analytic model and the
    simulator charge, so a split over one-core units is predicted as slow as the memory lets it be."""
    graph, blocks = _chain(4, 200_000_000, 1_000_000)  # compute-bound: the profile's memory never binds
    cpu = dataclasses.replace(_pu("cpu", "cpu", (0, 1), 100.0, 4e9), launch_overhead_us=_q(0.0))
    board = _board(cpu, memories=(SharedMemory("dram", ("cpu",), _q(100.0)),))
    plain = CostModel(board, graph)
    problem = build_problem(blocks, graph, plain, 2)
    split = Assignment(tuple(_cpu_units(problem, 1)[:1] * 2 + _cpu_units(problem, 1)[1:2] * 2))
    free = evaluate(to_plan(problem, split, blocks, board, Provenance("hand"), "split"), graph, plain)
    frame_bytes = plain.moved_bytes([n.name for n in graph.nodes])
    slowed_to_ms = 1000 / free.predicted.throughput_fps * 1.6  # as if each core ran 1.6x slower beside the other
    gbps = frame_bytes / (slowed_to_ms * 1e6)
    contended = plain.recalibrated(plain.calibration.with_memory("dram", gbps))
    assert contended.memory_gbps("dram") == pytest.approx(gbps) and plain.memory_gbps("dram") == 100.0
    problem = build_problem(blocks, graph, contended, 2)
    plan = evaluate(to_plan(problem, split, blocks, board, Provenance("hand"), "split"), graph, contended)
    assert 1000 / plan.predicted.throughput_fps == pytest.approx(slowed_to_ms, rel=0.01)
    assert 1000 / schedule(problem, split).period_ms == pytest.approx(plan.predicted.throughput_fps, rel=0.01)
    assert plan.simulated.throughput_fps == pytest.approx(plan.predicted.throughput_fps, rel=0.02)
    assert plan.predicted.latency_ms == pytest.approx(free.predicted.latency_ms), "latency sees no contention"
