"""Bundles and requests an attacker or a flaky link sends: bounded, streamed to disk, never fatal to the agent.

Every test runs real agent processes; timeouts are hang guards only.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import grpc
import numpy as np
import pytest

from agents.bundle import MANIFEST, parse_manifest
from agents.client import AgentError
from agents.proto import parapipe_agent_pb2 as pb
from agents.proto import parapipe_agent_pb2_grpc as rpc
from parapipe.local_agent import LocalAgent
from tests.support.tiny import (
    GUARD_S,
    TABLE_ROWS,
    bundle_sha,
    eventually,
    expected,
    frame,
    start_two_hosts,
    write_tiny_bundle,
)


def _chunks(sha: str, manifest_text: str, files: dict[str, bytes]) -> Iterator[pb.BundleChunk]:
    yield pb.BundleChunk(bundle_sha256=sha, manifest_json=manifest_text)
    for name, data in files.items():
        yield pb.BundleChunk(bundle_sha256=sha, file=name, offset=0, data=data)


def _upload(client, folder: Path) -> Iterator[pb.BundleChunk]:
    text = (folder / MANIFEST).read_text()
    files = {p.file: (folder / p.file).read_bytes() for p in parse_manifest(text).local_partitions()}
    return _chunks(parse_manifest(text).sha256(), text, files)


def _peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_chunk_offsets_must_follow_the_file(tmp_path: Path) -> None:
    folder = write_tiny_bundle(tmp_path / "b")
    text = (folder / MANIFEST).read_text()
    sha = parse_manifest(text).sha256()
    with LocalAgent() as agent:
        for offset in (1 << 40, 1):  # far past the end (a sparse file to hash), or a hole
            chunks = [
                pb.BundleChunk(bundle_sha256=sha, manifest_json=text),
                pb.BundleChunk(bundle_sha256=sha, file="s0.onnx", offset=offset, data=b"xx"),
            ]
            with pytest.raises(grpc.RpcError) as raw:
                agent.client.stub.LoadBundle(iter(chunks), timeout=GUARD_S)
            assert raw.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "in order" in raw.value.details()
        assert not list((Path(agent.workdir) / "bundles").iterdir())


def test_an_upload_is_streamed_to_disk_not_held_in_memory(tmp_path: Path) -> None:
    """The first chunk carries manifest and data (allowed): the rest of the stream must still not pile up
    in the agent's memory (it grows by far less than the 256 MiB sent)."""
    folder = write_tiny_bundle(tmp_path / "b")
    text = (folder / MANIFEST).read_text()
    sha = parse_manifest(text).sha256()
    model = (folder / "s0.onnx").read_bytes()
    block = b"\1" * (1 << 20)

    def chunks() -> Iterator[pb.BundleChunk]:
        yield pb.BundleChunk(bundle_sha256=sha, manifest_json=text, file="s0.onnx", offset=0, data=model)
        offset = len(model)
        for _ in range(256):
            yield pb.BundleChunk(bundle_sha256=sha, file="s0.onnx", offset=offset, data=block)
            offset += len(block)

    with LocalAgent() as agent:
        assert agent.process is not None
        before = _peak_rss_kib(agent.process.pid)
        with pytest.raises(grpc.RpcError) as raw:
            agent.client.stub.LoadBundle(chunks(), timeout=4 * GUARD_S)
        assert raw.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "sha256" in raw.value.details()
        grown_mib = (_peak_rss_kib(agent.process.pid) - before) / 1024
        assert grown_mib < 96, f"the agent's peak memory grew by {grown_mib:.0f} MiB during a 256 MiB upload"


def test_an_upload_beyond_the_agents_limit_is_refused(tmp_path: Path) -> None:
    import sys

    folder = write_tiny_bundle(tmp_path / "b")
    argv = [sys.executable, "-m", "agents.server", "--max-bundle-bytes", "100"]
    with LocalAgent(python=argv) as agent:
        with pytest.raises(AgentError) as info:
            agent.client.load_bundle(folder)
        assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT and "limit of 100 bytes" in str(info.value)


def test_concurrent_uploads_of_one_bundle_both_succeed(tmp_path: Path) -> None:
    folder = write_tiny_bundle(tmp_path / "b")
    both_started = threading.Barrier(2, timeout=GUARD_S)
    replies: list[pb.LoadBundleReply] = []
    errors: list[BaseException] = []

    def upload(client) -> None:
        def chunks() -> Iterator[pb.BundleChunk]:
            parts = list(_upload(client, folder))
            yield parts[0]
            time.sleep(0.5)  # let the agent take the manifest and open its temporary folder
            both_started.wait()
            yield from parts[1:]

        try:
            replies.append(client.stub.LoadBundle(chunks(), timeout=GUARD_S))
        except BaseException as exc:
            errors.append(exc)

    with LocalAgent() as agent:
        threads = [threading.Thread(target=upload, args=(agent.client,)) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(2 * GUARD_S)
        assert not errors, errors
        assert len(replies) == 2 and {r.bundle_sha256 for r in replies} == {bundle_sha(folder)}
        agent.client.start(bundle_sha(folder))
        assert np.array_equal(agent.client.infer(frame(1))["t1"], expected(1, 2))
        assert [p.name for p in (Path(agent.workdir) / "bundles").iterdir()] == [bundle_sha(folder)]


def test_uploads_cut_off_before_a_restart_are_cleaned_up(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    stale = workdir / "bundles" / f".{'a' * 64}.partial-1234abcd"
    stale.mkdir(parents=True)
    (stale / "s0.onnx").write_bytes(b"half a model")
    half_written = workdir / ".pipeline.json.tmp-1234abcd"  # a record being replaced when the board lost power
    half_written.write_text('{"bund')
    users = workdir / "notes.tmp-1234abcd"
    users.write_text("not the agent's")
    with LocalAgent(workdir=workdir) as agent:
        assert agent.client.status().bundles == []
        assert not stale.exists() and not half_written.exists()
        assert users.exists()


@pytest.mark.parametrize("how", ["cancelled", "closed early"])
def test_an_upload_cut_off_mid_stream_leaves_nothing_behind(tmp_path: Path, how: str) -> None:
    """The client goes away halfway through a file (cancelled, or its stream simply ends): the
    agent removes the upload's temporary folder at once, keeps serving, and the bundle can be sent again."""
    folder = write_tiny_bundle(tmp_path / "b")
    text = (folder / MANIFEST).read_text()
    sha = parse_manifest(text).sha256()
    data = (folder / "s0.onnx").read_bytes()
    hold = threading.Event()

    def half() -> Iterator[pb.BundleChunk]:
        yield pb.BundleChunk(bundle_sha256=sha, manifest_json=text)
        yield pb.BundleChunk(bundle_sha256=sha, file="s0.onnx", offset=0, data=data[:20])
        if how == "cancelled":
            hold.wait(GUARD_S)

    with LocalAgent() as agent:
        bundles = Path(agent.workdir) / "bundles"
        call = agent.client.stub.LoadBundle.future(half(), timeout=GUARD_S)
        if how == "cancelled":
            eventually("the upload is under way", lambda: any(p.name.startswith(".") for p in bundles.iterdir()))
            call.cancel()
            hold.set()
        else:
            with pytest.raises(grpc.RpcError) as raw:
                call.result()
            assert raw.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        eventually("the temporary folder is gone", lambda: not list(bundles.iterdir()))
        assert agent.client.load_bundle(folder).bundle_sha256 == sha
        assert [p.name for p in bundles.iterdir()] == [sha]


@pytest.mark.parametrize("name", [MANIFEST, ".", ".."])
def test_a_bundle_may_not_use_reserved_file_names(tmp_path: Path, name: str) -> None:
    """A partition stored as manifest.json would replace the manifest the bundle's hash names
    (here with another valid manifest, which would then run); "." and ".." name folders."""
    inner = write_tiny_bundle(tmp_path / "inner", stages=1)
    inner_text = (inner / MANIFEST).read_text()
    outer = json.loads(write_tiny_bundle(tmp_path / "outer", stages=2).joinpath(MANIFEST).read_text())
    outer["partitions"][1]["file"] = name
    outer["partitions"][1]["sha256"] = hashlib.sha256(inner_text.encode()).hexdigest()
    outer["partitions"][0]["sha256"] = hashlib.sha256((inner / "s0.onnx").read_bytes()).hexdigest()
    text = json.dumps(outer, indent=1, sort_keys=True) + "\n"
    sha = parse_manifest(text).sha256()
    files = {"s0.onnx": (inner / "s0.onnx").read_bytes(), name: inner_text.encode()}
    with LocalAgent() as agent:
        with pytest.raises(grpc.RpcError) as raw:
            agent.client.stub.LoadBundle(_chunks(sha, text, files), timeout=GUARD_S)
        assert raw.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "reserved" in raw.value.details()
        assert str(agent.workdir) not in raw.value.details()
        assert agent.client.status().bundles == []


def test_a_failed_start_leaves_the_running_pipeline_serving(tmp_path: Path) -> None:
    good = write_tiny_bundle(tmp_path / "good")
    broken = write_tiny_bundle(tmp_path / "broken", stages=3)
    manifest = json.loads((broken / MANIFEST).read_text())
    garbage = b"not an onnx model"
    (broken / "s2.onnx").write_bytes(garbage)
    manifest["partitions"][2]["sha256"] = hashlib.sha256(garbage).hexdigest()
    (broken / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    with LocalAgent() as agent:
        client = agent.client
        client.start(client.load_bundle(good).bundle_sha256)
        with pytest.raises(AgentError) as info:
            client.start(client.load_bundle(broken).bundle_sha256)
        assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION and "s2" in str(info.value)
        assert client.ready() and client.status().running_bundle == bundle_sha(good)
        assert np.array_equal(client.infer(frame(3))["t1"], expected(3, 2))


def test_benchmark_and_profile_requests_are_bounded(tmp_path: Path) -> None:
    folder = write_tiny_bundle(tmp_path / "b")
    with LocalAgent() as agent:
        client = agent.client
        client.start(client.load_bundle(folder).bundle_sha256)
        model = (folder / "s0.onnx").read_bytes()
        for request in (
            pb.ProfileRequest(model=model, threads=100_000),
            pb.ProfileRequest(model=model, repeats=100_000_000),
            pb.ProfileRequest(model=model, warmup=100_000_000),
            pb.ProfileRequest(model=model, cores=[100_000]),
        ):
            with pytest.raises(grpc.RpcError) as raw:
                client.stub.ProfileOps(request, timeout=GUARD_S)
            assert raw.value.code() == grpc.StatusCode.INVALID_ARGUMENT, request
        for request in (pb.BenchmarkRequest(frames=4_000_000_000), pb.BenchmarkRequest(frames=5, warmup=4_000_000_000)):
            with pytest.raises(grpc.RpcError) as raw:
                client.stub.Benchmark(request, timeout=GUARD_S)
            assert raw.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert client.benchmark(frames=5, warmup=1).frames == 5  # sane requests still run


def test_a_peer_that_stops_answering_breaks_the_link_by_keepalive(tmp_path: Path) -> None:
    """b freezes (SIGSTOP: its socket stays open, nothing answers): a's link notices by keepalive,
    a stops being ready and refuses frames naming b, instead of holding them for the stream's week."""
    env = {"PARAPIPE_PEER_KEEPALIVE_S": "2", "PARAPIPE_PEER_KEEPALIVE_TIMEOUT_S": "2"}
    with ExitStack() as stack:
        a, b = start_two_hosts(stack, tmp_path, stages=2, max_inflight=2, extra_env=env)
        assert np.array_equal(a.client.infer(frame(0))["t1"], expected(0, 2))
        assert b.process is not None
        os.kill(b.process.pid, signal.SIGSTOP)
        stack.callback(os.kill, b.process.pid, signal.SIGCONT)
        eventually("a is no longer ready", lambda: not a.client.ready(), timeout=2 * GUARD_S)
        with pytest.raises(AgentError, match="host 'b'"):  # after waiting its deadline for b to come back
            a.client.infer(frame(TABLE_ROWS - 1), timeout=2.0)
        assert a.client.health() == "SERVING"


def _with_external_weights(model: bytes, location: str) -> bytes:
    """The Relu stage with an extra initializer whose data is said to live at ``location``."""
    import onnx
    from onnx import TensorProto

    proto = onnx.load_from_string(model)
    t = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4])
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", "0"), ("length", "16")):
        t.external_data.add(key=k, value=v)
    proto.graph.initializer.append(t)
    return proto.SerializeToString()


@pytest.mark.parametrize("location", ["/etc/hostname", "../../../../etc/hostname", "sub/../../x.bin"])
def test_external_data_outside_the_bundle_is_refused_before_onnxruntime_reads_it(tmp_path: Path, location) -> None:
    folder = write_tiny_bundle(tmp_path / "b")
    manifest = json.loads((folder / MANIFEST).read_text())
    data = _with_external_weights((folder / "s1.onnx").read_bytes(), location)
    (folder / "s1.onnx").write_bytes(data)
    manifest["partitions"][1]["sha256"] = hashlib.sha256(data).hexdigest()
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    with LocalAgent() as agent:
        sha = agent.client.load_bundle(folder).bundle_sha256
        with pytest.raises(AgentError) as info:
            agent.client.start(sha)
        assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "outside the bundle" in str(info.value) and "'w'" in str(info.value)
        with pytest.raises(grpc.RpcError) as raw:
            agent.client.stub.ProfileOps(pb.ProfileRequest(model=data), timeout=GUARD_S)
        assert raw.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "carry its weights" in raw.value.details()


def test_an_agent_refuses_an_onnxruntime_older_than_it_supports(tmp_path: Path) -> None:
    import subprocess
    import sys

    fake = tmp_path / "old" / "onnxruntime"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('__version__ = "1.12.1"\n')
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), str(fake.parent)]))
    result = subprocess.run(
        [sys.executable, "-m", "agents.server", "--port", "0", "--workdir", str(tmp_path / "w")],
        capture_output=True,
        text=True,
        env=env,
        timeout=GUARD_S,
    )
    assert result.returncode == 2 and "onnxruntime 1.12.1 is older than 1.13" in result.stderr


def test_external_locations_are_found_in_subgraphs_and_attributes() -> None:
    """The agent's own protobuf walk finds what onnx finds: initializers, Constant tensors, If branches."""
    import onnx
    from onnx import TensorProto, helper

    from agents.external_data import external_locations

    def ext(name: str, location: str) -> onnx.TensorProto:
        t = onnx.TensorProto(name=name, data_type=TensorProto.FLOAT, dims=[1])
        t.data_location = TensorProto.EXTERNAL
        t.external_data.add(key="location", value=location)
        return t

    branch = helper.make_graph(
        [helper.make_node("Constant", [], ["c"], value=ext("in_then", "then.bin"))],
        "then",
        [],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [1])],
    )
    other = helper.make_graph([], "else", [], [helper.make_tensor_value_info("w", TensorProto.FLOAT, [1])])
    graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=other)],
        "g",
        [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        [ext("w", "w.bin")],
    )
    model = helper.make_model(graph).SerializeToString()
    assert sorted(external_locations(model)) == [("in_then", "then.bin"), ("w", "w.bin")]
    assert external_locations(helper.make_model(helper.make_graph([], "e", [], [])).SerializeToString()) == []


def _declared_input_model(shape: list[int]) -> bytes:
    """A model of a few bytes that declares an input of ``shape`` (an Identity)."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "huge",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_a_huge_declared_input_is_refused_before_it_is_allocated(tmp_path: Path) -> None:
    """A model of ~100 bytes declaring a [65536, 65536] float input (16 GiB) made ProfileOps try to allocate it
    (INTERNAL MemoryError where memory is capped, a stalled board where it is not); a manifest declaring one made
    Benchmark do the same. Both are refused before anything is allocated, saying the bound."""
    folder = write_tiny_bundle(tmp_path / "b")
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["inputs"][0]["shape"] = [65536, 65536]
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    with LocalAgent() as agent:
        before = _rss_mib(agent.process.pid)
        with pytest.raises(grpc.RpcError) as raw:
            agent.client.stub.ProfileOps(pb.ProfileRequest(model=_declared_input_model([65536, 65536])), timeout=60)
        assert raw.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "16384 MiB" in raw.value.details() and "64 MiB" in raw.value.details()
        text = (folder / MANIFEST).read_text()  # sent as is (the client would refuse it first)
        chunk = pb.BundleChunk(bundle_sha256=hashlib.sha256(text.encode()).hexdigest(), manifest_json=text)
        with pytest.raises(grpc.RpcError) as raw:
            agent.client.stub.LoadBundle(iter([chunk]), timeout=60)
        assert raw.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "32768 MiB" in raw.value.details()
        assert _rss_mib(agent.process.pid) - before < 50
        assert agent.client.profile_ops(pb.ProfileRequest(model=_declared_input_model([1, 8]), repeats=3)).timings


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _slow_model(convs: int = 12) -> bytes:
    """A chain of 3x3 convolutions on 1x16x96x96: tens of milliseconds a run on one core."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, weights, x = [], [], "x"
    for i in range(convs):
        w = numpy_helper.from_array(rng.standard_normal((16, 16, 3, 3)).astype(np.float32) * 0.1, f"w{i}")
        weights.append(w)
        nodes.append(helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]))
        x = f"c{i}"
    graph = helper.make_graph(
        nodes,
        "slow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 96, 96])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 16, 96, 96])],
        weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.parametrize("per_op", [False, True])
def test_profiling_stops_when_its_callers_deadline_passes(per_op: bool) -> None:
    """ProfileOps went on after its caller's deadline (10,000 repeats burning a core) and refused the next call
    with RESOURCE_EXHAUSTED; now it stops at the next run, and the next call is served."""
    with LocalAgent() as agent:
        request = pb.ProfileRequest(model=_slow_model(), threads=1, repeats=10_000, warmup=1, per_op=per_op)
        with pytest.raises(grpc.RpcError) as raw:
            agent.client.stub.ProfileOps(request, timeout=1.5)
        assert raw.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        pid = agent.process.pid
        time.sleep(1.0)  # a run in progress ends
        before = _cpu_s(pid)
        time.sleep(1.0)
        assert _cpu_s(pid) - before < 0.3, "the agent is still profiling for a caller who left"
        small = pb.ProfileRequest(model=_declared_input_model([1, 8]), repeats=3)
        assert agent.client.stub.ProfileOps(small, timeout=30).timings


def test_a_peer_cannot_make_an_agent_hold_tensors_for_frames_far_ahead(tmp_path: Path) -> None:
    """300 one-MiB tensors for frames far ahead on an Exchange stream took a peer agent from 83 to 396 MiB with
    max_inflight 2: each was held for a frame that could never come. Now a tensor more than the pipeline's
    bound ahead of the partition that reads it ends the stream with INVALID_ARGUMENT, and the plan runs on."""
    with ExitStack() as stack:
        a, b = start_two_hosts(stack, tmp_path, stages=2, max_inflight=2)
        assert np.array_equal(a.client.infer(frame(0))["t1"], expected(0, 2))
        plan_bundle = parse_manifest((tmp_path / "b" / MANIFEST).read_text()).plan_bundle
        before = _rss_mib(b.process.pid)
        big = np.zeros((1 << 18,), np.float32).tobytes()  # 1 MiB

        def handoffs() -> Iterator[pb.Handoff]:
            for k in range(300):
                yield pb.Handoff(
                    plan_bundle=plan_bundle,
                    frame=1_000 + k,
                    tensor=pb.Tensor(name="t0", dtype="float32", shape=[1 << 18], data=big),
                )

        with pytest.raises(grpc.RpcError) as raw:
            rpc.AgentStub(b.client.channel).Exchange(handoffs(), timeout=GUARD_S)
        assert raw.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "frames ahead" in raw.value.details()
        assert _rss_mib(b.process.pid) - before < 60
        assert np.array_equal(a.client.infer(frame(1))["t1"], expected(1, 2))
