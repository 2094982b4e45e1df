"""The simulator agrees with the analytic prediction and with what pipelining and replication must give."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from device_profiles.loader import load_profile
from models.coarsen import coarsen
from models.graph import build_graph
from models.onnx_io import load_onnx
from planner.baselines import flop_pipeline, single_pu
from planner.costmodel import CostModel
from planner.plan import Assignment, Plan, PlanError, Stage, load_plan, plan_from_json, validate
from planner.simulate import PlanModel, _whole_cycles, analytic, simulate


@pytest.fixture(scope="module")
def googlenet(exported):
    loaded = load_onnx(exported("googlenet").path)
    graph = build_graph(loaded.proto, loaded.sha256, "googlenet")
    return graph, coarsen(graph, "coarse")


def _figures(plan: Plan, graph, profile):
    validate(plan, graph, profile)
    model = PlanModel(plan, graph, CostModel(profile, graph))
    return model, analytic(model), simulate(model, 120)


def test_single_pu_plan_analytic_equals_simulated(googlenet) -> None:
    graph, blocks = googlenet
    vim3 = load_profile("khadas-vim3")
    model, a, s = _figures(single_pu(blocks, vim3, "a73", 4), graph, vim3)
    total = sum(model.ms.values())
    assert a.latency_ms == pytest.approx(total)
    assert a.throughput_fps == pytest.approx(1000 / total)
    assert s.latency_p50_ms == pytest.approx(a.latency_ms, rel=1e-6)
    assert s.throughput_fps == pytest.approx(a.throughput_fps, rel=1e-3)
    assert s.energy_mj == pytest.approx(a.energy_mj, rel=0.02)


def test_pipeline_throughput_is_set_by_the_slowest_stage(googlenet) -> None:
    graph, blocks = googlenet
    vim3 = load_profile("khadas-vim3")
    model, a, s = _figures(flop_pipeline(blocks, vim3, [("a73", 4), ("a53", 2)]), graph, vim3)
    stage_ms: dict[int, float] = {}
    for seg in model.segments:  # a stage's unit runs its partitions one after another
        stage_ms[seg.stage] = stage_ms.get(seg.stage, 0.0) + model.ms[seg.key]
    assert len(stage_ms) == 2
    stage_ms = list(stage_ms.values())
    assert a.throughput_fps == pytest.approx(1000 / max(stage_ms), rel=0.05)
    assert s.throughput_fps == pytest.approx(a.throughput_fps, rel=0.03)
    # the second stage starts on the branches the first hands over early (their partitions end there),
    # so one frame takes less than the two stages back to back, and more than either
    assert max(stage_ms) < a.latency_ms < sum(stage_ms)


def test_replication_takes_alternate_frames(googlenet) -> None:
    graph, blocks = googlenet
    vim3 = load_profile("khadas-vim3")
    one = single_pu(blocks, vim3, "a73", 4)
    all_blocks = one.stages[0].groups[0][0].blocks
    replicated = Plan(
        **{
            **one.__dict__,
            "stages": (Stage(((Assignment("a73", 4, all_blocks),), (Assignment("a53", 2, all_blocks),))),),
            "name": "replicated",
        }
    )
    _, _a1, s1 = _figures(one, graph, vim3)
    model, a2, s2 = _figures(replicated, graph, vim3)
    ms = {seg.pu: model.ms[seg.key] for seg in model.segments}
    # alternate frames: the pair finishes two frames per max(a73, a53) time
    assert s2.throughput_fps == pytest.approx(2000 / max(ms["a53"], ms["a73"]), rel=0.05)
    assert a2.throughput_fps == pytest.approx(s2.throughput_fps, rel=0.05)
    # strict round-robin: a replica four times slower makes the pair slower than the fast PU alone
    assert s2.throughput_fps < s1.throughput_fps


def test_equal_replicas_double_throughput(googlenet) -> None:
    import tomllib

    from device_profiles.loader import SHIPPED_DIR, parse_profile

    graph, blocks = googlenet
    data = tomllib.loads((SHIPPED_DIR / "khadas-vim3.toml").read_text())
    twin = dict(data["pus"][0], name="a73b", cores=[6, 7, 8, 9])
    data["pus"].append(twin)
    data["links"].append(
        {"a": "a73", "b": "a73b", **{k: data["links"][0][k] for k in ("bandwidth_gbps", "latency_us")}}
    )
    data["default_link"] = {"a": "*", "b": "*", **{k: data["links"][0][k] for k in ("bandwidth_gbps", "latency_us")}}
    twins = parse_profile(data)
    one = single_pu(blocks, twins, "a73", 4)
    all_blocks = one.stages[0].groups[0][0].blocks
    pair = Plan(
        **{
            **one.__dict__,
            "stages": (Stage(((Assignment("a73", 4, all_blocks),), (Assignment("a73b", 4, all_blocks),))),),
        }
    )
    _, a1, s1 = _figures(one, graph, twins)
    _, a2, s2 = _figures(pair, graph, twins)
    assert s2.throughput_fps == pytest.approx(2 * s1.throughput_fps, rel=0.02)
    assert a2.throughput_fps == pytest.approx(2 * a1.throughput_fps, rel=0.02)
    assert s2.latency_p50_ms == pytest.approx(s1.latency_p50_ms, rel=0.02)


def test_energy_is_labelled_modelled(googlenet) -> None:
    graph, blocks = googlenet
    local = load_profile("local")
    _, a, s = _figures(single_pu(blocks, local, "cpu", 1), graph, local)
    assert a.energy_source == "modelled" and s.predicted().energy_source == "modelled"


def test_plan_json_round_trip_and_hand_written_errors(googlenet, tmp_path: Path) -> None:
    graph, blocks = googlenet
    vim3 = load_profile("khadas-vim3")
    plan = flop_pipeline(blocks, vim3, [("a73", 4), ("a53", 2)])
    path = plan.save(tmp_path / "plan.json")
    again = load_plan(path)
    assert again == plan
    data = json.loads(path.read_text())

    broken = json.loads(json.dumps(data))
    del broken["stages"]
    with pytest.raises(PlanError, match="stages: missing field"):
        plan_from_json(broken)
    broken = json.loads(json.dumps(data))
    broken["stages"][0]["groups"][0][0]["pu"] = "tpu"
    with pytest.raises(PlanError, match=r"stages\[0\].groups\[0\]\[0\].pu: unknown PU 'tpu'"):
        validate(plan_from_json(broken), graph, vim3)
    broken = json.loads(json.dumps(data))
    broken["model_sha256"] = "0" * 64
    with pytest.raises(PlanError, match="model_sha256"):
        validate(plan_from_json(broken), graph, vim3)
    broken = json.loads(json.dumps(data))  # swap the stages: data flows backwards
    broken["stages"] = broken["stages"][::-1]
    with pytest.raises(PlanError, match="later stage"):
        validate(plan_from_json(broken), graph, vim3)
    broken = json.loads(json.dumps(data))
    broken["stages"][0]["groups"][0][0]["cores"] = 9
    with pytest.raises(PlanError, match="has 4 core"):
        validate(plan_from_json(broken), graph, vim3)
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(PlanError, match="not a readable JSON plan"):
        load_plan(tmp_path / "bad.json")


def test_unsupported_op_on_npu_is_refused(googlenet) -> None:
    graph, blocks = googlenet
    bst = load_profile("bst-a1000")
    npu = bst.pu("npu")
    if all(npu.supports(t) for n in graph.nodes for t in n.op_types):
        pytest.skip("the NPU supports every op of this model")
    with pytest.raises(PlanError, match="does not support"):
        validate(single_pu(blocks, bst, "npu", 1), graph, bst)


def test_a_learnt_handoff_delays_latency_but_occupies_no_link(googlenet) -> None:
    graph, blocks = googlenet
    vim3 = load_profile("khadas-vim3")
    plan = flop_pipeline(blocks, vim3, [("a73", 4), ("a53", 2)])
    cost = CostModel(vim3, graph)
    before = analytic(PlanModel(plan, graph, cost))
    cost = cost.recalibrated(cost.calibration.with_handoff(5.0))
    after = analytic(PlanModel(plan, graph, cost))
    hops = sum(1 for f in PlanModel(plan, graph, cost).frame_flows(0).values() if f[1] != f[2])
    assert hops >= 1
    # every path from input to output crosses from the first stage to the second once
    assert after.latency_ms == pytest.approx(before.latency_ms + 5.0, rel=1e-6)
    assert after.throughput_fps == pytest.approx(before.throughput_fps, rel=1e-9)


def test_a_handoff_between_two_units_of_one_pu_is_delayed_and_within_one_unit_is_not(googlenet) -> None:
    """Two units (threads) on the cores of one cluster wake each other per tensor like units on two PUs; a
    partition handing on to a later partition of its own unit (one thread) does not."""
    graph, blocks = googlenet
    vim3 = load_profile("khadas-vim3")
    plain = CostModel(vim3, graph)
    delayed = plain.recalibrated(plain.calibration.with_handoff(5.0))
    two_units = flop_pipeline(blocks, vim3, [("a73", 2), ("a73", 2)])
    one_unit = flop_pipeline(blocks, vim3, [("a73", 2)])
    assert len(two_units.stages) == 2 and len(one_unit.stages) == 1
    for plan, added in ((two_units, 5.0), (one_unit, 0.0)):
        before, after = analytic(PlanModel(plan, graph, plain)), analytic(PlanModel(plan, graph, delayed))
        assert after.latency_ms == pytest.approx(before.latency_ms + added, rel=1e-6), plan.name
        assert after.throughput_fps == pytest.approx(before.throughput_fps, rel=1e-9)


def test_a_frame_overhead_delays_a_pipelined_frame_not_a_frame_run_in_the_callers_thread(googlenet) -> None:
    """What a frame alone spends in a pipeline of several partitions outside their runs (``tune``'s frame
    overhead) is in its latency, analytic and simulated, and not in the throughput (it holds no unit); a plan of
    one partition on one host runs a frame in the caller's thread (``Pipeline.infer_inline``) and pays none."""
    graph, blocks = googlenet
    vim3 = load_profile("khadas-vim3")
    plain = CostModel(vim3, graph)
    slow = plain.recalibrated(plain.calibration.with_frame_overhead(0.7))
    pipeline = flop_pipeline(blocks, vim3, [("a73", 4), ("a53", 2)])
    alone = single_pu(blocks, vim3, "a73", 4)
    assert len(PlanModel(alone, graph, plain).segments) == 1 < len(PlanModel(pipeline, graph, plain).segments)
    for plan, added in ((pipeline, 0.7), (alone, 0.0)):
        before, after = PlanModel(plan, graph, plain), PlanModel(plan, graph, slow)
        assert after.frame_ms == added
        a, b = analytic(before), analytic(after)
        assert b.latency_ms == pytest.approx(a.latency_ms + added, rel=1e-9), plan.name
        assert b.throughput_fps == pytest.approx(a.throughput_fps, rel=1e-9)
        s, t = simulate(before, 120), simulate(after, 120)
        assert t.throughput_fps == pytest.approx(s.throughput_fps, rel=1e-9)
        assert t.latency_p50_ms == pytest.approx(s.latency_p50_ms + added, rel=1e-6)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.floats(0.0, 5.0), min_size=1, max_size=6),
    st.lists(st.floats(0.0, 5.0), max_size=8),
    st.integers(2, 12),
    st.floats(0.0, 1000.0),
)
def test_a_steady_rate_is_measured_over_whole_cycles(
    cycle: list[float], settling: list[float], repeats: int, t0: float
) -> None:
    """A steady state that repeats every few frames (two leave close together, then a long gap) is measured over
    whole cycles of it, wherever the stretch starts and ends: its rate is the cycle's (a stretch cut anywhere
    counted a burst too many: the simulator put a plan at 1.020x the busiest unit's bound over 40 frames), and
    frames still settling before it are left out."""
    assume(sum(cycle) > 0.01)
    gaps = settling + cycle * repeats + cycle[: len(cycle) // 2]
    assume(len(settling) <= len(gaps) // 2 and len(gaps) - len(gaps) // 2 >= 2 * len(cycle))  # half shows 2 cycles
    leave = [t0]
    for g in gaps:
        leave.append(leave[-1] + g)
    k = _whole_cycles(leave)
    assert 1 <= k <= len(gaps)
    ends = cycle[len(cycle) // 2 :] + cycle[: len(cycle) // 2]  # the cycle as the stretch ends it
    assert (leave[-1] - leave[-1 - k]) / k == pytest.approx(sum(ends) / len(ends), rel=1e-6)
    # without a cycle (a unit still settling, every interval a little shorter) the stretch is kept whole
    assert _whole_cycles([t0 + i * 2.0 - 0.001 * i * i for i in range(20)]) == 19
