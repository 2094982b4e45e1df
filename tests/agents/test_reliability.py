"""An agent that runs unattended: failed frames, deadlines, stops and overload, on real agent processes.

Frames come from tiny hand-made bundles (``tests.support.tiny``): an index past the table
fails in stage 0. Timeouts here are hang guards only; nothing asserts how long a call took.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import grpc
import numpy as np
import pytest

from agents.client import AgentClient, AgentError
from agents.peers import Peer
from agents.proto import health_pb2, health_pb2_grpc
from agents.proto import inference_pb2 as kpb
from agents.proto import inference_pb2_grpc as krpc
from agents.proto import parapipe_agent_pb2 as pb
from agents.server import AGENT_SERVICE, CALL_LIMITS
from agents.tensors import frame_arrays, frame_message
from parapipe.local_agent import LocalAgent
from tests.support.tiny import (
    GUARD_S,
    TABLE_ROWS,
    bundle_sha,
    eventually,
    expected,
    frame,
    start_two_hosts,
    write_const_bundle,
    write_tiny_bundle,
)


def _calls(client: AgentClient) -> dict[str, pb.CallStats]:
    return {c.kind: c for c in client.status().calls}


def _check_frames_flow(client: AgentClient, stages: int, count: int = 6) -> None:
    for i in range(count):
        got = client.infer(frame(i % TABLE_ROWS), frame_id=i)
        assert np.array_equal(got[f"t{stages - 1}"], expected(i % TABLE_ROWS, stages))


def test_a_frame_failing_in_stage_0_does_not_wedge_later_stages(tmp_path: Path) -> None:
    folder = write_tiny_bundle(tmp_path / "b", stages=3, max_inflight=2)
    with LocalAgent() as agent:
        client = agent.client
        client.timeout = GUARD_S
        client.start(client.load_bundle(folder).bundle_sha256)
        for _ in range(3):  # more failed frames than max_inflight
            with pytest.raises(AgentError) as info:
                client.infer(frame(TABLE_ROWS + 7))
            assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION and "partition s0" in str(info.value)
            _check_frames_flow(client, stages=3, count=3)
        assert client.ready()
        eventually("no frame left in flight", lambda: client.status().frames_in_flight == 0)


def test_a_frame_failing_on_the_entry_host_is_skipped_on_the_other_host(tmp_path: Path) -> None:
    with ExitStack() as stack:
        a, _ = start_two_hosts(stack, tmp_path, stages=3, max_inflight=2)
        a.client.timeout = GUARD_S
        for _ in range(3):
            with pytest.raises(AgentError, match="partition s0"):
                a.client.infer(frame(TABLE_ROWS))
            _check_frames_flow(a.client, stages=3, count=3)
        assert a.client.ready()


def test_expired_deadlines_free_their_frame_and_server_thread(tmp_path: Path) -> None:
    """Host b stops answering (SIGSTOP): every Infer on a ends at its deadline with DEADLINE_EXCEEDED,
    gives its frame up, and holds no server thread; once b is back, frames flow again."""
    with ExitStack() as stack:
        a, b = start_two_hosts(stack, tmp_path, stages=2, max_inflight=2)
        a.client.timeout = GUARD_S
        _check_frames_flow(a.client, stages=2, count=2)
        assert b.process is not None
        os.kill(b.process.pid, signal.SIGSTOP)
        try:
            for i in range(5):  # more than max_inflight
                with pytest.raises(grpc.RpcError) as raw:
                    a.client.stub.Infer(frame_message(100 + i, frame(1)), timeout=1.0)
                assert raw.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            eventually("every Infer thread released", lambda: _calls(a.client)["Infer"].active == 0)
            eventually("every given-up frame freed", lambda: a.client.status().frames_in_flight == 0)
        finally:
            os.kill(b.process.pid, signal.SIGCONT)
        _check_frames_flow(a.client, stages=2, count=3)
        assert "internal error" not in a.log_path.read_text()


def test_stop_wakes_callers_waiting_for_a_slot_and_stream_feeds(tmp_path: Path) -> None:
    with ExitStack() as stack:
        a, b = start_two_hosts(stack, tmp_path, stages=2, max_inflight=2)
        a.client.timeout = GUARD_S
        _check_frames_flow(a.client, stages=2, count=1)
        assert b.process is not None
        os.kill(b.process.pid, signal.SIGSTOP)  # frames go to b and never come back
        stack.callback(os.kill, b.process.pid, signal.SIGCONT)
        hold = threading.Event()
        stack.callback(hold.set)

        def requests() -> Iterator[pb.Frame]:
            for i in range(5):
                yield frame_message(i, frame(1))
            hold.wait(GUARD_S)

        codes: list[grpc.StatusCode] = []

        def stream() -> None:
            try:
                list(a.client.stub.InferStream(requests(), timeout=4 * GUARD_S))
            except grpc.RpcError as exc:
                codes.append(exc.code())

        def infer() -> None:
            try:
                a.client.stub.Infer(frame_message(9, frame(1)), timeout=4 * GUARD_S)
            except grpc.RpcError as exc:
                codes.append(exc.code())

        def idle_requests() -> Iterator[pb.Frame]:
            hold.wait(GUARD_S)
            yield from ()

        def idle_stream() -> None:  # open, sending nothing: it ends too
            try:
                list(a.client.stub.InferStream(idle_requests(), timeout=4 * GUARD_S))
            except grpc.RpcError as exc:
                codes.append(exc.code())

        threads = [threading.Thread(target=f) for f in (stream, idle_stream, infer, infer)]
        for t in threads:
            t.start()
        eventually("two stream feeds and two Infer calls wait", lambda: a.client.status().stream_feeds == 2)
        eventually("two Infer calls wait", lambda: _calls(a.client)["Infer"].active == 2)
        assert a.client.stop()
        for t in threads:
            t.join(GUARD_S)
            assert not t.is_alive(), "a caller still waits after StopPipeline"
        assert codes == [grpc.StatusCode.FAILED_PRECONDITION] * 4
        eventually("the stream's feed thread ended", lambda: a.client.status().stream_feeds == 0)


def test_health_is_answered_with_every_stream_kind_at_its_limit(tmp_path: Path) -> None:
    folder = write_tiny_bundle(tmp_path / "b", stages=2, max_inflight=2)
    with LocalAgent() as agent, ExitStack() as stack:
        client = agent.client
        client.start(client.load_bundle(folder).bundle_sha256)
        health = health_pb2_grpc.HealthStub(client.channel)
        hold = threading.Event()
        stack.callback(hold.set)

        watches = []
        for _ in range(CALL_LIMITS["Watch"]):
            w = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=4 * GUARD_S)
            assert next(w).status == health_pb2.HealthCheckResponse.SERVING
            watches.append(w)
            stack.callback(w.cancel)

        def idle() -> Iterator[pb.Frame]:
            hold.wait(4 * GUARD_S)
            yield from ()

        streams = []
        for _ in range(CALL_LIMITS["InferStream"]):
            s = client.stub.InferStream(idle(), timeout=4 * GUARD_S)
            streams.append(s)
            stack.callback(s.cancel)
        eventually("every stream runs", lambda: _calls(client)["InferStream"].active == CALL_LIMITS["InferStream"])

        assert client.health(timeout=GUARD_S) == "SERVING"  # liveness answers
        assert client.ready()
        with pytest.raises(grpc.RpcError) as raw:
            next(health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=GUARD_S))
        assert raw.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        with pytest.raises(grpc.RpcError) as raw:
            next(client.stub.InferStream(idle(), timeout=GUARD_S))
        assert raw.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "limit" in raw.value.details()
        calls = _calls(client)
        assert calls["Watch"].refused == 1 and calls["InferStream"].refused == 1
        assert np.array_equal(client.infer(frame(2))["t1"], expected(2, 2))  # frames still flow

        for call in (*watches, *streams):
            call.cancel()
        eventually(
            "cancelled streams give their places back",
            lambda: _calls(client)["Watch"].active == 0 and _calls(client)["InferStream"].active == 0,
        )


def test_sigterm_lets_frames_in_flight_finish_then_exits_0(tmp_path: Path) -> None:
    """SIGTERM while two frames wait on host b: a refuses new frames, finishes those two once b answers,
    and exits 0, without waiting out its grace period for b's exchange stream, which b holds open."""
    import sys

    grace = 4 * GUARD_S  # a waits for b's stream this long if it does not cut it: longer than the exit's guard
    argv = [sys.executable, "-m", "agents.server", "--grace", str(grace)]
    with ExitStack() as stack:
        b = stack.enter_context(LocalAgent())
        a = stack.enter_context(LocalAgent(python=argv))
        parts = {h: write_tiny_bundle(tmp_path / h, 2, 2, host=h) for h in ("a", "b")}
        a.client.load_bundle(parts["a"])
        b.client.load_bundle(parts["b"])
        b.client.start(bundle_sha(parts["b"]), peers=[Peer("a", f"127.0.0.1:{a.port}")])
        a.client.start(bundle_sha(parts["a"]), peers=[Peer("b", f"127.0.0.1:{b.port}")])
        a.client.timeout = 2 * GUARD_S
        _check_frames_flow(a.client, stages=2, count=1)
        assert a.process is not None and b.process is not None
        os.kill(b.process.pid, signal.SIGSTOP)
        stack.callback(os.kill, b.process.pid, signal.SIGCONT)
        results: list[object] = []

        def infer(i: int) -> None:
            try:
                results.append(a.client.infer(frame(i), frame_id=i)["t1"])
            except AgentError as exc:
                results.append(exc)

        threads = [threading.Thread(target=infer, args=(i,)) for i in (1, 2)]
        for t in threads:
            t.start()
        eventually("two frames in flight", lambda: a.client.status().frames_in_flight == 2)
        a.process.send_signal(signal.SIGTERM)
        eventually("a refuses new calls", lambda: _refused(a.client))
        os.kill(b.process.pid, signal.SIGCONT)
        for t in threads:
            t.join(2 * GUARD_S)
        assert a.process.wait(GUARD_S) == 0
        assert len(results) == 2 and all(isinstance(r, np.ndarray) for r in results), results
        assert "draining" in a.log_path.read_text()


def _refused(client: AgentClient) -> bool:
    try:
        client.status()
    except AgentError:
        return True
    return False


def test_an_agent_killed_and_started_again_resumes_its_pipeline(tmp_path: Path) -> None:
    """SIGKILL (a crash; a reboot is the same to the agent): started again on its workdir, it brings its
    last bundle and pipeline back and says so (boots, resumed); after StopPipeline it does not."""
    folder = write_tiny_bundle(tmp_path / "b", stages=2, max_inflight=2)
    workdir = tmp_path / "work"
    with LocalAgent(workdir=workdir) as first:
        first.client.start(first.client.load_bundle(folder).bundle_sha256)
        with pytest.raises(AgentError):
            first.client.infer(frame(TABLE_ROWS))
        _check_frames_flow(first.client, stages=2, count=2)
        status = first.client.status()
        assert (status.boots, status.resumed, status.frames_done, status.frames_failed) == (1, False, 2, 1)
        assert first.process is not None
        first.process.kill()
        first.process.wait()
    with LocalAgent(workdir=workdir) as second:
        eventually("the pipeline is back", second.client.ready)
        status = second.client.status()
        assert status.boots == 2 and status.resumed and status.running_bundle == bundle_sha(folder)
        _check_frames_flow(second.client, stages=2, count=2)
        assert second.client.stop()
        assert not (workdir / "pipeline.json").exists()
    with LocalAgent(workdir=workdir) as third:
        time.sleep(1.0)  # a resume would have started by now; nothing asserts on time, only on state
        status = third.client.status()
        assert status.boots == 3 and not status.ready and not status.running_bundle


def test_a_stream_reports_failed_frames_one_by_one_and_goes_on(tmp_path: Path) -> None:
    """Every frame of a stream comes back, in order, either with its outputs or reported failed."""
    folder = write_tiny_bundle(tmp_path / "b", stages=3, max_inflight=2)
    indices = [0, TABLE_ROWS, 1, 2, TABLE_ROWS + 3, 3, 0, TABLE_ROWS, TABLE_ROWS, 1]
    with LocalAgent() as agent:
        client = agent.client
        client.start(client.load_bundle(folder).bundle_sha256)
        results = list(client.infer_stream_results((frame(i) for i in indices), timeout=GUARD_S))
        assert [i for i, _ in results] == list(range(len(indices)))
        for idx, (_, got) in zip(indices, results, strict=True):
            if idx >= TABLE_ROWS:
                assert isinstance(got, AgentError) and "partition s0" in str(got)
            else:
                assert not isinstance(got, AgentError) and np.array_equal(got["t2"], expected(idx, 3))
        status = client.status()
        assert (status.frames_done, status.frames_failed) == (6, 4)


def test_a_malformed_frame_on_a_stream_is_its_own_error_and_the_stream_goes_on(tmp_path: Path) -> None:
    """A frame with an unknown tensor, a truncated one or the wrong dtype ended the whole InferStream with
    INVALID_ARGUMENT, and the frames after it were never answered; now each is answered with its own error."""
    folder = write_tiny_bundle(tmp_path / "b", stages=1)
    bad = [
        {"nope": np.zeros(1, np.int64)},
        {"idx": np.zeros(1, np.float32)},
    ]
    frames = [frame(0), bad[0], frame(1), bad[1], frame(2)]
    with LocalAgent() as agent:
        client = agent.client
        client.start(client.load_bundle(folder).bundle_sha256)
        results = list(client.infer_stream_results(frames, timeout=GUARD_S))
        truncated = pb.Frame(id=0, tensors=[pb.Tensor(name="idx", dtype="int64", shape=[1], data=b"\0" * 3)])
        replies = list(client.stub.InferStream(iter([truncated, frame_message(1, frame(3))]), timeout=GUARD_S))
    assert [i for i, _ in results] == [0, 1, 2, 3, 4]
    for k in (1, 3):
        got = results[k][1]
        assert isinstance(got, AgentError) and got.code == grpc.StatusCode.INVALID_ARGUMENT, got
    assert "nope" in str(results[1][1]) and "float32" in str(results[3][1])
    for k, idx in ((0, 0), (2, 1), (4, 2)):
        assert np.array_equal(results[k][1]["t0"], expected(idx, 1))
    assert "3 bytes" in replies[0].error and not replies[1].error and replies[1].tensors


# Hang guard for what starts an agent process or brings a plan back: an interpreter importing
# onnxruntime and grpc, and backoffs of up to 10 s, on a machine whose 2 cores are shared by
# several test runs (load 15) can take a good part of GUARD_S.
START_GUARD_S = 4 * GUARD_S


def _part_runs(client: AgentClient) -> bool:
    """Whether the agent's part of the plan runs (readiness), asked with a hang guard's deadline: the
    readiness check's own 2 s deadline can pass on a loaded machine while an agent starts a pipeline."""
    return client.health(AGENT_SERVICE, timeout=GUARD_S) == "SERVING"


class _Supervised:
    """An agent under deploy's restart loop (sh), on a fixed port and workdir, as on a board."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.pid_file = folder / "agent.pid"
        self.log_path = folder / "agent.log"
        self.process: subprocess.Popen | None = None
        self.client = AgentClient(f"127.0.0.1:{self.port}", timeout=GUARD_S)

    def __enter__(self) -> _Supervised:
        from parapipe.deploy import _SUPERVISOR, SUPERVISOR_NAME

        root = Path(__file__).resolve().parents[2]
        env = dict(os.environ, PYTHONPATH=f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        agent = [sys.executable, "-m", "agents.server", "--port", str(self.port)]
        agent += ["--workdir", str(self.folder / "work"), "--pid-file", str(self.pid_file)]
        argv = ["sh", "-c", _SUPERVISOR, SUPERVISOR_NAME, str(self.folder / "supervisor.pid"), *agent]
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.client.wait_serving(START_GUARD_S)
        return self

    def agent_pid(self) -> int:
        return int(self.pid_file.read_text().split()[0])

    def crash(self) -> None:
        """SIGKILL the agent (not its supervisor) and wait until the supervisor has started another."""
        first = self.agent_pid()
        os.kill(first, signal.SIGKILL)
        eventually(
            "the supervisor started the agent again",
            lambda: self.pid_file.exists() and self.agent_pid() != first,
            timeout=START_GUARD_S,
        )
        self.client.wait_serving(START_GUARD_S)

    def __exit__(self, *exc: object) -> None:
        self.client.close()
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(GUARD_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


@pytest.mark.parametrize("crashes", ["b", "a"])
def test_a_peer_restarted_by_its_supervisor_brings_the_plan_back(tmp_path: Path, crashes: str) -> None:
    """A plan over hosts a (entry) and b, each agent under its supervisor. One agent is SIGKILLed with
    frames in flight and comes back: every frame in flight is reported failed (none hangs until its
    deadline, none is lost), the other host's part starts again by itself, and frames flow again."""
    with ExitStack() as stack:
        agents = {h: stack.enter_context(_Supervised(tmp_path / h)) for h in ("a", "b")}
        parts = {h: write_tiny_bundle(tmp_path / f"bundle-{h}", 2, max_inflight=4, host=h) for h in ("a", "b")}
        for h in ("b", "a"):
            other = "a" if h == "b" else "b"
            agents[h].client.load_bundle(parts[h])
            agents[h].client.start(bundle_sha(parts[h]), peers=[Peer(other, f"127.0.0.1:{agents[other].port}")])
        a, b = agents["a"], agents["b"]
        _check_frames_flow(a.client, stages=2, count=3)
        b_pid = b.agent_pid()
        os.kill(b_pid, signal.SIGSTOP)  # frames reach b and stay there: in flight
        stack.callback(lambda: os.kill(b_pid, signal.SIGCONT) if Path(f"/proc/{b_pid}").exists() else None)
        in_flight = [
            a.client.stub.Infer.future(frame_message(100 + i, frame(i)), timeout=4 * GUARD_S) for i in range(4)
        ]
        eventually("frames in flight", lambda: a.client.status().frames_in_flight >= 1)
        if crashes == "b":
            b.crash()
        else:
            os.kill(b_pid, signal.SIGCONT)
            os.kill(a.agent_pid(), signal.SIGKILL)
        for call in in_flight:  # every one answered: with its outputs (b woke in time) or failed
            try:
                call.result()
            except grpc.RpcError as exc:
                assert exc.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNAVAILABLE), exc
        if crashes == "a":
            a.client.wait_serving(START_GUARD_S)  # the supervisor started it again
        eventually("the plan runs again on a", lambda: _part_runs(a.client), timeout=START_GUARD_S)
        eventually("b's part runs again", lambda: _part_runs(b.client), timeout=START_GUARD_S)
        _check_frames_flow(a.client, stages=2, count=6)
        status = {h: agents[h].client.status() for h in agents}
        assert status[crashes].boots == 2 and status[crashes].resumed
        assert all(s.running_bundle == bundle_sha(parts[h]) for h, s in status.items())
        assert "Traceback" not in a.log_path.read_text() + b.log_path.read_text()


def test_a_host_that_starts_its_part_again_brings_the_other_parts_along(tmp_path: Path) -> None:
    """a's part is started again (a new run: it numbers frames from 0 again) while b's runs on: b hears
    the new run on its stream, starts its own part again, and frames flow; none waits for its deadline
    on a b that would drop frames it believes it has seen."""
    with ExitStack() as stack:
        a, b = start_two_hosts(stack, tmp_path, stages=2, max_inflight=2)
        a.client.timeout = GUARD_S
        _check_frames_flow(a.client, stages=2, count=3)
        boots = b.client.status().boots
        a.client.start(bundle_sha(tmp_path / "a"), peers=[Peer("b", f"127.0.0.1:{b.port}")])
        deadline = time.monotonic() + 2 * GUARD_S
        while True:
            try:
                got = a.client.infer(frame(2))
                break
            except AgentError as exc:
                assert exc.code == grpc.StatusCode.FAILED_PRECONDITION, exc  # failed at once, never timed out
                assert time.monotonic() < deadline, "frames never flowed again"
                time.sleep(0.2)
        assert np.array_equal(got["t1"], expected(2, 2))
        _check_frames_flow(a.client, stages=2, count=6)
        status = b.client.status()
        assert status.boots == boots and status.ready  # b's agent did not restart; its part did
        assert "started its part of the plan again" in b.log_path.read_text()


def test_a_host_whose_partitions_take_no_inputs_runs_every_frame(tmp_path: Path) -> None:
    """b's only partition is a constant subgraph: no tensor ever reaches b, so b learns from the entry host
    that a frame entered; without that it never runs one and every frame on a waits for b's table."""
    with ExitStack() as stack:
        a = stack.enter_context(LocalAgent())
        b = stack.enter_context(LocalAgent())
        parts = {h: write_const_bundle(tmp_path / h, h, max_inflight=2) for h in ("a", "b")}
        for agent, h in ((a, "a"), (b, "b")):
            agent.client.load_bundle(parts[h])
        b.client.start(bundle_sha(parts["b"]), peers=[Peer("a", f"127.0.0.1:{a.port}")])
        a.client.start(bundle_sha(parts["a"]), peers=[Peer("b", f"127.0.0.1:{b.port}")])
        a.client.timeout = GUARD_S
        entered = 0
        for i in range(5):  # one by one: each frame needs b's table, which b makes only once told
            assert np.array_equal(a.client.infer(frame(i % TABLE_ROWS))["t0"], expected(i % TABLE_ROWS, 1))
        entered += 5
        with pytest.raises(AgentError, match="partition gather"):  # a failed frame: b skips it or ran it
            a.client.infer(frame(TABLE_ROWS))
        entered += 1
        count = 12  # more frames than max_inflight at once
        results = list(a.client.infer_stream_results([frame(i % TABLE_ROWS) for i in range(count)], timeout=GUARD_S))
        entered += count
        assert [i for i, _ in results] == list(range(count))
        for i, got in results:
            assert not isinstance(got, AgentError), got
            assert np.array_equal(got["t0"], expected(i % TABLE_ROWS, 1))
        status = b.client.status()
        assert status.ready and [p.name for p in status.partitions] == ["const"]
        assert entered - 1 <= status.partitions[0].frames <= entered  # once per frame that entered, never ahead
        assert "Traceback" not in a.log_path.read_text() + b.log_path.read_text()


def _memory_report(path: Path, pid: int) -> dict:
    """Ask an agent started with ``--debug-memory path`` for a report (SIGUSR1) and read it."""
    before = len(path.read_text().splitlines()) if path.exists() else 0
    os.kill(pid, signal.SIGUSR1)
    eventually(
        "the agent wrote its memory report", lambda: path.exists() and len(path.read_text().splitlines()) > before
    )
    return json.loads(path.read_text().splitlines()[-1])


def _catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler for ``signum`` (SigCgt in /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


# what a stopped pipeline could leave behind: itself, its workers, its peer links and their gRPC channels
_RETAINED = ("Pipeline", "_Worker", "PeerLinks", "_Link", "Channel", "InferenceSession")
_GRPC_THREADS = "Thread-N (_run)"  # gRPC's own threads: a stream's request reader, a channel's poller


def _retained(report: dict) -> dict[str, int]:
    """What the agent holds: live objects, the same before any collection (a stopped pipeline is garbage
    in reference cycles, holding its memory until the collector runs), and gRPC's threads."""
    live = {name.rsplit(".", 1)[-1]: n for name, n in report["objects"].items()}
    held = {name.rsplit(".", 1)[-1]: n for name, n in report["uncollected"].items()}
    return (
        {k: live[k] for k in _RETAINED}
        | {f"{k} uncollected": held[k] for k in _RETAINED}
        | {"grpc threads": report["threads"].get(_GRPC_THREADS, 0)}
    )


def test_a_peer_restarted_again_and_again_leaves_nothing_behind_on_the_entry_host(tmp_path: Path) -> None:
    """b, a peer of the entry host a, is SIGKILLed and started again by its supervisor three times. Each
    time a's link to b breaks and a's part starts again: afterwards a holds what it held before (one
    pipeline, its workers and sessions, one link and channel per peer, gRPC's threads for them), not
    one more of each per restart (the broken link's stream kept gRPC's request reader waiting for ever,
    and with it the stopped pipeline), and not as uncollected garbage either (a stopped pipeline is a
    reference cycle: on an idle agent it stayed until a full collection, many restarts later). Read from
    inside a by ``--debug-memory``, which is off without the flag (b: no SIGUSR1 handler)."""
    reports = tmp_path / "a.memory.jsonl"
    argv = [sys.executable, "-m", "agents.server", "--debug-memory", str(reports)]
    with ExitStack() as stack:
        b = stack.enter_context(_Supervised(tmp_path / "b"))
        a = stack.enter_context(LocalAgent(python=argv))
        assert a.process is not None
        parts = {h: write_tiny_bundle(tmp_path / f"bundle-{h}", 2, max_inflight=2, host=h) for h in ("a", "b")}
        a.client.load_bundle(parts["a"])
        b.client.load_bundle(parts["b"])
        b.client.start(bundle_sha(parts["b"]), peers=[Peer("a", f"127.0.0.1:{a.port}")])
        a.client.start(bundle_sha(parts["a"]), peers=[Peer("b", f"127.0.0.1:{b.port}")])
        a.client.timeout = GUARD_S
        _check_frames_flow(a.client, stages=2, count=3)
        assert _catches(a.process.pid, signal.SIGUSR1) and not _catches(b.agent_pid(), signal.SIGUSR1)
        baseline = _retained(_memory_report(reports, a.process.pid))
        assert baseline["Pipeline"] == 1 and baseline["_Link"] == 1 and baseline["grpc threads"] >= 1, baseline

        for _ in range(3):
            b.crash()
            eventually("b's part runs again", lambda: _part_runs(b.client), timeout=START_GUARD_S)
            eventually("a's part runs again", lambda: _part_runs(a.client), timeout=START_GUARD_S)
            _check_frames_flow(a.client, stages=2, count=3)

        now: dict[str, int] = {}

        def back_to_baseline() -> bool:  # stopped pipelines are released in the background
            now.update(_retained(_memory_report(reports, a.process.pid)))  # type: ignore[union-attr]
            return all(now[k] <= baseline[k] for k in baseline)

        try:
            eventually("a holds no more than before the restarts", back_to_baseline, timeout=GUARD_S)
        except AssertionError:
            raise AssertionError(f"after 3 restarts of b, a holds {now}; before: {baseline}") from None
        assert "Traceback" not in a.log_path.read_text()


def _model_infer(idx: int) -> kpb.ModelInferRequest:
    request = kpb.ModelInferRequest(model_name="parapipe", id=str(idx))
    request.inputs.add(name="idx", datatype="INT64", shape=[1])
    request.raw_input_contents.append(frame(idx)["idx"].tobytes())
    return request


def test_a_unary_infer_waits_within_its_deadline_for_an_away_peer(tmp_path: Path) -> None:
    """b, the entry host a's peer, is SIGKILLed while its supervisor is held (SIGSTOP), so b stays away
    until the test lets it restart. Meanwhile, on a: an Infer (and a ModelInfer) whose deadline is too
    short fails with UNAVAILABLE saying the peer is away (not FAILED_PRECONDITION at once), a stream still
    fails at once (FAILED_PRECONDITION, as streams report), and an Infer and a ModelInfer whose deadlines
    span b's restart wait for the plan to run again and complete with their frames' outputs."""
    with ExitStack() as stack:
        b = stack.enter_context(_Supervised(tmp_path / "b"))
        a = stack.enter_context(LocalAgent())
        parts = {h: write_tiny_bundle(tmp_path / f"bundle-{h}", 2, max_inflight=2, host=h) for h in ("a", "b")}
        a.client.load_bundle(parts["a"])
        b.client.load_bundle(parts["b"])
        b.client.start(bundle_sha(parts["b"]), peers=[Peer("a", f"127.0.0.1:{a.port}")])
        a.client.start(bundle_sha(parts["a"]), peers=[Peer("b", f"127.0.0.1:{b.port}")])
        a.client.timeout = GUARD_S
        _check_frames_flow(a.client, stages=2, count=1)
        assert b.process is not None
        supervisor = b.process.pid
        os.kill(supervisor, signal.SIGSTOP)  # b is not restarted until SIGCONT
        stack.callback(os.kill, supervisor, signal.SIGCONT)
        os.kill(b.agent_pid(), signal.SIGKILL)
        eventually("a sees b away", lambda: not _part_runs(a.client))

        with pytest.raises(grpc.RpcError) as short:
            a.client.stub.Infer(frame_message(1, frame(1)), timeout=1.0)
        assert short.value.code() == grpc.StatusCode.UNAVAILABLE, short.value
        assert "away" in short.value.details() and "host 'b'" in short.value.details(), short.value.details()
        with pytest.raises(AgentError) as streamed:
            list(a.client.infer_stream_results([frame(2)], timeout=GUARD_S))
        assert streamed.value.code == grpc.StatusCode.FAILED_PRECONDITION, streamed.value

        kserve = krpc.GRPCInferenceServiceStub(a.client.channel)  # the Open Inference Protocol's ModelInfer alike
        with pytest.raises(grpc.RpcError) as short:
            kserve.ModelInfer(_model_infer(0), timeout=1.0)
        assert short.value.code() == grpc.StatusCode.UNAVAILABLE and "away" in short.value.details(), short.value

        spanning = a.client.stub.Infer.future(frame_message(3, frame(3)), timeout=START_GUARD_S)
        spanning_kserve = kserve.ModelInfer.future(_model_infer(0), timeout=START_GUARD_S)
        calls = (spanning, spanning_kserve)
        eventually("the calls wait on a", lambda: _calls(a.client)["Infer"].active >= 2 or any(c.done() for c in calls))
        assert not any(c.done() for c in calls)  # b is still away: the calls wait instead of failing
        os.kill(supervisor, signal.SIGCONT)
        reply = spanning.result()
        assert np.array_equal(frame_arrays(reply)["t1"], expected(3, 2)) and reply.id == 3
        got = np.frombuffer(spanning_kserve.result().raw_output_contents[0], np.float32).reshape(1, 8)
        assert np.array_equal(got, expected(0, 2))
        _check_frames_flow(a.client, stages=2, count=2)
        assert "Traceback" not in a.log_path.read_text()
