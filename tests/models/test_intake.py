"""Every unusable ONNX file is refused with a clear message and exit code 2 (through the CLI)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from models.errors import ModelError
from models.onnx_io import load_onnx
from parapipe.cli import app

runner = CliRunner()


def _tiny_model(opset: int = 17, dims: list[int | str] | None = None) -> onnx.ModelProto:
    dims = dims or [1, 4]
    weight = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
        helper.make_node("Relu", ["h"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(nodes, "tiny", [x], [y], [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _inspect(path: Path, *extra: str):
    return runner.invoke(app, ["inspect", str(path), *extra])


def _refused(path: Path, needle: str, *extra: str) -> None:
    result = _inspect(path, *extra)
    assert result.exit_code == 2, result.output
    assert needle in result.output
    assert "Traceback" not in result.output


def test_a_valid_tiny_model_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "tiny.onnx"
    onnx.save(_tiny_model(), path)
    result = _inspect(path, "--json")
    assert result.exit_code == 0, result.output
    assert '"nodes": 2' in result.output


def test_garbage_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "garbage.onnx"
    path.write_bytes(os.urandom(3000))
    _refused(path, "not a readable ONNX model")


def test_text_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "notes.onnx"
    path.write_text("hello, this is not a model\n")
    result = _inspect(path)
    assert result.exit_code == 2 and "ONNX model" in result.output


def test_truncated_model_is_refused(tmp_path: Path, exported) -> None:
    data = exported("squeezenet1_1").path.read_bytes()
    path = tmp_path / "truncated.onnx"
    path.write_bytes(data[: len(data) // 2])
    _refused(path, "truncated or not ONNX")


def test_empty_and_missing_files_are_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    _refused(empty, "is empty")
    _refused(tmp_path / "nope.onnx", "no such file")
    _refused(tmp_path, "is not a file")


def test_model_failing_the_checker_is_refused(tmp_path: Path) -> None:
    model = _tiny_model()
    model.graph.node[1].input[0] = "undefined_tensor"
    path = tmp_path / "broken.onnx"
    path.write_bytes(model.SerializeToString())
    _refused(path, "fails the ONNX checker")


def _with_external(tmp_path: Path, location: str) -> Path:
    model = _tiny_model()
    tensor = model.graph.initializer[0]
    tensor.ClearField("raw_data")
    tensor.ClearField("float_data")
    tensor.data_location = TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value=location)
    path = tmp_path / "model" / "ext.onnx"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(model.SerializeToString())
    return path


def test_external_data_with_absolute_path_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "secret.bin"
    secret.write_bytes(np.ones(16, np.float32).tobytes())
    _refused(_with_external(tmp_path, str(secret)), "outside the model's folder")


def test_external_data_with_dotdot_is_refused(tmp_path: Path) -> None:
    (tmp_path / "secret.bin").write_bytes(np.ones(16, np.float32).tobytes())
    _refused(_with_external(tmp_path, "../secret.bin"), "outside the model's folder")


def test_external_data_through_symlink_is_refused(tmp_path: Path) -> None:
    (tmp_path / "secret.bin").write_bytes(np.ones(16, np.float32).tobytes())
    path = _with_external(tmp_path, "weights.bin")
    (path.parent / "weights.bin").symlink_to(tmp_path / "secret.bin")
    _refused(path, "symlink")


def test_external_data_beside_the_model_is_accepted(tmp_path: Path) -> None:
    path = _with_external(tmp_path, "weights.bin")
    (path.parent / "weights.bin").write_bytes(np.ones(16, np.float32).tobytes())
    assert _inspect(path).exit_code == 0


def test_missing_external_file_is_refused(tmp_path: Path) -> None:
    _refused(_with_external(tmp_path, "weights.bin"), "missing beside the model")


def test_opset_newer_than_onnxruntime_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.onnx"
    path.write_bytes(_tiny_model(opset=60).SerializeToString())
    result = _inspect(path)
    assert result.exit_code == 2
    assert "uses opset 60" in result.output and "--opset" in result.output


def test_dynamic_dims_need_a_shape(tmp_path: Path) -> None:
    path = tmp_path / "dynamic.onnx"
    onnx.save(_tiny_model(dims=["batch", 4]), path)
    refused = runner.invoke(app, ["partition", str(path), "-o", str(tmp_path / "parts")])
    assert refused.exit_code == 2 and "dynamic dimensions" in refused.output and "--input-shape x=1,4" in refused.output
    # inspect looks at any model onnxruntime loads: unknown dims are taken as 1, and it says so
    assumed = _inspect(path, "--json")
    assert assumed.exit_code == 0, assumed.output
    assert "assumed [1, 4]" in assumed.output
    ok = _inspect(path, "--input-shape", "x=3,4", "--json")
    assert ok.exit_code == 0, ok.output
    assert '"shape": [\n        3,\n        4\n      ]' in ok.output
    _refused(path, "contradicts", "--input-shape", "x=3,5")
    _refused(path, "does not have", "--input-shape", "y=3,4")
    _refused(path, "bad shape", "--input-shape", "x=3,-4")


def test_load_onnx_names_unnamed_nodes(tmp_path: Path) -> None:
    model = _tiny_model()
    for node in model.graph.node:
        node.name = ""
    path = tmp_path / "unnamed.onnx"
    onnx.save(model, path)
    names = [n.name for n in load_onnx(path).proto.graph.node]
    assert all(names) and len(set(names)) == len(names)


def test_errors_are_model_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelError):
        load_onnx(tmp_path / "missing.onnx")


def test_inspect_explains_in_one_line_why_onnxruntime_cannot_load_a_model(tmp_path: Path) -> None:
    # an op no runtime implements, in a domain the checker cannot check: onnx accepts it, onnxruntime does not
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("Frobnicate", ["x"], ["y"], domain="example.custom")], "g", [x], [y])
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("example.custom", 1)], ir_version=8
    )
    path = tmp_path / "custom.onnx"
    onnx.save(model, path)
    result = _inspect(path)
    assert result.exit_code == 2, result.output
    assert "onnxruntime" in result.output and "Frobnicate" in result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) <= 3  # one message (wrapped at most by the console)


def test_export_without_torch_says_how_to_get_it(tmp_path: Path) -> None:
    # a Python where torch cannot be found: the CLI must say which extra to install, not crash
    import subprocess
    import sys

    blocker = tmp_path / "sitecustomize.py"
    blocker.write_text(
        "import importlib.abc, sys\n"
        "class _No(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('torch', 'onnxscript'):\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, _No())\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run(
        [sys.executable, "-c", "from parapipe.cli import main; main()", "export", "googlenet"],
        capture_output=True, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "parapipe[torch]" in done.stderr and "Traceback" not in done.stderr
