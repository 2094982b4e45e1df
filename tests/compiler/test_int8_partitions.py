"""The compiler builds a plan's int8 blocks in int8 inside their partitions, from the ranges the plan embeds.

A tiny CNN in three blocks over two one-core partitions of ``local``: for every choice of int8 blocks, the
partitions holding an int8 block (and only those) carry QuantizeLinear/DequantizeLinear, every partition
still reads and returns fp32, and the chained partitions compute what the same mix assembled as one model
computes (what the planner measures a mix by), up to where a cut puts its boundary Q/DQ. ``validate`` refuses an fp32 block on an int8-only NPU and an
int8 node without a calibration range.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compiler import compile_plan, run_chained
from device_profiles.loader import load_profile
from models.graph import build_graph
from models.onnx_io import LoadedModel, load_onnx
from models.precision import INT8_METHOD, assemble, check_precision, qdq_nodes, tensor_ranges, write_ranges
from planner.build import evaluate
from planner.costmodel import CostModel
from planner.plan import Assignment, Plan, PlanError, PlanPrecision, Provenance, Stage, plan_from_json, validate
from tests.models.test_precision import GROUPS, SHAPE, _tiny_cnn


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    return load_onnx(_tiny_cnn(tmp_path_factory.mktemp("int8") / "tiny.onnx"))


@pytest.fixture(scope="module")
def ranges(tiny: LoadedModel) -> dict[str, tuple[float, float]]:
    rng = np.random.default_rng(1)
    return tensor_ranges(tiny, [{"x": rng.random(SHAPE, dtype=np.float32)} for _ in range(8)])


def _plan(tiny: LoadedModel, int8: tuple[str, ...], ranges, device: str = "local", pus=("cpu", "cpu")) -> Plan:
    graph = build_graph(tiny.proto, tiny.sha256)
    profile = load_profile(device)
    first = Stage(((Assignment(pus[0], 1, ("head",)),),))
    second = Stage(((Assignment(pus[1], 1, ("middle", "tail")),),))
    return Plan(
        model_sha256=graph.model_sha256,
        model_name="tiny",
        device=profile.name,
        device_sha256=profile.content_hash(),
        granularity="custom",
        blocks=dict(GROUPS),
        stages=(first, second),
        provenance=Provenance("hand"),
        name="tiny-int8",
        int8=int8,
        precision=PlanPrecision(ranges, "relerr", 0.05, 8, method=INT8_METHOD) if int8 else None,
    )


SUBSETS = [s for k in range(4) for s in itertools.combinations(GROUPS, k)]


@pytest.mark.parametrize("int8", SUBSETS, ids=lambda s: "+".join(s) or "fp32")
def test_every_mix_compiles_to_qdq_exactly_where_blocks_are_int8(tiny, ranges, int8, tmp_path: Path) -> None:
    graph = build_graph(tiny.proto, tiny.sha256)
    plan = _plan(tiny, int8, ranges)
    compiled = compile_plan(plan, tiny, graph, load_profile("local"))
    by_name = {p.name: p for p in compiled.manifest.partitions}
    assert len(by_name) == 2
    for p in by_name.values():
        data = compiled.files[p.file]
        blocks = {b for b, ms in GROUPS.items() if set(ms) & {n.name for n in onnx.load_from_string(data).graph.node}}
        assert (qdq_nodes(data) > 0) == bool(blocks & set(int8)), (p.name, blocks)
        model = onnx.load_from_string(data)
        for v in [*model.graph.input, *model.graph.output]:
            assert v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT, "partitions exchange fp32 tensors"
    if not int8:
        assert compiled.precision is None and compiled.max_abs_diff <= 1e-5
        return
    assert compiled.precision is not None and compiled.precision.metric == "relerr"
    # the chained partitions compute the mix the planner measures (one model, same ranges)
    one = assemble(tiny, write_ranges(ranges, tmp_path / "r.json"), int8_nodes=[m for b in int8 for m in GROUPS[b]])
    rng = np.random.default_rng(2)
    frames = [{"x": rng.random(SHAPE, dtype=np.float32)} for _ in range(4)]
    chained = [run_chained(compiled.manifest, compiled.files, f) for f in frames]
    # a cut through an int8 region puts a DequantizeLinear/QuantizeLinear pair on the boundary that one
    # session may place differently: the same mix, not always the same rounding
    same = check_precision(one.run(frames), chained, "relerr", 0.01)
    assert same.ok, same.describe()
    assert check_precision(_fp32(tiny, frames), chained, "relerr", plan.precision.budget).ok


def test_precisions_and_ranges_are_checked_against_the_board_and_the_model(tiny, ranges) -> None:
    graph = build_graph(tiny.proto, tiny.sha256)
    vim3 = load_profile("khadas-vim3")
    npu = next(p.name for p in vim3.pus if not p.computes("fp32"))
    cpu = next(p.name for p in vim3.pus if p.kind == "cpu")
    validate(_plan(tiny, ("head",), ranges, "khadas-vim3", (npu, cpu)), graph, vim3)  # int8 on the NPU: fine
    with pytest.raises(
        PlanError, match=rf"^stages\[0\]\.groups\[0\]\[0\]: block 'head' runs in fp32, which PU '{npu}'"
    ):
        validate(_plan(tiny, ("middle",), ranges, "khadas-vim3", (npu, cpu)), graph, vim3)
    partial = {t: r for t, r in ranges.items() if t != "r1"}  # conv2 reads r1
    plan = _plan(tiny, ("middle",), partial)
    with pytest.raises(PlanError, match=r"^precision\.ranges: no calibration range for tensor 'r1'"):
        validate(plan, graph, load_profile("local"))
    data = json.loads(json.dumps(plan.to_json()))
    data["precision"] = None
    with pytest.raises(PlanError, match=r"^precision: the plan runs 1 block\(s\) in int8"):
        plan_from_json(data)


def _fp32(tiny: LoadedModel, frames: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    import onnxruntime as ort

    s = ort.InferenceSession(tiny.ort_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return [{"logits": s.run(["logits"], f)[0]} for f in frames]


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(SUBSETS[1:]), st.lists(st.floats(0.0, 2.0), min_size=3, max_size=3))
def test_a_mixed_plan_is_priced_at_its_int8_times(tiny, ranges, int8, ratios) -> None:
    """Whatever the int8 times, the prediction is finite and positive, and int8 blocks faster than fp32 never
    make the plan slower (nor slower ones faster) than the same placement in fp32."""
    graph = build_graph(tiny.proto, tiny.sha256)
    cost = CostModel(load_profile("local"), graph)
    fp32 = evaluate(_plan(tiny, (), ranges), graph, cost, frames=0)
    plan = _plan(tiny, int8, ranges)
    times = {b: {"cpux1": cost.block_ms(GROUPS[b], "cpu", 1) * r} for b, r in zip(GROUPS, ratios, strict=True)}
    assert plan.precision is not None
    plan = dataclasses.replace(plan, precision=dataclasses.replace(plan.precision, int8_ms={b: times[b] for b in int8}))
    mixed = evaluate(plan, graph, cost, frames=20)
    assert mixed.predicted is not None and fp32.predicted is not None and mixed.simulated is not None
    assert 0 < mixed.predicted.latency_ms < float("inf") and mixed.predicted.throughput_fps > 0
    faster = all(ratios[list(GROUPS).index(b)] <= 1.0 for b in int8)
    slower = all(ratios[list(GROUPS).index(b)] >= 1.0 for b in int8)
    if faster:
        assert mixed.predicted.latency_ms <= fp32.predicted.latency_ms * (1 + 1e-9)
    if slower:
        assert mixed.predicted.latency_ms >= fp32.predicted.latency_ms * (1 - 1e-9)


def test_a_gpu_partition_holding_int8_and_fp16_blocks_compiles_and_runs_within_its_budget(tiny, ranges) -> None:
    """jetson-orin-nano's Ampere GPU computes fp32, fp16 and int8: one partition on it with the head in int8, the
    middle in fp16 and the tail in fp32 is quantised, then converted (its Q/DQ kept fp32), reads and returns fp32, and
    computes what fp32 does within the plan's budget."""
    from models.precision import fp16_nodes

    graph = build_graph(tiny.proto, tiny.sha256)
    jetson = load_profile("jetson-orin-nano")
    gpu = jetson.pu("ampere")
    assert {"fp32", "fp16", "int8"} <= set(gpu.precision_set.values)
    plan = dataclasses.replace(
        _plan(tiny, ("head",), ranges, "jetson-orin-nano", ("ampere", "ampere")),
        stages=(Stage(((Assignment("ampere", 1, ("head", "middle", "tail")),),)),),
        fp16=("middle",),
    )
    compiled = compile_plan(plan, tiny, graph, jetson)
    (only,) = compiled.manifest.partitions
    data = compiled.files[only.file]
    assert qdq_nodes(data) > 0 and fp16_nodes(data) > 0, "the head quantised and the middle converted, both"
    model = onnx.load_from_string(data)
    for v in [*model.graph.input, *model.graph.output]:
        assert v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert compiled.precision is not None  # checked by the plan's metric (on generated frames here)
    rng = np.random.default_rng(5)  # frames like the calibration ones
    frames = [{"x": rng.random(SHAPE, dtype=np.float32)} for _ in range(4)]
    chained = [run_chained(compiled.manifest, compiled.files, f) for f in frames]
    check = check_precision(_fp32(tiny, frames), chained, "relerr", plan.precision.budget)
    assert check.ok, check.describe()
