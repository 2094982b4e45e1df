"""Soak: frames streamed through a 3-stage plan on three supervised local agents, one SIGKILLed every ~2 minutes.

The plan runs over three hosts on 127.0.0.1 (h0 -> h1 -> h2, one stage each; the entry
host h0 gets the frames, the agents hand tensors to each other over gRPC). Every agent
runs under the restart loop ``deploy`` puts on boards (parapipe.deploy's supervisor
script): after a SIGKILL it is started again and resumes its last pipeline (with its
peers) by itself, and the other hosts start their part again once it is back.

Frames go in at a steady rate over the agent's streaming RPC (InferStream); a stream
that breaks (the entry agent died, or the entry host refuses frames, FAILED_PRECONDITION, until a
peer is back and its part runs again) is reopened, and every frame sent on it is accounted:
completed, failed in the stream's reply, or failed with the stream's error. Every
``--kill-every`` seconds one agent, in turn (h1, h2, h0, ...: non-entry and entry), is
SIGKILLed; every ``--bad-every`` seconds one bad frame (token ids far outside the
embedding table) fails in stage 0. Reported at the end: frames sent / completed / failed /
lost (lost = neither completed nor reported failed; must be 0), the longest time without
a completed frame, and for each host's agent incarnation its resident memory one minute
after its start and at its peak after that.

The 3 stages: core 0 (h0), core 1 (h1), and unpinned (h2) (this machine has two cores).

Before every SIGKILL (and at the end) it prints each agent's resident memory.

The agents require a bearer token (--token-file; the soak's clients and the agents' peers send it) and
serve /metrics on a port of their own when prometheus_client is importable. In both modes a prober
calls Status on each agent every 0.5 s (2 s deadline) and reports each agent's longest stretch without
an answer (SIGKILL restarts included). ``--hostile`` adds a hostile client beside the stream for the
whole soak, about 5 actions/s in all, cycling over every agent: 50 idle TCP connections held 15 s (gRPC
and metrics ports), tokenless Status / Infer / 8 MiB Infer, Infer with the token but a wrong tensor
name, dtype, shape or truncated bytes, ProfileOps of a model declaring a [65536, 65536] input or with
threads=100000, an Infer just over 64 MiB, and metrics scrapes without, with a wrong and with the token.
Its outcomes are counted by kind, status and host; INTERNAL / UNKNOWN (and HTTP 5xx) are findings.

Run: .venv/bin/python bench/soak.py [--minutes 10] [--kill-every 120] [--bad-every 30] [--fps 20] [--hostile]
Short iteration: .venv/bin/python bench/soak.py --minutes 3 --kill-every 40
Memory per peer restart, cheaply: .venv/bin/python bench/soak.py --minutes 2.5 --kill-every 30 --kill h1 --fps 2
(only h1, a peer of the entry host, is SIGKILLed; --debug-memory also has every agent write what it
holds before each kill: live pipelines, links, channels, sessions, threads, heap, see agents/debug.py)
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import queue
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from agents.bundle import parse_manifest
from agents.client import AgentClient, AgentError
from agents.peers import Peer
from compiler import compile_plan, write_bundles
from device_profiles.loader import parse_profile
from models.coarsen import coarsen
from models.graph import build_graph
from models.onnx_io import load_onnx
from parapipe.deploy import _SUPERVISOR, SUPERVISOR_NAME
from planner.baselines import flop_pipeline

ROOT = Path(__file__).resolve().parents[1]
HOSTS = ("h0", "h1", "h2")


def _q(v: float) -> dict:
    return {"value": v, "source": "estimate", "cite": "soak test profile"}


def soak_profile():
    base = {
        "execution_provider": "CPUExecutionProvider",
        "peak_gflops": {k: _q(10.0) for k in ("conv", "depthwise", "matmul", "elementwise", "pooling", "other")},
        "memory_bandwidth_gbps": _q(10.0),
        "memory_bytes": _q(8e9),
        "launch_overhead_us": _q(5.0),
        "active_power_w": _q(5.0),
        "idle_power_w": _q(1.0),
    }
    pus = [
        dict(base, kind="cpu", name="s0", cores=[0], host="h0"),
        dict(base, kind="cpu", name="s1", cores=[1], host="h1"),
        dict(base, kind="gpu", name="s2", cores=[], host="h2"),
    ]
    network = [
        {"a": a, "b": b, "bandwidth_gbps": _q(10.0), "latency_us": _q(50.0)}
        for a, b in (("h0", "h1"), ("h1", "h2"), ("h0", "h2"))
    ]
    hosts = [{"name": h, "description": f"soak agent {h} on 127.0.0.1"} for h in HOSTS]
    return parse_profile({"schema_version": 1, "name": "soak3", "hosts": hosts, "pus": pus, "network": network})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def agent_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


class Supervised:
    """One host's agent under deploy's restart loop, on a fixed port."""

    def __init__(
        self, host: str, work: Path, token_file: Path, metrics: bool = False, debug_memory: bool = False
    ) -> None:
        self.host, self.port = host, free_port()
        self.pid_file, sup_file = work / f"{host}.pid", work / f"{host}.supervisor.pid"
        self.log_path = work / f"{host}.log"
        self.reports = work / f"{host}.memory.jsonl" if debug_memory else None
        self.metrics_port_file = work / f"{host}.metrics-port" if metrics else None
        agent = [sys.executable, "-m", "agents.server", "--host", "127.0.0.1", "--port", str(self.port)]
        agent += ["--workdir", str(work / host), "--pid-file", str(self.pid_file), "--port-file", str(work / f"{host}.port")]  # fmt: skip
        agent += ["--token-file", str(token_file)]
        if self.metrics_port_file is not None:  # port 0: a restarted agent may pick another one (read the file)
            agent += ["--metrics-port", "0", "--metrics-port-file", str(self.metrics_port_file)]
        if self.reports is not None:
            agent += ["--debug-memory", str(self.reports)]
        self.log = open(self.log_path, "w")
        self.supervisor = subprocess.Popen(
            ["sh", "-c", _SUPERVISOR, SUPERVISOR_NAME, str(sup_file), *agent],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
        )
        self.client = AgentClient(f"127.0.0.1:{self.port}", token=token_file.read_text().strip(), timeout=10)

    def pid(self) -> int | None:
        return agent_pid(self.pid_file)

    def metrics_port(self) -> int | None:
        """The metrics port the agent wrote last (None: no metrics, or not written yet)."""
        try:
            return int(self.metrics_port_file.read_text().split()[0]) if self.metrics_port_file else None
        except (OSError, ValueError, IndexError):
            return None

    def shutdown(self) -> None:
        self.client.close()
        self.supervisor.send_signal(signal.SIGTERM)
        pid = self.pid()
        if pid:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        self.supervisor.wait(30)
        self.log.close()

    def restarts(self) -> int:
        return self.log_path.read_text().count("restarting it")

    def report_memory(self) -> None:
        """Ask the agent for a memory report (``--debug-memory``: one more line in ``self.reports``)."""
        pid = self.pid()
        if self.reports is not None and pid:
            try:
                os.kill(pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass


class Tally:
    """Every frame sent, and what became of it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts = {"sent": 0, "completed": 0, "failed": 0, "bad_sent": 0, "bad_failed": 0, "streams": 0}
        self.errors: dict[str, int] = {}
        self.last_done = time.monotonic()
        self.longest_gap = 0.0

    def sent(self, is_bad: bool) -> None:
        with self.lock:
            self.counts["sent"] += 1
            self.counts["bad_sent"] += is_bad

    def completed(self) -> None:
        with self.lock:
            self.counts["completed"] += 1
            now = time.monotonic()
            self.longest_gap = max(self.longest_gap, now - self.last_done)
            self.last_done = now

    def failed(self, is_bad: bool, why: str) -> None:
        with self.lock:
            self.counts["failed"] += 1
            self.counts["bad_failed"] += is_bad
            key = why + (" (bad frame)" if is_bad else "")
            self.errors[key] = self.errors.get(key, 0) + 1

    def gap_until(self, end: float) -> None:
        with self.lock:
            self.longest_gap = max(self.longest_gap, end - self.last_done)


class _Stream:
    """One InferStream call's frames: those sent and not answered yet, and whether the call ended."""

    def __init__(self) -> None:
        self.pending: dict[int, bool] = {}  # frame index in this stream -> is_bad
        self.closed = False


class Streamer:
    """Streams scheduled frames to the entry agent until the schedule ends; a stream that breaks is
    reopened. ``schedule`` gives ``is_bad`` per frame at the frame rate (None: no more frames).

    gRPC reads a stream's frames from its generator in a thread of its own, which may still be waiting
    in the generator of a stream that already broke while the next stream runs: each generator keeps
    to its own stream's state, and a frame it takes after its stream ended goes on the next stream."""

    def __init__(self, client: AgentClient, tally: Tally, schedule: queue.Queue, stream_timeout: float) -> None:
        self.client, self.tally, self.schedule, self.stream_timeout = client, tally, schedule, stream_timeout
        rng = np.random.default_rng(0)
        self.good = {"input_ids": rng.integers(0, 1024, size=(1, 128)).astype(np.int64)}
        self.bad = {"input_ids": np.full((1, 128), 10**6, dtype=np.int64)}
        self.carry: list[bool] = []  # taken from the schedule for a stream that broke before it was sent
        self.done = False
        self.lock = threading.Lock()
        self.leftover = 0  # frames a stream that ended normally never answered (lost)

    def _next(self, stream: _Stream) -> bool | None:
        """The next frame due (is_bad), or None: the stream ended, or the schedule did."""
        while True:
            with self.lock:
                if stream.closed:
                    return None
                if self.carry:
                    return self.carry.pop(0)
                if self.done:
                    return None
            try:
                is_bad = self.schedule.get(timeout=0.5)
            except queue.Empty:
                continue
            if is_bad is None:
                self.done = True
                return None
            return is_bad

    def _frames(self, stream: _Stream) -> Iterator[dict]:
        n = 0
        while True:
            is_bad = self._next(stream)
            if is_bad is None:
                return
            with self.lock:
                if stream.closed:  # the stream broke meanwhile: this frame goes on the next one
                    self.carry.append(is_bad)
                    return
                stream.pending[n] = is_bad
                n += 1
                self.tally.sent(is_bad)
            yield self.bad if is_bad else self.good

    def run(self) -> None:
        while not self.done:
            stream = _Stream()
            with self.tally.lock:
                self.tally.counts["streams"] += 1
            try:
                for i, result in self.client.infer_stream_results(self._frames(stream), timeout=self.stream_timeout):
                    with self.lock:
                        is_bad = stream.pending.pop(i)
                    if isinstance(result, AgentError):
                        msg = str(result)
                        kind = "a peer link broke" if "the link to host" in msg else "a stage failed" if "failed on frame" in msg else msg[:60]  # fmt: skip
                        self.tally.failed(is_bad, f"failed in its stream reply ({kind})")
                    else:
                        self.tally.completed()
            except AgentError as exc:
                why = f"stream broke: {exc.code.name if exc.code else '?'}"
                with self.lock:
                    stream.closed = True
                    for is_bad in stream.pending.values():
                        self.tally.failed(is_bad, why)
                    stream.pending.clear()
                time.sleep(0.2)  # the entry agent or a peer is coming back: reopen (frames due meanwhile wait)
                continue
            with self.lock:
                stream.closed = True
                self.leftover += len(stream.pending)


# gRPC channels of the prober and the hostile client: reconnect soon after an agent is back (gRPC's default
# backoff grows to minutes), and send messages over the agents' 64 MiB limit so that the agent refuses them
_PROBE_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
    ("grpc.max_send_message_length", 256 * 1024 * 1024),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
]


class Prober:
    """Calls Status (with the token) on each agent every ``every`` s (deadline ``timeout`` s) and keeps each
    agent's longest stretch without a successful answer (SIGKILL restarts included)."""

    def __init__(self, agents: dict[str, Supervised], token: str, end: float, every: float = 0.5, timeout: float = 2.0) -> None:  # fmt: skip
        import grpc

        from agents.proto import parapipe_agent_pb2_grpc as rpc

        self.grpc, self.end, self.every, self.timeout = grpc, end, every, timeout
        self.metadata = (("authorization", f"Bearer {token}"),)
        self.channels = {h: grpc.insecure_channel(f"127.0.0.1:{a.port}", options=_PROBE_OPTIONS) for h, a in agents.items()}  # fmt: skip
        self.stubs = {h: rpc.AgentStub(c) for h, c in self.channels.items()}
        self.longest = dict.fromkeys(agents, 0.0)
        self.longest_at = dict.fromkeys(agents, 0.0)  # when that stretch began (s after the start)
        self.calls = {h: {} for h in agents}  # host -> status -> count
        self.threads = [threading.Thread(target=self._run, args=(h,), daemon=True) for h in agents]

    def start(self, start: float) -> None:
        self.t0 = start
        for t in self.threads:
            t.start()

    def _run(self, host: str) -> None:
        from agents.proto import parapipe_agent_pb2 as pb

        last_ok = tick = self.t0
        while True:
            now = time.monotonic()
            if now >= self.end:
                break
            try:
                self.stubs[host].Status(pb.StatusRequest(), timeout=self.timeout, metadata=self.metadata)
                status = "OK"
            except self.grpc.RpcError as exc:
                status = exc.code().name if exc.code() else "?"
            done = time.monotonic()
            self.calls[host][status] = self.calls[host].get(status, 0) + 1
            if status == "OK":
                if done - last_ok > self.longest[host]:
                    self.longest[host], self.longest_at[host] = done - last_ok, last_ok - self.t0
                last_ok = done
            tick += self.every
            time.sleep(max(0.0, tick - time.monotonic()))
        if self.end - last_ok > self.longest[host]:  # a stretch still running at the end counts too
            self.longest[host], self.longest_at[host] = self.end - last_ok, last_ok - self.t0

    def join(self) -> None:
        for t in self.threads:
            t.join(10)
        for c in self.channels.values():
            c.close()


IDLE_CONNECTIONS, IDLE_HOLD_S = 50, 15.0
OVER_64_MIB = 64 * 1024 * 1024 + 1024


def _tiny_onnx(shape: list[int]) -> bytes:
    """An ONNX model of one Identity node whose float input (and output) is declared with ``shape``."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "hostile", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


class Hostile:
    """A hostile client beside the legitimate stream: about ``rate`` actions a second in all, until ``end``,
    cycling through its kinds against every agent (gRPC port, and metrics port when the agents serve metrics).
    Each action's outcome (gRPC status, HTTP status, or what became of the idle connections) is counted by
    kind; INTERNAL or UNKNOWN (and HTTP 5xx) are findings, kept with their details."""

    def __init__(self, agents: dict[str, Supervised], token: str, end: float, rate: float = 5.0) -> None:
        import grpc

        from agents.proto import parapipe_agent_pb2 as pb
        from agents.proto import parapipe_agent_pb2_grpc as rpc

        self.grpc, self.pb, self.agents, self.token, self.end, self.rate = grpc, pb, agents, token, end, rate
        self.auth = (("authorization", f"Bearer {token}"),)
        self.channels = {h: grpc.insecure_channel(f"127.0.0.1:{a.port}", options=_PROBE_OPTIONS) for h, a in agents.items()}  # fmt: skip
        self.stubs = {h: rpc.AgentStub(c) for h, c in self.channels.items()}
        self.lock = threading.Lock()
        self.counts: dict[tuple[str, str, str], int] = {}  # (kind, outcome, host) -> actions
        self.examples: dict[tuple[str, str], str] = {}  # (kind, outcome) -> what the agent said the first time
        self.findings: list[str] = []
        # idle kind -> seconds each connection lived until the agent closed it
        self.idle_closed: dict[str, list[float]] = {}
        self.holding: set[tuple[str, str]] = set()  # (kind, host) whose idle connections are held now
        self.holders: list[threading.Thread] = []
        self.metrics = all(a.metrics_port_file is not None for a in agents.values())

        def tensor(name: str, dtype: str, shape: tuple[int, ...], data: bytes) -> pb.Tensor:
            return pb.Tensor(name=name, dtype=dtype, shape=list(shape), data=data)

        ids = np.zeros((1, 128), dtype=np.int64).tobytes()
        frames = {
            "Infer, no token": tensor("input_ids", "int64", (1, 128), ids),
            "Infer 8 MiB, no token": tensor("input_ids", "int64", (1024, 1024), bytes(8 * 1024 * 1024)),
            "Infer, wrong tensor name": tensor("input_idz", "int64", (1, 128), ids),
            "Infer, wrong dtype": tensor("input_ids", "float32", (1, 128), np.zeros((1, 128), np.float32).tobytes()),
            "Infer, wrong shape": tensor("input_ids", "int64", (3, 7, 5), np.zeros(105, np.int64).tobytes()),
            "Infer, truncated bytes": tensor("input_ids", "int64", (1, 128), ids[:-3]),
            "Infer just over 64 MiB": tensor("input_ids", "int64", (OVER_64_MIB // 8,), bytes(OVER_64_MIB)),
        }
        self.frames = {k: pb.Frame(id=7, tensors=[t]) for k, t in frames.items()}
        self.profiles = {
            "ProfileOps, [65536, 65536] input": pb.ProfileRequest(
                model=_tiny_onnx([65536, 65536]), repeats=3, warmup=1
            ),
            "ProfileOps, threads=100000": pb.ProfileRequest(
                model=_tiny_onnx([1, 4]), threads=100000, repeats=3, warmup=1
            ),
        }
        kinds = ["idle gRPC connections", "Status, no token", *self.frames, *self.profiles]
        if self.metrics:
            kinds += ["idle metrics connections", "metrics scrape, no token", "metrics scrape, wrong token"]
            kinds += ["metrics scrape, token (legitimate)"]
        self.kinds = kinds
        self.thread = threading.Thread(target=self._run, name="hostile", daemon=True)

    def _count(self, kind: str, host: str, outcome: str, detail: str = "") -> None:
        with self.lock:
            self.counts[(kind, outcome, host)] = self.counts.get((kind, outcome, host), 0) + 1
            if detail:
                self.examples.setdefault((kind, outcome), f"{host}: {detail}")
            if outcome in ("INTERNAL", "UNKNOWN") or outcome.startswith("HTTP 5"):
                self.findings.append(f"{time.monotonic() - self.t0:6.1f} s {host} {kind}: {outcome}: {detail[:300]}")

    def _call(self, kind: str, host: str, method: str, request, token: bool) -> None:
        try:
            getattr(self.stubs[host], method)(request, timeout=10.0, metadata=self.auth if token else None)
            outcome, detail = "OK", ""
        except self.grpc.RpcError as exc:
            outcome = exc.code().name if exc.code() else "?"
            detail = exc.details() or ""
        self._count(kind, host, outcome, detail)

    def _scrape(self, kind: str, host: str, header: str | None) -> None:
        import http.client

        port = self.agents[host].metrics_port()
        if port is None:
            return self._count(kind, host, "no metrics port yet")
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5.0)
        try:
            conn.request("GET", "/metrics", headers={"Authorization": header} if header else {})
            resp = conn.getresponse()
            body = resp.read(300)
            self._count(kind, host, f"HTTP {resp.status}", body.decode("latin-1"))
        except ConnectionRefusedError:
            self._count(kind, host, "connection refused (agent down)")
        except (OSError, http.client.HTTPException) as exc:
            self._count(kind, host, type(exc).__name__)
        finally:
            conn.close()

    def _idle(self, kind: str, host: str, port: int | None) -> None:
        """Open ``IDLE_CONNECTIONS`` TCP connections to ``port``, send nothing, hold them ``IDLE_HOLD_S`` s."""
        import selectors

        try:
            socks, refused = [], 0
            for _ in range(IDLE_CONNECTIONS if port else 0):
                s = socket.socket()
                s.settimeout(2.0)
                try:
                    s.connect(("127.0.0.1", port))
                    socks.append(s)
                except OSError:
                    refused += 1
                    s.close()
            opened = time.monotonic()
            sel = selectors.DefaultSelector()
            for s in socks:
                s.setblocking(False)
                sel.register(s, selectors.EVENT_READ)
            live, closed = len(socks), []
            while live and time.monotonic() < opened + IDLE_HOLD_S:
                for key, _ in sel.select(0.25):
                    try:
                        data = key.fileobj.recv(65536)  # the agent's HTTP/2 settings, or b"": it closed
                    except BlockingIOError:
                        continue
                    except OSError:
                        data = b""
                    if not data:
                        sel.unregister(key.fileobj)
                        closed.append(time.monotonic() - opened)
                        live -= 1
            sel.close()
            for s in socks:
                s.close()
            with self.lock:
                self.idle_closed.setdefault(kind, []).extend(closed)
            if not socks:
                outcome = "no port (agent down)" if not port else "connection refused (agent down)"
            elif live == 0:
                outcome = f"all closed by the agent within {IDLE_HOLD_S:g} s"
            elif closed:
                outcome = f"some closed by the agent, the rest held {IDLE_HOLD_S:g} s"
            else:
                outcome = f"all held {IDLE_HOLD_S:g} s (none closed by the agent)"
            if refused and socks:
                outcome += f", {refused} refused"
            self._count(kind, host, outcome)
        finally:
            with self.lock:
                self.holding.discard((kind, host))

    def _act(self, kind: str, host: str) -> bool:
        """One action; False if it was not started (its idle connections to that agent are still held)."""
        pb = self.pb
        if kind.startswith("idle "):
            with self.lock:
                if (kind, host) in self.holding:
                    return False
                self.holding.add((kind, host))
            port = self.agents[host].port if kind == "idle gRPC connections" else self.agents[host].metrics_port()
            t = threading.Thread(target=self._idle, args=(kind, host, port), name="hostile-idle", daemon=True)
            self.holders.append(t)
            t.start()
        elif kind == "Status, no token":
            self._call(kind, host, "Status", pb.StatusRequest(), token=False)
        elif kind in self.frames:
            self._call(kind, host, "Infer", self.frames[kind], token="no token" not in kind)
        elif kind in self.profiles:
            self._call(kind, host, "ProfileOps", self.profiles[kind], token=True)
        elif kind == "metrics scrape, no token":
            self._scrape(kind, host, None)
        elif kind == "metrics scrape, wrong token":
            self._scrape(kind, host, "Bearer not-the-token")
        elif kind == "metrics scrape, token (legitimate)":
            self._scrape(kind, host, f"Bearer {self.token}")
        return True

    def start(self, start: float) -> None:
        self.t0 = start
        self.thread.start()

    def _run(self) -> None:
        tick = time.monotonic()
        while True:
            for kind in self.kinds:
                for host in self.agents:
                    if time.monotonic() >= self.end:
                        return
                    if self._act(kind, host):
                        tick = max(tick + 1.0 / self.rate, time.monotonic() - 1.0)  # no burst after a slow call
                        time.sleep(max(0.0, tick - time.monotonic()))

    def join(self) -> None:
        self.thread.join(30)
        for t in self.holders:
            t.join(IDLE_HOLD_S + 10)
        for c in self.channels.values():
            c.close()

    def report(self) -> None:
        total = sum(self.counts.values())
        print(
            f"hostile actions {total} (about {self.rate:g}/s, against {', '.join(self.agents)}), by kind and outcome:"
        )
        for kind in self.kinds:
            outcomes: dict[str, dict[str, int]] = {}
            for (k, o, h), n in self.counts.items():
                if k == kind:
                    outcomes.setdefault(o, {})[h] = n
            print(f"  {kind}: " + ("; ".join(
                f"{o} {sum(by.values())} ({', '.join(f'{h} {by[h]}' for h in sorted(by))})"
                for o, by in sorted(outcomes.items())) or "none"))  # fmt: skip
        print("what the agents said (the first time, per kind and outcome):")
        for kind in self.kinds:
            for (k, o), detail in sorted(self.examples.items()):
                if k == kind and o != "OK" and not o.startswith("HTTP 200"):
                    print(f"  {kind}, {o}: {' '.join(detail.split())[:150]}")
        for kind, closed in sorted(self.idle_closed.items()):
            if closed:
                closed.sort()
                print(f"  {kind}: {len(closed)} closed by the agents, after {closed[0]:.1f} s (first) / "
                      f"{closed[len(closed) // 2]:.1f} s (median) / {closed[-1]:.1f} s (last)")  # fmt: skip
        print(f"hostile outcomes INTERNAL or UNKNOWN (or HTTP 5xx): {len(self.findings)}")
        for f in self.findings[:40]:
            print(f"  {f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--kill-every", type=float, default=120.0)
    parser.add_argument("--bad-every", type=float, default=30.0)
    parser.add_argument("--fps", type=float, default=20.0)
    parser.add_argument("--zoo-dir", type=Path, default=Path("build/bench/zoo"))
    parser.add_argument(
        "--kill",
        default=",".join(HOSTS[1:] + HOSTS[:1]),
        help="the hosts SIGKILLed, in turn (default h1,h2,h0); --kill h1 restarts only a peer of the entry host",
    )
    parser.add_argument(
        "--debug-memory",
        action="store_true",
        help="agents trace their memory (--debug-memory); each is asked for a report before every SIGKILL "
        "and at the end (<work>/<host>.memory.jsonl)",
    )
    parser.add_argument(
        "--hostile",
        action="store_true",
        help="a hostile client beside the stream for the whole soak, about 5 actions/s against every agent: "
        "idle connections, tokenless calls, bad requests, oversized inputs",
    )
    args = parser.parse_args()
    path = args.zoo_dir / "bert_tiny.onnx"
    if not path.exists():
        from models.export import export_model

        export_model("bert_tiny", path)
    loaded = load_onnx(path)
    graph = build_graph(loaded.proto, loaded.sha256, "bert_tiny")
    profile = soak_profile()
    plan = flop_pipeline(coarsen(graph, "coarse"), profile, [("s0", 1), ("s1", 1), ("s2", 1)], name="soak-3-stages")
    work = Path(tempfile.mkdtemp(prefix="parapipe-soak-"))
    token = secrets.token_hex(16)
    token_file = work / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    metrics = importlib.util.find_spec("prometheus_client") is not None
    compiled = compile_plan(plan, loaded, graph, profile)
    parts = write_bundles(compiled, work / "bundle")
    entry = compiled.manifest.entry
    assert set(parts) == set(HOSTS) and entry == "h0", (sorted(parts), entry)
    agents = {h: Supervised(h, work, token_file, metrics, args.debug_memory) for h in HOSTS}
    for a in agents.values():
        a.client.wait_serving(60)
        a.client.load_bundle(parts[a.host])
    for h in reversed(HOSTS):  # the entry host last
        peers = [Peer(o, f"127.0.0.1:{agents[o].port}", token=token) for o in HOSTS if o != h]
        agents[h].client.start(parse_manifest((parts[h] / "manifest.json").read_text()).sha256(), peers=peers)
    print(f"# soak: 3-stage bert_tiny plan over hosts {', '.join(HOSTS)} (entry {entry}; one agent each on 127.0.0.1), "
          f"{args.minutes:g} min, SIGKILL every {args.kill_every:g} s (hosts in turn), bad frame every "
          f"{args.bad_every:g} s, {args.fps:g} frames/s streamed (InferStream); each agent under "
          f"{shlex.join(['sh', '-c', '<restart loop>', SUPERVISOR_NAME])}", flush=True)  # fmt: skip
    print(f"# agents: bearer token (--token-file), work folder {work} (logs <host>.log), {'metrics on (--metrics-port 0)' if metrics else 'no metrics port (prometheus_client is not importable: the hostile client skips its metrics actions)'}; "
          f"Status probed every 0.5 s on each agent; hostile client: "
          f"{'on, about 5 actions/s' if args.hostile else 'off'}", flush=True)  # fmt: skip

    tally = Tally()
    schedule: queue.Queue = queue.Queue()
    start = time.monotonic()
    end = start + args.minutes * 60
    streaming = Streamer(agents[entry].client, tally, schedule, args.minutes * 60 + 300)
    streamer = threading.Thread(target=streaming.run, daemon=True)
    streamer.start()
    prober = Prober(agents, token, end)
    prober.start(start)
    hostile = Hostile(agents, token, end) if args.hostile else None
    if hostile is not None:
        hostile.start(start)
    # (host, pid) -> started, rss at 1 min, peak after
    incarnations: dict[tuple[str, int], dict[str, float]] = {}
    kill_order = args.kill.split(",")
    assert set(kill_order) <= set(HOSTS), f"--kill takes hosts among {', '.join(HOSTS)}"
    next_kill, next_bad, kills = start + args.kill_every, start + args.bad_every, []
    tick = start
    while time.monotonic() < end:
        now = time.monotonic()
        for h, a in agents.items():
            pid = a.pid()
            if not pid:
                continue
            inc = incarnations.setdefault(
                (h, pid), {"started": now, "rss_1min": 0.0, "peak_after": 0.0, "last": 0.0, "peer_kills": 0.0}
            )
            rss = rss_kib(pid)
            if rss:
                inc["last"] = rss
            if now - inc["started"] >= 60 and not inc["rss_1min"]:
                inc["rss_1min"] = rss
            if inc["rss_1min"]:
                inc["peak_after"] = max(inc["peak_after"], rss)
        if now >= next_kill:
            rss = {h: rss_kib(a.pid() or 0) / 1024 for h, a in agents.items()}
            print(f"{now - start:6.1f} s: RSS before the kill " + ", ".join(f"{h} {m:.1f} MiB" for h, m in rss.items()))
            for a in agents.values():
                a.report_memory()
            victim = kill_order[len(kills) % len(kill_order)]
            pid = agents[victim].pid()
            if pid:
                os.kill(pid, signal.SIGKILL)
                kills.append(victim)
                for (host, p), inc in incarnations.items():
                    if host != victim and p == agents[host].pid():
                        inc["peer_kills"] += 1
                print(f"{now - start:6.1f} s: SIGKILL {victim} (pid {pid})", flush=True)
            next_kill += args.kill_every
        is_bad = now >= next_bad
        if is_bad:
            next_bad += args.bad_every
        schedule.put(is_bad)
        tick += 1.0 / args.fps
        time.sleep(max(0.0, tick - time.monotonic()))
    schedule.put(None)
    streamer.join(120)
    tally.gap_until(end)  # a stall at the end of the run counts too
    prober.join()
    if hostile is not None:
        hostile.join()
    unsent = len(streaming.carry)
    while not schedule.empty():  # due frames the streamer never sent (not counted as sent)
        unsent += schedule.get() is not None
    rss = {h: rss_kib(a.pid() or 0) / 1024 for h, a in agents.items()}
    print(f"{time.monotonic() - start:6.1f} s: RSS at the end " + ", ".join(f"{h} {m:.1f} MiB" for h, m in rss.items()))
    for a in agents.values():
        a.report_memory()
    if args.debug_memory:
        time.sleep(5.0)  # the reports are written by the agents' own threads
        print(f"memory reports: {work}/<host>.memory.jsonl")
    for a in agents.values():
        a.shutdown()
    c = tally.counts
    lost = c["sent"] - c["completed"] - c["failed"]
    print(f"frames sent {c['sent']}, completed {c['completed']}, failed {c['failed']}, lost {lost}")
    print(f"bad frames sent {c['bad_sent']}, reported failed {c['bad_failed']}")
    print("failures by status: " + ", ".join(f"{k} {v}" for k, v in sorted(tally.errors.items())))
    print(
        f"streams opened {c['streams']}; frames due but never sent {unsent}; streamer finished: {not streamer.is_alive()}"
    )
    print(f"SIGKILLs {len(kills)} ({', '.join(kills)}), restarts by the supervisors "
          + ", ".join(f"{h} {a.restarts()}" for h, a in agents.items()))  # fmt: skip
    print(f"longest time without a completed frame: {tally.longest_gap:.2f} s")
    for (h, pid), inc in incarnations.items():
        if inc["rss_1min"]:
            growth = (inc["peak_after"] / inc["rss_1min"] - 1) * 100
            last = (inc["last"] / inc["rss_1min"] - 1) * 100
            print(f"{h} agent pid {pid}: RSS {inc['rss_1min'] / 1024:.1f} MiB at 1 min, peak after {inc['peak_after'] / 1024:.1f} MiB "
                  f"({growth:+.1f}%), last {inc['last'] / 1024:.1f} MiB ({last:+.1f}%); peers SIGKILLed in its life "
                  f"{int(inc['peer_kills'])} (each restarts its part)")  # fmt: skip
        else:
            print(f"{h} agent pid {pid}: lived under a minute")
    drifts = [
        ((inc["peak_after"] / inc["rss_1min"] - 1) * 100, (inc["last"] / inc["rss_1min"] - 1) * 100, h, pid)
        for (h, pid), inc in incarnations.items()
        if inc["rss_1min"]
    ]
    if hostile is not None:
        hostile.report()
    else:
        print("hostile client: off")
    print("Status probes (token, every 0.5 s, 2 s deadline) by outcome: "
          + "; ".join(f"{h} " + ", ".join(f"{o} {n}" for o, n in sorted(prober.calls[h].items())) for h in HOSTS))  # fmt: skip
    print("longest time an agent did not answer Status: " + ", ".join(
        f"{h} {prober.longest[h]:.2f} s (from {prober.longest_at[h]:.1f} s)" for h in HOSTS))  # fmt: skip
    if drifts:
        worst_peak, worst_last = max(drifts), max(drifts, key=lambda d: d[1])
        print(f"worst RSS drift after 1 min: peak {worst_peak[0]:+.1f}% ({worst_peak[2]} pid {worst_peak[3]}), "
              f"last {worst_last[1]:+.1f}% ({worst_last[2]} pid {worst_last[3]})")  # fmt: skip
        drift_ok = f"{'OK' if worst_peak[0] <= 10.0 else 'FAILED'} ({worst_peak[0]:+.1f}%)"
    else:
        print("worst RSS drift after 1 min: none (no agent lived a minute)")
        drift_ok = "n/a"
    unreachable = max(prober.longest.values())
    print(f"lost must be 0: {'OK' if lost == 0 else 'FAILED'}; no agent unreachable over 10 s: "
          f"{'OK' if unreachable <= 10.0 else 'FAILED'} ({unreachable:.2f} s); RSS drift (peak) within 10%: {drift_ok}")  # fmt: skip


if __name__ == "__main__":
    main()
