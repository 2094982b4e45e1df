"""Costs that matter on real SoCs, in all three views of the execution model (ILP, analytic, simulator):
activation memory, the host CPU time of feeding an accelerator, and bandwidth of a memory PUs share."""

from __future__ import annotations

import pytest

from device_profiles.schema import OP_CLASSES, DeviceProfile, Host, Link, ProcessingUnit, Quantity
from planner.build import to_plan
from planner.costmodel import CostModel
from planner.ilp import Assignment, fits, solve
from planner.plan import ACTIVATION_FRAMES, PlanError, Provenance, memory_use, validate
from planner.problem import build_problem
from tests.planner.test_execution_model import _graph


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
    return _graph([flops] * n, [(i, i + 1) for i in range(n - 1)], [nbytes] * n)


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
