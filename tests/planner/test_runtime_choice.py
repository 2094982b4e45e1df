"""Several runtimes on one unit's hardware (``shares``: onnxruntime's CPU EP and OpenVINO on the same cores, CUDA
and TensorRT on one GPU): the planner plans each choice and keeps the best, and no plan ever counts the same cores
or the same device twice."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from device_profiles.loader import load_profile, parse_profile
from device_profiles.schema import ProfileError
from planner.baselines import flop_pipeline
from planner.costmodel import CostModel
from planner.plan import PlanError, validate
from planner.problem import build_problem
from planner.search import SearchOptions, baselines, best_plan, pareto_set
from tests.support.graphs import dag_graph

Q = {"source": "estimate", "cite": "test"}


def _pu(name: str, kind: str, cores: list[int], provider: str, gflops: float, **extra: object) -> dict:
    peaks = {c: {"value": gflops, **Q} for c in ("conv", "matmul", "depthwise", "elementwise", "pooling", "other")}
    return {
        "name": name,
        "kind": kind,
        "cores": cores,
        "execution_provider": provider,
        "peak_gflops": peaks,
        "memory_bandwidth_gbps": {"value": 20.0, **Q},
        "memory_bytes": {"value": 8e9, **Q},
        "launch_overhead_us": {"value": 5.0, **Q},
        "active_power_w": {"value": 4.0, **Q},
        "idle_power_w": {"value": 0.5, **Q},
        **extra,
    }


def _profile(ov_gflops: float = 40.0, trt_gflops: float = 300.0, pus: list[dict] | None = None):
    link = {"bandwidth_gbps": {"value": 8.0, **Q}, "latency_us": {"value": 20.0, **Q}}
    link["conversion_us_per_mb"] = {"value": 0.0, **Q}
    return parse_profile(
        {
            "schema_version": 1,
            "name": "two-runtimes",
            "pus": pus
            or [
                _pu("cpu", "cpu", [0, 1], "CPUExecutionProvider", 20.0),
                _pu("ov", "cpu", [0, 1], "OpenVINOExecutionProvider", ov_gflops, shares="cpu"),
                _pu("gpu", "gpu", [], "CUDAExecutionProvider", 150.0),
                _pu("trt", "gpu", [], "TensorrtExecutionProvider", trt_gflops, shares="gpu"),
            ],
            "default_link": {"a": "any", "b": "any", **link},
        }
    )


def _hardware_used(plan, profile) -> dict[str, set[str]]:
    used: dict[str, set[str]] = {}
    for _, _, a in plan.assignments():
        used.setdefault(profile.hardware(a.pu), set()).add(a.pu)
    return used


def test_a_unit_that_shares_hardware_must_match_it() -> None:
    base = _pu("cpu", "cpu", [0, 1], "CPUExecutionProvider", 20.0)
    with pytest.raises(ProfileError, match=r"pus\[1\]\.shares: 'nope' is no other PU"):
        _profile(pus=[base, _pu("ov", "cpu", [0, 1], "OpenVINOExecutionProvider", 40.0, shares="nope")])
    with pytest.raises(ProfileError, match=r"its host, kind and cores are cpu's"):
        _profile(pus=[base, _pu("ov", "cpu", [1], "OpenVINOExecutionProvider", 40.0, shares="cpu")])
    chain = [base, _pu("ov", "cpu", [0, 1], "OpenVINOExecutionProvider", 40.0, shares="cpu")]
    with pytest.raises(ProfileError, match=r"ov itself shares cpu's hardware"):
        _profile(pus=[*chain, _pu("ov2", "cpu", [0, 1], "OpenVINOExecutionProvider", 40.0, shares="ov")])
    # without shares, two PUs on the same cores are refused as before
    with pytest.raises(ProfileError, match="core 0 on host"):
        _profile(pus=[base, _pu("ov", "cpu", [0, 1], "OpenVINOExecutionProvider", 40.0)])


def test_choices_idle_power_and_shipped_profiles() -> None:
    profile = _profile()
    assert profile.runtime_choices() == [("cpu", "gpu"), ("cpu", "trt"), ("ov", "gpu"), ("ov", "trt")]
    assert profile.idle_w() == pytest.approx(1.0)  # the cores once and the GPU once, not four units' worth
    assert load_profile("local-openvino").runtime_choices() == [("cpu",), ("ov",)]
    ultra = load_profile("intel-core-ultra")
    assert [c for c in ultra.runtime_choices() if "p-ov" in c] == [("p-ov", "ecores", "igpu", "npu")]
    assert load_profile("local").runtime_choices() == [tuple(p.name for p in load_profile("local").pus)]


def test_no_one_problem_counts_shared_cores_twice() -> None:
    op, blocks = dag_graph([10**7] * 4, [(0, 1), (1, 2), (2, 3)], [4096] * 4)
    with pytest.raises(PlanError, match="several runtimes on one unit's hardware"):
        build_problem(blocks, op, CostModel(_profile(), op), 2)


def test_a_plan_that_uses_more_cores_than_the_hardware_has_is_refused() -> None:
    op, blocks = dag_graph([10**7] * 4, [(0, 1), (1, 2), (2, 3)], [4096] * 4)
    profile = _profile()
    both = flop_pipeline(blocks, profile, [("cpu", 2), ("ov", 1)])
    with pytest.raises(PlanError, match=r"also used by|leaves"):
        validate(both, op, profile)
    gpu_twice = flop_pipeline(blocks, profile, [("gpu", 1), ("trt", 1)])
    with pytest.raises(PlanError, match="is also used by"):
        validate(gpu_twice, op, profile)


@st.composite
def _dags(draw):
    n = draw(st.integers(3, 6))
    flops = draw(st.lists(st.integers(10**6, 10**8), min_size=n, max_size=n))
    edges = [(i, i + 1) for i in range(n - 1)]
    for j in range(2, n):
        if draw(st.booleans()):
            edges.append((draw(st.integers(0, j - 2)), j))
    nbytes = draw(st.lists(st.sampled_from([1024, 65536, 1 << 20]), min_size=n, max_size=n))
    return dag_graph(flops, sorted(set(edges)), nbytes)


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    dag=_dags(),
    ov=st.sampled_from([5.0, 20.0, 80.0]),
    trt=st.sampled_from([50.0, 600.0]),
    objective=st.sampled_from(["latency", "throughput"]),
)
def test_the_plan_is_the_best_choice_and_uses_one_runtime_per_hardware(dag, ov, trt, objective) -> None:
    op, blocks = dag
    profile = _profile(ov, trt)
    cost = CostModel(profile, op)
    search = SearchOptions(time_limit=0.3)
    plan = best_plan(blocks, op, cost, objective, search, frames=0)
    validate(plan, op, profile)  # on the full profile: no core and no device used twice
    used = _hardware_used(plan, profile)
    assert all(len(names) == 1 for names in used.values()), used
    # the best of the choices: no choice planned alone predicts better (same solver, same limit)
    alone = [best_plan(blocks, op, c, objective, search, frames=0) for c in cost.runtime_choices()]
    figure = (lambda p: p.predicted.latency_ms) if objective == "latency" else (lambda p: -p.predicted.throughput_fps)
    assert figure(plan) <= min(figure(p) for p in alone) + 1e-9
    # baselines and the Pareto set stay inside one choice too
    for p in [*baselines(blocks, op, cost, 2, frames=0).values(), *pareto_set(blocks, op, cost, search)]:
        assert all(len(names) == 1 for names in _hardware_used(p, profile).values()), p.name
        validate(dataclasses.replace(p), op, profile)
