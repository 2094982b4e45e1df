"""Precision variants: int8/fp16 variants chain with fp32 ones, metrics measure what they say,
repair restores the budget, profiles say which precisions each PU computes in, and cost tables keep
their fp32 keys. A tiny trained-shaped CNN keeps this fast; no wall-clock assertions."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from device_profiles.loader import load_profile, parse_profile
from device_profiles.schema import DEFAULT_PRECISIONS, ProfileError
from models.graph import build_graph
from models.onnx_io import LoadedModel, load_onnx
from models.precision import (
    METRICS,
    FrameReader,
    MixEvaluator,
    PrecisionError,
    VariantMaker,
    assemble,
    calibrate,
    choose_mix,
    int8_nodes,
    measure_accuracy,
    preprocessed,
    quantizable_groups,
    repair,
    run_chain,
    sensitivity,
    whole_model_int8,
)
from profiler.costtable import Conditions, CostEntry, CostTable, entry_key

SHAPE = (1, 3, 16, 16)


def _tiny_cnn(path: Path) -> Path:
    """x -> conv1 -> relu -> conv2 -> relu -> global pool -> flatten -> gemm -> logits[1, 10]."""
    rng = np.random.default_rng(0)

    def init(name: str, *shape: int, scale: float = 0.3) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["logits"], name="fc", transB=1),
    ]
    inits = [init("w1", 8, 3, 3, 3), init("b1", 8), init("w2", 8, 8, 3, 3), init("b2", 8)]
    inits += [init("w3", 10, 8), init("b3", 10)]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(SHAPE))],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


GROUPS = {"head": ("conv1", "relu1"), "middle": ("conv2", "relu2"), "tail": ("pool", "flatten", "fc")}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    return load_onnx(_tiny_cnn(tmp_path_factory.mktemp("precision") / "tiny.onnx"))


def _frames(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.random(SHAPE, dtype=np.float32)} for _ in range(n)]


def _io_types(model: bytes) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    import onnxruntime as ort

    s = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return [(i.name, i.type) for i in s.get_inputs()], [(o.name, o.type) for o in s.get_outputs()]


def _fp32_outputs(model: LoadedModel, frames: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    import onnxruntime as ort

    s = ort.InferenceSession(model.ort_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return [{"logits": s.run(["logits"], f)[0]} for f in frames]


# ---------------------------------------------------------------------------------------------- variants


def test_int8_block_chains_with_fp32_neighbours(tiny: LoadedModel) -> None:
    maker = VariantMaker(tiny)
    cal, held = _frames(8, 1), _frames(4, 2)
    fp32 = {g: maker.fp32(m, g) for g, m in GROUPS.items()}
    int8 = maker.int8(GROUPS["middle"], cal, "middle", tag="calibration")
    assert int8.precision == "int8" and int8.calibration_frames == 8
    # same boundary tensors, same dtypes: the Q/DQ are inside the variant
    assert (int8.inputs, int8.outputs) == (fp32["middle"].inputs, fp32["middle"].outputs) == (("r1",), ("r2",))
    assert _io_types(int8.model) == _io_types(fp32["middle"].model)
    inside = onnx.load_from_string(int8.model)
    ops = {n.op_type for n in inside.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    assert any(t.data_type == TensorProto.INT8 for t in inside.graph.initializer), "weights are not int8"
    # fp32 -> int8 -> fp32 chains and stays close to the fp32 model
    chained = run_chain([fp32["head"], int8, fp32["tail"]], held, ["logits"])
    ref = _fp32_outputs(tiny, held)
    assert chained[0]["logits"].shape == (1, 10) and chained[0]["logits"].dtype == np.float32
    acc = measure_accuracy(ref, chained, ("cosine", "relerr"))
    assert acc.loss("cosine") < 0.01 and 0 < acc.loss("relerr") < 0.1
    # the whole chain in fp32 is the model
    exact = run_chain(list(fp32.values()), held, ["logits"])
    assert measure_accuracy(ref, exact, ("relerr",)).loss("relerr") < 1e-6


def test_fp16_variant_keeps_fp32_boundary(tiny: LoadedModel) -> None:
    maker = VariantMaker(tiny)
    fp32, fp16 = maker.fp32(GROUPS["middle"], "m"), maker.fp16(GROUPS["middle"], "m")
    assert _io_types(fp16.model) == _io_types(fp32.model)
    inside = onnx.load_from_string(fp16.model)
    assert "Cast" in {n.op_type for n in inside.graph.node}
    assert any(t.data_type == TensorProto.FLOAT16 for t in inside.graph.initializer)


def test_variant_accuracy_and_unknown_precision(tiny: LoadedModel) -> None:
    from models.precision import variant_accuracy

    maker = VariantMaker(tiny)
    cal, held = _frames(6, 3), _frames(3, 4)
    v = maker.variants(GROUPS["head"], cal, ("fp32", "int8"), name="head", tag="calibration")
    same = variant_accuracy(maker, v["fp32"], cal, held)
    assert same.held_out.loss("relerr") == 0.0 and same.held_out.frames == 3
    q = variant_accuracy(maker, v["int8"], cal, held)
    assert 0 < q.calibration.loss("relerr") < 0.1 and 0 < q.held_out.loss("relerr") < 0.1
    with pytest.raises(PrecisionError, match="unknown precision"):
        maker.variants(GROUPS["head"], cal, ("int4",))
    with pytest.raises(PrecisionError, match="calibration frames"):
        maker.int8(GROUPS["head"], [])


def test_frame_reader_is_a_calibration_reader() -> None:
    from onnxruntime.quantization import CalibrationDataReader

    r = FrameReader(_frames(3, 0), ["x"])
    assert isinstance(r, CalibrationDataReader) and len(r) == 3
    assert len(list(r)) == 3 and r.get_next() is None
    r.set_range(1, 3)
    assert len(list(r)) == 2


# ---------------------------------------------------------------------------------------------- metrics


def test_metrics_on_known_inputs() -> None:
    ref = [{"y": np.array([[0.1, 0.9, 0.0], [0.8, 0.1, 0.1]], np.float32)}]
    assert METRICS["top1"].loss(ref, ref) == 0.0
    one_flip = [{"y": np.array([[0.1, 0.9, 0.0], [0.1, 0.8, 0.1]], np.float32)}]
    assert METRICS["top1"].loss(ref, one_flip) == pytest.approx(0.5)
    # no flip, but a row whose lead over the runner-up (0.06) is under twice its largest change (0.05) is not safe
    close = [{"y": np.array([[0.40, 0.34, 0.26], [0.8, 0.1, 0.1]], np.float32)}]
    moved = [{"y": np.array([[0.45, 0.34, 0.21], [0.8, 0.1, 0.1]], np.float32)}]
    assert METRICS["top1"].loss(close, moved) == pytest.approx(0.5)
    small = [{"y": np.array([[0.41, 0.34, 0.25], [0.8, 0.1, 0.1]], np.float32)}]  # change 0.01: lead 0.06 holds
    assert METRICS["top1"].loss(close, small) == 0.0
    tie = [{"y": np.array([[0.5, 0.5, 0.0]], np.float32)}]
    assert METRICS["top1"].loss(tie, tie) == 0.0  # identical outputs lose nothing, even at a tie
    a = [{"v": np.array([3.0, 4.0])}]
    assert METRICS["relerr"].loss(a, [{"v": np.array([3.0, 4.5])}]) == pytest.approx(0.1)
    assert METRICS["cosine"].loss(a, [{"v": np.array([6.0, 8.0])}]) == pytest.approx(0.0, abs=1e-12)
    assert METRICS["cosine"].loss(a, [{"v": np.array([-4.0, 3.0])}]) == pytest.approx(1.0)
    # pooled over frames (a near-zero frame does not dominate), worst output
    two = [{"v": np.array([1.0, 0.0]), "w": np.array([1.0])}, {"v": np.array([1.0, 0.0]), "w": np.array([1e-9])}]
    got = [{"v": np.array([1.0, 0.0]), "w": np.array([1.5])}, {"v": np.array([1.2, 0.0]), "w": np.array([0.0])}]
    assert METRICS["relerr"].loss(two, got) == pytest.approx(0.5)
    # top1 does not apply to an output with no class axis; measure_accuracy leaves it out
    acc = measure_accuracy(a[:1], [{"v": np.array([3.0, 4.5])}])
    assert acc.loss("relerr") == pytest.approx(0.1)
    scalar = measure_accuracy([{"s": np.array([[1.0]])}], [{"s": np.array([[1.0]])}])
    assert "top1" not in dict(scalar.losses)
    with pytest.raises(PrecisionError):
        measure_accuracy(a, [])


# ---------------------------------------------------------------------------------------------- mixes


def test_choose_mix_and_repair_are_greedy_by_sensitivity() -> None:
    sens = {"a": 0.004, "b": 0.001, "c": 0.02, "d": 0.003}
    assert choose_mix(sens, 0.01) == ("b", "d", "a")  # c alone exceeds the budget
    assert choose_mix(sens, 0.01, gains={"a": 10.0, "b": 0.1, "c": 1.0, "d": 1.0}) == ("a", "d", "b")

    calls: list[frozenset[str]] = []

    def evaluate(int8) -> float:  # errors add up, with an interaction between a and c
        s = frozenset(int8)
        calls.append(s)
        return sum(sens[g] for g in s) + (0.01 if {"a", "c"} <= s else 0.0)

    r = repair(sens, sens, evaluate, 0.01)
    assert r.ok and r.loss <= 0.01
    assert r.reverted == ("c",) and set(r.int8) == {"a", "b", "d"}
    assert calls[0] == frozenset(sens)  # the whole mix is measured first
    # with gains: most sensitivity per unit of gain goes back first (d saves little)
    r = repair(sens, sens, evaluate, 0.02, gains={"a": 1.0, "b": 1.0, "c": 100.0, "d": 0.01})
    assert r.reverted[0] == "d"
    # refill: losses do not add up, so a group put back early may fit again once a worse one is fp32
    table = {frozenset(): 0.0, frozenset("x"): 0.05, frozenset("y"): 0.4, frozenset("xy"): 1.0}
    r = repair(["x", "y"], {"x": 0.5, "y": 0.4}, lambda s: table[frozenset(s)], 0.1)
    assert r.int8 == ("x",) and r.reverted == ("y",) and r.loss == 0.05
    assert repair(["x", "y"], {"x": 0.5, "y": 0.4}, lambda s: table[frozenset(s)], 0.1, refill=False).int8 == ()
    # ties (a discrete metric) broken by a continuous figure
    r = repair(["a", "b"], {"a": 0.0, "b": 0.0}, lambda s: 1.0 if "b" in set(s) else 0.0, 0.5, {"a": 0.1, "b": 0.2})
    assert r.reverted == ("b",) and r.int8 == ("a",)


def test_precision_units_cover_every_node(tiny: LoadedModel) -> None:
    from models.coarsen import coarsen
    from models.precision import precision_units

    graph = build_graph(tiny.proto, tiny.sha256)
    units = precision_units(graph, coarsen(graph, "fine"))
    assert set(units) == {"conv1", "conv2", "fc"}  # one per Conv/MatMul/Gemm, named by it
    members = [m for ms in units.values() for m in ms]
    assert sorted(members) == sorted(n.name for n in graph.nodes)  # every node once
    assert {"relu2", "pool"} <= set(units["conv2"])  # activations and pools join their producer
    maker = VariantMaker(tiny, graph)
    for name, members in units.items():  # each cuts out as a partition (convex)
        assert maker.fp32(members, name).members


def test_repair_restores_the_budget_end_to_end(tiny: LoadedModel, tmp_path: Path) -> None:
    cal, held = _frames(8, 5), _frames(4, 6)
    graph = build_graph(tiny.proto, tiny.sha256)
    groups = quantizable_groups(graph, GROUPS)
    assert set(groups) == set(GROUPS)  # each holds a Conv or a Gemm
    ranges = calibrate(tiny, cal, tmp_path / "ranges.json")
    ev = MixEvaluator(tiny, groups, held, "relerr", ranges)
    everything = ev(groups)
    assert everything > 0
    sens = sensitivity(ev, groups)
    assert all(v > 0 for v in sens.values())
    budget = min(sens.values()) * 1.01  # only the least sensitive group alone fits
    r = repair(groups, sens, ev, budget)
    assert r.ok and ev(r.int8) <= budget
    assert set(r.int8) <= {min(sens, key=sens.__getitem__)}
    assert r.reverted[0] == max(sens, key=sens.__getitem__)
    assert repair(groups, sens, ev, 1.0).reverted == ()
    # the assembled mix is one model taking and giving fp32
    mix = assemble(tiny, ranges, int8_nodes=int8_nodes(groups, r.int8), frames=len(cal))
    assert _io_types(mix.model) == _io_types(tiny.ort_proto.SerializeToString())
    none = assemble(tiny, ranges, int8_nodes=[])
    assert none.precision == "fp32"
    assert measure_accuracy(_fp32_outputs(tiny, held), none.run(held), ("relerr",)).loss("relerr") < 1e-6
    # the mix of every group quantises their Conv/Gemm only (pool and flatten stay fp32): close to whole-model
    # int8 from the same calibration, not the same model
    whole = whole_model_int8(tiny, cal, ranges)
    assert whole.precision == "int8"
    every = assemble(tiny, ranges, int8_nodes=int8_nodes(groups, groups))
    assert every.model != whole.model
    assert measure_accuracy(whole.run(held), every.run(held), ("relerr",)).loss("relerr") < 0.02
    # everything but the fp32 groups: with none kept, whole-model int8; with the head kept, its Conv stays fp32
    assert assemble(tiny, ranges, fp32_nodes=[]).model == whole.model
    kept = assemble(tiny, ranges, fp32_nodes=GROUPS["head"])
    assert kept.precision == "mixed" and "conv1" not in kept.int8_nodes and "conv2" in kept.int8_nodes
    conv1 = next(n for n in onnx.load_from_string(kept.model).graph.node if n.name == "conv1")
    assert conv1.input[1] == "w1"  # fp32 weight, not a dequantised one
    pre = preprocessed(tiny)
    assert pre.precision == "fp32" and "QuantizeLinear" not in {
        n.op_type for n in onnx.load_from_string(pre.model).graph.node
    }
    assert measure_accuracy(_fp32_outputs(tiny, held), pre.run(held), ("relerr",)).loss("relerr") < 1e-5
    rest = MixEvaluator(tiny, {"head": GROUPS["head"]}, held, "relerr", ranges, rest="int8")
    whole_loss = METRICS["relerr"].loss(_fp32_outputs(tiny, held), whole.run(held))
    assert rest([]) > 0 and rest(["head"]) == pytest.approx(whole_loss)


# ---------------------------------------------------------------------------------------------- profiles


@pytest.mark.parametrize("board", ["khadas-vim3", "bst-a1000", "vim3-cloud"])
def test_npus_compute_int8_only(board: str) -> None:
    profile = load_profile(board)
    npus = [p for p in profile.pus if p.kind == "npu"]
    assert npus
    for pu in npus:
        assert pu.computes("int8") and not pu.computes("fp32") and not pu.computes("fp16")
        assert pu.precision_set.source in ("spec-sheet", "estimate", "measured") and pu.precision_set.cite
    for pu in profile.pus:
        if pu.kind == "cpu":
            assert pu.computes("fp32") and pu.computes("int8")


def test_precisions_default_by_kind_and_are_validated() -> None:
    local = load_profile("local")
    assert local.pus[0].precisions is None and local.pus[0].precision_set.values == DEFAULT_PRECISIONS["cpu"]
    assert DEFAULT_PRECISIONS["npu"] == ("int8",)
    data = _minimal_profile()
    before = parse_profile(data)
    assert before.pus[1].precision_set.values == ("int8",)  # an NPU saying nothing
    data["pus"][1]["precisions"] = {"value": ["fp16"], "source": "estimate"}
    with pytest.raises(ProfileError, match="cite"):
        parse_profile(data)
    data["pus"][1]["precisions"] = {"value": ["int4"], "source": "measured"}
    with pytest.raises(ProfileError, match="int4"):
        parse_profile(data)
    data["pus"][1]["precisions"] = {"value": ["int8", "fp16"], "source": "spec-sheet", "cite": "data sheet"}
    after = parse_profile(data)
    assert after.pus[1].computes("fp16") and after.content_hash() != before.content_hash()
    # fp16's peak is given only where the PU computes fp16, and counts in the hash
    data["pus"][1]["fp16_peak_ratio"] = {"value": 2.0, "source": "spec-sheet", "cite": "data sheet"}
    assert parse_profile(data).pus[1].fp16_peak_ratio.value == 2.0  # type: ignore[union-attr]
    assert parse_profile(data).content_hash() != after.content_hash()
    data["pus"][1]["precisions"] = {"value": ["int8"], "source": "spec-sheet", "cite": "data sheet"}
    with pytest.raises(ProfileError, match="fp16_peak_ratio: the PU does not compute fp16"):
        parse_profile(data)
    # a profile that says nothing of precisions, fp16's peak nor its runtime keeps the hash it had before the fields existed
    legacy = dataclasses.asdict(before)
    legacy.pop("origin")
    for pu in legacy["pus"]:
        pu.pop("precisions")
        pu.pop("fp16_peak_ratio")
        pu.pop("runtime")
        pu.pop("shares")
    assert before.content_hash() == hashlib.sha256(json.dumps(legacy, sort_keys=True, default=str).encode()).hexdigest()


def _minimal_profile() -> dict:
    q = {"value": 1.0, "source": "estimate", "cite": "test"}
    peaks = {c: q for c in ("conv", "depthwise", "matmul", "elementwise", "pooling", "other")}
    pu = {
        "memory_bandwidth_gbps": q,
        "memory_bytes": q,
        "launch_overhead_us": q,
        "active_power_w": q,
        "idle_power_w": q,
        "peak_gflops": peaks,
    }
    return {
        "schema_version": 1,
        "name": "t",
        "pus": [{"name": "cpu", "kind": "cpu", "cores": [0], **pu}, {"name": "npu", "kind": "npu", **pu}],
        "default_link": {"a": "cpu", "b": "npu", "bandwidth_gbps": q, "latency_us": q},
    }


# ---------------------------------------------------------------------------------------------- cost table


def test_cost_table_keeps_fp32_keys_and_stores_precision(tmp_path: Path) -> None:
    fp32 = Conditions("local", "cpu", 2, 2, "CPUExecutionProvider", "1.0", "all")
    legacy = {k: v for k, v in dataclasses.asdict(fp32).items() if k != "precision"}
    payload = json.dumps({"model": "m", "kind": "block", "members": ["a"], "cond": legacy}, sort_keys=True)
    assert entry_key("m", "block", ["a"], fp32) == hashlib.sha256(payload.encode()).hexdigest()
    int8 = dataclasses.replace(fp32, precision="int8")
    assert entry_key("m", "block", ["a"], int8) != entry_key("m", "block", ["a"], fp32)

    def entry(c: Conditions) -> CostEntry:
        return CostEntry(entry_key("m", "block", ["a"], c), "block", "m", "a", ("a",), c, 1.0, 1.0, 1.0, 1.0, 3)

    table = CostTable()
    table.add(entry(fp32))
    table.add(entry(int8))
    stored = table.to_json()["entries"]
    assert sorted("precision" in e["conditions"] for e in stored) == [False, True]  # type: ignore[index]
    table.save(tmp_path / "t.json")
    back = CostTable.load(tmp_path / "t.json")
    assert len(back) == 2
    assert [e.conditions.precision for e in back.select()] == ["fp32"]  # old callers see fp32 only
    assert sorted(e.conditions.precision for e in back.select(precision=None)) == ["fp32", "int8"]
    assert [e.conditions.precision for e in back.select(precision="int8")] == ["int8"]


def test_time_variants_records_each_precision_the_pu_computes(tiny: LoadedModel) -> None:
    from profiler.session import pu_configs
    from profiler.variants import VariantOptions, speedups, time_variants

    profile = load_profile("local")
    configs = pu_configs(profile)[:1]
    table = CostTable()
    groups = {"middle": GROUPS["middle"]}
    options = VariantOptions(("fp32", "int8", "fp16"), repeats=2, warmup=1)
    times = time_variants(tiny, groups, _frames(4, 7), profile, configs, options, table=table)
    # the local CPU computes fp32 and int8, not fp16
    assert sorted(t.precision for t in times) == ["fp32", "int8"]
    assert sorted(e.conditions.precision for e in table.select(precision=None)) == ["fp32", "int8"]
    assert all(t.entry.median_ms > 0 and not t.reused for t in times)
    assert set(speedups(times)) == {("middle", configs[0].label, "int8")}
    again = time_variants(tiny, groups, _frames(4, 7), profile, configs, VariantOptions(repeats=2), table=table)
    assert all(t.reused for t in again) and len(table) == 2


def _producers(model: bytes) -> tuple[list[onnx.NodeProto], dict[str, str]]:
    nodes = list(onnx.load_from_string(model).graph.node)
    return nodes, {o: n.op_type for n in nodes for o in n.output}


def _conv_swish_conv(path: Path) -> Path:
    """x -> conv1 -> x * sigmoid(x) (element-wise) -> conv2 -> y: a block holding convolutions and element-wise ops."""
    rng = np.random.default_rng(2)
    inits = [
        numpy_helper.from_array((rng.standard_normal(s) * 0.3).astype(np.float32), n)
        for n, s in (("w1", (8, 3, 3, 3)), ("b1", (8,)), ("w2", (8, 8, 3, 3)), ("b2", (8,)))
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="stem/conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c1"], ["s1"], name="stem/act/sigmoid"),
        helper.make_node("Mul", ["c1", "s1"], ["a1"], name="stem/act/mul"),
        helper.make_node("Conv", ["a1", "w2", "b2"], ["y"], name="stem/conv2", pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "swish",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(SHAPE))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_an_int8_block_quantises_its_convolutions_and_keeps_element_wise_ops_in_fp32(tmp_path: Path) -> None:
    """onnxruntime's int8 element-wise kernels are slower than its fp32 ones on x86: a block in int8 runs its
    Conv/MatMul/Gemm in int8 and its Sigmoid and Mul in fp32, in a mix, a variant and a compiled partition alike."""
    loaded = load_onnx(_conv_swish_conv(tmp_path / "swish.onnx"))
    frames = [{"x": np.random.default_rng(i).standard_normal(SHAPE).astype(np.float32)} for i in range(4)]
    ranges = calibrate(loaded, frames, tmp_path / "ranges.json")
    everything = [n.name for n in loaded.proto.graph.node]
    mix = assemble(loaded, ranges, int8_nodes=everything).model
    block = VariantMaker(loaded).int8(everything, frames, "stem").model
    for model in (mix, block):
        nodes, producer = _producers(model)
        convs = [n for n in nodes if n.op_type == "Conv"]
        assert len(convs) == 2 and all(producer.get(n.input[0]) == "DequantizeLinear" for n in convs)
        kernels = _kernels(model, tmp_path / "optimised.onnx")
        assert "QLinearConv" in kernels and not {"QLinearMul", "QLinearSigmoid"} & kernels, kernels
    assert {"QLinearMul", "QLinearSigmoid"} <= _kernels(
        whole_model_int8(loaded, frames, ranges).model, tmp_path / "w.onnx"
    ), "whole-model int8, the baseline, quantises every type onnxruntime does"


def _kernels(model: bytes, path: Path) -> set[str]:
    """The operators onnxruntime runs for ``model`` once it has fused its Q/DQ (extended optimisations)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(path)
    ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    return {n.op_type for n in onnx.load(path).graph.node}


def _dense(path: Path) -> Path:
    """layer/dense: x[1, 8, 16] -> MatMul -> + bias -> y, node names holding "/" as exporters write them."""
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array((rng.standard_normal((16, 16)) * 0.3).astype(np.float32), "w")
    b = numpy_helper.from_array((rng.standard_normal(16) * 0.1).astype(np.float32), "b")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"], name="/layer/dense/MatMul"),
        helper.make_node("Add", ["m", "b"], ["d"], name="/layer/dense/Add"),
        helper.make_node("Relu", ["d"], ["y"], name="/layer/act/Relu"),
    ]
    graph = helper.make_graph(
        nodes,
        "dense",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16])],
        [w, b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_a_matmul_fused_with_its_bias_is_still_found_by_its_slash_holding_name(tmp_path: Path) -> None:
    """Pre-processing fuses MatMul + bias Add into a Gemm named "/layer/dense/MatMul/MatMulAddFusion": naming
    "/layer/dense/MatMul" must quantise it (it was left fp32, so a text model's feed-forward stayed fp32)."""
    loaded = load_onnx(_dense(tmp_path / "dense.onnx"))
    frames = [{"x": np.random.default_rng(i).standard_normal((1, 8, 16)).astype(np.float32)} for i in range(4)]
    ranges = calibrate(loaded, frames, tmp_path / "ranges.json")
    mix = assemble(loaded, ranges, int8_nodes=["/layer/dense/MatMul", "/layer/dense/Add"]).model
    nodes, producer = _producers(mix)
    gemm = next(n for n in nodes if n.op_type == "Gemm")
    assert gemm.name.startswith("/layer/dense/MatMul/"), gemm.name
    assert producer.get(gemm.input[0]) == "DequantizeLinear" and producer.get(gemm.input[1]) == "DequantizeLinear"


def test_a_tensor_reshaped_by_pre_processing_takes_the_range_of_what_it_reshapes(tmp_path: Path) -> None:
    """Fusing MatMul + bias into Gemm inserts a Reshape named anew in each partition; quantising that Gemm needs
    a range for the reshaped tensor, which holds the same values as its input."""
    from models.precision import _ranges_through_reshapes, read_ranges, write_ranges

    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["gemm_input_reshape_arg_token_7"], name="r"),
        helper.make_node("Transpose", ["gemm_input_reshape_arg_token_7"], ["t"], name="t", perm=[1, 0]),
        helper.make_node("Relu", ["t"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 4])],
        [numpy_helper.from_array(np.array([4, 8], np.int64), "shape")],
    )
    cache = write_ranges({"x": (-2.0, 3.0), "y": (0.0, 3.0)}, tmp_path / "ranges.json")
    got = read_ranges(_ranges_through_reshapes(helper.make_model(graph), cache, tmp_path))
    assert got["gemm_input_reshape_arg_token_7"] == got["t"] == (-2.0, 3.0)
    assert got["y"] == (0.0, 3.0) and read_ranges(cache) == {"x": (-2.0, 3.0), "y": (0.0, 3.0)}
    complete = write_ranges(got, tmp_path / "complete.json")
    assert _ranges_through_reshapes(helper.make_model(graph), complete, tmp_path) == complete


def test_a_gemms_output_reshaped_back_takes_the_range_of_what_it_is_reshaped_into(tmp_path: Path) -> None:
    """On 3-D inputs the fused Gemm's output is a new tensor (``gemm_output_reshape_arg_token_N``) reshaped back
    into the MatMul + bias output the ranges were measured on: it holds the same values, so it takes that range
    (a text model's whole-model partition could not be quantised without it)."""
    from models.precision import _ranges_through_reshapes, read_ranges, write_ranges

    nodes = [
        helper.make_node("Relu", ["x"], ["gemm_output_reshape_arg_token_34"], name="gemm"),
        helper.make_node("Reshape", ["gemm_output_reshape_arg_token_34", "shape"], ["dense"], name="back"),
        helper.make_node("Identity", ["dense"], ["y"], name="out"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8])],
        [numpy_helper.from_array(np.array([1, 4, 8], np.int64), "shape")],
    )
    cache = write_ranges({"x": (-2.0, 3.0), "dense": (0.0, 2.5)}, tmp_path / "ranges.json")
    got = read_ranges(_ranges_through_reshapes(helper.make_model(graph), cache, tmp_path))
    assert got["gemm_output_reshape_arg_token_34"] == got["y"] == (0.0, 2.5)
    assert got["x"] == (-2.0, 3.0)
