"""The agent as a real process on 127.0.0.1: uploads, inference, streaming, and the gRPC status of bad requests."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import grpc
import numpy as np
import onnxruntime as ort
import pytest

from agents.bundle import MANIFEST
from agents.client import AgentClient, AgentError
from agents.executor import generate_inputs
from agents.proto import parapipe_agent_pb2 as pb
from agents.server import MAX_MESSAGE_BYTES
from compiler import compile_plan, write_bundle
from parapipe.local_agent import LocalAgent
from tests.support.plans import executor_plans, model_and_graph
from tests.support.tiny import write_conv_bundle


@pytest.fixture(scope="module")
def bundle(exported, two_cores, tmp_path_factory):
    loaded, graph = model_and_graph(exported, "googlenet")
    compiled = compile_plan(executor_plans(loaded, graph, two_cores)["branches"], loaded, graph, two_cores)
    folder = write_bundle(compiled, tmp_path_factory.mktemp("bundle") / "googlenet")
    return folder, compiled, loaded


@pytest.fixture(scope="module")
def agent():
    with LocalAgent() as a:
        yield a


def _code(exc: pytest.ExceptionInfo) -> grpc.StatusCode:
    return exc.value.code


def test_upload_start_infer_and_reupload_sends_nothing(agent, bundle) -> None:
    folder, compiled, loaded = bundle
    client = agent.client
    assert client.health() == "SERVING" and not client.ready()
    first = client.load_bundle(folder)
    assert not first.already_present and first.bytes_received > 0
    again = client.load_bundle(folder)
    assert again.already_present and again.bytes_received == 0
    client.start(first.bundle_sha256)
    assert client.ready()
    inputs = generate_inputs(compiled.manifest.inputs, seed=3)
    got = client.infer(inputs)
    ref = ort.InferenceSession(loaded.proto.SerializeToString()).run(None, inputs)[0]
    assert np.max(np.abs(next(iter(got.values())) - ref)) <= 1e-5
    status = client.status()
    assert first.bundle_sha256 in status.bundles and status.running_bundle == first.bundle_sha256


def test_stream_returns_frames_in_order(agent, bundle) -> None:
    folder, compiled, loaded = bundle
    client = agent.client
    client.start(client.load_bundle(folder).bundle_sha256)
    frames = [generate_inputs(compiled.manifest.inputs, seed=s) for s in range(8)]
    full = ort.InferenceSession(loaded.proto.SerializeToString())
    results = list(client.infer_stream(frames))
    assert len(results) == 8
    for f, got in zip(frames, results, strict=True):
        assert np.max(np.abs(next(iter(got.values())) - full.run(None, f)[0])) <= 1e-5


def test_benchmark_runs_on_the_board(agent, bundle) -> None:
    folder, _, _ = bundle
    client = agent.client
    client.start(client.load_bundle(folder).bundle_sha256)
    reply = client.benchmark(frames=10, warmup=2)
    assert reply.frames == 10 and reply.throughput_fps > 0 and reply.latency_alone_ms > 0
    assert reply.energy_source == "modelled"
    assert {p.pu for p in reply.partitions} == {"c0", "c1"}
    assert all(p.frames >= 10 for p in reply.partitions)


def test_a_benchmark_keeps_frames_on_two_units_at_once(agent, tmp_path) -> None:
    """The Benchmark reply says how its frames back to back went through two stages on two cores: with the
    pipeline's other frames in flight (one at a time reads 1.0), runs of different frames overlapping."""
    client = agent.client
    client.start(client.load_bundle(write_conv_bundle(tmp_path / "conv", "two-stages")).bundle_sha256)
    reply = client.benchmark(frames=60, warmup=3)
    assert reply.in_flight >= 2.0, f"runs started with {reply.in_flight:.2f} frames in flight on average"
    assert reply.runs_overlapped > 0 and reply.overlap > 0 and reply.frames_at_once > 1


def test_bad_requests_get_the_right_status_and_the_agent_keeps_serving(agent, bundle, tmp_path) -> None:
    folder, compiled, _ = bundle
    client = agent.client
    sha = client.load_bundle(folder).bundle_sha256
    client.start(sha)
    inputs = generate_inputs(compiled.manifest.inputs)
    name = next(iter(inputs))

    with pytest.raises(AgentError) as info:
        client.start("0" * 64)
    assert _code(info) == grpc.StatusCode.NOT_FOUND
    client.start(sha)

    with pytest.raises(AgentError) as info:
        client.infer({name: inputs[name][:, :, :100]})
    assert _code(info) == grpc.StatusCode.INVALID_ARGUMENT and "shape" in str(info.value)
    with pytest.raises(AgentError) as info:
        client.infer({name: inputs[name].astype(np.float64)})
    assert _code(info) == grpc.StatusCode.INVALID_ARGUMENT
    bad = pb.Frame(id=1, tensors=[pb.Tensor(name=name, dtype="float32", shape=[1, 3, 224, 224], data=b"\0" * 12)])
    with pytest.raises(grpc.RpcError) as raw:
        client.stub.Infer(bad, timeout=10)
    assert raw.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "bytes" in raw.value.details()
    huge = pb.Frame(
        id=2,
        tensors=[
            pb.Tensor(name=name, dtype="uint8", shape=[MAX_MESSAGE_BYTES + 16], data=b"\0" * (MAX_MESSAGE_BYTES + 16))
        ],
    )
    with pytest.raises(grpc.RpcError) as raw:
        client.stub.Infer(huge, timeout=30)
    assert raw.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

    # a partition that fails to load: hashes match, content is not ONNX
    broken = tmp_path / "broken"
    broken.mkdir()
    manifest = json.loads((folder / MANIFEST).read_text())
    garbage = b"this is not an onnx model"
    manifest["partitions"][0]["file"] = "garbage.onnx"
    manifest["partitions"][0]["sha256"] = hashlib.sha256(garbage).hexdigest()
    (broken / "garbage.onnx").write_bytes(garbage)
    for p in manifest["partitions"][1:]:
        (broken / p["file"]).write_bytes((folder / p["file"]).read_bytes())
    (broken / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    broken_sha = client.load_bundle(broken).bundle_sha256
    with pytest.raises(AgentError) as info:
        client.start(broken_sha)
    assert _code(info) == grpc.StatusCode.FAILED_PRECONDITION and "failed to load" in str(info.value)

    # and everything else still works
    client.start(sha)
    assert client.infer(inputs)
    assert client.status().ready


def test_infer_without_pipeline_is_a_precondition_failure(tmp_path) -> None:
    with LocalAgent() as a:
        with pytest.raises(AgentError) as info:
            a.client.infer({"input": np.zeros((1, 3, 8, 8), np.float32)})
        assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION


def test_wrong_token_is_unauthenticated() -> None:
    with LocalAgent(token="s3cret") as a:
        assert a.client.status().agent_version
        wrong = AgentClient(f"127.0.0.1:{a.port}", token="guess")
        with pytest.raises(AgentError) as info:
            wrong.status()
        assert info.value.code == grpc.StatusCode.UNAUTHENTICATED
        none = AgentClient(f"127.0.0.1:{a.port}")
        with pytest.raises(AgentError) as info:
            none.status()
        assert info.value.code == grpc.StatusCode.UNAUTHENTICATED
        assert a.client.status().agent_version  # still serving the right token


def test_a_second_agent_on_a_served_port_refuses_to_start_and_the_first_keeps_it(agent, tmp_path) -> None:
    """gRPC binds with SO_REUSEPORT unless told not to: a second agent on the same port would start and take
    a share of the first one's connections. It must exit 2 saying the port is in use instead."""
    import subprocess
    import sys

    argv = [sys.executable, "-m", "agents.server", "--port", str(agent.port), "--workdir", str(tmp_path / "wd")]
    second = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert second.returncode == 2, second.stderr
    assert f"cannot listen on 127.0.0.1:{agent.port}" in second.stderr and "Traceback" not in second.stderr
    assert agent.client.status().agent_version  # the first one still serves it


def test_a_cut_off_upload_leaves_no_bundle(agent, bundle) -> None:
    folder, _, _ = bundle
    text = (folder / MANIFEST).read_text()
    from agents.bundle import parse_manifest

    manifest = parse_manifest(text)
    sha = manifest.sha256()
    first_file = manifest.partitions[0].file
    data = (folder / first_file).read_bytes()

    def chunks():
        yield pb.BundleChunk(bundle_sha256=sha, manifest_json=text)
        yield pb.BundleChunk(bundle_sha256=sha, file=first_file, offset=0, data=data[: len(data) // 2])

    fresh = LocalAgent()
    with fresh as a:
        with pytest.raises(grpc.RpcError) as raw:
            a.client.stub.LoadBundle(chunks(), timeout=30)
        assert raw.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert sha not in a.client.status().bundles
        assert not [p for p in (Path(a.workdir) / "bundles").iterdir()]
