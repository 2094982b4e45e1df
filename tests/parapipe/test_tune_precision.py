"""``parapipe tune`` on precision plans: what it measures of int8 / fp16 partitions lands on entries of that
precision, never on the fp32 ones every fp32 plan (and the fits) read, and the fed-back times are what the
cost model then prices those partitions at.

A tiny CNN keeps this fast; the measurements are made up (what an agent would report), the functions that
take them are the real ones.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import onnxruntime as ort
import pytest

from device_profiles.loader import load_profile
from models.coarsen import coarsen
from models.graph import OpGraph, build_graph
from models.onnx_io import load_onnx
from parapipe.records import Figures, PartitionMeasurement
from parapipe.run import RunResult
from parapipe.tune import feed_back, recalibrate, table_errors
from planner.build import evaluate, priced
from planner.costmodel import CostModel
from planner.plan import Assignment, Plan, PlanPrecision, Provenance, Stage
from planner.segments import lower, segment_precision
from profiler.costtable import CostTable
from tests.models.test_precision import _tiny_cnn


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[OpGraph, OpGraph]:
    loaded = load_onnx(_tiny_cnn(tmp_path_factory.mktemp("tune-precision") / "tiny.onnx"))
    graph = build_graph(loaded.proto, loaded.sha256, "tiny")
    return graph, coarsen(graph, "fine")


def _plans(graph: OpGraph, blocks: OpGraph) -> tuple[Plan, Plan]:
    """The same placement twice: all fp32, and with the first unit's blocks all in int8 and one of the
    second unit's (a mix)."""
    names = [b.name for b in blocks.nodes]  # b000_conv1, b001_conv2, pool, flatten, fc
    stage = Stage(((Assignment("cpu", 1, tuple(names[:2]), (0,)), Assignment("cpu", 1, tuple(names[2:]), (1,))),))
    fp32 = Plan(
        model_sha256=graph.model_sha256,
        model_name="tiny",
        device="local",
        device_sha256="",
        granularity="fine",
        blocks={b.name: b.members for b in blocks.nodes},
        stages=(stage,),
        provenance=Provenance(),
        name="fp32",
    )
    int8 = ("b000_conv1", "b001_conv2", "fc")
    cost = CostModel(load_profile("local"), graph)
    times = {b: {"cpux1": cost.block_ms(fp32.blocks[b], "cpu", 1) / 2} for b in int8}
    mixed = dataclasses.replace(fp32, name="int8", int8=int8, precision=PlanPrecision({}, int8_ms=times))
    return fp32, mixed


def _measured(plan: Plan, graph: OpGraph, per_frame: dict[str, float]) -> RunResult:
    segments = lower(plan, graph, load_profile("local"))
    parts = tuple(
        PartitionMeasurement(
            s.name, str(s.pu), per_frame[s.name] * 20, 0.0, 20, per_frame[s.name] * 5, 5
        )  # the same time one at a time and back to back
        for s in segments
    )
    figures = Figures(latency_ms=sum(per_frame.values()), throughput_fps=1000 / max(per_frame.values()), energy_mj=0)
    return RunResult(plan.name, "local", "", figures, None, {}, "modelled", None, parts, 0, precision="int8")


def test_a_precision_plans_partitions_are_fed_back_in_their_precision_never_as_fp32(tiny) -> None:
    graph, blocks = tiny
    profile = load_profile("local")
    fp32, mixed = _plans(graph, blocks)
    segments = lower(mixed, graph, profile)
    labels = {s.name: segment_precision(mixed, s, profile) for s in segments}
    assert sorted(labels.values()) == ["int8", "int8:fc"], labels
    assert all(segment_precision(fp32, s, profile) == "fp32" for s in lower(fp32, graph, profile))

    table = CostTable()
    before = CostModel.from_table(profile, graph, table)
    fp32_before = evaluate(fp32, graph, before, frames=0).predicted
    per_frame = {s.name: 0.25 + 0.5 * i for i, s in enumerate(segments)}  # far from what the roofline says
    run = _measured(mixed, graph, per_frame)
    assert feed_back(table, mixed, run, graph, profile, ort.__version__) == len(segments)
    fed = {e.name.removeprefix("run:"): e for e in table}
    assert {n: e.conditions.precision for n, e in fed.items()} == labels
    assert not table.select(precision="fp32"), "nothing measured in int8 is an fp32 entry"

    after = CostModel.from_table(profile, graph, table)
    # fp32 plans (and every fit) read fp32 measurements only: the fp32 plan of the same placement is priced as before
    assert evaluate(fp32, graph, after, frames=0).predicted == fp32_before
    # the precision plan's partitions are priced at what they measured, in their mix
    model = priced(mixed, graph, after)
    for s in model.segments:
        assert model.ms[s.key] == pytest.approx(per_frame[s.name]), s.name
    # another mix of the same nodes is not that measurement
    other = dataclasses.replace(mixed, int8=("b000_conv1", "b001_conv2"))
    model = priced(other, graph, after)
    tail = next(s for s in model.segments if "fc" in s.blocks)
    assert segment_precision(other, tail, profile) == "fp32"
    assert model.ms[tail.key] == pytest.approx(after.group_ms(tail.members, "cpu", 1).ms)


def test_tune_keeps_a_recalibration_that_predicts_a_precision_plan_it_measured(tiny) -> None:
    """The fits and the kept-calibration rule evaluate a precision plan with its measured partitions: figures
    that agree with them are predicted within 1% once fed back, and the fp32 entries stay as they were."""
    graph, blocks = tiny
    profile = load_profile("local")
    _, mixed = _plans(graph, blocks)
    table = CostTable()
    segments = lower(mixed, graph, profile)
    per_frame = {s.name: 2.0 + i for i, s in enumerate(segments)}
    run = _measured(mixed, graph, per_frame)
    scratch = CostTable()
    feed_back(scratch, mixed, run, graph, profile, ort.__version__)
    agreed = evaluate(mixed, graph, CostModel.from_table(profile, graph, scratch), frames=0).predicted
    assert agreed is not None
    consistent = dataclasses.replace(
        run,
        measured=dataclasses.replace(run.measured, latency_ms=agreed.latency_ms, throughput_fps=agreed.throughput_fps),
    )
    verdict, _, _ = recalibrate(table, [(mixed, consistent)], [(mixed, consistent)], graph, profile, ort.__version__)
    assert verdict.kept and verdict.rmspe_after < 1 < verdict.rmspe_before
    assert table_errors(table, [(mixed, consistent)], graph, profile)[2] < 1
    assert all(e.conditions.precision != "fp32" for e in table)


def test_segment_precision_on_a_pu_of_one_precision_is_what_the_profiler_measured_there() -> None:
    """On an NPU (int8 only) the cost model's figure is the one the profiler measured there, under the default
    label: a partition measured there refines it."""
    profile = load_profile("khadas-vim3")
    npu = next(p for p in profile.pus if not p.computes("fp32"))
    from planner.segments import Segment
    from planner.unitname import UnitName

    plan = Plan(
        model_sha256="x",
        model_name="x",
        device=profile.name,
        device_sha256="",
        granularity="fine",
        blocks={"a": ("a",)},
        stages=(Stage(((Assignment(npu.name, 1, ("a",)),),)),),
        provenance=Provenance(),
        int8=("a",),
        precision=PlanPrecision({}),
    )
    seg = Segment(0, 0, 0, 0, UnitName(npu.name), 1, (), ("a",), ("a",))
    assert segment_precision(plan, seg, profile) == "fp32"


def test_recosted_int8_and_fp16_times_keep_their_ratio_to_the_recalibrated_fp32_figure(tiny) -> None:
    """tune's later rounds: accuracy stays as measured, each reduced-precision time follows its block's fp32 figure
    as a new cost table prices it (here: the block measured twice as slow as the roofline said)."""
    from parapipe.precision_auto import Auto, PrecisionRequest
    from profiler.costtable import Conditions, CostEntry, entry_key

    graph, blocks = tiny
    profile = load_profile("khadas-vim3")
    before = CostModel(profile, graph)
    block = blocks.nodes[0]
    table = CostTable()
    cond = Conditions(profile.name, "a73", 1, 1, "CPUExecutionProvider", ort.__version__, "all")
    slow = 2 * before.block_ms(block.members, "a73", 1)
    table.add(
        CostEntry(entry_key(graph.model_sha256, "block", block.members, cond), "block", graph.model_sha256,
                  block.name, block.members, cond, slow, slow, slow, slow, 5)
    )  # fmt: skip
    after = CostModel.from_table(profile, graph, table)
    assert after.block_ms(block.members, "a73", 1) == pytest.approx(slow)
    ms = {(block.name, "a73", 1): 0.3, (block.name, "a53", 1): 0.4}
    half = {(block.name, "mali", 1): 0.2}
    auto = Auto(None, graph, PrecisionRequest(Path("x"), 0.01, "relerr"), [], [], {}, {block.name: 0.001}, {},
                ms, [], {block.name: 0.0}, {}, half, {})  # type: ignore[arg-type]  # fmt: skip
    moved = auto.recosted(before, after, blocks)
    assert moved.ms[(block.name, "a73", 1)] == pytest.approx(0.6), "twice the fp32 figure: twice the int8 time"
    assert moved.ms[(block.name, "a53", 1)] == pytest.approx(0.4) and moved.fp16_ms == half, "the rest as it was"
    assert moved.sensitivity == auto.sensitivity and moved.fp16_sensitivity == auto.fp16_sensitivity
