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

Run: .venv/bin/python bench/soak.py [--minutes 10] [--kill-every 120] [--bad-every 30] [--fps 20]
Short iteration: .venv/bin/python bench/soak.py --minutes 3 --kill-every 40
Memory per peer restart, cheaply: .venv/bin/python bench/soak.py --minutes 2.5 --kill-every 30 --kill h1 --fps 2
(only h1, a peer of the entry host, is SIGKILLed; --debug-memory also has every agent write what it
holds before each kill: live pipelines, links, channels, sessions, threads, heap, see agents/debug.py)
"""

from __future__ import annotations

import argparse
import os
import queue
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
    compiled = compile_plan(plan, loaded, graph, profile)
    parts = write_bundles(compiled, work / "bundle")
    entry = compiled.manifest.entry
    assert set(parts) == set(HOSTS) and entry == "h0", (sorted(parts), entry)
    agents = {h: Supervised(h, work, args.debug_memory) for h in HOSTS}
    for a in agents.values():
        a.client.wait_serving(60)
        a.client.load_bundle(parts[a.host])
    for h in reversed(HOSTS):  # the entry host last
        peers = [Peer(o, f"127.0.0.1:{agents[o].port}") for o in HOSTS if o != h]
        agents[h].client.start(parse_manifest((parts[h] / "manifest.json").read_text()).sha256(), peers=peers)
    print(f"# soak: 3-stage bert_tiny plan over hosts {', '.join(HOSTS)} (entry {entry}; one agent each on 127.0.0.1), "
          f"{args.minutes:g} min, SIGKILL every {args.kill_every:g} s (hosts in turn), bad frame every "
          f"{args.bad_every:g} s, {args.fps:g} frames/s streamed (InferStream); each agent under "
          f"{shlex.join(['sh', '-c', '<restart loop>', SUPERVISOR_NAME])}", flush=True)  # fmt: skip

    tally = Tally()
    schedule: queue.Queue = queue.Queue()
    start = time.monotonic()
    end = start + args.minutes * 60
    streaming = Streamer(agents[entry].client, tally, schedule, args.minutes * 60 + 300)
    streamer = threading.Thread(target=streaming.run, daemon=True)
    streamer.start()
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
    print(f"lost must be 0: {'OK' if lost == 0 else 'FAILED'}")


if __name__ == "__main__":
    main()
