"""Typed values are range-checked per datatype, a request sends its values one way only, and one bad request
on a ``ModelStreamInfer`` stream is answered with its own error while the stream goes on (a real agent serving
a model with a UINT8 input, driven by the protocol's own stubs)."""

from __future__ import annotations

import hashlib
from contextlib import ExitStack

import grpc
import numpy as np
import pytest
from onnx import TensorProto, helper

from agents.bundle import MANIFEST, Manifest, PartitionSpec, TensorSpec
from agents.inference import decode_inputs
from agents.proto import inference_pb2 as kpb
from agents.proto import inference_pb2_grpc as krpc
from parapipe.local_agent import LocalAgent


def _uint8_bundle(folder) -> None:
    """One partition: ``u`` UINT8 [1, 4] -> Cast to float -> ``y``."""
    graph = helper.make_graph(
        [helper.make_node("Cast", ["u"], ["y"], to=TensorProto.FLOAT)],
        "cast",
        [helper.make_tensor_value_info("u", TensorProto.UINT8, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    part = PartitionSpec.on_cpu_core(
        "p0", "p0.onnx", hashlib.sha256(data).hexdigest(), 0, inputs=("u",), outputs=("y",)
    )
    manifest = Manifest(
        model_sha256="0" * 64, plan_name="uint8", device="test", pipelined=True, max_inflight=2, replicas=(1,),
        inputs=(TensorSpec("u", "uint8", (1, 4)),), outputs=(TensorSpec("y", "float32", (1, 4)),),
        partitions=(part,), power=(1.0, 0.5, 1),
    )  # fmt: skip
    folder.mkdir(parents=True)
    (folder / "p0.onnx").write_bytes(data)
    (folder / MANIFEST).write_text(manifest.text())


def _request(values: list[int], rid: str) -> kpb.ModelInferRequest:
    request = kpb.ModelInferRequest(model_name="parapipe", id=rid)
    t = request.inputs.add(name="u", datatype="UINT8", shape=[1, 4])
    t.contents.uint_contents.extend(values)
    return request


def test_typed_values_must_fit_their_datatype_and_come_one_way() -> None:
    with pytest.raises(ValueError, match="value 300 does not fit UINT8"):
        decode_inputs(_request([1, 300, 2, 3], "a"))
    both = _request([1, 2, 3, 4], "b")
    both.raw_input_contents.append(np.ones((1, 4), np.uint8).tobytes())
    with pytest.raises(ValueError, match="both raw_input_contents and typed contents"):
        decode_inputs(both)
    assert decode_inputs(_request([0, 1, 254, 255], "c"))["u"].tolist() == [[0, 1, 254, 255]]


@pytest.mark.agent
def test_one_bad_value_on_a_stream_is_its_own_error_and_the_stream_goes_on(tmp_path) -> None:
    _uint8_bundle(tmp_path / "b")
    with ExitStack() as stack:
        agent = stack.enter_context(LocalAgent())
        agent.client.start(agent.client.load_bundle(tmp_path / "b").bundle_sha256)
        channel = stack.enter_context(grpc.insecure_channel(f"127.0.0.1:{agent.port}"))
        stub = krpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(_request([1, 300, 2, 3], "unary"), timeout=30)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "does not fit UINT8" in info.value.details()
        twice = _request([1, 2, 3, 4], "twice")
        for _ in range(200):
            twice.outputs.add(name="y")
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(twice, timeout=30)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "more than once" in info.value.details()
        sent = [_request([1, 2, 3, 4], "0"), _request([1, 300, 2, 3], "1"), _request([5, 6, 7, 8], "2"),
                _request([9, 10, 11, 12], "3")]  # fmt: skip
        answers = list(stub.ModelStreamInfer(iter(sent), timeout=60))
        assert len(answers) == 4
        assert "does not fit UINT8" in answers[1].error_message
        for k in (0, 2, 3):
            got = np.frombuffer(answers[k].infer_response.raw_output_contents[0], np.float32)
            assert got.tolist() == [float(v) for v in sent[k].inputs[0].contents.uint_contents], k
