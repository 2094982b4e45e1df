"""A small two-input, three-output model compiled into real plans (one host, two hosts), and a
Triton client (``tritonclient[grpc]``, installed outside the environment) run as an application would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from agents.bundle import parse_manifest
from agents.executor import generate_inputs
from agents.peers import Peer
from compiler import compile_plan, write_bundle, write_bundles
from device_profiles.loader import load_profile
from models.coarsen import coarsen
from models.graph import build_graph
from models.onnx_io import load_onnx
from parapipe.local_agent import LocalAgent
from planner.baselines import flop_pipeline
from tests.support.packages import folders_for, python_path

TRITONCLIENT = "tritonclient[grpc]==2.73.0"
ROWS = 8


def write_model(path: Path) -> Path:
    """x: float32[1,16] and ids: int64[1] -> "out:a" float32, "scores" float32, "label" int64 (branches)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((ROWS, 16)).astype(np.float32), "table")] + [
        numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), f"w{i}") for i in range(4)
    ]
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["e"], axis=0, name="embed"),
        helper.make_node("Add", ["x", "e"], ["h"], name="add"),
        helper.make_node("MatMul", ["h", "w0"], ["t1"], name="mm0"),
        helper.make_node("Relu", ["t1"], ["t2"], name="relu0"),
        helper.make_node("MatMul", ["t2", "w1"], ["t3"], name="mm1"),
        helper.make_node("Tanh", ["t3"], ["out:a"], name="tanh"),
        helper.make_node("MatMul", ["t2", "w2"], ["m"], name="mm2"),
        helper.make_node("Relu", ["m"], ["m2"], name="relu1"),
        helper.make_node("MatMul", ["m2", "w3"], ["scores"], name="mm3"),
        helper.make_node("ArgMax", ["scores"], ["label"], axis=1, keepdims=1, name="argmax"),
    ]
    graph = helper.make_graph(
        nodes,
        "serving",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16]),
            helper.make_tensor_value_info("ids", TensorProto.INT64, [1]),
        ],
        [
            helper.make_tensor_value_info("out:a", TensorProto.FLOAT, [1, 16]),
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 16]),
            helper.make_tensor_value_info("label", TensorProto.INT64, [1, 1]),
        ],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


@dataclass(frozen=True)
class Served:
    """A compiled plan of the model: bundle folders by host ("" for one host), and the full model."""

    parts: dict[str, Path]
    entry: str
    plan_name: str
    model: Path
    inputs: tuple

    def frames(self, n: int) -> list[dict[str, np.ndarray]]:
        return [generate_inputs(self.inputs, seed=s) for s in range(n)]

    def reference(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        session = ort.InferenceSession(str(self.model), providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        return dict(zip(names, session.run(None, inputs), strict=True))


def two_unit_profile():
    """This machine as two one-core PUs (the first two cores it may use; one core twice on a single-core machine)."""
    from device_profiles.loader import parse_profile

    cores = sorted(os.sched_getaffinity(0))
    q = {"value": 1.0, "source": "estimate", "cite": "test profile"}
    peaks = {c: dict(q, value=50.0) for c in ("conv", "depthwise", "matmul", "elementwise", "pooling", "other")}
    pu = {
        "kind": "cpu",
        "peak_gflops": peaks,
        "memory_bandwidth_gbps": dict(q, value=10.0),
        "memory_bytes": dict(q, value=8e9),
        "launch_overhead_us": dict(q, value=5.0),
        "active_power_w": dict(q, value=5.0),
        "idle_power_w": dict(q, value=1.0),
    }
    return parse_profile(
        {
            "schema_version": 1,
            "name": "two-units",
            "pus": [dict(pu, name="c0", cores=[cores[0]]), dict(pu, name="c1", cores=[cores[-1]])],
            "links": [{"a": "c0", "b": "c1", "bandwidth_gbps": dict(q, value=10.0), "latency_us": dict(q, value=2.0)}],
        }
    )


def compile_served(folder: Path, two_hosts: bool) -> Served:
    """A two-stage pipeline of the model: on two units of this host, or edge then cloud (two hosts)."""
    model = write_model(folder / "serving.onnx")
    loaded = load_onnx(model)
    graph = build_graph(loaded.proto, loaded.sha256, "serving")
    blocks = coarsen(graph, "coarse")
    if two_hosts:
        profile = load_profile("local-edge-cloud")
        plan = flop_pipeline(blocks, profile, [("edge", 1), ("cloud", 1)], name="serving-two-hosts")
        compiled = compile_plan(plan, loaded, graph, profile)
        parts = write_bundles(compiled, folder / "bundles")
        return Served(parts, compiled.manifest.entry, plan.name, model, compiled.manifest.inputs)
    profile = two_unit_profile()
    plan = flop_pipeline(blocks, profile, [("c0", 1), ("c1", 1)], name="serving")
    compiled = compile_plan(plan, loaded, graph, profile)
    return Served({"": write_bundle(compiled, folder / "bundle")}, "", plan.name, model, compiled.manifest.inputs)


def write_two_host_plan(folder: Path) -> Path:
    """The model's plan over the ``local-edge-cloud`` profile's two hosts, as a plan file naming its model."""
    model = write_model(folder / "serving.onnx")
    loaded = load_onnx(model)
    blocks = coarsen(build_graph(loaded.proto, loaded.sha256, "serving"), "coarse")
    plan = flop_pipeline(blocks, load_profile("local-edge-cloud"), [("edge", 1), ("cloud", 1)], name="edge-then-cloud")
    path = folder / "edge-then-cloud.json"
    path.write_text(json.dumps(dict(plan.to_json(), model_path=str(model))))
    return path


def start_served(stack: ExitStack, served: Served, **agent_args) -> LocalAgent:
    """Agents for every host of the plan, started (the entry host last); returns the entry host's."""
    return start_hosts(stack, served, **agent_args)[served.entry]


def start_hosts(stack: ExitStack, served: Served, **agent_args) -> dict[str, LocalAgent]:
    """Agents for every host of the plan ("" for one host), started, the entry host last."""
    agents = {h: stack.enter_context(LocalAgent(**agent_args)) for h in served.parts}
    for h, part in served.parts.items():
        agents[h].client.load_bundle(part)
    for h in sorted(served.parts, key=lambda h: h == served.entry):
        peers = [Peer(o, f"127.0.0.1:{agents[o].port}") for o in served.parts if o != h]
        agents[h].client.start(parse_manifest((served.parts[h] / "manifest.json").read_text()).sha256(), peers=peers)
    return agents


def run_client(script: str, folder: Path, *extra: Path, **values: object) -> dict:
    """Run ``script`` in its own process with tritonclient[grpc] (and the protobuf it wants);
    ``values`` arrive as the dict ``ARGS``; what it prints last (JSON) comes back."""
    # the environment's (the dev extra installs it beside parapipe), else one installed outside it
    folders = folders_for("tritonclient.grpc", "tritonclient-grpc-2.73.0", TRITONCLIENT)
    env = dict(os.environ, PYTHONPATH=python_path(*folders, *extra))
    code = f"import json\nARGS = json.loads({json.dumps(json.dumps(values))})\n" + script
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, cwd=folder
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
