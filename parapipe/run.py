"""``parapipe run``: compile a plan, run it on a board's agent, and compare measured with predicted.

For the embedded boards (``local``, ``local-biglittle``, ``local-edge-cloud``) the
agent is a child process on 127.0.0.1 (one per host of the plan). An inventory board
is reached through an SSH tunnel after ``deploy``, or directly when the inventory
gives the agent's TLS address and token. A plan over several hosts gets one agent per
host: every agent is told where the others are, tensors between hosts go agent to
agent, and the host talks only to the entry agent. Every run is appended to
``$PARAPIPE_HOME/measurements.jsonl`` for the profiler's calibration.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from agents.bundle import verify_bundle
from agents.client import AgentClient
from compiler import compile_plan, host_bundles, write_bundle, write_bundles
from compiler.build import sample_frames
from device_profiles.loader import load_profile
from models.graph import build_graph
from models.onnx_io import LoadedModel
from models.partition import compare_outputs
from models.precision import PrecisionCheck, check_precision
from parapipe.home import parapipe_home
from parapipe.intake import open_model
from parapipe.local_agent import DeployError
from parapipe.reach import LOCAL_BOARDS, BoardSession, Started, board_device, open_board
from parapipe.records import Figures, PartitionMeasurement
from planner.plan import Plan


@dataclass(frozen=True)
class RunResult:
    plan: str
    board: str
    bundle_sha256: str
    measured: Figures
    predicted: Figures | None
    errors_pct: dict[str, float]
    energy_source: str
    max_abs_diff: float | None
    partitions: tuple[PartitionMeasurement, ...]
    uploaded_bytes: int
    hosts: dict[str, str] = field(default_factory=dict)  # plan host -> board (plans over several hosts)
    inputs: list[str] = field(default_factory=list)  # how each input's frames were made (data, graph rule, random)
    output_scale: float | None = None  # --verify: the largest output magnitude of the full model
    verified: bool | None = None  # --verify: within the allowed difference (relative to the output scale)
    precision: str = "fp32"  # the plan's precision mix
    # --verify on a plan with int8 blocks: the loss against fp32 by the plan's metric, the budget, the frames
    accuracy: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["measured"] = self.measured.to_json()
        data["predicted"] = self.predicted.to_json() if self.predicted else {}
        data["partitions"] = [p.to_json() for p in self.partitions]
        return data


def resolve_model(plan: Plan, model: Path | None, input_data: Path | None = None) -> LoadedModel:
    """The plan's model, opened with the input shapes it was planned for (and ``--input-data`` if given)."""
    path = model or (Path(plan.model_path) if plan.model_path else None)
    if path is None or not path.exists():
        raise DeployError(
            f"the plan names no model file that exists here ({plan.model_path or 'none'}); pass --model MODEL.onnx"
        )
    loaded = open_model(path, input_data=input_data, plan=plan)
    if loaded.sha256 != plan.model_sha256:
        raise DeployError(
            f"{path} is not the model this plan was made for (sha256 {loaded.sha256[:12]}… vs {plan.model_sha256[:12]}…); "
            "re-plan for this model or pass the right --model"
        )
    return loaded


def build_bundle(plan: Plan, loaded: LoadedModel) -> tuple[Path, float]:
    """The bundle of a single-host plan, compiled and checked (cached under $PARAPIPE_HOME/bundles)."""
    folders, diff = build_bundles(plan, loaded)
    if "" not in folders:
        raise DeployError(
            f"the plan spans hosts {', '.join(folders)}; deploy runs one board: use `parapipe run --board HOST=BOARD ...`"
        )
    return folders[""], diff


def build_bundles(plan: Plan, loaded: LoadedModel) -> tuple[dict[str, Path], float]:
    """{"": folder} for a single-host plan, else one folder per host of the plan (entry host first)."""
    profile = load_profile(plan.device)
    graph = build_graph(loaded.proto, loaded.sha256)
    compiled = compile_plan(plan, loaded, graph, profile)
    folder = parapipe_home() / "bundles" / compiled.sha256
    parts = host_bundles(compiled)
    if "" in parts:
        if not (folder.exists() and _intact(folder)):
            write_bundle(compiled, folder)
        return {"": folder}, compiled.max_abs_diff
    if not all((folder / h).exists() and _intact(folder / h) for h in parts):
        write_bundles(compiled, folder)
    return {h: folder / h for h in parts}, compiled.max_abs_diff


def _intact(folder: Path) -> bool:
    try:
        verify_bundle(folder)
    except (OSError, ValueError):
        return False
    return True


def run_plan(
    plan: Plan,
    board: str | Mapping[str, str],
    model: Path | None,
    frames: int = 50,
    verify: bool = False,
    progress=None,
    input_data: Path | None = None,
) -> RunResult:
    """Run a plan on its board(s) and compare measured with predicted.

    ``board`` is an embedded board (local, local-biglittle, local-edge-cloud: child agents
    on 127.0.0.1) or an inventory board; a plan over several hosts of an inventory needs
    one board per host, ``{"edge": "vim3", "cloud": "gpu-box"}``.
    """
    say = progress or (lambda _msg: None)
    per_host = dict(board) if isinstance(board, Mapping) else {}
    board_name = ",".join(f"{h}={b}" for h, b in per_host.items()) if per_host else str(board)
    for name in per_host.values() or [str(board)]:
        _check_device(plan, name)
    for host, name in per_host.items() or [(None, str(board))]:
        check_runtime(plan, name, host)
    loaded = resolve_model(plan, model, input_data)
    say("compiling and checking the bundle")
    folders, _ = build_bundles(plan, loaded)
    hosts = [h for h in folders if h]
    if not hosts:
        if per_host:
            raise DeployError(f"the plan runs on one host; give one board: --board {next(iter(per_host.values()))}")
        return _run_single(Measurement(plan, str(board), loaded, frames, verify), folders[""], say)
    if not per_host:
        if board not in LOCAL_BOARDS:
            raise DeployError(
                f"the plan spans hosts {', '.join(hosts)}; give a board per host: "
                + " ".join(f"--board {h}=BOARD" for h in hosts)
            )
        per_host = {h: str(board) for h in hosts}
    missing = [h for h in hosts if h not in per_host]
    unknown = [h for h in per_host if h not in hosts]
    if missing or unknown:
        raise DeployError(
            f"the plan's hosts are {', '.join(hosts)}; "
            + (f"no board given for {', '.join(missing)}" if missing else f"it has no host {', '.join(unknown)}")
        )
    return _run_hosts(Measurement(plan, board_name, loaded, frames, verify), per_host, folders, say)


def _check_device(plan: Plan, board: str) -> None:
    device = board_device(board)
    if plan.device != device and not _same_profile(plan.device, device):
        raise DeployError(
            f"the plan is for {plan.device!r}; board {board!r} runs plans made with --device {device}. Re-plan for this board."
        )


def check_runtime(plan: Plan, board: str, host: str | None = None) -> None:
    """Refuse (DeployError, before anything is compiled or started) a plan whose units on ``board`` (those of
    ``host`` for a plan over several) need an execution provider the board's onnxruntime does not offer."""
    from parapipe.availability import plan_units

    check_board_units(plan_units(plan, load_profile(plan.device), host), board)


def check_board_units(needed: Mapping[str, str], board: str) -> None:
    """Refuse (DeployError) units (name -> execution provider) whose provider board ``board`` does not offer."""
    from parapipe.availability import accelerated, refuse_missing

    if board in LOCAL_BOARDS:
        from parapipe.reach import local_runtime_of

        refuse_missing(needed, local_runtime_of(board)[1], board)
        return
    if not accelerated(needed):
        return  # every board's agent has the CPU provider (deploy installs it where there is none)
    from parapipe.boards import direct_client, get_board

    inventory = get_board(board)
    if inventory.agent_address:
        from parapipe.availability import Runtime

        with direct_client(inventory) as client:
            status = client.status()
        runtime = Runtime(status.ort_version, tuple(status.providers), f"its agent at {inventory.agent_address}")
        refuse_missing(needed, runtime, board)
        return
    from parapipe.availability import check_board_runtime
    from parapipe.ssh import BoardConnection

    with BoardConnection(inventory) as conn:
        check_board_runtime(conn, conn.path(inventory.workdir), needed)


def _same_profile(a: str, b: str) -> bool:
    """Two names or paths of one device profile (a TOML file named by another path, or by its name)."""
    from device_profiles.schema import ProfileError

    try:
        pa, pb = load_profile(a), load_profile(b)
    except ProfileError:
        return False
    return pa.name == pb.name and pa.content_hash() == pb.content_hash()


@dataclass(frozen=True)
class Measurement:
    """What one measurement on a board needs besides the client: the plan, its model and how to run it."""

    plan: Plan
    board: str
    loaded: LoadedModel
    frames: int
    verify: bool


def _run_single(job: Measurement, folder: Path, say) -> RunResult:
    with open_board(job.board) as session:
        say(f"loading the bundle on {job.board} ({session.kind})")
        started = session.start(folder)
        result = _measure(job, session.client, started, say)
    record(job.plan, result)
    return result


def _run_hosts(job: Measurement, per_host: dict[str, str], folders: dict[str, Path], say) -> RunResult:
    hosts = list(folders)  # the entry host first
    with ExitStack() as stack:
        sessions: dict[str, BoardSession] = {}
        for h in hosts:
            say(f"starting the agent of host {h} ({per_host[h]})")
            session = stack.enter_context(open_board(per_host[h]))
            if session.peer is None:
                raise DeployError(
                    f"board {per_host[h]} is reached through an SSH tunnel, which other boards cannot use; for "
                    f"agent-to-agent streaming give its agent's address: parapipe boards add {per_host[h]} "
                    "--agent-address HOST:PORT --token-file F --tls-ca F ..."
                )
            sessions[h] = session
        peers = {h: replace(s.peer, host=h) for h, s in sessions.items() if s.peer is not None}
        loaded_bundles = {}
        for h in hosts:
            say(f"loading host {h}'s bundle")
            loaded_bundles[h] = sessions[h].load(folders[h])
        try:
            for h in reversed(hosts):  # the entry host last: its agent checks that its peers answer
                say(f"starting host {h}'s pipeline")
                sessions[h].client.start(loaded_bundles[h].bundle_sha256, peers=[peers[o] for o in hosts if o != h])
            result = _measure(job, sessions[hosts[0]].client, loaded_bundles[hosts[0]], say)
            partitions = [replace(p, host=hosts[0]) for p in result.partitions]
            for h in hosts[1:]:  # counters since start (warm-up and --verify frames included)
                partitions += [
                    PartitionMeasurement.from_stats(p, host=h) for p in sessions[h].client.status().partitions
                ]
            result = replace(
                result,
                partitions=tuple(partitions),
                hosts=dict(per_host),
                uploaded_bytes=sum(r.bytes_received for r in loaded_bundles.values()),
            )
        finally:
            for h in hosts:
                try:
                    sessions[h].client.stop()
                except Exception:  # the agent may be gone already; the run's own error matters more
                    pass
    record(job.plan, result)
    return result


def _measure(job: Measurement, client: AgentClient, started: Started, progress) -> RunResult:
    """Verify one frame if asked, benchmark on the board, compare with the plan's prediction."""
    plan, loaded = job.plan, job.loaded
    check = None
    mixed: PrecisionCheck | None = None
    if job.verify and plan.reduced and plan.precision is not None:
        mixed = _verify_precision(plan, loaded, client)
    elif job.verify:
        import onnxruntime as ort

        inputs = loaded.feeds(seed=7)
        got = client.infer(inputs)
        full = ort.InferenceSession(loaded.ort_proto.SerializeToString(), providers=["CPUExecutionProvider"])
        expected = dict(zip([o.name for o in full.get_outputs()], full.run(None, inputs), strict=True))
        check = compare_outputs(expected, got)
    progress(f"benchmarking {job.frames} frames on the board")
    bench = client.benchmark(job.frames, warmup=max(3, job.frames // 10))
    measured = Figures(
        latency_ms=bench.latency_alone_ms,
        throughput_fps=bench.throughput_fps,
        energy_mj=bench.energy_mj,
        latency_p50_at_rate_ms=bench.latency_p50_ms,
        latency_p99_at_rate_ms=bench.latency_p99_ms,
    )
    predicted = None
    if plan.predicted:
        predicted = Figures(
            latency_ms=plan.predicted.latency_ms,
            throughput_fps=plan.predicted.throughput_fps,
            energy_mj=plan.predicted.energy_mj,
            latency_p50_at_rate_ms=plan.simulated.latency_ms if plan.simulated else None,
        )
    return RunResult(
        plan=plan.name,
        board=job.board,
        bundle_sha256=started.bundle_sha256,
        measured=measured,
        predicted=predicted,
        errors_pct=predicted.errors_pct(measured) if predicted else {},
        energy_source=bench.energy_source,
        max_abs_diff=check.max_abs_diff if check else None,
        partitions=tuple(PartitionMeasurement.from_stats(p) for p in bench.partitions),
        uploaded_bytes=started.bytes_received,
        inputs=[s.describe() for s in loaded.inputs],
        output_scale=check.scale if check else None,
        verified=check.ok if check else mixed.ok if mixed else None,
        precision=plan.precision_mix(),
        accuracy=_accuracy_json(mixed) if mixed else None,
    )


def _verify_precision(plan: Plan, loaded: LoadedModel, client: AgentClient) -> PrecisionCheck:
    """The board's outputs for a few frames (the user's data where given) against the full fp32 model, by the
    plan's metric and budget."""
    import onnxruntime as ort

    assert plan.precision is not None
    full = ort.InferenceSession(loaded.ort_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in full.get_outputs()]
    reference, got = [], []
    for feeds in sample_frames(loaded, 4):
        expected = dict(zip(names, full.run(None, feeds), strict=True))
        result = client.infer(feeds)
        compare_outputs(expected, result)  # names and shapes
        reference.append(expected)
        got.append({t: result[t] for t in names})
    return check_precision(reference, got, plan.precision.metric, plan.precision.budget)


def _accuracy_json(check: PrecisionCheck) -> dict[str, Any]:
    return {
        "metric": check.metric,
        "loss": check.loss,
        "budget": check.budget,
        "frames": check.accuracy.frames,
        "losses": dict(check.accuracy.losses),
    }


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
