"""What real-world ONNX files need from intake: control flow, shapes onnx cannot infer, scalar and
integer inputs, sample data, fp16, old opsets, external data, and names that are not file names."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from models.coarsen import coarsen
from models.errors import ModelError
from models.graph import build_graph
from models.inputs import InputSpec
from models.names import safe_name
from models.onnx_io import load_onnx, parse_input_shapes
from models.partition import cut_partitions, example_grouping, verify_partitions

SAFE = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]*$")


# --- names -----------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=0, max_size=400))
def test_safe_name_is_always_a_plain_file_name_component(name: str) -> None:
    out = safe_name(name)
    assert SAFE.match(out), out
    assert len(out) <= 96
    assert out not in (".", "..")
    assert safe_name(name) == out  # stable


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300), st.text(max_size=300))
def test_safe_name_never_maps_two_names_to_one(a: str, b: str) -> None:
    if a != b:
        assert safe_name(a) != safe_name(b)


def test_safe_name_keeps_readable_names_readable() -> None:
    assert safe_name("conv1") == "conv1"
    assert safe_name("/model.0/conv/Conv").startswith("model.0_conv_Conv-")
    assert safe_name("..").startswith("n-")


# --- control flow ------------------------------------------------------------------------------------


def _if_model() -> onnx.ModelProto:
    """pre -> If (its branches read `h` from the enclosing graph, not through node.input) -> post."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    flag = helper.make_tensor_value_info("flag", TensorProto.BOOL, [])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    w = numpy_helper.from_array(np.full((4, 4), 0.5, np.float32), "w")
    then_w = numpy_helper.from_array(np.full((4, 4), 2.0, np.float32), "then_w")
    then_b = helper.make_graph(
        [helper.make_node("MatMul", ["h", "then_w"], ["t_out"], name="then/matmul")],
        "then",
        [],
        [helper.make_tensor_value_info("t_out", TensorProto.FLOAT, None)],
        [then_w],
    )
    else_b = helper.make_graph(
        [helper.make_node("Neg", ["h"], ["e_out"], name="else/neg")],
        "else",
        [],
        [helper.make_tensor_value_info("e_out", TensorProto.FLOAT, None)],
    )
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="pre/matmul"),
        helper.make_node("If", ["flag"], ["z"], name="branch/if", then_branch=then_b, else_branch=else_b),
        helper.make_node("Relu", ["z"], ["y"], name="post/relu"),
    ]
    graph = helper.make_graph(nodes, "ifmodel", [x, flag], [y], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_control_flow_node_is_one_opaque_block_with_its_implicit_inputs(tmp_path: Path) -> None:
    path = tmp_path / "if.onnx"
    onnx.save(_if_model(), path)
    loaded = load_onnx(path)
    graph = build_graph(loaded.proto, loaded.sha256)
    node = graph.index["branch/if"]
    assert "h" in node.inputs, "what the branches read from outside is an input of the node"
    assert ("pre/matmul", "branch/if") in {(e.src, e.dst) for e in graph.edges}
    assert node.param_bytes == 4 * 4 * 4, "the then-branch's weights count in the block"
    cut = cut_partitions(loaded.ort_proto, graph, {n.name: [n.name] for n in graph.nodes})
    for flag in (True, False):
        feeds = {"x": np.random.default_rng(0).standard_normal((1, 4)).astype(np.float32), "flag": np.array(flag)}
        assert verify_partitions(loaded.ort_proto, cut, feeds) == 0.0


# --- shapes, scalars, data ---------------------------------------------------------------------------


def _scalar_model() -> onnx.ModelProto:
    """y = x * (sr == 16000 ? 1 : 0) with a scalar int64 `sr`, and a contrib op onnx cannot infer."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])
    sr = helper.make_tensor_value_info("sr", TensorProto.INT64, [])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    k = numpy_helper.from_array(np.array(16000, np.int64), "k")
    w = numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")
    nodes = [
        helper.make_node("Equal", ["sr", "k"], ["eq"], name="eq"),
        helper.make_node("Cast", ["eq"], ["gate"], to=TensorProto.FLOAT, name="cast"),
        helper.make_node("FusedMatMul", ["x", "w"], ["m"], domain="com.microsoft", name="contrib"),
        helper.make_node("Mul", ["m", "gate"], ["y"], name="mul"),
    ]
    graph = helper.make_graph(nodes, "scalar", [x, sr], [y], [k, w])
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)], ir_version=8
    )


def test_scalar_inputs_values_from_the_graph_and_shapes_from_onnxruntime(tmp_path: Path) -> None:
    path = tmp_path / "scalar.onnx"
    onnx.save(_scalar_model(), path)
    assert parse_input_shapes(["sr=", "x=3,4"]) == {"sr": (), "x": (3, 4)}
    loaded = load_onnx(path, parse_input_shapes(["x=3,4"]))
    sr = next(s for s in loaded.inputs if s.name == "sr")
    assert sr.shape == () and sr.values == (16000.0,) and sr.source.startswith("graph:")
    assert loaded.shape_sources["m"] == "onnxruntime"  # onnx has no shape function for the contrib op
    graph = build_graph(loaded.proto, loaded.sha256)
    assert graph.outputs[0].shape == (3, 4), "a dynamic output is fixed by the inputs"
    out = verify_partitions(
        loaded.ort_proto,
        cut_partitions(loaded.proto, graph, {"a": ["eq", "cast"], "b": ["contrib", "mul"]}),
        loaded.feeds(),
    )
    assert out == 0.0
    # a different input shape is a different model as planned; the file hash stays
    other = load_onnx(path, {"x": (5, 4)})
    assert other.sha256 != loaded.sha256 and other.file_sha256 == loaded.file_sha256


def test_input_data_fixes_shapes_and_values_and_bad_data_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "scalar.onnx"
    onnx.save(_scalar_model(), path)
    data = tmp_path / "inputs.npz"
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.savez(data, x=x, sr=np.array(8000, np.int64))
    loaded = load_onnx(path, input_data=data)
    assert loaded.input_shapes == {"x": (2, 4), "sr": ()}
    assert all(s.source == "data" for s in loaded.inputs)
    feeds = loaded.feeds()
    np.testing.assert_array_equal(feeds["x"], x)
    assert int(feeds["sr"]) == 8000
    for arrays, needle in [
        ({"x": x, "nope": x}, "does not read"),
        ({"x": x[0]}, "rank"),
        ({"x": np.array([["a"] * 4] * 2)}, "the model wants float32"),
    ]:
        bad = tmp_path / "bad.npz"
        np.savez(bad, **arrays)
        with pytest.raises(ModelError, match=needle):
            load_onnx(path, {"sr": ()}, bad)
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(ModelError, match=r"not a readable \.npz"):
        load_onnx(path, input_data=tmp_path / "junk.npz")


def test_input_spec_round_trips_through_json() -> None:
    spec = InputSpec("ids", "int64", (1, 16), 0.0, 30522.0, (), "graph:indexes emb")
    assert InputSpec.from_json(spec.to_json()) == spec


# --- dtypes, opsets, external data -------------------------------------------------------------------


def _chain(dtype: int, opset: int, ir: int) -> onnx.ModelProto:
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    x = helper.make_tensor_value_info("x", dtype, [1, 8])
    y = helper.make_tensor_value_info("y", dtype, [1, 8])
    inits = [numpy_helper.from_array((np.eye(8) * (i + 1)).astype(np_dtype), f"w{i}") for i in range(3)]
    nodes = []
    prev = "x"
    for i in range(3):
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"], name=f"mm{i}"))
        nodes.append(helper.make_node("Relu", [f"m{i}"], ["y" if i == 2 else f"r{i}"], name=f"relu{i}"))
        prev = f"r{i}"
    graph = helper.make_graph(nodes, "chain", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir)


@pytest.mark.parametrize(
    ("dtype", "opset", "ir", "external"),
    [
        (TensorProto.FLOAT16, 17, 8, False),
        (TensorProto.FLOAT, 7, 3, False),
        (TensorProto.FLOAT, 13, 7, True),
    ],
    ids=["fp16", "opset7", "external-data"],
)
def test_fp16_old_opsets_and_external_data_cut_and_verify(
    tmp_path: Path, dtype: int, opset: int, ir: int, external: bool
) -> None:
    path = tmp_path / "chain.onnx"
    model = _chain(dtype, opset, ir)
    if external:
        onnx.save(
            model, path, save_as_external_data=True, all_tensors_to_one_file=True, location="w.bin", size_threshold=0
        )
        assert (tmp_path / "w.bin").exists()
    else:
        onnx.save(model, path)
    loaded = load_onnx(path)
    graph = build_graph(loaded.proto, loaded.sha256)
    cut = cut_partitions(loaded.proto, graph, example_grouping(coarsen(graph, "fine"), 3))
    assert verify_partitions(loaded.ort_proto, cut, loaded.feeds()) <= 1e-3
