"""Plans over two hosts: two real agent processes on 127.0.0.1 stream tensors to each other over gRPC.

The ``local-edge-cloud`` profile makes this machine an edge (first core) and a cloud
node (second core); every host gets its own agent process. The host talks only to the
entry agent; the other agent's partitions get their inputs from it directly.
"""

from __future__ import annotations

import os
from contextlib import ExitStack

import grpc
import numpy as np
import onnxruntime as ort
import pytest

from agents.bundle import parse_manifest
from agents.client import AgentError
from agents.executor import generate_inputs
from agents.peers import Peer
from agents.proto import parapipe_agent_pb2 as pb
from agents.proto import parapipe_agent_pb2_grpc as rpc
from compiler import compile_plan, host_bundles, write_bundles
from device_profiles.loader import load_profile
from models.coarsen import coarsen
from parapipe.local_agent import LocalAgent
from planner.baselines import flop_pipeline
from tests.support.plans import branch_plan, model_and_graph

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")


@pytest.fixture(scope="module")
def edge_cloud():
    return load_profile("local-edge-cloud")


def _plans(loaded, graph, profile):
    blocks = coarsen(graph, "coarse")
    branches = branch_plan(blocks, graph, profile, "edge", "cloud", "branches-to-cloud", 2)
    return {
        "branches-to-cloud": branches,  # edge -> cloud -> edge inside one stage, several times
        "edge-then-cloud": flop_pipeline(blocks, profile, [("edge", 1), ("cloud", 1)], name="edge-then-cloud"),
        "cloud-first": flop_pipeline(blocks, profile, [("cloud", 1), ("edge", 1)], name="cloud-first"),
    }


def _start(stack: ExitStack, parts) -> dict[str, LocalAgent]:
    agents = {h: stack.enter_context(LocalAgent()) for h in parts}
    for h, part in parts.items():
        assert agents[h].client.load_bundle(part).bundle_sha256
    for h in reversed(list(parts)):  # the entry host last
        peers = [Peer(o, f"127.0.0.1:{agents[o].port}") for o in parts if o != h]
        agents[h].client.start(parse_manifest((parts[h] / "manifest.json").read_text()).sha256(), peers=peers)
    return agents


@pytest.mark.parametrize("model", ["googlenet"])  # branches cut across hosts (resnet18 too took 34 s more)
def test_plans_over_two_hosts_match_the_full_model(exported, edge_cloud, tmp_path, model) -> None:
    loaded, graph = model_and_graph(exported, model)
    full = ort.InferenceSession(loaded.proto.SerializeToString(), providers=["CPUExecutionProvider"])
    for name, plan in _plans(loaded, graph, edge_cloud).items():
        compiled = compile_plan(plan, loaded, graph, edge_cloud)
        parts = write_bundles(compiled, tmp_path / name)
        assert set(parts) == {"edge", "cloud"}, name
        entry = compiled.manifest.entry
        assert entry == ("cloud" if name == "cloud-first" else "edge")
        with ExitStack() as stack:
            agents = _start(stack, {entry: parts[entry], **{h: p for h, p in parts.items() if h != entry}})
            frames = [generate_inputs(compiled.manifest.inputs, seed=s) for s in range(6)]
            got = list(agents[entry].client.infer_stream(frames))
            for inputs, out in zip(frames, got, strict=True):
                ref = full.run(None, inputs)[0]
                assert np.max(np.abs(next(iter(out.values())) - ref)) <= 1e-5, name
            other = next(h for h in parts if h != entry)
            status = agents[other].client.status()
            assert status.host == other and status.ready
            # the other host computed every frame without the host ever sending it one
            assert status.partitions and all(p.frames >= len(frames) for p in status.partitions), name


def test_multihost_errors_name_what_is_missing(exported, edge_cloud, tmp_path) -> None:
    loaded, graph = model_and_graph(exported, "googlenet")
    plan = _plans(loaded, graph, edge_cloud)["edge-then-cloud"]
    compiled = compile_plan(plan, loaded, graph, edge_cloud)
    parts = write_bundles(compiled, tmp_path / "b")
    shas = {h: c.sha256 for h, c in host_bundles(compiled).items()}
    with LocalAgent() as edge, LocalAgent() as cloud:
        for a, h in ((edge, "edge"), (cloud, "cloud")):
            a.client.load_bundle(parts[h])
        # no peers: the agent says which host it needs
        with pytest.raises(AgentError) as exc:
            cloud.client.start(shas["cloud"])
        assert exc.value.code == grpc.StatusCode.INVALID_ARGUMENT and "edge" in str(exc.value)
        # a peer that does not answer
        with pytest.raises(AgentError) as exc:
            cloud.client.start(shas["cloud"], peers=[Peer("edge", "127.0.0.1:9")])
        assert exc.value.code == grpc.StatusCode.UNAVAILABLE and "edge" in str(exc.value)
        cloud.client.start(shas["cloud"], peers=[Peer("edge", f"127.0.0.1:{edge.port}")])
        edge.client.start(shas["edge"], peers=[Peer("cloud", f"127.0.0.1:{cloud.port}")])
        inputs = generate_inputs(compiled.manifest.inputs)
        # frames go to the entry host only
        with pytest.raises(AgentError) as exc:
            cloud.client.infer(inputs)
        assert exc.value.code == grpc.StatusCode.FAILED_PRECONDITION and "entry host 'edge'" in str(exc.value)
        # a handoff from another plan is refused; a tensor nobody here reads is refused
        stub = rpc.AgentStub(cloud.client.channel)
        wrong = pb.Handoff(plan_bundle="0" * 64, frame=0, tensor=pb.Tensor(name="x", dtype="float32"))
        with pytest.raises(grpc.RpcError) as rpc_exc:
            stub.Exchange(iter([wrong]), timeout=10)
        assert rpc_exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        manifest = parse_manifest((parts["cloud"] / "manifest.json").read_text())
        stray = pb.Handoff(plan_bundle=manifest.plan_bundle, frame=0, tensor=pb.Tensor(name="nobody", dtype="float32"))
        with pytest.raises(grpc.RpcError) as rpc_exc:
            stub.Exchange(iter([stray]), timeout=10)
        assert rpc_exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # and the plan still runs end to end
        ref = ort.InferenceSession(loaded.proto.SerializeToString()).run(None, inputs)[0]
        assert np.max(np.abs(next(iter(edge.client.infer(inputs).values())) - ref)) <= 1e-5


def test_a_peer_that_dies_fails_frames_with_its_name_instead_of_hanging(exported, edge_cloud, tmp_path) -> None:
    loaded, graph = model_and_graph(exported, "squeezenet1_1")
    plan = _plans(loaded, graph, edge_cloud)["edge-then-cloud"]
    compiled = compile_plan(plan, loaded, graph, edge_cloud)
    parts = write_bundles(compiled, tmp_path / "b")
    with ExitStack() as stack:
        agents = _start(stack, {"edge": parts["edge"], "cloud": parts["cloud"]})
        edge, cloud = agents["edge"], agents["cloud"]
        inputs = generate_inputs(compiled.manifest.inputs)
        assert edge.client.infer(inputs)
        cloud.process.kill()
        cloud.process.wait()
        # a unary call waits for the peer within its deadline, then says it is away (retryable: UNAVAILABLE)
        with pytest.raises(AgentError) as exc:
            edge.client.infer(inputs, timeout=2.0)
        assert exc.value.code == grpc.StatusCode.UNAVAILABLE
        assert "host 'cloud'" in str(exc.value) and "not back within the call's deadline" in str(exc.value)
        assert not edge.client.ready()  # no longer ready, and says why on every new frame
        with pytest.raises(AgentError, match="starts again by itself once the peer is back"):
            edge.client.infer(inputs, timeout=2.0)
        assert edge.client.health() == "SERVING"  # the agent itself keeps serving
