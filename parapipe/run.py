"""``parapipe run``: compile a plan, run it on a board's agent, and compare measured with predicted.

For the embedded ``local`` board the agent is a child process on 127.0.0.1. Every run
is appended to ``$PARAPIPE_HOME/measurements.jsonl`` for the profiler's calibration.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agents.bundle import verify_bundle
from agents.executor import generate_inputs
from device_profiles.loader import load_profile
from models.graph import build_graph
from models.onnx_io import LoadedModel, load_onnx
from parapipe.compile import compile_plan, write_bundle
from parapipe.home import parapipe_home
from parapipe.local_agent import DeployError, LocalAgent
from planner.plan import Plan

LOCAL_BOARDS = ("local", "local-biglittle")


@dataclass(frozen=True)
class RunResult:
    plan: str
    board: str
    bundle_sha256: str
    measured: dict[str, float]
    predicted: dict[str, float]
    errors_pct: dict[str, float]
    energy_source: str
    max_abs_diff: float | None
    partitions: list[dict[str, Any]]
    uploaded_bytes: int

    def to_json(self) -> dict[str, Any]:
        return self.__dict__.copy()


def resolve_model(plan: Plan, model: Path | None) -> LoadedModel:
    path = model or (Path(plan.model_path) if plan.model_path else None)
    if path is None or not path.exists():
        raise DeployError(
            f"the plan names no model file that exists here ({plan.model_path or 'none'}); pass --model MODEL.onnx"
        )
    loaded = load_onnx(path)
    if loaded.sha256 != plan.model_sha256:
        raise DeployError(
            f"{path} is not the model this plan was made for (sha256 {loaded.sha256[:12]}… vs {plan.model_sha256[:12]}…); "
            "re-plan for this model or pass the right --model"
        )
    return loaded


def build_bundle(plan: Plan, loaded: LoadedModel) -> tuple[Path, float]:
    profile = load_profile(plan.device)
    graph = build_graph(loaded.proto, loaded.sha256)
    compiled = compile_plan(plan, loaded, graph, profile)
    folder = parapipe_home() / "bundles" / compiled.sha256
    if not (folder.exists() and _intact(folder)):
        write_bundle(compiled, folder)
    return folder, compiled.max_abs_diff


def _intact(folder: Path) -> bool:
    try:
        verify_bundle(folder)
    except (OSError, ValueError):
        return False
    return True


def run_plan(
    plan: Plan, board: str, model: Path | None, frames: int = 50, verify: bool = False, progress=None
) -> RunResult:
    """Run on the embedded local board (child agent) or on an inventory board (deploy over SSH)."""
    remote = None
    if board not in LOCAL_BOARDS:
        from parapipe.boards import get_board

        remote = get_board(board)
        device = remote.device
    else:
        device = board
    if plan.device != device:
        raise DeployError(
            f"the plan is for {plan.device!r}; board {board!r} runs plans made with --device {device}. Re-plan for this board."
        )
    loaded = resolve_model(plan, model)
    if progress:
        progress("compiling and checking the bundle")
    folder, _ = build_bundle(plan, loaded)
    if remote is None:
        with LocalAgent() as agent:
            assert agent.client is not None
            if progress:
                progress("loading the bundle on the agent")
            reply = agent.client.load_bundle(folder)
            agent.client.start(reply.bundle_sha256)
            return _measure(plan, board, agent.client, folder, loaded, reply, frames, verify, progress)
    from parapipe.deploy import agent_client, deploy
    from parapipe.ssh import BoardConnection

    result = deploy(remote, folder)
    with BoardConnection(remote) as conn, agent_client(conn) as client:
        from agents.proto import parapipe_agent_pb2 as pb

        reply = pb.LoadBundleReply(bundle_sha256=result.bundle_sha256, bytes_received=result.bundle_uploaded_bytes)
        return _measure(plan, board, client, folder, loaded, reply, frames, verify, progress)


def _measure(
    plan: Plan, board: str, client, folder: Path, loaded: LoadedModel, reply, frames: int, verify: bool, progress
) -> RunResult:
    diff = None
    if verify:
        import onnxruntime as ort

        manifest = verify_bundle(folder)
        inputs = generate_inputs(manifest.inputs, seed=7)
        got = client.infer(inputs)
        full = ort.InferenceSession(loaded.proto.SerializeToString(), providers=["CPUExecutionProvider"])
        expected = dict(zip([o.name for o in full.get_outputs()], full.run(None, inputs), strict=True))
        diff = max(float(np.max(np.abs(got[k].astype(np.float64) - v))) for k, v in expected.items())
    if progress:
        progress(f"benchmarking {frames} frames on the board")
    bench = client.benchmark(frames, warmup=max(3, frames // 10))
    measured = {
        "latency_ms": bench.latency_alone_ms,
        "latency_p50_at_rate_ms": bench.latency_p50_ms,
        "latency_p99_at_rate_ms": bench.latency_p99_ms,
        "throughput_fps": bench.throughput_fps,
        "energy_mj": bench.energy_mj,
    }
    predicted: dict[str, float] = {}
    if plan.predicted:
        predicted = {
            "latency_ms": plan.predicted.latency_ms,
            "throughput_fps": plan.predicted.throughput_fps,
            "energy_mj": plan.predicted.energy_mj,
        }
    if plan.simulated:
        predicted["latency_p50_at_rate_ms"] = plan.simulated.latency_ms
    errors = {k: (predicted[k] - measured[k]) / measured[k] * 100 for k in predicted if measured.get(k)}
    result = RunResult(
        plan=plan.name,
        board=board,
        bundle_sha256=reply.bundle_sha256,
        measured=measured,
        predicted=predicted,
        errors_pct=errors,
        energy_source=bench.energy_source,
        max_abs_diff=diff,
        partitions=[
            {"name": p.name, "pu": p.pu, "busy_ms": p.busy_ms, "queue_wait_ms": p.queue_wait_ms, "frames": p.frames}
            for p in bench.partitions
        ],
        uploaded_bytes=reply.bytes_received,
    )
    record(plan, result)
    return result


def record(plan: Plan, result: RunResult) -> Path:
    """Append the measurement (with the plan that produced it) for calibration; one JSON line per run."""
    path = parapipe_home() / "measurements.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps({"time": time.time(), "plan": plan.to_json(), "result": result.to_json()}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())  # one write of one line: appends do not interleave
    finally:
        os.close(fd)
    return path
