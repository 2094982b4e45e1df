"""The board-side agent runs with only onnxruntime, grpcio, numpy and psutil: torch, pulp, onnx and the
host-side parts of parapipe are made unimportable in its process."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

from agents.executor import generate_inputs
from compiler import compile_plan, write_bundle
from parapipe.local_agent import LocalAgent
from tests.support.plans import executor_plans, model_and_graph

BLOCKER = """
import importlib.abc, runpy, sys
FORBIDDEN = {"torch", "pulp", "highspy", "onnx", "onnxscript", "typer", "rich", "paramiko", "matplotlib",
             "models", "planner", "parapipe", "device_profiles"}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in FORBIDDEN:
            raise ImportError(f"board-side agent must not import {name}")
        return None
sys.meta_path.insert(0, Block())
sys.argv = ["agents.server", *sys.argv[1:]]
runpy.run_module("agents.server", run_name="__main__")
"""


def test_agent_runs_without_host_side_packages(exported, two_cores, tmp_path: Path) -> None:
    loaded, graph = model_and_graph(exported, "squeezenet1_1")
    compiled = compile_plan(executor_plans(loaded, graph, two_cores)["two-stages"], loaded, graph, two_cores)
    folder = write_bundle(compiled, tmp_path / "bundle")
    script = tmp_path / "blocked_agent.py"
    script.write_text(BLOCKER)
    with LocalAgent(python=[sys.executable, str(script)]) as agent:
        client = agent.client
        sha = client.load_bundle(folder).bundle_sha256
        client.start(sha)
        inputs = generate_inputs(compiled.manifest.inputs)
        got = client.infer(inputs)
        ref = ort.InferenceSession(loaded.proto.SerializeToString()).run(None, inputs)[0]
        assert np.max(np.abs(next(iter(got.values())) - ref)) <= 1e-5
        assert client.benchmark(frames=5, warmup=1).throughput_fps > 0
        assert "ImportError" not in agent.log_path.read_text()
